"""Random operator workloads drawn as ALT §7.1 draws its test cases.

ALT evaluates each of its nine operators on random configurations: batch from 1 to 16,
channels from 3/16/32/64/512/960/1280, and random kernel sizes, strides, dilations and
groups. Pretraining (a cross-workload cost model, a policy) needs many such operators
that no benchmark suite uses, and a held-out suite needs them fixed by a seed: both come
from :func:`draw_workloads`. Spatial sizes include some with few divisors (15, 17, 31)
so that layouts must cope with awkward extents, and each draw is shrunk (spatial size
first, then batch) until its work fits ``max_gflop``, so that a 2-core machine measures a
candidate in milliseconds; ``min_gflop`` redraws operators too small to time (a 16x32x1
GEMM measures the timer, not a layout).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from .operators import operator_for
from .workload import KINDS, parse_workload

CHANNELS = (3, 16, 32, 64, 512, 960, 1280)
"""ALT §7.1's channel counts."""
SPATIAL = (7, 14, 15, 17, 28, 31, 56, 112)
"""Feature-map sizes: the usual halvings and a few with few divisors."""
SPATIAL_3D = (4, 7, 8, 14, 16)
DEPTH = (2, 4, 8)
BATCH = (1, 2, 4, 8, 16)
"""Batch sizes from ALT's range [1, 16]."""
ROWS = (1, 16, 49, 64, 100, 128, 196, 256, 300, 512)
"""GEMM row counts: a vector, a few token counts and flattened feature maps."""
MAX_GFLOP = 0.4
"""Default bound on a drawn operator's work (about 4 ms at 100 GFLOP/s)."""


def _conv(rng: np.random.Generator, kind: str) -> dict[str, int]:
    """One draw of a convolution's parameters (before shrinking)."""
    rank = {"c1d": 1, "c3d": 3, "t3d": 3}.get(kind, 2)
    p: dict[str, int] = {"N": int(rng.choice(BATCH))}
    if kind == "dep":
        p["C"] = int(rng.choice(CHANNELS[1:]))
    else:
        p["I"], p["O"] = (int(rng.choice(CHANNELS)) for _ in range(2))
    if kind in ("t2d", "t3d"):
        k = int(rng.choice((2, 3, 4)))
        stride = int(rng.choice((1, 2))) if k > 2 else 2
        p.update(stride=stride, pad=int(rng.integers(0, k // 2 + 1)))
    else:
        k = int(rng.choice((1, 3, 3, 5, 7) if rank < 3 else (1, 3, 3)))
        if kind == "dep":
            k = max(k, 3)
        p["stride"] = int(rng.choice((1, 1, 2)))
        if kind == "dil":
            k = max(k, 3)
            p["dilation"] = int(rng.choice((2, 3)))
        p["pad"] = (k - 1) // 2 * p.get("dilation", 1)
    if kind == "grp":
        p["I"], p["O"] = max(p["I"], 16), max(p["O"], 16)
        common = [g for g in (2, 4, 8, 16, 32) if p["I"] % g == 0 and p["O"] % g == 0]
        p["groups"] = int(rng.choice(common))
    names = {1: ("W",), 2: ("H", "W"), 3: ("D", "H", "W")}[rank]
    kernels = {1: ("KW",), 2: ("KH", "KW"), 3: ("KD", "KH", "KW")}[rank]
    size = int(rng.choice(SPATIAL_3D if rank == 3 else SPATIAL))
    for name in names:
        p[name] = int(rng.choice(DEPTH)) if name == "D" else size
    if rank == 1:
        p["W"] = size * 8  # sequences are longer than feature-map rows
    for name in kernels:
        p[name] = min(k, 3) if name == "KD" else k
    return p


def _gmm(rng: np.random.Generator) -> dict[str, int]:
    return {"batch": int(rng.choice((1, 1, 1, 4, 12, 16))), "M": int(rng.choice(ROWS)),
            "N": int(rng.choice(CHANNELS[1:])), "K": int(rng.choice(CHANNELS[1:]))}


def _spec(kind: str, params: dict[str, int]) -> str:
    return f"{kind}:" + ",".join(f"{k}={v}" for k, v in params.items())


def _shrink(kind: str, params: dict[str, int], max_flops: float,
            min_flops: float = 0.0) -> str | None:
    """The canonical spec of ``params`` with its spatial size (then batch, then rows)
    halved until the operator does at most ``max_flops``; ``None`` when it cannot fit, ends
    below ``min_flops`` or is not a valid operator."""
    floor = {"W": 16} if kind == "c1d" else {}
    batch = "batch" if kind == "gmm" else "N"
    spatial = [k for k in ("H", "W") if k in params]
    while True:
        try:
            workload = parse_workload(_spec(kind, params))
        except ValueError:
            return None
        flops = operator_for(workload).flops()
        if flops <= max_flops:
            return str(workload) if flops >= min_flops else None
        big = [k for k in spatial if params[k] > floor.get(k, 7)]
        if big:
            for k in big:
                params[k] = max(params[k] // 2, floor.get(k, 7))
        elif params.get(batch, 1) > 1:
            params[batch] //= 2
        elif kind == "gmm" and params["M"] > 16:
            params["M"] //= 2
        else:
            return None


def draw_workloads(count: int, seed: int, kinds: Sequence[str] = KINDS,
                   max_gflop: float = MAX_GFLOP, exclude: Iterable[str] = (),
                   min_gflop: float = 0.0) -> list[str]:
    """``count`` distinct canonical workload specs, the kinds in turn, drawn from ``seed``.

    Parameters
    ----------
    count:
        How many workloads.
    seed:
        Seed of the draws: the same seed gives the same list.
    kinds:
        Operator kinds to draw, used round-robin (``altenv.ops.KINDS``: all nine).
    max_gflop:
        Bound on each operator's work (GFLOP); larger draws are shrunk.
    exclude:
        Specs never to return (e.g. every benchmark suite's), compared canonically.
    min_gflop:
        Draws that do less work (after shrinking) are redrawn.
    """
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown or not kinds:
        raise ValueError(f"draw_workloads: kinds {unknown or '[]'} not allowed; "
                         f"allowed: {', '.join(KINDS)}")
    if count < 0 or not 0 <= min_gflop < max_gflop:
        raise ValueError("draw_workloads: count must be >= 0 and 0 <= min_gflop < max_gflop")
    rng = np.random.default_rng(seed)
    taken = {str(parse_workload(s)) for s in exclude}
    out: list[str] = []
    misses = 0
    while len(out) < count:
        kind = kinds[len(out) % len(kinds)]
        params = _gmm(rng) if kind == "gmm" else _conv(rng, kind)
        spec = _shrink(kind, params, max_gflop * 1e9, min_gflop * 1e9)
        if spec is None or spec in taken:
            misses += 1
            if misses > 1000 * max(count, 1):
                raise ValueError(f"draw_workloads: cannot draw {count} distinct {kind} "
                                 f"workloads of {min_gflop} to {max_gflop} GFLOP")
            continue
        taken.add(spec)
        out.append(spec)
    return out

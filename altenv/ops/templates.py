"""ALT's layout tuning templates (§5.1): tiling factors -> the layouts of an operator.

Convolutions: output ``N H/ht W/wt O/ot ht wt ot``; input unfolded so each output tile
reads one overlapped input tile, ``N H/ht W/wt I/it (ht+KH-1) (wt+KW-1) it`` (with stride
and dilation folded into the tile size); weight ``O/ot' I/it' KH KW it' ot'`` — six
tunables for C2D (``ht wt ot it it_w ot_w``). GMM: ``M/mt N/nt mt nt``,
``M/mt K/kt mt kt``, ``K/kt N/nt kt nt`` — three tunables (a batched GMM keeps its batch
dim outermost). Transposed convolutions read their input through a gather, not a window,
so their input template tiles channels only.
Multi-level templates (``levels=2``) tile the output and weight dims twice, as
``N H/(ht'ht) W/(wt'wt) O/(ot'ot) ht' wt' ot' ht wt ot``.

Channel and GEMM dims tiled once may also take a tile that does not divide them (ALT's
``pad``): a vector-friendly power of two whose padding wastes at most a quarter of the dim,
so that 300 or 120 can still be blocked by 16. Every tensor holding the dim is padded with
zeros to the same multiple (``pad`` then ``split``), the reduction still runs over the
logical extent, and the result is cropped when read back.

:class:`Template` is what tuning and the environments ask of a layout choice; an intrinsic
mapping (:class:`altenv.mapping.MappingTemplate`) answers it too.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from ..layout import Layout
from ..layout.state import tensor_state
from .codegen import OpProgram, generate
from .operators import SPATIAL_NAMES, Conv, MatMul, Operator, TransposedConv, operator_for
from .workload import Workload, parse_workload

SPATIAL = SPATIAL_NAMES[3]


def divisors(n: int) -> list[int]:
    """Sorted divisors of ``n``."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def nearest_divisor(n: int, x: float) -> int:
    """ALT's ``R(.)``: the divisor of ``n`` closest to ``x`` (ties to the smaller)."""
    return min(divisors(n), key=lambda d: (abs(d - x), d))


KNOB_ROLES = ("dt", "ht", "wt", "ot", "it", "it_w", "ot_w", "mt", "nt", "kt",
              "dt1", "ht1", "wt1", "ot1", "it_w1", "ot_w1")
"""Every knob name a layout template of one or two levels has: a fixed vocabulary, so a
policy head or a model input keeps its meaning across operators and shapes."""

PAD_TILES = (4, 8, 16, 32, 64)
"""Tiles a paddable dim may take though they do not divide it (SIMD widths and blocks)."""
PAD_WASTE = 0.25
"""The most padding a padded tile may add, as a fraction of the dim."""


def padded_tiles(extent: int) -> list[int]:
    """The tiles of :data:`PAD_TILES` that do not divide ``extent`` and pad it by at most
    :data:`PAD_WASTE`."""
    return [t for t in PAD_TILES if t < extent and extent % t
            and -(-extent // t) * t <= extent * (1 + PAD_WASTE)]


def _round_up(extent: int, tiles: Sequence[int]) -> int:
    """``extent`` rounded up to a multiple of every tile in ``tiles``."""
    step = math.lcm(*tiles) if tiles else 1
    return -(-extent // step) * step


@dataclass(frozen=True)
class Knob:
    """One tunable split factor: the tile size of ``dim`` (logical size ``extent``) at ``level``
    (0 = innermost)."""

    name: str
    dim: str
    extent: int
    level: int = 0


class Template(Protocol):
    """A layout choice as tuning and the environments see it: knobs whose factors give the
    layouts of an operator's tensors, and the program those layouts generate."""

    workload: Workload
    op: Operator
    levels: int
    knobs: list[Knob]
    tensor_intrin: str | None
    """The TVM tensor intrinsic its programs are tensorized with, ``None`` for none."""

    @property
    def knob_names(self) -> list[str]: ...

    def default_factors(self) -> dict[str, int]:
        """The factors of the untuned layout."""

    def choices(self, knob: Knob) -> list[int]:
        """The values ``knob`` takes."""

    def blocked_factors(self, lanes: int) -> dict[str, int] | None:
        """The vendor-style blocked layout for ``lanes``-element vectors, ``None`` where
        there is none."""

    def check(self, factors: Mapping[str, int]) -> None:
        """Raise ``ValueError`` unless ``factors`` are legal."""

    def layouts(self, factors: Mapping[str, int] | None = None) -> dict[str, Layout]:
        """The layouts of the operator's tensors (``None``: the default factors)."""

    def generate(self, factors: Mapping[str, int], epilogue: Sequence[str] = ()) -> OpProgram:
        """The operator generated under the layouts of ``factors``."""

    def choice_json(self, factors: Mapping[str, int]) -> dict[str, Any]:
        """What records store about the choice beside its tensors' layouts."""

    def factors_from_actions(self, actions: Sequence[float]) -> dict[str, int]:
        """The factors of a continuous action, one value in [0, 1] per knob."""

    def factors_from_indices(self, indices: Sequence[int]) -> dict[str, int]:
        """The factors of a discrete action, one index per knob."""

    def action_nvec(self) -> np.ndarray:
        """``nvec`` of the discrete action."""

    def action_mask(self, allowed: Callable[[str], set[int]]) -> np.ndarray:
        """A flat bool mask of the discrete action (``allowed``: the values a knob's
        constraints allow, by knob name)."""

    def observation(self, factors: Mapping[str, int]) -> np.ndarray:
        """The layout actor's state, in [0, 1], of a fixed length per operator kind."""


class LayoutTemplate:
    """The layout template of one operator.

    Parameters
    ----------
    workload:
        A spec string or :class:`Workload`.
    levels:
        Tiling levels of the output and weight dims (ALT's one- and multi-level templates).
    """

    def __init__(self, workload: str | Workload, levels: int = 1):
        if levels < 1:
            raise ValueError(f"levels must be >= 1, got {levels}")
        self.workload = parse_workload(workload)
        self.op: Operator = operator_for(self.workload)
        self.levels = levels
        self.knobs: list[Knob] = self._knobs()

    tensor_intrin = None
    """ALT's templates tensorize nothing (:attr:`Template.tensor_intrin`)."""

    # knobs ----------------------------------------------------------------
    def _dims(self) -> list[tuple[str, str, int, int]]:
        """(knob base name, logical dim label, extent, levels) of every tunable dim."""
        op, L = self.op, self.levels
        if isinstance(op, MatMul):
            p = self.workload.params
            return [("mt", "M", p["M"], 1), ("nt", "N", p["N"], 1), ("kt", "K", p["K"], 1)]
        spatial = [(s.lower() + "t", s, e, L) for s, e in
                   zip(op.names["out"][2:], op.out_spatial)]
        I, O = op.I, op.O
        in_weight = I // op.groups if isinstance(op, Conv) else I
        return spatial + [("ot", "O", O, L), ("it", "I", I, 1), ("it_w", "I", in_weight, L),
                          ("ot_w", "O", O, L)]

    def _knobs(self) -> list[Knob]:
        knobs = []
        for base, dim, extent, levels in self._dims():
            for level in range(levels):
                knobs.append(Knob(base if level == 0 else f"{base}{level}", dim, extent, level))
        return knobs

    @property
    def knob_names(self) -> list[str]:
        return [k.name for k in self.knobs]

    def default_factors(self) -> dict[str, int]:
        """Untiled layouts: channel tiles 1 and whole spatial tiles (physically NCHW/MKN)."""
        spatial = {s.lower() + "t" for s in SPATIAL}
        return {k.name: k.extent if k.level == 0 and k.name in spatial else 1 for k in self.knobs}

    def choices(self, knob: Knob) -> list[int]:
        """The divisors of the dim ``knob`` tiles, and on a dim tiled once its
        :func:`padded_tiles`."""
        extra = padded_tiles(knob.extent) if self._paddable(knob.name) else []
        return sorted(divisors(knob.extent) + extra)

    def _paddable(self, base: str) -> bool:
        """Whether the dim of knob ``base`` may be padded: a channel or GEMM dim tiled at
        one level (spatial dims are unfolded into overlapping windows: never padded)."""
        op = self.op
        if base in ("ot", "ot_w") and isinstance(op, Conv) and 1 < op.groups < op.O:
            return False  # a padded output channel's group reads past the input channels
        return base in _PADDABLE and sum(k.name.rstrip("0123456789") == base
                                         for k in self.knobs) == 1

    def padded_extents(self, factors: Mapping[str, int]) -> dict[str, int]:
        """The padded extent of every knob's dim under ``factors``: the dim rounded up to
        a multiple of the tiles of every tensor holding it (the output's and the weight's
        ``O`` alike, so the output's padding reads the weight's zeros)."""
        shared = {"ot": ("ot", "ot_w"), "ot_w": ("ot", "ot_w")}
        out = {}
        for base, _, extent, _ in self._dims():
            names = shared.get(base, (base,)) if self._paddable(base) else ()
            out[base] = _round_up(extent, [int(factors[n]) for n in names
                                           if self._paddable(n)])
        return out

    def blocked_factors(self, lanes: int) -> dict[str, int]:
        """The vendor-style blocked layouts: convolutions as TVM's x86 ``NCHW[x]c`` (every
        channel tile the largest of its :meth:`choices` up to ``lanes``, the SIMD width in
        elements, so a dim that pads to ``lanes`` cheaply is padded as oneDNN pads its
        blocked channels; spatial dims whole), GMM with its right-hand side packed in
        ``lanes`` columns (``N/nt K nt``, the packed-B layout of BLAS kernels). Outer levels
        1."""
        factors = self.default_factors()
        blocked = ("nt",) if isinstance(self.op, MatMul) else ("ot", "it", "it_w", "ot_w")
        for k in self.knobs:
            if k.name in blocked:
                factors[k.name] = max(d for d in self.choices(k) if d <= lanes)
            elif k.name == "kt":
                factors[k.name] = k.extent
        return factors

    def factors_from_actions(self, actions: Sequence[float]) -> dict[str, int]:
        """ALT Eq. 2: action ``a`` in (0, 1) gives factor ``R(D * a)`` for each knob, in
        order; a multi-level dim's later levels split what the earlier ones left."""
        if len(actions) != len(self.knobs):
            raise ValueError(f"expected {len(self.knobs)} actions ({self.knob_names}), "
                             f"got {len(actions)}")
        out: dict[str, int] = {}
        left: dict[str, int] = {}
        for knob, a in zip(self.knobs, actions):
            key = knob.name.rstrip("0123456789")
            rest = left.get(key, knob.extent)
            f = nearest_divisor(rest, rest * min(max(float(a), 0.0), 1.0))
            out[knob.name] = f
            left[key] = rest // f
        return out

    def factors_from_indices(self, indices: Sequence[int]) -> dict[str, int]:
        """Discrete action: index ``i`` picks the ``i``-th divisor (clipped to the last) of
        what the knob's dim has left (multi-level knobs divide the outer levels' rest)."""
        out: dict[str, int] = {}
        left: dict[str, int] = {}
        for knob, i in zip(self.knobs, indices, strict=True):
            key = knob.name.rstrip("0123456789")
            choices = divisors(left.get(key, knob.extent))
            out[knob.name] = choices[min(int(i), len(choices) - 1)]
            left[key] = left.get(key, knob.extent) // out[knob.name]
        return out

    def action_nvec(self) -> np.ndarray:
        """``nvec`` of the discrete action: every knob gets the longest divisor list."""
        longest = max(len(divisors(k.extent)) for k in self.knobs)
        return np.full(len(self.knobs), longest, dtype=np.int64)

    def action_mask(self, allowed: Callable[[str], set[int]]) -> np.ndarray:
        """Knob by knob, the indices past a knob's divisor list are masked, and so are the
        values ``allowed`` leaves out; outer levels of a multi-level knob divide what the
        inner level left, so only their list length is masked."""
        masks = []
        for knob, n in zip(self.knobs, self.action_nvec()):
            choices = divisors(knob.extent)
            legal = allowed(knob.name) if knob.level == 0 else set(choices)
            masks.append([i < len(choices) and choices[i] in legal for i in range(int(n))])
        return np.concatenate(masks).astype(bool)

    def observation(self, factors: Mapping[str, int]) -> np.ndarray:
        """The layout actor's state (ALT §5.2.1): per knob ``log(factor) / log(extent)`` and
        ``log2(extent) / 16`` (the shape, so a policy can transfer across workloads), then
        :func:`~altenv.layout.state.tensor_state` of every tensor (sorted by name)."""
        chosen = [math.log(factors[k.name]) / math.log(k.extent) if k.extent > 1 else 0.0
                  for k in self.knobs]
        shape = [min(math.log2(k.extent) / 16.0, 1.0) for k in self.knobs]
        layouts = self.layouts(factors)
        tensors = [tensor_state(layouts[name], 1 + self.levels) for name in sorted(layouts)]
        return np.concatenate([np.asarray(chosen + shape, dtype=np.float32), *tensors])

    def _tiles(self, factors: Mapping[str, int], base: str) -> list[int]:
        """Tile sizes of one dim, innermost level first."""
        return [int(factors[k.name]) for k in self.knobs if k.name.rstrip("0123456789") == base]

    def check(self, factors: Mapping[str, int]) -> None:
        missing = [n for n in self.knob_names if n not in factors]
        extra = [n for n in factors if n not in self.knob_names]
        if missing or extra:
            raise ValueError(f"template factors for {self.workload.kind}: missing {missing}, "
                             f"unknown {extra}; knobs: {self.knob_names}")
        for base, dim, extent, _ in self._dims():
            tiles = self._tiles(factors, base)
            knob = next(k for k in self.knobs if k.name == base)
            if any(t < 1 for t in tiles) or (extent % math.prod(tiles)
                                             and tiles[0] not in self.choices(knob)):
                raise ValueError(f"template factor {base}={tiles} must divide {dim}={extent} "
                                 f"(choices: {self.choices(knob)})")

    # layouts --------------------------------------------------------------
    def layouts(self, factors: Mapping[str, int] | None = None) -> dict[str, Layout]:
        """The layouts of ``data``, ``weight`` and ``out`` for template ``factors``."""
        factors = dict(self.default_factors() if factors is None else factors)
        self.check(factors)
        shapes = self.op.input_shapes()
        names = self.op.names
        padded = self.padded_extents(factors)
        if isinstance(self.op, MatMul):
            mt, nt, kt = factors["mt"], factors["nt"], factors["kt"]
            lead = [[1]] * (self.op.batch > 1)  # the batch stays outermost, untiled
            dims = {"out": ("mt", "nt"), "data": ("mt", "kt"), "weight": ("kt", "nt")}
            tiles = {"out": [[mt], [nt]], "data": [[mt], [kt]], "weight": [[kt], [nt]]}
            shapes["out"] = self.op.out_shape()
            return {name: _tile(_pad(Layout(shapes[name], names[name]),
                                     [None] * len(lead) + [padded[b] for b in dims[name]]),
                                lead + tiles[name])
                    for name in ("out", "data", "weight")}
        op = self.op
        spatial = [self._tiles(factors, s.lower() + "t") for s in names["out"][2:]]
        ot, it = self._tiles(factors, "ot"), self._tiles(factors, "it")
        it_w, ot_w = self._tiles(factors, "it_w"), self._tiles(factors, "ot_w")
        # out: N S.../T O/ot | tiles ... (channel last at each level)
        out = _tile(_pad(Layout(op.out_shape(), names["out"]), [None, padded["ot"]]),
                    [[1]] + [ot] + spatial, order=[0] + list(range(2, 2 + len(spatial))) + [1])
        # weight: O I K... -> O/ot' I/it' K... it' ot'
        rank = len(spatial)
        weight = Layout(shapes["weight"], names["weight"])
        if isinstance(op, TransposedConv):  # weight is I O K...
            weight = _tile(_pad(weight, [padded["it_w"], padded["ot_w"]]),
                           [it_w, ot_w] + [[1]] * rank,
                           order=list(range(rank + 2)), inner_order=[0, 1])
        else:
            weight = _tile(_pad(weight, [padded["ot_w"], padded["it_w"]]),
                           [ot_w, it_w] + [[1]] * rank,
                           order=[0, 1] + list(range(2, rank + 2)), inner_order=[1, 0])
        data = _pad(Layout(shapes["data"], names["data"]), [None, padded["it"]])
        if isinstance(op, Conv):
            data = _unfold_input(data, op, [math.prod(t) for t in spatial], it[0])
        else:
            data = _tile(data, [[1], it] + [[1]] * rank, order=[0, 1] + list(range(2, rank + 2)))
        return {"out": out, "data": data, "weight": weight}

    def generate(self, factors: Mapping[str, int], epilogue: Sequence[str] = ()) -> OpProgram:
        """The operator generated under the layouts of ``factors``."""
        return generate(self.workload, self.layouts(factors), epilogue)

    def choice_json(self, factors: Mapping[str, int]) -> dict[str, Any]:
        """Nothing beside the tensors' layouts (the factors are stored with them)."""
        return {}


_PADDABLE = ("mt", "nt", "kt", "ot", "it", "it_w", "ot_w")
"""Knobs of channel and GEMM dims (tiles of them may pad, :meth:`LayoutTemplate.choices`)."""


def _pad(layout: Layout, extents: Sequence[int | None]) -> Layout:
    """``layout`` with its leading dims padded with zeros at their end to ``extents``
    (``None``: as they are)."""
    for dim, extent in enumerate(extents):
        if extent is not None and extent > layout.shape[dim]:
            layout = layout.pad(dim, 0, extent - layout.shape[dim])
    return layout


def _tile(layout: Layout, tiles: list[list[int]], order: list[int] | None = None,
          inner_order: list[int] | None = None) -> Layout:
    """Split every dim ``d`` into ``[outer, t_L, ..., t_0]`` (tiles innermost first) and order
    all outer parts (by ``order``), then each level's tiles (outermost level first).

    ``inner_order`` orders the dims inside each tile level (default: ``order`` without the
    dims that have no tiles at that level). Dims whose tiles are all 1 keep a single part.
    """
    rank = len(tiles)
    order = list(range(rank)) if order is None else order
    parts: list[list[int]] = []  # physical positions of each dim's parts: outer, level L.., 0
    pos = 0
    for d in range(rank):
        levels = [t for t in reversed(tiles[d])] if any(t > 1 for t in tiles[d]) else []
        if levels:
            outer = layout.shape[pos] // math.prod(levels)
            layout = layout.split(pos, [outer] + levels)
        parts.append(list(range(pos, pos + 1 + len(levels))))
        pos += 1 + len(levels)
    depth = max(len(p) for p in parts) - 1  # tile levels of the deepest dim
    inner = order if inner_order is None else inner_order
    perm = [parts[d][0] for d in order]
    for level in reversed(range(depth)):  # innermost tiles (level 0) last for every dim
        perm += [parts[d][-1 - level] for d in inner if len(parts[d]) - 1 > level]
    return layout.reorder(perm) if perm != sorted(perm) else layout


def _unfold_input(data: Layout, op: Conv, out_tiles: list[int], it: int) -> Layout:
    """``N S.../T I/it (tile windows)... it``: overlapped tiles matching the output tiles.

    A spatial dim whose output tile is the whole output is left as it is (one tile)."""
    outer, inner = [], []
    pos = 2
    for j, tile in enumerate(out_tiles):
        if tile == op.out_spatial[j]:
            inner.append(pos)
            pos += 1
            continue
        size = (tile - 1) * op.stride[j] + op.windows[j]
        data = data.unfold(pos, size, tile * op.stride[j])
        outer.append(pos)
        inner.append(pos + 1)
        pos += 2
    chan = [1]
    if it > 1:
        data = data.split(1, [-1, it])
        outer, inner = [p + 1 for p in outer], [p + 1 for p in inner]
        chan = [1, 2]
    perm = [0] + outer + chan[:1] + inner + chan[1:]
    return data.reorder(perm) if perm != sorted(perm) else data

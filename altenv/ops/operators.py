"""Logical definitions of ALT's nine complex operators.

Each operator states its logical tensors (``data``, ``weight`` and ``out``), its
reduction axes and the body of one output element in terms of a ``read(name, index)``
callback, so code generation can put any layout under any tensor (``altenv.ops.codegen``).
It also converts the framework's raw inputs (e.g. an unpadded NCHW image) into the
operator's logical inputs and computes the framework's reference result with torch.

Convolution ``data`` is the zero-padded input, read through :class:`Window` accesses so an
``unfold`` layout can keep each window inside one tile (ALT Eq. 1). Transposed
convolutions are formulated as a gather over the valid kernel taps, so they do no work
on the zeros of a dilated input.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from ..layout import Window
from .workload import Workload

if TYPE_CHECKING:  # torch computes references only: a config's shape checks do without it
    import torch

Shape = tuple[int, ...]
Read = Callable[[str, list[Any]], Any]

SPATIAL_NAMES = {1: ("W",), 2: ("H", "W"), 3: ("D", "H", "W")}


class Operator:
    """A complex operator of a concrete :class:`Workload` (subclasses per family)."""

    #: logical dimension names of each tensor, for printing layouts
    names: dict[str, list[str]]

    def __init__(self, workload: Workload):
        self.workload = workload
        self.dtype = workload.dtype
        self.out_dtype = "int32" if workload.dtype == "int8" else workload.dtype

    def input_dtype(self, name: str) -> str:
        """dtype of input ``name``. ``int8`` operators are quantized the x86 way: unsigned
        8-bit activations (``data``, uint8) times signed 8-bit weights (int8), summed in
        int32 (what the u8 x i8 dot-product instructions compute)."""
        return "uint8" if self.dtype == "int8" and name == "data" else self.dtype

    # shapes ---------------------------------------------------------------
    @property
    def kind(self) -> str:
        return self.workload.kind

    def input_shapes(self) -> dict[str, Shape]:
        """Logical shapes of the operator's inputs (``data``, ``weight``)."""
        raise NotImplementedError

    def out_shape(self) -> Shape:
        raise NotImplementedError

    def reduce_extents(self) -> list[tuple[str, int]]:
        raise NotImplementedError

    def raw_shapes(self) -> dict[str, Shape]:
        """Shapes of the framework's inputs (before :meth:`prepare`)."""
        return self.input_shapes()

    channel_axis = 1  # the output dim a bias vector runs along

    # semantics ------------------------------------------------------------
    def body(self, read: Read, out: list[Any], red: list[Any]) -> Any:
        """One reduction term of output element ``out`` at reduction point ``red``."""
        raise NotImplementedError

    def prepare(self, raw: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Framework inputs -> the operator's logical inputs (e.g. zero padding)."""
        return dict(raw)

    def reference(self, raw: dict[str, np.ndarray]) -> np.ndarray:
        """The framework's result (torch) on raw inputs."""
        raise NotImplementedError

    def flops(self) -> int:
        """Useful multiply-adds times two."""
        return 2 * math.prod(self.out_shape()) * math.prod(e for _, e in self.reduce_extents())

    def traffic_bytes(self) -> int:
        """Bytes of the logical inputs and the output: what the kernel must move at least."""
        sizes = [math.prod(shape) * np.dtype(self.input_dtype(name)).itemsize
                 for name, shape in self.input_shapes().items()]
        return sum(sizes) + math.prod(self.out_shape()) * np.dtype(self.out_dtype).itemsize

    def random_raw_inputs(self, seed: int = 0) -> dict[str, np.ndarray]:
        """Random framework inputs (never zeros)."""
        rng = np.random.default_rng(seed)
        out = {}
        for name, shape in self.raw_shapes().items():
            dtype = self.input_dtype(name)
            if dtype in ("uint8", "int8"):  # the full range: saturating int16 pairs would show
                info = np.iinfo(dtype)
                out[name] = rng.integers(info.min, info.max + 1, size=shape, dtype=dtype)
            else:
                out[name] = rng.uniform(-1.0, 1.0, size=shape).astype(self.dtype)
        return out

    def tolerance(self) -> float:
        """The largest relative error (to the largest reference magnitude, as
        :func:`altenv.measure.check.max_relative_error` measures it) of a correct program:
        float32 1e-3; float16 sums in float16, whose rounding error grows with the square
        root of the reduction length K (about 3.5e-4 sqrt(K) measured on random inputs,
        K = 32..2048), so max(1e-2, 2^-9 sqrt(K)); int8 sums in int32, exactly: 0."""
        if self.out_dtype == "int32":
            return 0.0
        if self.dtype == "float16":
            terms = math.prod(e for _, e in self.reduce_extents())
            return max(1e-2, 2.0 ** -9 * math.sqrt(terms))
        return 1e-3

    def cast(self, value: Any) -> Any:
        """Promote a read to the accumulation type."""
        return value.astype(self.out_dtype) if self.out_dtype != self.dtype else value


def per_dim(value: int | tuple[int, ...], rank: int, key: str, workload: Workload
            ) -> tuple[int, ...]:
    """A scalar or per-dimension (``1x2x2``) parameter as one value per spatial dim."""
    values = value if isinstance(value, tuple) else (value,) * rank
    if len(values) != rank:
        raise ValueError(f"workload {workload}: {key} has {len(values)} values for {rank} "
                         "spatial dims")
    return values


def _torch(x: np.ndarray) -> torch.Tensor:
    import torch

    return torch.from_numpy(np.asarray(x, dtype=np.float64))


def _to_out(self: Operator, result: torch.Tensor) -> np.ndarray:
    return result.numpy().astype(self.out_dtype)


class Conv(Operator):
    """N-D grouped convolution (c1d, c2d, c3d, grp, dep, dil)."""

    def __init__(self, workload: Workload):
        super().__init__(workload)
        p = workload.params
        self.rank = {"c1d": 1, "c3d": 3}.get(workload.kind, 2)
        if workload.kind == "dep":
            self.I = self.O = self.groups = p["C"]
        else:
            self.I, self.O, self.groups = p["I"], p["O"], p.get("groups", 1)
        self.N = p["N"]
        self.stride = per_dim(p["stride"], self.rank, "stride", workload)
        self.pad = per_dim(p["pad"], self.rank, "pad", workload)
        self.dilation = per_dim(p["dilation"], self.rank, "dilation", workload)
        sp = SPATIAL_NAMES[self.rank]
        self.spatial = tuple(p[s] for s in sp)
        self.kernel = tuple(p["K" + s] for s in sp)
        if self.I % self.groups or self.O % self.groups:
            raise ValueError(f"workload {workload}: groups={self.groups} must divide I={self.I} "
                             f"and O={self.O}")
        if any(o < 1 for o in self.out_spatial):
            raise ValueError(f"workload {workload}: the kernel does not fit the padded input")
        self.names = {"data": ["N", "I", *sp], "weight": ["O", "I", *("K" + s for s in sp)],
                      "out": ["N", "O", *sp]}

    @property
    def windows(self) -> tuple[int, ...]:
        """Extent of one window per spatial dim, ``dilation * (K - 1) + 1``."""
        return tuple(d * (k - 1) + 1 for d, k in zip(self.dilation, self.kernel))

    @property
    def out_spatial(self) -> tuple[int, ...]:
        return tuple((s + 2 * p - w) // v + 1
                     for s, p, w, v in zip(self.spatial, self.pad, self.windows, self.stride))

    def input_shapes(self) -> dict[str, Shape]:
        padded = tuple(s + 2 * p for s, p in zip(self.spatial, self.pad))
        return {"data": (self.N, self.I) + padded,
                "weight": (self.O, self.I // self.groups) + self.kernel}

    def raw_shapes(self) -> dict[str, Shape]:
        return {"data": (self.N, self.I) + self.spatial,
                "weight": (self.O, self.I // self.groups) + self.kernel}

    def out_shape(self) -> Shape:
        return (self.N, self.O) + self.out_spatial

    def reduce_extents(self) -> list[tuple[str, int]]:
        return [("rc", self.I // self.groups)] + [(f"r{s.lower()}", k) for s, k in
                                                  zip(SPATIAL_NAMES[self.rank], self.kernel)]

    def body(self, read: Read, out: list[Any], red: list[Any]) -> Any:
        n, o, *xs = out
        rc, *rs = red
        in_per_group, out_per_group = self.I // self.groups, self.O // self.groups
        channel = rc if self.groups == 1 else (o // out_per_group) * in_per_group + rc
        wins = [Window(x, r * d if d != 1 else r, v, w)
                for x, r, d, v, w in zip(xs, rs, self.dilation, self.stride, self.windows)]
        data = self.cast(read("data", [n, channel] + wins))
        return data * self.cast(read("weight", [o, rc] + rs))

    def prepare(self, raw: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        pads = [(0, 0), (0, 0)] + [(p, p) for p in self.pad]
        return {"data": np.pad(raw["data"], pads), "weight": raw["weight"]}

    def reference(self, raw: dict[str, np.ndarray]) -> np.ndarray:
        import torch

        fn = {1: torch.nn.functional.conv1d, 2: torch.nn.functional.conv2d,
              3: torch.nn.functional.conv3d}[self.rank]
        res = fn(_torch(raw["data"]), _torch(raw["weight"]), stride=self.stride, padding=self.pad,
                 dilation=self.dilation, groups=self.groups)
        return _to_out(self, res)


class TransposedConv(Operator):
    """N-D transposed convolution (t2d, t3d) as a gather over valid taps; ``opad``
    (PyTorch's ``output_padding``, below the stride) adds rows at the end of each output dim.

    ``out[y] = sum_{i, kq} data[(y + pad) // s - kq] * weight[i, o, (y + pad) % s + s * kq]``
    with ``kq < ceil(K / s)``: each output reads only the kernel taps that land on it.
    The program's weight holds ``s * ceil(K / s)`` taps per kernel axis in output-phase
    order, zero past ``K`` (:meth:`prepare`), so the tap read is ``y % s + s * kq`` with no
    bound check: TVM 0.27's iterator-map simplification (``FlattenBuffer``) can drop the
    ``+ pad`` inside ``(... + pad) % s`` once MetaSchedule fuses the outer loops, which
    computed wrong numbers.
    """

    def __init__(self, workload: Workload):
        super().__init__(workload)
        p = workload.params
        self.rank = 3 if workload.kind == "t3d" else 2
        sp = SPATIAL_NAMES[self.rank]
        self.N, self.I, self.O = p["N"], p["I"], p["O"]
        self.stride = per_dim(p["stride"], self.rank, "stride", workload)
        self.pad = per_dim(p["pad"], self.rank, "pad", workload)
        self.opad = per_dim(p.get("opad", 0), self.rank, "opad", workload)
        if any(a >= v for a, v in zip(self.opad, self.stride)):
            raise ValueError(f"workload {workload}: opad (output padding) must be smaller "
                             "than stride in every dim")
        self.spatial = tuple(p[s] for s in sp)
        self.kernel = tuple(p["K" + s] for s in sp)
        if any(o < 1 for o in self.out_spatial):
            raise ValueError(f"workload {workload}: pad={p['pad']} leaves no output")
        self.names = {"data": ["N", "I", *sp], "weight": ["I", "O", *("K" + s for s in sp)],
                      "out": ["N", "O", *sp]}

    @property
    def out_spatial(self) -> tuple[int, ...]:
        return tuple((s - 1) * v - 2 * p + k + a for s, v, p, k, a in
                     zip(self.spatial, self.stride, self.pad, self.kernel, self.opad))

    @property
    def taps(self) -> tuple[int, ...]:
        """Kernel taps per output phase, ``ceil(K / stride)``."""
        return tuple(-(-k // v) for k, v in zip(self.kernel, self.stride))

    @property
    def stored_kernel(self) -> tuple[int, ...]:
        """Kernel taps per axis of the program's weight, ``stride * ceil(K / stride)``."""
        return tuple(v * q for v, q in zip(self.stride, self.taps))

    def halo(self) -> list[tuple[int, int]]:
        """Zero rows needed before/after each spatial input dim so every gather is in range."""
        halo = []
        for s, q, o, v, p in zip(self.spatial, self.taps, self.out_spatial, self.stride, self.pad):
            before = max(0, q - 1 - p // v)
            after = max(0, (o - 1 + p) // v - (s - 1))
            halo.append((before, after))
        return halo

    def input_shapes(self) -> dict[str, Shape]:
        padded = tuple(s + b + a for s, (b, a) in zip(self.spatial, self.halo()))
        return {"data": (self.N, self.I) + padded,
                "weight": (self.I, self.O) + self.stored_kernel}

    def raw_shapes(self) -> dict[str, Shape]:
        return {"data": (self.N, self.I) + self.spatial, "weight": (self.I, self.O) + self.kernel}

    def out_shape(self) -> Shape:
        return (self.N, self.O) + self.out_spatial

    def reduce_extents(self) -> list[tuple[str, int]]:
        return [("rc", self.I)] + [(f"r{s.lower()}", q) for s, q in
                                   zip(SPATIAL_NAMES[self.rank], self.taps)]

    def flops(self) -> int:
        return 2 * self.N * self.I * self.O * math.prod(self.spatial) * math.prod(self.kernel)

    def body(self, read: Read, out: list[Any], red: list[Any]) -> Any:
        n, o, *ys = out
        rc, *kqs = red
        rows = [(y + p) // v - kq + before
                for y, kq, v, p, (before, _) in zip(ys, kqs, self.stride, self.pad, self.halo())]
        taps = [y % v + v * kq for y, kq, v in zip(ys, kqs, self.stride)]  # see prepare
        return self.cast(read("data", [n, rc] + rows)) * self.cast(read("weight", [rc, o] + taps))

    def prepare(self, raw: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The data padded by its halo; the weight as :meth:`prepare_weight` stores it."""
        return {"data": np.pad(raw["data"], [(0, 0), (0, 0)] + self.halo()),
                "weight": self.prepare_weight(raw["weight"])}

    def prepare_weight(self, weight: np.ndarray) -> np.ndarray:
        """The weight's taps in output-phase order along each kernel axis: position
        ``f + s * kq`` holds tap ``(f + pad) % s + s * kq``, the one output phase ``f`` reads
        (:meth:`body`), or zero where that tap is past ``K``."""
        for axis, (k, v, p, stored) in enumerate(
                zip(self.kernel, self.stride, self.pad, self.stored_kernel), start=2):
            zeros = [(0, 0)] * weight.ndim
            zeros[axis] = (0, stored - k)
            weight = np.take(np.pad(weight, zeros),
                             [(t % v + p) % v + t - t % v for t in range(stored)], axis=axis)
        return weight

    def reference(self, raw: dict[str, np.ndarray]) -> np.ndarray:
        import torch

        fn = torch.nn.functional.conv_transpose3d if self.rank == 3 else \
            torch.nn.functional.conv_transpose2d
        res = fn(_torch(raw["data"]), _torch(raw["weight"]), stride=self.stride, padding=self.pad,
                 output_padding=self.opad)
        return _to_out(self, res)


class MatMul(Operator):
    """GMM ``out[M, N] = data[M, K] @ weight[K, N]``; with ``batch=B > 1`` a batched matmul
    ``out[B, M, N] = data[B, M, K] @ weight[B, K, N]`` (attention's products)."""

    def __init__(self, workload: Workload):
        super().__init__(workload)
        self.batch = int(workload.params.get("batch", 1))
        lead = ["B"] if self.batch > 1 else []
        self.names = {"data": lead + ["M", "K"], "weight": lead + ["K", "N"],
                      "out": lead + ["M", "N"]}
        self.channel_axis = len(lead) + 1

    def _lead(self) -> tuple[int, ...]:
        return (self.batch,) if self.batch > 1 else ()

    def input_shapes(self) -> dict[str, Shape]:
        p = self.workload.params
        return {"data": self._lead() + (p["M"], p["K"]),
                "weight": self._lead() + (p["K"], p["N"])}

    def out_shape(self) -> Shape:
        return self._lead() + (self.workload["M"], self.workload["N"])

    def reduce_extents(self) -> list[tuple[str, int]]:
        return [("rk", self.workload["K"])]

    def body(self, read: Read, out: list[Any], red: list[Any]) -> Any:
        *lead, m, n = out
        (k,) = red
        return self.cast(read("data", [*lead, m, k])) * self.cast(read("weight", [*lead, k, n]))

    def reference(self, raw: dict[str, np.ndarray]) -> np.ndarray:
        return _to_out(self, _torch(raw["data"]) @ _torch(raw["weight"]))


_FAMILIES: dict[str, type[Operator]] = {
    "c1d": Conv, "c2d": Conv, "c3d": Conv, "grp": Conv, "dep": Conv, "dil": Conv,
    "t2d": TransposedConv, "t3d": TransposedConv, "gmm": MatMul,
}


INT32_MAX = 2**31 - 1
"""Most elements of one tensor: TVM indexes buffers with int32 by default."""


def host_memory() -> int:
    """Bytes of physical memory of this machine."""
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def check_size(op: Operator) -> None:
    """A ``ValueError`` of one line if a tensor of ``op`` is past int32 indexing, or if
    checking it against torch would not fit in half this machine's memory (its inputs
    and output kept as drawn, in float64 for the reference and in the layouts tuned)."""
    shapes = {**op.raw_shapes(), **op.input_shapes(), "out": op.out_shape()}
    for name, shape in shapes.items():
        if math.prod(shape) > INT32_MAX:
            raise ValueError(f"workload {op.workload}: tensor {name} "
                             f"{'x'.join(map(str, shape))} has "
                             f"{math.prod(shape):,} elements, past int32 indexing "
                             f"({INT32_MAX:,}); use smaller sizes")
    elements = sum(math.prod(shape) for shape in shapes.values())
    need, have = 3 * 8 * elements, host_memory()
    if need > have / 2:
        raise ValueError(f"workload {op.workload}: its tensors hold {elements:,} elements: "
                         f"checking them needs about "
                         f"{need / 2**30:.0f} GiB, more than half of this machine's "
                         f"{have / 2**30:.0f} GiB; use smaller sizes")


def operator_for(workload: Workload) -> Operator:
    """The :class:`Operator` of a parsed workload (validates the shape and its size,
    :func:`check_size`)."""
    op = _FAMILIES[workload.kind](workload)
    check_size(op)
    return op

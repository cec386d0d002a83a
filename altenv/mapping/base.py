"""The shared interface of intrinsic-mapping generators (AMOS §4, Def. 4.1 and 4.3).

Three objects, and one protocol that every generator (``amos``, ``cp_embedding``)
implements:

* :class:`Intrinsic` — AMOS's compute abstraction of one hardware instruction: its
  iteration dims (kind ``S`` spatial or ``R`` reduction, fixed extent), which dims index
  each operand (``dst`` and the sources), the operand dtypes, the TVM ``TensorIntrin``
  that implements it and the target features it needs.
* :class:`LoopNest` — an operator's software iterations: one loop per output dim and per
  reduction dim, its kind and extent, and which loops index each tensor (``data``,
  ``weight``, ``out``): the rows of AMOS's software access matrix ``X``.
* :class:`Mapping` — one compute mapping: for each intrinsic dim, the operator loops fused
  onto it (outer first; the fused extent is padded up to a multiple of the intrinsic
  extent), and which operator tensor plays each operand. Loops on no intrinsic dim stay
  outer loops around the intrinsic. ``altenv.mapping.realize`` turns a mapping into the
  layouts of the operator's tensors (e.g. weight ``O/8 I/4 KH KW 8 4`` for ``o -> i``,
  ``c -> r`` on an 8x4 dot product) and of its reduction domain, so the program the
  layouts generate has the intrinsic as its innermost block.

A generator only has to produce :class:`Mapping` objects:

.. code-block:: python

    class MyGenerator(MappingGenerator):
        name = "mine"

        def generate(self, nest: LoopNest, intrinsic: Intrinsic) -> list[Mapping]:
            ...  # every mapping must pass ``mapping.check(nest, intrinsic)``

    register(MyGenerator)

``mappings_for(workload, "amos", target)`` then gives the mappings that the tuner's
mapping action chooses from (``OpTask(..., mapping="amos")``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

Kind = Literal["S", "R"]


@dataclass(frozen=True)
class Loop:
    """One software iteration (AMOS §4.3): a loop of the operator's nest."""

    name: str
    kind: Kind
    extent: int


@dataclass(frozen=True)
class Stencil:
    """A sliding-window access: ``tensor``'s dim of ``extent`` elements is indexed by the
    output loop ``out`` and the kernel loop ``kernel`` together (``out * stride + kernel *
    dilation`` for a convolution's data). AMOS's binary access matrix records only that
    both loops index the tensor; the layout rewrites of ``cp_embedding`` (unrolling the
    window into its own dim, im2col-style) need the window itself.

    ``affine`` is ``False`` for accesses that are not a window (a transposed conv's gather
    ``(out + pad) // stride - kernel``): neither loop can then go onto an intrinsic dim
    with a dense layout.
    """

    tensor: str
    out: str
    kernel: str
    extent: int
    stride: int = 1
    dilation: int = 1
    window: int = 1
    affine: bool = True

    @property
    def tiles(self) -> int:
        """Windows after unfolding the dim (ALT's ``unfold(extent, window, stride)``)."""
        return -(-(self.extent - self.window) // self.stride) + 1


@dataclass(frozen=True)
class LoopNest:
    """An operator's loops and its access relation (AMOS's software access matrix).

    Parameters
    ----------
    loops:
        The loops, output dims first (in the output's logical order), then reductions.
    access:
        For each tensor (``data``, ``weight``, ``out``), the names of the loops its index
        expressions use.
    stencils:
        The tensor dims indexed by an output loop and a kernel loop together (a
        convolution's sliding windows); every other tensor dim is one loop.
    """

    loops: tuple[Loop, ...]
    access: dict[str, frozenset[str]] = field(hash=False)
    stencils: tuple[Stencil, ...] = ()

    def loop(self, name: str) -> Loop:
        for lp in self.loops:
            if lp.name == name:
                return lp
        raise KeyError(f"no loop {name!r}; loops: {[lp.name for lp in self.loops]}")

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(lp.name for lp in self.loops)


@dataclass(frozen=True)
class Intrinsic:
    """A hardware compute intrinsic as AMOS's compute abstraction (Def. 4.1).

    ``dst[i...] += src1[...] * src2[...]`` over the iteration box ``dims``.

    Parameters
    ----------
    name:
        Short name (``"avx2_dot_8x4"``, ``"wmma_16x16x16"``).
    dims:
        The intrinsic's iterations, e.g. ``(("i", "S", 8), ("r", "R", 4))``.
    operands:
        The dims that index each operand: ``{"dst": ("i",), "src1": ("r",),
        "src2": ("i", "r")}`` (index order = the operand's memory order).
    dtypes:
        dtype of each operand.
    tvm_intrin:
        Name of the registered ``TensorIntrin`` that implements it (``None``: described
        only, e.g. the paper's Tensor Core shape used for counting).
    target_kind, features:
        Target kind (``"llvm"``, ``"cuda"``) and the CPU features it needs.
    """

    name: str
    dims: tuple[tuple[str, Kind, int], ...]
    operands: dict[str, tuple[str, ...]] = field(hash=False)
    dtypes: dict[str, str] = field(hash=False)
    tvm_intrin: str | None = None
    target_kind: str = "llvm"
    features: tuple[str, ...] = ()

    @property
    def dim_names(self) -> tuple[str, ...]:
        return tuple(d[0] for d in self.dims)

    def extent(self, dim: str) -> int:
        return next(e for n, _, e in self.dims if n == dim)

    def kind(self, dim: str) -> Kind:
        return next(k for n, k, _ in self.dims if n == dim)


OPERAND_OF = {"out": "dst", "data": "src1", "weight": "src2"}
"""The default binding of an operator's tensors to intrinsic operands (``dst = src1 *
src2`` for ``out = data * weight``)."""


@dataclass(frozen=True)
class Mapping:
    """A compute mapping of an operator's loops onto an intrinsic (AMOS Def. 4.3).

    Parameters
    ----------
    intrinsic:
        The intrinsic's name.
    groups:
        For each intrinsic dim (in ``Intrinsic.dims`` order), the operator loops fused onto
        it, outer first; an empty group leaves that dim unused (extent-1 padding).
    generator:
        Which generator produced it (``"amos"``, ``"cp_embedding"``).
    """

    intrinsic: str
    groups: tuple[tuple[str, ...], ...]
    generator: str = "amos"

    @property
    def mapped(self) -> tuple[str, ...]:
        """Operator loops mapped onto the intrinsic (the rest stay outer loops)."""
        return tuple(n for g in self.groups for n in g)

    def fused_extent(self, nest: LoopNest, k: int) -> int:
        """Product of the extents of the loops on intrinsic dim ``k``."""
        return math.prod(nest.loop(n).extent for n in self.groups[k])

    def padding(self, nest: LoopNest, intrinsic: Intrinsic) -> tuple[int, ...]:
        """Zeros appended to each intrinsic dim's fused extent to make it a multiple of
        the intrinsic extent (AMOS §5.1's trailing padding)."""
        out = []
        for k, (_, _, ext) in enumerate(intrinsic.dims):
            fused = self.fused_extent(nest, k)
            out.append(-fused % ext)
        return tuple(out)

    def check(self, nest: LoopNest, intrinsic: Intrinsic) -> None:
        """Raise ``ValueError`` unless the groups name distinct loops of ``nest``, one
        group per intrinsic dim, each loop of the same kind as its dim."""
        if intrinsic.name != self.intrinsic or len(self.groups) != len(intrinsic.dims):
            raise ValueError(f"mapping {self}: needs one group per dim of {intrinsic.name}")
        if len(set(self.mapped)) != len(self.mapped):
            raise ValueError(f"mapping {self}: a loop is mapped twice")
        for (dim, kind, _), group in zip(intrinsic.dims, self.groups):
            for name in group:
                if nest.loop(name).kind != kind:
                    raise ValueError(f"mapping {self}: loop {name} ({nest.loop(name).kind}) on "
                                     f"{kind} dim {dim}")

    def describe(self) -> str:
        """``intrin[i<-o, r<-c.rw]``: each intrinsic dim and the loops fused onto it."""
        return self.intrinsic + "[" + ", ".join(
            f"{k}<-{'.'.join(g) or '-'}" for k, g in zip(_dims_of(self), self.groups)) + "]"

    def to_json(self) -> dict[str, object]:
        return {"intrinsic": self.intrinsic, "groups": [list(g) for g in self.groups],
                "generator": self.generator}

    @classmethod
    def from_json(cls, data: dict[str, object]) -> Mapping:
        return cls(str(data["intrinsic"]), tuple(tuple(g) for g in data["groups"]),  # type: ignore[union-attr]
                   str(data.get("generator", "amos")))


def _dims_of(mapping: Mapping) -> tuple[str, ...]:
    from .intrinsics import INTRINSICS  # which builds its table from this module

    intrin = INTRINSICS.get(mapping.intrinsic)
    return intrin.dim_names if intrin else tuple(f"d{k}" for k in range(len(mapping.groups)))


class MappingGenerator:
    """Produces the mappings of an operator's loop nest onto an intrinsic."""

    name: str = ""
    ranked: bool = False
    """``True`` when :meth:`generate` returns the mappings best first (``mappings_for``
    then keeps that order instead of sorting by padding)."""

    def generate(self, nest: LoopNest, intrinsic: Intrinsic) -> list[Mapping]:
        raise NotImplementedError


GENERATORS: dict[str, Callable[[], MappingGenerator]] = {}


def register(cls: type[MappingGenerator]) -> type[MappingGenerator]:
    """Class decorator: make a generator available by its ``name``."""
    GENERATORS[cls.name] = cls
    return cls

"""Index arithmetic shared by numpy (data transforms) and TIR (code generation).

Every layout primitive maps index vectors in both directions. The same code runs on
Python ints, numpy integer arrays (to move data) and TIR expressions (to rewrite tensor
accesses), so these helpers dispatch on the operand type. A *validity* is ``None``
(always valid) or a boolean of the same kind as the indices.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Union

import numpy as np

if TYPE_CHECKING:
    from tvm.ir.expr import Expr

Index = Union[int, np.ndarray, "Expr"]  # noqa: UP007 (a runtime alias)
Valid = Union[None, bool, np.ndarray, "Expr"]  # noqa: UP007


def is_tir(*values: Any) -> bool:
    """Whether any operand is a TIR expression (none is before TVM is imported: numpy-only
    users, such as the shape checks of a config being read, never import it)."""
    expr = sys.modules.get("tvm.ir.expr")
    return expr is not None and any(isinstance(v, expr.Expr) for v in values)


def _tirx() -> Any:
    """TVM's ``tirx``, for operands :func:`is_tir` found to be TIR (TVM is loaded then)."""
    from tvm import tirx

    return tirx


def floordiv(a: Index, b: int) -> Index:
    if b == 1:
        return a
    return _tirx().floordiv(a, b) if is_tir(a) else a // b


def floormod(a: Index, b: int) -> Index:
    if b == 1:
        return 0
    return _tirx().floormod(a, b) if is_tir(a) else a % b


def minimum(a: Index, b: int) -> Index:
    return _tirx().min(a, b) if is_tir(a) else np.minimum(a, b)


def in_range(x: Index, lo: int, hi: int) -> Valid:
    """``lo <= x < hi`` (``None`` when it always holds for a plain int)."""
    if isinstance(x, (int, np.integer)):
        return None if lo <= x < hi else False
    if is_tir(x):
        return _tirx().all(x >= lo, x < hi)
    return (x >= lo) & (x < hi)


def both(a: Valid, b: Valid) -> Valid:
    """Conjunction of two validities."""
    if a is None:
        return b
    if b is None:
        return a
    if is_tir(a, b):
        return _tirx().all(a, b)
    return np.logical_and(a, b)


def linear(digits: list[Index], sizes: list[int]) -> Index:
    """Row-major linear index of ``digits`` in a box of ``sizes``."""
    total: Index = 0
    for digit, size in zip(digits, sizes):
        total = digit if isinstance(total, int) and total == 0 else total * size + digit
    return total


def delinear(value: Index, sizes: list[int]) -> list[Index]:
    """Inverse of :func:`linear`: the row-major digits of ``value`` (the first one unbounded)."""
    digits: list[Index] = []
    stride = int(np.prod(sizes[1:], dtype=np.int64)) if len(sizes) > 1 else 1
    for j, size in enumerate(sizes):
        digit = floordiv(value, stride)
        if j > 0:
            digit = floormod(digit, size)
        digits.append(digit)
        if j + 1 < len(sizes):
            stride //= sizes[j + 1]
    return digits


@dataclass(frozen=True)
class Window:
    """A sliding-window access ``stride * index + offset`` with ``0 <= offset < extent``.

    Convolutions read their input as ``V*i + r`` (ALT §4.1.2): ``index`` is the output
    position ``i``, ``stride`` the convolution stride ``V``, ``offset`` the reduction term
    (``r * dilation``) and ``extent`` the window size ``M``. An ``unfold`` that matches the
    window rewrites such an access with Eq. 1 so the whole window stays in one tile.
    """

    index: Index
    offset: Index
    stride: int
    extent: int

    def flat(self) -> Index:
        scaled = self.index * self.stride if self.stride != 1 else self.index
        return scaled + self.offset


def flat(x: Index | Window) -> Index:
    """The plain index of ``x`` (a window collapses to ``stride * index + offset``)."""
    return x.flat() if isinstance(x, Window) else x

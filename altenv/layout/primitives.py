"""The layout primitives of ALT (§4.1, Table 1) and their inverses.

A primitive is bound to the shape it applies to (``in_shape``) and maps index vectors
both ways: ``to_physical`` takes an index of its input (the logical side) to its output
(the physical side), ``to_logical`` the other way. Both return ``(indices, validity)``;
an invalid position holds a zero (padding, the tail of the last unfolded tile, or a slot
that belongs to an attached tensor). Basic primitives (split, reorder, fuse) are
bijections; advanced ones (unfold, pad, store_at) are not, and their inverses are
``fold``, ``unpad`` and ``decouple_at``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .indexing import (
    Valid,
    Window,
    both,
    delinear,
    flat,
    floordiv,
    in_range,
    linear,
    minimum,
)

if TYPE_CHECKING:
    from .layout import Layout

Shape = tuple[int, ...]
IndexList = list  # list[Index | Window]


def _check_dim(dim: int, rank: int, what: str) -> None:
    if not isinstance(dim, int) or not 0 <= dim < rank:
        raise ValueError(f"{what}: dim {dim!r} out of range for a {rank}-D layout (0..{rank - 1})")


@dataclass(frozen=True)
class Primitive:
    """Base class: a layout transformation bound to its input shape."""

    in_shape: Shape

    name = "primitive"
    advanced = False

    @property
    def out_shape(self) -> Shape:
        raise NotImplementedError

    def to_physical(self, idx: IndexList) -> tuple[IndexList, Valid]:
        raise NotImplementedError

    def to_logical(self, idx: IndexList) -> tuple[IndexList, Valid]:
        raise NotImplementedError

    def inverse(self) -> Primitive:
        raise NotImplementedError

    def is_trivial(self) -> bool:
        """Whether the primitive leaves the data unchanged (e.g. a zero pad)."""
        return self.in_shape == self.out_shape and self.to_logical_is_identity()

    def to_logical_is_identity(self) -> bool:
        return False

    def state(self) -> list[int]:
        """The primitive's current parameters, the RL state of ALT §5.2.1."""
        raise NotImplementedError

    def params(self) -> dict[str, Any]:
        """JSON-able parameters (the shape is implied by the position in a layout)."""
        raise NotImplementedError


@dataclass(frozen=True)
class Split(Primitive):
    """``split(dim, factors)``: dimension ``dim`` becomes ``len(factors)`` dimensions."""

    dim: int
    factors: tuple[int, ...]
    name = "split"

    def __post_init__(self) -> None:
        _check_dim(self.dim, len(self.in_shape), "split")
        if math.prod(self.factors) != self.in_shape[self.dim] or min(self.factors) < 1:
            raise ValueError(
                f"split: factors {list(self.factors)} of dim {self.dim} multiply to "
                f"{math.prod(self.factors)}, but the dim has size {self.in_shape[self.dim]}"
            )

    @property
    def out_shape(self) -> Shape:
        s = self.in_shape
        return s[: self.dim] + tuple(self.factors) + s[self.dim + 1 :]

    def to_physical(self, idx: IndexList) -> tuple[IndexList, Valid]:
        parts = delinear(flat(idx[self.dim]), list(self.factors))
        return idx[: self.dim] + parts + idx[self.dim + 1 :], None

    def to_logical(self, idx: IndexList) -> tuple[IndexList, Valid]:
        k = len(self.factors)
        digits = [flat(x) for x in idx[self.dim : self.dim + k]]
        return idx[: self.dim] + [linear(digits, list(self.factors))] + idx[self.dim + k :], None

    def inverse(self) -> Primitive:
        return Fuse(self.out_shape, self.dim, len(self.factors))

    def to_logical_is_identity(self) -> bool:
        return len(self.factors) == 1

    def state(self) -> list[int]:
        return list(self.factors)

    def params(self) -> dict[str, Any]:
        return {"dim": self.dim, "factors": list(self.factors)}


@dataclass(frozen=True)
class Fuse(Primitive):
    """``fuse(dims)``: ``count`` consecutive dimensions from ``dim`` become one."""

    dim: int
    count: int
    name = "fuse"

    def __post_init__(self) -> None:
        _check_dim(self.dim, len(self.in_shape), "fuse")
        if self.count < 1 or self.dim + self.count > len(self.in_shape):
            raise ValueError(
                f"fuse: dims {self.dim}..{self.dim + self.count - 1} exceed the "
                f"{len(self.in_shape)}-D layout"
            )

    @property
    def sizes(self) -> list[int]:
        return list(self.in_shape[self.dim : self.dim + self.count])

    @property
    def out_shape(self) -> Shape:
        s = self.in_shape
        return s[: self.dim] + (math.prod(self.sizes),) + s[self.dim + self.count :]

    def to_physical(self, idx: IndexList) -> tuple[IndexList, Valid]:
        digits = [flat(x) for x in idx[self.dim : self.dim + self.count]]
        return idx[: self.dim] + [linear(digits, self.sizes)] + idx[self.dim + self.count :], None

    def to_logical(self, idx: IndexList) -> tuple[IndexList, Valid]:
        parts = delinear(flat(idx[self.dim]), self.sizes)
        return idx[: self.dim] + parts + idx[self.dim + 1 :], None

    def inverse(self) -> Primitive:
        return Split(self.out_shape, self.dim, tuple(self.sizes))

    def to_logical_is_identity(self) -> bool:
        return self.count == 1

    def state(self) -> list[int]:
        return [math.prod(self.sizes)]

    def params(self) -> dict[str, Any]:
        return {"dims": list(range(self.dim, self.dim + self.count))}


@dataclass(frozen=True)
class Reorder(Primitive):
    """``reorder(perm)``: new dimension ``i`` is old dimension ``perm[i]``."""

    perm: tuple[int, ...]
    name = "reorder"

    def __post_init__(self) -> None:
        if sorted(self.perm) != list(range(len(self.in_shape))):
            raise ValueError(
                f"reorder: {list(self.perm)} is not a permutation of "
                f"0..{len(self.in_shape) - 1}"
            )

    @property
    def out_shape(self) -> Shape:
        return tuple(self.in_shape[p] for p in self.perm)

    def to_physical(self, idx: IndexList) -> tuple[IndexList, Valid]:
        return [idx[p] for p in self.perm], None

    def to_logical(self, idx: IndexList) -> tuple[IndexList, Valid]:
        old: IndexList = [None] * len(self.perm)
        for new_pos, p in enumerate(self.perm):
            old[p] = idx[new_pos]
        return old, None

    def inverse(self) -> Primitive:
        inv = [0] * len(self.perm)
        for new_pos, p in enumerate(self.perm):
            inv[p] = new_pos
        return Reorder(self.out_shape, tuple(inv))

    def to_logical_is_identity(self) -> bool:
        return list(self.perm) == sorted(self.perm)

    def state(self) -> list[int]:
        return list(self.perm)

    def params(self) -> dict[str, Any]:
        return {"perm": list(self.perm)}


@dataclass(frozen=True)
class Unfold(Primitive):
    """``unfold(dim, tile, stride)``: overlapped tiling (ALT §4.1.2).

    Dimension ``dim`` of size ``D`` becomes ``ceil((D - tile) / stride) + 1`` tiles of
    ``tile`` elements; element ``[a, b]`` is logical ``a * stride + b`` (zero past the end).
    A read of a :class:`Window` whose windows fit the tiles uses Eq. 1; any other read
    uses the canonical copy (the first tile that holds the element). A stride above the
    tile skips the elements between tiles (e.g. the rows a strided 1x1 convolution never
    reads); they are not stored and read back as zero.
    """

    dim: int
    tile: int
    stride: int
    name = "unfold"
    advanced = True

    def __post_init__(self) -> None:
        _check_dim(self.dim, len(self.in_shape), "unfold")
        size = self.in_shape[self.dim]
        if self.stride < 1:
            raise ValueError(f"unfold: stride must be >= 1, got {self.stride}")
        if not 1 <= self.tile <= size:
            raise ValueError(f"unfold: tile {self.tile} must be in 1..{size} "
                             f"(size of dim {self.dim})")

    @property
    def size(self) -> int:
        return self.in_shape[self.dim]

    @property
    def tiles(self) -> int:
        return -(-(self.size - self.tile) // self.stride) + 1

    @property
    def out_shape(self) -> Shape:
        s = self.in_shape
        return s[: self.dim] + (self.tiles, self.tile) + s[self.dim + 1 :]

    def window_tiles(self, w: Window) -> int | None:
        """Windows per tile when ``w`` is rewritten by Eq. 1, or ``None`` if it does not fit."""
        per_tile = (self.tile - w.extent) // w.stride + 1
        if w.extent <= self.tile and self.stride == w.stride * per_tile:
            return per_tile
        return None

    def to_physical(self, idx: IndexList) -> tuple[IndexList, Valid]:
        x = idx[self.dim]
        per_tile = self.window_tiles(x) if isinstance(x, Window) else None
        if per_tile is not None:  # Eq. 1
            a = floordiv(x.index, per_tile)
            b = x.flat() - a * self.stride
        else:
            x = flat(x)
            a = minimum(floordiv(x, self.stride), self.tiles - 1)
            b = x - a * self.stride
            if self.stride > self.tile:
                return idx[: self.dim] + [a, b] + idx[self.dim + 1 :], in_range(b, 0, self.tile)
        return idx[: self.dim] + [a, b] + idx[self.dim + 1 :], None

    def to_logical(self, idx: IndexList) -> tuple[IndexList, Valid]:
        x = flat(idx[self.dim]) * self.stride + flat(idx[self.dim + 1])
        return idx[: self.dim] + [x] + idx[self.dim + 2 :], in_range(x, 0, self.size)

    def inverse(self) -> Primitive:
        return Fold(self.out_shape, self.dim, self.stride, self.size)

    def is_trivial(self) -> bool:
        return self.tiles == 1 and self.tile == self.size

    def state(self) -> list[int]:
        return [self.tiles, self.tile]

    def params(self) -> dict[str, Any]:
        return {"dim": self.dim, "tile": self.tile, "stride": self.stride}


@dataclass(frozen=True)
class Pad(Primitive):
    """``pad(dim, before, after)``: zeros around dimension ``dim``."""

    dim: int
    before: int
    after: int
    name = "pad"
    advanced = True

    def __post_init__(self) -> None:
        _check_dim(self.dim, len(self.in_shape), "pad")
        if self.before < 0 or self.after < 0:
            raise ValueError(f"pad: before/after must be >= 0, got {self.before}, {self.after}")

    @property
    def out_shape(self) -> Shape:
        s = list(self.in_shape)
        s[self.dim] += self.before + self.after
        return tuple(s)

    def to_physical(self, idx: IndexList) -> tuple[IndexList, Valid]:
        return idx[: self.dim] + [flat(idx[self.dim]) + self.before] + idx[self.dim + 1 :], None

    def to_logical(self, idx: IndexList) -> tuple[IndexList, Valid]:
        x = flat(idx[self.dim])
        valid = in_range(x, self.before, self.before + self.in_shape[self.dim])
        return idx[: self.dim] + [x - self.before] + idx[self.dim + 1 :], valid

    def inverse(self) -> Primitive:
        return Unpad(self.out_shape, self.dim, self.before, self.after)

    def to_logical_is_identity(self) -> bool:
        return self.before == 0 and self.after == 0

    def state(self) -> list[int]:
        return [self.before, self.after]

    def params(self) -> dict[str, Any]:
        return {"dim": self.dim, "before": self.before, "after": self.after}


@dataclass(frozen=True)
class StoreAt(Primitive):
    """``store_at(guest, dim)``: append tensor ``guest`` after this one along ``dim``.

    ALT's example attaches a bias vector to a weight matrix so that each weight column
    and its bias share a cache line. The guest's physical shape must equal this shape
    without ``dim`` (it then takes one slot) or with any extent at ``dim``.
    """

    guest: Layout = field(compare=False)
    dim: int = 0
    name = "store_at"
    advanced = True

    def __post_init__(self) -> None:
        _check_dim(self.dim, len(self.in_shape), "store_at")
        host = list(self.in_shape)
        g = list(self.guest.shape)
        others = host[: self.dim] + host[self.dim + 1 :]
        if len(g) == len(host) - 1:
            ok = g == others
        else:
            ok = len(g) == len(host) and g[: self.dim] + g[self.dim + 1 :] == others
        if not ok:
            raise ValueError(
                f"store_at: guest shape {tuple(g)} does not fit host shape {self.in_shape} at "
                f"dim {self.dim} (need the host shape without dim {self.dim}, or with another "
                "extent there)"
            )

    @property
    def guest_extent(self) -> int:
        g = self.guest.shape
        return 1 if len(g) == len(self.in_shape) - 1 else g[self.dim]

    @property
    def out_shape(self) -> Shape:
        s = list(self.in_shape)
        s[self.dim] += self.guest_extent
        return tuple(s)

    def to_physical(self, idx: IndexList) -> tuple[IndexList, Valid]:
        return list(idx), None

    def to_logical(self, idx: IndexList) -> tuple[IndexList, Valid]:
        return list(idx), in_range(flat(idx[self.dim]), 0, self.in_shape[self.dim])

    def guest_to_host(self, guest_idx: IndexList) -> tuple[IndexList, Valid]:
        """The host-side index of a guest element (guest logical index in)."""
        phys, valid = self.guest.to_physical(guest_idx)
        phys = [flat(x) for x in phys]
        if len(phys) == len(self.in_shape) - 1:
            phys = phys[: self.dim] + [0] + phys[self.dim :]
        phys[self.dim] = phys[self.dim] + self.in_shape[self.dim]
        return phys, valid

    def host_to_guest(self, idx: IndexList) -> tuple[IndexList, Valid]:
        """The guest logical index stored at a host-side position, and whether it is one."""
        local = [flat(x) for x in idx]
        local[self.dim] = local[self.dim] - self.in_shape[self.dim]
        is_guest = in_range(local[self.dim], 0, self.guest_extent)
        if len(self.guest.shape) == len(self.in_shape) - 1:
            local = local[: self.dim] + local[self.dim + 1 :]
        logical, valid = self.guest.to_logical(local)
        return logical, both(is_guest, valid)

    def inverse(self) -> Primitive:
        return DecoupleAt(self.out_shape, self.dim, self.guest_extent)

    def state(self) -> list[int]:
        return [self.dim, self.guest_extent]

    def params(self) -> dict[str, Any]:
        return {"dim": self.dim, "guest": self.guest.to_json()}


@dataclass(frozen=True)
class Fold(Primitive):
    """``fold(dim, stride, size)``: inverse of unfold; dims ``dim, dim+1`` become one dim."""

    dim: int
    stride: int
    size: int
    name = "fold"

    def __post_init__(self) -> None:
        _check_dim(self.dim, len(self.in_shape) - 1, "fold")
        tiles, tile = self.in_shape[self.dim], self.in_shape[self.dim + 1]
        expected = -(-(self.size - tile) // max(self.stride, 1)) + 1 if self.size >= tile else -1
        if self.stride < 1 or tiles != expected:
            raise ValueError(
                f"fold: dims {self.dim},{self.dim + 1} of sizes {tiles}x{tile} are not an unfold "
                f"of size {self.size} with stride {self.stride}"
            )

    def _unfold(self) -> Unfold:
        s = self.in_shape
        return Unfold(s[: self.dim] + (self.size,) + s[self.dim + 2 :], self.dim,
                      s[self.dim + 1], self.stride)

    @property
    def out_shape(self) -> Shape:
        return self._unfold().in_shape

    def to_physical(self, idx: IndexList) -> tuple[IndexList, Valid]:
        return self._unfold().to_logical(idx)

    def to_logical(self, idx: IndexList) -> tuple[IndexList, Valid]:
        return self._unfold().to_physical(idx)

    def inverse(self) -> Primitive:
        return self._unfold()

    def state(self) -> list[int]:
        return [self.size]

    def params(self) -> dict[str, Any]:
        return {"dim": self.dim, "stride": self.stride, "size": self.size}


@dataclass(frozen=True)
class Unpad(Primitive):
    """``unpad(dim, before, after)``: inverse of pad; drops ``before``/``after`` slots."""

    dim: int
    before: int
    after: int
    name = "unpad"

    def __post_init__(self) -> None:
        _check_dim(self.dim, len(self.in_shape), "unpad")
        if self.before < 0 or self.after < 0 or self.before + self.after >= self.in_shape[self.dim]:
            raise ValueError(
                f"unpad: cannot remove {self.before}+{self.after} slots from dim {self.dim} "
                f"of size {self.in_shape[self.dim]}"
            )

    def _pad(self) -> Pad:
        s = list(self.in_shape)
        s[self.dim] -= self.before + self.after
        return Pad(tuple(s), self.dim, self.before, self.after)

    @property
    def out_shape(self) -> Shape:
        return self._pad().in_shape

    def to_physical(self, idx: IndexList) -> tuple[IndexList, Valid]:
        return self._pad().to_logical(idx)

    def to_logical(self, idx: IndexList) -> tuple[IndexList, Valid]:
        return self._pad().to_physical(idx)

    def inverse(self) -> Primitive:
        return self._pad()

    def state(self) -> list[int]:
        return [self.before, self.after]

    def params(self) -> dict[str, Any]:
        return {"dim": self.dim, "before": self.before, "after": self.after}


@dataclass(frozen=True)
class DecoupleAt(Primitive):
    """``decouple_at(dim, extent)``: inverse of store_at; drops the attached ``extent`` slots."""

    dim: int
    extent: int
    name = "decouple_at"

    def __post_init__(self) -> None:
        _check_dim(self.dim, len(self.in_shape), "decouple_at")
        if not 1 <= self.extent < self.in_shape[self.dim]:
            raise ValueError(
                f"decouple_at: extent {self.extent} must be in 1..{self.in_shape[self.dim] - 1}"
            )

    @property
    def out_shape(self) -> Shape:
        s = list(self.in_shape)
        s[self.dim] -= self.extent
        return tuple(s)

    def to_physical(self, idx: IndexList) -> tuple[IndexList, Valid]:
        return list(idx), in_range(flat(idx[self.dim]), 0, self.out_shape[self.dim])

    def to_logical(self, idx: IndexList) -> tuple[IndexList, Valid]:
        return list(idx), None

    def inverse(self) -> Primitive:
        raise ValueError("decouple_at: the attached tensor is gone; re-attach it with store_at")

    def state(self) -> list[int]:
        return [self.dim, self.extent]

    def params(self) -> dict[str, Any]:
        return {"dim": self.dim, "extent": self.extent}

"""``Layout``: a tensor's logical shape plus a recorded sequence of layout primitives.

Primitives are recorded lazily (ALT §4.1) and take effect where programs are generated:
``to_physical`` rewrites a read of logical element ``idx`` into the physical tensor,
``to_logical`` maps a physical position back (to rebuild an output loop nest, ALT §6),
and ``apply``/``invert`` move numpy data between the two forms. Layouts are immutable:
every primitive returns a new ``Layout``, so calls chain.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from .indexing import Index, Valid, Window, both, flat, is_tir
from .primitives import (
    DecoupleAt,
    Fold,
    Fuse,
    Pad,
    Primitive,
    Reorder,
    Split,
    StoreAt,
    Unfold,
    Unpad,
)

Shape = tuple[int, ...]


class Layout:
    """The data layout of one tensor.

    Parameters
    ----------
    shape:
        The logical shape (the operator's view, e.g. NCHW for a convolution input).
    names:
        Optional dimension names for printing, e.g. ``"NOHW"`` or ``["N", "O", "H", "W"]``.

    Example (ALT §4.1.1: ``N O/ot H W ot`` from ``NOHW``)::

        Layout((1, 64, 56, 56), "NOHW").split(1, [-1, 16]).reorder([0, 1, 3, 4, 2])
    """

    def __init__(self, shape: Sequence[int], names: Sequence[str] | str | None = None,
                 _prims: tuple[Primitive, ...] = (), _names: tuple[str, ...] | None = None):
        shape = tuple(int(s) for s in shape)
        if any(s < 1 for s in shape):
            raise ValueError(f"Layout: every dimension must be >= 1, got shape {shape}")
        if names is not None and len(names) != len(shape):
            raise ValueError(f"Layout: {len(names)} names for a {len(shape)}-D shape")
        self.logical_shape: Shape = shape
        self.primitives: tuple[Primitive, ...] = _prims
        self.logical_names: tuple[str, ...] = (
            tuple(names) if names is not None else tuple(f"d{i}" for i in range(len(shape)))
        )
        self.names: tuple[str, ...] = _names if _names is not None else self.logical_names

    # ------------------------------------------------------------------ basics
    @property
    def shape(self) -> Shape:
        """The physical shape after every primitive."""
        return self.primitives[-1].out_shape if self.primitives else self.logical_shape

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def is_identity(self) -> bool:
        """Whether the physical data equals the logical data."""
        return all(p.is_trivial() for p in self.primitives)

    def has_nontrivial_advanced(self) -> bool:
        """Whether a non-trivial unfold/pad/store_at is recorded (ALT Alg. 1, line 3)."""
        return any(p.advanced and not p.is_trivial() for p in self.primitives)

    def _with(self, prim: Primitive, names: Sequence[str]) -> Layout:
        return Layout(self.logical_shape, self.logical_names, self.primitives + (prim,),
                      tuple(names))

    def _dim(self, dim: int, what: str) -> int:
        if not isinstance(dim, (int, np.integer)) or not 0 <= dim < self.ndim:
            raise ValueError(f"{what}: dim {dim!r} out of range for the {self.ndim}-D layout "
                             f"{self.describe()} (valid: 0..{self.ndim - 1})")
        return int(dim)

    # -------------------------------------------------------------- primitives
    def split(self, dim: int, factors: Sequence[int]) -> Layout:
        """Split ``dim`` into ``factors`` (outer first); one factor may be -1 (inferred)."""
        dim = self._dim(dim, "split")
        size = self.shape[dim]
        factors = [int(f) for f in factors]
        if not factors or factors.count(-1) > 1 or any(f < 1 and f != -1 for f in factors):
            raise ValueError(f"split: factors {factors} must be >= 1 with at most one -1")
        known = math.prod(f for f in factors if f != -1)
        if -1 in factors:
            if size % known:
                raise ValueError(f"split: factors {factors} do not divide dim {dim} of size {size}"
                                 " (pad the dim first to make it divide)")
            factors[factors.index(-1)] = size // known
        elif known != size:
            raise ValueError(f"split: factors {factors} multiply to {known}, but dim {dim} has "
                             f"size {size}")
        base = self.names[dim]
        names = [base] if len(factors) == 1 else [f"{base}{j}" for j in range(len(factors))]
        return self._with(Split(self.shape, dim, tuple(factors)),
                          self.names[:dim] + tuple(names) + self.names[dim + 1:])

    def reorder(self, perm: Sequence[int]) -> Layout:
        """Permute dims: new dim ``i`` is old dim ``perm[i]``."""
        perm = tuple(int(p) for p in perm)
        if sorted(perm) != list(range(self.ndim)):
            raise ValueError(f"reorder: {list(perm)} is not a permutation of 0..{self.ndim - 1}")
        return self._with(Reorder(self.shape, perm), [self.names[p] for p in perm])

    def fuse(self, dims: Sequence[int]) -> Layout:
        """Fuse consecutive ``dims`` into one."""
        dims = [self._dim(d, "fuse") for d in dims]
        if not dims or dims != list(range(dims[0], dims[0] + len(dims))):
            raise ValueError(f"fuse: dims {dims} must be consecutive and increasing")
        name = "(" + "".join(self.names[d] for d in dims) + ")"
        return self._with(Fuse(self.shape, dims[0], len(dims)),
                          self.names[:dims[0]] + (name,) + self.names[dims[-1] + 1:])

    def unfold(self, dim: int, tile: int, stride: int) -> Layout:
        """Overlapped tiling of ``dim``: tiles of ``tile`` elements every ``stride``."""
        dim = self._dim(dim, "unfold")
        base = self.names[dim]
        return self._with(Unfold(self.shape, dim, int(tile), int(stride)),
                          self.names[:dim] + (f"{base}o", f"{base}i") + self.names[dim + 1:])

    def pad(self, dim: int, before: int = 0, after: int = 0) -> Layout:
        """Append zeros before/after ``dim``."""
        dim = self._dim(dim, "pad")
        return self._with(Pad(self.shape, dim, int(before), int(after)), self.names)

    def store_at(self, guest: Layout, dim: int) -> Layout:
        """Attach tensor ``guest`` (with its own layout) after this one along ``dim``."""
        dim = self._dim(dim, "store_at")
        return self._with(StoreAt(self.shape, guest, dim), self.names)

    def fold(self, dim: int, stride: int, size: int) -> Layout:
        """Inverse of unfold: merge tile dims ``dim, dim+1`` back into one of ``size``."""
        if not 0 <= dim < self.ndim - 1:
            raise ValueError(f"fold: dim {dim} needs a following tile dim in the {self.ndim}-D "
                             f"layout {self.describe()}")
        base = self.names[dim].removesuffix("o")
        return self._with(Fold(self.shape, dim, int(stride), int(size)),
                          self.names[:dim] + (base,) + self.names[dim + 2:])

    def unpad(self, dim: int, before: int = 0, after: int = 0) -> Layout:
        """Inverse of pad: drop ``before``/``after`` slots of ``dim``."""
        dim = self._dim(dim, "unpad")
        return self._with(Unpad(self.shape, dim, int(before), int(after)), self.names)

    def decouple_at(self, dim: int, extent: int = 1) -> Layout:
        """Inverse of store_at: drop the ``extent`` attached slots at the end of ``dim``."""
        dim = self._dim(dim, "decouple_at")
        return self._with(DecoupleAt(self.shape, dim, int(extent)), self.names)

    def then(self, other: Layout) -> Layout:
        """This layout followed by ``other``'s primitives (``other`` is a layout of this
        layout's physical shape), e.g. a pad followed by a template's tiling."""
        if other.logical_shape != self.shape:
            raise ValueError(f"then: {other} is a layout of shape {other.logical_shape}, not of "
                             f"this layout's physical shape {self.shape}")
        return _replay(self, other.to_json()["primitives"])

    def inverse(self) -> list[Primitive]:
        """The inverse primitive sequence (physical -> logical), as ALT's ``S^-1``."""
        return [p.inverse() for p in reversed(self.primitives)]

    # ------------------------------------------------------------- index maps
    def to_physical(self, idx: Sequence[Index | Window]) -> tuple[list[Index], Valid]:
        """Physical index of logical element ``idx`` (a read or write access).

        Entries may be :class:`Window` objects for sliding-window reads (Eq. 1). The
        validity is ``None`` unless the element is absent (e.g. removed by ``unpad``).
        """
        if len(idx) != len(self.logical_shape):
            raise ValueError(f"to_physical: {len(idx)} indices for a {len(self.logical_shape)}-D "
                             "tensor")
        cur, valid = list(idx), None
        for p in self.primitives:
            cur, v = p.to_physical(cur)
            valid = both(valid, v)
        return [flat(x) for x in cur], valid

    def to_logical(self, idx: Sequence[Index]) -> tuple[list[Index], Valid]:
        """Logical index held at physical position ``idx``; invalid where it holds padding."""
        if len(idx) != self.ndim:
            raise ValueError(f"to_logical: {len(idx)} indices for a {self.ndim}-D physical tensor")
        cur, valid = list(idx), None
        for p in reversed(self.primitives):
            cur, v = p.to_logical(cur)
            valid = both(valid, v)
        return cur, valid

    def attached_to_physical(self, guest_idx: Sequence[Index], which: int = 0
                             ) -> tuple[list[Index], Valid]:
        """Physical index of element ``guest_idx`` of the ``which``-th ``store_at`` guest."""
        stores = [i for i, p in enumerate(self.primitives) if isinstance(p, StoreAt)]
        if which >= len(stores):
            raise ValueError(f"attached_to_physical: the layout has {len(stores)} attached tensors")
        pos = stores[which]
        cur, valid = self.primitives[pos].guest_to_host(list(guest_idx))
        for p in self.primitives[pos + 1:]:
            cur, v = p.to_physical(cur)
            valid = both(valid, v)
        return [flat(x) for x in cur], valid

    # ------------------------------------------------------------------- data
    def apply(self, array: np.ndarray, *attached: np.ndarray) -> np.ndarray:
        """Logical -> physical data; ``attached`` are the ``store_at`` guests' logical arrays.
        Index vectors are formed :data:`CHUNK` physical positions at a time (see there)."""
        array = np.asarray(array)
        if array.shape != self.logical_shape:
            raise ValueError(f"apply: array shape {array.shape} != logical shape "
                             f"{self.logical_shape}")
        stores = [p for p in self.primitives if isinstance(p, StoreAt)]
        if len(attached) != len(stores):
            raise ValueError(f"apply: the layout has {len(stores)} attached tensors, "
                             f"got {len(attached)} extra arrays")
        out = np.zeros(math.prod(self.shape), dtype=array.dtype)
        for part, cur in _chunks(self.shape):
            block = out[part]  # a view: writes land in ``out``
            valid: Any = np.ones(block.shape, dtype=bool)
            guests = list(zip(stores, attached))
            for p in reversed(self.primitives):
                if isinstance(p, StoreAt):
                    _, data = guests.pop()
                    gidx, gvalid = p.host_to_guest(cur)
                    gmask = valid & _mask(gvalid, block.shape)
                    block[gmask] = _gather(np.asarray(data), gidx, gmask)
                cur, v = p.to_logical(cur)
                valid = valid & _mask(v, block.shape)
            block[valid] = _gather(array, cur, valid)
        return out.reshape(self.shape)

    def same_storage(self, other: Layout) -> bool:
        """Whether ``other``, a layout of the same logical shape, stores every element at the
        same offset of a buffer of the same size (converting between them is a reshape)."""
        size = math.prod(self.logical_shape)
        if (other.logical_shape != self.logical_shape or math.prod(self.shape) != size
                or math.prod(other.shape) != size):
            return False
        if any(isinstance(p, StoreAt) for p in (*self.primitives, *other.primitives)):
            return False
        offsets = np.arange(size).reshape(self.logical_shape)
        return bool(np.array_equal(self.apply(offsets).ravel(), other.apply(offsets).ravel()))

    def invert(self, physical: np.ndarray) -> np.ndarray:
        """Physical -> logical data (an unfolded dim is read from its canonical copy)."""
        physical = np.asarray(physical)
        if physical.shape != self.shape:
            raise ValueError(f"invert: array shape {physical.shape} != physical shape {self.shape}")
        return _pull(physical, self.logical_shape, self.to_physical)

    def detach(self, physical: np.ndarray, which: int = 0) -> np.ndarray:
        """The logical data of the ``which``-th ``store_at`` guest held in ``physical``."""
        stores = [p for p in self.primitives if isinstance(p, StoreAt)]
        guest = stores[which].guest
        return _pull(np.asarray(physical), guest.logical_shape,
                     lambda idx: self.attached_to_physical(idx, which))

    # ------------------------------------------------------------ description
    def state(self) -> list[int]:
        """Concatenated parameters of every primitive (ALT §5.2.1's RL state)."""
        return [v for p in self.primitives for v in p.state()]

    def describe(self) -> str:
        """ALT-style notation: each physical dim's name and size, e.g. ``N:1 H0:7 ...``."""
        return " ".join(f"{n}:{s}" for n, s in zip(self.names, self.shape))

    def __repr__(self) -> str:
        return f"Layout({self.describe()})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Layout) and self.to_json() == other.to_json()

    def __hash__(self) -> int:
        return hash(json.dumps(self.to_json(), sort_keys=True))

    def to_json(self) -> dict[str, Any]:
        """A JSON-able description that :meth:`from_json` replays."""
        return {
            "shape": list(self.logical_shape),
            "names": list(self.logical_names),
            "primitives": [{"op": p.name, **p.params()} for p in self.primitives],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Layout:
        return _replay(cls(data["shape"], data.get("names")), data["primitives"])


_REPLAY = {"split", "reorder", "fuse", "unfold", "pad", "store_at", "fold", "unpad", "decouple_at"}


def _replay(layout: Layout, steps: list[dict[str, Any]]) -> Layout:
    """Apply JSON primitive steps (``{"op": name, **params}``) through the public methods."""
    for step in steps:
        args = dict(step)
        op = args.pop("op")
        if op not in _REPLAY:
            raise ValueError(f"unknown layout primitive {op!r}; known: {sorted(_REPLAY)}")
        if op == "store_at":
            args["guest"] = Layout.from_json(args["guest"])
        layout = getattr(layout, op)(**args)
    return layout


CHUNK = 1 << 18
"""Positions whose index vectors :meth:`Layout.apply` and :meth:`Layout.invert` form at
once. Over a whole tensor those vectors cost 8 bytes per dimension per element in each
intermediate: the correctness check of held-out dep_2's input laid out with 1x1 spatial tiles
(16x31x31x512 windows of 5x5, 197 M elements) grew the process to 22 GiB and the OOM killer
ended the bench; a chunk keeps them near 40 MB (1.4 GiB resident for that layout, most of
it the 0.8 GB tensor), whatever the tensor."""


def _chunks(shape: Shape) -> Iterator[tuple[slice, list[np.ndarray]]]:
    """Row-major runs of at most :data:`CHUNK` positions of ``shape``: the flat slice and
    the index vector of each dimension over it."""
    if not shape:  # a scalar: one position, no index
        yield slice(0, 1), []
        return
    size = math.prod(shape)
    for start in range(0, size, CHUNK):
        stop = min(size, start + CHUNK)
        yield slice(start, stop), list(np.unravel_index(np.arange(start, stop), shape))


def _pull(physical: np.ndarray, shape: Shape,
          to_physical: Callable[[list[Index]], tuple[list[Index], Valid]]) -> np.ndarray:
    """The array of ``shape`` whose element ``idx`` is ``physical[to_physical(idx)]``
    (zero where that index is not valid), chunk by chunk."""
    out = np.zeros(math.prod(shape), dtype=physical.dtype)
    for part, idx in _chunks(shape):
        block = out[part]
        where, valid = to_physical(idx)
        mask = _mask(valid, block.shape)
        block[mask] = _gather(physical, where, mask)
    return out.reshape(shape)


def _mask(valid: Valid, shape: Shape) -> np.ndarray:
    if valid is None:
        return np.ones(shape, dtype=bool)
    if is_tir(valid):
        raise TypeError("a TIR validity cannot mask numpy data")
    return np.broadcast_to(np.asarray(valid, dtype=bool), shape)


def _gather(array: np.ndarray, idx: Sequence[Any], mask: np.ndarray) -> np.ndarray:
    """``array[idx]`` at the positions where ``mask`` holds."""
    return array[tuple(np.broadcast_to(np.asarray(i), mask.shape)[mask] for i in idx)]

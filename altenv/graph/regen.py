"""Regenerate an elementwise or injective task in TE under arbitrary layouts.

A fused task made of spatial blocks (reshape, add, gelu, pad, ...) is first inlined into its
last block. That block's expression is then rebuilt as a TE stage whose loop nest runs over
the output's *physical* shape (ALT §6: the new loops are the output's dims, the logical
indices come from the inverse map) and whose loads go through each input's layout. So such
a task reads its inputs in whatever layout they are stored in and writes its output directly
in the layout its consumer wants, padding and overlapped tiles included (ALT Fig. 5b).

With ``fast_math`` the rebuilt expression calls TVM's fast polynomial versions of the named
float32 functions instead of the libm calls LLVM keeps scalar (:mod:`altenv.ops.expr`).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import Any

from tvm import s_tir, te, tirx

from altenv.layout import Layout
from altenv.ops.expr import rebuild


class Regenerable:
    """A task reduced to one spatial expression of its parameters.

    Use :meth:`of` to build one; it returns ``None`` for tasks that do not reduce (reductions,
    several outputs, partial writes).
    """

    def __init__(self, func: tirx.PrimFunc, value: Any, ivars: list[Any]) -> None:
        self.params = list(func.params)
        self.shapes = [tuple(int(d) for d in p.ty.shape) for p in self.params]
        self.dtypes = [str(p.ty.dtype) for p in self.params]
        self.value = value
        self.ivars = ivars

    @classmethod
    def of(cls, func: tirx.PrimFunc) -> Regenerable | None:
        sch = s_tir.Schedule(func)
        try:
            blocks = sch.get_child_blocks(sch.get_sblock("root"))
            for blk in blocks[:-1]:
                sch.compute_inline(blk)
        except RuntimeError:  # a ScheduleError: a block that does not inline
            return None
        block = sch.get(blocks[-1])
        store = block.body
        out = func.params[-1]
        if not isinstance(store, tirx.BufferStore) or not store.buffer.same_as(out):
            return None
        if any(iv.iter_type != 0 for iv in block.iter_vars):
            return None
        ivars = [iv.var for iv in block.iter_vars]
        extents = [int(iv.dom.extent) for iv in block.iter_vars]
        if (len(store.indices) != len(ivars) or not all(i.same_as(v) for i, v in
                                                         zip(store.indices, ivars))
                or extents != [int(d) for d in out.ty.shape] or not extents):
            return None
        regen = cls(func, store.value, ivars)
        try:  # every expression node must be one that can be rebuilt
            regen.func({}, Layout(extents))
        except ValueError:
            return None
        return regen

    def func(self, layouts: Mapping[int, Layout], out_layout: Layout,
             fast_math: Collection[str] = ()) -> tirx.PrimFunc:
        """The task with input ``k`` stored in ``layouts[k]`` (identity when absent) and the
        output written in ``out_layout``; positions holding no element are zero. The float32
        functions named in ``fast_math`` (keys of :data:`altenv.ops.expr.FAST_MATH`) are
        computed by their fast versions."""
        holders = []
        for k, (shape, dtype) in enumerate(zip(self.shapes[:-1], self.dtypes[:-1])):
            layout = layouts.get(k)
            holders.append(te.placeholder(layout.shape if layout else shape, dtype, f"in{k}"))
        dtype = self.dtypes[-1]

        def load(k: int, idx: list[Any]) -> Any:
            layout = layouts.get(k)
            if layout is None:
                return holders[k](*idx)
            phys, valid = layout.to_physical(idx)
            value = holders[k](*phys)
            return value if valid is None else tirx.if_then_else(
                valid, value, tirx.const(0, self.dtypes[k]))

        def body(*phys: Any) -> Any:
            logical, valid = out_layout.to_logical(list(phys))
            env = {v: _as(x, str(v.ty.dtype)) for v, x in zip(self.ivars, logical)}
            value = rebuild(self.value, env, self._param_loader(load), frozenset(fast_math))
            return value if valid is None else tirx.if_then_else(valid, value,
                                                                 tirx.const(0, dtype))

        out = te.compute(out_layout.shape, body, name="regen")
        return te.create_prim_func(holders + [out])

    def _param_loader(self, load: Callable[[int, list[Any]], Any]) -> Callable[[Any, list], Any]:
        def param_load(source: Any, idx: list[Any]) -> Any:
            for k, p in enumerate(self.params[:-1]):
                if p.same_as(source):
                    return load(k, idx)
            raise ValueError(f"regenerate: load from {source}, not a parameter")
        return param_load


def _as(x: Any, dtype: str) -> Any:
    if isinstance(x, int):
        return tirx.const(x, dtype)
    return x if str(x.ty.dtype) == dtype else tirx.Cast(dtype, x)

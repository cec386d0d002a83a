"""Regenerate an elementwise or injective task in TE under arbitrary layouts.

A fused task made of spatial blocks (reshape, add, gelu, pad, ...) is first inlined into its
last block. That block's expression is then rebuilt as a TE stage whose loop nest runs over
the output's *physical* shape (ALT §6: the new loops are the output's dims, the logical
indices come from the inverse map) and whose loads go through each input's layout. So such
a task reads its inputs in whatever layout they are stored in and writes its output directly
in the layout its consumer wants, padding and overlapped tiles included (ALT Fig. 5b).

With ``fast_math`` the rebuilt expression calls TVM's fast polynomial versions of the named
float32 functions (``topi.fast_erf``, ``fast_tanh``, ``fast_exp``) instead of the libm calls
LLVM keeps scalar: a GELU's ``erf`` then vectorizes (9x faster on BERT-tiny's GELU here;
``fast_erf`` is within 4.2e-7 of ``erf``, ``fast_exp`` within a relative 4.1e-6 of ``exp``).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import Any

import tvm.ir.expr as ire
import tvm.ir.prim.expr as pe
from tvm import s_tir, te, tirx, topi

from altenv.layout import Layout

#: The functions ``fast_math`` can name, with their TVM fast versions.
FAST_MATH = {"erf": topi.fast_erf, "tanh": topi.fast_tanh, "exp": topi.fast_exp}

_BINARY = (pe.Add, pe.Sub, pe.Mul, pe.Div, pe.Mod, pe.FloorDiv, pe.FloorMod, pe.Min, pe.Max,
           pe.EQ, pe.NE, pe.LT, pe.LE, pe.GT, pe.GE, pe.And, pe.Or)


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
        functions named in ``fast_math`` (keys of :data:`FAST_MATH`) are computed by their
        fast versions."""
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
            value = _rebuild(self.value, env, self._param_loader(load), frozenset(fast_math))
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


def _rebuild(e: Any, env: dict[Any, Any], load: Callable[[Any, list], Any],
             fast: frozenset[str] = frozenset()) -> Any:
    """``e`` with iteration variables replaced by ``env``, parameter loads by ``load`` and
    calls of the float32 functions in ``fast`` by their fast versions."""
    def go(x: Any) -> Any:
        return _rebuild(x, env, load, fast)

    if isinstance(e, _BINARY):
        return type(e)(go(e.a), go(e.b))
    if isinstance(e, pe.Cast):
        return pe.Cast(e.ty, go(e.value))
    if isinstance(e, pe.Not):
        return pe.Not(go(e.a))
    if isinstance(e, pe.Select):
        return pe.Select(go(e.condition), go(e.true_value), go(e.false_value))
    if isinstance(e, ire.TensorLoad):
        return load(e.source, [go(i) for i in e.indices])
    if isinstance(e, ire.Call) and e.op.name == "te.tensor_load":  # a TE stage's load
        return load(e.args[0], [go(i) for i in e.args[1:]])
    if isinstance(e, ire.Call):
        name = str(e.op.name).removeprefix("tirx.")
        if name in fast and len(e.args) == 1 and str(e.ty.dtype) == "float32":
            return _fast(name, go(e.args[0]))
        return ire.Call(e.op, [go(a) for a in e.args], ret_ty=e.ty)
    if isinstance(e, tirx.Var):
        return env.get(e, e)
    if isinstance(e, (pe.IntImm, pe.FloatImm)):
        return e
    raise ValueError(f"regenerate: unsupported expression {type(e).__name__}")


def _fast(name: str, arg: Any) -> Any:
    """TVM's fast ``name`` (a :data:`FAST_MATH` key) of the float32 expression ``arg``: the
    body of its TE stage over a one-element placeholder, the placeholder's loads replaced
    by ``arg``."""
    holder = te.placeholder((1,), "float32", "x")
    body = FAST_MATH[name](holder).op.body[0]
    return _rebuild(body, {}, lambda source, idx: arg)

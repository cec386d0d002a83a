"""TIR value expressions rebuilt, and float32 ``exp``, ``erf``, ``tanh`` computed by TVM's
fast polynomials.

LLVM keeps libm's ``expf``, ``erff`` and ``tanhf`` scalar, so an epilogue or elementwise task
that calls them runs one call per element even inside a vectorized loop: a SiLU
(``x * sigmoid(x)``, the sigmoid through ``exp``) on a 96x112x112 tensor took 6.8 ms on a
2-core AVX2 host (timed beside a tuning run), 1.6 ms with ``topi.fast_exp``; BERT-tiny's
GELU 130 us, 14 us with ``topi.fast_erf``. The fast versions are TVM's own (``topi.fast_exp``,
``fast_erf``, ``fast_tanh``), taken as plain expressions so that they inline into whatever
loop nest computes the value. ``fast_erf`` is within 4.2e-7 of ``erf``, ``fast_exp`` within a
relative 4.1e-6 of ``exp``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tvm.ir.expr as ire
import tvm.ir.prim.expr as pe
from tvm import te, tirx, topi

from .epilogue import ENABLED_BY

FAST_MATH = {"erf": topi.fast_erf, "tanh": topi.fast_tanh, "exp": topi.fast_exp}
"""The functions ``fast_math`` can name, with their TVM fast versions."""

_BINARY = (pe.Add, pe.Sub, pe.Mul, pe.Div, pe.Mod, pe.FloorDiv, pe.FloorMod, pe.Min, pe.Max,
           pe.EQ, pe.NE, pe.LT, pe.LE, pe.GT, pe.GE, pe.And, pe.Or, pe.LShift, pe.RShift,
           pe.BitwiseAnd, pe.BitwiseOr, pe.BitwiseXor)


def rebuild(e: Any, env: dict[Any, Any], load: Callable[[Any, list], Any],
            fast: frozenset[str] = frozenset()) -> Any:
    """``e`` with iteration variables replaced by ``env``, tensor loads by ``load(source,
    indices)`` and calls of the float32 functions in ``fast`` by their fast versions. Raises
    ``ValueError`` on an expression node it cannot rebuild."""
    def go(x: Any) -> Any:
        return rebuild(x, env, load, fast)

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
        if ENABLED_BY.get(name) in fast and len(e.args) == 1 and str(e.ty.dtype) == "float32":
            return fast_version(name, go(e.args[0]))
        return ire.Call(e.op, [go(a) for a in e.args], ret_ty=e.ty)
    if isinstance(e, tirx.Var):
        return env.get(e, e)
    if isinstance(e, (pe.IntImm, pe.FloatImm)):
        return e
    raise ValueError(f"rebuild: unsupported expression {type(e).__name__}")


def fast_version(name: str, arg: Any) -> Any:
    """The float32 ``name(arg)`` (``name`` a key of :data:`ENABLED_BY`) by TVM's fast
    polynomials: a sigmoid as ``1 / (1 + fast_exp(-arg))``."""
    if name != "sigmoid":
        return fast_call(name, arg)
    one = tirx.const(1.0, "float32")
    return one / (one + fast_call("exp", tirx.const(0.0, "float32") - arg))


def fast_call(name: str, arg: Any) -> Any:
    """TVM's fast ``name`` (a :data:`FAST_MATH` key) of the float32 expression ``arg``: its
    TE stages over a one-element placeholder inlined into one expression (``fast_tanh``
    clamps its input in a stage of its own), the placeholder's loads replaced by ``arg``."""
    holder = te.placeholder((1,), "float32", "x")

    def load(source: Any, idx: list[Any]) -> Any:
        if source.same_as(holder):
            return arg
        stage = source.op
        return rebuild(stage.body[0], {iv.var: i for iv, i in zip(stage.axis, idx)}, load)

    return rebuild(FAST_MATH[name](holder).op.body[0], {}, load)

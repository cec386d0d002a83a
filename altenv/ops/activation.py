"""Epilogue trees (:mod:`altenv.ops.epilogue`) evaluated: as a TIR expression in generated
code and as the torch reference it is checked against, from the same tree.

``fast_exp``, ``fast_sigmoid`` (through ``fast_exp``), ``fast_erf`` and ``fast_tanh`` compute
the float32 functions by TVM's polynomials (:mod:`altenv.ops.expr`), which vectorize where
libm's calls stay scalar. Their torch reference is the exact function, so the checks bound
the approximation too.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

import torch
from tvm import tirx

from .epilogue import FAST, ROUNDING, Tree
from .expr import fast_version


def _evaluate(tree: Tree, x: Any, const: Callable[[float], Any], ops: Mapping[str, Callable]
              ) -> Any:
    if tree == "x":
        return x
    if isinstance(tree, float):
        return const(tree)
    return ops[tree[0]](*(_evaluate(a, x, const, ops) for a in tree[1:]))


def _te_round(dtype: str, a: Any) -> Any:
    return a.astype(dtype).astype(a.ty.dtype)


def _torch_round(dtype: str, a: torch.Tensor) -> torch.Tensor:
    return a.to(getattr(torch, dtype)).to(a.dtype)


def _te_fast(name: str, a: Any) -> Any:
    """TVM's fast ``name`` of a float32 ``a`` (other dtypes: the exact function)."""
    return fast_version(name, a) if str(a.ty.dtype) == "float32" else _TE[name](a)


_COMMON = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
           "div": lambda a, b: a / b, "lt": lambda a, b: a < b, "le": lambda a, b: a <= b,
           "gt": lambda a, b: a > b, "ge": lambda a, b: a >= b}
_TE = {**_COMMON, "max": tirx.max, "min": tirx.min, "sigmoid": tirx.sigmoid,
       "tanh": tirx.tanh, "erf": tirx.erf, "exp": tirx.exp, "select": tirx.Select,
       **{FAST[f]: partial(_te_fast, f) for f in FAST},
       **{t: partial(_te_round, t) for t in ROUNDING}}
_TORCH = {**_COMMON, "max": torch.maximum, "min": torch.minimum, "sigmoid": torch.sigmoid,
          "tanh": torch.tanh, "erf": torch.erf, "exp": torch.exp, "select": torch.where,
          **{t: partial(_torch_round, t) for t in ROUNDING}}
_TORCH.update({FAST[f]: _TORCH[f] for f in FAST})  # the reference is the exact function


def te_value(tree: Tree, x: Any, dtype: str) -> Any:
    """The tree as a TIR expression of the value ``x`` (constants in ``dtype``)."""
    return _evaluate(tree, x, lambda v: tirx.const(v, dtype), _TE)


def torch_value(tree: Tree, x: torch.Tensor) -> torch.Tensor:
    """The tree applied to a torch tensor (the reference the generated code is checked
    against)."""
    return _evaluate(tree, x, lambda v: torch.tensor(v, dtype=x.dtype), _TORCH)

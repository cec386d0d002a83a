"""Epilogue steps: what configs, suites and record keys say is fused after an operator.

Relax fuses whatever elementwise chain a network applies after a convolution or matmul:
SiLU is ``x * sigmoid(x)``, GELU ``x * (0.5 + erf(x * 0.707...) * 0.5)``, a clamp
``max(min(x, hi), lo)``, leaky ReLU a ``select``. Reading that chain as a tree of a few
ops lets the generator emit any of them in the chosen layout without a case per
activation. One text form (``mul(x,sigmoid(x))``, or a name such as ``silu`` where the
tree is a known one) serves configs, record keys (``spec|bias+silu``: no ``+`` or ``|`` in
it) and the planner. This module is the grammar only (no TVM, no torch), so that reading a
config imports neither; :mod:`altenv.ops.activation` builds the TE expression and the torch
reference from the same tree, so the two cannot disagree.

A tree is ``"x"``, a ``float`` constant or a tuple ``(op, *operands)``. ``fast_exp``,
``fast_sigmoid`` (through ``fast_exp``), ``fast_erf`` and ``fast_tanh`` stand for TVM's
polynomial versions of the float32 functions; :func:`fast_step` swaps them in for a run's
``fast_math``.
"""


from __future__ import annotations

import math
import re
from collections.abc import Collection, Mapping
from typing import Annotated

from pydantic import AfterValidator

Tree = str | float | tuple

ENABLED_BY = {"exp": "exp", "sigmoid": "exp", "erf": "erf", "tanh": "tanh"}
"""Each function with a fast version, and the ``fast_math`` name that turns it on (a sigmoid
is computed through ``exp``)."""
DEFAULT_FAST_MATH = ("erf", "exp")
"""What a model run computes with the fast versions unless its config says otherwise."""

FAST = {f: f"fast_{f}" for f in ENABLED_BY}
"""Each function with a fast version, and that version's op."""
UNARY = (*ENABLED_BY, *FAST.values())
ROUNDING = ("float16", "bfloat16")
"""Casts to a narrower float and back (a cast in the chain, which goes on in the op's dtype)."""
BINARY = ("add", "sub", "mul", "div", "max", "min", "lt", "le", "gt", "ge")
ARITY = {**dict.fromkeys(UNARY + ROUNDING, 1), **dict.fromkeys(BINARY, 2), "select": 3}

NAMED = {
    "relu": "max(x,0.0)",
    "relu6": "max(min(x,6.0),0.0)",
    "sigmoid": "sigmoid(x)",
    "silu": "mul(x,sigmoid(x))",
    "hardswish": "div(mul(x,max(min(add(x,3.0),6.0),0.0)),6.0)",
    "hardsigmoid": "div(max(min(add(x,3.0),6.0),0.0),6.0)",
    "tanh": "tanh(x)",
    "gelu": "mul(x,add(0.5,mul(erf(mul(x,0.7071067811865476)),0.5)))",
    "gelu_tanh": "mul(mul(0.5,x),add(1.0,tanh(mul(mul(0.7978845608028654,x),"
                 "add(1.0,mul(mul(0.044715,x),x))))))",
    "fast_sigmoid": "fast_sigmoid(x)",
    "fast_silu": "mul(x,fast_sigmoid(x))",
    "fast_tanh": "fast_tanh(x)",
    "fast_gelu": "mul(x,add(0.5,mul(fast_erf(mul(x,0.7071067811865476)),0.5)))",
    "fast_gelu_tanh": "mul(mul(0.5,x),add(1.0,fast_tanh(mul(mul(0.7978845608028654,x),"
                      "add(1.0,mul(mul(0.044715,x),x))))))",
}
"""Activations by name: the trees Relax fuses for them (as its PyTorch frontend imports
``torch.nn.functional.silu`` and the others), so a planned task shows the name."""
PARAMETRIC = {
    "clip": (("lo", "hi"), "max(min(x,hi),lo)"),
    "leaky_relu": (("a",), "select(lt(0.0,x),x,mul(x,a))"),
}
"""Activations with constant parameters, e.g. ``clip(-1.0,2.0)``, ``leaky_relu(0.1)``."""
NAMES = (*NAMED, *(f"{n}({','.join(p)})" for n, (p, _) in PARAMETRIC.items()))

_TOKEN = re.compile(r"\s*(?:(?P<num>[-+]?(?:inf|(?:\d+\.?\d*|\.\d+)(?:e[-+]?\d+)?))"
                    r"|(?P<name>[a-z_][a-z0-9_]*)|(?P<punct>[(),]))")


def _parse(text: str, params: Mapping[str, Tree] | None = None) -> Tree:
    """A tree from its text (``params``: names that stand for constants, or for
    placeholders when :func:`_match` reads a template)."""
    tokens: list[tuple[str, str]] = []
    pos, text = 0, text.strip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise ValueError(f"unexpected {text[pos:pos + 10]!r}")
        kind = m.lastgroup or ""
        tokens.append((kind, m.group(kind)))
        pos = m.end()
    tokens.reverse()

    def take(want: str | None = None) -> tuple[str, str]:
        if not tokens:
            raise ValueError("unexpected end")
        kind, value = tokens.pop()
        if want is not None and value != want:
            raise ValueError(f"expected {want!r}, got {value!r}")
        return kind, value

    def node() -> Tree:
        kind, value = take()
        if kind == "num":
            return float(value)
        if kind != "name":
            raise ValueError(f"unexpected {value!r}")
        if value == "x":
            return "x"
        if params and value in params:
            return params[value]
        if value not in ARITY:
            raise ValueError(f"unknown op {value!r}; ops: x, a number, "
                             f"{', '.join(ARITY)}")
        take("(")
        args = [node()]
        for _ in range(ARITY[value] - 1):
            take(",")
            args.append(node())
        take(")")
        return (value, *args)

    tree = node()
    if tokens:
        raise ValueError(f"unexpected {tokens[-1][1]!r} after the expression")
    return tree


def _numbers(text: str) -> list[float]:
    return [float(v) for v in text.split(",")] if text.strip() else []


def parse_step(step: str) -> Tree:
    """The tree of an activation step: a name (:data:`NAMES`), ``clip(lo,hi)``,
    ``leaky_relu(a)`` or an expression in ``x`` (``mul(x,sigmoid(x))``). Raises
    ``ValueError`` naming what is allowed."""
    text = step.strip()
    try:
        if text in NAMED:
            return simplify(_parse(NAMED[text]))
        name, paren, rest = text.partition("(")
        if paren and name in PARAMETRIC and rest.endswith(")"):
            names, template = PARAMETRIC[name]
            values = _numbers(rest[:-1])
            if len(values) != len(names):
                raise ValueError(f"{name} takes {len(names)} numbers")
            return simplify(_parse(template, dict(zip(names, values))))
        return simplify(_parse(text))
    except ValueError as err:
        raise ValueError(f"epilogue step {step!r}: {err}; allowed: bias, residual, "
                         f"{', '.join(NAMES)} or an expression in x such as "
                         "mul(x,sigmoid(x))") from None


def simplify(tree: Tree) -> Tree:
    """Drop one-sided clip bounds at infinity and write a clip ``min(max(e, lo), hi)`` as
    ``max(min(e, hi), lo)`` (equal for ``lo <= hi``), so one activation has one tree."""
    if not isinstance(tree, tuple):
        return tree
    op, *args = tree
    args = [simplify(a) for a in args]
    if op == "min" and args[1] == math.inf or op == "max" and args[1] == -math.inf:
        return args[0]
    if op == "min" and isinstance(args[0], tuple) and args[0][0] == "max":
        inner, lo, hi = args[0][1], args[0][2], args[1]
        if isinstance(lo, float) and isinstance(hi, float) and lo <= hi:
            return ("max", ("min", inner, hi), lo)
    return (op, *args)


def _number(value: float) -> str:
    return repr(float(value)).replace("e+", "e")  # no '+': record keys join steps with it


def _text(tree: Tree) -> str:
    if isinstance(tree, float):
        return _number(tree)
    if isinstance(tree, str):
        return tree
    return f"{tree[0]}({','.join(_text(a) for a in tree[1:])})"


def _match(pattern: Tree, tree: Tree, binds: dict[str, float]) -> bool:
    if isinstance(pattern, str) and pattern != "x":
        if not isinstance(tree, float) or binds.setdefault(pattern, tree) != tree:
            return False
        return True
    if isinstance(pattern, tuple):
        return isinstance(tree, tuple) and len(tree) == len(pattern) and \
            tree[0] == pattern[0] and all(_match(p, t, binds)
                                          for p, t in zip(pattern[1:], tree[1:]))
    return pattern == tree


def step_text(tree: Tree) -> str:
    """The canonical text of a tree: its name where it is a named or parametric
    activation, else the expression."""
    tree = simplify(tree)
    for name, text in NAMED.items():
        if simplify(_parse(text)) == tree:
            return name
    for name, (params, template) in PARAMETRIC.items():
        binds: dict[str, float] = {}
        if _match(_parse(template, {p: p for p in params}), tree, binds):
            return f"{name}({','.join(_number(binds[p]) for p in params)})"
    return _text(tree)


def canonical_step(step: str) -> str:
    """A config's epilogue step in the form records use (``bias``, ``residual`` or
    :func:`step_text` of its tree)."""
    return step if step in ("bias", "residual") else step_text(parse_step(step))


def fast_tree(tree: Tree, fast_math: Collection[str]) -> Tree:
    """``tree`` with each function whose ``fast_math`` name is in ``fast_math`` (``exp``
    for ``exp`` and ``sigmoid``, ``erf``, ``tanh``) replaced by its fast version."""
    if not isinstance(tree, tuple):
        return tree
    op, *args = tree
    if op in FAST and ENABLED_BY[op] in fast_math:
        op = FAST[op]
    return (op, *(fast_tree(a, fast_math) for a in args))


def fast_step(step: str, fast_math: Collection[str]) -> str:
    """The canonical epilogue step computing ``step`` with the fast versions that
    ``fast_math`` names (``silu`` -> ``fast_silu`` with ``exp``)."""
    if step in ("bias", "residual"):
        return step
    return step_text(fast_tree(parse_step(step), fast_math))


Epilogue = Annotated[str, AfterValidator(canonical_step)]
"""An elementwise step fused after an operator, in the order given: add a per-channel
``bias``, add a ``residual`` tensor of the output's shape, or an activation (``relu``,
``relu6``, ``silu``, ``gelu``, ``clip(lo,hi)``, ``leaky_relu(a)``, ... or an expression in
``x``). Configs and suites take these."""
EPILOGUE_INPUTS = ("bias", "residual")
"""The steps that read a tensor of their own (an argument after ``data`` and ``weight``)."""

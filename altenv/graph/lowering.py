"""Map a fused complex task onto ALT's layout-aware operator generator.

A fused task such as ``conv2d -> subtract -> divide -> multiply -> add -> add -> relu`` is read
block by block: the complex block becomes an :mod:`altenv.ops` workload, per-channel affine
steps with constant operands (a decomposed batch norm, a bias) are folded offline into the
weights and one bias vector (ALT transforms constant weights offline), a same-shape
non-constant ``add`` becomes the ``residual`` epilogue, and the elementwise blocks after
them that read no tensor but their own chain (``relu``, a clip, SiLU's ``x * sigmoid(x)``,
GELU, ...) become one activation expression. Anything else keeps the original task (the
caller warns).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import tvm.ir.expr as ire
import tvm.ir.prim.expr as pe
from tvm import tirx

from altenv.graph.ops_match import ComplexOp, get_blocks
from altenv.layout import Layout
from altenv.ops import LayoutTemplate, OpProgram, generate, parse_workload
from altenv.ops.epilogue import ROUNDING, UNARY, Tree, step_text
from altenv.ops.workload import Workload

AFFINE = {pe.Add: "add", pe.Sub: "sub", pe.Mul: "mul", pe.Div: "div"}
TRANSPOSED = ("t2d", "t3d")  # transposed convolutions: weight [I, O, K...], taps reordered


class NotMappable(ValueError):
    """A fused task that the layout-aware generator cannot express (the reason is the text)."""


@dataclass(frozen=True)
class ComplexLowering:
    """How one call of a complex task maps onto :func:`altenv.ops.generate`.

    Parameters
    ----------
    spec: the workload spec of the task's own complex block as the matcher writes it (a
        separate pad task stays outside: the block then reads an already padded tensor with
        ``pad=0``); what ``altenv tasks`` shows.
    data_arg, weight_arg: PrimFunc parameter positions of the operands.
    weight_transposed: a matmul weight stored ``[N, K]`` (transposed offline).
    affine: per-channel steps ``(op, operand)`` in order, ``op`` in add/sub/mul/div and the
        operand a parameter position (``int``) or an immediate (``float``).
    residual_arg: parameter position of a same-shape residual added after the affine steps.
    activation: ``None`` or the activation step after them (:mod:`altenv.ops.epilogue`:
        ``relu``, ``silu``, ``clip(-1.0,2.0)``, ... or an expression in ``x``).
    data_pads: zero padding ``(before, after)`` per data dim, done by the data's producer.
    workload: ``spec`` parsed, once: what is generated and tuned (and keys its records).
    """

    spec: str
    data_arg: int
    weight_arg: int
    weight_transposed: bool
    affine: tuple[tuple[str, int | float], ...]
    residual_arg: int | None
    activation: str | None
    data_pads: tuple[tuple[int, int], ...]
    workload: Workload

    @property
    def epilogue(self) -> tuple[str, ...]:
        """The generator's epilogue steps."""
        steps = ("bias",) if self.affine else ()
        steps += ("residual",) if self.residual_arg is not None else ()
        return steps + ((self.activation,) if self.activation else ())

    @property
    def matmul(self) -> bool:
        """Whether the call is a (batched) matmul: its bias runs along the last output dim."""
        return self.workload.kind == "gmm"

    def template(self) -> LayoutTemplate:
        return LayoutTemplate(self.workload)

    def data_layout(self, unpadded: Sequence[int], template_data: Layout) -> Layout:
        """The data layout over the unpadded tensor: the pads, then the template's layout."""
        layout = Layout(unpadded)
        for dim, (before, after) in enumerate(self.data_pads):
            if before or after:
                layout = layout.pad(dim, before, after)
        return layout.then(template_data)

    def read_through_layout(self, stored: Layout) -> Layout:
        """The data layout over the operator's padded input that reads ``stored`` (the
        producer's layout of the unpadded tensor) as it is: the pads become guarded reads
        of zero instead of a padded copy, so no conversion runs between the two."""
        pads = self.data_pads or ((0, 0),) * len(stored.logical_shape)
        layout = Layout(tuple(s + b + a for s, (b, a) in zip(stored.logical_shape, pads)))
        for dim, (before, after) in enumerate(pads):
            if before or after:
                layout = layout.unpad(dim, before, after)
        return layout.then(stored)

    def program(self, layouts: Mapping[str, Layout],
                data_stage: tuple[Layout, Layout] | None = None) -> OpProgram:
        """The generated program (what ``altenv.tuning.OpTask(spec, epilogue=...)`` tunes);
        ``data_stage``: its data converted in a first stage
        (:func:`altenv.ops.codegen.generate`)."""
        return generate(self.workload, layouts, self.epilogue, data_stage=data_stage)

    def func(self, layouts: Mapping[str, Layout],
             data_stage: tuple[Layout, Layout] | None = None) -> tirx.PrimFunc:
        """The layout-transformed PrimFunc ``(data, weight[, bias][, residual], out)``."""
        return self.program(layouts, data_stage).func.without_attr("global_symbol")

    def fold(self, weight: np.ndarray, consts: Mapping[int, np.ndarray], channel_axis: int,
             out_ndim: int) -> tuple[np.ndarray, np.ndarray | None]:
        """Logical weight (matmul: ``[K, N]`` or ``[B, K, N]``; a transposed convolution's
        taps reordered as its generator reads them) and bias with the affine steps folded
        in."""
        w = np.asarray(weight, np.float64)
        matmul = self.matmul
        if self.weight_transposed:
            w = np.swapaxes(w, -1, -2)
        # matmul [B] K N, conv O I K..., transposed conv I O K...
        out_axis = w.ndim - 1 if matmul else int(self.workload.kind in TRANSPOSED)
        channels = w.shape[out_axis]
        scale, shift = np.ones(channels), np.zeros(channels)
        for op, operand in self.affine:
            c = (np.full(channels, operand) if isinstance(operand, float)
                 else _per_channel(consts[operand], channels, channel_axis, out_ndim))
            if op == "add":
                shift = shift + c
            elif op == "sub":
                shift = shift - c
            elif op == "mul":
                scale, shift = scale * c, shift * c
            else:
                scale, shift = scale / c, shift / c
        w = w * scale.reshape((-1,) + (1,) * (w.ndim - 1 - out_axis))
        if self.workload.kind in TRANSPOSED:
            w = self.template().op.prepare_weight(w)  # type: ignore[attr-defined]
        dtype = np.asarray(weight).dtype
        return w.astype(dtype), shift.astype(dtype) if self.affine else None


def _per_channel(value: np.ndarray, channels: int, axis: int, out_ndim: int) -> np.ndarray:
    """A constant broadcast along one output axis only, as a vector of ``channels``."""
    arr = np.asarray(value, np.float64)
    shape = (1,) * (out_ndim - arr.ndim) + arr.shape
    if len(shape) != out_ndim or any(s != 1 for d, s in enumerate(shape) if d != axis):
        raise NotMappable(f"operand of shape {arr.shape} is not per-channel")
    if shape[axis] not in (1, channels):
        raise NotMappable(f"operand of shape {arr.shape} does not match {channels} channels")
    return np.broadcast_to(arr.reshape(-1), (channels,)).copy()


def lower_complex(func: tirx.PrimFunc, op: ComplexOp, prologue: Sequence[str],
                  constant_args: set[int], out_shape: Sequence[int]) -> ComplexLowering:
    """Map a call of a complex task (``constant_args``: parameter positions bound to
    constants at that call). Raises :class:`NotMappable` with the reason."""
    if op.data_arg is None or op.weight_arg is None:
        raise NotMappable("an operand is computed inside the task")
    spec = op.spec()
    try:
        wl = parse_workload(spec)
    except ValueError as err:
        raise NotMappable(f"workload not supported by altenv.ops ({err})") from None
    params = list(func.params)
    shape = [tuple(int(d) for d in p.ty.shape) for p in params]
    if op.kind == "gmm":
        pads: tuple[tuple[int, int], ...] = ((0, 0),) * (2 + (op.params["batch"] > 1))
        if prologue:
            raise NotMappable(f"matmul prologue {list(prologue)}")
        transposed = bool(op.params["trans_b"])
        if transposed and op.weight_arg not in constant_args:
            raise NotMappable("a transposed non-constant matmul weight")
    elif op.kind in TRANSPOSED:
        if not set(prologue) <= {"dilate", "pad", "transform"}:
            raise NotMappable(f"{op.kind} with prologue {list(prologue)}")
        if op.weight_arg not in constant_args:
            raise NotMappable(f"a non-constant {op.kind} weight")
        transposed = False
    else:
        if not _plain_prologue(func, prologue):
            raise NotMappable(f"{op.kind} with prologue {list(prologue)}")
        if tuple(op.params["pad"]) != tuple(op.params["pad_after"]):
            raise NotMappable("asymmetric padding")
        pads = ((0, 0), (0, 0)) + tuple((p, p) for p in op.params["pad"])  # type: ignore
        transposed = False
    program = generate(wl)
    if op.kind in TRANSPOSED:  # the generator's halo replaces the task's dilate and pad
        pads = ((0, 0), (0, 0)) + tuple(program.op.halo())  # type: ignore[attr-defined]
    logical = program.op.input_shapes()
    unpadded = tuple(s - b - a for s, (b, a) in zip(logical["data"], pads))
    want_weight = tuple(reversed(logical["weight"])) if transposed else \
        program.op.raw_shapes()["weight"]
    if (shape[op.data_arg] != unpadded or shape[op.weight_arg] != want_weight
            or tuple(out_shape) != program.op.out_shape()):
        raise NotMappable(f"operand shapes {shape} differ from {spec}'s")
    out_dtype = str(params[-1].ty.dtype)
    if out_dtype != program.op.out_dtype:
        raise NotMappable(f"a {out_dtype} output of a {program.op.out_dtype} {op.kind}")
    affine, residual, activation = _epilogue(func, op, constant_args, tuple(out_shape))
    return ComplexLowering(spec, op.data_arg, op.weight_arg, transposed, affine, residual,
                           activation, pads, wl)


def _plain_prologue(func: tirx.PrimFunc, prologue: Sequence[str]) -> bool:
    """Whether the blocks before the complex block only pad or copy (a 1x1 conv's copy)."""
    for name, blk in zip(prologue, get_blocks(func)):
        if name == "pad":
            continue
        store = blk.body
        ivars = [iv.var for iv in blk.iter_vars]
        if name != "transform" or not isinstance(store, tirx.BufferStore) or \
                not isinstance(store.value, ire.TensorLoad) or \
                not _is_chain(store.value, store.value.source, ivars):
            return False
    return True


def _epilogue(func: tirx.PrimFunc, op: ComplexOp, constant_args: set[int],
              out_shape: tuple[int, ...]) -> tuple[tuple, int | None, str | None]:
    """Read the blocks after the complex block as affine steps, a residual, then an
    activation: the rest of the blocks, which read no parameter, as one expression tree of
    the value before them (:mod:`altenv.ops.epilogue`). A step of the chain and a
    constant whose input a later block reads too (``x`` in ``x * sigmoid(x)``) starts the
    activation instead of folding."""
    blocks = get_blocks(func)
    params = list(func.params)
    pos = next(i for i, b in enumerate(blocks) if b.name_hint == op.block)
    chain = blocks[pos].writes[0].source
    affine: list[tuple[str, int | float]] = []
    residual: int | None = None
    trees: dict[Any, Tree] | None = None  # buffer -> its value's tree, once activated
    tail = blocks[pos + 1:]
    for k, blk in enumerate(tail):
        store = blk.body
        if not isinstance(store, tirx.BufferStore):
            raise NotMappable(f"epilogue block {blk.name_hint} is opaque")
        ivars = [iv.var for iv in blk.iter_vars]
        if trees is None:
            step = _affine_or_residual(store.value, chain, ivars, params, constant_args,
                                       out_shape, residual)
            read_later = any(r.source.same_as(chain) for b in tail[k + 1:] for r in b.reads)
            if step is not None and not read_later:
                name, operand = step
                if name == "residual":
                    residual = operand  # type: ignore[assignment]
                elif residual is not None:
                    raise NotMappable(f"affine step {name} after the residual add")
                else:
                    affine.append((name, operand))
                chain = store.buffer
                continue
            trees = {chain: "x"}
        trees[store.buffer] = _tree(store.value, trees, ivars, params)
        chain = store.buffer
    if not chain.same_as(params[-1]):
        raise NotMappable("the epilogue does not end in the task's output")
    return tuple(affine), residual, None if trees is None else step_text(trees[chain])


def _affine_or_residual(value: object, chain: object, ivars: list, params: list,
                        constant_args: set[int], out_shape: tuple[int, ...],
                        residual: int | None) -> tuple[str, int | float] | None:
    """An affine step ``(op, operand)`` or ``("residual", arg)``, or ``None`` when the
    block is no binary step of the chain and a parameter or an immediate."""
    try:
        step, operand = _binary(value, chain, ivars, params)
    except NotMappable:
        return None
    if isinstance(operand, int) and operand not in constant_args:
        if step != "add" or residual is not None or \
                tuple(int(d) for d in params[operand].ty.shape) != out_shape:
            raise NotMappable(f"non-constant operand in epilogue step {step}")
        return "residual", operand
    return step, operand


_TREE_OPS = {pe.Add: "add", pe.Sub: "sub", pe.Mul: "mul", pe.Div: "div", pe.Max: "max",
             pe.Min: "min", pe.LT: "lt", pe.LE: "le", pe.GT: "gt", pe.GE: "ge"}


def _tree(expr: object, trees: dict[Any, Tree], ivars: list, params: list) -> Tree:
    """An elementwise expression as a tree over the activation's input ``x``: loads of
    buffers written since (at the block's own indices) become their trees."""
    if isinstance(expr, ire.TensorLoad):
        for buf, tree in trees.items():
            if _is_chain(expr, buf, ivars):
                return tree
        if any(p.same_as(expr.source) for p in params):
            raise NotMappable("an epilogue step reading a tensor after an activation")
        raise NotMappable("an epilogue reading another element than its own")
    imm = _imm(expr)
    if imm is not None:
        return imm
    name = _TREE_OPS.get(type(expr))
    if name is not None:
        return (name, _tree(expr.a, trees, ivars, params), _tree(expr.b, trees, ivars, params))
    if isinstance(expr, pe.Cast):
        return _cast(expr, _tree(expr.value, trees, ivars, params))
    if isinstance(expr, pe.Select):
        return ("select", *(_tree(e, trees, ivars, params)
                            for e in (expr.condition, expr.true_value, expr.false_value)))
    if isinstance(expr, ire.Call):
        name = str(expr.op.name).rsplit(".", 1)[-1]
        if name in UNARY and len(expr.args) == 1:
            return (name, _tree(expr.args[0], trees, ivars, params))
        raise NotMappable(f"epilogue call {name}")
    raise NotMappable(f"epilogue expression {type(expr).__name__}")


def _cast(expr: pe.Cast, value: Tree) -> Tree:
    """A cast in an activation chain: of a condition, a select of 1 and 0; to a narrower
    float, rounding to it (the chain goes on in the op's dtype); to the same dtype, none."""
    src, dst = str(expr.value.ty.dtype), str(expr.ty.dtype)
    if src == "bool":
        return ("select", value, 1.0, 0.0)
    if dst in ROUNDING and src.startswith("float"):
        return (dst, value)
    if dst == src or dst.startswith("float") and src.startswith("float"):
        return value  # widening back: the chain already runs in the op's dtype
    raise NotMappable(f"epilogue cast from {src} to {dst}")


def _is_chain(expr: object, chain: object, ivars: list) -> bool:
    return (isinstance(expr, ire.TensorLoad) and expr.source.same_as(chain)
            and len(expr.indices) == len(ivars)
            and all(i.same_as(v) for i, v in zip(expr.indices, ivars)))


def _imm(expr: object) -> float | None:
    return float(expr.value) if isinstance(expr, (pe.FloatImm, pe.IntImm)) else None


def _binary(value: object, chain: object, ivars: list, params: list) -> tuple[str, int | float]:
    """An ``add/sub/mul/div`` of the chain and a parameter or an immediate."""
    step = AFFINE.get(type(value))
    if step is None:
        raise NotMappable(f"epilogue expression {type(value).__name__}")
    if _is_chain(value.a, chain, ivars):
        other = value.b
    elif step in ("add", "mul") and _is_chain(value.b, chain, ivars):
        other = value.a
    else:
        raise NotMappable(f"epilogue {step} with the result on the right")
    imm = _imm(other)
    if imm is not None:
        return step, imm
    if isinstance(other, ire.TensorLoad):
        for k, p in enumerate(params):
            if p.same_as(other.source):
                return step, k
    raise NotMappable(f"epilogue {step} operand is not a parameter")

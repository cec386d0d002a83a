"""Tensor-expression generation of an operator under arbitrary layouts (ALT §4.1, §6).

Every tensor is a placeholder of its *physical* shape; each read goes through its
layout's logical->physical map. The output's loop nest is rebuilt from its physical
shape: the new loops are the output's physical dims, and the logical indices the body
needs come from the layout's physical->logical map (``S_Y^-1`` in ALT §6). Epilogues
(bias add, residual add, activations) are generated in the output's layout so they align with
the main loop nest for fusion.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import tvm
from tvm import te, tirx
from tvm.sym.analyzer import Analyzer

from ..layout import Layout
from ..layout.convert import conversion_stage
from ..layout.primitives import Pad, Reorder, Split, StoreAt
from ..target import make_target
from .activation import te_value, torch_value
from .epilogue import EPILOGUE_INPUTS, parse_step
from .operators import Operator, operator_for
from .workload import Workload, parse_workload


def _attached_bias(weight: Layout, op: Operator) -> Layout | None:
    """The bias layout stored in the weight's layout by ``store_at``, if any."""
    channels = (op.out_shape()[op.channel_axis],)
    for p in weight.primitives:
        if isinstance(p, StoreAt) and p.guest.logical_shape == channels:
            return p.guest
    return None


def bias_layout(out: Layout, axis: int) -> Layout:
    """The layout of a bias vector along the output's dim ``axis``: that dim's splits and
    order in ``out`` (e.g. ``O/ot ot`` for ``N O/ot H W ot``), so the bias add reads it at
    plain output loop indices and MetaSchedule can inline it into the operator's tile
    (its ``AutoInline`` and write-cache fusion accept only reads indexed by output loop
    variables), padded like the output's channel dim. Identity when ``out`` uses primitives
    other than split, reorder and pad."""
    bias = Layout((out.logical_shape[axis],), (out.logical_names[axis],))
    pos: list[int | None] = [None] * len(out.logical_shape)  # bias dim of each out dim
    pos[axis] = 0
    for prim in out.primitives:
        if isinstance(prim, Split):
            n, at = len(prim.factors), pos[prim.dim]
            if at is not None:
                bias = bias.split(at, prim.factors)
            shifted = [q + n - 1 if q is not None and at is not None and q > at else q
                       for q in pos]
            parts = [None] * n if at is None else list(range(at, at + n))
            pos = shifted[:prim.dim] + parts + shifted[prim.dim + 1:]
        elif isinstance(prim, Pad):
            if pos[prim.dim] is not None:
                bias = bias.pad(pos[prim.dim], prim.before, prim.after)
        elif isinstance(prim, Reorder):
            pos = [pos[p] for p in prim.perm]
            order = [q for q in pos if q is not None]
            if order != sorted(order):
                bias = bias.reorder(order)
                pos = [None if q is None else order.index(q) for q in pos]
        else:
            return Layout(bias.logical_shape, bias.logical_names)
    return bias


def _guard(valid: Any, value: Any, dtype: str) -> Any:
    return value if valid is None else tirx.if_then_else(valid, value, tirx.const(0, dtype))


def _in_bounds(reads: Sequence[tuple[list[Any], Any, tuple[int, ...]]],
               ranges: Sequence[tuple[Any, int]]) -> bool:
    """Whether every read ``(physical index, validity, shape)`` is unguarded and provably
    inside its tensor for loop variables over ``ranges`` (``(var, extent)``): then the
    points of a padded output may be computed like any other (from the operands' zero
    padding; they are cropped when read back) rather than guarded, which would keep a
    vectorized tile from vectorizing."""
    analyzer = Analyzer()
    for var, extent in ranges:
        analyzer.bind(var, tvm.ir.Range(0, extent))
    for idx, valid, shape in reads:
        if valid is not None:
            return False
        for x, size in zip(idx, shape):
            bound = analyzer.const_int_bound(analyzer.simplify(x))
            if bound.min_value < 0 or bound.max_value >= size:
                return False
    return True


@dataclass
class OpProgram:
    """A generated operator: its PrimFunc, argument order and the layouts it was built with."""

    workload: Workload
    op: Operator
    layouts: dict[str, Layout]
    epilogue: tuple[str, ...]
    tensors: list[te.Tensor] = field(repr=False)
    arg_names: list[str]
    reduce: Layout | None = None

    @property
    def bias_in_weight(self) -> bool:
        """Whether the bias is attached to the weight with ``store_at`` (ALT §4.1.2)."""
        return _attached_bias(self.layouts["weight"], self.op) is not None

    @property
    def func(self) -> tvm.tirx.PrimFunc:
        return te.create_prim_func(self.tensors).with_attr("global_symbol", "main")

    def logical_inputs(self, raw: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The operator's logical inputs from framework inputs (epilogue tensors pass through)."""
        prepared = self.op.prepare({k: raw[k] for k in ("data", "weight")})
        prepared.update({k: raw[k] for k in EPILOGUE_INPUTS if k in raw})
        return prepared

    def physical_args(self, raw: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        """Numpy arguments in physical layouts, the output zero-initialised."""
        logical = self.logical_inputs(raw)
        args = [self.layouts[n].apply(logical[n], *([logical["bias"]] if n == "weight" and
                                                     self.bias_in_weight else []))
                for n in self.arg_names[:-1]]
        out_layout = self.layouts["out"]
        return args + [np.zeros(out_layout.shape, dtype=self.op.out_dtype)]

    def reference(self, raw: Mapping[str, np.ndarray]) -> np.ndarray:
        """The framework's logical result, epilogue included."""
        out = self.op.reference({k: raw[k] for k in ("data", "weight")})
        for step in self.epilogue:
            if step == "bias":
                shape = [1] * out.ndim
                shape[self.op.channel_axis] = -1
                out = out + raw["bias"].reshape(shape)
            elif step == "residual":
                out = out + raw["residual"]
            else:
                out = torch_value(parse_step(step), torch.from_numpy(out)).numpy()
        return out.astype(self.op.out_dtype)

    def random_inputs(self, seed: int = 0) -> dict[str, np.ndarray]:
        """Random framework inputs for every argument (never zeros)."""
        raw = self.op.random_raw_inputs(seed)
        rng = np.random.default_rng(seed + 1)
        dtype = self.op.out_dtype
        if "bias" in self.epilogue:
            channels = self.op.out_shape()[self.op.channel_axis]
            raw["bias"] = rng.uniform(-1, 1, channels).astype(dtype)
        if "residual" in self.epilogue:
            raw["residual"] = rng.uniform(-1, 1, self.op.out_shape()).astype(dtype)
        return raw


def generate(workload: str | Workload, layouts: Mapping[str, Layout] | None = None,
             epilogue: Sequence[str] = (), reduce: Layout | None = None,
             data_stage: tuple[Layout, Layout] | None = None) -> OpProgram:
    """Generate ``workload`` with the given layouts (identity where none is given).

    ``layouts`` maps tensor names (``data``, ``weight``, ``out``, and for epilogues
    ``bias`` and ``residual``) to :class:`Layout` objects over their logical shapes. The
    residual shares the output layout unless given. ``epilogue`` is a sequence of
    :data:`Epilogue` steps: ``bias``, ``residual`` and activations.

    ``reduce`` is a layout of the reduction domain (logical shape: the operator's
    reduction extents): the reduction loops become its physical dims, e.g. an intrinsic
    mapping's fused, padded and split ``rc.rw -> (I*KW)/4, 4`` (``altenv.mapping``).
    Index expressions are then simplified over the loop ranges, so the operand reads are
    the plain physical indices a tensor intrinsic matches. Reduction points in the
    layout's padding are not guarded: they must read a zero from an operand that is
    padded the same way (a mapping pads the weight with zeros).

    ``data_stage`` is ``(stored, converted)``, two layouts of the tensor the data operand is
    made from (e.g. unpadded): the data argument is then that tensor stored in ``stored``,
    and a first stage (``data_stage``) converts it into ``converted``, whose physical shape
    is the data layout's, for the operator to read: a conversion fused into the operator.
    """
    wl = parse_workload(workload)
    op = operator_for(wl)
    for step in epilogue:
        if step not in EPILOGUE_INPUTS:
            parse_step(step)  # a ValueError naming what is allowed
    layouts = dict(layouts or {})
    shapes = dict(op.input_shapes())
    shapes["out"] = op.out_shape()
    if "bias" in epilogue and "weight" in layouts and _attached_bias(layouts["weight"], op):
        if "bias" in layouts:
            raise ValueError("layouts: the bias is stored in the weight (store_at); give no "
                             "separate 'bias' layout")
    elif "bias" in epilogue:
        shapes["bias"] = (op.out_shape()[op.channel_axis],)
        if "out" in layouts:
            layouts.setdefault("bias", bias_layout(layouts["out"], op.channel_axis))
    if "residual" in epilogue:
        shapes["residual"] = op.out_shape()
        layouts.setdefault("residual", layouts.get("out", Layout(shapes["out"])))
    unknown = set(layouts) - set(shapes)
    if unknown:
        raise ValueError(f"layouts: no tensor named {sorted(unknown)} in {wl.kind}; "
                         f"tensors: {sorted(shapes)}")
    for name, shape in shapes.items():
        names = getattr(op, "names", {}).get(name)
        layout = layouts.setdefault(name, Layout(shape, names if names and len(names) == len(shape)
                                                 else None))
        if layout.logical_shape != tuple(shape):
            raise ValueError(f"layouts[{name!r}]: logical shape {layout.logical_shape} does not "
                             f"match the tensor's shape {tuple(shape)} in {wl}")

    holders = {name: te.placeholder(layouts[name].shape, op.input_dtype(name), name=name)
               for name in op.input_shapes()}
    sources = dict(holders)
    if data_stage is not None:
        stored, converted = data_stage
        if converted.shape != layouts["data"].shape:
            raise ValueError(f"data_stage: converts into physical shape {converted.shape}, but "
                             f"the data layout's is {layouts['data'].shape}")
        sources["data"] = te.placeholder(stored.shape, op.input_dtype("data"), name="data")
        holders["data"] = conversion_stage(sources["data"], stored, converted, "data_stage")
    analyzer = Analyzer() if reduce is not None else None
    reads: list[tuple[list[Any], Any, tuple[int, ...]]] = []

    def read(name: str, idx: list[Any]) -> Any:
        phys, valid = layouts[name].to_physical(idx)
        if analyzer is not None:
            phys = [analyzer.simplify(x) for x in phys]
        reads.append((phys, valid, tuple(holders[name].shape)))
        return _guard(valid, holders[name][tuple(phys)], holders[name].dtype)

    out_layout = layouts["out"]
    red_names, extents = zip(*op.reduce_extents())
    if reduce is not None and reduce.logical_shape != extents:
        raise ValueError(f"reduce: a layout of shape {reduce.logical_shape}, but the reduction "
                         f"of {wl} has extents {extents}")
    red = [te.reduce_axis((0, ext), name=n) for n, ext in
           (zip(red_names, extents) if reduce is None else
            ((f"r{i}", e) for i, e in enumerate(reduce.shape)))]

    def main(*phys: Any) -> Any:
        logical, valid = out_layout.to_logical(list(phys))
        red_vars = [r.var for r in red]
        if reduce is not None:
            for var, ext in zip(list(phys) + red_vars, out_layout.shape + reduce.shape):
                analyzer.bind(var, tvm.ir.Range(0, ext))
            red_vars = reduce.to_logical(red_vars)[0]  # padding: zero weights, no guard
        body = op.body(read, logical, red_vars)
        if valid is not None and _in_bounds(reads, list(zip(phys, out_layout.shape)) +
                                            [(r.var, r.dom.extent) for r in red]):
            valid = None
        return te.sum(_guard(valid, body, op.out_dtype), axis=red)

    out = te.compute(out_layout.shape, main, name=wl.kind)
    tensors, names = [sources["data"], holders["weight"]], ["data", "weight"]
    for step in epilogue:
        out, extra = _epilogue(step, out, out_layout, layouts, op, holders["weight"])
        if extra is not None:
            tensors.append(extra)
            names.append(step)
    return OpProgram(wl, op, layouts, tuple(epilogue), tensors + [out], names + ["out"],
                     reduce)


def _epilogue(step: str, prev: te.Tensor, out_layout: Layout, layouts: dict[str, Layout],
              op: Operator, weight: te.Tensor) -> tuple[te.Tensor, te.Tensor | None]:
    """One elementwise stage in the output layout; returns (result, new input or None)."""
    dtype = op.out_dtype
    if step not in EPILOGUE_INPUTS:
        tree = parse_step(step)
        name = step if step.isidentifier() else "activation"
        return te.compute(prev.shape, lambda *p: te_value(tree, prev(*p), dtype),
                          name=name), None
    if step == "residual":
        res_layout = layouts["residual"]
        res = te.placeholder(res_layout.shape, dtype, name="residual")

        def add_residual(*p: Any) -> Any:
            if res_layout == out_layout:
                return prev(*p) + res(*p)
            logical, valid = out_layout.to_logical(list(p))
            phys, rvalid = res_layout.to_physical(logical)
            return prev(*p) + _guard(rvalid, res[tuple(phys)], dtype)

        return te.compute(prev.shape, add_residual, name="add_residual"), res
    stored = _attached_bias(layouts["weight"], op) is not None
    bias = weight if stored else te.placeholder(layouts["bias"].shape, dtype, name="bias")

    def add_bias(*p: Any) -> Any:
        logical, valid = out_layout.to_logical(list(p))
        channel = [logical[op.channel_axis]]
        phys, bvalid = (layouts["weight"].attached_to_physical(channel) if stored
                        else layouts["bias"].to_physical(channel))
        analyzer = Analyzer()  # (o * ot + i) // ot -> o: plain loop indices
        for var, extent in zip(p, prev.shape):
            analyzer.bind(var, tvm.ir.Range(0, extent))
        phys = [analyzer.simplify(x) for x in phys]
        value = op.cast(bias[tuple(phys)]) if stored else bias[tuple(phys)]
        if _in_bounds([(phys, bvalid, tuple(bias.shape))], list(zip(p, prev.shape))):
            valid = None  # the bias is padded like the output: its padding reads zeros
        return _guard(valid, prev(*p) + _guard(bvalid, value, dtype), dtype)

    return te.compute(prev.shape, add_bias, name="add_bias"), None if stored else bias


def run_numpy(program: OpProgram, raw: Mapping[str, np.ndarray],
              target: tvm.target.Target | str | None = None,
              func: tvm.tirx.PrimFunc | tvm.IRModule | None = None) -> np.ndarray:
    """Compile ``func`` (default: the untransformed program) and run it on framework inputs;
    returns the logical output (for correctness checks)."""
    tgt = make_target(target)
    dev = tvm.cpu(0) if tgt.kind.name == "llvm" else tvm.device(tgt.kind.name, 0)
    lib = tvm.compile(func if func is not None else program.func, target=tgt)
    args = [tvm.runtime.tensor(a, dev) for a in program.physical_args(raw)]
    lib["main"](*args)
    return program.layouts["out"].invert(args[-1].numpy())

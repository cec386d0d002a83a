"""The rewrite of a Relax ``main`` from a :class:`~altenv.graph.plan.NetworkPlan`, the
program :mod:`altenv.graph.network` compiles (:class:`Rewriter`):

* a complex call becomes a call of its layout-transformed PrimFunc (``altenv.ops.generate``),
  with a decomposed batch norm / bias folded into its weights, which are transformed once,
  at build time, into their physical layouts (ALT's offline weight conversion). Every
  weight becomes a parameter of ``main``, so the VM is given the physical weights;
* an elementwise or injective task is regenerated to read each input in its stored layout
  and write its output in its propagated layout, including the padded, unfolded input
  layout of a convolution it feeds (Fig. 5b: the producer converts, no extra operator);
* every other read of a tensor in a layout it is not stored in becomes a call of a
  conversion PrimFunc (``conversion_func``): the pad-and-convert producer of a
  convolution's input, a conversion before an ``other`` task, and the conversion of the
  network outputs back to their logical layout;
* with ``read_through``, a complex call may instead read its data operand in the layout it
  is stored in (its pads as guarded reads; the task's schedule replayed on that variant),
  where :mod:`altenv.graph.read_through` times that faster than conversion plus call.

Each kernel is scheduled as :mod:`altenv.graph.scheduler` says.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import tvm
import tvm.ir.expr as ire
from tvm import relax, tirx
from tvm.s_tir.meta_schedule.database import Database

from altenv.graph.kernels import CALL_TIR
from altenv.graph.lowering import ComplexLowering
from altenv.graph.plan import NetworkPlan, is_const, op_name, tensor_name
from altenv.graph.propagation import ELEMENTWISE, OTHER
from altenv.graph.read_through import GUARDED
from altenv.graph.scheduler import (
    KernelScheduler,
    Scheduled,
    canonical,
    conversion_kernel,
    noalias,
)
from altenv.layout import Layout
from altenv.measure.chains import ChainTimer
from altenv.ops.codegen import bias_layout

log = logging.getLogger(__name__)

MEASURE = "measure"
ReadThrough = Mapping[int, int] | Collection[int] | Literal["measure"] | None
"""Which complex calls read their data operand as it is stored: call -> how
(:data:`~altenv.graph.read_through.GUARDED`, or the loop a staged variant converts at; a
collection of calls reads guarded), ``"measure"`` to time the ways and keep the fastest,
``None`` to convert every such operand first."""


@dataclass(frozen=True)
class InsertedConversion:
    """A conversion call in the rewritten ``main``: ``tensor`` from ``src`` to ``dst``, first
    needed by ``consumer`` (``"output"`` for a network output or another use outside the
    tasks, ``"storage"`` for a producer that cannot write the propagated layout), computed by
    ``func``."""

    tensor: str
    consumer: str
    src: Layout
    dst: Layout
    func: str


class Rewriter(KernelScheduler):
    """Builds the new ``main`` call by call, keeping each tensor's versions by layout; its
    kernels scheduled as :class:`KernelScheduler` schedules them."""

    def __init__(self, plan: NetworkPlan, schedules: dict[str, Scheduled],
                 target: tvm.target.Target, read_through: ReadThrough = None,
                 others: Database | None = None, timer: ChainTimer | None = None) -> None:
        if isinstance(read_through, Mapping):
            read_through = {int(i): int(how) for i, how in read_through.items()}
        elif read_through is not None and read_through != MEASURE:
            read_through = dict.fromkeys((int(i) for i in read_through), GUARDED)
        super().__init__(plan, schedules, target, others, timer)
        self.other_kernels: dict[str, tirx.PrimFunc] = {}
        self.tuned_others: list[str] = []
        self.read_through = read_through
        self.reads_through: dict[int, int] = {}
        self.variants: dict[tuple[Any, ...], tirx.PrimFunc | None] = {}
        graph = plan.graph
        base = tvm.IRModule({gv: f for gv, f in graph.mod.functions.items()
                             if gv.name_hint != "main"}, attrs=graph.mod.attrs)
        self.bb = relax.BlockBuilder(base)
        self.main = graph.mod["main"]
        self.inputs = [relax.Var(p.name, p.ty) for p in self.main.params]
        self.param_vars: list[relax.Var] = []
        self.param_names: list[str] = []
        self.param_values: list[np.ndarray] = []
        self.const_params: dict[Any, relax.Var] = {}
        self.versions: dict[str, dict[Layout, Any]] = {}
        self.conversions: list[InsertedConversion] = []
        self.conv_funcs: dict[tuple[Layout, Layout, str], tvm.ir.GlobalVar] = {}
        self.funcs: dict[Any, tvm.ir.GlobalVar] = {}
        self.scheduled: set[str] = set()
        self.untuned: set[str] = set()
        self.kinds: dict[str, str] = {}
        self.remap: dict[Any, Any] = dict(zip(self.main.params, self.inputs))
        self.var_tensor: dict[Any, str] = {}

    # ------------------------------------------------------------------ driver
    def run(self) -> tvm.IRModule:
        index = 0
        call_tir = tvm.ir.Op.get(CALL_TIR)
        with self.bb.function("main", attrs={"num_input": len(self.inputs)}):
            with self.bb.dataflow():
                for p, var in zip(self.main.params, self.inputs):
                    name = f"in:{p.name}"
                    self.versions[name] = {canonical(Layout(self.plan.dataflow.shapes[name])): var}
                    self.var_tensor[p] = name
                    self._materialize(name)
                for block in self.main.body.blocks:
                    for binding in block.bindings:
                        value = binding.value
                        if isinstance(value, ire.Call) and value.op.same_as(call_tir):
                            self._call(index)
                            self.var_tensor[binding.var] = tensor_name(index)
                            index += 1
                        else:
                            self.remap[binding.var] = self.bb.emit(self._logical(value))
                out = self.bb.emit_output(self._logical(self.main.body.body))
            self.bb.emit_func_output(out, params=self.inputs + self.param_vars)
        mod = self.bb.get()
        return relax.transform.DeadCodeElimination(["main"])(mod)

    # ------------------------------------------------------------ tensors
    def _materialize(self, tensor: str) -> None:
        """A producer that wrote the logical layout: convert to the propagated storage."""
        storage = self._storage(tensor)
        if storage not in self.versions[tensor]:
            self._get(tensor, storage, "storage")

    def _get(self, tensor: str, layout: Layout, consumer: str) -> Any:
        """``tensor`` in ``layout``, converting (once) from its stored version; a layout that
        stores the same bytes is a reshape of it, not a conversion."""
        have = self.versions[tensor]
        layout = canonical(layout)
        if layout in have:
            return have[layout]
        storage = self._storage(tensor)
        src = storage if storage in have else next(iter(have))
        if src.same_storage(layout):  # the same bytes: a reshape, no copy
            have[layout] = self.bb.emit(relax.op.reshape(have[src], list(layout.shape)), "view")
            return have[layout]
        dtype = str(have[src].ty.dtype)
        key = (src, layout, dtype)
        if key not in self.conv_funcs:
            self.conv_funcs[key] = self._add_other(conversion_kernel(src, layout, dtype),
                                                   "layout_convert", "conversion")
        gvar = self.conv_funcs[key]
        var = self.bb.emit(relax.call_tir(gvar, [have[src]], relax.TensorType(
            list(layout.shape), dtype)), "convert")
        have[layout] = var
        self.conversions.append(InsertedConversion(tensor, consumer, src, layout, gvar.name_hint))
        return var

    def _logical(self, expr: Any, consumer: str = "output") -> Any:
        """``expr`` of the original ``main`` over the new variables, tensors logical."""
        if isinstance(expr, ire.Var):
            tensor = self.var_tensor.get(expr)
            if tensor is not None:
                return self._get(tensor, Layout(self.plan.dataflow.shapes[tensor]), consumer)
            return self.remap[expr]
        if isinstance(expr, ire.Tuple):
            return relax.Tuple([self._logical(f, consumer) for f in expr.fields])
        if isinstance(expr, ire.TupleGetItem):
            return relax.TupleGetItem(self._logical(expr.tuple_value, consumer), expr.index)
        if is_const(expr):
            return self._param(expr)
        raise NotImplementedError(f"network build: a {type(expr).__name__} binding in main "
                                  "outside call_tir is not supported")

    def _param(self, const: Any) -> Any:
        """A constant of the original ``main`` as a weight parameter (scalars stay inline)."""
        if len(const.ty.shape) == 0:
            return const
        if const not in self.const_params:
            self.const_params[const] = self._new_param(f"const{len(self.const_params)}",
                                                       const.value.numpy())
        return self.const_params[const]

    def _new_param(self, name: str, value: np.ndarray) -> relax.Var:
        value = np.ascontiguousarray(value)
        var = relax.Var(name, relax.TensorType(list(value.shape), str(value.dtype)))
        self.param_vars.append(var)
        self.param_names.append(name)
        self.param_values.append(value)
        return var

    # --------------------------------------------------------------- calls
    def _call(self, index: int) -> None:
        plan = self.plan
        call = plan.graph.calls[index]
        op = plan.dataflow.op(op_name(index))
        out = tensor_name(index)
        if index in plan.lowerings:
            gvar, args, layout = self._complex(index)
        elif op.kind == ELEMENTWISE:
            gvar, args, layout = self._elementwise(index)
        else:
            gvar = self._untuned(call.task)
            args = [self._read(index, a, None) for a in plan.args[index]]
            layout = Layout(call.shape)
        var = self.bb.emit(relax.call_tir(gvar, args, relax.TensorType(list(layout.shape),
                                                                       call.dtype)), "lv")
        self.versions[out] = {canonical(layout): var}
        self._materialize(out)

    def _read(self, index: int, arg: Any, layout: Layout | None) -> Any:
        """Argument ``arg`` of call ``index`` in ``layout`` (``None``: propagation's choice
        for a network tensor, constants and others as they are)."""
        if is_const(arg):
            return self._param(arg)
        tensor = self.var_tensor.get(arg)
        if tensor is None:
            return self.remap[arg]
        name = op_name(index)
        want = layout or self.plan.propagation.read_layout(name, tensor,
                                                           self.plan.dataflow.shapes)
        if self.plan.dataflow.op(name).kind == OTHER:
            want = Layout(self.plan.dataflow.shapes[tensor])
        return self._get(tensor, want, name)

    def _complex(self, index: int) -> tuple[tvm.ir.GlobalVar, list[Any], Layout]:
        plan = self.plan
        call = plan.graph.calls[index]
        lowering = plan.lowerings[index]
        call_args = plan.args[index]
        name = op_name(index)
        layouts = dict(plan.layouts[call.task])
        chosen = plan.chosen[name]
        if lowering.residual_arg is not None:
            res = self.var_tensor[call_args[lowering.residual_arg]]
            layouts["residual"] = plan.propagation.read_layout(name, res, plan.dataflow.shapes)
        through = self._read_through(index, layouts)
        variant = None
        if through is None:
            data = self._read(index, call_args[lowering.data_arg], chosen["data"])
        else:
            data, variant = through
        args = [data]
        weight_expr = call_args[lowering.weight_arg]
        bias = None
        if is_const(weight_expr):
            consts = {k: a.value.numpy() for k, a in enumerate(call_args) if is_const(a)}
            axis = len(call.shape) - 1 if lowering.matmul else 1
            weight, bias = lowering.fold(consts[lowering.weight_arg], consts, axis,
                                         len(call.shape))
            args.append(self._new_param(f"w{index}", layouts["weight"].apply(weight)))
        else:
            args.append(self._read(index, weight_expr, None))
        if bias is not None:  # stored as the operator's program reads it
            stored = bias_layout(layouts["out"], lowering.template().op.channel_axis)
            args.append(self._new_param(f"b{index}", stored.apply(bias)))
        if lowering.residual_arg is not None:
            args.append(self._read(index, call_args[lowering.residual_arg],
                                   layouts["residual"]))
        return self._complex_func(call.task, lowering, layouts, variant), args, layouts["out"]

    def _complex_func(self, task: str, lowering: ComplexLowering,
                      layouts: Mapping[str, Layout],
                      variant: tuple[tuple[Any, ...], tirx.PrimFunc] | None = None
                      ) -> tvm.ir.GlobalVar:
        """The (scheduled) function of a complex task under ``layouts``, or ``variant``
        (its key and scheduled function: the call reading its data as stored), added once."""
        key = self._complex_key(task, lowering, layouts) if variant is None else variant[0]
        if key not in self.funcs:
            func = (self._schedule(task, lowering.func(layouts)) if variant is None
                    else variant[1])
            self.funcs[key] = self.bb.add_func(noalias(func), f"alt_{task}")
            self.kinds[self.funcs[key].name_hint] = self.plan.graph.tasks[task].kind
            if task in self.schedules:
                self.scheduled.add(self.funcs[key].name_hint)
        return self.funcs[key]

    def _read_through(self, index: int, layouts: Mapping[str, Layout]
                      ) -> tuple[Any, tuple[tuple[Any, ...], tirx.PrimFunc]] | None:
        """Call ``index``'s data operand as it is stored and the variant of its function
        that reads it so (its key and scheduled function), when the call reads it as stored
        (``read_through``) instead of converting it first. ``None``: convert as planned."""
        if self.read_through is None or (self.read_through != MEASURE
                                         and index not in self.read_through):
            return None
        plan = self.plan
        call = plan.graph.calls[index]
        lowering = plan.lowerings[index]
        tensor = self.var_tensor.get(plan.args[index][lowering.data_arg])
        if tensor is None:
            return None
        want = canonical(plan.chosen[op_name(index)]["data"])
        storage = self._storage(tensor)
        if want in self.versions[tensor] or storage.same_storage(want):
            return None  # no conversion to save
        how = (self._measured_read(index, layouts, storage, want) if self.read_through == MEASURE
               else self.read_through[index])
        if how is None:
            return None
        key = (self._complex_key(call.task, lowering, layouts), storage, how)
        if key not in self.variants:
            self.variants[key] = self._read_variant(call.task, lowering, layouts, storage,
                                                    want, how)
        if self.variants[key] is None:
            return None
        self.reads_through[index] = how
        return self.versions[tensor][storage], (key, self.variants[key])

    def _add_other(self, func: tirx.PrimFunc, name: str, kind: str) -> tvm.ir.GlobalVar:
        """Add a generated kernel (scheduled by :meth:`_other`) to the module."""
        scheduled, tuned = self._other(func)
        gvar = self.bb.add_func(scheduled, name)
        self._note_other(gvar.name_hint, kind, func, tuned, kept=False)
        return gvar

    def _note_other(self, name: str, kind: str, func: tirx.PrimFunc, tuned: bool,
                    kept: bool) -> None:
        self.kinds[name] = kind
        if self._for_others(kept):
            self.other_kernels[name] = func
        if tuned:
            self.scheduled.add(name)
            self.tuned_others.append(name)

    def _untuned(self, task: str) -> tvm.ir.GlobalVar:
        """The function of a task kept as the frontend fused it, scheduled (once) by
        :meth:`_other`."""
        gvar = self.bb.get().get_global_var(task)
        if task not in self.untuned:
            self.untuned.add(task)
            func = self.bb.get()[gvar]
            scheduled, tuned = self._other(func, kept=True)
            self.bb.update_func(gvar, scheduled)
            self._note_other(task, self.plan.graph.tasks[task].kind, func, tuned, kept=True)
        return gvar

    def _elementwise(self, index: int) -> tuple[tvm.ir.GlobalVar, list[Any], Layout]:
        plan = self.plan
        call = plan.graph.calls[index]
        regen = plan.regens[call.task]
        args, layouts = [], {}
        for k, arg in enumerate(plan.args[index]):
            args.append(self._read(index, arg, None))
            tensor = None if is_const(arg) else self.var_tensor.get(arg)
            if tensor is not None:
                layout = plan.propagation.read_layout(op_name(index), tensor,
                                                      plan.dataflow.shapes)
                if layout.primitives:
                    layouts[k] = layout
        out_layout = self._storage(tensor_name(index))
        key = (call.task, tuple(sorted(layouts.items(), key=lambda kv: kv[0])), out_layout)
        if key not in self.funcs:
            func = noalias(regen.func(layouts, out_layout, self.plan.fast_math))
            self.funcs[key] = self._add_other(func, call.task,
                                              self.plan.graph.tasks[call.task].kind)
        return self.funcs[key], args, out_layout

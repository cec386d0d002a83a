"""Whole-network build with per-task layouts and schedules (ALT's graph level, §4.2 and §6).

:func:`plan_network` turns a :class:`TaskGraph` and template factors per complex task into a
:class:`NetworkPlan`: the dataflow of the calls (complex ops mapped onto
:mod:`altenv.ops`, spatial tasks that can be regenerated under layouts as elementwise ops,
the rest as ``other``), the layouts chosen for every complex call (a convolution's data
layout over its *unpadded* input is its pads followed by the template's layout) and the
result of :func:`altenv.graph.propagation.propagate`.

:func:`build_network` rewrites the Relax ``main`` from the plan and compiles it:

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

On a CPU target the functions the build generates (conversions, regenerated elementwise
tasks) get :func:`altenv.graph.spatial.parallel_spatial`: parallel over the target's cores,
innermost loop vectorized. Tasks kept as the frontend fused them (softmax, norms, pooling,
and complex tasks that cannot be mapped, with a warning) stay on logical tensors with
:func:`altenv.graph.spatial.untuned_schedule`.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import numpy as np
import tvm
import tvm.ir.expr as ire
import tvm_ffi
from tvm import relax, s_tir, tirx
from tvm.s_tir.meta_schedule.database import Database

from altenv.graph.build import BuiltModel, compile_module, with_func
from altenv.graph.kernels import CALL_TIR, kernel_calls
from altenv.graph.lowering import ComplexLowering, NotMappable, lower_complex
from altenv.graph.propagation import (
    COMPLEX,
    ELEMENTWISE,
    OTHER,
    Dataflow,
    OpNode,
    Propagation,
    propagate,
)
from altenv.graph.read_through import GUARDED, fastest_chain, staged_variants
from altenv.graph.regen import Regenerable
from altenv.graph.spatial import parallel_spatial, untuned_schedule
from altenv.graph.tasks import TaskGraph
from altenv.graph.tuned_kernel import tuned_kernel
from altenv.layout import Layout
from altenv.layout.convert import conversion_func
from altenv.measure.chains import ChainTimer
from altenv.ops.activation import fast_step
from altenv.ops.codegen import bias_layout
from altenv.target import make_target, target_cores

log = logging.getLogger(__name__)

Scheduled = tirx.PrimFunc | s_tir.Schedule
MEASURE = "measure"
ReadThrough = Mapping[int, int] | Collection[int] | Literal["measure"] | None
"""Which complex calls read their data operand as it is stored: call -> how
(:data:`~altenv.graph.read_through.GUARDED`, or the loop a staged variant converts at; a
collection of calls reads guarded), ``"measure"`` to time the ways and keep the fastest,
``None`` to convert every such operand first."""


def op_name(index: int) -> str:
    """Dataflow name of call ``index``."""
    return f"call{index}"


def tensor_name(index: int) -> str:
    """Dataflow name of the result of call ``index``."""
    return f"t{index}"


@dataclass
class NetworkPlan:
    """Layouts of a whole network, before the Relax rewrite.

    Parameters
    ----------
    graph: the task graph.
    args: each call's argument expressions in the original ``main``.
    dataflow: the calls as a propagation dataflow (ops ``call<i>``, tensors ``t<i>``,
        inputs ``in:<name>``, constant weights ``w<i>``).
    factors: template factors of each mapped complex task.
    layouts: the template layouts (``data`` over the padded input, ``weight``, ``out``) of
        each mapped complex task.
    chosen: the layouts handed to :func:`propagate`, per complex op.
    propagation: its result.
    lowerings: how each mapped complex call is generated.
    regens: the regenerable tasks, by task name.
    fallbacks: the reason each unmapped complex call keeps its original task.
    fast_math: the float32 functions (``erf``, ``tanh``, ``exp``) that the generated code
        (complex tasks' epilogues, regenerated elementwise tasks) computes with TVM's fast
        versions (:mod:`altenv.ops.expr`).
    """

    graph: TaskGraph
    args: list[list[Any]]
    dataflow: Dataflow
    factors: dict[str, dict[str, int]]
    layouts: dict[str, dict[str, Layout]]
    chosen: dict[str, dict[str, Layout]]
    propagation: Propagation
    lowerings: dict[int, ComplexLowering]
    regens: dict[str, Regenerable]
    fallbacks: dict[int, str] = field(default_factory=dict)
    fast_math: tuple[str, ...] = ()

    @property
    def kept(self) -> list[str]:
        """The tasks kept as the frontend fused them (neither generated with layouts nor
        regenerated in them), in order of first call: on a CPU, the kernels MetaSchedule
        tunes with ``budget.others``."""
        kept = [c.task for c in self.graph.calls
                if c.index not in self.lowerings and c.task not in self.regens]
        return list(dict.fromkeys(kept))

    def program(self, task: str) -> tirx.PrimFunc:
        """The layout-transformed PrimFunc of a mapped complex task, as it is tuned (a
        residual read in the output's layout): the function a schedule in
        :func:`build_network` is written for."""
        call = next(i for i, c in enumerate(self.graph.calls)
                    if c.task == task and i in self.lowerings)
        return self.lowerings[call].func(self.layouts[task])


def _call_args(main: relax.Function) -> list[list[Any]]:
    """Argument expressions of every ``call_tir`` in ``main``, in binding order."""
    out = []
    for block in main.body.blocks:
        for binding in block.bindings:
            value = binding.value
            if isinstance(value, ire.Call) and value.op.same_as(tvm.ir.Op.get(CALL_TIR)):
                out.append(list(value.args[1].fields))
    return out


def _is_const(expr: Any) -> bool:
    return isinstance(expr, ire.Constant)


def plan_network(graph: TaskGraph, factors: Mapping[str, Mapping[str, int]] | None = None,
                 fast_math: Collection[str] = ()) -> NetworkPlan:
    """Map the calls of ``graph``, choose layouts from ``factors`` (task name -> template
    factors; absent tasks get the untiled template) and propagate them. The generated code
    computes the float32 functions named in ``fast_math`` (``erf``, ``tanh``, ``exp``) with
    TVM's fast versions: a complex task's activation ``silu`` becomes ``fast_silu``
    (:func:`altenv.ops.activation.fast_step`), a task of its own."""
    factors = dict(factors or {})
    unknown = set(factors) - set(graph.tasks)
    if unknown:
        raise KeyError(f"layouts for unknown tasks {sorted(unknown)}; complex tasks: "
                       f"{[t.name for t in graph.complex_tasks()]}")
    main = graph.mod["main"]
    args = _call_args(main)
    var_call = {}
    inputs = {p: f"in:{p.name}" for p in main.params}
    shapes: dict[str, tuple[int, ...]] = {
        f"in:{p.name}": tuple(int(d) for d in p.ty.shape) for p in main.params}
    index = 0
    for block in main.body.blocks:
        for binding in block.bindings:
            value = binding.value
            if isinstance(value, ire.Call) and value.op.same_as(tvm.ir.Op.get(CALL_TIR)):
                var_call[binding.var] = tensor_name(index)
                index += 1

    def tensor_of(expr: Any) -> str | None:
        return var_call.get(expr) or inputs.get(expr)

    ops: list[OpNode] = []
    constants: set[str] = set()
    lowerings: dict[int, ComplexLowering] = {}
    regens: dict[str, Regenerable] = {}
    fallbacks: dict[int, str] = {}
    task_factors: dict[str, dict[str, int]] = {}
    task_layouts: dict[str, dict[str, Layout]] = {}
    chosen: dict[str, dict[str, Layout]] = {}
    for call, call_args in zip(graph.calls, args):
        task = graph.tasks[call.task]
        out = tensor_name(call.index)
        shapes[out] = call.shape
        tensors = [tensor_of(a) for a in call_args]
        if task.op is not None:
            try:
                lowering = _lower(task, call_args, tensors, call.shape, fast_math)
            except NotMappable as err:
                fallbacks[call.index] = str(err)
                log.warning("task %s (call %d): %s; it is not tuned and stays on logical "
                            "tensors", call.task, call.index, err)
            else:
                lowerings[call.index] = lowering
                if call.task not in task_layouts:
                    template = lowering.template()
                    f = dict(factors.get(call.task) or template.default_factors())
                    try:
                        task_layouts[call.task] = template.layouts(f)
                    except ValueError as err:
                        raise ValueError(f"task {call.task} ({lowering.spec}): factors {f} "
                                         f"give no layout: {err}") from None
                    task_factors[call.task] = f
                layouts = task_layouts[call.task]
                data = tensors[lowering.data_arg]
                shapes_data = shapes[data]  # type: ignore[index]
                weight = tensors[lowering.weight_arg]
                if weight is None:
                    weight = f"w{call.index}"
                    constants.add(weight)
                    shapes[weight] = layouts["weight"].logical_shape
                inputs_ = [data, weight]
                if lowering.residual_arg is not None:
                    inputs_.append(tensors[lowering.residual_arg])
                ops.append(OpNode(op_name(call.index), COMPLEX, tuple(inputs_), out))
                chosen[op_name(call.index)] = {
                    "data": lowering.data_layout(shapes_data, layouts["data"]),
                    "weight": layouts["weight"], "out": layouts["out"]}
                continue
        live = tuple(t for t in tensors if t is not None)
        if task.op is None and call.task not in regens:
            regen = Regenerable.of(task.func)
            if regen is not None:
                regens[call.task] = regen
        kind = ELEMENTWISE if call.task in regens else OTHER
        ops.append(OpNode(op_name(call.index), kind, live, out))
    for name in factors:
        if name not in task_layouts:
            log.warning("layouts given for task %s, which is not generated with layouts", name)
    dataflow = Dataflow(ops, shapes, frozenset(constants))
    prop = propagate(dataflow, chosen)
    return NetworkPlan(graph, args, dataflow, task_factors, task_layouts, chosen, prop,
                       lowerings, regens, fallbacks, tuple(fast_math))


def _lower(task: Any, call_args: list[Any], tensors: list[str | None],
           out_shape: tuple[int, ...], fast_math: Collection[str]) -> ComplexLowering:
    """:func:`lower_complex` for one call (its activation computed with ``fast_math``),
    checking which operands are dataflow tensors."""
    consts = {k for k, a in enumerate(call_args) if _is_const(a)}
    lowering = lower_complex(task.func, task.op, task.analysis.prologue, consts, out_shape)
    if lowering.activation is not None:
        lowering = replace(lowering, activation=fast_step(lowering.activation, fast_math))
    if tensors[lowering.data_arg] is None:
        raise NotMappable("the data operand is not a tensor of the network")
    if lowering.weight_arg not in consts and tensors[lowering.weight_arg] is None:
        raise NotMappable("the weight operand is neither a constant nor a network tensor")
    if lowering.residual_arg is not None and tensors[lowering.residual_arg] is None:
        raise NotMappable("the residual operand is not a tensor of the network")
    if lowering.affine and lowering.weight_arg not in consts:
        raise NotMappable("affine epilogue steps on a non-constant weight cannot be folded")
    return lowering


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


@dataclass
class NetworkBuild:
    """A compiled network with per-task layouts.

    Parameters
    ----------
    plan: the layouts and their propagation.
    mod: the rewritten module that was compiled.
    built: the compiled executable and its VM.
    param_names, params: ``main``'s weight parameters (after the inputs), in argument
        order, holding the physical (pre-transformed) weights.
    conversions: the conversion calls inserted into ``main``.
    target: the target it was compiled for.
    scheduled: the PrimFuncs that carry a tuned schedule.
    reads_through: the complex calls that read their data operand as it is stored (no
        conversion call before them) -> how (:data:`ReadThrough`).
    kinds: what each PrimFunc ``main`` calls computes (a complex op kind, ``conversion``,
        or the kind of the task it was generated from), for per-kernel profiles.
    tuned_others: the other kernels (not complex calls) scheduled from the ``others``
        database.
    """

    plan: NetworkPlan
    mod: tvm.IRModule
    built: BuiltModel
    param_names: list[str]
    params: list[np.ndarray]
    conversions: list[InsertedConversion]
    target: tvm.target.Target
    scheduled: frozenset[str] = frozenset()
    reads_through: Mapping[int, int] = field(default_factory=dict)
    kinds: Mapping[str, str] = field(default_factory=dict)
    tuned_others: tuple[str, ...] = ()
    _device_weights: list[tvm.runtime.Tensor] | None = field(default=None, init=False,
                                                             repr=False)

    def run(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        """Outputs (logical layouts) of the network on numpy ``inputs``."""
        dev = self.built.device
        weights = self.device_params()
        out = self.built.vm["main"](*(tvm.runtime.tensor(x, dev) for x in inputs), *weights)
        return _flatten(out)

    def device_params(self) -> list[tvm.runtime.Tensor]:
        """The physical weights on the device (uploaded once)."""
        if self._device_weights is None:
            self._device_weights = [tvm.runtime.tensor(p, self.built.device)
                                    for p in self.params]
        return self._device_weights

    def time(self, inputs: list[np.ndarray], number: int = 10, repeat: int = 3) -> float:
        """Median latency of ``main`` in seconds."""
        dev = self.built.device
        args = [tvm.runtime.tensor(x, dev) for x in inputs] + self.device_params()
        timer = self.built.vm.time_evaluator("main", dev, number=number, repeat=repeat)
        return float(timer(*args).median)

    def without_conversions(self) -> NetworkBuild:
        """The same network compiled with every conversion PrimFunc emptied: the same calls on
        the same buffers, minus the conversions' work. Its outputs are wrong; timed next to
        this network it measures what the conversions cost."""
        mod = self.mod
        for name in {c.func for c in self.conversions}:
            gv = mod.get_global_var(name)
            mod = with_func(mod, name, mod[gv].with_body(tirx.Evaluate(0)))
        built = compile_module(mod, self.target, self.scheduled)
        return replace(self, mod=mod, built=built)


def _flatten(value: Any) -> list[np.ndarray]:
    if isinstance(value, tvm.runtime.Tensor):
        return [value.numpy()]
    return [a for v in value for a in _flatten(v)]


def build_network(graph: TaskGraph, factors: Mapping[str, Mapping[str, int]] | None = None,
                  schedules: Mapping[str, Scheduled] | None = None,
                  target: str | dict | tvm.target.Target | None = None,
                  read_through: ReadThrough = None,
                  others: Database | None = None,
                  fast_math: Collection[str] = (),
                  timer: ChainTimer | None = None) -> NetworkBuild:
    """Compile ``graph`` with the template ``factors`` of each complex task (default: untiled)
    and ``schedules`` of their layout-transformed programs (:meth:`NetworkPlan.program`;
    default schedules otherwise). The other kernels MetaSchedule tunes (:func:`other_kernels`)
    take their schedules from its database ``others`` where it has one
    (:mod:`altenv.tuning.others`), else the defaults above. The generated
    code computes the float32 functions named in ``fast_math`` (``erf``, ``tanh``,
    ``exp``) with TVM's fast versions (:func:`plan_network`).

    ``read_through`` picks the complex calls that read their data operand in the layout it
    is stored in instead of converting it first, and how (:data:`ReadThrough`, see
    :mod:`altenv.graph.read_through`), where a conversion would run and the task's schedule
    replays on the variant; ``"measure"`` times the ways for each such call with ``timer``
    (the measuring device's, :meth:`altenv.measure.Measurer.chain_timer`; this host's by
    default) and keeps the fastest. :attr:`NetworkBuild.reads_through` holds the calls that
    do, and how."""
    plan = plan_network(graph, factors, fast_math)
    return build_plan(plan, schedules, target, read_through, others, timer)


def build_plan(plan: NetworkPlan, schedules: Mapping[str, Scheduled] | None = None,
               target: str | dict | tvm.target.Target | None = None,
               read_through: ReadThrough = None,
               others: Database | None = None,
               timer: ChainTimer | None = None) -> NetworkBuild:
    """Rewrite ``main`` from ``plan`` and compile it (``read_through``, ``others``,
    ``timer``: see :func:`build_network`)."""
    tgt = make_target(target)
    rewriter = _Rewriter(plan, dict(schedules or {}), tgt, read_through, others, timer)
    mod = rewriter.run()
    built = compile_module(mod, tgt, rewriter.scheduled)
    return NetworkBuild(plan, mod, built, rewriter.param_names, rewriter.param_values,
                        rewriter.conversions, tgt, frozenset(rewriter.scheduled),
                        dict(rewriter.reads_through), rewriter.kinds,
                        tuple(rewriter.tuned_others))


def other_kernels(plan: NetworkPlan, schedules: Mapping[str, Scheduled] | None = None,
                  target: str | dict | tvm.target.Target | None = None,
                  read_through: ReadThrough = None, timer: ChainTimer | None = None
                  ) -> tuple[dict[str, tuple[tirx.PrimFunc, int]], dict[int, int]]:
    """The kernels of the network :func:`build_plan` would compile that the layout search
    does not tune and MetaSchedule does (the tasks kept as the frontend fused them; on a
    CPU the build schedules the functions it generates itself): name -> (unscheduled
    PrimFunc, calls in ``main``); and the calls that read through, and how (``"measure"``
    decides them here, with ``timer``, so a later build can be given them).
    Nothing is compiled but what ``"measure"`` times."""
    rewriter = _Rewriter(plan, dict(schedules or {}), make_target(target), read_through,
                         timer=timer)
    calls = kernel_calls(rewriter.run())
    kernels = {name: (func, calls[name]) for name, func in rewriter.other_kernels.items()
               if calls[name]}
    return kernels, dict(rewriter.reads_through)


def call_options(plan: NetworkPlan, schedules: Mapping[str, Scheduled], index: int,
                 target: str | dict | tvm.target.Target | None = None
                 ) -> list[list[tirx.PrimFunc]]:
    """The kernels a build of ``plan`` runs for complex call ``index``, scheduled as the build
    schedules them, one list per way the call may get its data operand: the conversions of
    its operands that are not stored in the layouts it reads, then the call; and, where its
    data operand is converted, the same with the call reading that operand as stored
    instead (when its schedule replays on that variant; :mod:`altenv.graph.read_through`).
    A conversion another call of the network would share is counted here all the same."""
    return _Rewriter(plan, dict(schedules), make_target(target)).call_options(index)


class _Rewriter:
    """Builds the new ``main`` call by call, keeping each tensor's versions by layout. The
    tasks kept as they are (and, off the CPU, the generated spatial functions) take their
    schedules from the ``others`` database where it has one; otherwise, with a CPU
    ``target``, :func:`untuned_schedule` and :func:`parallel_spatial`."""

    def __init__(self, plan: NetworkPlan, schedules: dict[str, Scheduled],
                 target: tvm.target.Target, read_through: ReadThrough = None,
                 others: Database | None = None, timer: ChainTimer | None = None) -> None:
        self.plan = plan
        self.timer = timer
        self.schedules = schedules
        self.target = target
        self.others = others
        self.other_kernels: dict[str, tirx.PrimFunc] = {}
        self.tuned_others: list[str] = []
        self.cores = target_cores(target) if target.kind.name == "llvm" else None
        if isinstance(read_through, Mapping):
            read_through = {int(i): int(how) for i, how in read_through.items()}
        elif read_through is not None and read_through != MEASURE:
            read_through = dict.fromkeys((int(i) for i in read_through), GUARDED)
        self.read_through = read_through
        self.reads_through: dict[int, int] = {}
        self.variants: dict[tuple[Any, ...], tirx.PrimFunc | None] = {}
        self.measured: dict[tuple[Any, ...], int | None] = {}
        unknown = set(schedules) - set(plan.layouts)
        if unknown:
            log.warning("schedules for tasks %s ignored: not generated with layouts",
                        sorted(unknown))
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
    def _storage(self, tensor: str) -> Layout:
        return canonical(self.plan.propagation.layout_of(tensor, self.plan.dataflow.shapes))

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
            self.conv_funcs[key] = self._add_other(_conversion(src, layout, dtype),
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
        if _is_const(expr):
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
        if _is_const(arg):
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
        if _is_const(weight_expr):
            consts = {k: a.value.numpy() for k, a in enumerate(call_args) if _is_const(a)}
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

    def _complex_key(self, task: str, lowering: ComplexLowering,
                     layouts: Mapping[str, Layout]) -> tuple[Any, ...]:
        return (task, lowering.epilogue, lowering.activation,
                layouts.get("residual", layouts["out"]), layouts["data"])

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
            self.funcs[key] = self.bb.add_func(_noalias(func), f"alt_{task}")
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

    def _read_variant(self, task: str, lowering: ComplexLowering,
                      layouts: Mapping[str, Layout], storage: Layout, want: Layout, how: int
                      ) -> tirx.PrimFunc | None:
        """The scheduled function of ``task`` reading its data stored in ``storage`` (the
        template reads ``want``): guarded reads, or the conversion staged at loop ``how``;
        ``None`` when the schedule does not replay on it."""
        if how == GUARDED:
            return self._replay(task, lowering.func(
                {**layouts, "data": lowering.read_through_layout(storage)}))
        given = self.schedules.get(task)
        if not isinstance(given, s_tir.Schedule):
            return None
        return staged_variants(lowering.func(layouts, (storage, want)), given.trace,
                               self.target, at=how).get(how)

    def _read_options(self, index: int, layouts: Mapping[str, Layout], storage: Layout,
                      want: Layout) -> dict[str, tuple[int | None, list[tirx.PrimFunc]]]:
        """Every way call ``index`` may get its data stored in ``storage`` (the template
        reads ``want``): name -> (how, or ``None`` to convert first; the kernels run)."""
        call = self.plan.graph.calls[index]
        task, lowering = call.task, self.plan.lowerings[index]
        conversion, _ = self._other(_conversion(storage, want, call.dtype))
        kernel = _noalias(self._schedule(task, lowering.func(layouts)))
        options: dict[str, tuple[int | None, list[tirx.PrimFunc]]] = {
            "convert": (None, [conversion, kernel])}
        guarded = self._read_variant(task, lowering, layouts, storage, want, GUARDED)
        if guarded is not None:
            options["guarded"] = (GUARDED, [_noalias(guarded)])
        given = self.schedules.get(task)
        if isinstance(given, s_tir.Schedule):
            staged = staged_variants(lowering.func(layouts, (storage, want)), given.trace,
                                     self.target)
            for at, func in staged.items():
                options[f"staged at loop {at}"] = (at, [_noalias(func)])
        return options

    def _measured_read(self, index: int, layouts: Mapping[str, Layout], storage: Layout,
                       want: Layout) -> int | None:
        """How call ``index`` gets its data stored in ``storage`` (``None``: converted
        first): the fastest way alone (:func:`fastest_chain`), decided once per function
        and storage."""
        task = self.plan.graph.calls[index].task
        lowering = self.plan.lowerings[index]
        key = (self._complex_key(task, lowering, layouts), storage)
        if key not in self.measured:
            options = self._read_options(index, layouts, storage, want)
            best, medians = fastest_chain({name: chain for name, (_, chain) in options.items()},
                                          self.target, timer=self.timer)
            log.info("call %d (%s): %s", index, task, ", ".join(
                f"{name} {seconds * 1e6:.1f} us" for name, seconds in medians.items()))
            self.measured[key] = options[best][0]
        return self.measured[key]

    def call_options(self, index: int) -> list[list[tirx.PrimFunc]]:
        """See :func:`call_options`."""
        plan = self.plan
        call = plan.graph.calls[index]
        lowering = plan.lowerings[index]
        name = op_name(index)
        op = plan.dataflow.op(name)
        shapes = plan.dataflow.shapes
        layouts = dict(plan.layouts[call.task])
        if lowering.residual_arg is not None:
            layouts["residual"] = plan.propagation.read_layout(name, op.inputs[-1], shapes)
        before = []
        for tensor in op.inputs[1:]:
            if tensor in plan.dataflow.constants:
                continue
            stored = self._storage(tensor)
            read = canonical(plan.propagation.read_layout(name, tensor, shapes))
            if not stored.same_storage(read):
                before.append(self._other(_conversion(stored, read, call.dtype))[0])
        storage = self._storage(op.inputs[0])
        want = canonical(plan.chosen[name]["data"])
        if storage.same_storage(want):
            return [before + [_noalias(self._schedule(call.task, lowering.func(layouts)))]]
        return [before + chain for _, chain in
                self._read_options(index, layouts, storage, want).values()]

    def _schedule(self, task: str, func: tirx.PrimFunc) -> tirx.PrimFunc:
        """``func`` with the task's schedule (:meth:`_replay`); the default schedule, with a
        warning, when it does not apply."""
        scheduled = self._replay(task, func, warn=True)
        return func if scheduled is None else scheduled

    def _replay(self, task: str, func: tirx.PrimFunc, warn: bool = False
                ) -> tirx.PrimFunc | None:
        """``func`` with the task's schedule: as given when ``func`` is the tuned program,
        else replayed from the schedule's trace (a variant reading its residual or data in
        another layout); ``func`` itself for a task without schedule, ``None`` when the
        schedule does not replay."""
        given = self.schedules.get(task)
        if given is None:
            return func
        if tvm_ffi.structural_equal(func, self.plan.program(task)):
            scheduled = given.mod["main"] if isinstance(given, s_tir.Schedule) else given
            return scheduled.without_attr("global_symbol") if scheduled.attrs is not None \
                and "global_symbol" in scheduled.attrs else scheduled
        if isinstance(given, s_tir.Schedule):
            sch = s_tir.Schedule(func)
            try:
                given.trace.apply_to_schedule(sch, remove_postproc=False)
                return sch.mod["main"]
            except RuntimeError as err:
                if warn:
                    log.warning("task %s: schedule does not replay on a variant (%s); default "
                                "schedule", task, str(err).splitlines()[0])
        elif warn:
            log.warning("task %s: a variant of its program (residual layout) has no schedule; "
                        "default schedule", task)
        return None

    def _for_others(self, kept: bool) -> bool:
        """Whether MetaSchedule tunes such a kernel: a task kept as the frontend fused it,
        and on a target other than a CPU the generated spatial functions too. On a CPU these
        (conversions, regenerated elementwise tasks) keep :func:`parallel_spatial`:
        MetaSchedule's design space for a single spatial block fuses all its loops and
        vectorizes the fused loop, which ran R3D-18's conversions 2-55x slower."""
        return kept or self.cores is None

    def _other(self, func: tirx.PrimFunc, kept: bool = False) -> tuple[tirx.PrimFunc, bool]:
        """``func``, a kernel the layout search does not tune (``kept``: a task kept as the
        frontend fused it, else a generated conversion or elementwise function), with its
        schedule from the ``others`` database when MetaSchedule tunes it
        (:meth:`_for_others`) and the database has a correct one; otherwise, on a CPU
        target, :func:`untuned_schedule` or :func:`parallel_spatial`. Also whether the
        schedule came from the database."""
        if self.others is not None and self._for_others(kept):
            tuned = tuned_kernel(self.others, func, self.target)
            if tuned is not None:
                return tuned, True
        if self.cores is None:
            return func, False
        return (untuned_schedule(func, self.target, self.cores) if kept
                else parallel_spatial(func, self.cores)), False

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
            tensor = None if _is_const(arg) else self.var_tensor.get(arg)
            if tensor is not None:
                layout = plan.propagation.read_layout(op_name(index), tensor,
                                                      plan.dataflow.shapes)
                if layout.primitives:
                    layouts[k] = layout
        out_layout = self._storage(tensor_name(index))
        key = (call.task, tuple(sorted(layouts.items(), key=lambda kv: kv[0])), out_layout)
        if key not in self.funcs:
            func = _noalias(regen.func(layouts, out_layout, self.plan.fast_math))
            self.funcs[key] = self._add_other(func, call.task,
                                              self.plan.graph.tasks[call.task].kind)
        return self.funcs[key], args, out_layout


def canonical(layout: Layout) -> Layout:
    """``layout`` without dimension names (layouts that store data alike compare equal)."""
    data = layout.to_json()
    return Layout.from_json({"shape": data["shape"], "primitives": data["primitives"]})


def _conversion(src: Layout, dst: Layout, dtype: str) -> tirx.PrimFunc:
    """The unscheduled PrimFunc converting a tensor stored in ``src`` into ``dst``."""
    return _noalias(conversion_func(src, dst, dtype).without_attr("global_symbol"))


def _noalias(func: tirx.PrimFunc) -> tirx.PrimFunc:
    return func.with_attr("tirx.noalias", True)

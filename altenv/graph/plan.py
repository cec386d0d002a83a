"""Layouts of a whole network, before it is built (ALT's graph level, §4.2 and §6).

:func:`plan_network` turns a :class:`TaskGraph` and template factors per complex task into a
:class:`NetworkPlan`: the dataflow of the calls (complex ops mapped onto
:mod:`altenv.ops`, spatial tasks that can be regenerated under layouts as elementwise ops,
the rest as ``other``), the layouts chosen for every complex call (a convolution's data
layout over its *unpadded* input is its pads followed by the template's layout) and the
result of :func:`altenv.graph.propagation.propagate`. Call ``i`` of the task graph is op
:func:`op_name` in that dataflow and its result tensor :func:`tensor_name`. The plan is what
``altenv tasks`` previews and what :mod:`altenv.graph.network` builds.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import tvm
import tvm.ir.expr as ire
from tvm import relax, tirx

from altenv.graph.kernels import CALL_TIR
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
from altenv.graph.regen import Regenerable
from altenv.graph.tasks import TaskGraph
from altenv.layout import Layout
from altenv.ops.epilogue import fast_step

log = logging.getLogger(__name__)


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
        :func:`~altenv.graph.network.build_network` is written for."""
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


def is_const(expr: Any) -> bool:
    return isinstance(expr, ire.Constant)


def plan_network(graph: TaskGraph, factors: Mapping[str, Mapping[str, int]] | None = None,
                 fast_math: Collection[str] = ()) -> NetworkPlan:
    """Map the calls of ``graph``, choose layouts from ``factors`` (task name -> template
    factors; absent tasks get the untiled template) and propagate them. The generated code
    computes the float32 functions named in ``fast_math`` (``erf``, ``tanh``, ``exp``) with
    TVM's fast versions: a complex task's activation ``silu`` becomes ``fast_silu``
    (:func:`altenv.ops.epilogue.fast_step`), a task of its own."""
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
    consts = {k for k, a in enumerate(call_args) if is_const(a)}
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

"""Task graph: legalize and fuse a Relax model, then describe each fused PrimFunc and the
dataflow between their calls in ``main``.

Tasks are the distinct fused PrimFuncs (structurally equal copies merged, ``calls`` counts
their call sites); :class:`TaskCall` nodes are the call sites in ``main``'s topological order and
:class:`Edge` objects link a producer call to the argument of a consumer call.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
import tvm
import tvm.ir.expr as ire
import tvm.ir.prim.expr as pe
import tvm_ffi
from tvm import relax, tirx

from altenv.graph.frontend import ImportedModel
from altenv.graph.ops_match import ComplexOp, FuncAnalysis, analyze_func, get_blocks
from altenv.target import make_target


def prepare(model: ImportedModel) -> tvm.IRModule:
    """Inference form of ``model`` with its weights bound as constants.

    Batch norms are decomposed into elementwise ops and every computation on weights and
    constants alone (batch-norm statistics, weight transposes) is lifted out of ``main``,
    compiled once and evaluated offline on the host, like ALT's offline weight conversion.
    """
    main = model.mod["main"]
    num_input = int(main.attrs["num_input"])
    lifter = _ConstToParam()
    body = _SplitToSlices().visit_expr(lifter.visit_expr(main.body))
    params = list(main.params) + lifter.params
    func = relax.Function(params, body, main.ret_ty, main.is_pure, main.attrs)
    mod = tvm.transform.Sequential([
        relax.transform.DecomposeOpsForInference(),
        relax.transform.CanonicalizeBindings(),
        relax.transform.LiftTransformParams(),
    ])(tvm.IRModule({"main": func}))
    weights = [tvm.runtime.tensor(np.ascontiguousarray(v)) for v in model.params.values()]
    weights += lifter.values
    main = mod["main"]
    if "main_transform_params" in [gv.name_hint for gv in mod.functions]:
        lifted = tvm.IRModule({"main_transform_params": mod["main_transform_params"]})
        vm = relax.VirtualMachine(tvm.compile(lifted, make_target(None)), tvm.cpu())
        weights = list(vm["main_transform_params"](weights))
    binding = dict(zip(main.params[num_input:], weights))
    bound = relax.transform.BindParams("main", binding)(tvm.IRModule({"main": main}))
    return relax.transform.DeadCodeElimination()(bound)


@relax.expr_functor.mutator
class _SplitToSlices(relax.PyExprMutator):
    """Rewrites a ``split`` (ShuffleNet's channel split, ``torch.chunk``) into one strided
    slice per part: each part is then a tensor task of its own, which layouts propagate to
    and regenerate, instead of one task returning a tuple."""

    def visit_call_(self, op: ire.Call) -> ire.Expr:
        call = super().visit_call_(op)
        if not (isinstance(call.op, tvm.ir.Op) and call.op.name == "relax.split"):
            return call
        data = call.args[0]
        axis = int(call.attrs.axis)
        length = int(data.ty.shape[axis])
        sections = call.attrs.indices_or_sections
        if isinstance(sections, (int, tirx.IntImm)):
            step = -(-length // int(sections))  # Relax's sections: ceil-sized, the last smaller
            bounds = [min(i * step, length) for i in range(int(sections) + 1)]
        else:
            bounds = [0] + [int(i) for i in sections] + [length]
        parts = [self.builder_.emit(relax.op.strided_slice(data, [axis], [lo], [hi]))
                 for lo, hi in zip(bounds, bounds[1:])]
        return relax.Tuple(parts)


@relax.expr_functor.mutator
class _ConstToParam(relax.PyExprMutator):
    """Turns tensor constants of ``main`` into extra parameters (collected with their values)."""

    def __init__(self) -> None:
        super().__init__()
        self.params: list[ire.Var] = []
        self.values: list[tvm.runtime.Tensor] = []

    def visit_generic_const_(self, op: ire.GenericConst) -> ire.Expr:
        if len(op.ty.shape) == 0:
            return op
        var = relax.Var(f"const_{len(self.params)}", op.ty)
        self.params.append(var)
        self.values.append(op.value)
        return var


def fuse_pipeline() -> tvm.transform.Pass:
    """The Relax passes that turn a prepared module into fused TIR tasks."""
    return tvm.transform.Sequential([
        relax.transform.LegalizeOps(),
        relax.transform.AnnotateTIROpPattern(),
        relax.transform.FoldConstant(),
        separate_gates,
        relax.transform.FuseOps(),
        relax.transform.FuseTIR(),
        relax.transform.DeadCodeElimination(),
    ])


_INJECTIVE = 2  # relax's OpPatternKind kInjective: never fused after a complex op
_ACTIVATION_CALLS = 6


@tvm.transform.module_pass(opt_level=0, name="SeparateGates")
def separate_gates(mod: tvm.IRModule, _ctx: object) -> tvm.IRModule:
    """Keep a gate product out of its operands' fused tasks.

    Squeeze-excite multiplies a feature map by a per-channel gate ``[N, C, 1, 1]`` that a
    1x1 convolution computed; fused into that convolution (Relax's broadcast pattern), the
    task's output is the feature map, which no complex-operator generator writes. Marked
    injective, the product of two computed tensors, one per-channel and neither computed
    from the other by one call (as SiLU's ``x * sigmoid(x)``), stays a task of its own:
    the gate's convolution is tuned with its activation and the product is regenerated
    in the propagated layouts like any elementwise task.

    The mark goes on a copy of the product's PrimFunc that only gate calls use: the same
    PrimFunc also scales a batch norm's output by its (constant, folded) per-channel
    weight, and marked there it would cut the norm and activation off their convolution.
    """
    main = mod["main"]
    call_tir = tvm.ir.Op.get("relax.call_tir")
    gates: dict[ire.Call, tvm.ir.GlobalVar] = {}
    producers: dict[ire.Var, tuple[list[ire.Expr], int]] = {}  # result -> args, pattern
    for block in main.body.blocks:
        for binding in block.bindings:
            value = binding.value
            if not (isinstance(value, ire.Call) and value.op.same_as(call_tir)):
                continue
            args = list(value.args[1].fields)
            attrs = mod[value.args[0]].attrs
            producers[binding.var] = (args, int(attrs["op_pattern"]) if attrs is not None and
                                      "op_pattern" in attrs else _INJECTIVE + 1)
            if len(args) == 2 and not any(isinstance(a, ire.Constant) for a in args) and \
                    any(_per_channel(a.ty) for a in args) and \
                    not _activation(args, producers) and _is_product(mod[value.args[0]]):
                gates[value] = value.args[0]
    if not gates:
        return mod
    bb = relax.BlockBuilder(mod)
    copies = {name: bb.add_func(mod[name].with_attr("op_pattern", _INJECTIVE), f"{name}_gate")
              for name in sorted({gv.name_hint for gv in gates.values()})}
    swap = {call: copies[gv.name_hint] for call, gv in gates.items()}
    bb.update_func(mod.get_global_var("main"), _Regate(swap).visit_expr(main))
    return bb.get()


@relax.expr_functor.mutator
class _Regate(relax.PyExprMutator):
    """Points the given ``call_tir`` calls at other PrimFuncs."""

    def __init__(self, swap: dict[ire.Call, tvm.ir.GlobalVar]) -> None:
        super().__init__()
        self.swap = swap

    def visit_call_(self, op: ire.Call) -> ire.Expr:
        call = super().visit_call_(op)
        target = self.swap.get(op)
        if target is None:
            return call
        return ire.Call(call.op, [target, *call.args[1:]], call.attrs, call.ty_args)


def _activation(args: list[ire.Expr], producers: dict[ire.Var, tuple[list[ire.Expr], int]]
                ) -> bool:
    """Whether a product ``a * f(a)`` is an activation's (SiLU, hardswish on a
    ``[N, C, 1, 1]`` tensor): one operand computed from the other by elementwise or
    injective calls alone, a few at most (a gate passes through convolutions)."""
    for a, b in (args, args[::-1]):
        frontier = [b]
        for _ in range(_ACTIVATION_CALLS):
            if not frontier:
                break
            inputs, pattern = producers.get(frontier.pop(), ([], _INJECTIVE + 1))
            if pattern > _INJECTIVE:
                continue
            if any(x.same_as(a) for x in inputs):
                return True
            frontier += [x for x in inputs if isinstance(x, ire.Var)]
    return False


def _per_channel(ty: object) -> bool:
    shape = getattr(ty, "shape", None)
    return shape is not None and len(shape) >= 3 and all(int(d) == 1 for d in list(shape)[2:])


def _is_product(func: object) -> bool:
    """Whether a PrimFunc is one block storing the product of loads of its two inputs."""
    if not isinstance(func, tirx.PrimFunc):
        return False
    blocks = get_blocks(func)
    if len(blocks) != 1 or not isinstance(blocks[0].body, tirx.BufferStore):
        return False
    value = blocks[0].body.value
    return isinstance(value, pe.Mul) and all(
        isinstance(x, ire.TensorLoad) for x in (value.a, value.b)) and \
        not value.a.source.same_as(value.b.source)


@dataclass
class Task:
    """A distinct fused PrimFunc.

    Parameters
    ----------
    name: its GlobalVar name in :attr:`TaskGraph.mod` (the first of ``func_names``).
    func: the PrimFunc.
    analysis: what it computes (complex op, prologue, epilogue, kind).
    func_names: every GlobalVar bound to a structurally equal copy.
    calls: number of call sites in ``main``.
    """

    name: str
    func: tirx.PrimFunc
    analysis: FuncAnalysis
    func_names: list[str] = field(default_factory=list)
    calls: int = 0

    @property
    def kind(self) -> str:
        """Complex op kind (``c2d``, ``gmm``...) or ``reduce`` / ``elemwise`` / ``injective``."""
        return self.analysis.kind

    @property
    def op(self) -> ComplexOp | None:
        """The complex operator, if the task has one."""
        return self.analysis.op


@dataclass(frozen=True)
class Source:
    """Where a call argument comes from: ``call`` (index of a :class:`TaskCall`), a model
    ``input`` (its name) or a ``const`` (bound weight; ``ref`` is its position among the
    call's arguments)."""

    kind: str
    ref: int | str


@dataclass(frozen=True)
class TaskCall:
    """One ``call_tir`` in ``main``.

    Parameters
    ----------
    index: position in topological order.
    task: name of the :class:`Task` called.
    var: the Relax variable bound to the result.
    args: the source of each argument (same order as the PrimFunc's inputs).
    shape, dtype: of the result.
    op: the complex op as seen at this call, with the padding of a separate producer pad
        task folded in (``None`` for non-complex tasks).
    pad_producer: index of that producer pad call, if any.
    """

    index: int
    task: str
    var: str
    args: tuple[Source, ...]
    shape: tuple[int, ...]
    dtype: str
    op: ComplexOp | None = None
    pad_producer: int | None = None


@dataclass(frozen=True)
class Edge:
    """Output of call ``src`` feeds argument ``arg`` of call ``dst``."""

    src: int
    dst: int
    arg: int


@dataclass
class TaskGraph:
    """Fused model: the module, its tasks, its call sites and the edges between them.

    Parameters
    ----------
    mod: the fused IRModule (weights bound as constants; ``main`` takes the model inputs).
    tasks: distinct tasks by name, in order of first call.
    calls: call sites in topological order.
    edges: producer -> consumer links between calls.
    outputs: indices of the calls whose results ``main`` returns (in return order).
    """

    mod: tvm.IRModule
    tasks: dict[str, Task]
    calls: list[TaskCall]
    edges: list[Edge]
    outputs: list[int]

    def complex_calls(self) -> list[TaskCall]:
        """Call sites of complex operators, in topological order."""
        return [c for c in self.calls if c.op is not None]

    def complex_tasks(self) -> list[Task]:
        """Distinct tasks holding a complex operator."""
        return [t for t in self.tasks.values() if t.op is not None]

    def producers(self, index: int) -> list[Edge]:
        """Edges into call ``index``."""
        return [e for e in self.edges if e.dst == index]

    def consumers(self, index: int) -> list[Edge]:
        """Edges out of call ``index``."""
        return [e for e in self.edges if e.src == index]

    def specs(self) -> list[str]:
        """Workload spec of every complex call, in topological order."""
        return [c.op.spec() for c in self.complex_calls()]  # type: ignore[union-attr]

    def summary(self) -> str:
        """One line per call: index, task, kind, spec or epilogue, producers."""
        lines = []
        for c in self.calls:
            task = self.tasks[c.task]
            what = c.op.spec() if c.op else task.kind
            extra = "+".join(task.analysis.epilogue)
            src = ",".join(str(e.src) for e in self.producers(c.index))
            lines.append(f"{c.index:3d} {c.task:40s} {what} [{extra}] <- {src}")
        return "\n".join(lines)


def extract_tasks(model: ImportedModel | tvm.IRModule) -> TaskGraph:
    """Fuse ``model`` (an :class:`ImportedModel`, or a Relax module whose ``main`` takes only
    the model inputs) and build its :class:`TaskGraph`."""
    mod = prepare(model) if isinstance(model, ImportedModel) else model
    fused = fuse_pipeline()(mod)
    return graph_of(fused)


def graph_of(fused: tvm.IRModule) -> TaskGraph:
    """The :class:`TaskGraph` of an already fused module."""
    main = fused["main"]
    tasks: dict[str, Task] = {}
    canonical: dict[str, str] = {}
    calls: list[TaskCall] = []
    edges: list[Edge] = []
    env: dict[ire.Var, list[Source]] = {p: [Source("input", p.name)] for p in main.params}
    call_tir = tvm.ir.Op.get("relax.call_tir")
    for block in main.body.blocks:
        for binding in block.bindings:
            value = binding.value
            if isinstance(value, ire.Call) and value.op.same_as(call_tir):
                gname = value.args[0].name_hint
                name = canonical.get(gname) or _register(fused, gname, tasks, canonical)
                tasks[name].calls += 1
                args = []
                for k, arg in enumerate(value.args[1].fields):
                    srcs = _sources(arg, env)
                    args.append(srcs[0] if len(srcs) == 1 else Source("const", k))
                    for s in srcs:
                        if s.kind == "call":
                            edges.append(Edge(int(s.ref), len(calls), k))
                ty = binding.var.ty
                calls.append(TaskCall(len(calls), name, binding.var.name, tuple(args),
                                      tuple(int(d) for d in ty.shape), str(ty.dtype),
                                      tasks[name].op))
                env[binding.var] = [Source("call", len(calls) - 1)]
            else:
                env[binding.var] = _sources(value, env)
    outputs = [int(s.ref) for s in _sources(main.body.body, env) if s.kind == "call"]
    calls = [_fold_pad(c, calls, tasks) for c in calls]
    return TaskGraph(fused, tasks, calls, edges, outputs)


def _register(mod: tvm.IRModule, gname: str, tasks: dict[str, Task],
              canonical: dict[str, str]) -> str:
    func = mod[gname]
    for task in tasks.values():
        if tvm_ffi.structural_equal(task.func, func):
            task.func_names.append(gname)
            canonical[gname] = task.name
            return task.name
    tasks[gname] = Task(gname, func, analyze_func(func), [gname])
    canonical[gname] = gname
    return gname


def _sources(expr: object, env: dict[ire.Var, list[Source]]) -> list[Source]:
    if isinstance(expr, ire.Var):
        return env.get(expr, [Source("input", expr.name)])
    if isinstance(expr, ire.Tuple):
        return [s for f in expr.fields for s in _sources(f, env)]
    if isinstance(expr, ire.TupleGetItem):
        inner = _sources(expr.tuple_value, env)
        return [inner[expr.index]] if len(inner) > expr.index else inner
    if isinstance(expr, ire.Call):
        return [s for a in expr.args for s in _sources(a, env)]
    return [Source("const", -1)]


def _fold_pad(call: TaskCall, calls: list[TaskCall], tasks: dict[str, Task]) -> TaskCall:
    """Fold a separate pad task feeding a convolution's data into the call's op parameters
    (spatial dims are taken to be the trailing ones, as in the NC[D]HW layouts frontends emit)."""
    op = call.op
    if op is None or op.kind == "gmm" or op.kind.startswith("t") or op.data_arg is None \
            or any(op.params["pad"]):
        return call
    src = call.args[op.data_arg]
    if src.kind != "call":
        return call
    producer = calls[int(src.ref)]
    pad = tasks[producer.task].analysis.pad
    if pad is None:
        return call
    before, after = pad
    nd = len(op.params["size"])  # type: ignore[arg-type]
    if any(before[:-nd]) or any(after[:-nd]):
        return call
    params = dict(op.params)
    params["pad"], params["pad_after"] = tuple(before[-nd:]), tuple(after[-nd:])
    params["size"] = tuple(s - b - a for s, b, a in
                           zip(op.params["size"], before[-nd:], after[-nd:]))  # type: ignore
    return replace(call, op=replace(op, params=params), pad_producer=producer.index)

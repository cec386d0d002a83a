"""Layout propagation over a dataflow graph (ALT §4.2, Alg. 1, and §6).

Complex operators are visited in topological order. A complex operator's output layout
is copied onto elementwise consumers of equal shape (so fused epilogues share the loop
nest), and on through further elementwise operators, until:

* the next operator is complex: the elementwise operator before it writes its output
  directly in the layout that operator wants for its input (ALT Fig. 5b: the producer
  performs the conversion, no extra operator);
* the sequence holds a non-trivial advanced primitive (unfold, pad, store_at), or the
  consumer is itself complex, or cannot read through a layout: an explicit conversion
  operator is inserted (Alg. 1, lines 3-6).

An elementwise operator with several propagated inputs follows the first (§6); if none
of its inputs carries a layout yet, the layout of its output (set by a complex operator
it feeds) is propagated backwards to all of them. Constant weights never need a
conversion at run time: they are transformed once when the network is built.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ..layout import Layout

COMPLEX, ELEMENTWISE, OTHER = "complex", "elementwise", "other"


@dataclass(frozen=True)
class OpNode:
    """One operator: its kind, input tensors (for a complex op: data first, then weight)
    and output tensor."""

    name: str
    kind: str
    inputs: tuple[str, ...]
    output: str


@dataclass
class Dataflow:
    """A dataflow graph: operators in topological order, tensor shapes and constants."""

    ops: list[OpNode]
    shapes: dict[str, tuple[int, ...]]
    constants: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        for op in self.ops:
            if op.kind not in (COMPLEX, ELEMENTWISE, OTHER):
                raise ValueError(f"op {op.name}: kind {op.kind!r} not in complex/elementwise/other")
            for t in op.inputs + (op.output,):
                if t not in self.shapes:
                    raise ValueError(f"op {op.name}: tensor {t!r} has no shape")

    def consumers(self, tensor: str) -> list[OpNode]:
        return [op for op in self.ops if tensor in op.inputs]

    def producer(self, tensor: str) -> OpNode | None:
        return next((op for op in self.ops if op.output == tensor), None)

    def op(self, name: str) -> OpNode:
        return next(op for op in self.ops if op.name == name)


@dataclass(frozen=True)
class Conversion:
    """A layout conversion operator inserted on ``tensor`` before ``consumer``."""

    tensor: str
    consumer: str
    src: Layout
    dst: Layout


@dataclass
class Propagation:
    """The result: every tensor's storage layout, what each operator reads, conversions."""

    storage: dict[str, Layout] = field(default_factory=dict)
    reads: dict[tuple[str, str], Layout] = field(default_factory=dict)
    conversions: list[Conversion] = field(default_factory=list)
    weights: dict[str, Layout] = field(default_factory=dict)

    def layout_of(self, tensor: str, shapes: Mapping[str, Sequence[int]]) -> Layout:
        return self.storage.get(tensor) or Layout(shapes[tensor])

    def read_layout(self, op: str, tensor: str, shapes: Mapping[str, Sequence[int]]) -> Layout:
        """The layout in which ``op`` reads ``tensor`` (after any conversion)."""
        return self.reads.get((op, tensor)) or self.layout_of(tensor, shapes)


def propagate(graph: Dataflow, chosen: Mapping[str, Mapping[str, Layout]]) -> Propagation:
    """Propagate the layouts ``chosen`` for complex operators through ``graph``.

    ``chosen`` maps a complex op's name to layouts of its ``data`` (first input),
    ``weight`` (second input) and ``out`` tensors, each over that tensor's shape in the
    graph (a convolution's data layout over the unpadded input starts with ``pad``).
    Further inputs of a complex op are its fused epilogue's operands: a same-shape one
    (a residual) is read in the output's layout when its producer can write it so (§6),
    otherwise in its own layout; constants (a bias) keep theirs.
    """
    result = Propagation()
    ident = {t: Layout(s) for t, s in graph.shapes.items()}
    for op in graph.ops:
        if op.kind != COMPLEX:
            continue
        layouts = chosen.get(op.name, {})
        data, weight, *extras = op.inputs
        want = layouts.get("data", ident[data])
        result.reads[(op.name, data)] = want
        _feed_complex_input(graph, result, op, data, want)
        w_layout = layouts.get("weight", ident[weight])
        result.reads[(op.name, weight)] = w_layout
        if weight in graph.constants:
            result.weights[weight] = w_layout
        elif w_layout != result.layout_of(weight, graph.shapes):
            result.conversions.append(Conversion(weight, op.name,
                                                 result.layout_of(weight, graph.shapes), w_layout))
        out_layout = layouts.get("out", ident[op.output])
        for x in extras:
            if graph.shapes[x] == graph.shapes[op.output] and x not in graph.constants:
                _write_as_output(graph, result, op, x, out_layout)
            result.reads[(op.name, x)] = result.layout_of(x, graph.shapes)
        result.storage[op.output] = out_layout
        _propagate_from(graph, result, op.output, out_layout)
    _convert_foreign_reads(graph, result, ident)
    return result


def _write_as_output(graph: Dataflow, result: Propagation, op: OpNode, tensor: str,
                     layout: Layout) -> None:
    """§6 backwards: the elementwise producer of a residual operand writes it in the
    output's layout when nothing else fixed its layout and nobody else reads it."""
    producer = graph.producer(tensor)
    if (tensor in result.storage or producer is None or producer.kind != ELEMENTWISE
            or len(graph.consumers(tensor)) > 1 or layout.has_nontrivial_advanced()):
        return
    result.storage[tensor] = layout
    _propagate_backwards(graph, result, producer, layout)


def _feed_complex_input(graph: Dataflow, result: Propagation, op: OpNode, tensor: str,
                        want: Layout) -> None:
    """Make ``tensor`` available to complex ``op`` in layout ``want``."""
    have = result.layout_of(tensor, graph.shapes)
    if have == want:
        return
    producer = graph.producer(tensor)
    others = [c for c in graph.consumers(tensor) if c.name != op.name]
    if (producer is not None and producer.kind == ELEMENTWISE and tensor not in result.storage
            and not others):
        # Fig. 5b: the elementwise producer writes straight into the wanted layout
        result.storage[tensor] = want
        _propagate_backwards(graph, result, producer, want)
        return
    result.conversions.append(Conversion(tensor, op.name, have, want))


def _propagate_from(graph: Dataflow, result: Propagation, tensor: str, layout: Layout,
                    ) -> None:
    """Alg. 1 from a complex operator's output ``tensor`` stored in ``layout``."""
    if layout.is_identity() or layout.has_nontrivial_advanced():
        return  # consumers read it through a conversion where they need one
    queue = deque([tensor])
    while queue:
        s = queue.popleft()
        for o2 in graph.consumers(s):
            t = o2.output
            if o2.kind != ELEMENTWISE or graph.shapes[t] != graph.shapes[s] or t in result.storage:
                continue
            if s != o2.inputs[0] and any(x in result.storage for x in o2.inputs[:o2.inputs.index(s)]
                                         if graph.shapes[x] == graph.shapes[t]):
                continue  # §6: an earlier propagated input decides the output layout
            if any(o3.kind == COMPLEX for o3 in graph.consumers(t)):
                continue  # o2 will write t in the complex consumer's input layout
            result.storage[t] = layout
            queue.append(t)


def _propagate_backwards(graph: Dataflow, result: Propagation, op: OpNode, layout: Layout,
                         ) -> None:
    """§6: an elementwise op whose output layout is fixed first hands that layout to all of
    its same-shape inputs that carry none yet (and on through their elementwise producers).
    Layouts with non-trivial advanced primitives stop here: the op reads logical inputs and
    performs that conversion itself."""
    if layout.has_nontrivial_advanced():
        return
    for x in op.inputs:
        if x in result.storage or graph.shapes[x] != graph.shapes[op.output]:
            continue
        if x in graph.constants or len(graph.consumers(x)) > 1:
            continue
        result.storage[x] = layout
        producer = graph.producer(x)
        if producer is not None and producer.kind == ELEMENTWISE:
            _propagate_backwards(graph, result, producer, layout)


def _convert_foreign_reads(graph: Dataflow, result: Propagation, ident: dict[str, Layout]
                           ) -> None:
    """Operators that cannot read through a layout (``other``) or that would read a
    non-trivial advanced layout of a tensor get a conversion to the logical layout."""
    for op in graph.ops:
        if op.kind == COMPLEX:
            continue
        for x in op.inputs:
            have = result.layout_of(x, graph.shapes)
            if have.is_identity():
                continue
            if op.kind == OTHER or have.has_nontrivial_advanced():
                result.conversions.append(Conversion(x, op.name, have, ident[x]))
                result.reads[(op.name, x)] = ident[x]

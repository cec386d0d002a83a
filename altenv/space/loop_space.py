"""The loop space of one task: MetaSchedule design spaces seen as a vector of decisions.

MetaSchedule's ``post-order-apply`` generator with the target's schedule rules gives a
few design spaces (traces with sampling instructions). A point is the design-space
index plus one decision per sampling instruction; decoding replays the chosen trace
with those decisions and runs MetaSchedule's postprocessors. Sampling instructions of
different design spaces that sample the same thing (same kind, attributes, extent or
block, and occurrence) share one subspace, so moving between design spaces keeps the
tiling. What MetaSchedule does not have — the fixed-length vector, directional moves,
encodings and JSON — is written here.

With a tensor intrinsic (``intrin=``, e.g. an ``altenv.mapping`` dot product), the
target's rules tile with ``MultiLevelTilingWithIntrin`` instead of ``MultiLevelTiling``
and the ``RewriteTensorize`` postprocessor emits the intrinsic, so every point is a
tiling around the tensorized inner block.
"""

from __future__ import annotations

import threading
from collections import Counter, OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import tvm
import tvm_ffi
from tvm.s_tir import Schedule
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.schedule import Instruction, Trace

from altenv.errors import UserError
from altenv.space.intrin import ensure_registered, tune_context_intrins
from altenv.space.subspace import (
    CategoricalSubspace,
    ComputeLocationSubspace,
    DesignSubspace,
    Subspace,
    TileSubspace,
    Value,
)

_TILE, _CATEGORICAL, _LOCATION = "SamplePerfectTile", "SampleCategorical", "SampleComputeLocation"
_EXPOSED = (_TILE, _CATEGORICAL, _LOCATION)


class StaleRecordError(UserError, ValueError):
    """A recorded point that does not fit the design space this version of altenv builds
    for its layout (the rules that shape the space changed since it was recorded); the
    command line prints it as one line."""


@dataclass(frozen=True)
class LoopPoint:
    """A point of a :class:`LoopSpace`: ``values[0] == (design_index,)``, then one tuple
    of ints per sampling subspace. Hashable, so it can key caches and sets."""

    values: tuple[Value, ...]

    @property
    def design(self) -> int:
        """Index of the design space this point decodes with."""
        return self.values[0][0]

    def replace(self, subspace: int, value: Value) -> LoopPoint:
        """A copy with one subspace's value changed."""
        values = list(self.values)
        values[subspace] = tuple(int(v) for v in value)
        return LoopPoint(tuple(values))


@dataclass(frozen=True)
class _Design:
    """One design space: its trace, which subspace each sampling instruction feeds, and
    the decisions of sampling instructions the space does not expose."""

    insts: tuple[Instruction, ...]
    slots: tuple[tuple[int, int], ...]  # (instruction index, subspace index), trace order
    fixed: dict[Instruction, Any]


def _mutator_probs(target: tvm.target.Target) -> dict[ms.Mutator, float]:
    """MetaSchedule's mutators of the target (``cuda`` or ``llvm``) without
    ``MutateParallel``: that one rewrites an annotation's value, which a point (decisions
    of sampling instructions) cannot hold, so a mutant it made would be measured as its
    parent."""
    kind = "cuda" if target.kind.name == "cuda" else "llvm"
    probs = {m: p for m, p in ms.Mutator.create(kind).items()
             if not isinstance(m, ms.mutator.MutateParallel)}
    total = sum(probs.values())
    return {m: p / total for m, p in probs.items()}


def _generator(target: tvm.target.Target, intrin: str | None
               ) -> ms.space_generator.PostOrderApply:
    """``post-order-apply`` with the target's rules and postprocessors, or, with tensor
    intrinsic ``intrin``, the LLVM rules tiling around it (as TVM's own x86 VNNI
    configuration)."""
    if intrin is None:
        return ms.space_generator.PostOrderApply(mutator_probs=_mutator_probs(target))
    ensure_registered(intrin)
    rules = [ms.schedule_rule.MultiLevelTilingWithIntrin(
        intrin, structure="SSRSRS", max_innermost_factor=64,
        reuse_write=ms.schedule_rule.ReuseType(req="may", levels=[1, 2], scope="global"))
        if isinstance(r, ms.schedule_rule.MultiLevelTiling) else r
        for r in ms.ScheduleRule.create("llvm")]
    postprocs = []
    for p in ms.Postproc.create("llvm"):
        postprocs.append(p)
        if isinstance(p, ms.postproc.RewriteReductionBlock):
            postprocs.append(ms.postproc.RewriteTensorize(vectorize_init_loop=True))
    return ms.space_generator.PostOrderApply(sch_rules=rules, postprocs=postprocs,
                                             mutator_probs=_mutator_probs(target))


class _Core:
    """Everything derived from (module, target, intrinsic) once: context, designs,
    subspaces."""

    def __init__(self, mod: tvm.IRModule, target: tvm.target.Target,
                 intrin: str | None = None) -> None:
        self.mod = mod
        self.target = target
        self.intrin = intrin
        with tune_context_intrins(target):
            self.context = ms.TuneContext(
                mod, target=target, space_generator=_generator(target, intrin), task_name="task"
            )
        self.postprocs = list(self.context.space_generator.postprocs)
        spaces = self.context.generate_design_space()
        if not spaces:
            raise ValueError("MetaSchedule generated no design space for this task")
        if intrin is not None and not any(_tensorized(sch) for sch in spaces):
            raise ValueError(f"MetaSchedule cannot tensorize this task with {intrin}")
        keys: dict[tuple, int] = {("design",): 0}
        subspaces: list[Subspace] = [DesignSubspace("design", len(spaces))]
        defaults: list[Value] = [(0,)]
        self.designs: list[_Design] = []
        for sch in spaces:
            trace = sch.trace
            insts = tuple(trace.insts)
            producers = {_rv_key(out): inst for inst in insts for out in inst.outputs}
            seen: Counter = Counter()
            slots, fixed = [], {}
            for i, inst in enumerate(insts):
                kind = inst.kind.name
                if kind not in _EXPOSED:
                    if kind.startswith("Sample"):
                        fixed[inst] = trace.get_decision(inst)
                    continue
                decision = _value_of(kind, trace.get_decision(inst))
                signature = _signature(inst, decision, producers)
                seen[signature] += 1
                key = (signature, seen[signature])
                if key not in keys:
                    keys[key] = len(subspaces)
                    subspaces.append(_make_subspace(signature, len(subspaces), sch))
                    defaults.append(decision)
                elif kind == _LOCATION:  # the same block in another design: widest nest
                    shared = subspaces[keys[key]]
                    depth = max(shared.num_loops, _max_loop_depth(sch))
                    subspaces[keys[key]] = ComputeLocationSubspace(shared.name, depth)
                slots.append((i, keys[key]))
            self.designs.append(_Design(insts, tuple(slots), fixed))
        self.subspaces: tuple[Subspace, ...] = tuple(subspaces)
        self.defaults: tuple[Value, ...] = tuple(defaults)
        #: what each subspace samples: (signature, occurrence), the design index first
        self.keys: tuple[tuple, ...] = tuple(sorted(keys, key=keys.get))


def _tensorized(sch: Schedule) -> bool:
    """Whether a design space tiles a block for a tensor intrinsic."""
    return any(inst.kind.name == "Annotate" and str(inst.attrs[0]) ==
               "meta_schedule.auto_tensorize" for inst in sch.trace.insts)


def _rv_key(rv: Any) -> int:
    """A key for a random variable that survives re-wrapping by the FFI."""
    return rv.__hash__()


def _value_of(kind: str, decision: Any) -> Value:
    if kind == _TILE:
        return tuple(int(f) for f in decision)
    return (int(decision),)


def _signature(inst: Instruction, decision: Value, producers: dict[int, Instruction]) -> tuple:
    kind = inst.kind.name
    if kind == _TILE:
        levels, max_innermost = (int(a) for a in inst.attrs[:2])
        return (kind, levels, max_innermost, int(np.prod(decision)))
    if kind == _CATEGORICAL:
        return (kind, tuple(int(c) for c in inst.attrs[0]))
    producer = producers.get(_rv_key(inst.inputs[0]))
    if producer is not None and producer.kind.name == "GetSBlock":
        return (kind, str(producer.attrs[0]))
    return (kind, producer.kind.name if producer is not None else "")


def _max_loop_depth(sch: Schedule) -> int:
    root = sch.get_sblock("root")
    return max((len(sch.get_loops(b)) for b in sch.get_child_blocks(root)), default=0)


def _make_subspace(signature: tuple, index: int, sch: Schedule) -> Subspace:
    kind = signature[0]
    name = f"{index}:{kind.removeprefix('Sample')}"
    if kind == _TILE:
        _, levels, max_innermost, extent = signature
        return TileSubspace(name, extent, levels, max_innermost)
    if kind == _CATEGORICAL:
        return CategoricalSubspace(name, signature[1])
    return ComputeLocationSubspace(f"{name}:{signature[1]}", _max_loop_depth(sch))


_CACHE_LOCK = threading.Lock()
_CORES: dict[tuple[int, str, str | None], list[_Core]] = {}


def _core_for(mod: tvm.IRModule, target: tvm.target.Target, intrin: str | None) -> _Core:
    key = (tvm_ffi.structural_hash(mod), str(target), intrin)
    with _CACHE_LOCK:
        for core in _CORES.get(key, []):
            if tvm_ffi.structural_equal(core.mod, mod):
                return core
    core = _Core(mod, target, intrin)
    with _CACHE_LOCK:
        _CORES.setdefault(key, []).append(core)
    return core


class LoopSpace:
    """The loop-tuning space of one task PrimFunc on one target.

    Built on MetaSchedule's design-space generation (``post-order-apply`` with the
    target's schedule rules and postprocessors); structurally equal tasks share the
    generated spaces, so constructing the space of an already seen layout is cheap.

    Parameters
    ----------
    mod : tvm.tirx.PrimFunc | tvm.IRModule
        The task (a PrimFunc, or an IRModule whose only function is the task).
    target : tvm.target.Target
        The target, e.g. ``altenv.target.make_target(None)``.
    cache_size : int
        Decoded points kept (schedules and validity) to avoid replaying twice.
    intrin : str | None
        A registered tensor intrinsic to tile around and tensorize with (``None``: the
        target's default rules).
    """

    def __init__(
        self,
        mod: tvm.tirx.PrimFunc | tvm.IRModule,
        target: tvm.target.Target,
        cache_size: int = 512,
        intrin: str | None = None,
    ) -> None:
        if isinstance(mod, tvm.tirx.PrimFunc):
            mod = tvm.IRModule({"main": mod.with_attr("global_symbol", "main")})
        self._core = _core_for(mod, target, intrin)
        self._cache_size = cache_size
        self._decoded: OrderedDict[LoopPoint, Schedule | None] = OrderedDict()

    # ----------------------------------------------------------------- structure
    @property
    def mod(self) -> tvm.IRModule:
        """The task module."""
        return self._core.mod

    @property
    def target(self) -> tvm.target.Target:
        """The target the design spaces were generated for."""
        return self._core.target

    @property
    def context(self) -> ms.TuneContext:
        """MetaSchedule's tuning context of the task (feature extraction needs it)."""
        return self._core.context

    @property
    def subspaces(self) -> tuple[Subspace, ...]:
        """Subspace 0 is the design-space index; then one per sampling instruction."""
        return self._core.subspaces

    @property
    def num_designs(self) -> int:
        """Number of MetaSchedule design spaces."""
        return len(self._core.designs)

    @property
    def num_subspaces(self) -> int:
        """Number of subspaces, the design-space index included."""
        return len(self._core.subspaces)

    @property
    def subspace_sizes(self) -> tuple[int, ...]:
        """Entries of each subspace in the flat point vector (tile levels, or 1)."""
        return tuple(s.size for s in self._core.subspaces)

    @property
    def vector_size(self) -> int:
        """Length of :meth:`to_vector` and :meth:`encode`."""
        return sum(self.subspace_sizes)

    @property
    def default(self) -> LoopPoint:
        """Design space 0 with the decisions MetaSchedule generated; sampled points keep
        these values in the subspaces their design does not read."""
        return LoopPoint(self._core.defaults)

    @property
    def action_nvec(self) -> np.ndarray:
        """Directions per subspace: the ``nvec`` of a ``MultiDiscrete`` action space."""
        return np.array([s.num_directions for s in self._core.subspaces], dtype=np.int64)

    def design_slots(self, design: int) -> tuple[int, ...]:
        """Subspace fed by each exposed sampling instruction of a design space, in trace
        order (the order of those instructions in a decoded schedule's trace)."""
        return tuple(k for _, k in self._core.designs[design].slots)

    def design_sites(self, design: int) -> tuple[tuple[Instruction, int], ...]:
        """Each exposed sampling instruction of a design space with the subspace it feeds,
        in trace order."""
        insts = self._core.designs[design].insts
        return tuple((insts[i], k) for i, k in self._core.designs[design].slots)

    def design_instructions(self, design: int) -> tuple[Instruction, ...]:
        """The whole trace of a design space (to find what a sampling instruction reads)."""
        return self._core.designs[design].insts

    def compute_locations(self, point: LoopPoint, subspace: int) -> tuple[int, ...]:
        """The locations MetaSchedule offers to a compute-location subspace that
        ``point``'s design reads, given the point's earlier decisions: the trace is
        replayed up to that instruction and every location is tried there (MetaSchedule
        snaps an unavailable one to a neighbour)."""
        design = self._core.designs[point.design]
        stop = next(i for i, k in design.slots if k == subspace)
        sch = self._new_schedule(1)
        prefix = design.insts[:stop]
        decisions = {inst: d for inst, d in self._decisions(point).items() if inst in prefix}
        Trace(list(prefix), decisions).apply_to_schedule(sch, remove_postproc=True)
        sub = self._core.subspaces[subspace]
        try:  # the subspace is named after its block when the trace names one
            block = sch.get_sblock(sub.name.rsplit(":", 1)[-1])
        except (RuntimeError, ValueError):
            return tuple(range(-2, sub.num_loops))
        found = []
        for loc in range(-2, sub.num_loops):
            sch.sample_compute_location(block, decision=loc)
            if int(sch.trace.get_decision(sch.trace.insts[-1])) == loc:
                found.append(loc)
        return tuple(found)

    def describe(self) -> list[dict[str, Any]]:
        """The space's structure as JSON, enough to walk it and read a point without TVM:
        each subspace's class, size, directions and fields."""
        out = []
        for sub in self._core.subspaces:
            entry: dict[str, Any] = {"type": type(sub).__name__, "size": sub.size,
                                     "directions": sub.num_directions}
            entry.update({k: list(v) if isinstance(v, tuple) else v
                          for k, v in vars(sub).items()
                          if isinstance(v, (int, str, float, bool, list, tuple))})
            out.append(entry)
        return out

    def canonical(self, point: LoopPoint) -> LoopPoint:
        """``point`` with every subspace its design does not read set to that subspace's
        canonical value: the same program, one vector. (Unread subspaces otherwise hold the
        decisions MetaSchedule drew when this process generated the design spaces, which
        differ between processes.)"""
        mask = self.active(point)
        return LoopPoint(tuple(value if read else sub.canonical for value, read, sub in
                               zip(point.values, mask, self._core.subspaces, strict=True)))

    def active(self, point: LoopPoint) -> np.ndarray:
        """Mask of the subspaces that ``point``'s design space reads (always subspace 0)."""
        mask = np.zeros(self.num_subspaces, dtype=bool)
        mask[0] = True
        for _, k in self._core.designs[point.design].slots:
            mask[k] = True
        return mask

    # ----------------------------------------------------------------- sampling
    def sample(self, n: int, seed: int | np.random.Generator | None = None,
               max_tries: int = 16) -> list[LoopPoint]:
        """``n`` valid points drawn by MetaSchedule's own sampling (each design space
        equally likely); fewer only if ``n * max_tries`` draws give no more."""
        rng = np.random.default_rng(seed)
        points: list[LoopPoint] = []
        for _ in range(n * max_tries):
            if len(points) == n:
                break
            d = int(rng.integers(self.num_designs))
            design = self._core.designs[d]
            sch = self._new_schedule(int(rng.integers(1, 1 << 30)))
            Trace(list(design.insts), dict(design.fixed)).apply_to_schedule(
                sch, remove_postproc=True)
            values = list(self._core.defaults)
            values[0] = (d,)
            insts = sch.trace.insts
            for i, k in design.slots:
                values[k] = _value_of(insts[i].kind.name, sch.trace.get_decision(insts[i]))
            point = LoopPoint(tuple(values))
            ok = self._postprocess(sch)
            self._remember(point, sch if ok else None)
            if ok:
                points.append(point)
        return points

    # ----------------------------------------------------------------- MetaSchedule search
    def search_context(self, strategy: ms.SearchStrategy, seed: int,
                       threads: int | None = None) -> tuple[ms.TuneContext, list[Schedule]]:
        """A tuning context of this task for a MetaSchedule search ``strategy`` (same rules,
        postprocessors and mutators as the space), seeded with ``seed``, and its design
        spaces (whose traces :meth:`point_of` reads back). ``threads``: the search's
        threads (``None``: the physical cores); only one makes a seeded search repeat,
        since its threads take candidates as they free up."""
        with tune_context_intrins(self.target):
            context = ms.TuneContext(self.mod, target=self.target,
                                     space_generator=_generator(self.target, self._core.intrin),
                                     search_strategy=strategy, task_name="task",
                                     rand_state=seed, num_threads=threads or "physical")
        return context, list(context.generate_design_space())

    def point_of(self, sch: Schedule) -> LoopPoint | None:
        """The point that decodes to ``sch`` (a schedule of one of the design spaces with
        other decisions, e.g. a MetaSchedule search candidate, whose trace may have been
        simplified), or ``None`` if no valid point does: the sampling instructions of the
        trace are matched to a design space's in order, and the decoded program must be
        structurally equal to ``sch``'s."""
        samples = [inst for inst in sch.trace.insts if inst.kind.name.startswith("Sample")]
        kinds = tuple(inst.kind.name for inst in samples)
        for d, design in enumerate(self._core.designs):
            ours = [i for i, inst in enumerate(design.insts) if inst.kind.name.startswith("Sample")]
            if tuple(design.insts[i].kind.name for i in ours) != kinds:
                continue
            at = dict(zip(ours, samples))
            values = list(self._core.defaults)
            values[0] = (d,)
            for i, k in design.slots:
                values[k] = _value_of(at[i].kind.name, sch.trace.get_decision(at[i]))
            point = LoopPoint(tuple(values))
            decoded = self.decode(point)
            if decoded is not None and tvm_ffi.structural_equal(decoded.mod, sch.mod):
                return point
        return None

    def transfer(self, point: LoopPoint, source: LoopSpace) -> LoopPoint | None:
        """``point``, a point of ``source`` (the same operator with another fused
        epilogue, say), as a point of this space: its design index, and each decision
        where this space samples the same thing (kind, attributes, tile extent or block,
        occurrence); this space's defaults elsewhere. ``None`` if that does not decode."""
        theirs = dict(zip(source._core.keys, point.values, strict=True))
        values = tuple(theirs.get(key, default)
                       for key, default in zip(self._core.keys, self._core.defaults, strict=True))
        moved = LoopPoint(values)
        try:
            return moved if self.is_valid(moved) else None
        except ValueError:  # a design or a value this space does not have
            return None

    # ----------------------------------------------------------------- decoding
    def decode(self, point: LoopPoint) -> Schedule | None:
        """The schedule of ``point`` (trace replayed, postprocessors applied), or ``None``
        if the point is invalid. Schedules are cached: treat them as read-only."""
        if point in self._decoded:
            self._decoded.move_to_end(point)
            return self._decoded[point]
        sch = self._replay(point)
        self._remember(point, sch)
        return sch

    def is_valid(self, point: LoopPoint) -> bool:
        """Whether ``point`` replays to its own decisions and passes the postprocessors."""
        return self.decode(point) is not None

    def _replay(self, point: LoopPoint) -> Schedule | None:
        self._check(point)
        design = self._core.designs[point.design]
        sch = self._new_schedule(1)
        try:
            Trace(list(design.insts), self._decisions(point)).apply_to_schedule(
                sch, remove_postproc=True)
        except (RuntimeError, ValueError, IndexError):  # ScheduleError, InternalError
            return None
        insts = sch.trace.insts
        for i, k in design.slots:
            if _value_of(insts[i].kind.name, sch.trace.get_decision(insts[i])) != point.values[k]:
                return None
        return sch if self._postprocess(sch) else None

    def _decisions(self, point: LoopPoint) -> dict[Instruction, Any]:
        """The trace decisions of ``point`` (its design's fixed ones included)."""
        design = self._core.designs[point.design]
        decisions = dict(design.fixed)
        for i, k in design.slots:
            value = point.values[k]
            decisions[design.insts[i]] = list(value) if len(value) > 1 or isinstance(
                self._core.subspaces[k], TileSubspace) else value[0]
        return decisions

    def _new_schedule(self, seed: int) -> Schedule:
        return Schedule(self._core.mod, seed=seed, debug_mask="none", error_render_level="none")

    def _postprocess(self, sch: Schedule) -> bool:
        sch.enter_postproc()
        return all(p.apply(sch) for p in self._core.postprocs)

    def _remember(self, point: LoopPoint, sch: Schedule | None) -> None:
        self._decoded[point] = sch
        self._decoded.move_to_end(point)
        while len(self._decoded) > self._cache_size:
            self._decoded.popitem(last=False)

    # ----------------------------------------------------------------- moves
    def mutate(self, point: LoopPoint, rng: np.random.Generator) -> LoopPoint:
        """A random neighbour of ``point`` (evolutionary search's mutation): one move, or
        two with probability 0.3, each on a random active subspace in a random direction."""
        active = [k for k in np.flatnonzero(self.active(point))
                  if self.subspaces[k].num_directions > 1]
        for _ in range(1 + int(rng.random() < 0.3)):
            if not active:
                break
            k = int(rng.choice(active))
            point = self.move(point, k, int(rng.integers(1, self.subspaces[k].num_directions)))
        return point

    def move(self, point: LoopPoint, subspace: int, direction: int) -> LoopPoint:
        """Walk ``point`` one step along ``direction`` on ``subspace``: the nearest valid
        neighbour in that direction, or ``point`` itself when there is none. A compute
        location that the move invalidates (its loop changed) moves to the nearest valid
        location."""
        if direction == 0:
            return point
        active = self.active(point)[subspace]
        for value in self._core.subspaces[subspace].neighbours(point.values[subspace], direction):
            moved = point.replace(subspace, value)
            if not active or self.is_valid(moved):
                return moved
            repaired = self._repair(moved, keep={subspace})
            if repaired is not None:
                return repaired
        return point

    def step(self, point: LoopPoint, directions: Sequence[int]) -> LoopPoint:
        """Apply one direction per subspace at once (a ``MultiDiscrete`` action). The
        joint move (first candidate of every direction, compute locations repaired) is
        tried first; if invalid, the moves are applied one at a time."""
        if len(directions) != self.num_subspaces:
            raise ValueError(f"step: {len(directions)} directions for "
                             f"{self.num_subspaces} subspaces")
        joint, moved = point, set()
        for k, d in enumerate(directions):
            if d:
                first = next(self._core.subspaces[k].neighbours(point.values[k], int(d)), None)
                if first is not None:
                    joint = joint.replace(k, first)
                    moved.add(k)
        if joint == point or self.is_valid(joint):
            return joint
        repaired = self._repair(joint, keep=moved)
        if repaired is not None:
            return repaired
        for k, d in enumerate(directions):
            point = self.move(point, k, int(d))
        return point

    def _repair(self, point: LoopPoint, keep: set[int]) -> LoopPoint | None:
        """The valid point nearest to ``point`` that differs in one compute-location
        subspace outside ``keep``, or ``None``."""
        for k in self.design_slots(point.design):
            sub = self._core.subspaces[k]
            if k in keep or not isinstance(sub, ComputeLocationSubspace):
                continue
            old = point.values[k][0]
            for loc in sorted(range(-2, sub.num_loops), key=lambda v: (abs(v - old), v)):
                candidate = point.replace(k, (loc,))
                if loc != old and self.is_valid(candidate):
                    return candidate
        return None

    # ----------------------------------------------------------------- encodings
    def to_vector(self, point: LoopPoint) -> np.ndarray:
        """The flat integer vector of a point (length :attr:`vector_size`)."""
        return np.array([v for value in point.values for v in value], dtype=np.int64)

    def from_vector(self, vector: Sequence[int] | np.ndarray) -> LoopPoint:
        """Inverse of :meth:`to_vector`; :class:`StaleRecordError` when the vector has
        another length (it was recorded from a differently built design space)."""
        flat = [int(v) for v in vector]
        if len(flat) != self.vector_size:
            raise StaleRecordError(
                f"a recorded point of {len(flat)} loop decisions does not fit this design "
                f"space of {self.vector_size}: it was recorded by a version of altenv that "
                "built this layout's design space differently")
        values, at = [], 0
        for size in self.subspace_sizes:
            values.append(tuple(flat[at:at + size]))
            at += size
        return LoopPoint(tuple(values))

    def encode(self, point: LoopPoint) -> np.ndarray:
        """Normalized float32 features in [0, 1] (length :attr:`vector_size`) for RL
        observations: tile factors as log(factor)/log(extent), indices scaled."""
        feats = [f for sub, value in zip(self._core.subspaces, point.values, strict=True)
                 for f in sub.encode(value)]
        return np.asarray(feats, dtype=np.float32)

    def to_json(self, point: LoopPoint) -> dict[str, Any]:
        """Stable JSON form: ``{"design": d, "decisions": [[...], ...]}`` (one list per
        subspace after the design index, in subspace order)."""
        return {"design": point.design, "decisions": [list(v) for v in point.values[1:]]}

    def from_json(self, obj: dict[str, Any]) -> LoopPoint:
        """Inverse of :meth:`to_json`."""
        point = LoopPoint(((int(obj["design"]),),
                           *(tuple(int(x) for x in v) for v in obj["decisions"])))
        self._check(point)
        return point

    def _check(self, point: LoopPoint) -> None:
        sizes = tuple(len(v) for v in point.values)
        if sizes != self.subspace_sizes or not 0 <= point.design < self.num_designs:
            raise ValueError(f"point does not belong to this space: sizes {sizes}, "
                             f"expected {self.subspace_sizes}, design {point.design} "
                             f"of {self.num_designs}")

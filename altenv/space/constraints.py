"""Constraint models of a task's joint space, solved with CP-SAT (Heron §4).

Heron describes a schedule space as a constraint satisfaction problem: tunable
variables, auxiliary products, and rules that bind them (Table 7: PROD, SUM, EQ, LE, IN,
SELECT). Here the variables ("genes") are named integers with a finite list of values:

* a loop space (:class:`LoopConstraints`): ``design``; ``t{k}.{l}`` the factor of
  level ``l`` of tile subspace ``k``; ``c{k}`` a categorical index; ``l{k}`` a compute
  location;
* a layout template (:class:`LayoutConstraints`): ``layout.{knob}`` for every knob.

Constraints (Heron's rules C1-C6 on MetaSchedule's design spaces):

* C1 split products: the levels of a tile multiply to the loop extent, the innermost at
  most ``max_innermost`` (an enumerated table of factorizations);
* C3 candidates: categorical indices, layout knobs in the divisors of their dims;
* C4 compute locations: per design space, the locations MetaSchedule offers (a SELECT:
  which values are legal depends on the design index); subspaces a design does not read
  keep their default;
* C5 cache capacity: the tile footprint of every buffer of the tiled block (product of
  the inner tile sizes of the loops that index it, CPU multi-level tiling ``SSRSRS``) sums
  to at most the L1 data cache inside the outer reduction loop and the L2 cache inside
  the outer spatial loops;
* C6 vector length: the innermost tile of the loop that indexes the output's contiguous
  dim is a multiple of the SIMD lanes (at most MetaSchedule's vectorize bound); layout
  knobs that tile a tensor's innermost dim are 1, a multiple of the lanes, or the dim;
  a depthwise convolution's input channel tile is 1 exactly when its output's is (the
  output's vector lanes read the input's channels one to one).

C5 and C6 are the hardware constraints (``hardware=True``); the others describe the
space exactly. Random constraint satisfaction (Heron's RandSAT) is CP-SAT with a fixed
search over the genes in random order, each domain split at random
(``SELECT_RANDOM_HALF``) and a fresh seed per solution. Every constraint also checks a
plain assignment in Python (:meth:`ConstraintModel.holds`), which action masks use.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tvm
from ortools.sat.python import cp_model
from tvm.s_tir import Schedule
from tvm.tirx.analysis import undefined_vars

from altenv.ops.operators import Conv
from altenv.ops.templates import Template, divisors
from altenv.target import vector_bits

from .loop_space import LoopPoint, LoopSpace
from .subspace import CategoricalSubspace, ComputeLocationSubspace, TileSubspace

Genes = dict[str, int]
LAYOUT = "layout."
"""Prefix of layout genes."""

_CACHE_DIR = Path("/sys/devices/system/cpu/cpu0/cache")
_FALLBACK_CACHE = {1: 32 * 1024, 2: 1024 * 1024}
_MAX_VECTORIZE = 64
"""MetaSchedule's CPU ``max_vectorize_extent``."""
_VECTOR_KNOBS = ("ot", "ot_w", "nt")
"""Layout knobs that tile the innermost physical dim of the output or the weight."""


# ------------------------------------------------------------------------- hardware
def cache_bytes(level: int, root: Path = _CACHE_DIR) -> int:
    """Size of this machine's level-``level`` data (or unified) cache, read from sysfs;
    32 KiB for L1 and 1 MiB for L2 when sysfs does not say."""
    for index in sorted(root.glob("index*")):
        try:
            if int((index / "level").read_text()) != level:
                continue
            if (index / "type").read_text().strip() == "Instruction":
                continue
            size = (index / "size").read_text().strip().upper()
        except (OSError, ValueError):
            continue
        scale = {"K": 1024, "M": 1024 ** 2, "G": 1024 ** 3}.get(size[-1:], 1)
        return int(size.rstrip("KMG")) * scale
    return _FALLBACK_CACHE.get(level, _FALLBACK_CACHE[2])


@dataclass(frozen=True)
class Hardware:
    """What the hardware constraints need: SIMD width and cache sizes (bytes)."""

    vector_bits: int
    l1_bytes: int
    l2_bytes: int

    @classmethod
    def of(cls, target: tvm.target.Target) -> Hardware:
        """The target's SIMD width and this machine's caches."""
        return cls(vector_bits(target), cache_bytes(1), cache_bytes(2))

    def lanes(self, dtype_bits: int = 32) -> int:
        """Elements of ``dtype_bits`` in one vector register."""
        return max(self.vector_bits // dtype_bits, 1)


def vector_values(values: Sequence[int], extent: int, lanes: int) -> list[int]:
    """Innermost vectorized tile sizes allowed among ``values``: multiples of ``lanes``
    up to MetaSchedule's vectorize bound; when the extent has none, tiles at least its
    largest divisor that fits in a register."""
    full = [v for v in values if v % lanes == 0 and v <= _MAX_VECTORIZE]
    if full:
        return full
    fits = max((d for d in divisors(extent) if d <= lanes), default=1)
    return [v for v in values if fits <= v <= max(_MAX_VECTORIZE, fits)]


# ------------------------------------------------------------------------- constraints
@dataclass(frozen=True)
class Allowed:
    """Heron's IN (and the table form of PROD): the tuple of ``names`` is one of ``rows``;
    with ``when=(gene, value)`` only when that gene has that value (Heron's SELECT)."""

    names: tuple[str, ...]
    rows: frozenset[tuple[int, ...]]
    when: tuple[str, int] | None = None

    def holds(self, genes: Mapping[str, int]) -> bool:
        if self.when is not None and genes[self.when[0]] != self.when[1]:
            return True
        return tuple(genes[n] for n in self.names) in self.rows


@dataclass(frozen=True)
class Capacity:
    """Heron's PROD, SUM and LE for a memory limit:
    ``sum(coef * prod(genes of term)) <= limit`` over ``terms = ((coef, names), ...)``."""

    terms: tuple[tuple[int, tuple[str, ...]], ...]
    limit: int

    def holds(self, genes: Mapping[str, int]) -> bool:
        return self.total(genes) <= self.limit

    def total(self, genes: Mapping[str, int]) -> int:
        return sum(c * math.prod(genes[n] for n in names) for c, names in self.terms)


Constraint = Allowed | Capacity


class ConstraintModel:
    """Genes with finite value lists, constraints on them, and random solving.

    Parameters
    ----------
    genes:
        Each gene's values (the gene takes one of them).
    constraints:
        :class:`Allowed` and :class:`Capacity` constraints on the genes.
    """

    def __init__(self, genes: Mapping[str, Sequence[int]],
                 constraints: Sequence[Constraint]):
        self.values: dict[str, tuple[int, ...]] = {g: tuple(v) for g, v in genes.items()}
        self.constraints = tuple(constraints)
        self._model = cp_model.CpModel()
        self._index: dict[str, cp_model.IntVar] = {}
        self._value: dict[str, cp_model.IntVar] = {}
        for gene, values in self.values.items():
            index = self._model.NewIntVar(0, len(values) - 1, f"{gene}#")
            value = self._model.NewIntVarFromDomain(
                cp_model.Domain.FromValues(sorted(set(values))), gene)
            self._model.AddElement(index, list(values), value)
            self._index[gene], self._value[gene] = index, value
        for constraint in self.constraints:
            self._post(self._model, constraint)

    @property
    def genes(self) -> tuple[str, ...]:
        return tuple(self.values)

    def holds(self, genes: Mapping[str, int]) -> bool:
        """Whether a full assignment takes listed values and satisfies every constraint."""
        return all(genes.get(g) in v for g, v in self.values.items()) and all(
            c.holds(genes) for c in self.constraints)

    def _post(self, model: cp_model.CpModel, constraint: Constraint) -> None:
        if isinstance(constraint, Capacity):
            total = []
            for coef, names in constraint.terms:
                if len(names) == 1:
                    total.append(coef * self._value[names[0]])
                    continue
                high = math.prod(max(self.values[n]) for n in names)
                product = model.NewIntVar(1, high, "*".join(names))
                model.AddMultiplicationEquality(product, [self._value[n] for n in names])
                total.append(coef * product)
            model.Add(sum(total) <= constraint.limit)
            return
        variables = [self._value[n] for n in constraint.names]
        if constraint.when is None:
            model.AddAllowedAssignments(variables, sorted(constraint.rows))
            return
        gene, value = constraint.when
        if len(variables) != 1:
            raise ValueError("a conditional constraint takes one gene")
        chosen = model.NewBoolVar(f"{gene}=={value}")
        model.Add(self._value[gene] == value).OnlyEnforceIf(chosen)
        model.Add(self._value[gene] != value).OnlyEnforceIf(chosen.Not())
        domain = cp_model.Domain.FromValues(sorted(r[0] for r in constraint.rows))
        model.AddLinearExpressionInDomain(variables[0], domain).OnlyEnforceIf(chosen)

    def solve(self, rng: np.random.Generator,
              allowed: Mapping[str, Collection[int]] | None = None,
              forbidden: Sequence[Mapping[str, int]] = ()) -> Genes | None:
        """One random solution (RandSAT) of the model plus ``allowed`` (gene -> values it
        may take, Heron's crossover IN constraints) and minus the ``forbidden`` full
        assignments; ``None`` if there is none."""
        model = self._model.Clone()
        for gene, values in (allowed or {}).items():
            legal = sorted(set(values) & set(self.values[gene]))
            if not legal:
                return None
            var = model.GetIntVarFromProtoIndex(self._value[gene].Index())
            model.AddLinearExpressionInDomain(var, cp_model.Domain.FromValues(legal))
        if forbidden:
            genes = list(self.values)
            model.AddForbiddenAssignments(
                [model.GetIntVarFromProtoIndex(self._value[g].Index()) for g in genes],
                [tuple(f[g] for g in genes) for f in forbidden])
        order = [model.GetIntVarFromProtoIndex(self._index[g].Index())
                 for g in rng.permutation(list(self.values))]
        model.AddDecisionStrategy(order, cp_model.CHOOSE_FIRST, cp_model.SELECT_RANDOM_HALF)
        solver = cp_model.CpSolver()
        # CP-SAT's own SIGINT handler is left behind as SIG_DFL after a solve: Ctrl-C then
        # killed the run without a word instead of raising KeyboardInterrupt
        solver.parameters.catch_sigint_signal = False
        solver.parameters.num_workers = 1
        solver.parameters.search_branching = cp_model.FIXED_SEARCH
        solver.parameters.cp_model_presolve = False  # presolve drops the random strategy
        # one feasible point of a small model: probing, symmetry detection and the LP
        # relaxation cost more than they prune (about half of each solve)
        solver.parameters.cp_model_probing_level = 0
        solver.parameters.symmetry_level = 0
        solver.parameters.linearization_level = 0
        solver.parameters.random_seed = int(rng.integers(1 << 30))
        solver.parameters.max_time_in_seconds = 5.0
        if solver.Solve(model) not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            return None
        return {g: int(solver.Value(self._value[g])) for g in self.values}

    def sample(self, n: int, rng: np.random.Generator, max_tries: int = 4) -> list[Genes]:
        """Up to ``n`` distinct random solutions (fewer if ``n * max_tries`` solves give
        no more)."""
        seen: dict[tuple[int, ...], Genes] = {}
        for _ in range(n * max_tries):
            if len(seen) == n:
                break
            genes = self.solve(rng)
            if genes is None:
                break
            seen.setdefault(tuple(genes.values()), genes)
        return list(seen.values())


# ------------------------------------------------------------------------- layouts
class LayoutConstraints(ConstraintModel):
    """The layout template's knobs as genes ``layout.{knob}``: the values each knob takes
    (divisors of its dim; an intrinsic mapping's indices), the levels of a multi-level dim
    dividing it together, and (``hardware``) the knobs that tile a tensor's innermost dim
    vector-friendly (1, a multiple of the lanes, or the whole dim)."""

    def __init__(self, template: Template, hardware: Hardware | None = None):
        self.template, self.hardware = template, hardware
        genes = {LAYOUT + k.name: template.choices(k) for k in template.knobs}
        constraints: list[Constraint] = []
        bases: dict[str, list[str]] = {}
        for knob in template.knobs:
            bases.setdefault(knob.name.rstrip("0123456789"), []).append(knob.name)
        for names in bases.values():
            if len(names) > 1:
                extent = next(k.extent for k in template.knobs if k.name == names[0])
                rows = [r for r in _product(*(genes[LAYOUT + n] for n in names))
                        if extent % math.prod(r) == 0]
                constraints.append(Allowed(tuple(LAYOUT + n for n in names), frozenset(rows)))
        if hardware is not None:
            lanes = hardware.lanes()

            def vector(gene: str, extent: int) -> list[int]:
                return [v for v in genes[gene] if v in (1, extent) or v % lanes == 0]

            for knob in template.knobs:
                if knob.name in _VECTOR_KNOBS:
                    rows = {(v,) for v in vector(LAYOUT + knob.name, knob.extent)}
                    constraints.append(Allowed((LAYOUT + knob.name,), frozenset(rows)))
            op = template.op
            if (isinstance(op, Conv) and op.groups == op.I == op.O
                    and LAYOUT + "it" in genes):
                # depthwise: output lane c reads input channel c, so the input's channel
                # tile is blocked like the output's (both 1, or both vector-sized)
                names = (LAYOUT + "it", LAYOUT + "ot")
                rows = {(i, o) for i in vector(names[0], op.I) for o in vector(names[1], op.O)
                        if (i == 1) == (o == 1)}
                constraints.append(Allowed(names, frozenset(rows)))
        super().__init__(genes, constraints)

    def factors(self, genes: Mapping[str, int]) -> dict[str, int]:
        """Template factors of an assignment."""
        return {k.name: int(genes[LAYOUT + k.name]) for k in self.template.knobs}

    def genes_of(self, factors: Mapping[str, int]) -> Genes:
        return {LAYOUT + k: int(v) for k, v in dict(factors).items()}

    def nearest(self, factors: Mapping[str, int]) -> dict[str, int]:
        """The legal factors closest to ``factors``: knob by knob in template order, the
        chosen value if the knobs fixed so far still admit a solution with it, else the
        admissible value nearest on a log scale (the smaller on a tie). Policies that pick
        knobs independently (one head each) cannot express constraints between knobs, such
        as a depthwise convolution's equal channel tiles; this projects their choice."""
        genes = self.genes_of(factors)
        if self.holds(genes):
            return dict(factors)
        rng = np.random.default_rng(0)
        fixed: dict[str, set[int]] = {}
        for knob in self.template.knobs:
            gene, want = LAYOUT + knob.name, max(int(factors[knob.name]), 1)
            order = sorted(self.values[gene],
                           key=lambda v: (abs(math.log(v) - math.log(want)), v))
            fixed[gene] = next(({v} for v in order
                                if self.solve(rng, {**fixed, gene: {v}}) is not None),
                               set(self.values[gene]))
        return self.factors({g: next(iter(v)) for g, v in fixed.items()})

    def knob_values(self, knob: str) -> set[int]:
        """Values of one knob that the unary constraints (and tables, per column) allow."""
        gene = LAYOUT + knob
        allowed = set(self.values[gene])
        for c in self.constraints:
            if isinstance(c, Allowed) and gene in c.names:
                allowed &= {row[c.names.index(gene)] for row in c.rows}
        return allowed


def _product(*lists: Sequence[int]) -> Iterator[tuple[int, ...]]:
    if not lists:
        yield ()
        return
    for head in lists[0]:
        for rest in _product(*lists[1:]):
            yield (head, *rest)


# ------------------------------------------------------------------------- loops
def _tilings(extent: int, levels: int, max_innermost: int) -> Iterator[tuple[int, ...]]:
    """Every ordered factorization of ``extent`` into ``levels`` factors (outer first),
    the innermost at most ``max_innermost`` when positive."""
    if levels == 1:
        if max_innermost <= 0 or extent <= max_innermost:
            yield (extent,)
        return
    for d in divisors(extent):
        for rest in _tilings(extent // d, levels - 1, max_innermost):
            yield (d, *rest)


@dataclass(frozen=True)
class _Axis:
    """The block loop a tile subspace splits."""

    block: str
    iter_index: int
    reduce: bool


class LoopConstraints(ConstraintModel):
    """The constraint model of one :class:`LoopSpace` (one layout).

    Parameters
    ----------
    space:
        The loop space.
    hardware:
        Hardware for the vector-length and cache-capacity constraints; ``None`` keeps
        only the constraints that describe the space exactly.
    """

    def __init__(self, space: LoopSpace, hardware: Hardware | None = None):
        self.space = space
        self.hardware = hardware
        subs = space.subspaces
        genes: dict[str, list[int]] = {"design": list(range(space.num_designs))}
        constraints: list[Constraint] = []
        self._names: list[tuple[str, ...]] = [("design",)]
        for k, sub in enumerate(subs[1:], start=1):
            if isinstance(sub, TileSubspace):
                names = tuple(f"t{k}.{level}" for level in range(sub.levels))
                rows = frozenset(_tilings(sub.extent, sub.levels, sub.max_innermost))
                for level, name in enumerate(names):
                    genes[name] = sorted({r[level] for r in rows})
                constraints.append(Allowed(names, rows))
            elif isinstance(sub, CategoricalSubspace):
                names = (f"c{k}",)
                genes[names[0]] = list(range(len(sub.candidates)))
            else:
                names = (f"l{k}",)
                genes[names[0]] = list(range(-2, sub.num_loops))
            self._names.append(names)
        default = space.default
        for d in range(space.num_designs):
            read = set(space.design_slots(d))
            for k in range(1, len(subs)):
                if k not in read:  # SELECT: a design that does not read k keeps it fixed
                    for name, v in zip(self._names[k], default.values[k]):
                        constraints.append(Allowed((name,), frozenset({(v,)}), ("design", d)))
                elif isinstance(subs[k], ComputeLocationSubspace):
                    locs = space.compute_locations(default.replace(0, (d,)), k)
                    constraints.append(Allowed((f"l{k}",), frozenset((v,) for v in locs),
                                               ("design", d)))
        if hardware is not None:
            constraints += _hardware(space, hardware, genes)
        super().__init__(genes, constraints)

    # ---------------------------------------------------------------- mapping
    def genes_of(self, point: LoopPoint) -> Genes:
        """The assignment of a point."""
        return {n: int(v) for names, value in zip(self._names, point.values)
                for n, v in zip(names, value)}

    def point(self, genes: Mapping[str, int]) -> LoopPoint:
        """The point of an assignment."""
        return LoopPoint(tuple(tuple(int(genes[n]) for n in names) for names in self._names))

    def satisfied(self, point: LoopPoint) -> bool:
        """Whether a point satisfies the model (no decoding)."""
        return self.holds(self.genes_of(point))

    def sample_points(self, n: int, rng: np.random.Generator) -> list[LoopPoint]:
        """Up to ``n`` distinct random solutions that the space confirms valid."""
        points = [self.point(g) for g in self.sample(n, rng)]
        return [p for p in points if self.space.is_valid(p)]

    # ---------------------------------------------------------------- walks and masks
    def destination(self, point: LoopPoint, subspace: int, direction: int
                    ) -> LoopPoint | None:
        """Where a direction leads under the model: the nearest neighbour along it that
        satisfies the constraints (no decoding), ``None`` if there is none."""
        if direction == 0:
            return point
        sub = self.space.subspaces[subspace]
        for value in sub.neighbours(point.values[subspace], direction):
            moved = point.replace(subspace, value)
            if self.satisfied(moved):
                return moved
        return None

    def masks(self, point: LoopPoint) -> np.ndarray:
        """Flat action mask over ``space.action_nvec`` (sb3-contrib's layout): a direction
        is allowed if it leads to a different point that satisfies the model; staying
        (direction 0) always is."""
        masks = []
        for k, n in enumerate(self.space.action_nvec):
            masks.append([d == 0 or self.destination(point, k, d) is not None
                          for d in range(int(n))])
        return np.concatenate(masks).astype(bool)

    def step(self, point: LoopPoint, directions: Sequence[int]) -> LoopPoint:
        """Move every subspace along its direction at once, staying valid and inside the
        model: the joint move if it holds and decodes, else the single moves one after
        another, each kept only if it does."""
        joint = point
        for k, d in enumerate(directions):
            moved = self.destination(joint, k, int(d)) if d else None
            if moved is not None:
                joint = joint.replace(k, moved.values[k])
        if joint == point or (self.satisfied(joint) and self.space.is_valid(joint)):
            return joint
        for k, d in enumerate(directions):
            moved = self.destination(point, k, int(d)) if d else None
            if moved is not None and self.space.is_valid(moved):
                point = moved
        return point


def _iters(expr: tvm.tirx.PrimExpr, block: tvm.tirx.SBlock) -> list[int]:
    """Indices of the block iter vars an index expression uses."""
    used = undefined_vars(expr)
    return [i for i, iv in enumerate(block.iter_vars) if any(iv.var.same_as(v) for v in used)]


def _tile_axes(space: LoopSpace) -> dict[int, _Axis]:
    """The block loop each tile subspace splits, found through the trace: the sampling
    instruction's loop comes from ``get_loops`` on a named block of the unscheduled
    program, and its extent must match the subspace's."""
    sch = Schedule(space.mod)
    axes: dict[int, _Axis] = {}
    for design in range(space.num_designs):
        insts = space.design_instructions(design)
        producers = {out.__hash__(): inst for inst in insts for out in inst.outputs}
        for inst, k in space.design_sites(design):
            sub = space.subspaces[k]
            if k in axes or not isinstance(sub, TileSubspace):
                continue
            loops = producers.get(inst.inputs[0].__hash__())
            if loops is None or loops.kind.name != "GetLoops":
                continue
            get_block = producers.get(loops.inputs[0].__hash__())
            if get_block is None or get_block.kind.name != "GetSBlock":
                continue
            name = str(get_block.attrs[0])
            index = [o.__hash__() for o in loops.outputs].index(inst.inputs[0].__hash__())
            try:
                block_rv = sch.get_sblock(name)
            except (RuntimeError, ValueError):
                continue
            loop = sch.get(sch.get_loops(block_rv)[index])
            block = sch.get(block_rv)
            if int(loop.extent) != sub.extent or index >= len(block.iter_vars):
                continue
            axes[k] = _Axis(name, index, int(block.iter_vars[index].iter_type) == 2)
    return axes


def _hardware(space: LoopSpace, hardware: Hardware, genes: Mapping[str, Sequence[int]]
          ) -> list[Constraint]:
    """C6 vector length and C5 cache capacity on the tiled block."""
    axes = _tile_axes(space)
    if not axes:
        return []
    block_name = next(iter(axes.values())).block
    sch = Schedule(space.mod)
    block = sch.get(sch.get_sblock(block_name))
    by_iter = {a.iter_index: k for k, a in axes.items() if a.block == block_name}
    extents = [int(iv.dom.extent) for iv in block.iter_vars]
    out = block.writes[0]
    constraints: list[Constraint] = []
    for index in reversed(out.region):  # the output's innermost dim that moves
        used = [i for i in _iters(index.min, block) if extents[i] > 1 and i in by_iter]
        if used:
            k = by_iter[used[-1]]
            sub = space.subspaces[k]
            name = f"t{k}.{sub.levels - 1}"
            lanes = hardware.lanes(out.source.dtype.bits)
            values = vector_values(genes[name], sub.extent, lanes)
            constraints.append(Allowed((name,), frozenset((v,) for v in values)))
            break
    for limit, reduce_levels in ((hardware.l1_bytes, 1), (hardware.l2_bytes, None)):
        terms = []
        for region in (*block.reads, *block.writes):
            coef, names = region.source.dtype.bits // 8, []
            for i in sorted({i for r in region.region for i in _iters(r.min, block)}):
                k = by_iter.get(i)
                if k is None:
                    coef *= extents[i]
                    continue
                sub = space.subspaces[k]
                inner = (sub.levels // 2 if not axes[k].reduce else
                         0 if reduce_levels is None else sub.levels - reduce_levels)
                if inner == 0:
                    coef *= sub.extent
                else:
                    names += [f"t{k}.{lv}" for lv in range(inner, sub.levels)]
            terms.append((coef, tuple(names)))
        constraints.append(Capacity(tuple(t for t in terms if t[1]),
                                    limit - sum(c for c, n in terms if not n)))
    return constraints


_MODELS: weakref.WeakKeyDictionary[LoopSpace, dict[bool, LoopConstraints]] = \
    weakref.WeakKeyDictionary()


def loop_constraints(space: LoopSpace, hardware: bool = True) -> LoopConstraints:
    """The (cached) constraint model of a loop space, with the hardware constraints of
    its target when ``hardware``."""
    models = _MODELS.setdefault(space, {})
    if hardware not in models:
        models[hardware] = LoopConstraints(space, Hardware.of(space.target) if hardware
                                           else None)
    return models[hardware]

"""The ``cp_embedding`` mapping generator: intrinsic embedding as a constraint problem
(Rieber, Acosta, Fröning, *Joint Program and Layout Transformations to enable
Convolutional Operators on Specialized Hardware based on Constraint Programming*, §4-§5
and Table 2; ``papers/rieber-cp-embedding.txt``).

The paper embeds the instruction's dataflow graph into the operator's with a scalar-level
CSP, then reads off which operator dims each instruction dim covers and the data-layout
rewrites that make the embedding dense. Here the same problem is posed one level up, on
dims, as a CP-SAT model whose solution *is* that read-off:

* ``x[l, d]`` — operator loop ``l`` lies on intrinsic dim ``d`` (at most one dim per
  loop; several loops on one dim are **fused**). Legality, the dimension-level subgraph
  isomorphism: ``l`` and ``d`` have the same kind and are read by the same operands (one
  column of AMOS's Alg. 1, ``Z * Y == X``), and a window loop must be a dense affine one
  (the paper's *dense* and *linear memory access* constraints: no dilated window inside
  the intrinsic, no transposed-conv gather). Every dim some loop can fill is filled.
* ``y[a, b]`` — ``a`` is outer of ``b`` when both are fused on one dim (**reorder**),
  a transitive order.
* per dim, the fused extent ``F_d`` (a product constraint) and its tile count ``q_d`` with
  ``ext * q_d >= F_d`` (**split** into ``(q_d, ext)``, **pad** with ``ext * q_d - F_d``
  zeros where the extent does not divide); dims of the output split exactly, because the
  code generator (``realize``) never pads the output.
* a kernel loop on a dim **unrolls** its window (Table 2's stencil unroll, im2col along
  that spatial dim: ``unfold(extent, window, stride)``, ``tiles x window`` elements; with
  ``stride >= window`` it is the paper's image pack, no element is copied twice).

Objective (§4.4): the overheads over the theoretical minimum, ``O_MAC = MAC_total -
MAC_min`` (the multiply-accumulates spent on padding) and ``O_Data = elements_total -
elements_min`` (elements of the rewritten ``data``, ``weight`` and ``out`` tensors —
padding and window copies — over the originals; the paper counts elements, not bytes),
minimised as ``w . [O_MAC, O_Data]`` with ``w = (1, 1)`` as in the paper's experiments.
Ties are broken by fewest reorders (pairs of fused loops out of the nest's order).

Solutions are enumerated in objective order: solve to optimality, forbid that mapping (a
no-good cut over ``x`` and the fused pairs' ``y``), solve again, until ``limit`` mappings
and every tie of the last one are found; equal objectives are then ordered by the nest's
loop order, so the ranked list (the mapping action's indices) is deterministic.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from .base import OPERAND_OF, Intrinsic, LoopNest, Mapping, MappingGenerator, register


@dataclass(frozen=True)
class Embedding:
    """One solution: the mapping and its objective terms.

    ``wasted_macs`` is ``O_MAC``, ``data_movement`` is ``O_Data`` (tensor elements; below 0
    when a strided window unroll drops elements the operator never reads), ``reorders``
    the fused pairs out of the nest's order, ``cost`` the weighted sum of the first two.
    """

    mapping: Mapping
    wasted_macs: int
    data_movement: int
    reorders: int
    cost: int


def _operand_tensors(intrinsic: Intrinsic, dim: str) -> frozenset[str]:
    return frozenset(t for t, op in OPERAND_OF.items() if dim in intrinsic.operands[op])


def legal_dims(nest: LoopNest, intrinsic: Intrinsic) -> dict[str, list[str]]:
    """For each loop, the intrinsic dims it may lie on: same kind, read by the same
    operands, and not a loop of a non-affine access or a dilated window."""
    blocked = set()
    for st in nest.stencils:
        if not st.affine:
            blocked |= {st.out, st.kernel}
        elif st.dilation != 1:
            blocked.add(st.kernel)
    out = {}
    for lp in nest.loops:
        tensors = frozenset(t for t in OPERAND_OF if lp.name in nest.access[t])
        out[lp.name] = [] if lp.name in blocked else [
            d for d, kind, _ in intrinsic.dims
            if kind == lp.kind and _operand_tensors(intrinsic, d) == tensors]
    return out


class _Model:
    """The CP-SAT model of embedding ``intrinsic`` into ``nest`` (see the module doc)."""

    def __init__(self, nest: LoopNest, intrinsic: Intrinsic, weights: tuple[int, int]):
        from ortools.sat.python import cp_model  # 0.4 s, for this generator only

        self.nest, self.intrinsic = nest, intrinsic
        m = self.model = cp_model.CpModel()
        choices = legal_dims(nest, intrinsic)
        names = nest.names
        self.x = {(n, d): m.new_bool_var(f"x_{n}_{d}") for n in names for d in choices[n]}
        mapped = {n: sum(self.x[n, d] for d in choices[n]) for n in names}
        for n in names:
            m.add_at_most_one(self.x[n, d] for d in choices[n])
        kept = {lp.name: (lp.extent - (lp.extent - 1) * mapped[lp.name], lp.extent)
                for lp in nest.loops}  # the loop's extent outside the intrinsic

        padded = {}
        for d, _, ext in intrinsic.dims:
            on = [lp for lp in nest.loops if (lp.name, d) in self.x]
            if on:
                m.add_bool_or(self.x[lp.name, d] for lp in on)
            fused = self._product([(1 + (lp.extent - 1) * self.x[lp.name, d], lp.extent)
                                   for lp in on], f"fused_{d}")
            hi = math.prod(lp.extent for lp in on)
            tiles = m.new_int_var(1, -(-hi // ext), f"tiles_{d}")
            m.add(ext * tiles >= fused)
            if d in intrinsic.operands["dst"]:
                m.add(ext * tiles == fused)
            else:
                m.add(ext * tiles <= fused + ext - 1)
            padded[d] = (ext * tiles, ext * (-(-hi // ext)))

        self.mac_min = math.prod(lp.extent for lp in nest.loops)
        self.macs = self._product([*kept.values(), *padded.values()], "macs")
        self.elements_min = 0
        elements = []
        for t, operand in OPERAND_OF.items():
            factors, minimum = self._tensor_dims(t, kept, mapped)
            factors += [padded[d] for d in intrinsic.operands[operand]]
            elements.append(self._product(factors, f"elements_{t}"))
            self.elements_min += minimum
        self.elements = sum(elements)

        # reorder: y[a, b] = a outer of b; an inversion is a fused pair out of nest order
        self.y, inversions = {}, []
        for i, a in enumerate(names):
            for b in names[i + 1:]:
                common = set(choices[a]) & set(choices[b])
                if not common:
                    continue
                y = self.y[a, b] = m.new_bool_var(f"y_{a}_{b}")
                inv = m.new_bool_var(f"inv_{a}_{b}")
                for d in common:
                    m.add(inv + y >= self.x[a, d] + self.x[b, d] - 1)
                inversions.append(inv)
        for (a, b), ab in self.y.items():
            for c in names[names.index(b) + 1:]:
                if (b, c) in self.y and (a, c) in self.y:
                    bc, ac = self.y[b, c], self.y[a, c]
                    m.add_bool_or([ab.Not(), bc.Not(), ac])
                    m.add_bool_or([ab, bc, ac.Not()])
        self.reorders = sum(inversions)
        w_mac, w_data = weights
        self.cost = w_mac * (self.macs - self.mac_min) + w_data * (self.elements -
                                                                   self.elements_min)
        m.minimize(self.cost * (len(inversions) + 1) + self.reorders)

    def _product(self, factors: list[tuple[Any, int]], name: str) -> Any:
        """An int var equal to the product of ``(expression, upper bound)`` factors."""
        hi = math.prod(h for _, h in factors)
        var = self.model.new_int_var(1, hi, name)
        if factors:
            self.model.add_multiplication_equality(var, [f for f, _ in factors])
        else:
            self.model.add(var == 1)
        return var

    def _tensor_dims(self, tensor: str, kept: dict[str, tuple[Any, int]],
                     mapped: dict[str, Any]) -> tuple[list[tuple[Any, int]], int]:
        """The factors of ``tensor``'s element count outside the intrinsic dims, and its
        original element count. A window dim whose kernel loop lies on the intrinsic is
        unrolled (``tiles`` stay outside, the window goes in); one whose output loop does
        keeps its ``window`` outside."""
        m = self.model
        stencils = [st for st in self.nest.stencils if st.tensor == tensor]
        own = {n for st in stencils for n in (st.out, st.kernel)}
        loops = [n for n in self.nest.names if n in self.nest.access[tensor] and n not in own]
        factors = [kept[n] for n in loops]
        minimum = math.prod(self.nest.loop(n).extent for n in loops)
        for st in stencils:
            minimum *= st.extent
            which = m.new_int_var(0, 3, f"unroll_{st.kernel}")
            m.add(which == mapped[st.kernel] + 2 * mapped[st.out])
            values = [st.extent, st.tiles, st.window, 1]
            size = m.new_int_var(1, max(values), f"window_{st.kernel}")
            m.add_element(which, values, size)
            factors.append((size, max(values)))
        return factors, minimum

    def solutions(self, limit: int) -> list[tuple[int, Embedding]]:
        """The ``limit`` best solutions in objective order, each with its objective value,
        and every solution that ties with the last of them."""
        from ortools.sat.python import cp_model  # 0.4 s, for this generator only

        solver = cp_model.CpSolver()
        solver.parameters.catch_sigint_signal = False  # keeps Python's Ctrl-C (constraints.py)
        solver.parameters.num_workers = 1
        solver.parameters.random_seed = 0
        out: list[tuple[int, Embedding]] = []
        while True:
            if solver.solve(self.model) != cp_model.OPTIMAL:
                break  # infeasible: every solution found
            if len(out) >= limit and solver.objective_value > out[limit - 1][0]:
                break
            groups = self._groups(solver)
            out.append((int(solver.objective_value), Embedding(
                Mapping(self.intrinsic.name, groups, CpEmbeddingGenerator.name),
                solver.value(self.macs) - self.mac_min,
                solver.value(self.elements) - self.elements_min,
                solver.value(self.reorders), solver.value(self.cost))))
            same = [(a, b) for g in groups for a in g for b in g if (a, b) in self.y]
            chosen = [v if solver.boolean_value(v) else v.Not() for v in
                      [*self.x.values(), *(self.y[p] for p in same)]]
            self.model.add_bool_or([lit.Not() for lit in chosen])  # no-good cut
        return out

    def _groups(self, solver: Any) -> tuple[tuple[str, ...], ...]:
        """Each dim's loops, outer first (ranked by how many group mates are outer)."""
        groups = []
        for d in self.intrinsic.dim_names:
            group = [n for n in self.nest.names if (n, d) in self.x and
                     solver.boolean_value(self.x[n, d])]
            outer = {n: 0 for n in group}
            for a in group:
                for b in group:
                    if (a, b) in self.y:
                        outer[b if solver.boolean_value(self.y[a, b]) else a] += 1
            groups.append(tuple(sorted(group, key=outer.__getitem__)))
        return tuple(groups)


@lru_cache(maxsize=64)
def embeddings(nest: LoopNest, intrinsic: Intrinsic, weights: tuple[int, int] = (1, 1),
               limit: int = 64) -> tuple[Embedding, ...]:
    """The best ``limit`` embeddings of ``intrinsic`` into ``nest``, best first (ties in
    objective in the order of the nest's loops, so the list does not depend on the
    solver's choice among equals)."""
    found = _Model(nest, intrinsic, weights).solutions(limit)
    order = {n: i for i, n in enumerate(nest.names)}
    found.sort(key=lambda oe: (oe[0], [[order[n] for n in g] for g in oe[1].mapping.groups]))
    return tuple(e for _, e in found[:limit])


@register
class CpEmbeddingGenerator(MappingGenerator):
    """Mappings from the dimension-level CP-SAT embedding model, best objective first.

    Parameters
    ----------
    weights:
        ``w`` of the objective ``w . [O_MAC, O_Data]`` (integers).
    limit:
        At most this many mappings (the best ones).
    """

    name = "cp_embedding"
    ranked = True

    def __init__(self, weights: tuple[int, int] = (1, 1), limit: int = 64):
        self.weights = (int(weights[0]), int(weights[1]))
        self.limit = int(limit)

    def embeddings(self, nest: LoopNest, intrinsic: Intrinsic) -> list[Embedding]:
        """The solutions with their objective terms, best first."""
        return list(embeddings(nest, intrinsic, self.weights, self.limit))

    def generate(self, nest: LoopNest, intrinsic: Intrinsic) -> list[Mapping]:
        return [e.mapping for e in self.embeddings(nest, intrinsic)]

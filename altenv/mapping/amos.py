"""AMOS mapping generation and validation (Zheng et al., ISCA'22, §5.1-§5.2, Alg. 1).

A candidate compute mapping assigns every software loop either to one intrinsic dim or
to no dim (it stays an outer loop around the intrinsic). Alg. 1 checks a candidate with
three binary matrices: the software access matrix ``X`` (tensors x mapped loops), the
matching matrix ``Y`` (intrinsic dims x mapped loops) and the intrinsic access matrix
``Z`` (operands x used dims). The mapping preserves the operator's semantics iff
``Z * Y == X`` and ``X * Y^T == Z`` (binary matrix products).

Enumeration. ``Z * Y == X`` compares column by column, and a loop's column of ``Z * Y``
is the column of the dim it is mapped to; given that, ``X * Y^T == Z`` holds for every
non-empty dim. So Alg. 1 accepts exactly the products of per-loop choices that pass it
alone; :class:`AmosGenerator` enumerates that product (a loop's choices: each dim on
which the one-loop mapping passes Alg. 1, or none) and runs Alg. 1 on every candidate.
A dim that some loop can fill must be filled (a mapping that leaves it idle is the
same computation with a wasted intrinsic dim); a dim no loop can fill stays empty
(AMOS maps GEMV onto Tensor Core with ``i2`` unused).
"""

from __future__ import annotations

import itertools

import numpy as np

from .base import OPERAND_OF, Intrinsic, LoopNest, Mapping, MappingGenerator, register


def bool_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Binary matrix product (``*`` of Alg. 1): ``(a @ b) > 0``."""
    return (a.astype(np.int64) @ b.astype(np.int64)) > 0


def validate(X: np.ndarray, Y: np.ndarray, Z: np.ndarray) -> bool:
    """AMOS Alg. 1: ``X`` software access (tensors x loops), ``Y`` matching (dims x
    loops), ``Z`` intrinsic access (operands x dims, rows in the tensors' order)."""
    X, Y, Z = (np.asarray(m, dtype=bool) for m in (X, Y, Z))
    return bool(np.array_equal(bool_matmul(Z, Y), X) and np.array_equal(bool_matmul(X, Y.T), Z))


def matrices(nest: LoopNest, intrinsic: Intrinsic, assignment: dict[str, str]
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``X, Y, Z`` of Alg. 1 for a loop -> dim assignment, restricted to the mapped loops
    and the dims they fill (tensor rows ``out, data, weight``)."""
    tensors = list(OPERAND_OF)
    loops = [lp.name for lp in nest.loops if lp.name in assignment]
    dims = [d for d in intrinsic.dim_names if d in assignment.values()]
    X = np.array([[name in nest.access[t] for name in loops] for t in tensors], dtype=bool)
    Y = np.array([[assignment[name] == d for name in loops] for d in dims], dtype=bool)
    Z = np.array([[d in intrinsic.operands[OPERAND_OF[t]] for d in dims] for t in tensors],
                 dtype=bool)
    return X, Y.reshape(len(dims), len(loops)), Z


def _is_valid(nest: LoopNest, intrinsic: Intrinsic, assignment: dict[str, str]) -> bool:
    return validate(*matrices(nest, intrinsic, assignment))


def candidates(nest: LoopNest, intrinsic: Intrinsic) -> int:
    """Size of the unpruned candidate space, ``(dims + 1) ^ loops``."""
    return (len(intrinsic.dims) + 1) ** len(nest.loops)


@register
class AmosGenerator(MappingGenerator):
    """Every mapping of the loop nest onto the intrinsic that Alg. 1 accepts, with each
    fillable intrinsic dim filled. Groups list their loops in the nest's order."""

    name = "amos"

    def generate(self, nest: LoopNest, intrinsic: Intrinsic) -> list[Mapping]:
        choices = []
        for lp in nest.loops:
            dims = [d for d in intrinsic.dim_names if _is_valid(nest, intrinsic, {lp.name: d})]
            choices.append([None, *dims])
        fillable = {d for c in choices for d in c if d is not None}
        out = []
        for picks in itertools.product(*choices):
            assignment = {lp.name: d for lp, d in zip(nest.loops, picks) if d is not None}
            if set(assignment.values()) != fillable or not _is_valid(nest, intrinsic,
                                                                      assignment):
                continue
            groups = tuple(tuple(n for n, d in assignment.items() if d == dim)
                           for dim in intrinsic.dim_names)
            out.append(Mapping(intrinsic.name, groups, self.name))
        return out

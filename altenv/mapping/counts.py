"""Valid-mapping counts per operator kind, next to AMOS Table 6 (Tensor Core).

    python -m altenv.mapping.counts

prints, for each kind, the mappings :class:`~altenv.mapping.amos.AmosGenerator` accepts
onto the Tensor Core shape of AMOS Eq. 1 and onto the x86 dot product, the count AMOS
reports, and the solutions of :class:`~altenv.mapping.cp_embedding.CpEmbeddingGenerator`
on the x86 dot product. AMOS's counts depend on the loop structure only; cp_embedding's
also on the shapes (the output must split into lanes exactly).
"""

from __future__ import annotations

from ..ops.workload import parse_workload
from .amos import AmosGenerator, candidates
from .cp_embedding import CpEmbeddingGenerator
from .intrinsics import INTRINSICS
from .nest import loop_nest

TABLE6 = {"gmm": 1, "c1d": 6, "c2d": 35, "c3d": 180, "t2d": 7, "grp": 35, "dil": 35, "dep": 11}
"""AMOS Table 6: feasible mappings on Tensor Core."""

SPECS = {
    "gmm": "gmm:M=16,N=16,K=16",
    "c1d": "c1d:N=1,I=16,O=16,W=16,KW=3",
    "c2d": "c2d:N=1,I=16,O=16,H=8,W=8,KH=3,KW=3",
    "c3d": "c3d:N=1,I=16,O=16,D=8,H=8,W=8,KD=3,KH=3,KW=3",
    "t2d": "t2d:N=1,I=16,O=16,H=8,W=8,KH=3,KW=3",
    "grp": "grp:N=1,I=16,O=16,groups=4,H=8,W=8,KH=3,KW=3",
    "dil": "dil:N=1,I=16,O=16,H=8,W=8,KH=3,KW=3",
    "dep": "dep:N=1,C=16,H=8,W=8,KH=3,KW=3",
}


def count_table() -> list[dict[str, int | str]]:
    """One row per kind: candidates, valid mappings onto Tensor Core and onto the x86 dot
    product, AMOS's Table 6 count, and cp_embedding's solutions on the x86 dot product."""
    gen, cp = AmosGenerator(), CpEmbeddingGenerator()
    rows = []
    for kind, spec in SPECS.items():
        nest = loop_nest(parse_workload(spec))
        rows.append({"kind": kind, "loops": len(nest.loops),
                     "candidates": candidates(nest, INTRINSICS["wmma_16x16x16"]),
                     "tensor_core": len(gen.generate(nest, INTRINSICS["wmma_16x16x16"])),
                     "amos_table6": TABLE6[kind],
                     "x86_dot": len(gen.generate(nest, INTRINSICS["avx2_dot_8x4"])),
                     "x86_cp_embedding": len(cp.generate(nest, INTRINSICS["avx2_dot_8x4"]))})
    return rows


def main() -> None:
    rows = count_table()
    header = list(rows[0])
    print(" | ".join(header))
    for row in rows:
        print(" | ".join(str(row[h]) for h in header))


if __name__ == "__main__":
    main()

"""An exact AVX2 int8 dot-product ``TensorIntrin``: 8 int32 lanes x 4 (u8 x i8 -> i32).

TVM ships x86 int8 dot products only for AVX-512 (``dot_16x4_avx512``, whose
``pmaddubsw`` saturates pairs of products at int16) and AVX-512 VNNI
(``dot_16x4_vnni``). CPUs with AVX2 but without AVX-512 get this one::

    C[i] += sum_k int32(A[k]) * int32(B[i, k])     A: u8[4], B: i8[8, 4], C: i32[8]

Implementation: widen both operands to int16 (``vpmovzxbw``/``vpmovsxbw``), multiply
and add pairs to int32 with ``vpmaddwd`` (exact: |u8 * i8| * 2 < 2^31), add the pairs of
neighbouring rows with ``vphaddd`` and restore the row order with ``vpermd``. No
intermediate saturates, so the result is exact for every input.
"""

from __future__ import annotations

from tvm.s_tir import TensorIntrin
from tvm.script import tirx as T

from .dot import dot_desc

AVX2_DOT_8x4_INTRIN = "altenv_dot_8x4_avx2"


@T.prim_func(s_tir=True)
def _impl(A: T.Buffer((4,), "uint8", offset_factor=1),
          B: T.Buffer((8, 4), "int8", offset_factor=1),
          C: T.Buffer((8,), "int32", offset_factor=1)) -> None:
    with T.sblock("root"):
        T.reads(C[0:8], A[0:4], B[0:8, 0:4])
        T.writes(C[0:8])
        # A as int16, repeated four times: [a0 a1 a2 a3] x 4
        a16 = T.reinterpret(T.broadcast(T.reinterpret(
            T.Cast("int16x4", A.vload([0], "uint8x4")), dtype="int64"), 4), dtype="int16x16")
        rows03 = T.Cast("int16x16", B.vload([0, 0], "int8x16"))
        rows47 = T.Cast("int16x16", B.vload([4, 0], "int8x16"))
        # pairs: [r0k01 r0k23 r1k01 r1k23 | r2.. r3..] and the same for rows 4-7
        lo = T.call_llvm_pure_intrin("int32x8", "llvm.x86.avx2.pmadd.wd", rows03, a16)
        hi = T.call_llvm_pure_intrin("int32x8", "llvm.x86.avx2.pmadd.wd", rows47, a16)
        # per 128-bit lane: [r0 r1 r4 r5 | r2 r3 r6 r7]
        sums = T.call_llvm_pure_intrin("int32x8", "llvm.x86.avx2.phadd.d", lo, hi)
        # 64-bit pairs [r0r1 r4r5 r2r3 r6r7] -> rows 0..7 (one vpermq)
        C[T.ramp(T.int32(0), 1, 8)] += T.reinterpret(T.Shuffle(
            [T.reinterpret(sums, dtype="int64x4")], [0, 2, 1, 3]), dtype="int32x8")


TensorIntrin.register(AVX2_DOT_8x4_INTRIN, dot_desc(8), _impl)

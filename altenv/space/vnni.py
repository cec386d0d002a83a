"""An AVX-512 VNNI int8 dot-product ``TensorIntrin``: 16 int32 lanes x 4 (u8 x i8 -> i32).

TVM 0.27 ships one (``dot_16x4_vnni``), but it passes its operands to
``llvm.x86.avx512.vpdpbusd.512`` as ``<16 x i32>``, while the LLVM in the wheel declares
the intrinsic on ``<64 x i8>`` operands, so every module using it fails LLVM's verifier
("Call parameter type does not match function signature"). This is the same
computation with the operands as the intrinsic declares them::

    C[i] += sum_k int32(A[k]) * int32(B[i, k])     A: u8[4], B: i8[16, 4], C: i32[16]

One ``vpdpbusd`` does it exactly: products of u8 and i8, four per lane, summed in int32
without saturation.
"""

from __future__ import annotations

from tvm.s_tir import TensorIntrin
from tvm.script import tirx as T

from .dot import dot_desc

VNNI_DOT_16x4_INTRIN = "altenv_dot_16x4_vnni"


@T.prim_func(s_tir=True)
def _impl(A: T.Buffer((4,), "uint8", offset_factor=1),
          B: T.Buffer((16, 4), "int8", offset_factor=1),
          C: T.Buffer((16,), "int32", offset_factor=1)) -> None:
    with T.sblock("root"):
        T.reads(C[0:16], A[0:4], B[0:16, 0:4])
        T.writes(C[0:16])
        # A's four bytes in every 32-bit lane, B's rows as they lie in memory
        a = T.reinterpret(T.broadcast(T.reinterpret(A.vload([0], "uint8x4"), dtype="int32"),
                                      16), dtype="int8x64")
        C[T.ramp(T.int32(0), 1, 16)] = T.call_llvm_pure_intrin(
            "int32x16", "llvm.x86.avx512.vpdpbusd.512", C.vload([0], "int32x16"), a,
            B.vload([0, 0], "int8x64"))


TensorIntrin.register(VNNI_DOT_16x4_INTRIN, dot_desc(16), _impl)

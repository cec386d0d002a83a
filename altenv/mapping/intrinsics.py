"""The intrinsics mappings target, as AMOS compute abstractions (Def. 4.1).

x86 int8 dot products ``dst[i] += sum_r src1[r] * src2[i, r]`` (u8 activations x i8
weights -> i32, AMOS §7.5's "vector units in Intel CPU"):

========================  =====  ==========================  ================================
name                      i x r  TVM TensorIntrin            needs
========================  =====  ==========================  ================================
``avx2_dot_8x4``          8 x 4  ``altenv_dot_8x4_avx2``     AVX2 (exact; ours, see
                                                             ``altenv.space.avx2``)
``avx512_dot_16x4``       16x4   ``dot_16x4_avx512``         AVX-512BW (TVM's; its pmaddubsw
                                                             saturates pairs at int16)
``vnni_dot_16x4``         16x4   ``altenv_dot_16x4_vnni``    AVX-512 VNNI (exact; ours, see
                                                             ``altenv.space.vnni``)
========================  =====  ==========================  ================================

``wmma_16x16x16`` is the Tensor Core shape of AMOS Eq. 1 (``dst[i1, i2] += src1[i1, r1] *
src2[r1, i2]``); it is described for counting mappings (AMOS Table 6) and not
implemented here (no CUDA device).
"""

from __future__ import annotations

from .base import Intrinsic

_DOT_OPERANDS = {"dst": ("i",), "src1": ("r",), "src2": ("i", "r")}
_DOT_DTYPES = {"dst": "int32", "src1": "uint8", "src2": "int8"}


def _dot(name: str, lanes: int, tvm_intrin: str, features: tuple[str, ...]) -> Intrinsic:
    return Intrinsic(name, (("i", "S", lanes), ("r", "R", 4)), _DOT_OPERANDS, _DOT_DTYPES,
                     tvm_intrin, "llvm", features)


INTRINSICS: dict[str, Intrinsic] = {
    intrin.name: intrin for intrin in (
        _dot("avx2_dot_8x4", 8, "altenv_dot_8x4_avx2", ("avx2",)),
        _dot("avx512_dot_16x4", 16, "dot_16x4_avx512", ("avx512bw",)),
        _dot("vnni_dot_16x4", 16, "altenv_dot_16x4_vnni", ("avx512vnni",)),
        Intrinsic("wmma_16x16x16", (("i1", "S", 16), ("i2", "S", 16), ("r1", "R", 16)),
                  {"dst": ("i1", "i2"), "src1": ("i1", "r1"), "src2": ("r1", "i2")},
                  {"dst": "float32", "src1": "float16", "src2": "float16"}, None, "cuda"),
    )
}

X86_PREFERENCE = ("vnni_dot_16x4", "avx512_dot_16x4", "avx2_dot_8x4")
"""x86 dot products, best first: a target gets the first one its CPU supports."""

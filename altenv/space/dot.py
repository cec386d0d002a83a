"""What altenv's x86 int8 dot-product intrinsics compute, as a ``TensorIntrin``
description: ``lanes`` int32 outputs, each the sum of four u8 x i8 products::

    C[i] += sum_k int32(A[k]) * int32(B[i, k])     A: u8[4], B: i8[lanes, 4], C: i32[lanes]

``altenv.space.avx2`` (8 lanes) and ``altenv.space.vnni`` (16) implement it.
"""

from __future__ import annotations

from tvm.script import tirx as T
from tvm.tirx import PrimFunc


def dot_desc(lanes: int) -> PrimFunc:
    """The description of a ``lanes`` x 4 dot product."""

    @T.prim_func(s_tir=True)
    def desc(A: T.Buffer((4,), "uint8", offset_factor=1),
             B: T.Buffer((lanes, 4), "int8", offset_factor=1),
             C: T.Buffer((lanes,), "int32", offset_factor=1)) -> None:
        with T.sblock("root"):
            T.reads(C[0:lanes], A[0:4], B[0:lanes, 0:4])
            T.writes(C[0:lanes])
            for i in T.serial(0, lanes):
                for k in T.serial(0, 4):
                    with T.sblock("update"):
                        vi, vk = T.axis.remap("SR", [i, k])
                        C[vi] = C[vi] + T.cast(A[vk], "int32") * T.cast(B[vi, vk], "int32")

    return desc

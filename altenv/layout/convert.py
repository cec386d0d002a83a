"""Layout conversion operators: a TE stage that rewrites a tensor from one layout to another.

Used where propagation (ALT Alg. 1) inserts a conversion, and for the pad-and-convert
producer of a convolution's input (Fig. 5b). Each physical position of the destination
is mapped to its logical element and read from the source layout; positions that hold
no element (padding, unfolded tails) are zero.
"""

from __future__ import annotations

from typing import Any

import tvm
from tvm import te, tirx

from .layout import Layout


def _both(a: Any, b: Any) -> Any:
    if a is None:
        return b
    return a if b is None else tirx.all(a, b)


def conversion_stage(src: te.Tensor, src_layout: Layout, dst_layout: Layout,
                     name: str = "layout_convert") -> te.Tensor:
    """A TE stage holding ``src`` (stored in ``src_layout``) in ``dst_layout``.

    The two layouts must describe the same logical tensor.
    """
    if src_layout.logical_shape != dst_layout.logical_shape:
        raise ValueError(f"conversion: {src_layout} and {dst_layout} are layouts of different "
                         f"tensors ({src_layout.logical_shape} vs {dst_layout.logical_shape})")

    def body(*phys: Any) -> Any:
        logical, valid = dst_layout.to_logical(list(phys))
        src_idx, src_valid = src_layout.to_physical(logical)
        valid = _both(valid, src_valid)
        value = src[tuple(src_idx)]
        return value if valid is None else tirx.if_then_else(valid, value,
                                                              tirx.const(0, src.dtype))

    return te.compute(dst_layout.shape, body, name=name)


def conversion_func(src_layout: Layout, dst_layout: Layout, dtype: str = "float32"
                    ) -> tvm.tirx.PrimFunc:
    """A PrimFunc ``(src, dst)`` converting between the two layouts."""
    src = te.placeholder(src_layout.shape, dtype, name="src")
    dst = conversion_stage(src, src_layout, dst_layout)
    return te.create_prim_func([src, dst]).with_attr("global_symbol", "main")

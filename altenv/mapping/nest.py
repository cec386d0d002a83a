"""The software loop nest of an operator (AMOS §4.3's software iterations).

One loop per output dim and per reduction dim of the operator as ``altenv.ops`` defines
it, named after the dims (``n o h w rc rh rw`` for C2D, ``m n rk`` for GMM), and for each
tensor the loops its index expressions use. Grouped convolutions get a group loop ``g``
and a per-group output channel ``o``; depthwise convolutions index all three tensors
with their channel loop ``c``. Convolutions also describe their sliding windows
(:class:`~altenv.mapping.base.Stencil`: the data dim that ``h`` and ``rh`` index
together); a transposed convolution's gather is described as non-affine.
"""

from __future__ import annotations

from ..ops import operator_for
from ..ops.operators import Conv, MatMul, TransposedConv
from ..ops.workload import Workload
from .base import Loop, LoopNest, Stencil


def loop_nest(wl: Workload) -> LoopNest:
    """The loops of ``wl``'s operator and the loops each tensor's index uses."""
    op = operator_for(wl)
    if isinstance(op, MatMul):
        if op.batch > 1:
            raise ValueError(f"mapping: batched matmuls ({wl}) have no intrinsic mappings; "
                             "use mapping: none")
        M, N, K = (wl[k] for k in "MNK")
        loops = (Loop("m", "S", M), Loop("n", "S", N), Loop("rk", "R", K))
        return LoopNest(loops, {"data": frozenset({"m", "rk"}), "weight": frozenset({"rk", "n"}),
                                "out": frozenset({"m", "n"})})
    spatial = [Loop(s.lower(), "S", e) for s, e in zip(op.names["out"][2:], op.out_spatial)]
    kernel = [Loop(n, "R", e) for n, e in op.reduce_extents()[1:]]
    sp, kn = {lp.name for lp in spatial}, {lp.name for lp in kernel}
    extents = op.input_shapes()["data"][2:]
    if isinstance(op, TransposedConv):  # a tap's kernel index depends on the output position
        loops = (Loop("n", "S", op.N), Loop("o", "S", op.O), *spatial, Loop("rc", "R", op.I),
                 *kernel)
        gathers = tuple(g for s, k, e, K in zip(spatial, kernel, extents, op.stored_kernel)
                        for g in (Stencil("data", s.name, k.name, e, affine=False),
                                  Stencil("weight", s.name, k.name, K, affine=False)))
        return LoopNest(loops, {"data": frozenset({"n", "rc"} | sp | kn),
                                "weight": frozenset({"rc", "o"} | sp | kn),
                                "out": frozenset({"n", "o"} | sp)}, gathers)
    assert isinstance(op, Conv)
    windows = tuple(Stencil("data", s.name, k.name, e, v, d, w) for s, k, e, v, d, w in
                    zip(spatial, kernel, extents, op.stride, op.dilation, op.windows))
    if op.groups == 1:
        loops = (Loop("n", "S", op.N), Loop("o", "S", op.O), *spatial, Loop("rc", "R", op.I),
                 *kernel)
        return LoopNest(loops, {"data": frozenset({"n", "rc"} | sp | kn),
                                "weight": frozenset({"o", "rc"} | kn),
                                "out": frozenset({"n", "o"} | sp)}, windows)
    if op.groups == op.I == op.O:  # depthwise: one channel loop indexes everything
        loops = (Loop("n", "S", op.N), Loop("c", "S", op.O), *spatial, *kernel)
        return LoopNest(loops, {"data": frozenset({"n", "c"} | sp | kn),
                                "weight": frozenset({"c"} | kn),
                                "out": frozenset({"n", "c"} | sp)}, windows)
    loops = (Loop("n", "S", op.N), Loop("g", "S", op.groups),
             Loop("o", "S", op.O // op.groups), *spatial, Loop("rc", "R", op.I // op.groups),
             *kernel)
    return LoopNest(loops, {"data": frozenset({"n", "g", "rc"} | sp | kn),
                            "weight": frozenset({"g", "o", "rc"} | kn),
                            "out": frozenset({"n", "g", "o"} | sp)}, windows)

"""CPU schedule of the spatial stages a network build generates (layout conversions,
regenerated elementwise tasks).

Both are one TE stage whose loops run over the output's physical shape. Left unscheduled
they are one serial scalar loop nest: on MobileNet-V2 the conversions alone took a third of
the network's latency. :func:`parallel_spatial` spreads the outer loops over the target's
cores and vectorizes the innermost one; where a padding condition varies along that loop,
TVM's vectorizer keeps it scalar (it never loads outside a buffer).
"""

from __future__ import annotations

import math

from tvm import s_tir, tirx

# The three thresholds are set by hand, not tuned: only the schedule as a whole was
# measured (docs/benchmarks.md, ResNet-18 second run).
#: Outputs smaller than this stay serial (a thread-pool launch for a few KB of copying).
PARALLEL_MIN_ELEMENTS = 4096
#: Work items per core the parallel loop is fused to reach (balances uneven chunks).
ITEMS_PER_CORE = 8
#: The widest innermost loop that is vectorized as a whole.
MAX_VECTOR = 64


def parallel_spatial(func: tirx.PrimFunc, cores: int) -> tirx.PrimFunc:
    """``func``, a PrimFunc of a single spatial block, scheduled for ``cores`` CPU cores:
    its leading loops fused into one parallel loop of at least ``ITEMS_PER_CORE * cores``
    iterations (when the output has ``PARALLEL_MIN_ELEMENTS`` elements), the innermost loop
    vectorized when it is at most ``MAX_VECTOR`` wide. Other functions are returned as
    they are."""
    sch = s_tir.Schedule(func)
    blocks = sch.get_child_blocks(sch.get_sblock("root"))
    if len(blocks) != 1 or any(iv.iter_type != 0 for iv in sch.get(blocks[0]).iter_vars):
        return func
    loops = sch.get_loops(blocks[0])
    if not loops:
        return func
    extents = [int(sch.get(loop).extent) for loop in loops]
    if len(loops) > 1 and 1 < extents[-1] <= MAX_VECTOR:
        sch.vectorize(loops[-1])
    outer = loops[:-1] if len(loops) > 1 else loops
    if cores > 1 and math.prod(extents) >= PARALLEL_MIN_ELEMENTS:
        count, work = 0, 1
        while count < len(outer) and work < ITEMS_PER_CORE * cores:
            work *= extents[count]
            count += 1
        fused = sch.fuse(*outer[:count]) if count > 1 else outer[0]
        sch.parallel(fused)
    return sch.mod["main"]

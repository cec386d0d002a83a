"""CPU schedules of the functions a network build does not tune.

* The spatial stages it generates (layout conversions, regenerated elementwise tasks): one
  TE stage whose loops run over the output's physical shape. Left unscheduled they are one
  serial scalar loop nest: on MobileNet-V2 the conversions alone took a third of the
  network's latency. :func:`parallel_spatial` spreads the outer loops over the target's
  cores and vectorizes the innermost one (or, when it is wide, the inner part of a split of
  it); where a padding condition varies along that loop, TVM's vectorizer keeps it scalar
  (it never loads outside a buffer). A conversion that transposes (its source's contiguous
  axis advances along an outer output loop, e.g. channels-innermost to planar) is first
  tiled so that each tile of the source stays in cache while its rows are written.
* The tasks it keeps as the frontend fused them (softmax, layer norm, pooling, a complex
  task it cannot map): :func:`untuned_schedule` gives them dlight's CPU reduction rule
  where it applies, else runs the leading spatial loops of their last block in parallel.
"""

from __future__ import annotations

import math

import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.s_tir import dlight as dl
from tvm.s_tir.dlight.analysis import normalize_prim_func
from tvm.tirx.analysis import undefined_vars

# The three thresholds are set by hand, not tuned: only the schedule as a whole was
# measured (docs/benchmarks.md, ResNet-18 second run).
#: Outputs smaller than this stay serial (a thread-pool launch for a few KB of copying).
PARALLEL_MIN_ELEMENTS = 4096
#: Work items per core the parallel loop is fused to reach (balances uneven chunks).
ITEMS_PER_CORE = 8
#: The widest innermost loop that is vectorized as a whole; a wider one is split by its
#: largest divisor between ``MIN_VECTOR`` and this, and the inner part vectorized.
MAX_VECTOR = 64
MIN_VECTOR = 8
#: The most iterations of a transposed loop moved inside (:func:`_tile_transpose`): 16
#: float32 values fill one cache line of the source.
TRANSPOSE_TILE = 16


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
    tiled, loops, extents = _tile_transpose(sch, blocks[0], loops)
    changed = _parallel_vectorize(sch, loops, extents, len(loops), cores)
    return sch.mod["main"] if changed or tiled else func


def _tile_transpose(sch: s_tir.Schedule, block: s_tir.SBlockRV, loops: list
                    ) -> tuple[bool, list, list[int]]:
    """Tile a transposing copy: when the innermost (contiguous) index of the largest buffer
    ``block`` reads follows a single output loop that is neither the innermost nor next to
    it, split that loop by its largest divisor up to ``TRANSPOSE_TILE`` and move the inner
    part just outside the innermost loop. Each source cache line is then read whole within
    one tile instead of once per element across the output. The block's iterators must be
    its loops in order (a TE stage). Returns whether it tiled, the loops and their
    extents."""
    extents = [int(sch.get(loop).extent) for loop in loops]
    stmt = sch.get(block)
    iters = [iv.var for iv in stmt.iter_vars]
    if len(loops) < 3 or len(iters) != len(loops) or not stmt.reads:
        return False, loops, extents
    source = max(stmt.reads, key=lambda r: math.prod(int(d) for d in r.source.shape))
    if not source.region:
        return False, loops, extents
    used = undefined_vars(source.region[-1].min)
    follows = [i for i, var in enumerate(iters) if any(var.same_as(u) for u in used)]
    if len(follows) != 1 or follows[0] >= len(loops) - 2:
        return False, loops, extents
    axis = follows[0]
    tile = next(d for d in range(min(TRANSPOSE_TILE, extents[axis]), 0, -1)
                if extents[axis] % d == 0)
    if tile == 1:
        return False, loops, extents
    if tile == extents[axis]:
        keep, ext = [], []
    else:
        outer, loops[axis] = sch.split(loops[axis], [None, tile])
        keep, ext = [outer], [extents[axis] // tile]
    order = loops[:axis] + keep + loops[axis + 1:-1] + [loops[axis], loops[-1]]
    sch.reorder(*order)
    return True, order, extents[:axis] + ext + extents[axis + 1:-1] + [tile, extents[-1]]


def untuned_schedule(func: tirx.PrimFunc, target: tvm.target.Target, cores: int
                     ) -> tirx.PrimFunc:
    """``func``, a task the build keeps as it is, scheduled for ``cores`` CPU cores: dlight's
    CPU reduction rule where it matches and there are cores to share (softmax, layer norm:
    rows in parallel, injective stages vectorized); otherwise, when every block but the last
    can be inlined (a pool's padding), the last block's leading spatial loops fused into one
    parallel loop and its innermost loop vectorized when spatial and at most ``MAX_VECTOR``
    wide. Functions neither applies to are returned as they are."""
    if cores > 1:
        with target:
            mod = dl.ApplyDefaultSchedule(dl.cpu.Reduction())(tvm.IRModule({"main": func}))
        if not tvm_ffi.structural_equal(mod["main"], func):
            return mod["main"]
    sch = s_tir.Schedule(func)
    *producers, _ = sch.get_child_blocks(sch.get_sblock("root"))
    try:
        for block in producers:
            sch.compute_inline(block)
    except RuntimeError:  # a ScheduleError: a block that does not inline
        return func
    infos = normalize_prim_func(sch)
    if not infos or len(infos) != 1:
        return func
    iters = infos[0].iters
    if not iters or any(not isinstance(it.dom, int) for it in iters):
        return func
    spatial = next((i for i, it in enumerate(iters) if it.kind != "S"), len(iters))
    changed = _parallel_vectorize(sch, [it.loop_rv for it in iters],
                                  [int(it.dom) for it in iters], spatial, cores)
    return sch.mod["main"] if changed else func


def _parallel_vectorize(sch: s_tir.Schedule, loops: list, extents: list[int], spatial: int,
                        cores: int) -> bool:
    """Vectorize the innermost loop when it is one of the ``spatial`` leading (data-parallel)
    loops, not the only loop, and at most ``MAX_VECTOR`` wide (a wider one: its inner part
    of a split, see ``MIN_VECTOR``); fuse the leading spatial loops outside it until
    ``ITEMS_PER_CORE * cores`` items and mark them parallel, when the loop nest does
    ``PARALLEL_MIN_ELEMENTS`` iterations or more. Returns whether it did either."""
    width = extents[-1] if extents[-1] <= MAX_VECTOR else next(
        (d for d in range(MAX_VECTOR, MIN_VECTOR - 1, -1) if extents[-1] % d == 0), 0)
    vector = len(loops) > 1 and spatial == len(loops) and width > 1
    if vector:
        inner = loops[-1] if width == extents[-1] else sch.split(loops[-1], [None, width])[1]
        sch.vectorize(inner)
    outer = loops[:min(spatial, len(loops) - 1)] if len(loops) > 1 else loops[:spatial]
    if cores > 1 and outer and math.prod(extents) >= PARALLEL_MIN_ELEMENTS:
        count, work = 0, 1
        while count < len(outer) and work < ITEMS_PER_CORE * cores:
            work *= extents[count]
            count += 1
        fused = sch.fuse(*outer[:count]) if count > 1 else outer[0]
        sch.parallel(fused)
        return True
    return vector

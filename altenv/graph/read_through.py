"""Measured choice of how a convolution gets an input stored in another layout than the
one its template reads.

A complex call whose input is stored in another layout (the producer is itself a
convolution, or a layout the propagation could not push into its producer) gets it in one
of three ways, timed alone on the build's target, interleaved (:func:`fastest_chain`):

- a conversion call first (pad and re-tile into the template's layout), then the call;
- the call reading the stored layout directly through guarded index maps
  (:meth:`altenv.graph.lowering.ComplexLowering.read_through_layout`), the task's tuned
  schedule replayed on that variant. It saves a pass over the tensor but may make the
  convolution's own reads slower (a guard on every load of its innermost loop);
- the conversion fused into the call as its first stage (:data:`STAGE`), computed at one
  loop of the tuned schedule (:func:`staged_variants`): each thread converts the part of the
  input its tile reads, while that part sits in its cache, as MetaSchedule computes a
  convolution's padding at its tile. Which loop is fastest depends on the schedule (the
  outermost converts once but out of cache; an inner one converts a window per tile, the
  halo again and again), so the loops are timed, all but those that would convert as much
  as the loop inside them.
"""

from __future__ import annotations

import atexit
import logging
import math
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path

import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.builder import BuilderInput

from altenv.measure.builder import PersistentBuilder
from altenv.measure.chains import ChainTimer, kernel_module, local_timer
from altenv.measure.config import DEFAULT_PRELOAD
from altenv.space.intrin import tune_context_intrins
from altenv.target import target_cores

log = logging.getLogger(__name__)

GUARDED = -1
"""How a call reads its input as stored through guarded index maps, in the build's record
(``best.json``'s ``read_through``: call -> this, or the loop a staged variant converts at)."""
STAGE = "data_stage"
"""The name of the conversion stage a staged variant's program computes first
(:func:`altenv.ops.codegen.generate`'s ``data_stage``)."""
BUILD_TIMEOUT = 30.0
"""Seconds a staged variant may take to compile, in a worker process, before it is dropped:
at some loops the stage is unrolled into code that LLVM took more than 15 minutes on (a
MobileNet-V2 run); the others compile in about a second."""

_builder: PersistentBuilder | None = None


def staged_variants(func: tirx.PrimFunc, trace: s_tir.Trace, target: tvm.target.Target,
                    at: int | None = None) -> dict[int, tirx.PrimFunc]:
    """``func``, a call's program whose data conversion is its first stage (:data:`STAGE`),
    with the task's schedule ``trace`` replayed and the stage computed at a loop of the block
    that reads it, then MetaSchedule's postprocessors for ``target`` applied: position in
    that block's loop nest (as the trace leaves it) -> scheduled function (``at``: that
    position only). Of consecutive positions that convert as many elements in all (a loop
    nested in the last one without repeating its halo), only the innermost is a candidate:
    the smallest piece at a time, nearest its use; and of equal functions the first. Empty
    when the trace does not replay."""
    base = s_tir.Schedule(func)
    try:
        trace.apply_to_schedule(base, remove_postproc=True)
        (reader,) = base.get_consumers(base.get_sblock(STAGE))
    except (RuntimeError, ValueError):
        return {}
    # position, elements converted (None: a loop's extent varies, a tile at an edge)
    placed: list[tuple[int, int | None, s_tir.Schedule]] = []
    for position in range(len(base.get_loops(reader))) if at is None else [at]:
        sch = base.copy()
        stage = sch.get_sblock(STAGE)
        try:
            loops = sch.get_loops(sch.get_consumers(stage)[0])
            sch.compute_at(stage, loops[position], preserve_unit_loops=False)
        except (RuntimeError, IndexError):
            continue
        extents = [sch.get(loop).extent for loop in sch.get_loops(stage)]
        work = (math.prod(int(e) for e in extents)
                if all(isinstance(e, tirx.IntImm) for e in extents) else None)
        placed.append((position, work, sch))
    with tune_context_intrins(target):
        postprocs = ms.TuneContext(kernel_module(func), target=target,
                                   space_generator="post-order-apply",
                                   task_name="staged").space_generator.postprocs
    variants: dict[int, tirx.PrimFunc] = {}
    seen: set[int] = set()
    for k, (position, work, sch) in enumerate(placed):
        if work is not None and k + 1 < len(placed) and placed[k + 1][:2] == (position + 1,
                                                                               work):
            continue
        sch.enter_postproc()
        if not all(p.apply(sch) for p in postprocs):
            continue
        variant = sch.mod["main"]
        key = tvm_ffi.structural_hash(variant)
        if key not in seen:
            seen.add(key)
            variants[position] = variant
    if at is None:
        built = builds_in_time(list(variants.values()), target)
        for position, ok in zip(list(variants), built):
            if not ok:
                log.warning("staged variant at loop %d dropped: it did not compile within "
                            "%.0f s", position, BUILD_TIMEOUT)
                del variants[position]
    return variants


def builds_in_time(funcs: Sequence[tirx.PrimFunc], target: tvm.target.Target) -> list[bool]:
    """Whether each of ``funcs`` compiles for ``target`` within :data:`BUILD_TIMEOUT`, built
    in this process's persistent worker pool (a build that hangs or crashes only costs
    its worker)."""
    global _builder
    if not funcs:
        return []
    if _builder is None:
        _builder = PersistentBuilder(max_workers=target_cores(target) or 1,
                                     timeout_sec=BUILD_TIMEOUT, preload=DEFAULT_PRELOAD)
        atexit.register(_builder.shutdown)
    results = _builder.build([BuilderInput(kernel_module(f), target) for f in funcs])
    for result in results:
        if result.artifact_path is not None:
            shutil.rmtree(Path(result.artifact_path).parent, ignore_errors=True)
    return [result.error_msg is None for result in results]


def fastest_chain(chains: Mapping[str, Sequence[tirx.PrimFunc]],
                  target: tvm.target.Target, rounds: int = 5,
                  timer: ChainTimer | None = None) -> tuple[str, dict[str, float]]:
    """The key of the fastest of ``chains`` (kernels run one after another, each compiled
    alone), timed interleaved by ``timer`` (the measuring device's; this host's for
    ``target`` by default); also every chain's median seconds."""
    stats = (timer or local_timer(target))(chains, rounds, 0)
    medians = {key: stats[key].median for key in chains}
    return min(medians, key=medians.__getitem__), medians

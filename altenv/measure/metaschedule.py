"""A MetaSchedule tuning call's builder and runner, set up once for every caller.

MetaSchedule tunes the tuned baselines (``tune_tir``, ``tune_relax``) and a model run's
other kernels (:mod:`altenv.tuning.others`) alike: with only the target's tensor intrinsics
registered (registering all of them costs half a minute here), persistent builder workers
that pay TVM's start-up once, and a runner timed as :class:`~altenv.measure.MeasureConfig`
says.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

from tvm.s_tir.meta_schedule.runner import EvaluatorConfig, LocalRunner, RPCRunner, Runner
from tvm.target import Target

from ..space.intrin import tune_context_intrins
from ..target import target_cores, use_tvm_threads
from .builder import PersistentBuilder
from .config import MeasureConfig
from .signals import sigint_blocked


@contextlib.contextmanager
def _unnamed_log_handlers_detached(name: str = "tvm.s_tir.meta_schedule") -> Iterator[None]:
    """MetaSchedule's logging set-up feeds the names of its logger's handlers to
    ``logging.config.dictConfig`` and fails on an unnamed one (pytest's log capture attaches
    such handlers after a first tuning run); keep those aside while tuning."""
    logger = logging.getLogger(name)
    unnamed = [h for h in logger.handlers if h.get_name() is None]
    for handler in unnamed:
        logger.removeHandler(handler)
    try:
        yield
    finally:
        for handler in unnamed:
            logger.addHandler(handler)


@contextlib.contextmanager
def metaschedule_session(
    config: MeasureConfig, target: Target, remote: bool = False
) -> Iterator[tuple[PersistentBuilder, Runner]]:
    """Everything a MetaSchedule tuning call needs here: only ``target``'s tensor intrinsics
    registered (see :mod:`altenv.space.intrin`), a persistent-worker builder and a
    ``LocalRunner`` with ``config``'s settings whose workers run ``target_cores(target)``
    TVM threads; with ``remote`` and ``config.rpc``, an ``RPCRunner`` on the devices behind
    the tracker key instead. Workers are shut down on exit."""
    use_tvm_threads(target_cores(target))
    builder = PersistentBuilder(
        max_workers=config.build_workers,
        timeout_sec=config.build_timeout,
        preload=config.builder_preload,
        max_process_uses=config.builder_max_uses,
    )
    timing = EvaluatorConfig(number=config.number, repeat=config.repeat,
                             min_repeat_ms=config.min_repeat_ms,
                             enable_cpu_cache_flush=config.enable_cpu_cache_flush)
    with sigint_blocked():  # its worker starts now; Ctrl-C is for this process
        if remote and config.rpc is not None:
            runner = RPCRunner(config.rpc.session_config(config.run_timeout), timing,
                               max_workers=config.rpc.max_workers)
        else:
            runner = LocalRunner(timeout_sec=config.run_timeout, evaluator_config=timing)
    try:
        with tune_context_intrins(target), _unnamed_log_handlers_detached():
            yield builder, runner
    finally:
        builder.shutdown()
        runner.pool.shutdown(wait=True)

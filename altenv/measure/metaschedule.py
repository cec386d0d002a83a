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
from typing import TYPE_CHECKING

from tvm.s_tir.meta_schedule.runner import EvaluatorConfig, RPCRunner, Runner
from tvm.target import Target

from ..space.intrin import tune_context_intrins
from ..target import target_cores, use_tvm_threads
from .builder import PersistentBuilder
from .config import MeasureConfig
from .pool import LeanLocalRunner
from .signals import sigint_blocked

if TYPE_CHECKING:
    from .measurer import Measurer


@contextlib.contextmanager
def metaschedule_logging_contained(name: str = "tvm.s_tir.meta_schedule") -> Iterator[None]:
    """Keep MetaSchedule's logging set-up inside the tuning call.

    Each tuning call runs ``logging.config.dictConfig``: it feeds the names of the logger's
    handlers back in (and fails on an unnamed one, such as pytest's log capture), attaches a
    console handler bound to whatever ``sys.stdout`` is at that moment, file handlers in the
    work directory, and a logger per task. Left in place, a later MetaSchedule message (a
    ``LocalRunner`` being made) prints on stdout or, when that stream has since closed, a
    logging traceback. So unnamed handlers wait aside, and on exit every handler the call
    added under ``name`` is closed and the logger's handlers, level and propagation are put
    back."""
    logger = logging.getLogger(name)
    before = {n: list(lg.handlers) for n, lg in _loggers_under(name).items()}
    level, propagate = logger.level, logger.propagate
    unnamed = [h for h in logger.handlers if h.get_name() is None]
    for handler in unnamed:
        logger.removeHandler(handler)
    try:
        yield
    finally:
        for n, lg in _loggers_under(name).items():
            kept = before.get(n, [])
            for handler in [h for h in lg.handlers if h not in kept]:
                lg.removeHandler(handler)
                handler.close()
        for handler in before[name]:
            if handler not in logger.handlers:
                logger.addHandler(handler)
        logger.setLevel(level)
        logger.propagate = propagate


def _loggers_under(name: str) -> dict[str, logging.Logger]:
    """``name``'s logger and every logger below it made so far."""
    found = {name: logging.getLogger(name)}
    for n, lg in list(logging.root.manager.loggerDict.items()):
        if n.startswith(name + ".") and isinstance(lg, logging.Logger):
            found[n] = lg
    return found


@contextlib.contextmanager
def metaschedule_session(
    config: MeasureConfig, target: Target, remote: bool = False,
    measurer: Measurer | None = None,
) -> Iterator[tuple[PersistentBuilder, Runner]]:
    """Everything a MetaSchedule tuning call needs here: only ``target``'s tensor intrinsics
    registered (see :mod:`altenv.space.intrin`), a persistent-worker builder and a
    ``LocalRunner`` with ``config``'s settings whose workers run ``target_cores(target)``
    TVM threads; with ``remote`` and ``config.rpc``, an ``RPCRunner`` on the devices behind
    the tracker key instead. An open ``measurer`` with the same settings and target lends
    its own builder and runner where it has them
    (:meth:`~altenv.measure.Measurer.metaschedule_pair`), which stay running; otherwise the
    session starts its own and shuts them down on exit."""
    use_tvm_threads(target_cores(target))
    same = measurer is not None and measurer.config == config and \
        str(measurer.target) == str(target)
    lent = measurer.metaschedule_pair() if same else None
    if lent is not None:
        with tune_context_intrins(target), metaschedule_logging_contained():
            yield lent
        return
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
            runner = LeanLocalRunner(timeout_sec=config.run_timeout, evaluator_config=timing)
    try:
        with tune_context_intrins(target), metaschedule_logging_contained():
            yield builder, runner
    finally:
        builder.shutdown()
        runner.pool.shutdown(wait=True)

"""MetaSchedule for the kernels of a network that the layout search does not tune.

Once every complex task has its layouts and schedule, the network's remaining kernels are
fixed PrimFuncs: the tasks kept as the frontend fused them (softmax, layer norm, pooling, a
complex task that cannot be mapped), the regenerated elementwise tasks and the layout
conversions. On a CPU the build schedules the last two itself
(:func:`altenv.graph.spatial.parallel_spatial`, faster than MetaSchedule's schedules of
them, measured), so the first are tuned here; on other targets all three.
:func:`tune_others` gives them MetaSchedule's own search (its design spaces,
evolutionary search and XGBoost model, the task scheduler spreading the trials by call
count and latency) for a share of the run's budget, as ``tune_relax`` does for every task
of a network. Its records go to a MetaSchedule JSON database in the run directory, so a
run cut short continues from them. The build reads each kernel's best schedule back from it
(:func:`altenv.graph.tuned_kernel.tuned_kernel`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import tvm
from tvm import tirx
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.logging import get_loggers_from_work_dir
from tvm.s_tir.meta_schedule.utils import fork_seed

from ..measure import MeasureConfig, Measurer
from ..measure.chains import kernel_module
from ..measure.metaschedule import metaschedule_session
from ..target import target_cores

#: Candidates MetaSchedule measures per search iteration (its default, 64, would spend a
#: small budget on one or two kernels).
TRIALS_PER_ITER = 16


def open_database(work_dir: str | Path) -> ms.database.JSONDatabase:
    """The MetaSchedule JSON database of a run's other kernels (created if missing)."""
    Path(work_dir).mkdir(parents=True, exist_ok=True)
    return ms.database.JSONDatabase(work_dir=str(work_dir))


def tune_others(kernels: Mapping[str, tuple[tirx.PrimFunc, int]], trials: int,
                work_dir: str | Path, target: tvm.target.Target, config: MeasureConfig,
                seed: int = 0, measurer: Measurer | None = None) -> int:
    """Tune ``kernels`` (name -> unscheduled PrimFunc and its call count) with MetaSchedule
    until the database in ``work_dir`` holds ``trials`` records in all (a resumed run adds
    only what is missing); returns the records it holds. The run's open ``measurer`` lends
    its workers (:func:`~altenv.measure.metaschedule.metaschedule_session`)."""
    database = open_database(work_dir)
    done = len(database.get_all_tuning_records())
    left = trials - done
    if left <= 0 or not kernels:
        return done
    names = list(kernels)
    with metaschedule_session(config, target, remote=True, measurer=measurer) as (builder,
                                                                                 runner):
        contexts = [ms.TuneContext(mod=kernel_module(kernels[name][0]), target=target,
                                   space_generator="post-order-apply",
                                   search_strategy="evolutionary", task_name=name,
                                   rand_state=rand_state, num_threads=target_cores(target),
                                   logger=logger).clone()
                    for name, logger, rand_state in zip(
                        names, get_loggers_from_work_dir(str(work_dir), names),
                        fork_seed(seed + done, n=len(names)))]
        ms.tune_tasks(tasks=contexts, task_weights=[float(kernels[n][1]) for n in names],
                      work_dir=str(work_dir), max_trials_global=left,
                      num_trials_per_iter=min(TRIALS_PER_ITER, left), builder=builder,
                      runner=runner, database=database)
    return len(database.get_all_tuning_records())

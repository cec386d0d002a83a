"""The run pipeline: what ``altenv tune`` and ``altenv train`` do, on a run directory.

- :mod:`.rundir`: the run directory, its files, identity check and lock;
- :mod:`.checks`: what a run needs beyond its config, checked before anything is written;
- :mod:`.operator`: an operator run; :mod:`.model`: a model run, one function per stage;
- :mod:`.train`: ``altenv train`` (corpus, cost model, pretraining, measured tuning);
- :mod:`.replay`: a run's recorded best decoded back into schedules (export, bench);
- :mod:`.report`: a run's result and printed timings; :mod:`.tensorboard`: its TB log.
"""

from .model import tune_model
from .operator import tune_workload
from .replay import best_schedules, replay_best
from .report import RunResult, timing_table
from .rundir import RunDir

__all__ = ["RunDir", "RunResult", "best_schedules", "replay_best", "timing_table",
           "tune_model", "tune_workload"]

"""What every baseline hands back (a runnable program and how it was obtained), the
correctness check before timing, the schedule rules of the untuned builds, and what the
tuned baselines read of a MetaSchedule database."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import tvm
from tvm.s_tir import dlight as dl
from tvm.s_tir.meta_schedule.database import Database

from ..graph.kernels import KernelSource
from ..measure import WrongResultError
from ..measure.check import max_relative_error
from ..measure.timing import BlockTimer, TimingStats, time_interleaved

#: MetaSchedule stores this run time for a candidate that failed to build or run.
FAILED_RUN_SECONDS = 1e9


class NoValidMeasurementsError(RuntimeError):
    """A MetaSchedule tuning run measured no candidate successfully."""


@dataclass(frozen=True)
class TuningSummary:
    """How a tuned baseline was obtained.

    Parameters
    ----------
    trials : int
        Candidates MetaSchedule measured (records in its database, failures included).
    valid : int
        Candidates with a finite measured run time.
    best_seconds : float
        Best mean run time MetaSchedule measured (the network: sum over tasks, unweighted).
    tuning_seconds : float
        Wall time of the tuning call.
    work_dir : str
        MetaSchedule's work directory (its JSON database and logs).
    """

    trials: int
    valid: int
    best_seconds: float
    tuning_seconds: float
    work_dir: str

    @property
    def seconds_per_trial(self) -> float:
        """Tuning wall time per measured candidate."""
        return self.tuning_seconds / self.trials if self.trials else math.inf


@dataclass
class Baseline:
    """A compiled implementation ready to be timed.

    Parameters
    ----------
    name : str
        Short label (``"metaschedule"``, ``"tvm-default"``, ``"torch"``).
    run : Callable[[], object]
        Runs the program once on prepared inputs and returns when the result is ready.
    outputs : Callable[[], list[np.ndarray]]
        The logical outputs of the latest :attr:`run`.
    tuning : TuningSummary | None
        Set for tuned baselines.
    notes : str
        Which path produced it (e.g. the TVM pipeline used).
    worker : BlockTimer | None
        Set when the program runs elsewhere and times its own blocks: in a worker process
        (:class:`~altenv.baselines.isolated.IsolatedRun`) or on a remote device.
    kernels : KernelSource | None
        For a Relax VM program: what :func:`~altenv.graph.kernels.profile_kernels` times.
    """

    name: str
    run: Callable[[], object]
    outputs: Callable[[], list[np.ndarray]] = field(repr=False)
    tuning: TuningSummary | None = None
    notes: str = ""
    worker: BlockTimer | None = field(default=None, repr=False)
    kernels: KernelSource | None = field(default=None, repr=False)


def check_baseline(baseline: Baseline, expected: Sequence[np.ndarray], rtol: float = 1e-3) -> float:
    """Run ``baseline`` once and compare its outputs with ``expected``; returns the largest
    relative error, raises :class:`WrongResultError` above ``rtol``."""
    baseline.run()
    actual = baseline.outputs()
    if len(actual) != len(expected):
        raise WrongResultError(f"{baseline.name}: {len(actual)} outputs, expected {len(expected)}")
    worst = 0.0
    for got, want in zip(actual, expected):
        if tuple(got.shape) != tuple(want.shape):
            raise WrongResultError(f"{baseline.name}: output shape {got.shape} != {want.shape}")
        worst = max(worst, max_relative_error(got, want))
    if not worst <= rtol:
        raise WrongResultError(f"{baseline.name}: wrong result (max rel err {worst:.3g})")
    return worst


def compare(
    baselines: Sequence[Baseline],
    expected: Sequence[np.ndarray],
    rtol: float = 1e-3,
    rounds: int = 10,
    inner: int | None = None,
) -> dict[str, TimingStats]:
    """Check every baseline against ``expected``, then time them all interleaved."""
    names = [b.name for b in baselines]
    if len(set(names)) != len(names):
        raise ValueError(f"baseline names must be unique, got {names}")
    for baseline in baselines:
        check_baseline(baseline, expected, rtol)
    return time_interleaved({b.name: b.worker or b.run for b in baselines}, rounds=rounds,
                            inner=inner)


def untuned_rules() -> tvm.transform.Pass:
    """The schedule rules of TVM's untuned builds (apply under a target): dlight's CPU
    reduction rule; every function it does not match keeps TVM's default lowering.

    dlight's CPU GEMV rule is left out. It schedules only inner-reduction GEMVs
    (``y[s] = sum_r W[s, r] x[r]``) and vectorizes them across ``s``, 128 lanes wide, which is
    a gather with stride ``r`` from ``W``, with the reduction unrolled. In our networks it
    matches only convolutions with a 1x1 output (the last stage of a small-input ResNet-18):
    LLVM takes 7 s (``znver3``), 33 s (``skylake-avx512``) and over 6 minutes (``znver4``)
    to compile one such function."""
    return dl.ApplyDefaultSchedule(dl.cpu.Reduction())


def mean_run_seconds(run_secs: Sequence[object] | None) -> float:
    """Mean of a record's run times; ``inf`` for a failed or unmeasured candidate."""
    if not run_secs:
        return math.inf
    values = [float(x) for x in run_secs]
    mean = sum(values) / len(values)
    return mean if math.isfinite(mean) and mean < FAILED_RUN_SECONDS else math.inf


def count_measurements(database: Database) -> tuple[int, int]:
    """``(measured, valid)`` records of a MetaSchedule database."""
    records = database.get_all_tuning_records()
    valid = sum(1 for r in records if math.isfinite(mean_run_seconds(r.run_secs)))
    return len(records), valid

"""What goes into a measurement (a candidate) and what comes out (a result)."""

from __future__ import annotations

from dataclasses import dataclass, field

from tvm.ir import IRModule
from tvm.s_tir import Schedule
from tvm.tirx import PrimFunc

from ..records import Timed
from .check import CorrectnessCheck


def as_module(program: IRModule | PrimFunc | Schedule) -> IRModule:
    """An IRModule whose entry is ``main``, from a PrimFunc, IRModule or Schedule."""
    if isinstance(program, Schedule):
        program = program.mod
    if isinstance(program, PrimFunc):
        return IRModule({"main": program.with_attr("global_symbol", "main")})
    return program


@dataclass(frozen=True)
class ProgramPoint:
    """Which point of a workload's joint space a program is: what a measurer that answers
    from a dataset instead of a device (``altenv.dataset.ReplayMeasurer``) looks up."""

    workload: str
    factors: tuple[tuple[str, int], ...]
    decisions: tuple[int, ...]
    encoding: tuple[float, ...]
    subspaces: tuple[dict, ...] = ()
    """The loop space's ``LoopSpace.describe()`` (what a surrogate reads the point with)."""
    features: tuple[int, ...] = ()
    """The program's feature summary as a dataset stores it
    (``altenv.costmodel.feature_bytes``); given where the measurer asks for it
    (``reads_features``), for a surrogate that reads programs."""


@dataclass
class MeasureCandidate:
    """One program to build and time.

    Parameters
    ----------
    program : IRModule | PrimFunc | Schedule
        The scheduled program (its entry function is timed).
    check : CorrectnessCheck | None
        Compare its outputs with a reference before timing.
    point : ProgramPoint | None
        The joint-space point the program was generated from (a tuning session's
        candidates carry it; a replayed measurement needs it).
    """

    program: IRModule | PrimFunc | Schedule
    check: CorrectnessCheck | None = None
    point: ProgramPoint | None = None

    @property
    def mod(self) -> IRModule:
        """The program as an IRModule with entry ``main``."""
        return as_module(self.program)


@dataclass
class MeasureResult(Timed):
    """Outcome of one candidate.

    Parameters
    ----------
    latencies : list[float]
        Seconds per run, one per repeat; empty when the candidate failed.
    error : str | None
        Why it failed (build error, crash, timeout, wrong result), else ``None``.
    build_seconds : float
        Compile time inside the builder worker.
    run_seconds : float
        Wall time of the runner for this candidate (check and timing included).
    """

    latencies: list[float] = field(default_factory=list)
    error: str | None = None
    build_seconds: float = 0.0
    run_seconds: float = 0.0

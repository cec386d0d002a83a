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


@dataclass
class MeasureCandidate:
    """One program to build and time.

    Parameters
    ----------
    program : IRModule | PrimFunc | Schedule
        The scheduled program (its entry function is timed).
    check : CorrectnessCheck | None
        Compare its outputs with a reference before timing.
    """

    program: IRModule | PrimFunc | Schedule
    check: CorrectnessCheck | None = None

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

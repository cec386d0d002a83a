"""Tuning: operator tasks, measurement sessions with a cost model, and the tuning loop."""

from .loop import Budget, tune
from .session import TuningSession
from .task import Candidate, OpTask, freeze

__all__ = ["Budget", "Candidate", "OpTask", "TuningSession", "freeze", "tune"]

"""Tuning: operator tasks, measurement sessions with a cost model, and the tuning loop."""

from .budget import Budget
from .job import SearchOptions, TuningJob
from .loop import tune
from .session import TuningSession
from .task import Candidate, OpTask, freeze

__all__ = ["Budget", "Candidate", "OpTask", "SearchOptions", "TuningJob", "TuningSession",
           "freeze", "tune"]

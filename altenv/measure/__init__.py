"""Measurement of candidate programs: persistent builders, local and RPC runners,
correctness checks. ``create("local" | "rpc", config, target)`` is the entry point."""

from .builder import PersistentBuilder
from .check import CorrectnessCheck, WrongResultError
from .config import MeasureConfig, RPCSettings
from .measurer import LocalMeasurer, Measurer, RPCMeasurer, create, device_type
from .result import MeasureCandidate, MeasureResult, ProgramPoint, as_module

__all__ = [
    "CorrectnessCheck",
    "LocalMeasurer",
    "MeasureCandidate",
    "MeasureConfig",
    "MeasureResult",
    "ProgramPoint",
    "Measurer",
    "PersistentBuilder",
    "RPCMeasurer",
    "RPCSettings",
    "WrongResultError",
    "as_module",
    "create",
    "device_type",
]

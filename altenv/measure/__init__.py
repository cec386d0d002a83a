"""Measurement of candidate programs: persistent builders, local and RPC runners,
correctness checks. ``create("local" | "rpc", config, target)`` is the entry point."""

import lazy_loader

# Submodules load on first use, so that reading a config (altenv.config) imports no TVM.
__getattr__, __dir__, __all__ = lazy_loader.attach(__name__, submod_attrs={
    "builder": ["PersistentBuilder"],
    "check": ["CorrectnessCheck", "WrongResultError"],
    "config": ["MeasureConfig", "RPCSettings"],
    "measurer": ["LocalMeasurer", "Measurer", "RPCMeasurer", "create", "device_type"],
    "result": ["MeasureCandidate", "MeasureResult", "ProgramPoint", "as_module"],
})

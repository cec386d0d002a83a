"""Tuning: operator tasks, measurement sessions with a cost model, and the tuning loop."""

import lazy_loader

# Submodules load on first use, so that reading a config (altenv.config) imports no TVM.
__getattr__, __dir__, __all__ = lazy_loader.attach(__name__, submod_attrs={
    "budget": ["Budget"],
    "job": ["SearchOptions", "TuningJob"],
    "loop": ["tune"],
    "session": ["TuningSession"],
    "task": ["Candidate", "OpTask", "freeze"],
})

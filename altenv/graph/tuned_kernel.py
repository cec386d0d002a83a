"""A kernel's schedule tuned by MetaSchedule, read back from its database at build time.

A model run's other kernels are tuned into a MetaSchedule database
(:mod:`altenv.tuning.others`); the build asks it for each kernel's best schedule, checked
against the unscheduled kernel on random inputs: a tuned kernel that computes other numbers
is not used (the build falls back to its default schedule, with a warning).
"""

from __future__ import annotations

import logging

import numpy as np
import tvm
from tvm import tirx
from tvm.s_tir import meta_schedule as ms

from altenv.measure.chains import kernel_module, random_values
from altenv.measure.check import max_relative_error
from altenv.target import device_of

log = logging.getLogger(__name__)


def tuned_kernel(database: ms.database.Database, func: tirx.PrimFunc,
                 target: tvm.target.Target) -> tirx.PrimFunc | None:
    """``func`` with its best schedule from ``database``, or ``None`` when it has none or
    the scheduled kernel's outputs differ from ``func``'s on random inputs."""
    sch = database.query_schedule(kernel_module(func), target, workload_name="main")
    if sch is None:
        return None
    scheduled = sch.mod["main"].without_attr("global_symbol")
    err = _difference(func, scheduled, target)
    if not err <= 1e-5:
        log.warning("a tuned kernel computes other results than its program (relative error "
                    "%.3g); default schedule", err)
        return None
    return scheduled


def _difference(reference: tirx.PrimFunc, candidate: tirx.PrimFunc,
                target: tvm.target.Target) -> float:
    """Largest relative error between the buffers of the two kernels after running both on
    the same random inputs (:func:`~altenv.measure.chains.random_values`)."""
    dev = device_of(target)
    values = random_values(reference, np.random.default_rng(0))
    results = []
    for func in (reference, candidate):
        lib = tvm.compile(kernel_module(func), target=target)
        args = [tvm.runtime.tensor(v, dev) for v in values]
        lib["main"](*args)
        results.append([a.numpy() for a in args])
    return max((max_relative_error(c, r) for r, c in zip(*results)), default=0.0)

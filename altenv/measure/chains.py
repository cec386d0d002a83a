"""Kernels timed back to back where the network will run: the device that measures.

A network's in-network layout choice (:mod:`altenv.graph.in_network`) and its read-through
choice (:mod:`altenv.graph.read_through`) re-time already measured kernels, chained as the
network calls them. They must be timed on the tuning target's device, as its candidates
were: a board behind an RPC tracker or a Ray device actor answers differently from the
host, and a cross-compiled kernel does not run on the host at all.

:class:`KernelChain` compiles PrimFuncs one by one and times them with TVM's own evaluator
(no Python overhead per call), here or through an RPC session; :func:`time_chains` times
several chains interleaved. A :data:`ChainTimer` is what a measurer hands the network
stages: :meth:`altenv.measure.Measurer.chain_timer`.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import tvm
from tvm import tirx
from tvm.s_tir.meta_schedule.builder.local_builder import default_export
from tvm.s_tir.meta_schedule.runner.rpc_runner import default_upload_module

from ..target import device_of, remote_device, target_cores, use_tvm_threads
from .timing import TimingStats, time_interleaved

ChainTimer = Callable[[Mapping[Any, Sequence[tirx.PrimFunc]], int, int], dict[Any, TimingStats]]
"""``timer(chains, rounds, seed)``: each chain of kernels (key -> PrimFuncs run one after
another) timed interleaved over ``rounds`` on random inputs drawn from ``seed``."""


def kernel_module(func: tirx.PrimFunc) -> tvm.IRModule:
    """A PrimFunc alone in a module, as ``main``: how a kernel is compiled by itself (and
    tuned and looked up by MetaSchedule, :mod:`altenv.tuning.others`)."""
    return tvm.IRModule({"main": func.with_attr("global_symbol", "main")})


def random_values(func: tirx.PrimFunc, rng: np.random.Generator) -> list[np.ndarray]:
    """One uniform [-1, 1) array per parameter of ``func`` in its shape and dtype (integer
    buffers hold zeros: valid indices)."""
    return [rng.uniform(-1, 1, [int(d) for d in p.shape]).astype(str(p.dtype))
            for p in func.params]


class KernelChain:
    """A block timer (:class:`altenv.measure.timing.BlockTimer`) for PrimFuncs run one
    after another on random inputs, each compiled alone for ``target``; with ``session``
    (a TVM RPC session) uploaded and run on that session's device, as MetaSchedule's
    ``RPCRunner`` uploads a candidate.

    With ``cold`` (a CPU target), every call finds all its arguments but the first (the data,
    which its producer has just written) flushed from the CPU caches, as kernels run inside
    a network and as a network run's candidates are measured
    (``measure.enable_cpu_cache_flush``); warm, a kernel run again and again keeps its
    weights in the caches, which hides what reading them costs in the network."""

    def __init__(self, funcs: Sequence[tirx.PrimFunc], target: tvm.target.Target, seed: int,
                 cold: bool = False, session: Any = None):
        if cold and target.kind.name != "llvm":
            raise ValueError(f"KernelChain: cold timing flushes CPU caches; target is "
                             f"{target.kind.name}")
        rng = np.random.default_rng(seed)
        dev = device_of(target) if session is None else remote_device(session, target)
        self.cold = cold
        self.steps = []
        for func in funcs:
            lib = tvm.compile(kernel_module(func), target=target)
            mod = lib.mod if session is None else upload(session, lib.mod)
            args = [tvm.runtime.tensor(v, dev) for v in random_values(func, rng)]
            self.steps.append((mod, dev, args))

    def block(self, inner: int) -> float:
        """Seconds for one pass over the chain, averaged over ``inner`` passes."""
        total = 0.0
        for mod, dev, args in self.steps:
            if self.cold:
                timer = mod.time_evaluator("main", dev, number=1, repeat=inner,
                                           f_preproc="cache_flush_cpu_non_first_arg")
            else:
                timer = mod.time_evaluator("main", dev, number=inner, repeat=1)
            total += float(timer(*args).mean)
        return total


def upload(session: Any, module: tvm.runtime.Module) -> tvm.runtime.Module:
    """A compiled ``module`` (a kernel's library, a Relax VM executable's ``mod``) exported
    as MetaSchedule's builders export a candidate, uploaded to an RPC ``session`` and
    loaded there (the local copy removed)."""
    artifact = default_export(module)
    try:  # a name of its own: the device's loader would hand back a module of the same name
        return default_upload_module(session, artifact, f"chain-{uuid.uuid4().hex}.tar")
    finally:
        shutil.rmtree(os.path.dirname(artifact), ignore_errors=True)


def time_chains(chains: Mapping[Any, Sequence[tirx.PrimFunc]], target: tvm.target.Target,
                rounds: int, seed: int, session: Any = None) -> dict[Any, TimingStats]:
    """Every chain's :class:`KernelChain` (on ``session``'s device, or here) timed
    interleaved over ``rounds``, blocks of about 5 ms; here, TVM's pool gets the target's
    cores first."""
    if session is None and target.kind.name in ("llvm", "c"):
        use_tvm_threads(target_cores(target))
    runs = {key: KernelChain(list(chain), target, seed, session=session)
            for key, chain in chains.items()}
    return time_interleaved(runs, rounds=rounds, min_block_seconds=0.005,
                            cooldown_seconds=0.002)


def local_timer(target: tvm.target.Target) -> ChainTimer:
    """The :data:`ChainTimer` of this host's device for ``target``."""
    return lambda chains, rounds, seed: time_chains(chains, target, rounds, seed)

"""Every kernel of a compiled network timed alone and inside the network: the per-kernel
profile.

:func:`profile_kernels` times every PrimFunc the ``main`` of one or more compiled programs
calls, each compiled alone (:class:`~altenv.measure.chains.KernelChain`): its time per
call, interleaved with all the others over rounds, times its number of calls. The sum
leaves out what the VM does between kernels (allocation, views, argument checks), so it
comes out below the network's latency; the difference is reported as such, not spread over
the kernels.

Alone, a kernel runs again and again on the same buffers, so its weights and inputs sit in
the caches. Inside the network they were last touched one or many kernels earlier, so each
kernel is also timed cold, its weights flushed from the caches before every call: on
MobileNet-V2 the cold sums came within 1-4 % of the kernels' sums inside the
network, the warm sums 23-30 % below them. Where a
program's VM is given, :func:`time_in_network` also times every call as ``main`` makes it,
with the VM's instrument hook (a callback before and after each call); the callback's own
cost per call is measured by a run whose kernel calls are all skipped, and subtracted.
"""

from __future__ import annotations

import math
import statistics
import time
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import tvm
import tvm.ir.expr as ire
from tvm import relax, tirx

from altenv.graph.ops_match import analyze_func
from altenv.measure.chains import KernelChain
from altenv.measure.timing import time_interleaved
from altenv.target import target_cores, use_tvm_threads

CALL_TIR = "relax.call_tir"


@dataclass(frozen=True)
class KernelTime:
    """One PrimFunc of a network in a profile.

    Parameters
    ----------
    name: its name in the module.
    kind: what it computes: a complex op kind (``c2d``, ``gmm``, ...), ``conversion`` (a
        layout conversion a network build inserted), ``reduce``, ``elemwise`` or
        ``injective``.
    calls: its call sites in ``main``.
    seconds: median seconds per call, timed alone.
    spread: interquartile range over median of its rounds.
    cold: median seconds per call alone, every argument but the data flushed from the CPU
        caches first (:class:`KernelChain` ``cold``); NaN off the CPU.
    in_network: mean seconds per call inside the network (:func:`time_in_network`), NaN
        when the program's VM was not given.
    """

    name: str
    kind: str
    calls: int
    seconds: float
    spread: float
    cold: float = math.nan
    in_network: float = math.nan

    @property
    def total(self) -> float:
        """Seconds per network run: ``calls * seconds``."""
        return self.calls * self.seconds

    @property
    def cold_total(self) -> float:
        """Seconds per network run timed alone and cold: ``calls * cold``."""
        return self.calls * self.cold

    @property
    def network_total(self) -> float:
        """Seconds per network run inside the network: ``calls * in_network``."""
        return self.calls * self.in_network


def kernel_calls(mod: tvm.IRModule) -> Counter[str]:
    """How often ``main`` calls each PrimFunc, after the reshapes the VM runs as views are
    rewritten (as the CPU pipeline does before lowering)."""
    main = relax.transform.RewriteDataflowReshape()(mod)["main"]
    call_tir = tvm.ir.Op.get(CALL_TIR)
    calls: Counter[str] = Counter()
    for block in main.body.blocks:
        for binding in block.bindings:
            value = binding.value
            if isinstance(value, ire.Call) and value.op.same_as(call_tir):
                calls[value.args[0].name_hint] += 1
    return calls


def kind_of(func: tirx.PrimFunc) -> str:
    """What an unscheduled PrimFunc computes (:func:`~altenv.graph.ops_match.analyze_func`):
    its complex op's kind, else ``reduce`` / ``elemwise`` / ``injective``."""
    return analyze_func(func).kind


@dataclass(frozen=True)
class KernelSource:
    """A compiled Relax program as the profiler reads it.

    Parameters
    ----------
    module: the module that was compiled (``main`` and its PrimFuncs).
    target: the target it was compiled for.
    kinds: what each kernel computes (:attr:`KernelTime.kind`); a kernel left out is
        classified by :func:`kind_of`, which reads unscheduled functions, so tuned ones
        need an entry.
    vm, args: the program's Relax VM and the arguments of its ``main``, for the times
        inside the network; ``None`` and empty to time the kernels alone only.
    """

    module: tvm.IRModule
    target: tvm.target.Target
    kinds: Mapping[str, str] = field(default_factory=dict)
    vm: Any = None
    args: Sequence[Any] = ()


#: A VM instrument's answer: run the call, or skip it.
_RUN, _SKIP = 0, 1


def _is_kernel(symbol: str) -> bool:
    """Whether a VM call is a PrimFunc of the module (the VM's builtins are ``vm.*``)."""
    return not symbol.startswith("vm.")


def _instrumented_run(vm: Any, args: Sequence[Any], skip: bool) -> list[tuple[str, float]]:
    """One call of ``main`` with every VM call timed between the instrument's before and
    after hooks, in call order; with ``skip`` the kernel calls are skipped (builtins run)
    and each is timed from its before hook to the next hook (the VM calls no after hook
    for a skipped call)."""
    times: list[tuple[str, float]] = []
    start = 0.0
    skipped: str | None = None  # the skipped call whose time ends at the next hook

    def instrument(func: Any, symbol: str, before: bool, ret: Any, *call_args: Any) -> int:
        nonlocal start, skipped
        now = time.perf_counter()
        if skipped is not None:
            times.append((skipped, now - start))
            skipped = None
        if not before:
            times.append((symbol, now - start))
            return _RUN
        start = time.perf_counter()
        if skip and _is_kernel(symbol):
            skipped = symbol
            return _SKIP
        return _RUN

    vm.set_instrument(instrument)
    try:
        vm["main"](*args)
    finally:
        vm.set_instrument(None)
    return times


def time_in_network(sources: Mapping[str, KernelSource], rounds: int = 5,
                    ) -> dict[str, dict[str, float]]:
    """Seconds per call of every kernel inside its network, for each source with a VM:
    ``main`` run ``rounds`` times with each call timed (the programs interleaved), the
    median per call site, less the instrument's own cost per call (the median over a
    run's skipped kernel calls), averaged over the kernel's call sites."""
    programs = {label: src for label, src in sources.items() if src.vm is not None}
    sites: dict[str, dict[tuple[str, int], list[float]]] = {
        label: defaultdict(list) for label in programs}
    for _ in range(rounds + 1):  # the first round warms up
        for label, src in programs.items():
            seen: Counter[str] = Counter()
            for symbol, seconds in _instrumented_run(src.vm, src.args, skip=False):
                if _is_kernel(symbol):
                    sites[label][symbol, seen[symbol]].append(seconds)
                    seen[symbol] += 1
    out = {}
    for label, src in programs.items():
        skipped = [s for _ in range(3)
                   for symbol, s in _instrumented_run(src.vm, src.args, skip=True)
                   if _is_kernel(symbol)]
        overhead = statistics.median(skipped) if skipped else 0.0
        per_call: dict[str, list[float]] = defaultdict(list)
        for (symbol, _), samples in sites[label].items():
            per_call[symbol].append(max(statistics.median(samples[1:]) - overhead, 0.0))
        out[label] = {symbol: statistics.fmean(v) for symbol, v in per_call.items()}
    return out


def profile_kernels(programs: Mapping[str, KernelSource], rounds: int = 5,
                    seed: int = 0) -> dict[str, list[KernelTime]]:
    """Every PrimFunc each program's ``main`` calls, compiled alone and timed on random
    inputs, warm and (on the CPU) cold, the kernels of all programs interleaved over
    ``rounds``; per program the largest share first. TVM's thread pool gets the first
    program's target's cores. For the programs whose VM is given, each kernel's time
    inside the network too (:func:`time_in_network`)."""
    if programs:
        use_tvm_threads(target_cores(next(iter(programs.values())).target))
    calls = {label: kernel_calls(src.module) for label, src in programs.items()}
    chains = {(label, name, cold): KernelChain([src.module[name]], src.target, seed, cold)
              for label, src in programs.items() for name in calls[label]
              for cold in (False, True) if not cold or src.target.kind.name == "llvm"}
    stats = time_interleaved(chains, rounds=rounds, min_block_seconds=0.005,
                             cooldown_seconds=0.002)
    inside = time_in_network(programs, rounds)
    out = {}
    for label, src in programs.items():
        rows = []
        for name, count in calls[label].items():
            warm, cold = stats[label, name, False], stats.get((label, name, True))
            rows.append(KernelTime(name, src.kinds.get(name) or kind_of(src.module[name]),
                                   count, warm.median, warm.spread,
                                   cold.median if cold else math.nan,
                                   inside.get(label, {}).get(name, math.nan)))
        out[label] = sorted(rows, key=lambda row: -row.total)
    return out

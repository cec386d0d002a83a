"""Whole-network build with per-task layouts and schedules (ALT's graph level, §4.2 and §6).

:func:`build_network` plans a task graph (:mod:`altenv.graph.plan`), rewrites its Relax
``main`` from the plan (:mod:`altenv.graph.rewriter`) and compiles it into a
:class:`NetworkBuild`, which runs and times the network on its physical weights.
:func:`other_kernels` (the kernels MetaSchedule tunes) and :func:`call_options` (the kernels
one complex call runs, for :mod:`altenv.graph.in_network`) compile nothing of the network.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import tvm
from tvm import tirx
from tvm.s_tir.meta_schedule.database import Database

from altenv.graph.build import BuiltModel, compile_module, with_func
from altenv.graph.kernels import kernel_calls
from altenv.graph.plan import NetworkPlan, plan_network
from altenv.graph.rewriter import InsertedConversion, ReadThrough, Rewriter
from altenv.graph.scheduler import KernelScheduler, Scheduled
from altenv.graph.tasks import TaskGraph
from altenv.measure.chains import ChainTimer
from altenv.target import make_target


@dataclass
class NetworkBuild:
    """A compiled network with per-task layouts.

    Parameters
    ----------
    plan: the layouts and their propagation.
    mod: the rewritten module that was compiled.
    built: the compiled executable and its VM.
    param_names, params: ``main``'s weight parameters (after the inputs), in argument
        order, holding the physical (pre-transformed) weights.
    conversions: the conversion calls inserted into ``main``.
    target: the target it was compiled for.
    scheduled: the PrimFuncs that carry a tuned schedule.
    reads_through: the complex calls that read their data operand as it is stored (no
        conversion call before them) -> how (:data:`ReadThrough`).
    kinds: what each PrimFunc ``main`` calls computes (a complex op kind, ``conversion``,
        or the kind of the task it was generated from), for per-kernel profiles.
    tuned_others: the other kernels (not complex calls) scheduled from the ``others``
        database.
    """

    plan: NetworkPlan
    mod: tvm.IRModule
    built: BuiltModel
    param_names: list[str]
    params: list[np.ndarray]
    conversions: list[InsertedConversion]
    target: tvm.target.Target
    scheduled: frozenset[str] = frozenset()
    reads_through: Mapping[int, int] = field(default_factory=dict)
    kinds: Mapping[str, str] = field(default_factory=dict)
    tuned_others: tuple[str, ...] = ()
    _device_weights: list[tvm.runtime.Tensor] | None = field(default=None, init=False,
                                                             repr=False)

    def run(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        """Outputs (logical layouts) of the network on numpy ``inputs``."""
        dev = self.built.device
        weights = self.device_params()
        out = self.built.vm["main"](*(tvm.runtime.tensor(x, dev) for x in inputs), *weights)
        return _flatten(out)

    def device_params(self) -> list[tvm.runtime.Tensor]:
        """The physical weights on the device (uploaded once)."""
        if self._device_weights is None:
            self._device_weights = [tvm.runtime.tensor(p, self.built.device)
                                    for p in self.params]
        return self._device_weights

    def time(self, inputs: list[np.ndarray], number: int = 10, repeat: int = 3) -> float:
        """Median latency of ``main`` in seconds."""
        dev = self.built.device
        args = [tvm.runtime.tensor(x, dev) for x in inputs] + self.device_params()
        timer = self.built.vm.time_evaluator("main", dev, number=number, repeat=repeat)
        return float(timer(*args).median)

    def without_conversions(self) -> NetworkBuild:
        """The same network compiled with every conversion PrimFunc emptied: the same calls on
        the same buffers, minus the conversions' work. Its outputs are wrong; timed next to
        this network it measures what the conversions cost."""
        mod = self.mod
        for name in {c.func for c in self.conversions}:
            gv = mod.get_global_var(name)
            mod = with_func(mod, name, mod[gv].with_body(tirx.Evaluate(0)))
        built = compile_module(mod, self.target, self.scheduled)
        return replace(self, mod=mod, built=built)


def _flatten(value: Any) -> list[np.ndarray]:
    if isinstance(value, tvm.runtime.Tensor):
        return [value.numpy()]
    return [a for v in value for a in _flatten(v)]


def build_network(graph: TaskGraph, factors: Mapping[str, Mapping[str, int]] | None = None,
                  schedules: Mapping[str, Scheduled] | None = None,
                  target: str | dict | tvm.target.Target | None = None,
                  read_through: ReadThrough = None,
                  others: Database | None = None,
                  fast_math: Collection[str] = (),
                  timer: ChainTimer | None = None) -> NetworkBuild:
    """Compile ``graph`` with the template ``factors`` of each complex task (default: untiled)
    and ``schedules`` of their layout-transformed programs (:meth:`NetworkPlan.program`;
    default schedules otherwise). The other kernels MetaSchedule tunes (:func:`other_kernels`)
    take their schedules from its database ``others`` where it has one
    (:mod:`altenv.tuning.others`), else the defaults above. The generated
    code computes the float32 functions named in ``fast_math`` (``erf``, ``tanh``,
    ``exp``) with TVM's fast versions (:func:`plan_network`).

    ``read_through`` picks the complex calls that read their data operand in the layout it
    is stored in instead of converting it first, and how (:data:`ReadThrough`, see
    :mod:`altenv.graph.read_through`), where a conversion would run and the task's schedule
    replays on the variant; ``"measure"`` times the ways for each such call with ``timer``
    (the measuring device's, :meth:`altenv.measure.Measurer.chain_timer`; this host's by
    default) and keeps the fastest. :attr:`NetworkBuild.reads_through` holds the calls that
    do, and how."""
    plan = plan_network(graph, factors, fast_math)
    return build_plan(plan, schedules, target, read_through, others, timer)


def build_plan(plan: NetworkPlan, schedules: Mapping[str, Scheduled] | None = None,
               target: str | dict | tvm.target.Target | None = None,
               read_through: ReadThrough = None,
               others: Database | None = None,
               timer: ChainTimer | None = None) -> NetworkBuild:
    """Rewrite ``main`` from ``plan`` and compile it (``read_through``, ``others``,
    ``timer``: see :func:`build_network`)."""
    tgt = make_target(target)
    rewriter = Rewriter(plan, dict(schedules or {}), tgt, read_through, others, timer)
    mod = rewriter.run()
    built = compile_module(mod, tgt, rewriter.scheduled)
    return NetworkBuild(plan, mod, built, rewriter.param_names, rewriter.param_values,
                        rewriter.conversions, tgt, frozenset(rewriter.scheduled),
                        dict(rewriter.reads_through), rewriter.kinds,
                        tuple(rewriter.tuned_others))


def other_kernels(plan: NetworkPlan, schedules: Mapping[str, Scheduled] | None = None,
                  target: str | dict | tvm.target.Target | None = None,
                  read_through: ReadThrough = None, timer: ChainTimer | None = None
                  ) -> tuple[dict[str, tuple[tirx.PrimFunc, int]], dict[int, int]]:
    """The kernels of the network :func:`build_plan` would compile that the layout search
    does not tune and MetaSchedule does (the tasks kept as the frontend fused them; on a
    CPU the build schedules the functions it generates itself): name -> (unscheduled
    PrimFunc, calls in ``main``); and the calls that read through, and how (``"measure"``
    decides them here, with ``timer``, so a later build can be given them).
    Nothing is compiled but what ``"measure"`` times."""
    rewriter = Rewriter(plan, dict(schedules or {}), make_target(target), read_through,
                         timer=timer)
    calls = kernel_calls(rewriter.run())
    kernels = {name: (func, calls[name]) for name, func in rewriter.other_kernels.items()
               if calls[name]}
    return kernels, dict(rewriter.reads_through)


def call_options(plan: NetworkPlan, schedules: Mapping[str, Scheduled], index: int,
                 target: str | dict | tvm.target.Target | None = None
                 ) -> list[list[tirx.PrimFunc]]:
    """The kernels a build of ``plan`` runs for complex call ``index``, scheduled as the build
    schedules them, one list per way the call may get its data operand: the conversions of
    its operands that are not stored in the layouts it reads, then the call; and, where its
    data operand is converted, the same with the call reading that operand as stored
    instead (when its schedule replays on that variant; :mod:`altenv.graph.read_through`).
    A conversion another call of the network would share is counted here all the same."""
    return KernelScheduler(plan, dict(schedules), make_target(target)).call_options(index)

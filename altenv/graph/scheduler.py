"""How a build of a :class:`~altenv.graph.plan.NetworkPlan` schedules each of its kernels.

A mapped complex task gets the schedule given for its layout-transformed program, replayed
from that schedule's trace on a variant of the program (a residual read in another layout,
the data operand read as it is stored: :mod:`altenv.graph.read_through`). On a CPU target
the functions the build generates (conversions, regenerated elementwise tasks) get
:func:`altenv.graph.spatial.parallel_spatial`: parallel over the target's cores, innermost
loop vectorized. Tasks kept as the frontend fused them (softmax, norms, pooling, and complex
tasks that cannot be mapped, with a warning) stay on logical tensors with
:func:`altenv.graph.spatial.untuned_schedule`. The kernels MetaSchedule tunes take their
schedules from its ``others`` database where it has one. :class:`KernelScheduler` also gives
the ways a complex call may get its data operand, each as the kernels it runs, for the
read-through choice and :func:`altenv.graph.network.call_options`; the rewrite of ``main``
(:mod:`altenv.graph.rewriter`) builds on it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.s_tir.meta_schedule.database import Database

from altenv.graph.lowering import ComplexLowering
from altenv.graph.plan import NetworkPlan, op_name
from altenv.graph.read_through import GUARDED, fastest_chain, staged_variants
from altenv.graph.spatial import parallel_spatial, untuned_schedule
from altenv.graph.tuned_kernel import tuned_kernel
from altenv.layout import Layout
from altenv.layout.convert import conversion_func
from altenv.measure.chains import ChainTimer
from altenv.target import target_cores

log = logging.getLogger(__name__)

Scheduled = tirx.PrimFunc | s_tir.Schedule


class KernelScheduler:
    """Schedules the kernels of a build of ``plan``: the complex tasks' from ``schedules``
    (task name -> the schedule of :meth:`NetworkPlan.program`); the tasks kept as they are
    (and, off the CPU, the generated spatial functions) from the ``others`` database where
    it has one, otherwise, with a CPU ``target``, :func:`untuned_schedule` and
    :func:`parallel_spatial`. ``timer`` times the ways a call may read its data operand."""

    def __init__(self, plan: NetworkPlan, schedules: dict[str, Scheduled],
                 target: tvm.target.Target, others: Database | None = None,
                 timer: ChainTimer | None = None) -> None:
        self.plan = plan
        self.timer = timer
        self.schedules = schedules
        self.target = target
        self.others = others
        self.cores = target_cores(target) if target.kind.name == "llvm" else None
        self.measured: dict[tuple[Any, ...], int | None] = {}
        unknown = set(schedules) - set(plan.layouts)
        if unknown:
            log.warning("schedules for tasks %s ignored: not generated with layouts",
                        sorted(unknown))

    def _storage(self, tensor: str) -> Layout:
        return canonical(self.plan.propagation.layout_of(tensor, self.plan.dataflow.shapes))

    def _complex_key(self, task: str, lowering: ComplexLowering,
                     layouts: Mapping[str, Layout]) -> tuple[Any, ...]:
        return (task, lowering.epilogue, lowering.activation,
                layouts.get("residual", layouts["out"]), layouts["data"])

    def _read_variant(self, task: str, lowering: ComplexLowering,
                      layouts: Mapping[str, Layout], storage: Layout, want: Layout, how: int
                      ) -> tirx.PrimFunc | None:
        """The scheduled function of ``task`` reading its data stored in ``storage`` (the
        template reads ``want``): guarded reads, or the conversion staged at loop ``how``;
        ``None`` when the schedule does not replay on it."""
        if how == GUARDED:
            return self._replay(task, lowering.func(
                {**layouts, "data": lowering.read_through_layout(storage)}))
        given = self.schedules.get(task)
        if not isinstance(given, s_tir.Schedule):
            return None
        return staged_variants(lowering.func(layouts, (storage, want)), given.trace,
                               self.target, at=how).get(how)

    def _read_options(self, index: int, layouts: Mapping[str, Layout], storage: Layout,
                      want: Layout) -> dict[str, tuple[int | None, list[tirx.PrimFunc]]]:
        """Every way call ``index`` may get its data stored in ``storage`` (the template
        reads ``want``): name -> (how, or ``None`` to convert first; the kernels run)."""
        call = self.plan.graph.calls[index]
        task, lowering = call.task, self.plan.lowerings[index]
        conversion, _ = self._other(conversion_kernel(storage, want, call.dtype))
        kernel = noalias(self._schedule(task, lowering.func(layouts)))
        options: dict[str, tuple[int | None, list[tirx.PrimFunc]]] = {
            "convert": (None, [conversion, kernel])}
        guarded = self._read_variant(task, lowering, layouts, storage, want, GUARDED)
        if guarded is not None:
            options["guarded"] = (GUARDED, [noalias(guarded)])
        given = self.schedules.get(task)
        if isinstance(given, s_tir.Schedule):
            staged = staged_variants(lowering.func(layouts, (storage, want)), given.trace,
                                     self.target)
            for at, func in staged.items():
                options[f"staged at loop {at}"] = (at, [noalias(func)])
        return options

    def _measured_read(self, index: int, layouts: Mapping[str, Layout], storage: Layout,
                       want: Layout) -> int | None:
        """How call ``index`` gets its data stored in ``storage`` (``None``: converted
        first): the fastest way alone (:func:`fastest_chain`), decided once per function
        and storage."""
        task = self.plan.graph.calls[index].task
        lowering = self.plan.lowerings[index]
        key = (self._complex_key(task, lowering, layouts), storage)
        if key not in self.measured:
            options = self._read_options(index, layouts, storage, want)
            best, medians = fastest_chain({name: chain for name, (_, chain) in options.items()},
                                          self.target, timer=self.timer)
            log.info("call %d (%s): %s", index, task, ", ".join(
                f"{name} {seconds * 1e6:.1f} us" for name, seconds in medians.items()))
            self.measured[key] = options[best][0]
        return self.measured[key]

    def call_options(self, index: int) -> list[list[tirx.PrimFunc]]:
        """See :func:`altenv.graph.network.call_options`."""
        plan = self.plan
        call = plan.graph.calls[index]
        lowering = plan.lowerings[index]
        name = op_name(index)
        op = plan.dataflow.op(name)
        shapes = plan.dataflow.shapes
        layouts = dict(plan.layouts[call.task])
        if lowering.residual_arg is not None:
            layouts["residual"] = plan.propagation.read_layout(name, op.inputs[-1], shapes)
        before = []
        for tensor in op.inputs[1:]:
            if tensor in plan.dataflow.constants:
                continue
            stored = self._storage(tensor)
            read = canonical(plan.propagation.read_layout(name, tensor, shapes))
            if not stored.same_storage(read):
                before.append(self._other(conversion_kernel(stored, read, call.dtype))[0])
        storage = self._storage(op.inputs[0])
        want = canonical(plan.chosen[name]["data"])
        if storage.same_storage(want):
            return [before + [noalias(self._schedule(call.task, lowering.func(layouts)))]]
        return [before + chain for _, chain in
                self._read_options(index, layouts, storage, want).values()]

    def _schedule(self, task: str, func: tirx.PrimFunc) -> tirx.PrimFunc:
        """``func`` with the task's schedule (:meth:`_replay`); the default schedule, with a
        warning, when it does not apply."""
        scheduled = self._replay(task, func, warn=True)
        return func if scheduled is None else scheduled

    def _replay(self, task: str, func: tirx.PrimFunc, warn: bool = False
                ) -> tirx.PrimFunc | None:
        """``func`` with the task's schedule: as given when ``func`` is the tuned program,
        else replayed from the schedule's trace (a variant reading its residual or data in
        another layout); ``func`` itself for a task without schedule, ``None`` when the
        schedule does not replay."""
        given = self.schedules.get(task)
        if given is None:
            return func
        if tvm_ffi.structural_equal(func, self.plan.program(task)):
            scheduled = given.mod["main"] if isinstance(given, s_tir.Schedule) else given
            return scheduled.without_attr("global_symbol") if scheduled.attrs is not None \
                and "global_symbol" in scheduled.attrs else scheduled
        if isinstance(given, s_tir.Schedule):
            sch = s_tir.Schedule(func)
            try:
                given.trace.apply_to_schedule(sch, remove_postproc=False)
                return sch.mod["main"]
            except RuntimeError as err:
                if warn:
                    log.warning("task %s: schedule does not replay on a variant (%s); default "
                                "schedule", task, str(err).splitlines()[0])
        elif warn:
            log.warning("task %s: a variant of its program (residual layout) has no schedule; "
                        "default schedule", task)
        return None

    def _for_others(self, kept: bool) -> bool:
        """Whether MetaSchedule tunes such a kernel: a task kept as the frontend fused it,
        and on a target other than a CPU the generated spatial functions too. On a CPU these
        (conversions, regenerated elementwise tasks) keep :func:`parallel_spatial`:
        MetaSchedule's design space for a single spatial block fuses all its loops and
        vectorizes the fused loop, which ran R3D-18's conversions 2-55x slower."""
        return kept or self.cores is None

    def _other(self, func: tirx.PrimFunc, kept: bool = False) -> tuple[tirx.PrimFunc, bool]:
        """``func``, a kernel the layout search does not tune (``kept``: a task kept as the
        frontend fused it, else a generated conversion or elementwise function), with its
        schedule from the ``others`` database when MetaSchedule tunes it
        (:meth:`_for_others`) and the database has a correct one; otherwise, on a CPU
        target, :func:`untuned_schedule` or :func:`parallel_spatial`. Also whether the
        schedule came from the database."""
        if self.others is not None and self._for_others(kept):
            tuned = tuned_kernel(self.others, func, self.target)
            if tuned is not None:
                return tuned, True
        if self.cores is None:
            return func, False
        return (untuned_schedule(func, self.target, self.cores) if kept
                else parallel_spatial(func, self.cores)), False


def canonical(layout: Layout) -> Layout:
    """``layout`` without dimension names (layouts that store data alike compare equal)."""
    data = layout.to_json()
    return Layout.from_json({"shape": data["shape"], "primitives": data["primitives"]})


def conversion_kernel(src: Layout, dst: Layout, dtype: str) -> tirx.PrimFunc:
    """The unscheduled PrimFunc converting a tensor stored in ``src`` into ``dst``."""
    return noalias(conversion_func(src, dst, dtype).without_attr("global_symbol"))


def noalias(func: tirx.PrimFunc) -> tirx.PrimFunc:
    return func.with_attr("tirx.noalias", True)

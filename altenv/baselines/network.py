"""Network baselines for a Relax module with separate weights (``main(*inputs, *weights)``,
attribute ``num_input``, as :mod:`altenv.graph` imports models): MetaSchedule ``tune_relax``
with weight pre-packing, TVM's untuned default build, and a torch module in eager mode."""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import tvm
import tvm_ffi
from tvm import relax, tirx
from tvm.relax import pipeline as relax_pipeline
from tvm.relax.backend.cpu_generic import pipeline as cpu_pipeline
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.search_strategy import SearchStrategy

from ..graph.build import with_func
from ..graph.kernels import KernelSource, kernel_calls, kind_of
from ..graph.network import NetworkBuild
from ..measure import MeasureConfig, Measurer
from ..measure.chains import upload
from ..measure.check import WrongResultError, max_relative_error
from ..measure.metaschedule import metaschedule_session
from ..target import make_target, remote_device, target_cores, use_tvm_threads
from .base import (
    Baseline,
    NoValidMeasurementsError,
    TuningSummary,
    count_measurements,
    mean_run_seconds,
    untuned_rules,
)
from .isolated import IsolatedRun
from .operator import TargetSpec

log = logging.getLogger(__name__)


def weight_names(mod: tvm.IRModule) -> list[str]:
    """Names of ``main``'s weight parameters (those after its ``num_input`` inputs)."""
    func = mod["main"]
    num_input = int(func.attrs["num_input"]) if func.attrs and "num_input" in func.attrs else 0
    return [p.name for p in func.params[num_input:]]


def _flatten(value: object) -> list[np.ndarray]:
    if isinstance(value, tvm.runtime.Tensor):
        return [value.numpy()]
    return [x for item in value for x in _flatten(item)]  # type: ignore[attr-defined]


class _DeviceTimer:
    """A block timer (:class:`~altenv.measure.timing.BlockTimer`) of a VM's ``main`` on a
    remote device, its arguments set there (``set_input``, which works over RPC where a
    returned tuple does not): the device's own evaluator times each block, as it times
    candidates."""

    def __init__(self, vm: relax.VirtualMachine, dev: tvm.runtime.Device) -> None:
        self.vm, self.dev = vm, dev

    def block(self, inner: int) -> float:
        """Seconds per call over ``inner`` back-to-back calls on the device."""
        timer = self.vm.time_evaluator("invoke_stateful", self.dev, number=inner, repeat=1)
        return float(timer("main").mean)


def _vm_baseline(name: str, executable: tvm.runtime.Executable, target: tvm.target.Target,
                 inputs: Sequence[np.ndarray], weights: list[tvm.runtime.Tensor], notes: str,
                 tuning: TuningSummary | None = None, prepacked: bool = False,
                 kernels: KernelSource | None = None, session: Any = None) -> Baseline:
    """A Relax VM program as a :class:`Baseline`, TVM's thread pool set to the target's
    cores (TVM's own default is half the hardware threads: one on a 2-vCPU machine). Its
    ``kernels`` are given the VM and ``main``'s arguments (the per-kernel profile times
    them inside the network too). With ``session`` (a TVM RPC session) the program runs on
    that session's device: uploaded, its arguments copied there, each timed block run by
    the device's evaluator; no per-kernel profile."""
    if session is None:
        use_tvm_threads(target_cores(target))
        dev = tvm.cpu(0)
        vm = relax.VirtualMachine(executable, dev)
    else:
        dev = remote_device(session, target)
        vm = relax.VirtualMachine(upload(session, executable.mod), dev)
        weights = [tvm.runtime.tensor(w.numpy(), dev) for w in weights]
    if prepacked:  # the weight layout rewrite runs once, outside the timed function
        weights = list(vm["main_transform_params"](weights))
    args = [tvm.runtime.tensor(np.ascontiguousarray(x), dev) for x in inputs] + weights
    if session is not None:
        vm.set_input("main", *args)
        return Baseline(name, functools.partial(vm.invoke_stateful, "main"),
                        lambda: _flatten(vm.get_outputs("main")), tuning=tuning, notes=notes,
                        worker=_DeviceTimer(vm, dev))
    main = vm["main"]
    result: list[object] = []

    def run() -> None:
        result[:] = [main(*args)]

    def outputs() -> list[np.ndarray]:
        return _flatten(result[0])

    if kernels is not None:
        kernels = dataclasses.replace(kernels, vm=vm, args=args)
    return Baseline(name, run, outputs, tuning=tuning, notes=notes, kernels=kernels)


def _weight_tensors(mod: tvm.IRModule,
                    params: Mapping[str, np.ndarray]) -> list[tvm.runtime.Tensor]:
    missing = [n for n in weight_names(mod) if n not in params]
    if missing:
        raise ValueError(f"params: no value for weight(s) {missing}")
    return [tvm.runtime.tensor(np.ascontiguousarray(params[n]), tvm.cpu(0))
            for n in weight_names(mod)]


def untuned_relax_baseline(
    mod: tvm.IRModule,
    params: Mapping[str, np.ndarray],
    inputs: Sequence[np.ndarray],
    *,
    target: TargetSpec = None,
    session: Any = None,
) -> Baseline:
    """``mod`` built by TVM's default CPU Relax pipeline (dispatch, legalize, fuse, lower)
    with dlight's CPU reduction rule (:func:`.base.untuned_rules`) applied to the fused
    functions: the best schedule TVM offers without tuning. Complex operators stay naive
    serial loop nests. With ``session`` it runs on that RPC session's device."""
    tgt = make_target(target)
    if tgt.kind.name != "llvm":
        raise ValueError(f"untuned Relax baseline: CPU (llvm) targets only, got {tgt.kind.name}")
    passes = (cpu_pipeline.library_dispatch_passes(tgt) + cpu_pipeline.legalize_passes(tgt)
              + [untuned_rules()]
              + cpu_pipeline.dataflow_lower_passes(tgt) + cpu_pipeline.finalize_passes(tgt))
    with tgt:
        executable = tvm.compile(mod, tgt, relax_pipeline=tvm.transform.Sequential(passes))
    return _vm_baseline("tvm-default", executable, tgt, inputs, _weight_tensors(mod, params),
                        "default CPU Relax pipeline + dlight CPU reduction rule",
                        session=session)


def _fused_for_tuning(mod: tvm.IRModule, target: tvm.target.Target,
                      prepack: bool) -> tvm.IRModule:
    """The preparation of ``relax.pipeline.static_shape_tuning_pipeline``: legalize and fuse,
    and with ``prepack`` mark weights layout-free so MetaSchedule may rewrite their layout."""
    passes = [relax.transform.DecomposeOpsForInference(), relax.transform.CanonicalizeBindings(),
              relax_pipeline.zero_pipeline()]
    if prepack:
        passes.append(relax.transform.AttachAttrLayoutFreeBuffers())
    with target:
        return tvm.transform.Sequential(passes)(mod)


def round_size(max_trials: int, tasks: int, most: int = 64, least: int = 8) -> int:
    """MetaSchedule's trials per task and round for a network of ``tasks`` tasks: its own
    default (64) where the budget covers a round of every task, else the budget over the
    tasks (at least ``least``). MetaSchedule's task scheduler gives each task one round
    before it ranks them, and a task it never reaches keeps TVM's default schedule: at
    64 per round, 2000 trials left 14 of MobileNet-V3-Small's 43 convolution and matmul
    tasks (66 tasks in all) untuned, and seven of them (a 1024 x 576 GEMV at 2.0 ms
    among them) took 8.2 of its 12 ms."""
    return max(least, min(most, max_trials // max(tasks, 1)))


def tune_relax_baseline(
    mod: tvm.IRModule,
    params: Mapping[str, np.ndarray],
    inputs: Sequence[np.ndarray],
    work_dir: str | Path,
    max_trials: int,
    *,
    target: TargetSpec = None,
    config: MeasureConfig | None = None,
    num_trials_per_iter: int | None = None,
    strategy: SearchStrategy.SearchStrategyType = "evolutionary",
    max_trials_per_task: int | None = None,
    prepack: bool = True,
    seed: int = 0,
    measurer: Measurer | None = None,
) -> Baseline:
    """Tune every fused task of ``mod`` with MetaSchedule for exactly ``max_trials`` measured
    candidates in all (persistent-worker builder, ``LocalRunner``) and build the network from
    the best records. With ``prepack`` (TVM's ``cpu_weight_prepack``) tuned kernels may pick
    their own weight layouts; the weights are converted once by ``main_transform_params``
    before timing. ``strategy`` as in :func:`~altenv.baselines.tune_tir_baseline`.
    ``num_trials_per_iter`` (MetaSchedule's round size per task; ``None``:
    :func:`round_size`) decides how many tasks the budget reaches; an open ``measurer`` with
    ``config`` lends its workers. Raises :class:`NoValidMeasurementsError` when nothing
    valid was measured."""
    tgt = make_target(target)
    config = config or MeasureConfig()
    fused = _fused_for_tuning(mod, tgt, prepack)
    start = time.perf_counter()
    with metaschedule_session(config, tgt, measurer=measurer) as (builder, runner):
        tasks = ms.relax_integration.extract_tasks(fused, tgt)
        contexts, weights = ms.relax_integration.extracted_tasks_to_tune_contexts(
            tasks, str(work_dir), strategy=strategy, num_threads=target_cores(tgt), seed=seed)
        per_iter = num_trials_per_iter or round_size(max_trials, len(tasks))
        database = ms.tune_tasks(
            tasks=contexts, task_weights=weights, work_dir=str(work_dir),
            max_trials_global=max_trials, max_trials_per_task=max_trials_per_task,
            num_trials_per_iter=min(per_iter, max_trials), builder=builder,
            runner=runner)
    return tuned_relax_baseline(mod, params, inputs, work_dir, target=tgt, prepack=prepack,
                                tuning_seconds=time.perf_counter() - start, database=database)


def tuned_relax_baseline(
    mod: tvm.IRModule,
    params: Mapping[str, np.ndarray],
    inputs: Sequence[np.ndarray],
    work_dir: str | Path,
    *,
    target: TargetSpec = None,
    prepack: bool = True,
    tuning_seconds: float = math.nan,
    database: ms.database.Database | None = None,
) -> Baseline:
    """The network built from a finished ``tune_relax`` run (its JSON database in
    ``work_dir``, or ``database``), ``prepack`` as the run was tuned. Raises
    :class:`NoValidMeasurementsError` when nothing valid was measured."""
    tgt = make_target(target)
    fused = _fused_for_tuning(mod, tgt, prepack)
    if database is None:
        database = ms.database.JSONDatabase(work_dir=str(work_dir), allow_missing=False)
    trials, valid = count_measurements(database)
    if valid == 0:
        raise NoValidMeasurementsError(
            f"tune_relax: {trials} candidates measured, none valid (see {work_dir}/logs)")
    best: dict[str, float] = {}
    for record in database.get_all_tuning_records():
        key = str(record.workload.as_json()[0])  # the workload's structural hash
        best[key] = min(best.get(key, np.inf), mean_run_seconds(record.run_secs))
    summary = TuningSummary(trials, valid, float(sum(v for v in best.values() if v < np.inf)),
                            tuning_seconds, str(work_dir))
    with tgt, database:
        applied = relax.transform.MetaScheduleApplyDatabase()(fused)
    weights = _weight_tensors(mod, params)
    executable, wrong, compiled = _checked_build(fused, applied, tgt, prepack, inputs, weights)
    notes = (f"MetaSchedule tune_relax, {trials} trials, "
             f"weight pre-pack {'on' if prepack else 'off'}")
    if wrong:
        notes += f"; built untuned (their tuned programs compute wrong results): {wrong}"
    # a pre-packed kernel is named after its task plus this suffix
    tasks = {gv.name_hint for gv in fused.get_global_vars()}
    kinds = {name: kind_of(fused[task]) for name in kernel_calls(compiled)
             if (task := name.removesuffix("_prepacked")) in tasks}
    return _vm_baseline("metaschedule", executable, tgt, inputs, weights, notes, tuning=summary,
                        prepacked=prepack,
                        kernels=KernelSource(compiled, tgt, kinds))


def _checked_build(fused: tvm.IRModule, applied: tvm.IRModule, target: tvm.target.Target,
                   prepack: bool, inputs: Sequence[np.ndarray],
                   weights: list[tvm.runtime.Tensor]
                   ) -> tuple[tvm.runtime.Executable, list[str], tvm.IRModule]:
    """Compile ``applied`` (``fused`` with tuned schedules) and check it on ``inputs`` against
    ``fused`` compiled untuned. When they differ, each tuned function is tried alone on the
    untuned module, and those that change the result are built untuned: a wrong tuned program
    (e.g. MetaSchedule's layout rewrite of an embedding table read at a data-dependent row,
    which drops the row) is isolated instead of ending the run. Returns the executable, the
    names of the functions built untuned and the module compiled (weights pre-packed)."""
    def prepared(module: tvm.IRModule) -> tvm.IRModule:
        if not prepack:
            return module
        with target:
            return tvm.transform.Sequential([
                relax.transform.SplitLayoutRewritePreproc(),
                relax.transform.LiftTransformParams(),
                relax.transform.FoldConstant()])(module)

    def build(module: tvm.IRModule) -> tvm.runtime.Executable:
        return tvm.compile(prepared(module), target)

    def outputs(executable: tvm.runtime.Executable) -> list[np.ndarray]:
        vm = relax.VirtualMachine(executable, tvm.cpu(0))
        args = list(vm["main_transform_params"](weights)) if prepack else weights
        return _flatten(vm["main"](*(tvm.runtime.tensor(np.ascontiguousarray(x))
                                     for x in inputs), *args))

    def agrees(got: list[np.ndarray]) -> bool:
        return all(max_relative_error(a, b) <= 1e-4 for a, b in zip(got, expected))

    module = prepared(applied)
    executable = tvm.compile(module, target)
    expected = outputs(build(fused))
    if agrees(outputs(executable)):
        return executable, [], module
    tuned = [gv.name_hint for gv, func in applied.functions.items()
             if isinstance(func, tirx.PrimFunc)
             and not tvm_ffi.structural_equal(func, fused[gv.name_hint])]
    wrong = [name for name in tuned
             if not agrees(outputs(build(with_func(fused, name, applied[name]))))]
    for name in wrong:
        log.warning("metaschedule: the tuned %s computes wrong results; built untuned", name)
        applied = with_func(applied, name, fused[name])
    module = prepared(applied)
    executable = tvm.compile(module, target)
    if not agrees(outputs(executable)):
        raise WrongResultError("metaschedule: the tuned network computes wrong results, and no "
                               f"single tuned function explains it (tuned: {tuned})")
    return executable, wrong, module


def network_baseline(name: str, network: NetworkBuild, inputs: Sequence[np.ndarray],
                     notes: str = "", session: Any = None) -> Baseline:
    """A layout-transformed network (``altenv.graph.network.build_network``) as a
    :class:`Baseline`; its weights are already in their physical layouts. With ``session``
    it runs on that RPC session's device."""
    weights = [tvm.runtime.tensor(p, tvm.cpu(0)) for p in network.params]
    return _vm_baseline(name, network.built.executable, network.target, inputs, weights, notes,
                        kernels=KernelSource(network.mod, network.target, network.kinds),
                        session=session)


def _torch_module_setup(module: torch.nn.Module, inputs: list[np.ndarray]
                        ) -> tuple[Callable[[], object], Callable[[], list[np.ndarray]]]:
    """In the worker process: the eval-mode module bound to its inputs."""
    module = module.eval()
    tensors = [torch.from_numpy(np.ascontiguousarray(x)) for x in inputs]
    result: list[object] = []

    def run() -> None:
        with torch.inference_mode():
            result[:] = [module(*tensors)]

    def outputs() -> list[np.ndarray]:
        out = result[0]
        flat = out if isinstance(out, (tuple, list)) else (out,)
        return [t.numpy() for t in flat]

    return run, outputs


def torch_module_baseline(
    module: torch.nn.Module,
    inputs: Sequence[np.ndarray],
    *,
    target: TargetSpec = None,
) -> Baseline:
    """``module.forward`` in eval mode under ``torch.inference_mode``, with as many intra-op
    threads as the target has cores, in a worker process of its own (the module travels
    by cloudpickle; see :mod:`altenv.baselines.isolated`)."""
    threads = target_cores(make_target(target))
    worker = IsolatedRun(functools.partial(_torch_module_setup, module, list(inputs)), threads)
    return Baseline("torch", worker.run, worker.outputs, worker=worker,
                    notes=f"torch {torch.__version__} eager module, {threads} threads, "
                    "own process")

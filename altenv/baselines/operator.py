"""Operator baselines for one :class:`~altenv.ops.OpProgram`: MetaSchedule ``tune_tir`` with
an exact trial budget, TVM's untuned default lowering, and PyTorch eager."""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
import tvm
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.search_strategy import SearchStrategy

from ..measure import MeasureConfig, Measurer, as_module
from ..measure.check import random_array
from ..measure.metaschedule import metaschedule_session
from ..ops import EPILOGUE_INPUTS, OpProgram, generate
from ..ops.activation import torch_value
from ..ops.epilogue import parse_step
from ..ops.operators import Conv, MatMul, TransposedConv
from ..ops.workload import Workload
from ..target import make_target, target_cores, use_tvm_threads
from .base import (
    Baseline,
    NoValidMeasurementsError,
    TuningSummary,
    count_measurements,
    mean_run_seconds,
    untuned_rules,
)
from .deadline import DeadlineSearch
from .isolated import IsolatedRun

TargetSpec = str | dict[str, Any] | tvm.target.Target | None


def _tvm_baseline(name: str, program: OpProgram, executable: Any, target: tvm.target.Target,
                  raw: Mapping[str, np.ndarray] | None, seed: int, notes: str,
                  tuning: TuningSummary | None = None) -> Baseline:
    """Bind a compiled PrimFunc to the program's physical arguments (output pre-filled with
    random values, so a kernel that skips writes fails the check); TVM's thread pool gets
    the target's cores."""
    use_tvm_threads(target_cores(target))
    raw = raw if raw is not None else program.random_inputs(seed)
    args = program.physical_args(raw)
    args[-1] = random_array(np.random.default_rng(seed + 7), args[-1].shape, str(args[-1].dtype))
    dev = tvm.cpu(0)
    tensors = [tvm.runtime.tensor(a, dev) for a in args]
    func = executable["main"]
    out_layout = program.layouts["out"]

    def run() -> None:
        func(*tensors)

    def outputs() -> list[np.ndarray]:
        return [out_layout.invert(tensors[-1].numpy())]

    return Baseline(name, run, outputs, tuning=tuning, notes=notes)


def compiled_baseline(name: str, program: OpProgram, mod: tvm.IRModule | tvm.tirx.PrimFunc,
                      *, target: TargetSpec = None, seed: int = 0,
                      raw: Mapping[str, np.ndarray] | None = None, notes: str = "") -> Baseline:
    """Any scheduled version of ``program`` (e.g. altenv's best) as a :class:`Baseline`."""
    tgt = make_target(target)
    return _tvm_baseline(name, program, tvm.compile(mod, tgt), tgt, raw, seed, notes)


def tune_tir_baseline(
    program: OpProgram,
    work_dir: str | Path,
    max_trials: int,
    *,
    target: TargetSpec = None,
    config: MeasureConfig | None = None,
    num_trials_per_iter: int = 64,
    strategy: SearchStrategy.SearchStrategyType = "evolutionary",
    seed: int = 0,
    measurer: Measurer | None = None,
    raw: Mapping[str, np.ndarray] | None = None,
    seconds: float | None = None,
) -> Baseline:
    """Tune ``program.func`` with MetaSchedule's ``tune_tir`` for exactly ``max_trials``
    measured candidates (persistent-worker builder, ``LocalRunner`` with ``config``'s timing)
    and compile its best schedule. ``strategy`` is MetaSchedule's search strategy (its
    default evolutionary search unless given, e.g. a smaller population); an open
    ``measurer`` with ``config`` lends its workers
    (:func:`~altenv.measure.metaschedule.metaschedule_session`). With ``seconds`` the
    search also stops once it has tuned that long (:class:`DeadlineSearch`), whatever
    ``max_trials`` allows. Raises :class:`NoValidMeasurementsError` when no candidate was
    measured successfully (the tuning log is in ``work_dir/logs``)."""
    tgt = make_target(target)
    config = config or MeasureConfig()
    mod = as_module(program.func)
    start = time.perf_counter()
    if seconds is not None:
        inner = SearchStrategy.create(strategy) if isinstance(strategy, str) else strategy
        strategy = DeadlineSearch(inner, time.monotonic() + seconds)
    with metaschedule_session(config, tgt, measurer=measurer) as (builder, runner):
        database = ms.tune_tir(
            mod, tgt, str(work_dir), max_trials_global=max_trials,
            num_trials_per_iter=min(num_trials_per_iter, max_trials), builder=builder,
            runner=runner, num_tuning_cores=target_cores(tgt), seed=seed, strategy=strategy,
        )
    return tuned_tir_baseline(program, work_dir, target=tgt, seed=seed, raw=raw,
                              tuning_seconds=time.perf_counter() - start, database=database)


def tuned_tir_baseline(
    program: OpProgram,
    work_dir: str | Path,
    *,
    target: TargetSpec = None,
    seed: int = 0,
    raw: Mapping[str, np.ndarray] | None = None,
    tuning_seconds: float = math.nan,
    database: ms.database.Database | None = None,
) -> Baseline:
    """The best schedule of a finished ``tune_tir`` run (its JSON database in ``work_dir``,
    or ``database``), compiled. Raises :class:`NoValidMeasurementsError` when the run
    measured nothing valid."""
    tgt = make_target(target)
    if database is None:
        database = ms.database.JSONDatabase(work_dir=str(work_dir), allow_missing=False)
    trials, valid = count_measurements(database)
    if valid == 0:
        raise NoValidMeasurementsError(
            f"tune_tir on {program.workload}: {trials} candidates measured, none valid "
            f"(see {work_dir}/logs)")
    best = min(mean_run_seconds(r.run_secs) for r in database.get_all_tuning_records())
    sch = ms.tir_integration.compile_tir(database, as_module(program.func), tgt)
    summary = TuningSummary(trials, valid, best, tuning_seconds, str(work_dir))
    return _tvm_baseline("metaschedule", program, tvm.compile(sch.mod, tgt), tgt, raw, seed,
                         f"MetaSchedule tune_tir, {trials} trials", summary)


def untuned_tir_baseline(
    program: OpProgram,
    *,
    target: TargetSpec = None,
    seed: int = 0,
    raw: Mapping[str, np.ndarray] | None = None,
) -> Baseline:
    """``program.func`` as TVM builds it untuned: dlight's CPU reduction rule
    (:func:`.base.untuned_rules`), which matches few complex operators, then ``tvm.compile``'s
    default TIR lowering (a serial loop nest where no rule applied)."""
    tgt = make_target(target)
    with tgt:
        mod = untuned_rules()(as_module(program.func))
    return _tvm_baseline("tvm-default", program, tvm.compile(mod, tgt), tgt, raw, seed,
                         "tvm.compile, default TIR pipeline after dlight CPU reduction rule")


def torch_function(program: OpProgram) -> Callable[..., torch.Tensor]:
    """The PyTorch eager equivalent of ``program`` (operator and epilogue), taking the
    framework inputs ``data, weight`` and then ``bias``/``residual`` as the epilogue needs."""
    op = program.op
    F = torch.nn.functional
    if isinstance(op, Conv):
        conv = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[op.rank]

        def main(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
            return conv(x, w, stride=op.stride, padding=op.pad, dilation=op.dilation,
                        groups=op.groups)
    elif isinstance(op, TransposedConv):
        tconv = F.conv_transpose3d if op.rank == 3 else F.conv_transpose2d

        def main(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
            return tconv(x, w, stride=op.stride, padding=op.pad)
    elif isinstance(op, MatMul):
        main = torch.matmul
    else:
        raise ValueError(f"no torch equivalent for operator kind {op.kind!r}")
    steps = program.epilogue
    axis = op.channel_axis

    def fn(x: torch.Tensor, w: torch.Tensor, *extra: torch.Tensor) -> torch.Tensor:
        out = main(x, w)
        rest = iter(extra)
        for step in steps:
            if step == "bias":
                shape = [1] * out.dim()
                shape[axis] = -1
                out = out + next(rest).view(shape)
            elif step == "residual":
                out = out + next(rest)
            else:
                out = torch_value(parse_step(step), out)
        return out

    return fn


def _torch_operator_setup(workload: Workload, epilogue: tuple[str, ...],
                          raw: dict[str, np.ndarray]
                          ) -> tuple[Callable[[], object], Callable[[], list[np.ndarray]]]:
    """In the worker process: the torch eager operator bound to its inputs."""
    program = generate(workload, epilogue=epilogue)
    names = ["data", "weight"] + [s for s in epilogue if s in EPILOGUE_INPUTS]
    tensors = [torch.from_numpy(np.ascontiguousarray(raw[n])) for n in names]
    fn = torch_function(program)
    result: list[torch.Tensor] = []

    def run() -> None:
        with torch.inference_mode():
            result[:] = [fn(*tensors)]

    def outputs() -> list[np.ndarray]:
        return [result[0].numpy()]

    return run, outputs


def torch_operator_baseline(
    program: OpProgram,
    *,
    target: TargetSpec = None,
    seed: int = 0,
    raw: Mapping[str, np.ndarray] | None = None,
) -> Baseline:
    """PyTorch eager on the same framework inputs, with as many intra-op threads as the
    target has cores, under ``torch.inference_mode``, in a worker process of its own (see
    :mod:`altenv.baselines.isolated`)."""
    if program.op.dtype != "float32":
        raise ValueError(f"torch baseline: only float32 operators, got {program.op.dtype}")
    threads = target_cores(make_target(target))
    raw = raw if raw is not None else program.random_inputs(seed)
    worker = IsolatedRun(functools.partial(_torch_operator_setup, program.workload,
                                           tuple(program.epilogue), dict(raw)), threads)
    return Baseline("torch", worker.run, worker.outputs, worker=worker,
                    notes=f"torch {torch.__version__} eager, {threads} threads, own process")

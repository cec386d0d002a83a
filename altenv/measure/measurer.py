"""Measurers: build a batch in persistent workers, then time each build with a MetaSchedule
runner (``LocalRunner`` here, ``RPCRunner`` through a tracker). Every failure is recorded on
its own candidate; a batch never stops early."""

from __future__ import annotations

import math
import os
import re
import shutil
import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar, Literal

from tvm.ir import IRModule
from tvm.s_tir.meta_schedule.arg_info import ArgInfo
from tvm.s_tir.meta_schedule.builder import BuilderInput
from tvm.s_tir.meta_schedule.runner import (
    EvaluatorConfig,
    LocalRunner,
    RPCConfig,
    RPCRunner,
    Runner,
    RunnerInput,
)
from tvm.target import Target

from ..target import make_target, target_cores, use_tvm_threads
from .builder import PersistentBuilder
from .config import MeasureConfig
from .result import MeasureCandidate, MeasureResult
from .signals import sigint_blocked

_WRONG_RESULT = re.compile(r"WrongResultError: (wrong result \(max rel err [^)]*\))")


def device_type(target: Target) -> str:
    """Runtime device name of a target kind (``llvm`` runs on ``cpu``)."""
    kind = str(target.kind.name)
    return "cpu" if kind in ("llvm", "c") else kind


class Measurer(ABC):
    """Build candidates and time them on one kind of device.

    Parameters
    ----------
    config : MeasureConfig | None
        Timing and timeout settings (defaults: ``MeasureConfig()``).
    target : str | dict | Target | None
        Compilation target, resolved by :func:`altenv.target.make_target` (``None``: this CPU).
    """

    rpc: ClassVar[bool] = False

    def __init__(
        self,
        config: MeasureConfig | None = None,
        target: str | dict[str, Any] | Target | None = None,
    ) -> None:
        self.config = config or MeasureConfig()
        self.target = make_target(target)
        self.device_type = device_type(self.target)
        if self.device_type == "cpu":  # runner workers inherit the thread count
            use_tvm_threads(target_cores(self.target))
        self.evaluator_config = EvaluatorConfig(
            number=self.config.number,
            repeat=self.config.repeat,
            min_repeat_ms=self.config.min_repeat_ms,
            enable_cpu_cache_flush=self.config.enable_cpu_cache_flush,
        )
        self.builder = PersistentBuilder(
            max_workers=self.config.build_workers,
            timeout_sec=self.config.build_timeout,
            preload=self.config.builder_preload,
            max_process_uses=self.config.builder_max_uses,
        )
        with sigint_blocked():  # its worker starts now; Ctrl-C is for this process
            self.runner = self._make_runner()

    @abstractmethod
    def _make_runner(self) -> Runner:
        """The MetaSchedule runner this measurer times with."""

    def measure(self, candidates: Sequence[MeasureCandidate]) -> list[MeasureResult]:
        """Build all candidates in parallel, then run them one by one; one result each."""
        return [rounds[0] for rounds in self.retime(candidates, rounds=1)]

    def retime(self, candidates: Sequence[MeasureCandidate], rounds: int, cold: bool = False
               ) -> list[list[MeasureResult]]:
        """Build all candidates in parallel once, then run every built one ``rounds`` times,
        interleaved (the order rotates each round, so drifts of the host's speed hit all
        alike); ``rounds`` results per candidate (a failed build fails every round).

        With ``cold`` (CPU devices; ignored elsewhere) each of a round's ``repeat`` latencies
        is one call right after every argument but the first was flushed from the caches
        (MetaSchedule's ``enable_cpu_cache_flush`` with ``number=1``): a kernel as a network
        calls it, its weights last touched one network run ago, its data just written."""
        # MetaSchedule's Local and RPC runners read ``evaluator_config`` each time an input
        # is submitted (as ``f_run_evaluator``, see _run), so it can be swapped per re-timing
        runner_config = self.runner.evaluator_config
        if cold and self.device_type == "cpu":
            self.runner.evaluator_config = EvaluatorConfig(
                number=1, repeat=self.config.repeat, min_repeat_ms=0,
                enable_cpu_cache_flush=True)
        try:
            return self._retime(candidates, rounds)
        finally:
            self.runner.evaluator_config = runner_config

    def _retime(self, candidates: Sequence[MeasureCandidate], rounds: int
                ) -> list[list[MeasureResult]]:
        mods = [candidate.mod for candidate in candidates]
        built = self.builder.build([BuilderInput(mod, self.target) for mod in mods])
        build_seconds = list(self.builder.last_build_seconds)
        results: list[list[MeasureResult]] = []
        for build, seconds in zip(built, build_seconds, strict=True):
            failed = build.error_msg is not None
            results.append([MeasureResult(error=str(build.error_msg), build_seconds=seconds)
                            for _ in range(rounds)] if failed else [])
        ok = [i for i, build in enumerate(built) if build.error_msg is None]
        try:
            for r in range(rounds if ok else 0):
                for i in ok[r % len(ok):] + ok[:r % len(ok)]:
                    result = self._run(candidates[i], mods[i], str(built[i].artifact_path))
                    result.build_seconds = build_seconds[i] if r == 0 else 0.0
                    results[i].append(result)
        finally:
            for i in ok:
                shutil.rmtree(os.path.dirname(str(built[i].artifact_path)), ignore_errors=True)
        return results

    def _run(self, candidate: MeasureCandidate, mod: IRModule, artifact: str) -> MeasureResult:
        args_info = ArgInfo.from_entry_func(mod)
        evaluator = None
        if candidate.check is not None:
            signature = [tuple(info.as_json()[1:3]) for info in args_info]
            try:
                evaluator = candidate.check.evaluator(signature, rpc=self.rpc)
            except Exception as err:  # noqa: BLE001 (a bad reference fails this candidate only)
                return MeasureResult(error=f"correctness reference failed: {err!r}")
        # Both MetaSchedule runners read ``f_run_evaluator`` when an input is submitted.
        self.runner.f_run_evaluator = evaluator
        start = time.perf_counter()
        (future,) = self.runner.run([RunnerInput(artifact, self.device_type, args_info)])
        outcome = future.result()
        elapsed = time.perf_counter() - start
        if outcome.error_msg is not None:
            error = str(outcome.error_msg)
            wrong = _WRONG_RESULT.search(error)
            return MeasureResult(error=wrong.group(1) if wrong else error, run_seconds=elapsed)
        latencies = [float(x) for x in outcome.run_secs]
        return MeasureResult(latencies=latencies, run_seconds=elapsed)

    def close(self) -> None:
        """Stop builder and runner worker processes."""
        self.builder.shutdown()
        self.runner.pool.shutdown(wait=True)

    def __enter__(self) -> Measurer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class LocalMeasurer(Measurer):
    """Times candidates on this host with MetaSchedule's ``LocalRunner`` (one persistent
    worker process; a crash or a timeout kills and restarts it)."""

    def _make_runner(self) -> Runner:
        return LocalRunner(
            timeout_sec=self.config.run_timeout,
            evaluator_config=self.evaluator_config,
        )


class RPCMeasurer(Measurer):
    """Times candidates on remote devices found through a TVM RPC tracker
    (``config.rpc``), with MetaSchedule's ``RPCRunner``; the run timeout is the session
    timeout."""

    rpc: ClassVar[bool] = True

    def _make_runner(self) -> Runner:
        settings = self.config.rpc
        if settings is None:
            raise ValueError("RPC measurement needs measure.rpc: {tracker: 'host:port', key: ...}")
        return RPCRunner(
            rpc_config=RPCConfig(
                tracker_host=settings.host,
                tracker_port=settings.port,
                tracker_key=settings.key,
                session_priority=settings.priority,
                session_timeout_sec=math.ceil(self.config.run_timeout),
            ),
            evaluator_config=self.evaluator_config,
            max_workers=settings.max_workers,
        )


def create(
    kind: Literal["local", "rpc"] | None = None,
    config: MeasureConfig | None = None,
    target: str | dict[str, Any] | Target | None = None,
) -> Measurer:
    """Make a measurer by alias; ``kind=None`` picks ``"rpc"`` when ``config.rpc`` is set."""
    config = config or MeasureConfig()
    kind = kind or ("rpc" if config.rpc is not None else "local")
    if kind == "local":
        return LocalMeasurer(config, target)
    if kind == "rpc":
        return RPCMeasurer(config, target)
    raise ValueError(f"measurer kind must be 'local' or 'rpc', got {kind!r}")

"""Measurers: build a batch in persistent workers, then time each build with a MetaSchedule
runner (``LocalRunner`` here, one candidate after another; ``RPCRunner`` on every device
behind a tracker key at once, a :class:`FleetMeasurer`). Every failure is recorded on its
own candidate; a batch never stops early."""

from __future__ import annotations

import os
import re
import shutil
import threading
import time
import warnings
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar, Literal

from tvm.ir import IRModule
from tvm.rpc import connect_tracker
from tvm.s_tir.meta_schedule.arg_info import ArgInfo
from tvm.s_tir.meta_schedule.builder import BuilderInput
from tvm.s_tir.meta_schedule.runner import (
    EvaluatorConfig,
    RPCRunner,
    Runner,
    RunnerInput,
)
from tvm.target import Target

from ..target import device_type, make_target, target_cores, use_tvm_threads
from .builder import PersistentBuilder
from .chains import ChainTimer, local_timer, time_chains
from .check import CheckedEvaluator
from .config import MeasureConfig, RPCSettings
from .fleet import DeviceLost, Fleet
from .pool import LeanLocalRunner, worker_pool
from .result import MeasureCandidate, MeasureResult
from .signals import sigint_blocked

_DROPPED = re.compile(r"RPCCode::kReturn|connection (reset|refused|closed)|broken pipe|"
                      r"socket error|cannot connect", re.IGNORECASE)
"""Errors of an RPC session whose device went away (the candidate was not timed)."""
_WRONG_RESULT = re.compile(r"WrongResultError: (wrong result \(max rel err [^)]*\))")


def time_artifact(runner: Runner, device: str, args_info: list[ArgInfo], artifact: str,
                  timing: EvaluatorConfig, evaluator: Any = None) -> MeasureResult:
    """Time one built artifact with a MetaSchedule runner; ``timing`` and ``evaluator`` (a
    checking ``f_run_evaluator`` or ``None``) are read by MetaSchedule's Local and RPC
    runners each time an input is submitted."""
    runner.evaluator_config, runner.f_run_evaluator = timing, evaluator
    start = time.perf_counter()
    (future,) = runner.run([RunnerInput(artifact, device, args_info)])
    outcome = future.result()
    elapsed = time.perf_counter() - start
    if outcome.error_msg is not None:
        error = str(outcome.error_msg)
        wrong = _WRONG_RESULT.search(error)
        return MeasureResult(error=wrong.group(1) if wrong else error, run_seconds=elapsed)
    return MeasureResult(latencies=[float(x) for x in outcome.run_secs], run_seconds=elapsed)


Job = tuple[MeasureCandidate, IRModule, str, EvaluatorConfig]
"""A built candidate to time: the candidate, its module, its artifact, the timing."""


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
        self.builder = self._make_builder()
        with sigint_blocked():  # its worker starts now; Ctrl-C is for this process
            self.runner = self._make_runner()

    def _make_builder(self) -> Any:
        """The builder of candidates: a MetaSchedule ``Builder`` with ``build_timed``
        and ``shutdown()``."""
        return PersistentBuilder(
            max_workers=self.config.build_workers,
            timeout_sec=self.config.build_timeout,
            preload=self.config.builder_preload,
            max_process_uses=self.config.builder_max_uses,
        )

    @abstractmethod
    def _make_runner(self) -> Any:
        """What this measurer times with (a MetaSchedule runner, a device actor)."""

    def chain_timer(self) -> ChainTimer:
        """How a network's stages after tuning (the in-network and read-through choices)
        time chains of kernels: on the device this measurer times candidates on."""
        return local_timer(self.target)

    def metaschedule_pair(self) -> tuple[Any, Runner] | None:
        """This measurer's builder and runner for a MetaSchedule tuning call
        (:func:`~altenv.measure.metaschedule.metaschedule_session`), set to time with its
        settings and MetaSchedule's own evaluator; their workers are already running, so a
        model run's other kernels and a bench's MetaSchedule cells start none of their own.
        ``None`` where this measurer does not time with a MetaSchedule runner of its own
        (several devices, a cluster)."""
        return None

    def device_session(self) -> Any:
        """A TVM RPC session on the device this measurer times candidates on, for a
        network's final check and timing; ``None`` when that device is this host's."""
        return None

    @property
    def timed_on(self) -> str | None:
        """Where candidates are timed when not on this host (``None``): a dataset's card
        says so, and a collection heeds this host's other work only when it is ``None``."""
        return None

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
        timing = self.evaluator_config
        if cold and self.device_type == "cpu":
            timing = EvaluatorConfig(number=1, repeat=self.config.repeat, min_repeat_ms=0,
                                     enable_cpu_cache_flush=True)
        mods = [candidate.mod for candidate in candidates]
        built, build_seconds = self.builder.build_timed(
            [BuilderInput(mod, self.target) for mod in mods])
        results: list[list[MeasureResult]] = []
        for build, seconds in zip(built, build_seconds, strict=True):
            failed = build.error_msg is not None
            results.append([MeasureResult(error=str(build.error_msg), build_seconds=seconds)
                            for _ in range(rounds)] if failed else [])
        ok = [i for i, build in enumerate(built) if build.error_msg is None]
        try:
            for r in range(rounds if ok else 0):
                order = ok[r % len(ok):] + ok[:r % len(ok)]
                timed = self._time([(candidates[i], mods[i], str(built[i].artifact_path),
                                     timing) for i in order])
                for i, result in zip(order, timed, strict=True):
                    result.build_seconds = build_seconds[i] if r == 0 else 0.0
                    results[i].append(result)
        finally:
            for i in ok:
                shutil.rmtree(os.path.dirname(str(built[i].artifact_path)), ignore_errors=True)
        return results

    def _time(self, jobs: Sequence[Job]) -> list[MeasureResult]:
        """Time built candidates, one after another."""
        return [self._run(self.runner, job) for job in jobs]

    def _run(self, runner: Any, job: Job) -> MeasureResult:
        candidate, mod, artifact, timing = job
        args_info = ArgInfo.from_entry_func(mod)
        evaluator = None
        if candidate.check is not None:
            signature = [tuple(info.as_json()[1:3]) for info in args_info]
            try:
                evaluator = candidate.check.evaluator(signature, rpc=self.rpc)
            except Exception as err:  # noqa: BLE001 (a bad reference fails this candidate only)
                return MeasureResult(error=f"correctness reference failed: {err!r}")
        return self._time_one(runner, args_info, artifact, timing, evaluator)

    def _time_one(self, runner: Any, args_info: list[ArgInfo], artifact: str,
                  timing: EvaluatorConfig, evaluator: CheckedEvaluator | None
                  ) -> MeasureResult:
        """Time one built, checked candidate on ``runner``."""
        return time_artifact(runner, self.device_type, args_info, artifact, timing, evaluator)

    def close(self) -> None:
        """Stop builder and runner worker processes."""
        self.builder.shutdown()
        self._close_runner(self.runner, wait=True)

    def _close_runner(self, runner: Any, wait: bool) -> None:
        """Stop one runner's worker (``wait``: until it is gone)."""
        runner.pool.shutdown(wait=wait)

    def __enter__(self) -> Measurer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class LocalMeasurer(Measurer):
    """Times candidates on this host with MetaSchedule's ``LocalRunner`` (one persistent
    worker process; a crash or a timeout kills and restarts it)."""

    def _make_runner(self) -> Runner:
        return LeanLocalRunner(
            timeout_sec=self.config.run_timeout,
            evaluator_config=self.evaluator_config,
        )

    def metaschedule_pair(self) -> tuple[PersistentBuilder, Runner]:
        self.runner.evaluator_config, self.runner.f_run_evaluator = self.evaluator_config, None
        return self.builder, self.runner


class FleetMeasurer(Measurer):
    """A measurer over several devices (:class:`~altenv.measure.fleet.Fleet`): the
    candidates of every batch in flight are timed on all devices at once, one candidate per
    device; a device that drops mid-batch (its run raises
    :class:`~altenv.measure.fleet.DeviceLost`) has its candidate timed on another and is
    replaced before the next batch. Runners are kept across batches (their workers take
    seconds to start); :attr:`runner` is the first one."""

    def __init__(self, config: MeasureConfig | None = None,
                 target: str | dict[str, Any] | Target | None = None) -> None:
        self.fleet = Fleet(self._run_or_lose)
        self._growing = threading.Lock()
        super().__init__(config, target)
        self.fleet.add(self.runner)

    @abstractmethod
    def devices(self) -> int:
        """How many devices can measure at once now."""

    def _time(self, jobs: Sequence[Job]) -> list[MeasureResult]:
        with self._growing:  # replace lost devices, add new ones, up to what the batch uses
            for lost in self.fleet.lost:
                self._close_runner(lost, wait=False)
            self.fleet.lost.clear()
            while len(self.fleet.devices) < min(self.devices(), len(jobs)):
                with sigint_blocked():
                    self.fleet.add(self._make_runner())
        results = self.fleet.measure(jobs)
        if self.fleet.lost:
            warnings.warn(f"{len(self.fleet.lost)} measuring device(s) dropped; their "
                          "candidates were timed on the others", stacklevel=3)
        return results

    def _run_or_lose(self, runner: Any, job: Job) -> MeasureResult:
        result = self._run(runner, job)
        if result.error is not None and _DROPPED.search(result.error):
            raise DeviceLost(result.error.strip().splitlines()[-1])
        return result

    def close(self) -> None:
        """Stop the builder and every device's worker."""
        self.builder.shutdown()
        for runner in self.fleet.devices + self.fleet.lost:
            self._close_runner(runner, wait=True)


class RPCMeasurer(FleetMeasurer):
    """Times candidates on the remote devices behind a TVM RPC tracker key
    (``config.rpc``), with MetaSchedule's ``RPCRunner``: all of them at once, one candidate
    per device. The run timeout is the session timeout; the client gives up on a session
    ``rpc.connect_timeout`` seconds after it."""

    rpc: ClassVar[bool] = True

    def _settings(self) -> RPCSettings:
        if self.config.rpc is None:
            raise ValueError("RPC measurement needs measure.rpc: {tracker: 'host:port', key: ...}")
        return self.config.rpc

    def _make_runner(self) -> Runner:
        runner = RPCRunner(rpc_config=self._settings().session_config(self.config.run_timeout),
                           evaluator_config=self.evaluator_config)
        # the client-side timeout: MetaSchedule's pool kills a worker stuck past it
        runner.pool.shutdown(wait=True)
        runner.pool = worker_pool(
            max_workers=1, timeout=self.config.run_timeout + self.config.rpc.connect_timeout)
        return runner

    def chain_timer(self) -> ChainTimer:
        """Chains timed on one device behind the tracker key, a session per call (the
        tracker hands it out when no candidate is on it), which may last ``run_timeout``
        seconds per chain."""

        def timer(chains, rounds: int, seed: int):
            session = self._session(self.config.run_timeout * (len(chains) + 1))
            return time_chains(chains, self.target, rounds, seed, session)

        return timer

    def device_session(self) -> Any:
        """A session on one device behind the tracker key, which may last ten times
        ``run_timeout``."""
        return self._session(10 * self.config.run_timeout)

    def _session(self, seconds: float) -> Any:
        return self._settings().session_config(seconds).connect_server()

    @property
    def timed_on(self) -> str:
        """The tracker and key of the devices."""
        return f"rpc tracker {self.config.rpc.tracker}, key {self.config.rpc.key}"

    def devices(self) -> int:
        """The servers registered at the tracker under the key (``rpc.max_workers``, when
        set, caps them)."""
        settings = self.config.rpc
        summary = connect_tracker(settings.host, settings.port).summary()
        count = sum(1 for s in summary["server_info"] if s["key"] == f"server:{settings.key}")
        return min(count, settings.max_workers or count)


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

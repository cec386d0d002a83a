"""The Ray measurer: builds as Ray tasks spread over the cluster's CPUs, each measuring
device owned by one Ray actor (one per unit of the ``device_resource`` the cluster's nodes
offer), which times one candidate at a time with the run's timing settings.

Programs travel as TVM JSON, built artifacts as bytes (nodes share no disk). A build task
whose worker dies is retried by Ray (``max_retries``); a device actor that dies mid-batch
has its candidate timed on another device (:class:`~altenv.measure.FleetMeasurer`) and is
replaced for the next batch by one Ray places wherever the resource is left.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import ray
import tvm
from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError, WorkerCrashedError
from tvm.ir.utils import derived_object
from tvm.s_tir.meta_schedule.arg_info import ArgInfo
from tvm.s_tir.meta_schedule.builder import BuilderInput, BuilderResult, PyBuilder
from tvm.s_tir.meta_schedule.runner import EvaluatorConfig
from tvm.target import Target

from ..measure import MeasureConfig, MeasureResult
from ..measure.builder import build_and_export
from ..measure.chains import ChainTimer, time_chains
from ..measure.check import CheckedEvaluator
from ..measure.fleet import DeviceLost
from ..measure.measurer import FleetMeasurer, time_artifact
from ..measure.pool import LeanLocalRunner
from ..measure.timing import TimingStats
from ..target import target_cores, use_tvm_threads
from .settings import RaySettings

BUILD_START_SECONDS = 120.0
"""Seconds a build task may wait for a worker and its TVM import, on top of the build
timeout."""
PROBE_SECONDS = 5.0
"""Seconds a device actor has to answer, when it is stopped, before it is taken for hung."""


def _build(mod_json: str, target: dict[str, Any]) -> tuple[bytes, float]:
    """Ray task: build a program for a target; the exported artifact's bytes and the
    compile seconds."""
    artifact, seconds = build_and_export(tvm.ir.load_json(mod_json), Target(target))
    try:
        return Path(artifact).read_bytes(), seconds
    finally:
        os.remove(artifact)
        os.rmdir(os.path.dirname(artifact))


@derived_object
class RayBuilder(PyBuilder):
    """A MetaSchedule builder whose builds are Ray tasks (``cpus`` each); artifacts land in
    a temporary directory of this process, as MetaSchedule's builders leave them."""

    def __init__(self, timeout_sec: float, cpus: float) -> None:
        super().__init__()
        self.timeout_sec = timeout_sec
        self.task = ray.remote(_build).options(num_cpus=cpus, max_retries=3)

    def build(self, build_inputs: list[BuilderInput]) -> list[BuilderResult]:
        """Build a batch on the cluster; failures and timeouts become ``error_msg``."""
        return self.build_timed(build_inputs)[0]

    def build_timed(self, build_inputs: list[BuilderInput]
                    ) -> tuple[list[BuilderResult], list[float]]:
        """:meth:`build` returning the compile seconds (0.0 when failed) too."""
        refs = [self.task.remote(tvm.ir.save_json(inp.mod), inp.target.export())
                for inp in build_inputs]
        index = {ref: i for i, ref in enumerate(refs)}
        results: list[BuilderResult] = [BuilderResult(None, "RayBuilder: not built")] * len(refs)
        seconds = [0.0] * len(refs)
        waiting = list(refs)
        while waiting:  # each round, at least one build must finish in time
            ready, waiting = ray.wait(waiting, num_returns=1,
                                      timeout=self.timeout_sec + BUILD_START_SECONDS)
            if not ready:
                for ref in waiting:
                    ray.cancel(ref, force=True)
                    results[index[ref]] = BuilderResult(
                        None, f"RayBuilder: Timeout, killed after {self.timeout_sec} seconds")
                break
            (ref,) = ready
            try:
                data, elapsed = ray.get(ref)
            except (RayTaskError, WorkerCrashedError) as err:
                results[index[ref]] = BuilderResult(
                    None, f"RayBuilder: An exception occurred\n{err}")
                continue
            folder = tempfile.mkdtemp(prefix="altenv-ray-")
            artifact = os.path.join(folder, "tvm_tmp_mod.tar")
            Path(artifact).write_bytes(data)
            results[index[ref]] = BuilderResult(artifact, None)
            seconds[index[ref]] = elapsed
        return results, seconds

    def shutdown(self) -> None:
        """Nothing runs between batches."""


class Device:
    """Ray actor: one measuring device, timing one candidate at a time with MetaSchedule's
    ``LocalRunner`` (its worker process is killed and restarted on a crash or timeout)."""

    def __init__(self, timeout_sec: float, target: dict[str, Any]) -> None:
        target = self.target = Target(target)
        if str(target.kind.name) in ("llvm", "c"):
            use_tvm_threads(target_cores(target))
        self.runner = LeanLocalRunner(timeout_sec=timeout_sec)
        self.checks: dict[str, bytes] = {}
        self.actor = ray.get_runtime_context().get_actor_id()

    def node(self) -> str:
        """The Ray node this device is on."""
        return ray.get_runtime_context().get_node_id()

    def time(self, artifact: bytes, device: str, args_info: list[Any], timing: dict[str, Any],
             check: tuple[str, ray.ObjectRef, float] | None) -> MeasureResult:
        """Time one built artifact; ``check``: ``(name, object ref of the .npz bytes, rtol)``
        of its correctness data (inside a tuple, Ray passes the ref unresolved: a device
        fetches each check's data once, by name)."""
        # a path of its own, as a builder's artifacts have: the runner's worker links a
        # .tar to PATH.so and loads it, and the loader hands back the module it already
        # loaded from that path (every candidate would time the device's first). Nothing
        # outlives the call: Ray kills an actor without running its cleanup. The name tells
        # whose folder it is (one an actor left when killed mid-call, or one being written).
        folder = tempfile.mkdtemp(prefix=f"altenv-device-{self.actor}-")
        path = os.path.join(folder, "mod.tar")
        Path(path).write_bytes(artifact)
        evaluator = None
        if check is not None:
            name, data, rtol = check
            if name not in self.checks:
                self.checks[name] = ray.get(data)
            check_file = os.path.join(folder, "check.npz")
            Path(check_file).write_bytes(self.checks[name])
            evaluator = CheckedEvaluator(check_file, rtol, rpc=False)
        try:
            return time_artifact(self.runner, device, [ArgInfo.from_json(a) for a in args_info],
                                 path, EvaluatorConfig(**timing), evaluator)
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    def time_chains(self, chains: dict[Any, list[str]], rounds: int, seed: int
                    ) -> dict[Any, TimingStats]:
        """Chains of kernels (TVM JSON of PrimFuncs) timed on this device
        (:func:`~altenv.measure.chains.time_chains`)."""
        return time_chains({key: [tvm.ir.load_json(f) for f in funcs]
                            for key, funcs in chains.items()}, self.target, rounds, seed)


class RayMeasurer(FleetMeasurer):
    """Builds with :class:`RayBuilder` and times on every device of the cluster at once
    (:class:`Device` actors, one per unit of ``settings.device_resource``).

    Parameters
    ----------
    settings : RaySettings
        The cluster (already joined, :func:`~altenv.cluster.connect`).
    config, target
        As :class:`~altenv.measure.Measurer` takes them (``build_workers`` and the
        builder's preload are Ray's business here).
    """

    def __init__(self, settings: RaySettings, config: MeasureConfig | None = None,
                 target: str | dict[str, Any] | Target | None = None) -> None:
        self.settings = settings
        self._checks: dict[str, ray.ObjectRef] = {}
        self._actor = ray.remote(Device).options(
            num_cpus=0, resources={settings.device_resource: 1}, max_restarts=0)
        super().__init__(config, target)

    def _make_builder(self) -> RayBuilder:
        return RayBuilder(self.config.build_timeout, self.settings.build_cpus)

    def _make_runner(self) -> Any:
        return self._actor.remote(self.config.run_timeout, self.target.export())

    def chain_timer(self) -> ChainTimer:
        """Chains timed by an idle device actor (another one if it dies)."""

        def on(actor: Any, chains: dict[Any, list[str]], rounds: int, seed: int
               ) -> dict[Any, TimingStats]:
            try:
                return ray.get(actor.time_chains.remote(chains, rounds, seed),
                               timeout=self.config.run_timeout * (len(chains) + 1)
                               + BUILD_START_SECONDS)
            except RayActorError as err:
                raise DeviceLost(f"Ray device actor died: {err.__class__.__name__}") from None
            except GetTimeoutError:
                raise DeviceLost("Ray device actor silent while timing chains") from None

        def timer(chains, rounds: int, seed: int) -> dict[Any, TimingStats]:
            texts = {key: [tvm.ir.save_json(f) for f in funcs] for key, funcs in chains.items()}
            return self.fleet.call(lambda actor: on(actor, texts, rounds, seed))

        return timer

    def devices(self) -> int:
        """Units of the device resource the cluster's live nodes offer."""
        return int(ray.cluster_resources().get(self.settings.device_resource, 0))

    @property
    def timed_on(self) -> str | None:
        """The cluster's address; ``None`` for ``local``, whose one device is this host (its
        actors are this process's descendants, as the collection's own workers are)."""
        return None if self.settings.address == "local" else f"ray cluster {self.settings.address}"

    def _time_one(self, runner: Any, args_info: list[ArgInfo], artifact: str,
                  timing: EvaluatorConfig, evaluator: CheckedEvaluator | None
                  ) -> MeasureResult:
        check = None
        if evaluator is not None:  # the driver puts each check's data in the store once
            name = evaluator.data_file
            if name not in self._checks:
                self._checks[name] = ray.put(Path(name).read_bytes())
            check = (name, self._checks[name], evaluator.rtol)
        start = time.perf_counter()
        ref = runner.time.remote(
            Path(artifact).read_bytes(), self.device_type, [a.as_json() for a in args_info],
            {"number": timing.number, "repeat": timing.repeat,
             "min_repeat_ms": timing.min_repeat_ms,
             "enable_cpu_cache_flush": timing.enable_cpu_cache_flush}, check)
        try:
            # the device's own runner times out first; this is for a device that hangs
            return ray.get(ref, timeout=self.config.run_timeout + BUILD_START_SECONDS)
        except RayActorError as err:
            raise DeviceLost(f"Ray device actor died: {err.__class__.__name__}") from None
        except GetTimeoutError:
            raise DeviceLost(f"Ray device actor silent for {time.perf_counter() - start:.0f} "
                             "s") from None

    def _close_runner(self, runner: Any, wait: bool) -> None:
        """Stop a device's actor, unless it already died (with its node): Ray 2's
        ``ray.kill`` of an actor whose death the driver has processed fails a C++ check
        and aborts the driver. A device that does not answer within a few seconds is hung
        and killed."""
        try:
            ray.get(runner.node.remote(), timeout=PROBE_SECONDS)
        except RayActorError:
            return
        except GetTimeoutError:
            pass
        ray.kill(runner)



"""A MetaSchedule builder whose worker processes persist across batches.

MetaSchedule's ``LocalBuilder`` starts a fresh process pool for every batch and its default
build function imports ``tvm.s_tir.tensor_intrin`` inside the timed region; on a 2-core
machine that import alone outlasts the default 30 s timeout (DESIGN.md, "start-up trap").
``PersistentBuilder`` keeps one ``PopenPoolExecutor`` alive, makes every worker import
``builder_preload`` once in the (untimed) pool initializer, and times only the compilation.
It is a regular MetaSchedule ``Builder`` and can be handed to ``tune_tir`` as well.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Sequence

import tvm
from tvm.ir import IRModule
from tvm.ir.utils import derived_object
from tvm.s_tir.meta_schedule.builder import BuilderInput, BuilderResult, PyBuilder
from tvm.s_tir.meta_schedule.builder.local_builder import default_export
from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock
from tvm.support.popen_pool import StatusKind
from tvm.target import Target

from .pool import worker_pool


def preload_modules(modules: Sequence[str]) -> None:
    """Pool initializer: import ``modules`` once per worker, before any timed build."""
    for name in modules:
        importlib.import_module(name)


def build_and_export(mod: IRModule, target: Target) -> tuple[str, float]:
    """Worker function: compile ``mod`` for ``target``, export a tarball; returns
    ``(artifact_path, build_seconds)``. Mirrors MetaSchedule's ``default_build`` without
    its per-build ``tensor_intrin`` import (built modules no longer need the registry)."""
    start = time.perf_counter()
    mod = RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod)
    artifact = default_export(tvm.driver.build(mod, target=target))
    return artifact, time.perf_counter() - start


@derived_object
class PersistentBuilder(PyBuilder):
    """Builds candidates in long-lived Popen workers.

    Parameters
    ----------
    max_workers : int
        Number of worker processes.
    timeout_sec : float
        Limit for one build; a worker that exceeds it is killed and lazily restarted.
    preload : Sequence[str]
        Modules each worker imports once when it starts (not counted against the timeout).
    max_process_uses : int | None
        Recycle a worker after this many builds; ``None`` keeps it until it dies.

    Workers leave Ctrl-C to the main process (:mod:`altenv.measure.signals`).
    """

    def __init__(
        self,
        max_workers: int,
        timeout_sec: float,
        preload: Sequence[str] = (),
        max_process_uses: int | None = None,
    ) -> None:
        super().__init__()
        self.timeout_sec = timeout_sec
        self.pool = worker_pool(
            max_workers=max_workers,
            timeout=timeout_sec,
            initializer=preload_modules,
            initargs=(tuple(preload),),
            maximum_process_uses=max_process_uses,
        )

    def build(self, build_inputs: list[BuilderInput]) -> list[BuilderResult]:
        """Build a batch; failures and timeouts become ``BuilderResult.error_msg``."""
        return self.build_timed(build_inputs)[0]

    def build_timed(self, build_inputs: list[BuilderInput]
                    ) -> tuple[list[BuilderResult], list[float]]:
        """:meth:`build` returning each candidate's compile seconds (0.0 when failed) with
        the results (safe when several threads build at once)."""
        for build_input in build_inputs:
            if build_input.params is not None:
                raise ValueError("PersistentBuilder builds TIR candidates; params are unsupported")
        results: list[BuilderResult] = []
        seconds: list[float] = []
        jobs = [(inp.mod, inp.target) for inp in build_inputs]
        for item in self.pool.map_with_error_catching(lambda job: build_and_export(*job), jobs):
            if item.status == StatusKind.COMPLETE:
                artifact, elapsed = item.value
                results.append(BuilderResult(artifact, None))
                seconds.append(elapsed)
                continue
            if item.status == StatusKind.TIMEOUT:
                msg = f"PersistentBuilder: Timeout, killed after {self.timeout_sec} seconds"
            else:
                msg = f"PersistentBuilder: An exception occurred\n{item.value}"
            results.append(BuilderResult(None, msg))
            seconds.append(0.0)
        return results, seconds

    def worker_pids(self) -> set[int]:
        """Process ids of the live workers (for checking that they persist across batches)."""
        workers = self.pool._worker_map.values()  # PopenPoolExecutor keeps one worker a thread
        return {w._proc.pid for w in workers if w.is_alive()}

    def shutdown(self) -> None:
        """Kill the worker processes."""
        self.pool.shutdown(wait=True)

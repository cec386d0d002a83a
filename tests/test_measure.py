"""Measurer: batches with crashing, hanging, unbuildable and wrong candidates; persistent
builder workers; correctness checks; RPC measurement through a loopback tracker."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator

import numpy as np
import pytest
import tvm
import yaml
from pydantic import ValidationError
from tvm import te
from tvm.rpc.client import RPCSession
from tvm.s_tir import Schedule
from tvm.s_tir.meta_schedule.builder import BuilderInput
from tvm.script import tirx as T

from altenv.measure import (
    CorrectnessCheck,
    LocalMeasurer,
    MeasureCandidate,
    MeasureConfig,
    RPCMeasurer,
    RPCSettings,
    create,
)
from altenv.measure.check import max_relative_error
from altenv.measure.signals import sigint_deferred

FAST = {"number": 2, "repeat": 3, "min_repeat_ms": 1}


def matmul(n: int = 64) -> tvm.tirx.PrimFunc:
    a = te.placeholder((n, n), name="A")
    b = te.placeholder((n, n), name="B")
    k = te.reduce_axis((0, n), name="k")
    c = te.compute((n, n), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")
    return te.create_prim_func([a, b, c])


def conv2d(n: int = 1, ci: int = 8, hw: int = 10, co: int = 8, kk: int = 3) -> tvm.tirx.PrimFunc:
    x = te.placeholder((n, ci, hw, hw), name="X")
    w = te.placeholder((co, ci, kk, kk), name="W")
    rc = te.reduce_axis((0, ci), name="rc")
    rh = te.reduce_axis((0, kk), name="rh")
    rw = te.reduce_axis((0, kk), name="rw")
    out = hw - kk + 1
    y = te.compute(
        (n, co, out, out),
        lambda b, o, h, v: te.sum(x[b, rc, h + rh, v + rw] * w[o, rc, rh, rw], axis=[rc, rh, rw]),
        name="Y",
    )
    return te.create_prim_func([x, w, y])


def conv2d_ref(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    kk = w.shape[2]
    out = x.shape[2] - kk + 1
    windows = np.lib.stride_tricks.sliding_window_view(x, (kk, kk), axis=(2, 3))
    assert windows.shape[2] == out
    return np.einsum("bchwij,ocij->bohw", windows, w)


def tiled_matmul(factor: int) -> Schedule:
    sch = Schedule(matmul())
    i, j, _ = sch.get_loops(sch.get_sblock("C"))
    _, ji = sch.split(j, [None, factor])
    sch.vectorize(ji)
    sch.parallel(i)
    return sch


def unbuildable() -> Schedule:
    """GPU thread binding on an LLVM target: the code generator rejects it."""
    sch = Schedule(matmul())
    i, _, _ = sch.get_loops(sch.get_sblock("C"))
    sch.bind(i, "threadIdx.x")
    return sch


@T.prim_func
def out_of_bounds(
    A: T.Buffer((64, 64), "float32"), B: T.Buffer((64, 64), "float32"),
    C: T.Buffer((64, 64), "float32"),
):
    T.func_attr({"global_symbol": "main", "tir.noalias": True})
    far = T.decl_buffer((1 << 40,), "float32", data=C.data)
    for i in range(64):
        far[(1 << 39) + i * 4096] = A[i, 0]


@T.prim_func
def endless(
    A: T.Buffer((64, 64), "float32"), B: T.Buffer((64, 64), "float32"),
    C: T.Buffer((64, 64), "float32"),
):
    T.func_attr({"global_symbol": "main", "tir.noalias": True})
    for t in range(1 << 40):
        for i in range(64):
            C[i, t % 64] = C[i, (t + 1) % 64] + A[i, 0]


@pytest.fixture(scope="module")
def measurer() -> Iterator[LocalMeasurer]:
    # The timeout ends ``endless``; it must also leave room for a good candidate's first run
    # in a freshly restarted worker on a loaded 2-core CI host (2 s did not, once).
    with create("local", MeasureConfig(**FAST, run_timeout=8.0, build_workers=2)) as m:
        yield m


def test_builder_workers_persist_across_batches(measurer: LocalMeasurer) -> None:
    """First in this file, so normally the measurer's first batch: builds must succeed on
    freshly started workers too, and the same workers must serve the next batch."""
    target = measurer.target
    batch = [BuilderInput(tiled_matmul(f).mod, target) for f in (4, 8, 16, 32)]
    first = measurer.builder.build(batch)
    workers = measurer.builder.worker_pids()
    second, seconds = measurer.builder.build_timed(batch)
    assert sum(r.error_msg is None for r in first) == len(batch)
    assert sum(r.error_msg is None for r in second) == len(batch)
    assert all(s > 0 for s in seconds)
    assert workers and workers <= measurer.builder.worker_pids()


def test_pool_workers_start_without_torch_and_ignore_ctrl_c() -> None:
    """Builder and runner workers never use PyTorch, which ``tvm_ffi`` would import at
    start-up (seconds a worker); Ctrl-C at the terminal is for the process owning them."""
    from altenv.measure.pool import LeanLocalRunner, worker_pool

    def state():
        import signal
        import sys

        import tvm  # noqa: F401 (imported by the worker already)
        return sys.modules.get("torch"), signal.SIGINT in signal.pthread_sigmask(
            signal.SIG_BLOCK, set())

    pool = worker_pool(max_workers=1, timeout=60)
    try:
        assert pool.submit(state).result() == (None, True)
    finally:
        pool.shutdown()
    runner = LeanLocalRunner(timeout_sec=60)  # its worker started by the sanity check
    try:
        assert runner.pool.submit(state).result() == (None, True)
    finally:
        runner.pool.shutdown()


def test_workers_are_forked_by_the_zygote_and_replaced_after_a_timeout(monkeypatch) -> None:
    """Workers come from this process's zygote with the environment and directory of the
    moment they start; a worker killed after a timeout is replaced, and a dead zygote by
    a new one."""
    import os
    import time

    from altenv.measure.pool import WORKER_PRELOAD, worker_pool
    from altenv.measure.zygote import zygote

    def where():
        import os
        return os.getppid(), os.getpid(), os.environ.get("ALTENV_ZYGOTE_TEST"), os.getcwd()

    def asked(fn, *args, timeout=60):
        pool = worker_pool(max_workers=1, timeout=timeout)
        try:
            return pool.submit(fn, *args).result()
        finally:
            pool.shutdown()

    first = zygote(WORKER_PRELOAD, without_torch=True)
    monkeypatch.setenv("ALTENV_ZYGOTE_TEST", "set after the zygote started")
    monkeypatch.chdir("/")
    parent, _, env, cwd = asked(where)
    assert (parent, env, cwd) == (first.process.pid, "set after the zygote started", "/")
    pool = worker_pool(max_workers=1, timeout=2)
    try:
        parent, pid, _, _ = pool.submit(where).result()
        with pytest.raises(TimeoutError):
            pool.submit(time.sleep, 30).result()
        parent, after, _, _ = pool.submit(where).result()  # a new worker
        assert parent == first.process.pid and after != pid
    finally:
        pool.shutdown()
    os.kill(first.process.pid, 9)
    first.process.wait()
    assert asked(where)[0] == zygote(WORKER_PRELOAD, True).process.pid != first.process.pid


def test_an_ended_workers_cpu_time_counts_as_the_zygotes_children() -> None:
    """A worker that ends is reaped by its zygote, so its CPU time stays inside this process
    tree's totals (a dataset collection tells its own load from other processes' by them)
    rather than vanishing as it would were the kernel to reap it."""
    import time

    import psutil

    from altenv.measure.pool import WORKER_PRELOAD, worker_pool
    from altenv.measure.zygote import zygote

    made = psutil.Process(zygote(WORKER_PRELOAD, without_torch=True).process.pid)

    def reaped() -> float:
        times = made.cpu_times()
        return times.children_user + times.children_system

    before = reaped()
    pool = worker_pool(max_workers=1, timeout=60)
    try:
        pool.submit(sum, range(20_000_000)).result()  # about 0.3 s of CPU
    finally:
        pool.shutdown()
    deadline = time.monotonic() + 10
    while reaped() - before < 0.1 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert reaped() - before >= 0.1


@pytest.mark.slow
def test_failures_are_recorded_and_the_rest_measured(measurer: LocalMeasurer) -> None:
    mm = CorrectnessCheck(lambda a, b: a @ b)
    batch = [
        MeasureCandidate(tiled_matmul(16), mm),
        MeasureCandidate(out_of_bounds),
        MeasureCandidate(tiled_matmul(8), mm),
        MeasureCandidate(endless),
        MeasureCandidate(unbuildable()),
        MeasureCandidate(conv2d(), CorrectnessCheck(conv2d_ref)),
    ]
    results = measurer.measure(batch)
    for i in (0, 2, 5):
        assert results[i].error is None and results[i].ok
        assert len(results[i].latencies) == FAST["repeat"]
        assert 0 < results[i].median < 1
        assert results[i].build_seconds > 0 and results[i].run_seconds > 0
    for result in (results[1], results[3], results[4]):
        assert not result.ok and result.latencies == [] and result.median == float("inf")
    assert "Subprocess terminated" in results[1].error
    assert "Timeout" in results[3].error
    assert "PersistentBuilder" in results[4].error and results[4].run_seconds == 0.0


def test_retime_builds_once_and_runs_every_round(measurer: LocalMeasurer) -> None:
    batch = [MeasureCandidate(tiled_matmul(f)) for f in (4, 16)] + \
        [MeasureCandidate(unbuildable())]
    first, second, broken = measurer.retime(batch, rounds=3)
    for rounds in (first, second):
        assert len(rounds) == 3 and all(r.ok and 0 < r.median < 1 for r in rounds)
        assert rounds[0].build_seconds > 0 and rounds[1].build_seconds == 0.0
        assert len({r.median for r in rounds}) > 1  # timed again, not copied
    assert len(broken) == 3 and not any(r.ok for r in broken)
    assert "PersistentBuilder" in broken[0].error


def test_cold_retime_flushes_before_each_single_call(measurer: LocalMeasurer,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A cold re-timing runs with MetaSchedule's CPU cache flush and one call per latency;
    the measurer's own settings stay as they were."""
    seen = []
    time_jobs = measurer._time

    def spy(jobs):
        seen.extend(job[3] for job in jobs)
        return time_jobs(jobs)

    monkeypatch.setattr(measurer, "_time", spy)
    before = measurer.evaluator_config
    (rounds,) = measurer.retime([MeasureCandidate(tiled_matmul(8))], rounds=2, cold=True)
    assert len(rounds) == 2 and all(r.ok and len(r.latencies) == 3 for r in rounds)
    assert len(seen) == 2
    assert all(c.enable_cpu_cache_flush and c.number == 1 and c.min_repeat_ms == 0
               for c in seen)
    assert measurer.evaluator_config is before and not before.enable_cpu_cache_flush


def test_correctness_check_rejects_a_wrong_candidate(measurer: LocalMeasurer) -> None:
    right = CorrectnessCheck(lambda a, b: a @ b)
    wrong = CorrectnessCheck(lambda a, b: a @ b.T)
    broken = CorrectnessCheck(lambda a, b: a @ b[:3])
    good, bad, no_reference = measurer.measure(
        [MeasureCandidate(tiled_matmul(16), c) for c in (right, wrong, broken)]
    )
    assert good.ok
    assert not bad.ok and bad.error.startswith("wrong result (max rel err ")
    assert not no_reference.ok and no_reference.error.startswith("correctness reference failed")


@pytest.mark.slow
def test_a_metaschedule_call_tunes_on_an_open_measurers_workers(measurer: LocalMeasurer,
                                                                 tmp_path) -> None:
    """A MetaSchedule session lent the measurer's builder and runner starts no process of
    its own and leaves them running; its candidates are timed with MetaSchedule's own
    evaluator, not the check of the candidate the measurer timed last (a 64x64 matmul's
    reference would fail every 32x32 one); other settings get a session of their own."""
    from tvm.s_tir import meta_schedule as ms

    from altenv.measure.metaschedule import metaschedule_session

    right = CorrectnessCheck(lambda a, b: a @ b)
    assert measurer.measure([MeasureCandidate(tiled_matmul(16), right)])[0].ok
    workers = measurer.builder.worker_pids()
    with metaschedule_session(measurer.config, measurer.target, measurer=measurer) as pair:
        assert pair == (measurer.builder, measurer.runner)
        database = ms.tune_tir(matmul(32), measurer.target, str(tmp_path), max_trials_global=4,
                               num_trials_per_iter=4, builder=pair[0], runner=pair[1],
                               strategy="replay-trace")
    records = database.get_all_tuning_records()
    assert len(records) == 4
    assert all(r.run_secs and all(0 < float(t) < 1 for t in r.run_secs) for r in records)
    assert workers <= measurer.builder.worker_pids()  # the pool's own workers, still running
    good, bad = measurer.measure([MeasureCandidate(tiled_matmul(8), c) for c in (
        right, CorrectnessCheck(lambda a, b: a @ b.T))])
    assert good.ok and not bad.ok  # checked again
    other = measurer.config.model_copy(update={"repeat": 1})
    with metaschedule_session(other, measurer.target, measurer=measurer) as (builder, runner):
        assert builder is not measurer.builder and runner is not measurer.runner


def test_check_inputs_are_random_and_never_zero() -> None:
    check = CorrectnessCheck(lambda a: a * 2)
    path = check.data_file([("float32", (32, 32)), ("float32", (32, 32))])
    assert check.data_file([("float32", [32, 32]), ("float32", [32, 32])]) == path
    with np.load(path) as data:
        assert np.all(np.abs(data["arg0"]) >= 0.5) and np.all(np.abs(data["arg1"]) >= 0.5)
        assert np.unique(data["arg0"]).size > 100
        np.testing.assert_array_equal(data["expected1"], data["arg0"] * 2)


def test_checked_candidates_are_timed_on_the_signed_check_inputs(monkeypatch) -> None:
    """Not on MetaSchedule's arguments (random fill in [1, 10), all positive), on which a
    kernel that branches on signs runs faster than on real tensors."""
    import altenv.measure.check as check_module

    a = te.placeholder((64,), name="a")
    b = te.compute((64,), lambda i: tvm.te.max(a[i], tvm.tirx.const(0, "float32")), name="b")
    rt_mod = tvm.compile(te.create_prim_func([a, b]).with_attr("global_symbol", "main"),
                         target="llvm").mod
    check = CorrectnessCheck(lambda x: np.maximum(x, 0))
    evaluator = check.evaluator([("float32", (64,)), ("float32", (64,))], rpc=False)
    timed: list = []
    monkeypatch.setattr(check_module, "run_evaluator_common",
                        lambda mod, dev, config, args: timed.append(args) or [1.0])
    dev = tvm.cpu(0)
    ms_args = [tvm.runtime.tensor(np.full(64, 5.0, "float32"), dev) for _ in range(2)]
    assert evaluator(rt_mod, dev, None, [ms_args]) == [1.0]
    ((x, y),) = timed[0]
    with np.load(evaluator.data_file) as data:
        np.testing.assert_array_equal(x.numpy(), data["arg0"])
    assert (x.numpy() < 0).any() and (x.numpy() > 0).any()
    np.testing.assert_array_equal(y.numpy(), np.maximum(x.numpy(), 0))


def test_a_worker_checks_candidates_of_two_layouts_in_turn_on_their_own_data(monkeypatch):
    """The check data a worker read last is kept for the next candidate; a candidate of
    another signature reads its own, and a wrong one is still caught after a switch."""
    import altenv.measure.check as check_module

    monkeypatch.setattr(check_module, "run_evaluator_common", lambda *args: [1.0])
    dev = tvm.cpu(0)
    mods = {}
    for n in (16, 24):
        a = te.placeholder((n,), name="a")
        b = te.compute((n,), lambda i: a[i] * 2.0, name="b")  # noqa: B023 (used at once)
        mods[n] = tvm.compile(te.create_prim_func([a, b]).with_attr("global_symbol", "main"),
                              target="llvm").mod
    right = CorrectnessCheck(lambda x: x * 2)
    wrong = CorrectnessCheck(lambda x: x * 3)
    for n in (16, 24, 16, 24):
        sig = [("float32", (n,)), ("float32", (n,))]
        assert right.evaluator(sig, rpc=False)(mods[n], dev, None, None) == [1.0]
        assert check_module._LOADED.keys() == {right.data_file(sig)}
        with pytest.raises(check_module.WrongResultError):
            wrong.evaluator(sig, rpc=False)(mods[n], dev, None, None)


def test_relative_error_in_the_outputs_own_precision():
    assert max_relative_error(np.array([127], "int8"), np.array([-128], "int8")) == \
        pytest.approx(255 / 128)  # no wrap-around
    want = np.array([1.0, -4.0], "float16")
    assert max_relative_error(np.array([1.0, -3.0], "float16"), want) == pytest.approx(0.25)
    assert max_relative_error(want, want, scale=2.0) == 0.0
    assert max_relative_error(np.zeros(0), np.zeros(0)) == 0.0


def test_check_data_asked_for_by_several_devices_at_once_stays_whole() -> None:
    """A fleet's device threads ask for different signatures' data at the same moment."""
    from concurrent.futures import ThreadPoolExecutor

    check = CorrectnessCheck(lambda a: a + 1)
    sizes = list(range(64, 96))
    with ThreadPoolExecutor(8) as pool:
        paths = list(pool.map(lambda n: check.data_file([("float32", (n, n))] * 2), sizes))
    assert len(set(paths)) == len(sizes)
    for n, path in zip(sizes, paths, strict=True):
        with np.load(path) as data:
            assert data["arg0"].shape == (n, n)
            np.testing.assert_array_equal(data["expected1"], data["arg0"] + 1)


def test_config_maps_a_yaml_section() -> None:
    section = yaml.safe_load(
        "measure:\n  number: 5\n  enable_cpu_cache_flush: true\n  run_timeout: 4\n"
        "  rpc: {tracker: '127.0.0.1:9190', key: pi4}\n"
    )["measure"]
    config = MeasureConfig(**section)
    assert config.number == 5 and config.enable_cpu_cache_flush and config.run_timeout == 4
    assert config.rpc is not None and (config.rpc.host, config.rpc.port) == ("127.0.0.1", 9190)
    with pytest.raises(ValidationError):
        MeasureConfig(rpc={"tracker": "no-port", "key": "k"})
    with pytest.raises(ValidationError):
        MeasureConfig(numbr=3)
    with pytest.raises(ValueError, match="'local' or 'rpc'"):
        create("gpu")  # type: ignore[arg-type]


@pytest.mark.slow
def test_rpc_measurement_through_loopback_tracker(loopback_rpc: RPCSettings) -> None:
    config = MeasureConfig(**FAST, rpc=loopback_rpc, build_workers=1)
    with create(config=config) as measurer:
        assert isinstance(measurer, RPCMeasurer)
        right = CorrectnessCheck(lambda a, b: a @ b)
        wrong = CorrectnessCheck(lambda a, b: a + b)
        good, bad = measurer.measure(
            [MeasureCandidate(tiled_matmul(16), right), MeasureCandidate(matmul(), wrong)]
        )
    assert good.ok and len(good.latencies) == FAST["repeat"] and 0 < good.median < 1
    assert bad.error is not None and bad.error.startswith("wrong result")


@pytest.mark.slow
def test_rpc_measurer_times_kernel_chains_on_the_device(loopback_rpc: RPCSettings,
                                                        monkeypatch) -> None:
    """A network's in-network and read-through choices time chains of kernels where the
    candidates were timed: each kernel uploaded to the device, under a name of its own."""
    uploads: list[str] = []
    upload = RPCSession.upload

    def counted(self, data, target=None):
        uploads.append(target)
        return upload(self, data, target)

    monkeypatch.setattr(RPCSession, "upload", counted)
    config = MeasureConfig(**FAST, rpc=loopback_rpc, build_workers=1)
    with create(config=config) as measurer:
        small, large = matmul(16), matmul(64)
        stats = measurer.chain_timer()({"small": [small], "both": [small, large]}, 2, 0)
    assert len(uploads) == 3 and len(set(uploads)) == 3
    assert all(len(s.samples) == 2 and 0 < s.median < 1 for s in stats.values())
    assert stats["both"].median > stats["small"].median


@pytest.mark.skipif(not tvm.cuda().exist, reason="needs a CUDA GPU")
def test_cuda_measurement() -> None:
    sch = Schedule(matmul())
    i, j, _ = sch.get_loops(sch.get_sblock("C"))
    sch.bind(i, "blockIdx.x")
    sch.bind(j, "threadIdx.x")
    with create("local", MeasureConfig(**FAST), target="cuda") as measurer:
        (result,) = measurer.measure([MeasureCandidate(sch, CorrectnessCheck(lambda a, b: a @ b))])
    assert result.ok, result.error


def test_sigint_deferred_raises_after_the_block():
    """Ctrl-C inside the block runs nothing there and reaches the previous handler after."""
    seen, reached = [], []

    def handler(signum, frame):
        seen.append(signum)
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            with sigint_deferred():
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.05)  # Python runs handlers between bytecodes
                reached.append(True)
        assert reached and seen == [signal.SIGINT]
    finally:
        signal.signal(signal.SIGINT, previous)


def test_metaschedule_logging_stays_inside_the_tuning_call(tmp_path, capsys):
    """MetaSchedule's own logger set-up (a console handler on the stdout of the moment, file
    handlers, a logger per task) is undone when the call ends, so a later MetaSchedule
    message neither prints nor writes to a stream that has since closed."""
    import logging

    from tvm.s_tir.meta_schedule.logging import create_loggers

    from altenv.measure.metaschedule import metaschedule_logging_contained

    logger = logging.getLogger("tvm.s_tir.meta_schedule")
    mine = logging.StreamHandler()  # a handler the user attached, unnamed
    logger.addHandler(mine)
    try:
        before = (list(logger.handlers), logger.level, logger.propagate)
        with metaschedule_logging_contained():
            create_loggers(str(tmp_path), [{"log_dir": str(tmp_path), "logger_name":
                                            "tvm.s_tir.meta_schedule.logging.task_0"}])
            task = logging.getLogger("tvm.s_tir.meta_schedule.logging.task_0")
            added = [h for h in logger.handlers + task.handlers if h is not mine]
            assert {h.get_name() for h in added} >= {"tvm.s_tir.meta_schedule.console"}
            logger.info("inside")
        assert "inside" in capsys.readouterr().out
        assert (list(logger.handlers), logger.level, logger.propagate) == before
        assert task.handlers == []
        assert all(getattr(h, "stream", None) is None or h.stream.closed for h in added
                   if isinstance(h, logging.FileHandler))
        logger.removeHandler(mine)
        logger.info("after")
        assert "after" not in capsys.readouterr().out
    finally:
        logger.removeHandler(mine)

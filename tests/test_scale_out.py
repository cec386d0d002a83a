"""Scaling out: a fleet of devices timing one candidate each, RPC servers behind one
tracker key, a Ray cluster of several raylets on this machine; devices and nodes that die
mid-run, a driver killed with SIGKILL and resumed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from conftest import SMALL_EVOLUTION
from test_measure import matmul, tiled_matmul
from tvm.rpc.server import Server
from tvm.rpc.tracker import Tracker

from altenv.measure import CorrectnessCheck, MeasureCandidate, MeasureConfig, MeasureResult
from altenv.measure.fleet import DeviceLost, Fleet
from altenv.measure.measurer import RPCMeasurer

RAY = pytest.mark.xdist_group("ray")  # one Ray cluster at a time on the machine
SLOW = {"number": 1, "repeat": 2, "min_repeat_ms": 400}  # a session lasts about a second


def test_fleet_gives_every_job_one_result_and_moves_a_dropped_devices_job() -> None:
    """One job per device at a time; a device that drops leaves the fleet, its job goes to
    another; a job that kills every device fails; with no device left, jobs fail."""
    busy: dict[str, int] = {}
    seen: list[tuple[str, int]] = []
    guard = threading.Lock()

    def run(device: str, job: int) -> MeasureResult:
        with guard:
            busy[device] = busy.get(device, 0) + 1
            assert busy[device] == 1, "a device got two jobs at once"
        try:
            if device == "flaky" or job == 99:
                raise DeviceLost(f"{device} gone")
            time.sleep(0.01)
            seen.append((device, job))
            return MeasureResult(latencies=[job * 1e-3])
        finally:
            with guard:
                busy[device] -= 1

    fleet = Fleet(run)
    for device in ("a", "flaky", "b"):
        fleet.add(device)
    results = fleet.measure(list(range(1, 9)))
    assert [r.median for r in results] == [j * 1e-3 for j in range(1, 9)]
    assert sorted(j for _, j in seen) == list(range(1, 9))  # each measured once
    assert fleet.lost == ["flaky"] and {d for d, _ in seen} == {"a", "b"}
    fleet.add("c")
    fleet.add("d")
    (killer,) = fleet.measure([99])  # drops three devices (two requeues), then fails
    assert killer.error == "device lost: " + f"{fleet.lost[-1]} gone"
    assert len(fleet.lost) == 4 and len(fleet.devices) == 1
    (killer,) = fleet.measure([99])  # drops the last one
    assert killer.error == "no measuring device left" and fleet.devices == []
    assert [r.error for r in fleet.measure([1, 2])] == ["no measuring device left"] * 2


@pytest.fixture
def two_rpc_servers() -> Iterator[tuple[Tracker, list[Server]]]:
    tracker = Tracker(host="127.0.0.1", port=9190, port_end=9290, silent=True)
    servers = [Server(host="127.0.0.1", port=9300, port_end=9400, key="fleet",
                      tracker_addr=("127.0.0.1", tracker.port), silent=True) for _ in range(2)]
    try:
        yield tracker, servers
    finally:
        for server in servers:
            server.terminate()
        tracker.terminate()


def free_servers(settings) -> int:
    from tvm.rpc import connect_tracker
    return connect_tracker(settings.host, settings.port).summary()["queue_info"].get(
        settings.key, {}).get("free", 0)


@pytest.mark.slow
def test_rpc_fleet_times_on_every_server_and_survives_one_killed_mid_batch(
        two_rpc_servers) -> None:
    tracker, servers = two_rpc_servers
    config = MeasureConfig(**SLOW, build_workers=1, run_timeout=20,
                           rpc={"tracker": f"127.0.0.1:{tracker.port}", "key": "fleet"})
    with RPCMeasurer(config) as measurer:
        for _ in range(100):  # the servers register asynchronously
            if measurer.devices() == 2:
                break
            time.sleep(0.1)
        assert measurer.devices() == 2
        right = CorrectnessCheck(lambda a, b: a @ b)
        # a session can fail to start under the full suite's load (the device is dropped and
        # replaced at the next batch); the warm-up wants one batch on both servers
        for _ in range(3):
            warm = measurer.measure([MeasureCandidate(tiled_matmul(f), right) for f in (4, 8)])
            if len(measurer.fleet.devices) == 2:
                break
        assert all(r.ok for r in warm), [r.error for r in warm]
        assert len(measurer.fleet.devices) == 2
        # the servers put themselves back at the tracker after a session, asynchronously:
        # once both have, the next batch starts on both
        for _ in range(200):
            if free_servers(config.rpc) == 2:
                break
            time.sleep(0.05)
        assert free_servers(config.rpc) == 2
        serving = [psutil.Process(server.proc._proc.pid) for server in servers]
        before = {child.pid for server in serving for child in server.children()}
        killed: list[int] = []

        def timing(child: psutil.Process) -> bool:
            # the session has loaded the uploaded module from its work dir (its cwd)
            try:
                cwd = child.cwd()
                return any(m.path.startswith(cwd) for m in child.memory_maps())
            except psutil.Error:
                return False

        def kill_mid_session() -> None:
            # a server serves each session in a child process: kill the first server whose
            # new session is timing its candidate (the tracker cannot tell which server is
            # busy; a kill between sessions would lose nothing, and one during the
            # connection's handshake makes the client ask the tracker for another server)
            while not killed:
                for i, server in enumerate(serving):
                    if any(c.pid not in before and timing(c) for c in server.children()):
                        servers[i].terminate()  # its candidate goes to the other server
                        killed.append(i)
                        break
                time.sleep(0.01)

        killer = threading.Thread(target=kill_mid_session, daemon=True)
        killer.start()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            results = measurer.measure([MeasureCandidate(matmul(32 + i), right)
                                        for i in range(4)])
        killer.join(timeout=30)
    assert killed, "no server started a session"
    assert all(r.ok for r in results), [r.error for r in results]
    assert any("1 measuring device" in str(w.message) for w in caught), \
        ([str(w.message) for w in caught], [r.median for r in results])
    assert len(measurer.fleet.lost) == 1


@pytest.fixture
def ray_cluster() -> Iterator[object]:
    """A head and a second raylet on this machine, one CPU and one device each (one per
    test: the order xdist runs them in is not this file's, and a test removes a node)."""
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "resources": {"altenv_device": 1}, "include_dashboard": False})
    cluster.add_node(num_cpus=1, resources={"altenv_device": 1})
    cluster.wait_for_nodes()
    try:
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


@RAY
@pytest.mark.slow
def test_ray_measurer_builds_on_the_cluster_and_survives_a_removed_node(ray_cluster,
                                                                       monkeypatch) -> None:
    import ray

    from altenv.cluster.measurer import RayMeasurer
    from altenv.cluster.session import connect
    from altenv.cluster.settings import RaySettings
    from altenv.measure import chains

    # a third raylet: Ray attaches this driver to any raylet on its host, the head's or
    # not, and removing the driver's raylet or the head (its GCS) ends this process
    ray_cluster.add_node(num_cpus=1, resources={"altenv_device": 1})
    ray_cluster.wait_for_nodes()
    settings = RaySettings(address=ray_cluster.address)
    connect(settings)
    deadline = time.monotonic() + 60  # the third node's resources reach the view later
    while ray.cluster_resources().get("altenv_device", 0) < 3 and time.monotonic() < deadline:
        time.sleep(0.1)
    config = MeasureConfig(number=1, repeat=2, min_repeat_ms=5, run_timeout=20)
    with RayMeasurer(settings, config) as measurer:
        right, wrong = CorrectnessCheck(lambda a, b: a @ b), CorrectnessCheck(lambda a, b: a + b)
        warm = measurer.measure([MeasureCandidate(tiled_matmul(4), right),
                                 MeasureCandidate(tiled_matmul(8), wrong),
                                 MeasureCandidate(tiled_matmul(2), right)])
        assert warm[0].ok and warm[0].build_seconds > 0 and warm[2].ok
        assert warm[1].error.startswith("wrong result")
        # each device loads every candidate afresh, not the module it loaded first
        (other,) = measurer.measure([MeasureCandidate(matmul(32), right)])
        assert other.ok, other.error
        # a device keeps no files between calls (Ray kills an actor without its cleanup);
        # other clusters' actors on this machine may be writing theirs
        actors = {d._actor_id.hex() for d in measurer.fleet.devices}
        left = [f for f in Path(tempfile.gettempdir()).glob("altenv-device-*")
                if f.name.split("-")[2] in actors]
        assert not left, [(f.name, sorted(p.name for p in f.iterdir())) for f in left]
        nodes = {ray.get(d.node.remote()) for d in measurer.fleet.devices}
        assert len(nodes) == 3  # one device actor on each raylet
        # kernel chains (the in-network choices) are timed by a device actor, not here
        # (the local timer, Measurer.chain_timer's default, would call this module's)
        monkeypatch.setattr(chains, "time_chains", lambda *a: pytest.fail("timed here"))
        chains = measurer.chain_timer()({"small": [matmul(16)],
                                         "both": [matmul(16), matmul(64)]}, 2, 0)
        assert chains["both"].median > chains["small"].median > 0
        driver = ray.get_runtime_context().get_node_id()
        victim = next(n for n in ray_cluster.worker_nodes if n.node_id != driver)
        ray_cluster.remove_node(victim)  # its device dies with it
        try:
            with pytest.warns(UserWarning, match="1 measuring device"):
                results = measurer.measure([MeasureCandidate(tiled_matmul(f), right)
                                            for f in (2, 4, 8, 16)])
        finally:  # the measurer then closes with its dead device's death processed
            ray_cluster.add_node(num_cpus=1, resources={"altenv_device": 1})
            ray_cluster.wait_for_nodes()
    assert all(r.ok for r in results), [r.error for r in results]


def records_of(run: Path) -> list[dict]:
    path = run / "records.jsonl"
    if not path.exists():
        return []
    return [r for r in map(json.loads, path.read_text().splitlines()) if "key" in r]


@RAY
@pytest.mark.slow
def test_ray_run_resumes_after_kill_9_without_measuring_twice(tmp_path, ray_cluster) -> None:
    """``altenv tune --ray ADDRESS``, the driver killed with SIGKILL once it recorded a
    batch, then run again: the budget is met, no candidate recorded twice."""
    command = [sys.executable, "-m", "altenv.cli", "tune", "--workload",
               "gmm:M=16,N=16,K=16", "--budget", "12", "--name", "r", "--output-dir",
               str(tmp_path), "--quiet", "--ray", ray_cluster.address,
               "--set", "search.top_k=2", "--set", "search.batch=16",
               "--set", f"agent.options={SMALL_EVOLUTION}",
               "--set", "measure={number: 1, repeat: 2, min_repeat_ms: 5}"]
    first = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while len(records_of(tmp_path / "r")) < 2 and first.poll() is None \
                and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
    before = len(records_of(tmp_path / "r"))
    assert 2 <= before < 12
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    keys = [r["key"] for r in records_of(tmp_path / "r")]
    assert len(keys) == 12 and len(set(keys)) == 12
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["resumed_records"] == before and summary["trials"] == 12


@RAY
@pytest.mark.slow
def test_bench_tunes_agent_cells_on_the_cluster(tmp_path, ray_cluster, monkeypatch) -> None:
    """``altenv bench ops --ray ADDRESS``: the agent's cells measure on the cluster's device
    actors, the re-timing on this host."""
    import ray

    from altenv.cli import main
    from altenv.cluster.measurer import RayMeasurer

    batches: list[int] = []
    measure = RayMeasurer.measure

    def counted(self, candidates, *args, **kwargs):
        batches.append(len(candidates))
        return measure(self, candidates, *args, **kwargs)

    monkeypatch.setattr(RayMeasurer, "measure", counted)
    out = tmp_path / "b"
    assert main(["bench", "ops", "--workload", "gmm:M=16,N=16,K=16", "--tuners", "random",
                 "--versus", "random", "--baselines", "torch", "--budget", "8", "--output",
                 str(out), "--quiet", "--ray", ray_cluster.address, "--set",
                 "measure={number: 1, repeat: 2, min_repeat_ms: 5}"]) == 0
    assert ray.is_initialized() and sum(batches) == 8
    assert json.loads((out / "suite.json").read_text())["ray"]["address"] == ray_cluster.address
    (cell,) = out.glob("*/random-seed0/cell.json")
    assert json.loads(cell.read_text())["trials"] == 8
    assert (out / "results.csv").exists()


def test_bad_ray_settings_are_one_line_and_leave_no_run_dir(tmp_path, capsys) -> None:
    from altenv.cli import main

    base = ["tune", "--workload", "gmm:M=16,N=16,K=16", "--budget", "4", "--name", "r",
            "--output-dir", str(tmp_path)]
    assert main([*base, "--ray", "127.0.0.1:1"]) == 2  # nothing listens on port 1
    assert "ray.address: nothing answers at '127.0.0.1:1'" in capsys.readouterr().err
    assert main([*base, "--ray", "local", "--set",
                 "measure.rpc={tracker: '127.0.0.1:9190', key: k}"]) == 2
    assert "measure.rpc is allowed only without ray" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()
    bench = ["bench", "ops", "--workload", "gmm:M=16,N=16,K=16", "--output", str(tmp_path / "b")]
    assert main([*bench, "--ray", "127.0.0.1:1"]) == 2
    assert "ray.address: nothing answers at '127.0.0.1:1'" in capsys.readouterr().err
    assert main([*bench, "--ray", "local", "--set",
                 "measure.rpc={tracker: '127.0.0.1:9190', key: k}"]) == 2
    assert "measure.rpc is allowed only without ray" in capsys.readouterr().err
    assert not (tmp_path / "b").exists()


@pytest.mark.slow
def test_simulated_fleet_runs_the_real_tuning_stages(tiny_model) -> None:
    """``altenv bench scale``'s simulation: the tiny network's tasks (tuned at once),
    scheduler, records and cost model on 4 simulated devices; the budget is met."""
    from altenv.bench.scale import simulate

    (row,) = simulate(tiny_model, [4], [12], agent="random", top_k=2,
                      build_seconds=0.01, session_seconds=0.02)
    assert row["devices"] == 4 and row["trials"] == 12 and row["of_linear"] == 1.0
    assert row["trials_per_min"] > 0 and 0 < row["device_utilization"] <= 1

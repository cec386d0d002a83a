"""Records database: durable appends, queries, torn lines, kill-and-resume, and the round
trip through MetaSchedule's JSONDatabase."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from altenv.records import (
    CorruptRecordsError,
    Final,
    Record,
    RecordDB,
    RecordsRepaired,
    candidate_key,
    plain_json,
    target_string,
)
from altenv.target import make_target

TARGET = target_string(make_target("cpu"))


def make_record(workload: str, index: int, latencies: list[float], error: str | None = None,
                layouts: dict | None = None) -> Record:
    layouts = layouts or {"C": ["N", "H/8", "W", "8"]}
    decisions = [[index, 4], index % 2]
    return Record(workload=workload, target=TARGET, layouts=layouts, trace=None,
                  decisions=decisions, latencies=latencies, error=error,
                  key=candidate_key(workload, TARGET, layouts, None, decisions))


def test_append_query_and_reopen(tmp_path: Path) -> None:
    path = tmp_path / "runs" / "records.jsonl"
    with RecordDB(path) as db:
        db.add(make_record("mm", 0, [3e-3, 2e-3, 4e-3]))
        db.add(make_record("mm", 1, [1e-3, 5e-3, 2e-3]))
        db.add(make_record("mm", 2, [], error="LocalRunner: Timeout"))
        db.add(make_record("c2d:N=1,I=64", 0, [7e-3]))
    with RecordDB(path) as db:
        assert len(db) == 4 and db.count("mm") == 3 and db.workloads() == ["mm", "c2d:N=1,I=64"]
        best = db.best("mm")
        assert best is not None and best.decisions == [[1, 4], 1] and best.median == 2e-3
        assert db.best("unknown") is None
        assert [r.error for r in db.records("mm")] == [None, None, "LocalRunner: Timeout"]
        assert db.has(make_record("mm", 2, []).key) and not db.has(make_record("mm", 9, []).key)
        assert len(db.seen_keys()) == 4
    line = json.loads(path.read_text().splitlines()[0])
    assert set(line) >= {"workload", "target", "layouts", "schedule", "latencies", "error",
                         "timestamp", "key"}
    assert line["schedule"] == {"trace": None, "decisions": [[0, 4], 0]}


def test_finalists_pick_the_best_until_a_later_record(tmp_path: Path) -> None:
    """Re-timed finalists override the tuning-time best, survive a reopen, and go stale
    once the workload gets another record."""
    path = tmp_path / "records.jsonl"
    with RecordDB(path) as db:
        fast, slow = (db.add(make_record("mm", i, [lat])) for i, lat in ((0, 1e-3), (1, 2e-3)))
        db.add(make_record("mm", 2, [], error="LocalRunner: Timeout"))
        db.add(make_record("c2d", 0, [5e-3]))
        assert db.best("mm") is fast and db.final("mm") is None
        with pytest.raises(ValueError, match="keys without records"):
            db.add_final(Final("mm", [fast.key, "nope"], [1e-3, 1e-3], trials=3))
        failed = db.add_final(Final("mm", [fast.key, slow.key], [float("inf")] * 2, trials=3))
        assert db.final("mm") is None and db.best("mm") is fast  # none of them ran
        final = db.add_final(Final("mm", [fast.key, slow.key], [1.6e-3, 1.4e-3], trials=3))
        assert final is not failed and db.final("mm") is final
        assert final.winner == (slow.key, 1.4e-3) and db.best("mm") is slow
        assert db.best("c2d").median == 5e-3 and db.final("c2d") is None
    with RecordDB(path) as db:
        assert db.final("mm") == final and db.best("mm").key == slow.key
        assert len(db) == 4 and db.count("mm") == 3  # finals are not records
        db.add(make_record("mm", 3, [1.2e-3]))
        assert db.final("mm") is None and db.best("mm").median == 1e-3


def test_candidate_key_is_stable_and_discriminating() -> None:
    a = candidate_key("mm", TARGET, {"A": [1, 2], "B": [3]}, [["Split"]], [[2, 32]])
    assert a == candidate_key("mm", TARGET, {"B": [3], "A": [1, 2]}, [["Split"]], [[2, 32]])
    assert a != candidate_key("mm", TARGET, {"A": [2, 1], "B": [3]}, [["Split"]], [[2, 32]])
    assert a != candidate_key("mm", TARGET, {"A": [1, 2], "B": [3]}, [["Split"]], [[4, 16]])
    assert a != candidate_key("mm2", TARGET, {"A": [1, 2], "B": [3]}, [["Split"]], [[2, 32]])


def test_torn_last_line_is_moved_aside_with_a_warning(tmp_path: Path) -> None:
    path = tmp_path / "records.jsonl"
    with RecordDB(path) as db:
        for i in range(3):
            db.add(make_record("mm", i, [1e-3 * (i + 1)]))
    whole = path.read_bytes()
    torn = whole.splitlines(keepends=True)[0][:37]
    path.write_bytes(whole + torn)  # killed mid-write
    with pytest.warns(RecordsRepaired, match=r"moved 1 bad line\(s\) .*line 4: cut off"):
        db = RecordDB(path)
    with db:
        assert len(db) == 3
        db.add(make_record("mm", 3, [5e-4]))
    assert db.rejected_path.read_bytes() == torn + b"\n"  # kept, not deleted
    with RecordDB(path) as db:
        assert len(db) == 4 and db.best("mm").decisions[0] == [3, 4]
    path.write_bytes(path.read_bytes().rstrip(b"\n"))  # complete record, newline not yet out
    with RecordDB(path) as db:
        assert len(db) == 4
        db.add(make_record("mm", 4, [6e-4]))
    assert len(RecordDB(path)) == 5


@pytest.mark.parametrize("line, problem", [
    (b"{not json", "not JSON"),
    (b"[1, 2]", "Input should be a valid dictionary"),
    (b'{"workload": "mm"}', "target: Field required"),
    (b'{"final": {"workload": "mm", "keys": [], "latencies": [], "trials": 1}}',
     "final.keys: List should have at least 1 item"),
    (b'{"final": {"workload": "mm", "keys": ["a"], "latencies": [1, 2], "trials": 1}}',
     "1 keys but 2 latencies"),
])
def test_a_bad_line_names_file_and_line_and_repair_moves_it(tmp_path: Path, line: bytes,
                                                            problem: str) -> None:
    path = tmp_path / "records.jsonl"
    with RecordDB(path) as db:
        db.add(make_record("mm", 0, [1e-3]))
        db.add(make_record("mm", 1, [2e-3]))
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(lines[0] + line + b"\n" + lines[1])
    before = path.read_bytes()
    with pytest.raises(CorruptRecordsError) as err:
        RecordDB(path)
    message = str(err.value)
    assert message.startswith(f"{path}:2: not a record: ") and problem in message
    assert "--repair" in message and "\n" not in message
    assert path.read_bytes() == before  # nothing changed without --repair
    with pytest.warns(RecordsRepaired, match="line 2"):
        repaired = RecordDB(path, repair=True)
    with repaired as db:
        assert [r.decisions[0][0] for r in db.records()] == [0, 1]
        assert db.line_of(db.records()[1]) == 2
    assert path.read_bytes() == lines[0] + lines[1]
    assert (tmp_path / "records.rejected.jsonl").read_bytes() == line + b"\n"


@pytest.mark.parametrize("field, value, problem", [
    ("latencies", "fast", "latencies: Input should be a valid list"),
    ("latencies", [-1.0], "latencies.0: Input should be greater than 0"),
    ("latencies", [float("nan")], "latencies.0: Input should be a finite number"),
    ("key", "x", "key: String should match pattern"),
    ("build_seconds", -2.0, "build_seconds: Input should be greater than or equal to 0"),
    ("error", 3, "error: Input should be a valid string"),
    ("bogus", 1, "bogus: Extra inputs are not permitted"),
])
def test_wrong_types_and_impossible_values_are_bad_lines(tmp_path: Path, field: str,
                                                         value: object, problem: str) -> None:
    path = tmp_path / "records.jsonl"
    data = make_record("mm", 0, [1e-3]).to_json()
    data[field] = value
    path.write_text(json.dumps(data) + "\n")
    with pytest.raises(CorruptRecordsError, match=f"records.jsonl:1: not a record: {problem}"):
        RecordDB(path)


def test_unusable_records_are_rejected_by_their_session_under_repair(tmp_path: Path) -> None:
    """A record that is well formed but no candidate of its workload (layout factors of
    another template) stops a session naming file and line; with ``repair`` it is moved
    aside and the session resumes from the rest."""
    from synthetic import SyntheticMeasurer

    from altenv.tuning import Candidate, OpTask, TuningSession

    task = OpTask("gmm:M=16,N=16,K=16")
    factors = task.default_factors()
    path = tmp_path / "records.jsonl"
    with RecordDB(path) as db:
        session = TuningSession(task, SyntheticMeasurer(), db, check=False)
        points = task.space(factors).sample(2, np.random.default_rng(0))
        session.measure([Candidate(factors, p) for p in points])
        db.add(make_record(task.key, 9, [1e-3], layouts={"factors": {"zz": 3}}))
    with RecordDB(path) as db, pytest.raises(CorruptRecordsError) as err:
        TuningSession(task, SyntheticMeasurer(), db, check=False)
    assert str(err.value).startswith(f"{path}:3: not a candidate of {task.key} (")
    with pytest.warns(RecordsRepaired, match="line 3"), RecordDB(path, repair=True) as db:
        session = TuningSession(task, SyntheticMeasurer(), db, check=False)
        assert session.trials == 2 and len(db) == 2
        session.measure([Candidate(factors, p) for p in
                         task.space(factors).sample(4, np.random.default_rng(1))])
    assert session.trials > 2 and len(RecordDB(path)) == session.trials
    assert b'"zz"' in db.rejected_path.read_bytes()


RESUMABLE_RUN = textwrap.dedent("""
    import sys, time
    from altenv.records import Record, RecordDB, candidate_key

    db = RecordDB(sys.argv[1])
    for i in range(int(sys.argv[2])):
        layouts, decisions = {"C": [i % 7]}, [i, i * 3 % 11]
        key = candidate_key("mm", "llvm", layouts, None, decisions)
        if db.has(key):
            continue
        time.sleep(0.002)  # "measuring"
        db.add(Record(workload="mm", target="llvm", layouts=layouts, trace=None,
                      decisions=decisions, latencies=[1e-3 + i * 1e-6], error=None, key=key))
        print(key, flush=True)
""")


def test_sigkill_then_resume_skips_completed_candidates(tmp_path: Path) -> None:
    path, total = tmp_path / "records.jsonl", 400
    script = tmp_path / "run.py"
    script.write_text(RESUMABLE_RUN)
    cmd = [sys.executable, str(script), str(path), str(total)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    reported = [proc.stdout.readline().strip() for _ in range(40)]
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    proc.stdout.close()
    assert proc.returncode == -signal.SIGKILL
    with RecordDB(path) as db:
        survived = db.seen_keys()
        assert set(reported) <= survived and len(survived) < total
    resumed = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.split()
    assert not set(resumed) & survived
    with RecordDB(path) as db:
        keys = [r.key for r in db.records()]
        assert len(keys) == len(set(keys)) == total


def test_plain_json_unpacks_tvm_values() -> None:
    from tvm.runtime import convert
    from tvm.tirx import FloatImm, IntImm

    value = convert({"a": [IntImm("int32", 3), FloatImm("float32", 0.5)], "b": "x"})
    assert plain_json(value) == {"a": [3, 0.5], "b": "x"}


def test_metaschedule_round_trip(tmp_path: Path) -> None:
    import tvm
    from tvm import te
    from tvm.s_tir import Schedule
    from tvm.s_tir.meta_schedule.database import JSONDatabase
    from tvm.s_tir.meta_schedule.tir_integration import compile_tir

    from altenv.measure import MeasureResult
    from altenv.records import export_metaschedule, import_metaschedule
    from altenv.target import make_target

    a = te.placeholder((64, 64), name="A")
    b = te.placeholder((64, 64), name="B")
    k = te.reduce_axis((0, 64), name="k")
    c = te.compute((64, 64), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")
    func = te.create_prim_func([a, b, c])
    target = make_target(None)

    def schedule(seed: int) -> Schedule:
        sch = Schedule(func, seed=seed)
        i, j, kk = sch.get_loops(sch.get_sblock("C"))
        i0, i1 = sch.split(i, sch.sample_perfect_tile(i, n=2))
        j0, j1 = sch.split(j, sch.sample_perfect_tile(j, n=2, max_innermost_factor=16))
        sch.reorder(i0, j0, kk, i1, j1)
        sch.parallel(i0)
        return sch

    schedules = [schedule(seed) for seed in (1, 2, 3)]
    db = RecordDB(tmp_path / "records.jsonl")
    for n, sch in enumerate(schedules):
        decisions = [sch.trace.get_decision(inst) for inst in sch.trace.insts]
        result = MeasureResult(latencies=[3e-4 - n * 1e-4 + d * 1e-6 for d in range(3)])
        db.add_result("mm64", target, {}, sch.trace, [d for d in decisions if d], result)
    db.add_result("mm64", target, {"C": "bad"}, schedules[0].trace.as_json(), [],
                  MeasureResult(error="LocalRunner: Timeout"))
    best = db.best("mm64")
    assert best is not None and best.trace == plain_json(schedules[2].trace.as_json())

    export_metaschedule(db, {"mm64": func}, tmp_path / "ms")
    loaded = JSONDatabase(work_dir=str(tmp_path / "ms"))
    assert len(loaded) == 1
    sch = compile_tir(loaded, func, target)
    assert plain_json(sch.trace.as_json()) == best.trace
    lib = tvm.compile(sch.mod, target)
    rng = np.random.default_rng(0)
    x, y = (rng.uniform(0.5, 1.5, (64, 64)).astype("float32") for _ in range(2))
    dev = tvm.cpu()
    out = tvm.runtime.tensor(np.full((64, 64), 7.0, "float32"), dev)
    lib["main"](tvm.runtime.tensor(x, dev), tvm.runtime.tensor(y, dev), out)
    np.testing.assert_allclose(out.numpy(), x @ y, rtol=1e-5)

    export_metaschedule(db, {"mm64": func}, tmp_path / "all", only_best=False)
    fresh = RecordDB(tmp_path / "imported.jsonl")
    assert import_metaschedule(fresh, tmp_path / "all", {"mm64": func}) == 3
    assert import_metaschedule(fresh, tmp_path / "all", {"mm64": func}) == 0
    assert fresh.best("mm64").trace == best.trace
    assert fresh.best("mm64").latencies == best.latencies
    assert json.loads(fresh.best("mm64").target)["kind"] == "llvm"
    assert import_metaschedule(RecordDB(tmp_path / "anon.jsonl"), loaded) == 1
    assert RecordDB(tmp_path / "anon.jsonl").workloads()[0].startswith("ms:")

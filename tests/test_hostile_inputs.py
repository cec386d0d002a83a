"""Classes of hostile input, not instances: property tests (hypothesis) that generate run
directories (links out of them, folders where files belong, devices), records files with a
damaged line, checkpoints, configs and workload sizes, and check altenv's contract for
each: exit status 2, one line on stderr, no traceback, nothing written outside the run
directory, nothing left behind or changed inside it.

Every case is refused before anything is tuned, so each example takes milliseconds to a
second; the example counts keep each test to a few seconds.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import tempfile
from pathlib import Path

import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import agents
from agents.checkpoint import POLICY, SETTINGS
from altenv.cli import main
from altenv.config import ConfigError, load_config
from altenv.errors import UserError
from altenv.files import (
    UnsafeFileError,
    check_tree,
    open_append,
    read_bytes,
    read_text,
    write_text,
)
from altenv.lock import DirLock
from altenv.ops import parse_workload
from altenv.ops.operators import INT32_MAX
from altenv.records import RecordDB
from altenv.yamlfile import MAX_DEPTH, load_yaml

GMM = "gmm:M=8,N=8,K=8"
PRECIOUS = b"someone else's file\n"
BOUNDED = settings(max_examples=25, deadline=None, derandomize=True,
                   suppress_health_check=[HealthCheck.too_slow])


def snapshot(root: Path) -> dict[str, bytes | str | None]:
    """Every path under ``root``: a link's target, a file's bytes, ``None`` for the rest
    (the run directory's lock file aside, which a refused run may create)."""
    out: dict[str, bytes | str | None] = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(folder) / name
            if name == ".lock" and path.is_file() and not path.is_symlink():
                continue
            out[str(path.relative_to(root))] = (
                os.readlink(path) if path.is_symlink()
                else path.read_bytes() if path.is_file() else None)
    return out


def refused(argv: list[str], root: Path) -> str:
    """Run ``altenv argv``; assert the contract under ``root`` (the temp folder holding the
    run directory and the outside files) and return the one line."""
    before = snapshot(root)
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        status = main(argv)
    text = err.getvalue()
    assert status == 2, text
    assert len(text.splitlines()) == 1 and text.startswith("altenv: "), text
    assert "Traceback" not in text
    assert snapshot(root) == before, text
    return text


def run_config(root: Path, body: str = "") -> Path:
    path = root / "run.yaml"
    path.write_text(f"name: r\noutput_dir: {root / 'runs'}\nworkload: '{GMM}'\n"
                    f"budget: 4\n{body}")
    return path


def saved_config(root: Path, cfg: Path) -> str:
    return yaml.safe_dump(load_config(cfg).model_dump(mode="json"), sort_keys=False)


# ----------------------------------------------------------------- run directories
FILES = ["config.yaml", "records.jsonl", "best.json", "summary.json", "costmodel.npz",
         ".lock", "in_network.json", "train-state.json", "checkpoint/policy.json",
         "tb/events"]
FOLDERS = ["tb", "checkpoint", "others", "model"]
DAMAGE = ["link to a file outside", "link to a folder outside", "dangling link",
          "folder for a file", "named pipe"]


def damage(run: Path, outside: Path, entry: str, how: str) -> None:
    path = run / entry
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_dir() and not path.is_symlink():
        for child in sorted(path.rglob("*"), reverse=True):
            child.rmdir() if child.is_dir() else child.unlink()
        path.rmdir()
    elif path.exists() or path.is_symlink():
        path.unlink()
    if how == "link to a file outside":
        path.symlink_to(outside / "precious.txt")
    elif how == "link to a folder outside":
        path.symlink_to(outside)
    elif how == "dangling link":
        path.symlink_to(outside / "nothing-here")
    elif how == "named pipe":
        os.mkfifo(path)
    elif entry in FOLDERS:  # "folder for a file" of a folder: a file where it belongs
        path.write_bytes(b"not a folder")
    else:
        path.mkdir()


@BOUNDED
@given(st.lists(st.tuples(st.sampled_from(FILES + FOLDERS), st.sampled_from(DAMAGE)),
                min_size=1, max_size=3, unique_by=lambda d: d[0]),
       st.sampled_from(["tune", "export"]))
def test_a_damaged_run_directory_is_refused_and_untouched(damages, command):
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        outside = root / "outside"
        outside.mkdir()
        (outside / "precious.txt").write_bytes(PRECIOUS)
        cfg = run_config(root)
        run = root / "runs" / "r"
        run.mkdir(parents=True)
        (run / "config.yaml").write_text(saved_config(root, cfg))
        (run / "best.json").write_text("{}")
        for entry, how in damages:
            damage(run, outside, entry, how)
        argv = ["tune", str(cfg), "--quiet"] if command == "tune" else \
            ["export", str(run), "--output", str(root / "out")]
        line = refused(argv, root)
        assert str(run) in line
        assert (outside / "precious.txt").read_bytes() == PRECIOUS
        assert not (root / "out").exists()


def test_the_run_directory_itself_may_not_be_a_link(tmp_path):
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    cfg = run_config(tmp_path)
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "r").symlink_to(outside)
    assert "is a symbolic link" in refused(["tune", str(cfg), "--quiet"], tmp_path)
    assert list(outside.iterdir()) == []


# ------------------------------------------------------------------------ records
@pytest.fixture(scope="module")
def records_lines(tmp_path_factory) -> list[bytes]:
    """Four records of :data:`GMM` on this host, as a real session writes them."""
    from synthetic import SyntheticMeasurer

    from altenv.tuning import Candidate, OpTask, TuningSession

    task = OpTask(GMM)
    path = tmp_path_factory.mktemp("records") / "records.jsonl"
    with RecordDB(path) as db:
        session = TuningSession(task, SyntheticMeasurer(), db, check=False)
        factors = task.default_factors()
        session.measure([Candidate(factors, p) for p in
                         task.space(factors).sample(4, np.random.default_rng(0))])
    return path.read_bytes().splitlines()


def _mutated(line: bytes, how: str, lines: list[bytes]) -> bytes:
    data = json.loads(line)
    if how == "duplicate":
        return lines[0]
    if how == "cut":
        return line[: len(line) // 2]
    if how == "not UTF-8":
        return b"\xff\xfe" + line
    if how == "nested":
        return b"[" * 5000 + b"]" * 5000
    if how in ("foreign target", "another workload"):
        if how == "foreign target":
            data["target"] = '{"kind":"cuda","tag":"","keys":["cuda","gpu"]}'
        else:
            data["workload"] = "gmm:M=16,N=16,K=16"
        from altenv.records import candidate_key

        data["key"] = candidate_key(data["workload"], data["target"], data["layouts"],
                                    data["schedule"]["trace"], data["schedule"]["decisions"])
        data["latencies"] = [1e-9]
        return json.dumps(data).encode()
    if how == "edited key":
        data["key"] = "0" * 32
    elif how.startswith("latency "):
        data["latencies"] = [json.loads(how.removeprefix("latency "))]
    elif how == "no workload":
        del data["workload"]
    elif how == "decisions a string":
        data["schedule"]["decisions"] = "many"
    return json.dumps(data).encode().replace(b"Infinity", b"1e999")


MUTATIONS = ["duplicate", "cut", "not UTF-8", "nested", "foreign target", "another workload",
             "edited key",
             "latency 0", "latency -1", "latency 1e999", "latency NaN", "latency \"1\"",
             "latency null", "no workload", "decisions a string"]


@BOUNDED
@given(st.sampled_from(MUTATIONS), st.integers(1, 3))
def test_a_damaged_records_line_is_named_and_nothing_is_measured(records_lines, how, index):
    """A damaged line that is not the last (a torn last line is a killed write, moved aside
    with a warning) stops the run naming file and line; the file stays as it was."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        cfg = run_config(root)
        run = root / "runs" / "r"
        run.mkdir(parents=True)
        (run / "config.yaml").write_text(saved_config(root, cfg))
        lines = list(records_lines)
        lines[index] = _mutated(lines[index], how, lines)
        (run / "records.jsonl").write_bytes(b"\n".join(lines) + b"\n")
        line = refused(["tune", str(cfg), "--quiet"], root)
        assert f"records.jsonl:{index + 1}:" in line and "--repair" in line, line


def test_repair_moves_duplicates_and_foreign_records_aside(records_lines, tmp_path):
    lines = list(records_lines)
    foreign = _mutated(lines[1], "foreign target", lines)
    path = tmp_path / "records.jsonl"
    path.write_bytes(b"\n".join([*lines, lines[0], foreign]) + b"\n")
    with pytest.warns(UserWarning, match="moved 1 bad line"), \
            RecordDB(path, repair=True) as db:
        assert len(db) == len(lines) + 1  # the foreign one is refused by its session
    from synthetic import SyntheticMeasurer

    from altenv.tuning import OpTask, TuningSession

    with pytest.warns(UserWarning, match="measured for target"), \
            RecordDB(path, repair=True) as db:
        session = TuningSession(OpTask(GMM), SyntheticMeasurer(), db, check=False)
        assert session.trials == len(lines)
    rejected = path.with_name("records.rejected.jsonl").read_bytes().splitlines()
    assert rejected == [lines[0], foreign]


# -------------------------------------------------------------------- checkpoints
@pytest.fixture(scope="module")
def policy() -> tuple[dict[str, tuple[int, ...]], dict[str, object]]:
    """The default ppo policy's tensor shapes and checkpoint settings."""
    agent = agents.create("ppo", checkpoint=None)
    return agent._policy_shapes(), {"format": 1, **agent._settings()}


CHECKPOINT_DAMAGE = ["no settings", "no arrays", "settings not JSON", "settings a list",
                     "format 2", "arrays not npz", "a tensor missing", "a tensor extra",
                     "a shape wrong", "a tensor of text", "policy_kwargs other"]


def write_checkpoint(path: Path, policy: tuple[dict, dict], how: set[str]) -> None:
    path.mkdir()
    shapes, settings_ = policy[0], {**policy[1], "format": 2 if "format 2" in how else 1}
    if "policy_kwargs other" in how:
        settings_["policy_kwargs"] = {"net_arch": [8]}
    if "no settings" not in how:
        text = "{nope" if "settings not JSON" in how else json.dumps(
            [settings_] if "settings a list" in how else settings_)
        (path / SETTINGS).write_text(text)
    arrays = {k: np.zeros(s, np.float32) for k, s in shapes.items()}
    name = sorted(arrays)[len(arrays) // 2]
    if "a tensor missing" in how:
        del arrays[name]
    if "a tensor extra" in how:
        arrays["extra.weight"] = np.zeros(3, np.float32)
    if "a shape wrong" in how:
        arrays[name] = np.zeros((2, 3), np.float32)
    if "a tensor of text" in how:
        arrays[name] = np.array(["x"] * math.prod(shapes[name])).reshape(shapes[name])
    if "arrays not npz" in how:
        (path / POLICY).write_bytes(b"PK\x03\x04 not really")
    elif "no arrays" not in how:
        np.savez(path / POLICY, **arrays)


@settings(max_examples=8, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.sets(st.sampled_from(CHECKPOINT_DAMAGE), min_size=1, max_size=3))
def test_a_bad_checkpoint_is_refused_before_the_run_directory_exists(policy, how):
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_checkpoint(root / "ck", policy, how)
        cfg = run_config(root, f"agent: {{name: ppo, options: {{checkpoint: {root / 'ck'}}}}}\n")
        line = refused(["tune", str(cfg), "--quiet"], root)
        assert str(root / "ck") in line
        assert not (root / "runs").exists()


def test_a_good_checkpoint_passes_the_same_checks(policy, tmp_path):
    write_checkpoint(tmp_path / "ck", policy, set())
    agent = agents.create("ppo", checkpoint=str(tmp_path / "ck"))
    assert agent.checkpoint == tmp_path / "ck"


# ------------------------------------------------------------------------ configs
FIELDS = ["name", "workload", "budget", "agent", "seed", "target", "search", "measure",
          "epilogue", "output_dir", "model", "model_options", "finalists", "bogus"]
leaf = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70),
                 st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12))
values = st.recursive(leaf, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)),
    max_leaves=8)


@BOUNDED
@given(st.dictionaries(st.sampled_from(FIELDS), values, max_size=5))
def test_any_config_validates_or_gets_one_line(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("cfg") / "run.yaml"
    path.write_text(yaml.safe_dump({"name": "r", "workload": GMM, **data}))
    try:
        load_config(path)
    except ConfigError as err:
        assert len(str(err).splitlines()) == 1 and str(err).startswith(f"config {path}")


@BOUNDED
@given(st.text(alphabet=st.sampled_from(list("ab: -[]{}&*!|>'\"\n\t#,1.")), max_size=80))
def test_any_yaml_text_validates_or_gets_one_line(tmp_path_factory, text):
    path = tmp_path_factory.mktemp("cfg") / "run.yaml"
    path.write_text(text)
    try:
        load_config(path)
    except ConfigError as err:
        assert len(str(err).splitlines()) == 1


@pytest.mark.parametrize("text, says", [
    ("a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{c}: &{c} [{', '.join([f'*{p}'] * 10)}]\n"
        for p, c in zip("abcdefg", "bcdefgh")), "once its aliases are expanded"),
    ("[" * 20000 + "]" * 20000, f"nested deeper than {MAX_DEPTH} levels"),
    ("name: a\nname: b\n", "key 'name' is given twice (lines 1 and 2)"),
    ("a: &a [*a]\n", "an alias refers to a node that contains it"),
])
def test_yaml_bombs_and_repeated_keys_are_refused(tmp_path, text, says):
    assert len(text) < 200_000
    with pytest.raises(ValueError, match=says.replace("(", r"\(").replace(")", r"\)")):
        load_yaml(text)
    path = tmp_path / "run.yaml"
    path.write_text(text)
    argv = ["tune", str(path), "--quiet"]
    assert says.split(" (")[0] in refused(argv, tmp_path)


def test_yaml_merge_keys_are_not_repeated_keys():
    assert load_yaml("base: &b {x: 1, y: 2}\nother:\n  <<: *b\n  x: 3\n")["other"] == \
        {"x": 3, "y": 2}


@pytest.mark.parametrize("path, says", [
    ("/dev/zero", "is a device"), (".", "is a directory"), ("missing.yaml", "no such file")])
def test_a_config_that_is_no_file_gets_one_line(tmp_path, monkeypatch, path, says):
    monkeypatch.chdir(tmp_path)
    assert says in refused(["tune", path, "--quiet"], tmp_path)


def test_a_config_that_is_not_utf8_is_named(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_bytes(b"name: \xff\n")
    assert "run.yaml: not UTF-8 text" in refused(["tune", str(path), "--quiet"], tmp_path)


def test_a_boolean_is_no_number(tmp_path):
    line = refused(["tune", str(run_config(tmp_path, "")).replace("budget: 4", ""),
                    "--quiet", "--set", "budget={joint: true}"], tmp_path)
    assert "budget.joint: true is a boolean" in line


# ------------------------------------------------------------------ workload sizes
@BOUNDED
@given(st.integers(1, 2**40), st.integers(1, 2**20), st.integers(1, 2**20))
def test_a_workload_fits_int32_and_memory_or_gets_one_line(m, n, k):
    try:
        op = parse_workload(f"gmm:M={m},N={n},K={k}")
    except ValueError as err:
        assert len(str(err).splitlines()) == 1 and str(err).startswith("workload gmm:")
        return
    assert max(m * k, k * n, m * n) <= INT32_MAX and op.kind == "gmm"


# ------------------------------------------------------------------ the file layer
def test_writes_never_follow_a_link(tmp_path):
    outside = tmp_path / "precious.txt"
    outside.write_bytes(PRECIOUS)
    link = tmp_path / "best.json"
    link.symlink_to(outside)
    with pytest.raises(UnsafeFileError, match="is a symbolic link"):
        write_text(link, "{}")
    with pytest.raises(UnsafeFileError, match="is a symbolic link"):
        open_append(link)
    with pytest.raises(UnsafeFileError, match="is a symbolic link"), DirLock(link, "run"):
        pass
    with pytest.raises(UnsafeFileError, match="is a symbolic link"):
        read_text(link)
    assert outside.read_bytes() == PRECIOUS
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best.json", "precious.txt"]


def test_a_write_replaces_the_file_whole(tmp_path):
    path = tmp_path / "summary.json"
    write_text(path, "one")
    hard = tmp_path / "hard-link"
    os.link(path, hard)  # a reader holding the old file keeps it
    write_text(path, "two")
    assert path.read_text() == "two" and hard.read_text() == "one"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hard-link", "summary.json"]


def test_reads_are_bounded_and_name_the_file(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_bytes(b"x" * 2000)
    with pytest.raises(UnsafeFileError, match="config.yaml: larger than"):
        read_bytes(path, limit=1000)
    assert read_bytes(path, limit=2000) == b"x" * 2000
    with pytest.raises(UnsafeFileError, match="is a device"):
        read_bytes("/dev/zero", follow=True)


def test_check_tree_names_the_first_odd_entry(tmp_path):
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "b" / "c").symlink_to("/etc/passwd")
    with pytest.raises(UserError, match="a/b/c: is a symbolic link"):
        check_tree(tmp_path)


def test_export_names_the_file_that_is_wrong(tmp_path):
    """A run directory's config.yaml that is not UTF-8 is blamed on config.yaml, a
    best.json that is not JSON on best.json."""
    run = tmp_path / "runs" / "r"
    run.mkdir(parents=True)
    (run / "config.yaml").write_bytes(b"name: \xff\n")
    (run / "best.json").write_text("{}")
    argv = ["export", str(run), "--output", str(tmp_path / "out")]
    assert "config.yaml: not UTF-8 text" in refused(argv, tmp_path)
    (run / "config.yaml").write_text(saved_config(tmp_path, run_config(tmp_path)))
    (run / "best.json").write_text("{nope")
    assert "best.json: not JSON" in refused(argv, tmp_path)

"""Run configs (typed YAML, one-line errors) and the ``altenv tune`` command, including
resume after the process is killed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import SMALL_EVOLUTION

from altenv.cli import _set_options, main
from altenv.config import ConfigError, DatasetConfig, RunConfig, TrainConfig, load_config

CONFIGS = Path(__file__).resolve().parent.parent / "configs"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "run.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("text, message", [
    ("name: x\nworkload: gmm:M=8,N=8,K=8\nbudget: {joint: -1}\n",
     "budget.joint: Input should be greater than or equal to 0"),
    ("name: x\nworkload: gmm:M=8,N=8,K=8\nagent: ppo2\n",
     "agent.name: unknown agent 'ppo2'; allowed: dataset_best, evolution, heron_cga, "
     "mind_mappings, ppo, random"),
    ("name: x\nworkload: gmm:M=8,N=8,K=8\nagent: {name: random, options: {steps: 3}}\n",
     "agent.options: random takes no option 'steps'; allowed: seed"),
    ("name: x\nworkload: gmm:M=8,N=8,K=8\nbugdet: 3\n",
     "bugdet: Extra inputs are not permitted"),
    ("name: x\nworkload: gmm:M=8,N=8\n", "workload: workload 'gmm:M=8,N=8': missing K"),
    ("name: x\n", "give exactly one of 'workload'"),
    ("name: x\nworkload: gmm:M=8,N=8,K=8\nepilogue: [gelu2]\n",
     "epilogue.0: epilogue step 'gelu2': unknown op 'gelu2'"),
    ("name: x\nworkload: gmm:M=8,N=8,K=8\nepilogue: [\"clip(0)\"]\n",
     "epilogue.0: epilogue step 'clip(0)': clip takes 2 numbers; allowed: bias, residual, relu"),
    ("name: x y\nworkload: gmm:M=8,N=8,K=8\n", "name: 'x y' is not a directory name"),
    ("name: x\nworkload: gmm:M=8,N=8,K=8\nmeasure: {number: 0}\n",
     "measure.number: Input should be greater than or equal to 1"),
    ("- a\n- b\n", "the top level must be a mapping"),
    ("name: x\nworkload: gmm:M=8,N=8,K=8\nbudget: {others: 8}\n",
     "budget.others: an operator run has no other kernels"),
    ("name: x\nmodel: resnet18\nfast_math: [log]\n",
     "fast_math.0: Input should be 'erf', 'tanh' or 'exp'"),
    ("name: x\nworkload: gmm:M=8,N=8,K=8\nsearch: {finalist_caches: hot}\n",
     "search.finalist_caches: Input should be 'auto', 'warm' or 'cold'"),
])
def test_bad_configs_name_the_field(tmp_path, text, message):
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, text))
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_shipped_configs_validate():
    paths = sorted(CONFIGS.glob("*.yaml"))
    assert paths
    for path in paths:
        data = yaml.safe_load(path.read_text())
        train = {"workloads", "models", "corpus", "pretrain"} & set(data)
        schema = (DatasetConfig if "collection" in data else TrainConfig if train
                  else RunConfig)
        load_config(path, schema)


READ_ONLY = """
import sys
from pathlib import Path

import yaml

from altenv.config import DatasetConfig, RunConfig, TrainConfig, load_config
from altenv.suites import load_suite

for path in sorted(Path(sys.argv[1]).glob("*.yaml")):
    data = yaml.safe_load(path.read_text())
    train = {"workloads", "models", "corpus", "pretrain"} & set(data)
    load_config(path, DatasetConfig if "collection" in data else TrainConfig if train
                else RunConfig)
for path in sorted(Path(sys.argv[1], "bench").glob("*.yaml")):
    load_suite(str(path))
heavy = {"tvm", "torch", "stable_baselines3", "sb3_contrib", "xgboost", "ray"}
print(sorted(m for m in sys.modules if m.split(".")[0] in heavy
             or (m.startswith("agents.") and m not in ("agents.base", "agents.options"))))
"""


def test_reading_configs_imports_neither_tvm_nor_the_agents():
    """A config is data: reading every shipped config and suite imports no TVM, torch, SB3
    or agent implementation (their checks run when the job is built)."""
    out = subprocess.run([sys.executable, "-c", READ_ONLY, str(CONFIGS)], capture_output=True,
                         text=True, check=True, timeout=120).stdout
    assert out.strip().splitlines()[-1] == "[]"


def test_overrides_and_defaults(tmp_path):
    cfg = load_config(None, name="a", workload="gmm:M=8,N=8,K=8", **{"budget.joint": 3})
    assert cfg.budget.joint == 3 and cfg.budget.loop_only == 45
    assert cfg.agent.name == "evolution" and cfg.run_dir == Path("runs/a")
    assert str(cfg.workload) == "gmm:M=8,N=8,K=8"


def test_cli_reports_config_errors(tmp_path, capsys):
    assert main(["tune", str(write(tmp_path, "name: x\n"))]) == 2
    assert "give exactly one of 'workload'" in capsys.readouterr().err


def test_cli_set_overrides_fields_and_names_bad_ones(tmp_path, capsys):
    """``--set KEY=VALUE`` reaches the validated config (YAML values, dotted keys); a bad
    key or value is a one-line error naming the field."""
    cfg = write(tmp_path, "name: x\nworkload: gmm:M=8,N=8,K=8\n")
    cases = [
        (["--set", "measure.number=two"], "measure.number: Input should be a valid integer"),
        (["--set", "measure.flush=true"], "measure.flush: Extra inputs are not permitted"),
        (["--set", "name.x=1"], "override 'name.x': 'name' is not a section of fields"),
        (["--set", "measure"], "--set 'measure': expected KEY=VALUE"),
    ]
    for extra, message in cases:
        assert main(["tune", str(cfg), *extra]) == 2
        assert message in capsys.readouterr().err
    overrides = _set_options(["measure.enable_cpu_cache_flush=true", "measure.number=1",
                              "agent.options={seed: 3}"])
    assert overrides == {"measure.enable_cpu_cache_flush": True, "measure.number": 1,
                         "agent.options": {"seed": 3}}
    cfg = load_config(None, name="a", workload="gmm:M=8,N=8,K=8", **overrides)
    assert cfg.measure.enable_cpu_cache_flush and cfg.measure.number == 1
    assert cfg.agent.given == {"seed": 3}
    train = write(tmp_path, "name: t\nworkloads: ['gmm:M=8,N=8,K=8']\npublish: somewhere\n")
    assert load_config(train, TrainConfig, **_set_options(["publish=null"])).publish is None
    assert main(["bench", "net", "--suite", "nets", "--set", "measure.repeat=0"]) == 2
    assert "measure.repeat: Input should be greater than or equal to 1" in \
        capsys.readouterr().err


def _run_until(cmd: list[str], records: Path, count: int) -> subprocess.Popen:
    """``cmd`` in a session of its own, once ``records`` holds ``count`` lines."""
    proc = subprocess.Popen(cmd, start_new_session=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        if records.exists() and sum(1 for _ in records.open()) >= count:
            break
        time.sleep(0.2)
    return proc


BUDGET = 24


@pytest.mark.slow
def test_tune_interrupted_killed_damaged_and_resumed(tmp_path, capsys):
    """Ctrl-C mid-run (the budget leaves the run far from done when the signal comes,
    even on a loaded host): one line, status 130, no candidate recorded as failed. SIGKILL,
    then a garbage line and a torn one in the records: the same command names the bad
    line; with --repair it moves both aside and resumes. Every record is kept, nothing is
    measured twice, the run stops at the budget."""
    args = ["tune", "--workload", "gmm:M=32,N=32,K=32", "--name", "k", "--budget", str(BUDGET),
            "--output-dir", str(tmp_path), "--quiet",
            "--set", f"agent.options={SMALL_EVOLUTION}"]
    cmd = [sys.executable, "-m", "altenv.cli", *args]
    records = tmp_path / "k" / "records.jsonl"
    proc = _run_until(cmd, records, 4)
    os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C at a terminal does
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, out + err
    assert err == "altenv: interrupted; run the same command again to resume\n"
    lines = [json.loads(line) for line in records.open()]
    assert lines and all(line["error"] is None for line in lines)

    proc = _run_until(cmd, records, 8)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate()
    before = [json.loads(line)["key"] for line in records.open() if line.strip()]
    assert 8 <= len(before) < BUDGET
    with records.open("a") as f:
        f.write('garbage\n{"workload": "gmm:M=3')  # and a write cut off by the kill
    assert main(args) == 2
    assert capsys.readouterr().err == (
        f"altenv: {records}:{len(before) + 1}: not a record: not JSON (Expecting value: line 1 "
        f"column 1 (char 0)); to resume without it, run the same command with --repair (bad "
        f"lines move to {tmp_path / 'k' / 'records.rejected.jsonl'}), or fix or delete the "
        "line\n")

    out = subprocess.run([*cmd, "--repair"], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"resuming run {tmp_path / 'k'} ({len(before)} records)" in out.stdout
    assert f"moved 2 bad line(s) to {tmp_path / 'k' / 'records.rejected.jsonl'}" in out.stderr
    assert (tmp_path / "k" / "records.rejected.jsonl").read_text() == \
        'garbage\n{"workload": "gmm:M=3\n'
    lines = [json.loads(line) for line in records.open()]
    after = [line["key"] for line in lines if "final" not in line]
    assert len(after) == BUDGET and len(set(after)) == BUDGET and after[:len(before)] == before
    assert "final" in lines[-1] and lines[-1]["final"]["trials"] == BUDGET  # finalists re-timed
    summary = json.loads((tmp_path / "k" / "summary.json").read_text())
    assert summary["trials"] == BUDGET and summary["max_rel_err_vs_torch"] < 1e-3
    assert (tmp_path / "k" / "best.json").exists() and (tmp_path / "k" / "tb").is_dir()


def test_budget_split_gives_a_share_to_the_other_kernels():
    from altenv.config import BudgetConfig

    budget = BudgetConfig.split(2000, 0.1)
    assert (budget.joint, budget.loop_only, budget.others) == (540, 1260, 200)
    assert budget.total == 2000 and budget.searched == 1800
    assert BudgetConfig.split(64).others == 0


def test_task_budgets_give_small_tasks_a_floor_then_split_by_flops():
    """ResNet-18-like weights: a 1x1 downsample and the classifier get the floor, the big
    convolutions the rest by FLOPs x calls; the shares add up to the total."""
    from altenv.tuning.budget import TASK_FLOOR_BATCHES, task_budgets

    weights = {"c3x3": 231e6 * 3, "c3x3_res": 231e6, "c1x1": 12.8e6, "fc": 1.0e6}
    floor = TASK_FLOOR_BATCHES * 8
    shares = task_budgets(weights, 600, floor)
    assert sum(shares.values()) == 600
    assert floor <= shares["fc"] <= shares["c1x1"] < shares["c3x3_res"] < shares["c3x3"]
    assert shares["c3x3"] - floor == pytest.approx(3 * (shares["c3x3_res"] - floor), abs=3)
    tight = task_budgets(weights, 40, floor)  # too few for the floor: an equal share first
    assert sum(tight.values()) == 40 and min(tight.values()) >= 10


def test_task_weights_follow_a_roofline_not_flops_alone():
    """A memory-bound depthwise convolution is weighted by the bytes it moves, a 3x3
    convolution by its FLOPs; int8 data moves one byte an element, its int32 output four."""
    from altenv.ops import operator_for, parse_workload
    from altenv.tuning.budget import RIDGE_FLOPS_PER_BYTE, task_weight

    dep = "dep:N=1,C=32,H=112,W=112,KH=3,KW=3,stride=1,pad=1"
    op = operator_for(parse_workload(dep))
    assert op.traffic_bytes() == 4 * (32 * 114 * 114 + 32 * 9 + 32 * 112 * 112)
    assert task_weight(op, 2) == 2 * RIDGE_FLOPS_PER_BYTE * op.traffic_bytes()
    assert task_weight(op, 1) > 2 * op.flops()
    c3 = "c2d:N=1,I=64,O=64,H=56,W=56,KH=3,KW=3,stride=1,pad=1"
    conv = operator_for(parse_workload(c3))
    assert task_weight(conv, 3) == 3 * conv.flops()
    q = operator_for(parse_workload("gmm:M=4,N=16,K=32,dtype=int8"))
    assert q.traffic_bytes() == 4 * 32 + 32 * 16 + 4 * 4 * 16


def test_finalists_are_re_timed_cold_in_model_runs():
    """``auto`` re-times a model run's finalists with flushed caches, an operator run's warm;
    ``warm`` and ``cold`` say the same for both."""
    from altenv.config import SearchConfig

    def cold(caches: str, model: bool) -> bool:
        return SearchConfig(finalist_caches=caches).options(model).finalists_cold

    assert cold("auto", True) and not cold("auto", False)
    assert not cold("warm", True) and cold("cold", False)
    assert SearchConfig().options().finalists == 8

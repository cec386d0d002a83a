"""Bad input through the real command line (``altenv.cli.main``): every case gets exit
status 2, exactly one line on stderr naming what is wrong, no traceback, and leaves the
files as they were (no run directory made, no record or earlier export touched; a run
directory's ``.lock`` file aside).

The table is the re-measurement of issue 47's list (a traceback or a second line fails
the case); ``pytest tests/test_bad_input.py -q`` counts them.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import tvm
import yaml

from altenv.cli import main
from altenv.config import load_config
from altenv.records import Record, candidate_key, target_string
from altenv.target import make_target

GMM = "gmm:M=8,N=8,K=8"
HOST = target_string(make_target("cpu"))
GPU = tvm.cuda(0).exist


def config(tmp: Path, body: str, name: str = "r") -> str:
    """A run config in ``tmp`` whose runs go to ``tmp/runs``."""
    path = tmp / "run.yaml"
    path.write_text(f"name: {name}\noutput_dir: {tmp / 'runs'}\n{body}")
    return str(path)


def tune(tmp: Path, body: str) -> list[str]:
    return ["tune", config(tmp, body), "--quiet"]


def tune_flags(tmp: Path, *flags: str) -> list[str]:
    return ["tune", "--workload", GMM, "--name", "r", "--output-dir", str(tmp / "runs"),
            "--quiet", *flags]


def module(tmp: Path, name: str, text: str) -> str:
    """A Python file in ``tmp`` (which the test puts on ``sys.path``)."""
    (tmp / f"{name}.py").write_text(text)
    return str(tmp / f"{name}.py")


def record(**changes: object) -> str:
    """One record line of :data:`GMM` with ``changes`` applied to its JSON (and its key
    computed from what it then holds, unless ``changes`` give one)."""
    line = Record(workload=GMM, target=HOST, layouts={"factors": {"mt": 8, "nt": 8, "kt": 8}},
                  trace=None, decisions=[0], latencies=[1e-3], error=None, key="").to_json()
    line.update(changes)
    if "key" not in changes:
        line["key"] = candidate_key(line["workload"], line["target"], line["layouts"],
                                    line["schedule"]["trace"], line["schedule"]["decisions"])
    return json.dumps(line)


def resumed(tmp: Path, records: str, body: str = f"workload: '{GMM}'\n") -> list[str]:
    """A run directory of ``body``'s run holding ``records``; tune it again."""
    argv = tune(tmp, body)
    run = tmp / "runs" / "r"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text(yaml.safe_dump(
        load_config(argv[1]).model_dump(mode="json"), sort_keys=False))
    (run / "records.jsonl").write_text(records)
    return argv


def finished_run(tmp: Path, best: str, body: str = f"workload: '{GMM}'\n",
                 cfg: str | None = None) -> Path:
    """A run directory with a config and ``best.json`` (as export reads them)."""
    run = tmp / "runs" / "r"
    run.mkdir(parents=True, exist_ok=True)
    saved = cfg if cfg is not None else yaml.safe_dump(
        load_config(config(tmp, body)).model_dump(mode="json"))
    (run / "config.yaml").write_text(saved)
    (run / "best.json").write_text(best)
    return run


def export(tmp: Path, run: Path, *flags: str) -> list[str]:
    return ["export", str(run), "--output", str(tmp / "out"), *flags]


def bench(tmp: Path, *flags: str, kind: str = "ops") -> list[str]:
    return ["bench", kind, "--output", str(tmp / "runs" / "bench"), "--quiet", "--budget", "8",
            *flags]


FACTORY = "import torch\n\ndef factory():\n    {body}\n"
UNSUPPORTED = '''
import torch

class M(torch.nn.Module):
    def forward(self, x):
        return torch.special.i0(x)

def factory():
    return M(), (torch.randn(2, 3),)
'''
AGENT = '''
from agents import Agent

class Climber(Agent):
    def __init__(self, seed: int = 0, radius: int = 1):
        self.radius = radius

    def propose(self, session, n, layout):
        return []

class NotAnAgent:
    pass
'''

def output_dir_a_file(tmp: Path) -> list[str]:
    (tmp / "runs").write_text("a file where the runs go\n")
    return tune(tmp, f"workload: '{GMM}'\n")


def train_state_garbage(tmp: Path) -> list[str]:
    (tmp / "runs" / "r").mkdir(parents=True)
    (tmp / "runs" / "r" / "train-state.json").write_text("{nope")
    return ["train", config(tmp, f"workloads: ['{GMM}']\n"
                                 "agent: {name: ppo, options: {checkpoint: null}}\n")]


Case = Callable[[Path], tuple[list[str], str]]
CASES: dict[str, Case] = {
    # found by a sweep of hostile and careless input (issue 97)
    "workload key twice": lambda t: (tune(t, "workload: 'gmm:M=8,N=8,K=8,M=16'\n"),
                                     "M is given twice"),
    "model_options on an operator run": lambda t: (
        tune(t, f"workload: '{GMM}'\nmodel_options: {{width: 2}}\n"),
        "model_options: an operator run imports no model"),
    "bench tuners empty": lambda t: (bench(t, "--workload", GMM, "--tuners", ""),
                                     "--tuners '': give comma-separated names"),
    "target mcpu unknown": lambda t: (
        tune(t, f"workload: '{GMM}'\ntarget: {{kind: llvm, mcpu: banana, num-cores: 2}}\n"),
        "mcpu 'banana' is no CPU LLVM knows"),
    "target without num-cores": lambda t: (
        tune(t, f"workload: '{GMM}'\ntarget: {{kind: llvm, mcpu: znver3}}\n"),
        "needs 'num-cores'"),
    "build timeout infinite": lambda t: (
        tune(t, f"workload: '{GMM}'\nmeasure: {{build_timeout: .inf}}\n"),
        "measure.build_timeout: Input should be a finite number"),
    "name of 300 characters": lambda t: (
        ["tune", config(t, f"workload: '{GMM}'\n", name="n" * 300), "--quiet"],
        "is not a directory name"),
    "output dir a file": lambda t: (output_dir_a_file(t), "cannot be made: a file is in its way"),
    "train state not JSON": lambda t: (train_state_garbage(t), "train-state.json: not JSON"),
    # budgets that cannot measure anything
    "budget -5": lambda t: (tune_flags(t, "--budget", "-5"),
                            "argument --budget: -5 is out of range: allowed 0 to"),
    "budget 0": lambda t: (tune_flags(t, "--budget", "0"),
                           "argument --budget: 0 is out of range: allowed 1 or more"),
    "budget -5 in the config": lambda t: (tune(t, f"workload: '{GMM}'\nbudget: -5\n"),
                                          "budget: -5 trials measure nothing"),
    "budget not a number": lambda t: (tune_flags(t, "--budget", "many"),
                                      "argument --budget: 'many' is not an integer"),
    "budget stages 0": lambda t: (
        tune(t, f"workload: '{GMM}'\nbudget: {{joint: 0, loop_only: 0}}\n"),
        "budget: joint + loop_only is 0"),
    # the model source and its factory
    "onnx file missing": lambda t: (tune(t, f"model: {t}/none.onnx\n"),
                                    "cannot import it (FileNotFoundError"),
    "py file missing": lambda t: (tune(t, f"model: {t}/none.py:factory\n"),
                                  "cannot import it (FileNotFoundError"),
    "onnx garbage": lambda t: ((t / "net.onnx").write_bytes(b"\x00garbage\xff" * 8),
                               tune(t, f"model: {t}/net.onnx\n"))[1:] + ("cannot import it",),
    "unsupported torch op": lambda t: (
        tune(t, f"model: {module(t, 'unsup', UNSUPPORTED)}:factory\n"),
        "unsupported operator(s): i0.default"),
    "factory missing": lambda t: (tune(t, f"model: {module(t, 'nofac', 'x = 1')}:factory\n"),
                                  "AttributeError"),
    "factory raises": lambda t: (tune(t, "model: " + module(
        t, "raises", FACTORY.format(body="raise RuntimeError('boom')")) + ":factory\n"),
        "RuntimeError: boom"),
    "factory syntax error": lambda t: (tune(t, f"model: {module(t, 'syntax', 'def (:')}:factory\n"),
                                       "SyntaxError"),
    "factory returns garbage": lambda t: (tune(t, "model: " + module(
        t, "garbage", FACTORY.format(body="return 42")) + ":factory\n"), "TypeError"),
    "zoo size huge": lambda t: (tune(t, "model: resnet18\nmodel_options: {size: huge}\n"),
                                "size must be 'small' or 'full'"),
    "zoo option unknown": lambda t: (tune(t, "model: resnet18\nmodel_options: {bogus: 1}\n"),
                                     "bogus"),
    "zoo model unknown": lambda t: (tune(t, "model: resnet19\n"), "cannot interpret source"),
    # targets
    "target banana": lambda t: (tune(t, f"workload: '{GMM}'\ntarget: banana\n"),
                                "target: unsupported value 'banana'"),
    "target dict kind": lambda t: (tune(t, f"workload: '{GMM}'\ntarget: {{kind: banana}}\n"),
                                   'Target kind "banana" is not defined'),
    # agents and their options
    "agent option type": lambda t: (tune(t, f"workload: '{GMM}'\nagent: {{name: evolution, "
                                            "options: {initial_layouts: many}}\n"),
                                    "evolution option initial_layouts: Input should be a valid "
                                    "integer"),
    "agent option value": lambda t: (tune(t, f"workload: '{GMM}'\nagent: {{name: evolution, "
                                             "options: {epsilon: 1.5}}\n"),
                                     "agent.options: evolution option epsilon: Input should be "
                                     "less than or equal to 1 (got 1.5)"),
    "agent option unknown": lambda t: (tune(t, f"workload: '{GMM}'\nagent: {{name: random, "
                                               "options: {steps: 3}}\n"),
                                       "random takes no option 'steps'; allowed: seed"),
    "agent unknown": lambda t: (tune_flags(t, "--agent", "ppo2"), "unknown agent 'ppo2'"),
    "agent module missing": lambda t: (tune_flags(t, "--agent", "nomod:Climber"),
                                       "No module named 'nomod'"),
    "agent module raises": lambda t: (
        module(t, "boom_agent", "raise RuntimeError('import-time failure')"),
        tune_flags(t, "--agent", "boom_agent:Climber"))[1:] + ("import-time failure",),
    "agent not an Agent": lambda t: (module(t, "plain_agent", AGENT),
                                     tune_flags(t, "--agent", "plain_agent:NotAnAgent"))[1:]
    + ("is not a subclass of agents.base.Agent",),
    "agent module option type": lambda t: (module(t, "my_agent", AGENT), tune(
        t, f"workload: '{GMM}'\nagent: {{name: 'my_agent:Climber', options: {{radius: far}}}}\n"
    ))[1:] + ("radius: Input should be a valid integer",),
    "mapping the workload cannot have": lambda t: (  # N=4: fewer outputs than any x86 dot has lanes
        tune(t, "workload: 'gmm:M=8,N=4,K=3,dtype=int8'\nmapping: amos\n"),
        "none of the 1 amos mappings of gmm:M=8,N=4,K=3,dtype=int8"),
    # names and the config itself
    "name ..": lambda t: (tune_flags(t, "--name", ".."), "'..' is not a directory name"),
    "name .": lambda t: (tune_flags(t, "--name", "."), "'.' is not a directory name"),
    "name with a slash": lambda t: (tune_flags(t, "--name", "a/b"), "not a directory name"),
    "config missing": lambda t: (["tune", str(t / "none.yaml")], "no such file"),
    "config not YAML": lambda t: (tune(t, "budget: [\n"), "not valid YAML"),
    "workload spec": lambda t: (tune(t, "workload: 'gmm:M=8'\n"), "missing N, K"),
    "seed not a number": lambda t: (tune_flags(t, "--seed", "abc"),
                                    "argument --seed: 'abc' is not an integer"),
    "seed negative": lambda t: (tune_flags(t, "--seed", "-1"),
                                "argument --seed: -1 is out of range"),
    "unknown command": lambda t: (["frobnicate"], "invalid choice: 'frobnicate'"),
    "set without =": lambda t: (tune_flags(t, "--set", "measure"), "expected KEY=VALUE"),
    # records of an earlier run
    "records garbage": lambda t: (resumed(t, record() + "\ngarbage\n"),
                                  "records.jsonl:2: not a record: not JSON"),
    "records wrong field": lambda t: (resumed(t, record(bogus=1) + "\n"),
                                      "records.jsonl:1: not a record: bogus: Extra inputs"),
    "records wrong type": lambda t: (resumed(t, record(latencies="fast") + "\n"),
                                     "records.jsonl:1: not a record: latencies: Input should be "
                                     "a valid list"),
    "records impossible value": lambda t: (resumed(t, record(latencies=[-1.0]) + "\n"),
                                           "latencies.0: Input should be greater than 0"),
    "records final without records": lambda t: (resumed(t, json.dumps({"final": {
        "workload": GMM, "keys": ["0" * 32], "latencies": [1e-3], "trials": 1}}) + "\n"),
        "final: keys without an earlier record"),
    "records not a candidate": lambda t: (resumed(t, record(layouts={"factors": {"zz": 3}}) + "\n"),
                                          f"records.jsonl:1: not a candidate of {GMM}"),
    "run directory of another run": lambda t: (
        resumed(t, ""), tune(t, "workload: 'gmm:M=16,N=8,K=8'\n"))[1:]
    + ("holds a run with workload='gmm:M=8,N=8,K=8'",),
    # training
    "train an agent without save": lambda t: (
        ["train", config(t, f"workloads: ['{GMM}']\nagent: random\n")], "has nothing to train"),
    "train no workloads": lambda t: (["train", config(t, "workloads: []\n")],
                                     "give at least one of 'workloads', 'models'"),
    "train pretrain without a cost model": lambda t: (
        ["train", config(t, "pretrain: {draw: {count: 2}, timesteps: 8}\n"
                            "agent: {name: ppo, options: {checkpoint: null}}\n")],
        "pretrain: needs a cost model"),
    "train corpus kinds": lambda t: (
        ["train", config(t, "corpus: {draw: {count: 2, kinds: [c4d]}}\n")],
        "unknown kinds ['c4d']"),
    "train corpus with an agent that cannot pretrain": lambda t: (
        ["train", config(t, "corpus: {draw: {count: 2}}\nagent: mind_mappings\n")],
        "cannot pretrain on cost-model rewards"),
    "train budget 0": lambda t: (["train", config(t, f"workloads: ['{GMM}']\nbudget: 0\n")],
                                 "budget: 0 trials measure nothing"),
    # export
    "export not a run": lambda t: (export(t, t / "nowhere"), "is not a finished run"),
    "export output not empty": lambda t: (
        (t / "out").mkdir(), (t / "out" / "manifest.json").write_text("{}"),
        export(t, finished_run(t, "{}")))[2:] + ("is not empty (manifest.json)",),
    "export best not JSON": lambda t: (export(t, finished_run(t, "{oops")),
                                       "best.json: not JSON"),
    "export best fields": lambda t: (export(t, finished_run(t, "{}")),
                                     "best.json: factors: Field required"),
    "export config not YAML": lambda t: (export(t, finished_run(t, "{}", cfg="name: [")),
                                         "config.yaml: not valid YAML"),
    "export model run of an older altenv": lambda t: (export(t, finished_run(
        t, json.dumps({"tasks": {}}), body="model: resnet18\n")), "keeps no imported model"),
    "export kept model damaged": lambda t: (
        (t / "runs" / "r" / "model").mkdir(parents=True),
        (t / "runs" / "r" / "model" / "model.json").write_text("{}"),
        export(t, finished_run(t, json.dumps({"tasks": {}}), body="model: resnet18\n")))[2:]
    + ("model: not a kept model (FileNotFoundError",),
    "export best not of the template": lambda t: (export(t, finished_run(t, json.dumps(
        {"factors": {"zz": 2}, "decisions": [], "latency_s": 1e-3}))), "best.json:"),
    # bench
    "bench filter regex": lambda t: (bench(t, "--workload", GMM, "--filter", "("),
                                     "--filter '(': not a regular expression"),
    "bench workload spec": lambda t: (bench(t, "--workload", "gmm:M=8"), "missing N, K"),
    "bench suite missing": lambda t: (bench(t, "--suite", "nope"), "no such suite"),
    "bench tuner unknown": lambda t: (bench(t, "--workload", GMM, "--tuners", "bogus"),
                                      "unknown tuner 'bogus'"),
    "bench agent syntax": lambda t: (bench(t, "--workload", GMM, "--agent", "evo8"),
                                     "expected LABEL=AGENT"),
    "bench agent option type": lambda t: (
        bench(t, "--workload", GMM, "--tuners", "e",
              "--agent", "e=evolution{initial_layouts: many}"),
        "initial_layouts: Input should be a valid integer"),
    "bench agent module missing": lambda t: (
        bench(t, "--workload", GMM, "--tuners", "altenv", "--altenv-agent", "nomod:Agent"),
        "No module named 'nomod'"),
    "bench budget 0": lambda t: (bench(t, "--workload", GMM, "--budget", "0"),
                                 "argument --budget: 0 is out of range: allowed 1 or more"),
    "bench net model missing": lambda t: (bench(t, "--model", f"{t}/none.onnx", kind="net"),
                                          "cannot import it (FileNotFoundError"),
    "bench target banana": lambda t: (bench(t, "--workload", GMM, "--set", "target=banana"),
                                      "target: unsupported value 'banana'"),
    "bench suite and workloads": lambda t: (bench(t, "--suite", "smoke", "--workload", GMM),
                                            "give either --suite NAME or --workload SPEC"),
}
if not GPU:
    CASES["target cuda without a GPU"] = lambda t: (
        tune(t, f"workload: '{GMM}'\ntarget: cuda\n"), "'cuda' needs a cuda device")
    CASES["bench target cuda without a GPU"] = lambda t: (
        bench(t, "--workload", GMM, "--set", "target=cuda"), "'cuda' needs a cuda device")


def snapshot(root: Path) -> dict[str, bytes | None]:
    """Every path under ``root`` with its bytes (``None`` for folders), lock files aside."""
    return {str(p.relative_to(root)): None if p.is_dir() else p.read_bytes()
            for p in sorted(root.rglob("*")) if p.name != ".lock"}


def test_there_are_enough_cases():
    assert len(CASES) >= 40


@pytest.mark.parametrize("case", CASES)
def test_bad_input_gets_one_line_and_leaves_nothing(case, tmp_path, capsys, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    argv, says = CASES[case](tmp_path)
    before = snapshot(tmp_path)
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1, err
    assert err.startswith("altenv: ") and "Traceback" not in err
    assert says in err, err
    assert snapshot(tmp_path) == before

"""Plug-ins as a user writes them: the example agent (``examples/custom_agent.py``) in the
tuning loop and through ``altenv tune``, the SB3 example, and ``envs.describe``."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
from synthetic import SyntheticMeasurer

import agents
from altenv.cli import main
from altenv.records import RecordDB
from altenv.tuning import Budget, OpTask, TuningSession, tune
from envs.describe import describe

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
GMM = "gmm:M=16,N=16,K=16"


@pytest.fixture
def examples_path(monkeypatch: pytest.MonkeyPatch) -> Path:
    """``examples/`` on ``sys.path``, as ``PYTHONPATH=examples`` gives a user."""
    monkeypatch.syspath_prepend(str(EXAMPLES))
    return EXAMPLES


def test_describe_lists_ids_and_spaces():
    text = describe()
    for env_id in ("altenv/LayoutTuning-v0", "altenv/LoopTuning-v0", "altenv/JointTuning-v0"):
        assert env_id in text
    assert text.count("Box(0.0, 1.0, (3,), float32)") == 2  # GMM's three layout knobs
    assert "MultiDiscrete(" in text and "## Rewards" not in text
    one = describe("altenv/LoopTuning-v0")
    assert "altenv/LayoutTuning-v0" not in one
    for section in ("## Action Space", "## Observation Space", "## Rewards", "## Episode End",
                    "## Arguments"):
        assert section in one
    with pytest.raises(ValueError, match="unknown env id 'altenv/Nope-v0'; registered: altenv"):
        describe("altenv/Nope-v0")


def test_hill_climber_in_the_tuning_loop(examples_path, tmp_path):
    """The example agent, named as a config names it, through ``tune``: the budget is
    spent, the loop-only stage stays on the best layout, proposals are valid neighbours."""
    task = OpTask(GMM)
    with RecordDB(tmp_path / "records.jsonl") as db:
        session = TuningSession(task, SyntheticMeasurer(), db, check=False)
        agent = agents.create("custom_agent:HillClimber", seed=0, max_radius=4)
        tune(session, agent, Budget(8, 16), batch=16, top_k=4, progress=False)
        assert session.trials == 24
        best, latency = session.best
        assert agent.best_latency == latency and agent.radius in (1, 2, 4)
        assert {str(r.layouts["factors"]) for r in db.records()[8:]} == \
            {str(dict(best.factors))}
        proposed = agent.propose(session, 16, best.factors)
        assert proposed and all(c.factors == best.factors for c in proposed)
        assert all(session.schedule(c) is not None for c in proposed)
        assert best not in proposed


@pytest.mark.slow
def test_custom_agent_config_through_cli(examples_path, tmp_path, capsys):
    """``PYTHONPATH=examples altenv tune examples/custom_agent.yaml`` with real timings."""
    config = examples_path / "custom_agent.yaml"
    assert main(["tune", str(config), "--budget", "8", "--output-dir", str(tmp_path),
                 "--quiet"]) == 0
    assert "best " in capsys.readouterr().out
    run = tmp_path / "custom_agent"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["trials"] == 8 and summary["max_rel_err_vs_torch"] < 1e-3
    assert "custom_agent:HillClimber" in (run / "config.yaml").read_text()


def test_sb3_example_trains_both_algorithms(examples_path):
    import sb3_custom_extractor as example

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # untrained cost model: random rewards
        layouts = example.main(["--workload", GMM, "--timesteps", "8"])
    assert set(layouts) == {"ppo/JointTuning-v0", "a2c/LayoutTuning-v0"}
    template = OpTask(GMM).template
    for factors in layouts.values():
        template.check(factors)

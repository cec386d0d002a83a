"""The tuning loop end to end on a tiny operator: random agent, cost model, records,
correctness of the best program, and resume without re-measuring."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import agents
import agents.options
from agents.options import EvolutionOptions, RandomOptions
from altenv import pretrained
from altenv.measure import MeasureConfig, create
from altenv.ops import run_numpy
from altenv.records import RecordDB, candidate_key
from altenv.space import StaleRecordError
from altenv.tuning import Budget, Candidate, OpTask, TuningSession, tune
from altenv.tuning.transfer import carry_back, tuned_task, warm_start

SPEC = "c2d:N=1,I=8,O=16,H=8,W=8,KH=3,KW=3,pad=1"


@pytest.fixture(scope="module")
def measurer():
    with create("local", MeasureConfig(number=1, repeat=2, min_repeat_ms=5)) as m:
        yield m


@pytest.mark.slow
def test_random_tuning_resumes_without_remeasuring(measurer, tmp_path):
    task = OpTask(SPEC, epilogue=("bias", "relu"))
    db = RecordDB(tmp_path / "records.jsonl")
    session = TuningSession(task, measurer, db)
    best = tune(session, agents.create("random", seed=1), Budget.split(12), batch=32,
                top_k=4, progress=False)
    assert session.trials == 12 and db.count(task.key) == 12
    assert np.isfinite(best)
    assert session.history == sorted(session.history, reverse=True)
    ok = [r for r in db.records() if r.ok]
    assert ok, [r.error for r in db.records()]
    # the joint stage tried several layouts, the loop-only stage kept the best one
    assert len({str(r.layouts["factors"]) for r in db.records()[:4]}) >= 1

    # the eight fastest were re-timed side by side; the fastest of that re-timing is the best
    final = db.final(task.key)
    by_latency = sorted((r for r in db.records() if r.ok), key=lambda r: r.median)
    assert final is not None and final.trials == 12
    assert final.keys == [r.key for r in by_latency[:8]]
    assert db.best(task.key).key == final.winner[0] and best == final.winner[1]

    # the best schedule computes the right numbers (checked again outside the runner)
    cand, latency = session.best
    program = task.program(cand.factors)
    raw = program.random_inputs(7)
    out = run_numpy(program, raw, func=session.schedule(cand).mod)
    np.testing.assert_allclose(out, program.reference(raw), rtol=1e-4, atol=1e-4)

    # reopen: records count against the budget, nothing is measured twice
    keys = [r.key for r in db.records()]
    db.close()
    db2 = RecordDB(tmp_path / "records.jsonl")
    resumed = TuningSession(OpTask(SPEC, epilogue=("bias", "relu")), measurer, db2)
    assert resumed.trials == 12 and resumed.best[1] == latency
    assert resumed.cost_model.num_records == len([r for r in db2.records() if r.ok]) or \
        resumed.cost_model.num_records == 12
    tune(resumed, agents.create("random", seed=1), Budget.split(20), batch=32, top_k=4,
         progress=False)
    keys2 = [r.key for r in db2.records()]
    assert len(keys2) == 20 and len(set(keys2)) == 20 and keys2[:12] == keys
    assert db2.final(task.key).trials == 20  # the new records made the old finalists stale
    finals = (tmp_path / "records.jsonl").read_text().count('"final"')
    tune(resumed, agents.create("random", seed=1), Budget.split(20), progress=False)
    assert (tmp_path / "records.jsonl").read_text().count('"final"') == finals == 2
    # finalists timed warm are not current for a cold final pick: it re-times them, cold
    assert not db2.final(task.key).cold
    cold = resumed.finalize(8, cold=True)
    assert cold is not None and cold.cold and db2.final(task.key) is cold
    assert (tmp_path / "records.jsonl").read_text().count('"final"') == 3
    assert resumed.finalize(8, cold=True) is cold

    # records written by a version whose design space had another shape: a clear refusal
    lines = (tmp_path / "records.jsonl").read_text().splitlines()
    data = json.loads(lines[0])
    data["schedule"]["decisions"].append(0)
    old_key, data["key"] = data["key"], candidate_key(  # as that version wrote it
        data["workload"], data["target"], data["layouts"], data["schedule"]["trace"],
        data["schedule"]["decisions"])
    stale = tmp_path / "stale.jsonl"
    stale.write_text("\n".join([json.dumps(data)] + lines[1:]).replace(old_key, data["key"])
                     + "\n")
    with RecordDB(stale) as db3, pytest.raises(StaleRecordError, match=(
            rf"{stale}: cannot resume .* loop decisions does not fit this design space .* "
            "tune into a new run directory")):
        TuningSession(OpTask(SPEC, epilogue=("bias", "relu")), measurer, db3)


def test_agent_registry_errors():
    with pytest.raises(ValueError, match="unknown agent 'nope'; allowed: dataset_best, evolution, "
                       "heron_cga, mind_mappings, ppo, random"):
        agents.create("nope")
    with pytest.raises(ValueError, match="cannot import"):
        agents.create("no_such_module:Agent")
    with pytest.raises(ValueError, match="not a subclass"):
        agents.create("numpy:ndarray")


def test_agent_options_are_one_typed_model_validated_once(tmp_path):
    """A built-in agent's options are its ``Options`` model (:mod:`agents.options`): values
    converted to its types, unknown or bad ones refused in one line, before and without
    importing the agent; the agent is made from the validated model, which ``build`` does
    not validate again (``defaults`` fill only what the options leave unset)."""
    evolution = agents.agent_class("evolution")
    assert agents.options_model(evolution) is EvolutionOptions is evolution.Options
    fields = EvolutionOptions.model_fields
    assert fields["initial_layouts"].default == 4 and "seed" in fields
    agent = agents.build("evolution", {"initial_layouts": "8", "epsilon": 1},
                         {"seed": 5, "tensorboard_log": "tb"})  # defaults it does not take
    assert (agent.initial_layouts, agent.epsilon) == (8, 1.0)
    with pytest.raises(ValueError, match=r"evolution option initial_layouts: Input should be a "
                                         r"valid integer.* \(got 'many'\)"):
        agents.create("evolution", initial_layouts="many")
    with pytest.raises(ValueError, match="random takes no option 'steps'; allowed: seed"):
        agents.create("random", steps=3)
    with pytest.raises(ValueError, match=r"^evolution option epsilon: Input should be less than "
                                         r"or equal to 1 \(got 1.5\)$"):
        agents.validate_options("evolution", {"epsilon": 1.5})
    with pytest.raises(ValueError, match=r"^evolution option layout_draws: Input should be "
                                         r"'solver' or 'actions' \(got 'eq2'\)$"):
        agents.validate_options("evolution", {"layout_draws": "eq2"})
    with pytest.raises(ValueError, match=r"^evolution option cost_model: must be null, "
                                         r"'pretrained' or a checkpoint directory holding a "
                                         r"costmodel.npz \(got "):
        agents.validate_options("evolution", {"cost_model": str(tmp_path)})
    with pytest.raises(ValueError, match=r"^heron_cga option mutation_prob: Input should be "
                                         r"less than or equal to 1 \(got 2\)$"):
        agents.validate_options("heron_cga", {"mutation_prob": 2})
    assert agents.check_options(agents.agent_class("mind_mappings"), {"hidden_sizes": [8, 4]},
                                "mm").model_dump(exclude_unset=True) == {"hidden_sizes": [8, 4]}

    valid = agents.validate_options("evolution", {"seed": 3, "population": "8"})
    assert isinstance(valid, EvolutionOptions) and valid.population == 8
    seen = []
    real = EvolutionOptions.model_validate
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(EvolutionOptions, "model_validate",
                   classmethod(lambda cls, *a, **k: seen.append(a) or real(*a, **k)))
        agent = agents.build("evolution", valid, {"seed": 9, "race_trials": 2, "nope": 1})
    assert not seen  # not validated again
    assert (agent.population, agent.race_trials) == (8, 2)
    assert agent.rng.bit_generator.state == np.random.default_rng(3).bit_generator.state
    with pytest.raises(TypeError, match="RandomOptions, not EvolutionOptions"):
        agents.build("evolution", RandomOptions())
    assert isinstance(agents.build("random", RandomOptions(seed=2)), type(agents.create("random")))


def test_options_of_a_keyword_agent_come_from_its_init():
    """A class without ``Options`` keeps its keywords: a model of its ``__init__``."""

    class Keywords(agents.Agent):
        def __init__(self, radius: int = 2, name: str = "x", **more):
            self.radius, self.more = radius, more

        def propose(self, session, n, layout):
            return []

    model = agents.options_model(Keywords)
    assert list(model.model_fields) == ["radius", "name"]
    valid = agents.check_options(Keywords, {"radius": "3", "other": 1}, "kw")
    assert valid.radius == 3 and valid.model_extra == {"other": 1}


def test_agent_options_import_no_agent_tvm_or_torch():
    """Reading a config checks agent options without importing the agents (TVM, torch)."""
    code = ("import sys, agents, agents.options\n"
            "agents.validate_options('ppo', {'seed': 1, 'checkpoint': None})\n"
            "agents.validate_options('evolution', {'cost_model': 'pretrained'})\n"
            "print(sorted(m for m in sys.modules if m.startswith(('tvm', 'torch', "
            "'stable_baselines3', 'agents.'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=Path(agents.__file__).parents[1]).stdout
    assert out.strip() == "['agents.base', 'agents.options']"
    assert agents.options.PRETRAINED == pretrained.PRETRAINED
    assert set(agents.options.BUILTIN) == set(agents.available())
    for name, (where, model) in agents.options.BUILTIN.items():
        assert agents.agent_class(name).Options is model
        assert where.endswith(":" + agents.agent_class(name).__name__)


@pytest.mark.slow
@pytest.mark.parametrize("spec", ["gmm:M=32,N=32,K=512,dtype=float16",
                                  "gmm:M=16,N=32,K=64,dtype=int8"])
def test_float16_and_int8_candidates_pass_the_check_of_their_dtype(measurer, tmp_path, spec):
    """float16 sums in float16 (its error grows with K, 8e-3 here): the float32 tolerance
    rejected every candidate and a run burnt its budget. int8 sums in int32, exactly (some
    int8 schedules fail to build in TVM; none may fail the check)."""
    task = OpTask(spec)
    factors = task.default_factors()
    with RecordDB(tmp_path / "records.jsonl") as db:
        session = TuningSession(task, measurer, db)
        points = task.space(factors).sample(4, np.random.default_rng(0))
        latencies = session.measure([Candidate(factors, p) for p in points])
        errors = [r.error for r in db.records() if r.error is not None]
    assert sum(np.isfinite(latencies)) >= 3 and not any("wrong result" in e for e in errors)
    op = task.program(factors).op
    assert op.tolerance() == (0.0 if "int8" in spec else 2 ** -9 * 512 ** 0.5)


@pytest.mark.slow
def test_a_wall_clock_budget_stops_the_trials_and_a_resume_goes_on(measurer, tmp_path):
    task = OpTask("gmm:M=16,N=16,K=16")
    db = RecordDB(tmp_path / "records.jsonl")
    session = TuningSession(task, measurer, db)
    agent = agents.create("random", seed=1)
    assert tune(session, agent, Budget.split(8), top_k=4, progress=False, seconds=0.0) \
        == float("inf")
    assert session.out_of_time and session.remaining == 0 and session.trials == 0
    tune(session, agent, Budget.split(8), top_k=4, progress=False)  # no deadline now
    assert session.deadline is None and session.trials == db.count(task.key) == 8
    split = session.seconds_per_trial()
    assert split["measure_wall"] > 0 and split["run"] > 0
    assert split["search"] + split["cost_model"] + split["measure_wall"] \
        < sum(session.seconds.values())
    assert split == pytest.approx({k: v / 8 for k, v in session.seconds.items()})


@pytest.mark.slow
def test_an_agent_that_drives_the_session_itself_has_its_own_time_counted_as_search(
        measurer, tmp_path):
    """Agents that override ``run`` (SB3 policies learning between batches) have their
    work outside the cost model and the measurements in the ``search`` part of the split,
    as the default loop's proposals are."""
    import time

    class Pondering(agents.agent_class("random")):
        def run(self, session, budget, batch, top_k, report):
            time.sleep(0.2)  # a policy update between batches, say
            super().run(session, budget, batch, top_k, report)

    session = TuningSession(OpTask("gmm:M=16,N=16,K=16"), measurer,
                            RecordDB(tmp_path / "records.jsonl"))
    tune(session, Pondering(RandomOptions(seed=1)), Budget.split(4), top_k=4,
         progress=False, finalists=0)
    assert session.trials == 4 and session.seconds["measure_wall"] > 0
    assert session.seconds["search"] >= 0.2


def test_a_deadline_keeps_time_for_the_finalists_builds_and_runs():
    """Trials fit at the session's pace after the finalists' builds (on the builders at
    once) and re-timing runs, each at the mean of the session's trials."""
    import time
    from types import SimpleNamespace

    from altenv.tuning.session import Deadline

    now = time.monotonic()
    session = SimpleNamespace(trials=10, resumed=0,  # 1 s a trial so far
                              seconds={"build": 10.0, "run": 5.0})  # 1 s, 0.5 s each
    assert Deadline(now + 10.5, now - 10, 0, 0, 0, 1).fits(session) == 10
    assert Deadline(now + 10.5, now - 10, 0, 8, 0, 2).fits(session) == 6  # 4 rounds of 1 s
    assert Deadline(now + 10.5, now - 10, 0, 8, 24, 2).fits(session) == 0  # 4 s + 12 s
    assert Deadline(now + 10.5, now - 10, 10, 0, 0, 1).fits(session) is None  # no pace yet
    assert Deadline(now - 1, now - 10, 10, 0, 0, 1).fits(session) == 0


@pytest.mark.slow
def test_metaschedule_under_a_deadline_stops_when_it_has_come(tmp_path):
    """MetaSchedule's search wrapped in a deadline: one far off leaves it as it was (the
    trial budget ends it); one that has come ends it before anything is measured."""
    from altenv.baselines import NoValidMeasurementsError, tune_tir_baseline
    from altenv.ops import generate

    program = generate("gmm:M=16,N=16,K=16")
    config = MeasureConfig(number=1, repeat=2, min_repeat_ms=2)
    far = tune_tir_baseline(program, tmp_path / "far", 4, config=config, seconds=1e6)
    assert far.tuning.trials == 4
    with pytest.raises(NoValidMeasurementsError):
        tune_tir_baseline(program, tmp_path / "past", 4, config=config, seconds=1e-9)


def test_budget_split():
    assert Budget.split(1000) == Budget(300, 700)
    assert Budget.split(64).total == 64


@pytest.mark.slow
def test_batched_gmm_tunes_to_a_correct_program(measurer, tmp_path):
    """Attention's batched products (BERT) are tuned like any GMM: layouts, loops, checks."""
    task = OpTask("gmm:M=8,N=12,K=16,batch=3")
    with RecordDB(tmp_path / "records.jsonl") as db:
        session = TuningSession(task, measurer, db)
        tune(session, agents.create("random", seed=2), Budget.split(6), batch=16, top_k=2,
             progress=False)
        cand, _ = session.best
        assert cand is not None, [r.error for r in db.records()]
        program = task.program(cand.factors)
        assert program.layouts["out"].logical_shape == (3, 8, 12)
        raw = program.random_inputs(5)
        out = run_numpy(program, raw, func=session.schedule(cand).mod)
        np.testing.assert_allclose(out, program.reference(raw), rtol=1e-4, atol=1e-4)


def _tile_decisions(sch) -> list[tuple[int, ...]]:
    return [tuple(int(v) for v in sch.trace.get_decision(inst)) for inst in sch.trace.insts
            if inst.kind.name == "SamplePerfectTile"]


@pytest.mark.slow
def test_warm_start_carries_a_siblings_fastest_over(measurer, tmp_path):
    """A task of the same operator with another epilogue starts from its sibling's fastest
    candidates: same layouts, same tiling, right numbers."""
    sibling = OpTask(SPEC, epilogue=("bias",))
    task = OpTask(SPEC, epilogue=("bias", "residual", "relu"))
    with RecordDB(tmp_path / "records.jsonl") as db:
        tuned = TuningSession(sibling, measurer, db)
        tune(tuned, agents.create("random", seed=2), Budget.split(8), batch=16, top_k=4,
             progress=False)
        carried = tuned_task(tuned, 3)
        assert carried.candidates[0] == (tuned.best[1], tuned.best[0])
        assert len(carried.candidates) == 3
        later = [lat for lat, _ in carried.candidates[1:]]
        assert later == sorted(later) and all(np.isfinite(later))

        seeds = warm_start(task, [carried], 3)
        assert len(seeds) == 3
        for seed, (_, source) in zip(seeds, carried.candidates, strict=True):
            assert seed.factors == source.factors
            assert _tile_decisions(task.space(seed.factors).decode(seed.point)) == \
                _tile_decisions(sibling.space(source.factors).decode(source.point))
        assert warm_start(task, [], 3) == [] and warm_start(task, [carried], 0) == []

        # measured like any candidate, each checked against torch first
        session = TuningSession(task, measurer, db)
        assert all(np.isfinite(session.measure(seeds)))
        assert [r.layouts["factors"] for r in db.records(task.key)] == \
            [dict(s.factors) for s in seeds]


@pytest.mark.slow
def test_carry_back_measures_a_later_siblings_fastest_and_repicks(measurer, tmp_path):
    """A task tuned before its sibling measures the sibling's fastest candidates it has not
    measured (up to ``n``, within ``limit``), re-times its finalists with them, and
    measures nothing again when called a second time (a resumed run)."""
    early = OpTask(SPEC, epilogue=("bias", "relu"))
    later = OpTask(SPEC, epilogue=("bias", "residual", "relu"))
    with RecordDB(tmp_path / "records.jsonl") as db:
        first = TuningSession(early, measurer, db)
        tune(first, agents.create("random", seed=3), Budget.split(6), batch=16, top_k=3,
             progress=False)
        second = TuningSession(later, measurer, db)
        tune(second, agents.create("random", seed=4), Budget.split(8), batch=16, top_k=4,
             progress=False)
        tuned = tuned_task(second, 4)
        expected = [c for c in warm_start(early, [tuned], 4) if first.measured(c) is None][:2]
        assert expected  # independent random searches: the sibling found new candidates

        carried = carry_back(first, [tuned], 2, limit=first.trials + 2, finalists=8)
        assert carried == expected
        assert all(np.isfinite(first.measure(carried)))
        assert db.count(early.key) == 6 + len(carried)
        assert [r.layouts["factors"] for r in db.records(early.key)[6:]] == \
            [dict(c.factors) for c in carried]
        final = db.final(early.key)  # re-timed with the carried candidates among them
        assert final is not None and final.trials == 6 + len(carried)
        assert first.best[0] is not None

        again = carry_back(first, [tuned], 2, limit=6 + len(carried), finalists=8)
        assert db.count(early.key) == 6 + len(carried) and db.final(early.key) == final
        assert not set(again) & set(carried)

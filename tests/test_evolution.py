"""The ``evolution`` agent: layout scheduling, valid evolved batches, budget and resume."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from test_plugins import SyntheticMeasurer

import agents
from altenv.measure import MeasureConfig, create
from altenv.records import RecordDB
from altenv.space.constraints import Hardware, LayoutConstraints
from altenv.tuning import Budget, OpTask, TuningSession, tune
from altenv.tuning.task import Candidate, freeze

C2D = "c2d:N=1,I=8,O=16,H=8,W=8,KH=3,KW=3,pad=1"


def _tune(task, db, budget, seed=0, callbacks=(), **options):
    options = {"ms_population": 32, "ms_batch": 8, **options}
    session = TuningSession(task, SyntheticMeasurer(), db, check=False)
    agent = agents.create("evolution", seed=seed, population=16, generations=2, children=16,
                          samples=12, **options)
    tune(session, agent, budget, top_k=4, progress=False, callbacks=callbacks)
    return session, agent


def _killed_and_resumed(task, path, budget, cut, seed=1, **options):
    """Tune until ``cut`` trials are measured, kill the run there, then resume it on the
    same records (with ``seed``): the resumed session, agent and records."""

    def kill(session):
        if session.trials >= cut:
            raise KeyboardInterrupt

    with RecordDB(path) as db, pytest.raises(KeyboardInterrupt):
        _tune(task, db, budget, callbacks=[kill], **options)
    with RecordDB(path) as db:
        session, agent = _tune(task, db, budget, seed=seed, **options)
        return session, agent, db.records(task.key)


def test_budget_stages_and_layout_schedule(tmp_path):
    task = OpTask(C2D)
    with RecordDB(tmp_path / "records.jsonl") as db:
        session, agent = _tune(task, db, Budget(16, 16))
        assert session.trials == 32
        records = db.records(task.key)
        keys = [r.key for r in records]
        assert len(set(keys)) == len(keys)  # nothing measured twice
        layouts = [tuple(sorted(r.layouts["factors"].items())) for r in records]
        # the joint stage starts with the default layout, then the initial draws, one batch
        # (top_k) each; every initial layout is vector-friendly or the default
        assert layouts[0] == task.default_factors()
        model = LayoutConstraints(task.template, Hardware.of(task.target))
        assert agent._initial[1] == task.blocked_factors(model.hardware.lanes())
        for factors in agent._initial[1:]:
            assert model.holds(model.genes_of(dict(factors)))
        first = list(dict.fromkeys(layouts[:4 * len(agent._initial)]))
        assert first == agent._initial
        # the loop-only stage stays on the best layout of the joint stage
        best_joint = min(records[:16], key=lambda r: r.median).layouts["factors"]
        assert all(r.layouts["factors"] == best_joint for r in records[16:])


def test_one_initial_layout_per_joint_batch_drawn_as_layout_actions(tmp_path):
    task = OpTask(C2D)
    with RecordDB(tmp_path / "records.jsonl") as db:
        _, agent = _tune(task, db, Budget(24, 8), initial_layouts=None, layout_draws="actions")
        layouts = [freeze(r.layouts["factors"]) for r in db.records(task.key)]
        # each of the joint stage's 6 batches (top_k 4) gets a layout of its own: the
        # default, the blocked one, then ALT Eq. 2 draws that the layout model allows
        assert len(agent._initial) == 6 and agent._initial[0] == task.default_factors()
        assert agent._initial[1] == task.blocked_factors(Hardware.of(task.target).lanes())
        assert [layouts[4 * b:4 * b + 4] for b in range(6)] == [[f] * 4 for f in agent._initial]
        model = LayoutConstraints(task.template, Hardware.of(task.target))
        assert all(model.holds(model.genes_of(dict(f))) for f in agent._initial[1:])
        # they are layout actions of the agent's seed (RandSAT solutions would not be)
        rng = np.random.default_rng(0)
        actions = {task.random_factors(rng) for _ in range(300)}
        assert set(agent._initial[2:]) <= actions


def test_fewer_initial_layouts_then_the_best_two_in_turn(tmp_path):
    task = OpTask(C2D)
    with RecordDB(tmp_path / "records.jsonl") as db:
        _, agent = _tune(task, db, Budget(24, 0), initial_layouts=2, explore_layout=0.0)
        layouts = [freeze(r.layouts["factors"]) for r in db.records(task.key)]
        assert len(agent._initial) == 2
        assert layouts[:8] == [agent._initial[0]] * 4 + [agent._initial[1]] * 4
        assert set(layouts) == set(agent._initial)  # no neighbours without explore_layout


@pytest.mark.parametrize("joint, rounds", [(48, 2), (44, 1)])
def test_a_second_round_of_initial_layouts_where_the_joint_stage_holds_three(
        tmp_path, joint, rounds):
    task = OpTask(C2D)
    with RecordDB(tmp_path / "records.jsonl") as db:
        _, agent = _tune(task, db, Budget(joint, 0), explore_layout=0.0)
        layouts = [freeze(r.layouts["factors"]) for r in db.records(task.key)]
        assert len(agent._initial) == 4  # 4 batches of top_k 4 a round: 3 rounds in 48
        one_round = [f for f in agent._initial for _ in range(4)]
        assert layouts[:16 * rounds] == one_round * rounds
        assert len(set(layouts[16 * rounds:])) <= 2  # then the best two in turn


def test_the_blocked_layout_gets_its_second_batch_after_every_first_one(tmp_path):
    task = OpTask(C2D)
    # killed after the first round, before the blocked second batch
    _, agent, records = _killed_and_resumed(task, tmp_path / "records.jsonl", Budget(32, 0),
                                            16, seed=0, explore_layout=0.0, blocked_rounds=2)
    layouts = [freeze(r.layouts["factors"]) for r in records]
    blocked = task.blocked_factors(Hardware.of(task.target).lanes())
    assert agent._initial[1] == blocked and agent._blocked == blocked
    # one round of the four (32 trials hold fewer than three), then the blocked
    # layout's second batch, resumed where the kill left it, then the best two
    assert layouts[:20] == [f for f in agent._initial for _ in range(4)] + [blocked] * 4
    assert len(set(layouts[20:])) <= 2


def test_killed_second_round_resumes_from_its_records(tmp_path):
    task = OpTask(C2D)
    # killed in the second round, resumed with the same seed: the same draws
    _, agent, records = _killed_and_resumed(task, tmp_path / "records.jsonl", Budget(48, 0),
                                            20, seed=0, explore_layout=0.0, initial_rounds=2)
    layouts = [freeze(r.layouts["factors"]) for r in records]
    assert layouts[:32] == [f for f in agent._initial for _ in range(4)] * 2


def test_evolved_batches_are_valid_and_ranked(tmp_path):
    task = OpTask(C2D)
    with RecordDB(tmp_path / "records.jsonl") as db:
        session, agent = _tune(task, db, Budget(8, 0))
        batch = agent.propose(session, 20, task.default_factors())
        assert 0 < len(batch) <= 20 and len(set(batch)) == len(batch)
        space = task.space(task.default_factors())
        assert all(c.factors == task.default_factors() and space.is_valid(c.point)
                   for c in batch)
        scores = session.predict(batch)
        assert np.all(np.isfinite(scores)) and np.all(np.diff(scores) <= 1e-9)


def test_resumed_run_spends_only_the_rest(tmp_path):
    task = OpTask(C2D)
    with RecordDB(tmp_path / "records.jsonl") as db:
        _tune(task, db, Budget(4, 4))
    with RecordDB(tmp_path / "records.jsonl") as db:
        session, _ = _tune(task, db, Budget(8, 8), seed=1)
        assert session.trials == 16
        keys = [r.key for r in db.records(task.key)]
        assert len(set(keys)) == len(keys) == 16


def test_one_agent_tunes_tasks_in_turn(tmp_path):
    """A model run hands the same agent one task after another."""
    agent = agents.create("evolution", seed=0, population=8, generations=1, children=8,
                          samples=8, ms_population=32, ms_batch=8)
    with RecordDB(tmp_path / "records.jsonl") as db:
        for spec in (C2D, "gmm:M=16,N=16,K=16"):
            session = TuningSession(OpTask(spec), SyntheticMeasurer(), db, check=False)
            tune(session, agent, Budget(4, 4), top_k=4, progress=False)
            assert session.trials == 8
            names = {k for k, _ in session.task.default_factors()}
            assert all({k for k, _ in f} == names for f in agent._initial)


def test_loop_stage_runs_metaschedule_search_from_the_layout_records(tmp_path):
    task = OpTask(C2D)
    with RecordDB(tmp_path / "records.jsonl") as db:
        session, agent = _tune(task, db, Budget(8, 12))
        records = db.records(task.key)
        assert len(records) == 20 and len({r.key for r in records}) == 20
        best_joint = freeze(min(records[:8], key=lambda r: r.median).layouts["factors"])
        search = agent._loop_searches[best_joint]
        assert all(freeze(r.layouts["factors"]) == best_joint for r in records[8:])
        # the loop stage measured MetaSchedule's picks, each read back into a point, and
        # the search's database receives every measured record of the layout (the joint
        # stage's included)
        picked = {c for _, c in search._pending if c is not None}
        assert picked & {c for c, _ in session.measured_items()}
        search._commit()
        on_layout = [c for c, _ in session.measured_items() if c.factors == best_joint]
        assert len(search.database) == len(on_layout) > 12


def _check_race(records, joint, trials):
    """The loop-only stage's records follow a race of the joint stage's four best layouts:
    ``trials`` each, then ``trials`` more for the faster two, then only the winner (on a
    tie of the final two, either: the agent orders them by all their trials so far)."""
    layouts = [freeze(r.layouts["factors"]) for r in records]
    best: dict = {}

    def update(upto):
        for f, r in zip(layouts[:upto], records[:upto]):
            best[f] = min(best.get(f, math.inf), r.median)

    update(joint)
    entrants = sorted(best, key=best.get)[:4]
    assert len(entrants) == 4
    start = joint
    for size in (4, 2):
        got = layouts[start:start + size * trials]
        assert {f: got.count(f) for f in set(got)} == dict.fromkeys(entrants, trials)
        start += size * trials
        update(start)
        entrants = sorted(entrants, key=best.get)[:size // 2]
    winner = set(layouts[start:])
    assert len(winner) == 1 and best[winner.pop()] == best[entrants[0]]


@pytest.mark.parametrize("loop_search, trials, budget", [
    ("metaschedule", 4, Budget(24, 56)),  # the race, (4 + 2) x 4 trials, fits in 28
    ("evolution", 6, Budget(24, 80)),  # quotas of 6 with top_k 4, epsilon exploring
])
def test_loop_stage_races_the_best_layouts_before_keeping_one(tmp_path, loop_search, trials,
                                                               budget):
    task = OpTask(C2D)
    with RecordDB(tmp_path / "records.jsonl") as db:
        _tune(task, db, budget, race_trials=trials, loop_search=loop_search)
        _check_race(db.records(task.key), budget.joint, trials)


def test_killed_race_resumes_from_its_records(tmp_path):
    task = OpTask(C2D)
    budget = Budget(24, 56)
    # killed in the race's first round
    session, _, records = _killed_and_resumed(task, tmp_path / "records.jsonl", budget, 32,
                                              race_trials=4)
    assert session.trials == 80
    _check_race(records, budget.joint, 4)


def test_predicted_layout_rank_races_the_layouts_the_model_ranks_best(tmp_path):
    """With ``layout_rank="predicted"`` the race's entrants are the joint stage's layouts
    ordered by the best cost-model score over each one's evolved loop population, and the
    rounds keep the race's shape (4 trials each for four, 4 more for two, then one)."""
    task = OpTask(C2D)
    budget = Budget(24, 56)
    with RecordDB(tmp_path / "records.jsonl") as db:
        session, agent = _tune(task, db, budget, race_trials=4, layout_rank="predicted")
        records = db.records(task.key)
        layouts = [freeze(r.layouts["factors"]) for r in records]
        assert len(records) == 80 and len(set(r.key for r in records)) == 80
        joint = set(layouts[:24])
        entrants = agent._race_ranks[frozenset(joint)][:4]
        got = layouts[24:40]
        assert {f: got.count(f) for f in set(got)} == dict.fromkeys(entrants, 4)
        finalists = agent._race_ranks[frozenset(entrants)][:2]
        got = layouts[40:48]
        assert {f: got.count(f) for f in set(got)} == dict.fromkeys(finalists, 4)
        winner = agent._race_ranks[frozenset(finalists)][0]
        assert set(layouts[48:]) == {winner}
        # the ranking is the model's: the best predicted score of each layout's population
        bests = {f: min(r.median for r, g in zip(records, layouts) if g == f) for f in joint}
        ranked = agent._rank(session, bests)
        potential = [session.predict(agent._pool[f]).max() for f in ranked]
        assert potential == sorted(potential, reverse=True)
        assert set(ranked) == joint


def test_bad_layout_rank():
    with pytest.raises(ValueError, match=r"evolution option layout_rank: Input should be "
                                         r"'measured' or 'predicted' \(got 'guess'\)"):
        agents.create("evolution", layout_rank="guess")


def _check_revisits(records, joint, stall, turn):
    """Each loop-only record (no race) is on the layout that the stall rule owes it: the
    best so far until ``stall`` trials bring no new best (by 1 %); then turns of ``turn``
    trials for the runner-ups (ranked by their best when the stall began) with the best
    layout's turn in between, until one sets a new best. Returns the runner-ups revisited."""
    layouts = [freeze(r.layouts["factors"]) for r in records]
    medians = [r.median for r in records]
    revisited = set()
    for i in range(joint, len(records)):
        gains = [j for j in range(i) if medians[j] < 0.99 * min(medians[:j], default=math.inf)]
        stalled = max(gains[-1] + 1, joint) + stall
        expected = layouts[min(range(i), key=lambda j: (medians[j], j))]
        if i >= stalled and (i - stalled) // turn % 2 == 0:
            bests: dict = {}
            for f, m in zip(layouts[:stalled], medians[:stalled]):
                bests[f] = min(bests.get(f, math.inf), m)
            ranked = sorted((f for f in bests if math.isfinite(bests[f])), key=bests.get)
            k = (i - stalled) // turn // 2
            if k + 1 < len(ranked):  # behind the best when the stall began
                expected = ranked[k + 1]
                revisited.add(expected)
        assert layouts[i] == expected, f"record {i}"
    return revisited


def test_stalled_loop_stage_revisits_the_runner_up_layouts(tmp_path):
    task = OpTask(C2D)
    with RecordDB(tmp_path / "records.jsonl") as db:
        _tune(task, db, Budget(16, 80), race_layouts=0, stall_trials=8, revisit_trials=4)
        assert len(_check_revisits(db.records(task.key), 16, 8, 4)) >= 2


def test_killed_revisit_resumes_from_its_records(tmp_path):
    task = OpTask(C2D)
    budget = Budget(16, 80)
    options = {"race_layouts": 0, "stall_trials": 8, "revisit_trials": 4}
    with RecordDB(tmp_path / "records.jsonl") as db:
        _tune(task, db, budget, **options)
        full = db.records(task.key)
    cut = next(i for i in range(16, 96) if freeze(full[i].layouts["factors"])
               != freeze(full[i - 1].layouts["factors"])) + 2  # inside the first revisit
    session, _, records = _killed_and_resumed(task, tmp_path / "killed.jsonl", budget, cut,
                                              **options)
    assert session.trials == 96
    assert len({r.key for r in records}) == 96  # nothing measured twice
    assert _check_revisits(records, 16, 8, 4)


class _Measured:
    """What :meth:`EvolutionAgent._revisit` reads of a session: its measured items."""

    def __init__(self, items):
        self.items = items

    def measured_items(self):
        return self.items


def test_a_stall_ends_only_with_a_gain_of_one_percent():
    agent = agents.create("evolution", race_layouts=0, stall_trials=8, revisit_trials=4)
    agent._budget, agent._top_k, agent._exhausted = Budget(6, 200), 4, set()
    a, b, c = (freeze({"nt": n}) for n in (1, 2, 3))

    def add(factors, latency, times=1):
        items.extend([(Candidate(factors, None), latency)] * times)
        return agent._revisit(_Measured(items))

    items = [(Candidate(f, None), t) for f, t in
             [(a, 1.0), (a, 1.5), (b, 1.2), (b, 1.1), (c, 1.3), (c, math.inf)]]
    assert add(a, 2.0, 4) is None  # 4 trials to the stall: a's batches, uncut
    assert add(a, 2.0, 2) == (a, 2)  # a's last batch ends where the stall begins
    assert add(a, 2.0, 2) == (b, 4)  # stalled: the first runner-up's turn
    assert add(b, 0.995) == (b, 3)  # faster than a, by 0.5 %: the stall goes on
    assert add(b, 2.0, 3) == (b, 4)  # the best layout's turn (b's now)
    assert add(b, 2.0, 4) == (c, 4)  # the second runner-up when the stall began
    assert add(a, 0.9) is None  # a new best by 10 %: no stall


def test_no_stall_rule_within_200_trials():
    agent = agents.create("evolution", stall_trials=128)
    agent._budget = Budget.split(200)
    race_end = agent._budget.joint + agent._race_length(agent._race_entrants())
    assert race_end + agent.stall_trials > 200


def test_race_shrinks_to_fit_the_loop_stage():
    agent = agents.create("evolution", race_layouts=4, race_trials=8)
    for loop_only, entrants in ((140, 4), (90, 3), (40, 2), (20, 0)):
        agent._budget = Budget(60, loop_only)
        assert agent._race_entrants() == entrants


def test_cost_model_starts_from_a_checkpoint(tmp_path):
    """``cost_model=`` continues a checkpoint's cross-workload model: the first batch is
    ranked by it (not at random), and the run's records add trees to it."""
    from altenv import pretrained
    from altenv.costmodel import CostModel

    task = OpTask(C2D)
    with RecordDB(tmp_path / "records.jsonl") as db:  # a model trained on another layout's points
        seed_session = TuningSession(task, SyntheticMeasurer(), db, check=False)
        space = task.space(task.default_factors())
        seed_session.measure([Candidate(task.default_factors(), p)
                              for p in space.sample(12, np.random.default_rng(1))])
        base = seed_session.cost_model
        base.fit()
        checkpoint = tmp_path / "checkpoint"
        checkpoint.mkdir()
        base.save(checkpoint / pretrained.COST_MODEL, records=False)

    blocked = task.blocked_factors(Hardware.of(task.target).lanes())
    probe = [Candidate(blocked, p)
             for p in task.space(blocked).sample(16, np.random.default_rng(2))]
    shipped = CostModel.load(checkpoint / pretrained.COST_MODEL)
    with RecordDB(tmp_path / "run.jsonl") as db:
        session = TuningSession(task, SyntheticMeasurer(), db, CostModel(base_warmup=8),
                                check=False)
        agent = agents.create("evolution", seed=0, population=16, generations=2, children=16,
                              samples=12, ms_population=32, ms_batch=8,
                              cost_model=str(checkpoint))
        agent.setup(session)
        assert session.cost_model.is_trained and session.trials == 0
        with RecordDB(tmp_path / "other.jsonl") as other:
            alone = TuningSession(task, SyntheticMeasurer(), other, shipped, check=False)
            assert np.allclose(session.predict(probe), alone.predict(probe))
        tune(session, agent, Budget(12, 4), top_k=4, progress=False)
        assert session.trials == 16
        assert session.cost_model.base is not None  # kept under the trees of the run's records
        assert session.cost_model.booster.num_boosted_rounds() > \
            shipped.booster.num_boosted_rounds()


def test_cost_model_pretrained_is_the_shipped_one_for_the_target(tmp_path):
    from altenv import pretrained

    path = pretrained.ppo_checkpoint()
    if path is None:
        pytest.skip("no shipped checkpoint")
    task = OpTask(C2D)
    with RecordDB(tmp_path / "records.jsonl") as db:
        session = TuningSession(task, SyntheticMeasurer(), db, check=False)
        assert not session.cost_model.is_trained  # random ranking before its first training
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # this CPU may not be the checkpoint's
            agents.create("evolution", cost_model="pretrained").setup(session)
        assert session.cost_model.base is pretrained.cost_model(path).booster


def test_bad_cost_model(tmp_path):
    with pytest.raises(ValueError, match="evolution option cost_model: must be null, 'pretrained' "
                                         "or a checkpoint directory holding a costmodel.npz"):
        agents.create("evolution", cost_model=str(tmp_path))


def test_bad_loop_search():
    with pytest.raises(ValueError, match="evolution option loop_search: Input should be "
                                         "'metaschedule' or 'evolution'"):
        agents.create("evolution", loop_search="beam")


def test_bad_race_options():
    with pytest.raises(ValueError, match=r"evolution option race_trials: Input should be greater "
                                         r"than or equal to 1 \(got 0\)"):
        agents.create("evolution", race_layouts=4, race_trials=0)


def test_bad_stall_options():
    with pytest.raises(ValueError, match=r"evolution option revisit_trials: Input should be "
                                         r"greater than or equal to 1 \(got 0\)"):
        agents.create("evolution", revisit_trials=0)


def test_bad_blocked_rounds():
    with pytest.raises(ValueError, match=r"evolution option blocked_rounds: Input should be "
                                         r"greater than or equal to 1 \(got 0\)"):
        agents.create("evolution", blocked_rounds=0)


def test_bad_epsilon():
    with pytest.raises(ValueError, match=r"evolution option epsilon: Input should be less "
                                         r"than or equal to 1 \(got 1.5\)"):
        agents.create("evolution", epsilon=1.5)


@pytest.mark.parametrize("options, message", [
    ({"initial_layouts": 0}, r"initial_layouts: Input should be greater than or equal to 1"),
    ({"initial_rounds": 0}, r"initial_rounds: Input should be greater than or equal to 1"),
    ({"layout_draws": "eq2"}, r"layout_draws: Input should be 'solver' or 'actions' \(got 'eq2'\)"),
])
def test_bad_layout_options(options, message):
    with pytest.raises(ValueError, match=message):
        agents.create("evolution", **options)


@pytest.mark.slow
def test_real_measurements_are_correct(tmp_path):
    task = OpTask(C2D, epilogue=("bias", "relu"))
    with create("local", MeasureConfig(number=1, repeat=2, min_repeat_ms=2)) as measurer, \
            RecordDB(tmp_path / "records.jsonl") as db:
        session = TuningSession(task, measurer, db)  # every trial checked against torch
        tune(session, agents.create("evolution", seed=0, population=16, children=16,
                                    samples=12), Budget(4, 4), top_k=4, progress=False)
        assert session.trials == 8
        assert math.isfinite(session.best[1])
        errors = [r.error for r in db.records(task.key) if r.error is not None]
        assert not errors, errors  # which check or timeout failed, if one did


def test_a_measured_batch_is_spread_over_the_ranking():
    from agents.evolution import differences, spread
    from altenv.space import LoopPoint
    from altenv.tuning.task import Candidate

    layout, other = freeze({"ot": 1}), freeze({"ot": 4})

    def cand(tiles, unroll, factors=layout, design=0):
        return Candidate(factors, LoopPoint(((design,), tiles, (unroll,))))

    a, a2 = cand((4, 8), 0), cand((4, 8), 1)   # a near-copy: unrolling only
    b, c = cand((2, 16), 1), cand((8, 4), 2)
    assert differences(a, a2) == 1 and differences(a, b) == 2
    assert differences(a, cand((4, 8), 0, other)) == math.inf
    assert differences(a, cand((4, 8), 0, design=1)) == math.inf
    assert spread([a, a2, b, c], 3, 2) == [a, b, c]  # a2 passed over
    assert spread([a, a2, b], 3, 2) == [a, b, a2]  # ... and fills what is left
    assert spread([a, a2, b, c], 3, 1) == [a, a2, b]  # 1: plain top-k
    with pytest.raises(ValueError, match="diversity"):
        agents.create("evolution", diversity=0)


def _policy_playing(task, factors, path):
    """A ``ppo`` checkpoint in ``path`` whose layout heads pick ``factors`` on ``task``."""
    import torch

    from agents.options import PPOOptions
    from agents.ppo import PPOAgent
    from envs.cross import BINS, SLOTS, CrossExplorationEnv, bin_choices

    prior = PPOAgent(PPOOptions(checkpoint=None))
    env = CrossExplorationEnv(task, reward_source="cost_model")
    net = prior.model_for(env).policy.action_net
    bias = torch.full_like(net.bias, -20.0)
    left: dict[str, int] = {}
    for knob in task.template.knobs:  # the bin of each knob's factor, outer levels last
        key = knob.name.rstrip("0123456789")
        extent = left.get(key, knob.extent)
        bias[SLOTS.index(knob.name) * BINS + bin_choices(extent).index(factors[knob.name])] = 20
        left[key] = extent // factors[knob.name]
    with torch.no_grad():
        net.weight.zero_()
        net.bias.copy_(bias)
    env.close()
    prior.save(path)
    return str(path)


def test_a_layout_prior_policy_puts_its_layout_among_the_initial_ones(tmp_path):
    """``layout_prior``: the policy's layout is measured in the joint stage right after the
    default and the blocked layout, in place of a solver draw, and then judged as any other."""
    task = OpTask(C2D)
    model = LayoutConstraints(task.template, Hardware.of(task.target))
    blocked = task.blocked_factors(model.hardware.lanes())
    with RecordDB(tmp_path / "plain.jsonl") as db:
        _, plain = _tune(task, db, Budget(16, 8))
    solutions = model.sample(64, np.random.default_rng(3))
    drawn = [f for f in (freeze(model.factors(g)) for g in solutions)
             if f not in plain._initial and f != blocked]
    wanted = dict(drawn[0])  # a layout the run without the prior did not measure
    checkpoint = _policy_playing(task, wanted, tmp_path / "prior")
    with RecordDB(tmp_path / "prior.jsonl") as db:
        session, agent = _tune(task, db, Budget(16, 8), layout_prior=checkpoint)
        assert agent._initial[:3] == [task.default_factors(), blocked, freeze(wanted)]
        assert len(agent._initial) == len(plain._initial)
        measured = {freeze(r.layouts["factors"]) for r in db.records(task.key)[:16]}
        assert freeze(wanted) in measured
    with pytest.raises(ValueError, match="evolution option layout_prior: must be null, "
                                         "'pretrained' or a checkpoint directory holding a policy"):
        agents.create("evolution", layout_prior=str(tmp_path / "plain.jsonl"))


def test_a_layout_prior_is_skipped_with_a_warning_where_its_heads_cannot_express_the_layout(
        tmp_path):
    """An intrinsic mapping's template (knobs the layout heads do not have) gets no prior,
    and the run goes on with the solver's layouts."""
    import tvm

    from altenv.target import make_target

    if not tvm.target.codegen.target_has_features("avx2", make_target(None)):
        pytest.skip("the CPU has no AVX2 (no intrinsic mapping)")
    task = OpTask(C2D + ",dtype=int8", mapping="amos")
    checkpoint = _policy_playing(OpTask(C2D), dict(OpTask(C2D).default_factors()),
                                 tmp_path / "prior")
    agent = agents.create("evolution", layout_prior=checkpoint)
    with RecordDB(tmp_path / "r.jsonl") as db:
        session = TuningSession(task, SyntheticMeasurer(), db, check=False)
        with pytest.warns(UserWarning, match="layout_prior skipped on .*intrinsic mappings"):
            assert agent._prior_layouts(session) == []

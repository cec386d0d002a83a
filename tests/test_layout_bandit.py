"""The loop-only stage's layout bandit: its turns, its framework share, and the agent
that follows it through a run and a resume."""

from __future__ import annotations

import math

import pytest
from test_evolution import C2D, _killed_and_resumed, _tune

from agents.layout_bandit import arms, next_turn
from altenv.records import RecordDB
from altenv.tuning import Budget, OpTask
from altenv.tuning.task import freeze

A, B, C, D, F = (freeze({"nt": n}) for n in range(1, 6))  # F: the framework layout


def _turn(items, joint=6, count=2, turn=4, share=0.0, exploration=0.5, exhausted=()):
    return next_turn(items, joint, count, turn, F, share, exploration, exhausted)


def test_the_arms_are_the_best_of_the_joint_stage_and_the_framework_layout():
    items = [(A, 1.0), (B, 2.0), (C, 0.5), (F, 3.0), (D, math.inf), (A, 0.9)]
    assert arms(items, 6, 2, F) == [C, A, F]
    assert arms(items, 6, 3, F) == [C, A, B, F]
    assert arms(items, 6, 5, F) == [C, A, B, F]  # D never ran
    assert arms(items, 3, 2, F) == [C, A]  # the framework layout not in the joint stage
    assert arms(items[:1], 1, 4, F) == [A]


def test_a_turn_goes_on_until_its_run_of_trials_is_whole():
    joint = [(A, 1.0), (B, 1.1), (F, 2.0)]
    assert _turn(joint + [(A, 0.9)] * 3, joint=3) == (A, 1)
    assert _turn(joint + [(B, 0.9)] * 5, joint=3) == (B, 3)
    # a whole turn: decided again (B is the leader now and has its trials)
    assert _turn(joint + [(A, 0.9)] * 4 + [(B, 0.5)] * 4, joint=3) == (F, 4)
    # an exhausted layout's turn ends early
    assert _turn(joint + [(A, 0.9)] * 3, joint=3, exhausted={A}) == (B, 4)
    assert _turn(joint, joint=3, exhausted={A, B, F}) is None
    assert _turn([(A, 1.0), (B, math.inf)], joint=2, count=2) is None  # one layout ran


def test_every_layout_first_has_a_turn_in_the_stage():
    joint = [(A, 1.0), (B, 3.0), (F, 9.0)]
    assert _turn(joint, joint=3) == (A, 4)
    assert _turn(joint + [(A, 1.0)] * 4, joint=3) == (B, 4)  # however far behind
    assert _turn(joint + [(A, 1.0)] * 4 + [(B, 3.0)] * 4, joint=3) == (F, 4)
    assert _turn(joint + [(A, 1.0)] * 4, joint=3, exhausted={B}) == (F, 4)


def _first_round(a, b, f):
    """One trial each in the joint stage, then a turn of 4 each."""
    return [(A, a), (B, b), (F, f)] + [(A, a)] * 4 + [(B, b)] * 4 + [(F, f)] * 4


def test_the_index_is_the_gap_to_the_leader_plus_a_shrinking_bonus():
    # equal trials: the leader
    assert _turn(_first_round(1.0, 1.2, 3.0), joint=3) == (A, 4)
    # B 1.2x behind with 5 trials against A's 29: log(1.2) = 0.18 < 0.5 (sqrt(log 39 / 5)
    # - sqrt(log 39 / 29)) = 0.25
    items = _first_round(1.0, 1.2, 3.0) + [(A, 1.0)] * 24
    assert _turn(items, joint=3) == (B, 4)
    # without exploration, never
    assert _turn(items, joint=3, exploration=0.0) == (A, 4)
    # 3x behind (log 3 = 1.10): not worth the bonus
    assert _turn(_first_round(1.0, 3.0, 3.0) + [(A, 1.0)] * 24, joint=3) == (A, 4)
    # the index compares layouts by their own trials: after 8 more of B's that found
    # nothing better, A again
    assert _turn(items + [(B, 1.3)] * 8, joint=3) == (A, 4)


def test_the_framework_layout_keeps_its_share():
    loop = _first_round(1.0, 1.0, 5.0) + [(A, 0.95)] * 12
    assert _turn(loop, joint=3, share=0.25) == (F, 4)  # 4 of 24 < 6
    # 8 of 28: the index's pick (B, with 5 trials against A's 17)
    assert _turn(loop + [(F, 4.0)] * 4, joint=3, share=0.25) == (B, 4)
    assert _turn(loop, joint=3, share=0.25, exhausted={F}) == (B, 4)


def _check_bandit(records, joint, turn, share, exploration, default):
    """Each loop-only record is on the layout that :func:`next_turn` of the records before
    it names, or on the best layout so far where it names none. A layout named but not
    played is taken as exhausted (its loop space has nothing new to offer: a small space's
    evolved population), and never played again."""
    items = [(freeze(r.layouts["factors"]), r.median) for r in records]
    exhausted: set = set()
    for i in range(joint, len(items)):
        while True:
            expected = next_turn(items[:i], joint, 4, turn, default, share, exploration,
                                 exhausted)
            leader = min(items[:i], key=lambda item: item[1])[0]
            named = leader if expected is None else expected[0]
            if items[i][0] == named or expected is None:
                break
            exhausted.add(named)
        assert items[i][0] == named, f"record {i}"
        assert items[i][0] not in exhausted, f"record {i}"
    return {f for f, _ in items[joint:]}


@pytest.mark.parametrize("loop_search", ["metaschedule", "evolution"])
def test_the_agent_plays_the_bandit(tmp_path, loop_search):
    task = OpTask(C2D)
    options = {"layout_choice": "bandit", "race_trials": 4, "framework_share": 0.25,
               "bandit_exploration": 1.0, "loop_search": loop_search}
    with RecordDB(tmp_path / "records.jsonl") as db:
        session, _ = _tune(task, db, Budget(24, 48), **options)
        assert session.trials == 72
        records = db.records(task.key)
        played = _check_bandit(records, 24, 4, 0.25, 1.0, task.default_factors())
        assert task.default_factors() in played
        framework = sum(freeze(r.layouts["factors"]) == task.default_factors()
                        for r in records[24:])
        assert framework >= 0.25 * 44  # its share of all but the last turn


def test_a_killed_bandit_resumes_from_its_records(tmp_path):
    task = OpTask(C2D)
    options = {"layout_choice": "bandit", "race_trials": 4, "framework_share": 0.25}
    # killed inside a turn (24 joint trials, then turns of 4)
    session, _, records = _killed_and_resumed(task, tmp_path / "records.jsonl",
                                              Budget(24, 40), 38, **options)
    assert session.trials == 64
    assert len({r.key for r in records}) == 64  # nothing measured twice
    _check_bandit(records, 24, 4, 0.25, 0.5, task.default_factors())


def test_bad_layout_choice():
    import agents

    with pytest.raises(ValueError, match=r"evolution option layout_choice: Input should be "
                                         r"'race' or 'bandit' \(got 'vote'\)"):
        agents.create("evolution", layout_choice="vote")

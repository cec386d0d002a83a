"""Pretraining pieces: ranking metrics, the corpus's records turned into examples and a
cost model, the held-out report, and the env-speed bench."""

from __future__ import annotations

import math

import numpy as np
import pytest

from altenv.costmodel import CostModel
from altenv.measure import MeasureConfig
from altenv.records import RecordDB
from altenv.training import (
    fit_cost_model,
    measure_corpus,
    ranking_report,
    record_examples,
    split_key,
)
from altenv.training.ranking import best_of_top, random_best_of_top, spearman


def test_ranking_metrics():
    lat = np.array([4.0, 1.0, 2.0, 8.0])
    assert spearman(1 / lat, 1 / lat) == pytest.approx(1.0)
    assert spearman(lat, 1 / lat) == pytest.approx(-1.0)
    assert math.isnan(spearman(np.ones(4), 1 / lat))
    assert best_of_top(1 / lat, lat, 1) == 1.0  # the best program ranked first
    assert best_of_top(lat, lat, 1) == pytest.approx(1 / 8)  # the worst ranked first
    assert 1 / 8 < random_best_of_top(lat, 1, draws=400) < 1.0
    assert random_best_of_top(lat, 4) == 1.0


def test_split_key():
    assert split_key("gmm:M=8,N=8,K=8|bias+relu") == ("gmm:M=8,N=8,K=8", ("bias", "relu"))
    assert split_key("gmm:M=8,N=8,K=8") == ("gmm:M=8,N=8,K=8", ())


@pytest.mark.slow
def test_corpus_to_cost_model_and_report(tmp_path):
    """A tiny measured corpus: records of two workloads resume (nothing measured twice),
    become examples and a cost model, and the held-out report compares the variants."""
    import agents

    specs = ["gmm:M=16,N=32,K=16", "gmm:M=32,N=16,K=16"]
    records = tmp_path / "corpus" / "records.jsonl"
    config = MeasureConfig(number=1, repeat=2, min_repeat_ms=5)
    made = lambda seed: agents.create("random", seed=seed)  # noqa: E731
    assert measure_corpus(specs, 12, records, None, config, made, batch=16, top_k=4,
                          progress=False) == 24
    assert measure_corpus(specs, 12, records, None, config, made, progress=False) == 0
    examples = record_examples([records], None, progress=False)
    assert sorted(e.key for e in examples) == sorted(specs)
    assert all(len(e.features) == len(e.latencies) == 12 for e in examples)
    model = fit_cost_model(examples[:1])
    assert model.is_trained and model.workloads == [examples[0].key]
    report = ranking_report(model, examples[1:], online=4, k=2)
    assert report.workloads == 1 and report.records > 0
    assert set(report.spearman) == {"pretrained", "online", "pretrained+online", "random"}
    assert "held-out ranking quality" in report.table()
    with RecordDB(records) as db:
        assert db.count() == 24


def test_bench_envs_counts_steps():
    from altenv import pretrained
    from altenv.bench.envs import env_speed, format_rows

    rows = env_speed([1], steps=3, workloads=2, warmup=1, cost_model=pretrained.cost_model(),
                     batch=4, walk_length=2, loop_rounds=1)
    assert rows[0]["envs"] == 1 and rows[0]["steps"] == 3 and rows[0]["steps_per_second"] > 0
    assert "steps/s" in format_rows(rows)


def test_cost_model_fits_many_workloads_and_keeps_their_labels_apart():
    rng = np.random.default_rng(0)
    rows = [rng.uniform(0, 8, (3, 200)).astype(np.float32) for _ in range(8)]
    from altenv.training import Examples

    fast = Examples("a", rows[:4], [1e-3] * 4)
    slow = Examples("b", rows[4:], [1e-1] * 4)  # 100x slower, but each is its own best
    model = fit_cost_model([fast, slow], num_boost_round=20)
    assert isinstance(model, CostModel) and model.num_records == 8
    np.testing.assert_allclose(model.predict(rows).mean(), 1.0, atol=0.2)

"""Pretraining: a measured corpus, a cross-workload cost model and its ranking quality."""

from .corpus import Examples, fit_cost_model, measure_corpus, record_examples, split_key
from .ranking import RankingReport, ranking_report

__all__ = ["Examples", "RankingReport", "fit_cost_model", "measure_corpus", "ranking_report",
           "record_examples", "split_key"]

"""``altenv bench``: tuners and baselines side by side at an equal measured-trial budget.

``bench ops`` tunes each operator of a suite with each tuner (altenv's agent,
MetaSchedule's ``tune_tir``, any registered agent), then re-times every final program
interleaved with TVM's untuned build and PyTorch eager in one process; ``bench net`` does
the same for whole networks against MetaSchedule's ``tune_relax``. Both resume from their
output directory, so a long suite can run in chunks.
"""

from ..suites import BenchSuite, NetEntry, OpEntry, load_suite

__all__ = ["BenchSuite", "NetEntry", "OpEntry", "load_suite"]

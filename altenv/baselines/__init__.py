"""Baselines in the same harness: MetaSchedule (``tune_tir`` / ``tune_relax``), TVM's untuned
default build and PyTorch eager, each a :class:`Baseline` that runs once on prepared inputs,
checked against a reference and timed interleaved with the others (:func:`compare`,
:mod:`altenv.measure.timing`)."""

from .base import (
    Baseline,
    NoValidMeasurementsError,
    TuningSummary,
    check_baseline,
    compare,
    count_measurements,
)
from .network import (
    network_baseline,
    torch_module_baseline,
    tune_relax_baseline,
    tuned_relax_baseline,
    untuned_relax_baseline,
    weight_names,
)
from .operator import (
    compiled_baseline,
    torch_function,
    torch_operator_baseline,
    tune_tir_baseline,
    tuned_tir_baseline,
    untuned_tir_baseline,
)

__all__ = [
    "Baseline",
    "NoValidMeasurementsError",
    "TuningSummary",
    "check_baseline",
    "compiled_baseline",
    "compare",
    "count_measurements",
    "network_baseline",
    "torch_function",
    "torch_module_baseline",
    "torch_operator_baseline",
    "tune_relax_baseline",
    "tuned_relax_baseline",
    "tune_tir_baseline",
    "tuned_tir_baseline",
    "untuned_relax_baseline",
    "untuned_tir_baseline",
    "weight_names",
]

"""The measurer a run or a bench cell tunes with: in this process (``measure:``, local or
an RPC tracker), or on a Ray cluster (``ray:``, imported only then)."""

from __future__ import annotations

from typing import Any

from ..cluster.settings import RaySettings
from ..measure import MeasureConfig, Measurer, create


def open_measurer(ray: RaySettings | None, measure: MeasureConfig, target: Any) -> Measurer:
    """A run's (or a bench cell's) measurer (a context manager; closing it stops its
    workers); with ``ray`` on the cluster, which :func:`~altenv.pipeline.checks.check_run`
    (or :func:`~altenv.bench.run.check_suite`) joined."""
    if ray is None:
        return create(None, measure, target)
    from ..cluster.measurer import RayMeasurer  # Ray only for a run that names it

    return RayMeasurer(ray, measure, target)

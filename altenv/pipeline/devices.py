"""The measurer a run tunes with: in this process (``measure:``, local or an RPC tracker),
or on a Ray cluster (``ray:``, imported only then)."""

from __future__ import annotations

from typing import Any

from ..config import RunConfig
from ..measure import Measurer, create


def open_measurer(cfg: RunConfig, target: Any) -> Measurer:
    """The run's measurer (a context manager; closing it stops its workers); a Ray run's
    cluster was joined by :func:`~altenv.pipeline.checks.check_run`."""
    if cfg.ray is None:
        return create(None, cfg.measure, target)
    from ..cluster.measurer import RayMeasurer  # Ray only for a run that names it

    return RayMeasurer(cfg.ray, cfg.measure, target)

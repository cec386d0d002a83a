"""The measurer a run or a bench cell tunes with: in this process (``measure:``, local or
an RPC tracker), or on a Ray cluster (``ray:``, imported only then); a bench's cells share
one (:class:`SharedMeasurer`)."""

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


class SharedMeasurer:
    """One measurer for a series of runs with the same settings (a bench's cells): started
    when a run first asks for it (a bench with nothing left to tune starts no worker) and
    closed on exit, so its builder and runner workers start once, not once a cell."""

    def __init__(self, ray: RaySettings | None, measure: MeasureConfig, target: Any) -> None:
        self._settings = (ray, measure, target)
        self._measurer: Measurer | None = None

    def get(self) -> Measurer:
        """The measurer, started on the first call; the runs it is lent to leave it open."""
        if self._measurer is None:
            self._measurer = open_measurer(*self._settings)
        return self._measurer

    def __enter__(self) -> SharedMeasurer:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._measurer is not None:
            self._measurer.close()

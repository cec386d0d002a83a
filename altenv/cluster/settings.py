"""The ``ray:`` section of a run config (no Ray import: configs are read without it)."""

from __future__ import annotations

from pydantic import Field

from ..strict import Strict


class RaySettings(Strict):
    """Where a run's builds and measurements go.

    Parameters
    ----------
    address : str
        ``local`` (a Ray instance started for this run, this machine as its one device),
        ``auto`` (the cluster this machine joined with ``ray start``) or ``HOST:PORT`` of a
        cluster's head (``ray://HOST:PORT`` for Ray Client).
    device_resource : str
        The Ray custom resource a node offers once per measuring device
        (``ray start --resources '{"altenv_device": 1}'``); one actor holds each unit.
    build_cpus : float
        CPUs one build task takes.
    """

    address: str = Field(min_length=1)
    device_resource: str = Field("altenv_device", min_length=1)
    build_cpus: float = Field(1.0, gt=0)

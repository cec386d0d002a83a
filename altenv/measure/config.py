"""Measurement settings: a plain pydantic model that a YAML ``measure:`` section maps onto."""

from __future__ import annotations

import math
import os
from typing import TYPE_CHECKING

from pydantic import Field, field_validator

from ..strict import Strict

if TYPE_CHECKING:  # a config is read without TVM
    from tvm.s_tir.meta_schedule.runner import RPCConfig

DEFAULT_PRELOAD = ("tvm.s_tir.meta_schedule", "tvm.s_tir.transform", "altenv.measure.builder")


class RPCSettings(Strict):
    """Where remote devices are found: a TVM RPC tracker and the key the servers registered.

    Parameters
    ----------
    tracker : str
        ``"host:port"`` of the tracker.
    key : str
        Device key the RPC servers registered under.
    priority : int
        Session priority at the tracker.
    max_workers : int | None
        At most this many devices measure at once (``None``: every server registered under
        the key, one candidate each).
    connect_timeout : float
        Seconds on top of ``measure.run_timeout`` the client waits for a session's answer
        before it gives up on it (a device that hangs).
    """

    tracker: str
    key: str
    priority: int = 1
    max_workers: int | None = Field(None, ge=1)
    connect_timeout: float = Field(30.0, gt=0)

    @field_validator("tracker")
    @classmethod
    def _host_port(cls, value: str) -> str:
        host, sep, port = value.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(f"rpc.tracker must be 'host:port', got {value!r}")
        return value

    @property
    def host(self) -> str:
        """Tracker host name."""
        return self.tracker.rpartition(":")[0]

    @property
    def port(self) -> int:
        """Tracker port."""
        return int(self.tracker.rpartition(":")[2])

    def session_config(self, timeout: float) -> RPCConfig:
        """MetaSchedule's ``RPCConfig`` of a session on one of the devices, which the server
        ends after ``timeout`` seconds."""
        from tvm.s_tir.meta_schedule.runner import RPCConfig

        return RPCConfig(tracker_host=self.host, tracker_port=self.port, tracker_key=self.key,
                         session_priority=self.priority, session_timeout_sec=math.ceil(timeout))


class MeasureConfig(Strict):
    """How candidates are built and timed.

    Parameters
    ----------
    number, repeat, min_repeat_ms, enable_cpu_cache_flush
        MetaSchedule ``EvaluatorConfig``: each of ``repeat`` latencies averages ``number``
        runs, ``number`` grows until one repeat lasts ``min_repeat_ms``.
    build_timeout : float
        Seconds one build may take inside a warm builder worker (imports are paid before the
        clock starts, see ``builder_preload``).
    run_timeout : float
        Seconds one candidate may take on the device, correctness check included; for RPC it
        is also the session timeout.
    build_workers : int
        Persistent builder processes (default: the cores this process may use).
    builder_preload : list[str]
        Modules every builder worker imports once, untimed, when it starts.
    builder_max_uses : int | None
        Recycle a builder worker after this many builds (bounds TVM's per-process leaks).
    rpc : RPCSettings | None
        Remote devices through a tracker; ``None`` measures on this host.
    """

    number: int = Field(3, ge=1)
    repeat: int = Field(3, ge=1)
    min_repeat_ms: int = Field(50, ge=0)
    enable_cpu_cache_flush: bool = False
    build_timeout: float = Field(60.0, gt=0)
    run_timeout: float = Field(30.0, gt=0)
    build_workers: int = Field(default_factory=lambda: len(os.sched_getaffinity(0)), ge=1)
    builder_preload: list[str] = Field(default_factory=lambda: list(DEFAULT_PRELOAD))
    builder_max_uses: int | None = Field(256, ge=1)
    rpc: RPCSettings | None = None

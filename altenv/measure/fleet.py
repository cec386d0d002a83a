"""A fleet of measuring devices: one candidate per device at a time, all devices at once.

The fleet is a pool of idle devices shared by every batch in flight (a network's tasks tune
concurrently): each job takes an idle device, waits for its answer and gives it back, so a
device never times two candidates at once and a timing is never disturbed by another on
the same device. A device that drops mid-job (a killed RPC server, a dead Ray actor)
raises :class:`DeviceLost`: it leaves the fleet and the job takes another device, at most
``requeues`` times (a candidate that kills every device it lands on fails instead). With
no device left, jobs fail; every job gets exactly one result.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from .result import MeasureResult

T = TypeVar("T")


class DeviceLost(RuntimeError):
    """The device stopped answering (its job was not measured)."""


class NoDevice(RuntimeError):
    """No device is left to do a job."""


class Fleet:
    """Measures jobs on devices in parallel, one job per device at a time.

    Parameters
    ----------
    run : Callable[[Any, Any], MeasureResult]
        Measure one job on one device; raises :class:`DeviceLost` when the device is gone.
    requeues : int
        How often one job may move to another device after its device dropped.
    """

    def __init__(self, run: Callable[[Any, Any], MeasureResult], requeues: int = 2) -> None:
        self.run = run
        self.requeues = requeues
        self.devices: list[Any] = []
        """The devices in the fleet (busy or idle)."""
        self.lost: list[Any] = []
        """Devices that dropped, oldest first."""
        self._idle: list[Any] = []
        self._changed = threading.Condition()

    def add(self, device: Any) -> None:
        """A new device, idle."""
        with self._changed:
            self.devices.append(device)
            self._idle.append(device)
            self._changed.notify()

    def _take(self) -> Any | None:
        with self._changed:
            while not self._idle and self.devices:
                self._changed.wait()
            return self._idle.pop() if self._idle else None

    def _give_back(self, device: Any, lost: bool) -> None:
        with self._changed:
            if lost:
                self.devices.remove(device)
                self.lost.append(device)
            else:
                self._idle.append(device)
            self._changed.notify_all()

    def call(self, work: Callable[[Any], T]) -> T:
        """``work(device)`` on the next idle device (another one if that device drops);
        raises :class:`NoDevice` when none is left or the work lost every device it got."""
        for _ in range(self.requeues + 1):
            device = self._take()
            if device is None:
                raise NoDevice("no measuring device left")
            try:
                result = work(device)
            except DeviceLost as err:
                self._give_back(device, lost=True)
                reason = str(err)
                continue
            self._give_back(device, lost=False)
            return result
        raise NoDevice(f"device lost: {reason}")

    def measure_one(self, job: Any) -> MeasureResult:
        """Measure one job on the next idle device (another one if that device drops)."""
        try:
            return self.call(lambda device: self.run(device, job))
        except NoDevice as err:
            return MeasureResult(error=str(err))

    def measure(self, jobs: Sequence[Any]) -> list[MeasureResult]:
        """One result per job, in order, measured on as many devices at once as are idle."""
        if len(jobs) <= 1:
            return [self.measure_one(job) for job in jobs]
        with ThreadPoolExecutor(len(jobs)) as pool:
            return list(pool.map(self.measure_one, jobs))

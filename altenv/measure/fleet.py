"""A fleet of measuring devices: one candidate per device at a time, all devices at once.

A batch is a queue of jobs; each device has a thread that takes the next job, hands it to
its device and waits for the answer (a device answers one job at a time, so a timing is
never disturbed by another of the same batch). A device that drops mid-batch (a killed RPC
server, a dead Ray actor) raises :class:`DeviceLost`: its job goes back to the queue for the
devices left and the device takes no more of this batch. A job is requeued at most
``requeues`` times (a candidate that kills every device it lands on fails instead), and a
batch whose devices are all gone fails its remaining jobs; every job gets exactly one
result.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

from .result import MeasureResult

Job = TypeVar("Job")
Device = TypeVar("Device")


class DeviceLost(RuntimeError):
    """The device stopped answering (its job was not measured)."""


class Fleet(Generic[Device, Job]):
    """Measures jobs on devices in parallel, one job per device at a time.

    Parameters
    ----------
    devices : Sequence[Device]
        The devices; :attr:`lost` collects those that dropped.
    run : Callable[[Device, Job], MeasureResult]
        Measure one job on one device; raises :class:`DeviceLost` when the device is gone.
    requeues : int
        How often one job may be handed to another device after its device dropped.
    """

    def __init__(self, devices: Sequence[Device], run: Callable[[Device, Job], MeasureResult],
                 requeues: int = 2) -> None:
        self.devices = list(devices)
        self.run = run
        self.requeues = requeues
        self.lost: list[Device] = []
        self.measured_on: list[tuple[int, int]] = []
        """``(job index, device index)`` of every measurement that came back (in order)."""

    def measure(self, jobs: Sequence[Job]) -> list[MeasureResult]:
        """One result per job, in order; the devices that drop are moved to :attr:`lost`."""
        results: list[MeasureResult | None] = [None] * len(jobs)
        pending: queue.Queue[tuple[int, int]] = queue.Queue()
        for i in range(len(jobs)):
            pending.put((i, 0))
        left = [len(jobs)]
        lock = threading.Lock()
        done = threading.Event()
        if not jobs:
            return []
        live = [d for d in self.devices if d not in self.lost]
        working = [len(live)]

        def finish(i: int, result: MeasureResult) -> None:
            with lock:
                results[i] = result
                left[0] -= 1
                if left[0] == 0:
                    done.set()

        def serve(index: int, device: Device) -> None:
            while not done.is_set():
                try:
                    i, tries = pending.get(timeout=0.05)
                except queue.Empty:
                    continue
                try:
                    result = self.run(device, jobs[i])
                except DeviceLost as err:
                    with lock:
                        self.lost.append(device)
                        working[0] -= 1
                        alone = working[0] == 0
                    if tries < self.requeues and not alone:
                        pending.put((i, tries + 1))
                    else:
                        finish(i, MeasureResult(error=f"device lost: {err}"))
                    if alone:  # nobody is left to take the rest
                        while not pending.empty():
                            j, _ = pending.get()
                            finish(j, MeasureResult(error="no measuring device left"))
                    return
                with lock:
                    self.measured_on.append((i, index))
                finish(i, result)

        if not live:
            return [MeasureResult(error="no measuring device left") for _ in jobs]
        threads = [threading.Thread(target=serve, args=(self.devices.index(d), d), daemon=True)
                   for d in live]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return [r if r is not None else MeasureResult(error="no measuring device left")
                for r in results]

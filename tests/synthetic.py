"""A stand-in for a device in tests that need many trials fast: a made-up latency per
distinct program, no build, no run."""

from __future__ import annotations

from collections.abc import Sequence

import tvm_ffi

from altenv.measure import MeasureCandidate, MeasureResult


class SyntheticMeasurer:
    """The :class:`altenv.measure.Measurer` interface with latencies from a program hash."""

    def measure(self, candidates: Sequence[MeasureCandidate]) -> list[MeasureResult]:
        return [MeasureResult([1e-5 * (1 + tvm_ffi.structural_hash(c.mod) % 97)])
                for c in candidates]

    def retime(self, candidates: Sequence[MeasureCandidate], rounds: int, cold: bool = False
               ) -> list[list[MeasureResult]]:
        """``rounds`` copies of each latency (a made-up latency knows no caches)."""
        return [[result] * rounds for result in self.measure(candidates)]

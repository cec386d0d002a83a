"""Parameter subspaces of a loop space: one per MetaSchedule sampling instruction.

A subspace knows its value domain, the fixed set of walking directions an actor can
choose (direction 0 always stays put), the candidate values a direction leads to
(nearest first, so a caller can fall back to the nearest valid one), and a normalized
numeric encoding of a value. Values are tuples of ints so a point is hashable.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass

Value = tuple[int, ...]


def _prime_factors(x: int) -> list[int]:
    """Distinct prime factors of ``x`` in increasing order."""
    out, p = [], 2
    while p * p <= x:
        if x % p == 0:
            out.append(p)
            while x % p == 0:
                x //= p
        p += 1
    if x > 1:
        out.append(x)
    return out


@dataclass(frozen=True)
class Subspace(ABC):
    """Base class: a named slot of the point vector with ``size`` integer entries."""

    name: str

    @property
    def size(self) -> int:
        """Entries this subspace takes in the flat point vector."""
        return 1

    @property
    @abstractmethod
    def num_directions(self) -> int:
        """Directions an actor can choose on this subspace (0 = stay)."""

    @abstractmethod
    def neighbours(self, value: Value, direction: int) -> Iterator[Value]:
        """Candidate values for walking from ``value`` along ``direction``, nearest first;
        empty when the direction leads nowhere. Only arithmetic validity is checked."""

    @abstractmethod
    def encode(self, value: Value) -> list[float]:
        """``size`` floats in [0, 1]."""

    @property
    def canonical(self) -> Value:
        """The value a point holds here when its design does not read this subspace (so
        that one program has one vector, whatever process generated the design space)."""
        return (0,)


@dataclass(frozen=True)
class DesignSubspace(Subspace):
    """Which MetaSchedule design space (sketch) the point uses."""

    count: int

    @property
    def num_directions(self) -> int:
        return 3

    def neighbours(self, value: Value, direction: int) -> Iterator[Value]:
        yield from _linear_walk(value[0], direction, 0, self.count)

    def encode(self, value: Value) -> list[float]:
        return [value[0] / max(self.count - 1, 1)]


@dataclass(frozen=True)
class CategoricalSubspace(Subspace):
    """A ``SampleCategorical`` decision: an index into ``candidates``; direction 1 takes
    the next candidate, 2 the previous one."""

    candidates: tuple[int, ...]

    @property
    def num_directions(self) -> int:
        return 3

    def neighbours(self, value: Value, direction: int) -> Iterator[Value]:
        yield from _linear_walk(value[0], direction, 0, len(self.candidates))

    def encode(self, value: Value) -> list[float]:
        return [value[0] / max(len(self.candidates) - 1, 1)]


@dataclass(frozen=True)
class ComputeLocationSubspace(Subspace):
    """A ``SampleComputeLocation`` decision: -2 inline, -1 root, ``i >= 0`` the i-th loop
    above the consumer. Which of these exist depends on the rest of the point, so the
    walk offers every index in order and the space keeps the nearest valid one."""

    num_loops: int

    @property
    def num_directions(self) -> int:
        return 3

    @property
    def canonical(self) -> Value:
        return (-1,)

    def neighbours(self, value: Value, direction: int) -> Iterator[Value]:
        yield from _linear_walk(value[0], direction, -2, self.num_loops)

    def encode(self, value: Value) -> list[float]:
        return [(value[0] + 2) / max(self.num_loops + 1, 1)]


@dataclass(frozen=True)
class TileSubspace(Subspace):
    """A ``SamplePerfectTile`` decision: ``levels`` factors whose product is ``extent``,
    the innermost at most ``max_innermost`` (when positive).

    Direction ``1 + i * (levels - 1) + j'`` moves a prime factor from level ``i`` to the
    ``j'``-th other level (levels in order, ``i`` skipped); the smallest prime factor is
    tried first, then the larger ones.
    """

    extent: int
    levels: int
    max_innermost: int

    @property
    def size(self) -> int:
        return self.levels

    @property
    def canonical(self) -> Value:
        return (self.extent,) + (1,) * (self.levels - 1)

    @property
    def num_directions(self) -> int:
        return 1 + self.levels * (self.levels - 1)

    def move_of(self, direction: int) -> tuple[int, int]:
        """The (source level, destination level) of a non-zero direction."""
        src, rest = divmod(direction - 1, self.levels - 1)
        return src, rest + (rest >= src)

    def is_valid(self, value: Value) -> bool:
        """Perfect tiling of ``extent`` that respects the innermost bound."""
        return (
            len(value) == self.levels
            and all(f >= 1 for f in value)
            and math.prod(value) == self.extent
            and (self.max_innermost <= 0 or value[-1] <= self.max_innermost)
        )

    def neighbours(self, value: Value, direction: int) -> Iterator[Value]:
        if direction == 0 or self.levels < 2:
            return
        src, dst = self.move_of(direction)
        for p in _prime_factors(value[src]):
            moved = list(value)
            moved[src] //= p
            moved[dst] *= p
            if self.is_valid(tuple(moved)):
                yield tuple(moved)

    def encode(self, value: Value) -> list[float]:
        scale = math.log(self.extent) if self.extent > 1 else 1.0
        return [math.log(f) / scale for f in value]


def _linear_walk(index: int, direction: int, low: int, high: int) -> Iterator[Value]:
    """Indices after ``index`` (direction 1) or before it (direction 2) in [low, high)."""
    if direction == 1:
        yield from ((i,) for i in range(index + 1, high))
    elif direction == 2:
        yield from ((i,) for i in range(index - 1, low - 1, -1))

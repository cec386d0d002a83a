"""Loop space over MetaSchedule design spaces: points, sampling, decoding, moves."""

from altenv.space.intrin import tune_context_intrins
from altenv.space.loop_space import LoopPoint, LoopSpace, StaleRecordError
from altenv.space.subspace import (
    CategoricalSubspace,
    ComputeLocationSubspace,
    DesignSubspace,
    Subspace,
    TileSubspace,
)

__all__ = [
    "CategoricalSubspace",
    "ComputeLocationSubspace",
    "DesignSubspace",
    "LoopPoint",
    "LoopSpace",
    "StaleRecordError",
    "Subspace",
    "TileSubspace",
    "tune_context_intrins",
]

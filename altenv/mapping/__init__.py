"""Intrinsic mappings (AMOS §4-§5): intrinsics, operator loop nests, mapping generators."""

from .base import GENERATORS, Intrinsic, Loop, LoopNest, Mapping, MappingGenerator, register
from .intrinsics import INTRINSICS

__all__ = ["GENERATORS", "INTRINSICS", "Intrinsic", "Loop", "LoopNest", "Mapping",
           "MappingGenerator", "register"]

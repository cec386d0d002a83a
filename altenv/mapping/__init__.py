"""Intrinsic mappings (AMOS §4-§5): intrinsics, operator loop nests, mapping generators,
their realization as layouts, and the mapping choice as a tuning knob."""

from .amos import AmosGenerator, validate
from .base import (
    GENERATORS,
    Intrinsic,
    Loop,
    LoopNest,
    Mapping,
    MappingGenerator,
    Stencil,
    register,
)
from .cp_embedding import CpEmbeddingGenerator
from .intrinsics import INTRINSICS
from .nest import loop_nest
from .realize import Realization, realize
from .space import MAPPING_GENERATORS, MappingTemplate, mappings_for, select_intrinsic

__all__ = ["GENERATORS", "INTRINSICS", "MAPPING_GENERATORS", "AmosGenerator",
           "CpEmbeddingGenerator", "Intrinsic", "Loop", "LoopNest", "Mapping", "MappingGenerator",
           "MappingTemplate", "Realization", "Stencil", "loop_nest", "mappings_for", "realize",
           "register", "select_intrinsic", "validate"]

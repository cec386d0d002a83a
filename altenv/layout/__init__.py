"""Layout primitives (ALT §4.1), their index maps, and random legal layouts."""

from .indexing import Window
from .layout import Layout
from .sampling import random_layout

__all__ = ["Layout", "Window", "random_layout"]

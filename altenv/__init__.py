"""altenv: joint data-layout and loop tuning environments on Apache TVM (ALT)."""

__version__ = "0.1.0"

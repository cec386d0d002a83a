"""ALT's nine complex operators: workload specs, layout-aware generation, templates."""

from .codegen import EPILOGUE_INPUTS, Epilogue, OpProgram, generate, run_numpy
from .operators import Operator, operator_for
from .templates import Knob, LayoutTemplate, divisors, nearest_divisor
from .workload import KINDS, Workload, parse_workload

__all__ = [
    "EPILOGUE_INPUTS", "Epilogue", "KINDS", "Knob", "LayoutTemplate", "OpProgram",
    "Operator", "Workload",
    "divisors", "generate", "nearest_divisor", "operator_for", "parse_workload", "run_numpy",
]

"""ALT's nine complex operators: workload specs, layout-aware generation, templates."""

import lazy_loader

# Submodules load on first use, so that reading a config (altenv.config) imports no TVM.
__getattr__, __dir__, __all__ = lazy_loader.attach(__name__, submod_attrs={
    "codegen": ["OpProgram", "generate", "run_numpy"],
    "epilogue": ["EPILOGUE_INPUTS", "Epilogue"],
    "operators": ["Operator", "operator_for"],
    "templates": ["Knob", "LayoutTemplate", "divisors", "nearest_divisor"],
    "workload": ["KINDS", "Workload", "parse_workload"],
})

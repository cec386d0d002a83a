"""Graph level: model import (zoo, ONNX, torch factories), task extraction, whole-network build."""

from altenv.graph.build import BuiltModel, build, max_rel_err, rel_err
from altenv.graph.frontend import ImportedModel, InputSpec, UnsupportedOperatorError, load_model
from altenv.graph.ops_match import ComplexOp, FuncAnalysis
from altenv.graph.tasks import Edge, Source, Task, TaskCall, TaskGraph, extract_tasks

__all__ = [
    "BuiltModel", "ComplexOp", "Edge", "FuncAnalysis", "ImportedModel", "InputSpec", "Source",
    "Task", "TaskCall", "TaskGraph", "UnsupportedOperatorError", "build", "extract_tasks",
    "load_model", "max_rel_err", "rel_err",
]

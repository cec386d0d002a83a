"""Whole-network build of a task graph, with per-task PrimFunc replacements.

The fused module of a :class:`TaskGraph` is compiled as is (no re-legalization or re-fusion),
so a task replaced by a tuned or layout-transformed PrimFunc stays exactly what was given.
Untouched tasks keep TVM's default schedules (plain loops on CPU, ``DefaultGPUSchedule`` on GPU).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import tvm
from tvm import relax, s_tir, tirx
from tvm.relax.backend.cpu_generic.pipeline import dataflow_lower_passes, finalize_passes

from altenv.graph.tasks import TaskGraph
from altenv.target import device_of, make_target


@dataclass
class BuiltModel:
    """A compiled network and its Relax VM.

    Parameters
    ----------
    executable: the ``tvm.compile`` result (``export_library`` for deployment).
    vm: the Relax virtual machine on ``device``.
    device: where it runs.
    """

    executable: relax.VMExecutable
    vm: relax.VirtualMachine
    device: tvm.runtime.Device

    def run(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        """Run ``main`` on numpy inputs; outputs flattened to a list of arrays."""
        out = self.vm["main"](*(tvm.runtime.tensor(x, self.device) for x in inputs))
        return _flatten(out)


def _flatten(value: object) -> list[np.ndarray]:
    if isinstance(value, tvm.runtime.Tensor):
        return [value.numpy()]
    return [a for v in value for a in _flatten(v)]  # type: ignore[attr-defined]


def apply_replacements(graph: TaskGraph,
                       replacements: Mapping[str, tirx.PrimFunc | s_tir.Schedule]) -> tvm.IRModule:
    """``graph.mod`` with the PrimFunc of each named task (every structurally equal copy)
    replaced; a :class:`tvm.s_tir.Schedule` stands for its scheduled ``main``. A replacement
    must keep the task's signature (parameter count, shapes and dtypes)."""
    mod = graph.mod
    for name, new in replacements.items():
        if name not in graph.tasks:
            raise KeyError(f"replace: no task {name!r}; tasks: {', '.join(graph.tasks)}")
        func = new.mod["main"] if isinstance(new, s_tir.Schedule) else new
        old = graph.tasks[name].func
        _check_signature(name, old, func)
        func = func.with_attrs(old.attrs) if old.attrs is not None else func
        for gname in graph.tasks[name].func_names:
            mod = with_func(mod, gname, func)
    return mod


def with_func(mod: tvm.IRModule, gname: str, func: tirx.PrimFunc) -> tvm.IRModule:
    """A copy of ``mod`` whose function ``gname`` is ``func``."""
    out = tvm.IRModule(dict(mod.functions), attrs=mod.attrs)
    out.update_func(out.get_global_var(gname), func)
    return out


def _shape(param: tirx.Var) -> tuple[tuple[int, ...], str]:
    return tuple(int(d) for d in param.shape), str(param.dtype)


def _check_signature(name: str, old: tirx.PrimFunc, new: tirx.PrimFunc) -> None:
    sig_old, sig_new = [_shape(p) for p in old.params], [_shape(p) for p in new.params]
    if sig_old != sig_new:
        raise ValueError(f"replace {name}: signature {sig_new} differs from the task's {sig_old}")


def build(graph: TaskGraph, target: str | dict | tvm.target.Target | None = None,
          replacements: Mapping[str, tirx.PrimFunc | s_tir.Schedule] | None = None) -> BuiltModel:
    """Compile ``graph`` for ``target`` (default: this host's CPU) with default schedules,
    except for the tasks in ``replacements`` (task name -> PrimFunc or Schedule)."""
    mod = apply_replacements(graph, replacements or {})
    fixed = {gname for name in (replacements or {}) for gname in graph.tasks[name].func_names}
    return compile_module(mod, target, fixed)


def compile_module(mod: tvm.IRModule, target: str | dict | tvm.target.Target | None = None,
                   scheduled: set[str] | frozenset[str] = frozenset()) -> BuiltModel:
    """Compile a module of ``call_tir`` calls as it is (no re-legalization or re-fusion); on a
    GPU every PrimFunc not named in ``scheduled`` gets ``DefaultGPUSchedule``."""
    tgt = make_target(target)
    if tgt.kind.name != "llvm":
        mod = _default_gpu_schedule(mod, tgt, set(scheduled))
    pipeline = tvm.transform.Sequential(dataflow_lower_passes(tgt) + finalize_passes(tgt))
    with tgt:
        ex = tvm.compile(mod, tgt, relax_pipeline=pipeline)
    dev = device_of(tgt)
    return BuiltModel(ex, relax.VirtualMachine(ex, dev), dev)


def _default_gpu_schedule(mod: tvm.IRModule, target: tvm.target.Target,
                          keep: set[str]) -> tvm.IRModule:
    """Thread-bind every PrimFunc not in ``keep`` with ``DefaultGPUSchedule``."""
    with target:
        scheduled = s_tir.transform.DefaultGPUSchedule()(mod)
    for gv, func in mod.functions.items():
        if gv.name_hint in keep:
            scheduled = with_func(scheduled, gv.name_hint, func)
    return scheduled


def rel_err(actual: np.ndarray, expected: np.ndarray) -> float:
    """``||actual - expected|| / ||expected||`` (L2, float64)."""
    a, e = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    return float(np.linalg.norm(a - e) / max(np.linalg.norm(e), 1e-30))


def max_rel_err(actual: list[np.ndarray], expected: list[np.ndarray]) -> float:
    """Largest :func:`rel_err` over paired outputs (their counts and shapes must match)."""
    if len(actual) != len(expected):
        raise ValueError(f"{len(actual)} outputs, expected {len(expected)}")
    for a, e in zip(actual, expected):
        if a.shape != e.shape:
            raise ValueError(f"output shape {a.shape}, expected {e.shape}")
    return max(rel_err(a, e) for a, e in zip(actual, expected))

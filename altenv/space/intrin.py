"""Register only the tensor intrinsics a target needs before MetaSchedule starts.

``TuneContext.__init__`` runs ``import tvm.s_tir.tensor_intrin``, which registers the
intrinsics of every backend: 40-80 s on a 2-core machine, 28 s of it CUDA, while x86
alone takes 0.6 s. :func:`tune_context_intrins` registers the families of one target
(``x86`` for an x86 LLVM target, ``arm_cpu`` for AArch64, ``cuda`` for CUDA) and lets
``TuneContext`` be built without paying for the others. Any later plain
``import tvm.s_tir.tensor_intrin`` still runs the package in full and reuses the
families already loaded, so nothing is registered twice and nothing goes missing.

Each ``@T.prim_func`` in those modules calls ``inspect.stack()``, which looks up the
module of every frame on the stack; frames of the import machinery (``<frozen
importlib._bootstrap>``) have no file, so each lookup scans ``sys.modules``. Loading the
CUDA family made 25,000 such lookups: 19 s in a plain process, 150 s under pytest (3,000
modules). While a family loads, ``inspect.stack`` gives the same frames with their
current line read through ``linecache`` (:func:`_frames`), which is all TVMScript reads.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import linecache
import os
import sys
import threading
import types
from collections.abc import Iterator

import tvm
import tvm.s_tir
from tvm.s_tir import TensorIntrin

_PACKAGE = "tvm.s_tir.tensor_intrin"


def intrin_families(target: tvm.target.Target) -> tuple[str, ...] | None:
    """Submodules of ``tvm.s_tir.tensor_intrin`` that ``target``'s schedule rules use,
    or ``None`` where only the full package is known to be enough."""
    kind = target.kind.name
    if kind == "cuda":
        return ("cuda",)
    if kind == "llvm":
        triple = str(target.attrs.get("mtriple", ""))
        if triple.startswith(("x86_64", "i686", "i386")) or not triple:
            return ("x86",)
        if triple.startswith("aarch64"):
            return ("arm_cpu",)
    return None


_SWAPPING = threading.RLock()
"""Held while ``sys.modules`` has a stand-in for TVM's intrinsic package."""


def _load_families(families: tuple[str, ...]) -> None:
    with _SWAPPING:
        _load_missing(families)


_STACK = inspect.stack


def _frames(context: int = 1) -> list[inspect.FrameInfo]:
    """``inspect.stack(context)`` of the caller without module lookups: each frame with its
    file name as compiled, its line number and (``context=1``) its current source line."""
    if context != 1:
        return _STACK(context)
    frames, frame = [], sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        line = linecache.getline(code.co_filename, frame.f_lineno, frame.f_globals)
        frames.append(inspect.FrameInfo(frame, code.co_filename, frame.f_lineno, code.co_name,
                                        [line] if line else None, 0 if line else None))
        frame = frame.f_back
    return frames


def _load_missing(families: tuple[str, ...]) -> None:
    missing = [f for f in families if f"{_PACKAGE}.{f}" not in sys.modules]
    if not missing:
        return
    package = types.ModuleType(_PACKAGE)
    package.__path__ = [os.path.join(os.path.dirname(tvm.s_tir.__file__), "tensor_intrin")]
    sys.modules[_PACKAGE] = package
    inspect.stack = _frames
    try:
        for family in missing:
            importlib.import_module(f"{_PACKAGE}.{family}")
    finally:
        inspect.stack = _STACK
        del sys.modules[_PACKAGE]


@contextlib.contextmanager
def tune_context_intrins(target: tvm.target.Target) -> Iterator[None]:
    """Within this block ``import tvm.s_tir.tensor_intrin`` is a no-op and the intrinsics
    of ``target`` are registered; build ``TuneContext`` objects inside it. One thread at a
    time (it swaps entries of ``sys.modules``; a network's tasks may tune in threads)."""
    with _SWAPPING:
        with _intrins_for(target):
            yield


@contextlib.contextmanager
def _intrins_for(target: tvm.target.Target) -> Iterator[None]:
    if _PACKAGE in sys.modules:
        yield
        return
    families = intrin_families(target)
    if families is None:
        importlib.import_module(_PACKAGE)
        yield
        return
    _load_families(families)
    placeholder = types.ModuleType(_PACKAGE)
    placeholder.__path__ = []
    sys.modules[_PACKAGE] = placeholder
    try:
        yield
    finally:
        if sys.modules.get(_PACKAGE) is placeholder:
            del sys.modules[_PACKAGE]


def ensure_registered(name: str) -> None:
    """Register tensor intrinsic ``name`` if it is not yet: altenv's AVX2 and VNNI dot
    products by importing their modules, TVM's x86 ones (``dot_16x4_avx512``, ...) by
    loading only the x86 family."""
    if TensorIntrin.get(name, allow_missing=True) is not None:
        return
    from .avx2 import AVX2_DOT_8x4_INTRIN  # importing registers it: only when asked
    from .vnni import VNNI_DOT_16x4_INTRIN

    if name not in (AVX2_DOT_8x4_INTRIN, VNNI_DOT_16x4_INTRIN):
        _load_families(("x86",))
    if TensorIntrin.get(name, allow_missing=True) is None:
        raise ValueError(f"tensor intrinsic {name!r} is not registered")

"""Optional correctness check of measured candidates against a numpy reference.

The check runs inside the runner's worker process (local or the RPC client worker), right
before timing, so a crashing candidate still only kills that worker, and the timing runs
on the checked inputs. Inputs are random, signed and never zero; outputs are pre-filled
with random values too, so a kernel that skips a write is caught.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import tvm
from tvm.s_tir.meta_schedule.runner.utils import run_evaluator_common


class WrongResultError(RuntimeError):
    """A candidate's output differs from the reference."""


def random_array(rng: np.random.Generator, shape: Sequence[int], dtype: str) -> np.ndarray:
    """Random values bounded away from zero: magnitude in [0.5, 1.5) (ints 1..4), random sign."""
    sign = rng.choice(np.array([-1, 1]), size=tuple(shape))
    if np.issubdtype(np.dtype(dtype), np.integer):
        return (rng.integers(1, 5, size=tuple(shape)) * sign).astype(dtype)
    return (rng.uniform(0.5, 1.5, size=tuple(shape)) * sign).astype(dtype)


def max_relative_error(actual: np.ndarray, expected: np.ndarray,
                       scale: float | None = None) -> float:
    """Largest absolute difference, relative to the largest reference magnitude (``scale``:
    that magnitude, where the caller knows it). Floats are subtracted in their own
    precision (at least float32: a difference that matters at a tolerance of 1e-3 is far
    above its rounding), integers in float64 (no overflow)."""
    if scale is None:
        scale = reference_scale(expected)
    if not actual.size:
        return 0.0
    work = (np.promote_types(expected.dtype, np.float32)
            if np.issubdtype(expected.dtype, np.floating) else np.float64)
    return float(np.max(np.abs(np.subtract(actual, expected, dtype=work)))) / scale


def reference_scale(expected: np.ndarray) -> float:
    """The largest magnitude of a reference output (never 0; integers in float64, where
    the magnitude of int8's -128 does not wrap)."""
    work = None if np.issubdtype(expected.dtype, np.floating) else np.float64
    top = float(np.max(np.abs(expected, dtype=work))) if expected.size else 0.0
    return max(top, np.finfo(np.float64).tiny)


_LOADED: dict[str, tuple[list[np.ndarray], list[tuple[int, np.ndarray, float]]]] = {}
"""The check data a runner worker read last (:func:`_load`): every candidate of a layout
is checked on the same file, and reading it takes longer than timing a large kernel."""


def _load(data_file: str) -> tuple[list[np.ndarray], list[tuple[int, np.ndarray, float]]]:
    """The arrays of a check file (arguments; outputs' index, expected values and scale),
    read once per worker process while it checks candidates of the same file."""
    entry = _LOADED.get(data_file)
    if entry is None:
        with np.load(data_file) as data:
            count = sum(1 for name in data.files if name.startswith("arg"))
            args = [data[f"arg{i}"] for i in range(count)]
            expected = [(int(name.removeprefix("expected")), data[name])
                        for name in data.files if name.startswith("expected")]
        entry = (args, [(i, e, reference_scale(e)) for i, e in expected])
        _LOADED.clear()  # one file held: a worker's memory stays one operator's data
        _LOADED[data_file] = entry
    return entry


class CorrectnessCheck:
    """Compare a candidate's outputs with ``reference`` on random inputs.

    Parameters
    ----------
    reference : Callable[..., np.ndarray | tuple[np.ndarray, ...]]
        Called with the input arrays (the function's parameters except the last
        ``num_outputs``); returns the expected output(s).
    num_outputs : int
        How many trailing parameters of the PrimFunc are outputs.
    rtol : float
        Tolerance on :func:`max_relative_error`.
    seed : int
        Seed of the random inputs.
    case : Callable[[np.random.Generator], tuple[Sequence[np.ndarray], Any]] | None
        Makes the inputs *and* the expected output(s) together, instead of
        ``reference`` on independent random inputs: for programs whose inputs are not
        independent arrays (a layout that stores overlapping tiles holds equal copies).
    """

    def __init__(
        self,
        reference: Callable[..., Any] | None = None,
        num_outputs: int = 1,
        rtol: float = 1e-3,
        seed: int = 0,
        case: Callable[[np.random.Generator], tuple[Sequence[np.ndarray], Any]] | None = None,
    ) -> None:
        if (reference is None) == (case is None):
            raise ValueError("CorrectnessCheck needs exactly one of reference= and case=")
        self.reference = reference
        self.num_outputs = num_outputs
        self.rtol = rtol
        self.seed = seed
        self.case = case
        self._dir = tempfile.TemporaryDirectory(prefix="altenv-check-")
        self._files: dict[tuple[tuple[str, tuple[int, ...]], ...], str] = {}

    def data_file(self, args: Sequence[tuple[str, Sequence[int]]]) -> str:
        """The ``.npz`` holding inputs, initial outputs and expected outputs for these
        ``(dtype, shape)`` parameters; computed once per signature (threads asking at
        once may each compute it; each writes its own file)."""
        sig = tuple((dtype, tuple(int(d) for d in shape)) for dtype, shape in args)
        if sig not in self._files:
            rng = np.random.default_rng(self.seed)
            first_out = len(sig) - self.num_outputs
            if self.case is None:
                arrays = [random_array(rng, shape, dtype) for dtype, shape in sig[:first_out]]
                expected = self.reference(*arrays)
            else:
                inputs, expected = self.case(rng)
                arrays = [np.asarray(a, dtype=dtype)
                          for a, (dtype, _) in zip(inputs, sig[:first_out], strict=True)]
            arrays += [random_array(rng, shape, dtype) for dtype, shape in sig[first_out:]]
            if isinstance(expected, np.ndarray):
                expected = (expected,)
            if len(expected) != self.num_outputs:
                raise ValueError(f"reference returned {len(expected)} outputs, "
                                 f"expected {self.num_outputs}")
            payload = {f"arg{i}": a for i, a in enumerate(arrays)}
            for i, exp in enumerate(expected):
                payload[f"expected{first_out + i}"] = np.asarray(exp, dtype=sig[first_out + i][0])
            # a file of its own even when devices' threads ask at once, published once whole
            handle, path = tempfile.mkstemp(suffix=".npz", dir=self._dir.name)
            with os.fdopen(handle, "wb") as stream:
                np.savez(stream, **payload)
            self._files[sig] = path
        return self._files[sig]

    def evaluator(self, args: Sequence[tuple[str, Sequence[int]]], rpc: bool) -> CheckedEvaluator:
        """A runner ``f_run_evaluator`` that checks before it times."""
        return CheckedEvaluator(self.data_file(args), self.rtol, rpc)


class CheckedEvaluator:
    """MetaSchedule ``f_run_evaluator`` (local or RPC signature): run once on the stored
    inputs, raise :class:`WrongResultError` on a mismatch, else time as MetaSchedule does
    on those same inputs.

    Not on MetaSchedule's own arguments: its random fill draws floats in [1, 10), all
    positive, and a kernel whose speed depends on signs (a branch on the sign of a ReLU's
    input, say) runs faster on them than on real tensors. One stem convolution at batch 16
    timed 61 ms on them and 82 ms on signed inputs, and the search, ranking on the
    former, picked it over kernels that are faster on the latter."""

    def __init__(self, data_file: str, rtol: float, rpc: bool) -> None:
        self.data_file = data_file
        self.rtol = rtol
        self.rpc = rpc

    def __call__(self, *args: Any) -> list[float]:
        rt_mod, device, evaluator_config, _ = args[1:] if self.rpc else args
        arrays, expected = _load(self.data_file)
        # fresh tensors each time: a wrong kernel may write into its inputs
        tensors = [tvm.runtime.tensor(a, device) for a in arrays]
        rt_mod[rt_mod.entry_name](*tensors)
        device.sync()
        for index, want, scale in expected:
            err = max_relative_error(tensors[index].numpy(), want, scale)
            if not err <= self.rtol:
                raise WrongResultError(f"wrong result (max rel err {err:.3g})")
        return run_evaluator_common(rt_mod, device, evaluator_config, [tensors])

"""``altenv bench peak``: this host's roofline, measured by kernels TVM builds.

A tuned operator's latency says little without the machine's limits beside it. The FMA
peak is timed on a TIR kernel of independent multiply-add chains (``chains`` vector
accumulators of the target's SIMD width, so the FMA units never wait on a result), on every
core and on one, with TVM's thread pool as wide as the tuned programs run it; the bandwidth
on a streaming kernel (``a = s * a + b``, 12 bytes an element) at three sizes: inside each
core's L1 and L2 (swept many times) and over arrays larger than the last-level cache
(memory). All are built for the same TVM target as the tuned programs and cached per host
(``$XDG_CACHE_HOME/altenv/peak-<host>-<hash>.json``).

:func:`roofline` bounds an operator by ``min(peak, intensity * bandwidth)`` (intensity:
its FLOPs over the bytes of its tensors, each read or written once; bandwidth: that of the
smallest level its tensors fit in, all cores' private caches together; a cache-aware
roofline), the bound the ``% roof`` column of ``altenv bench ops`` tables divides by (once
``altenv bench peak`` has measured the host: a bench never spends its time on it unasked).
"""

from __future__ import annotations

import hashlib
import os
import socket
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import tvm
from tvm.script import tirx as T

from ..files import UnsafeFileError, make_dir, read_json, write_json
from ..ops.operators import operator_for
from ..ops.workload import Workload
from ..space.constraints import Hardware, cache_bytes
from ..target import make_target, use_tvm_threads

CHAINS = 12
"""Independent vector accumulators: FMA latency (4 cycles) x FMA ports (2), with room."""
FMA_SECONDS = 0.05
"""Seconds one timing of the FMA or an in-cache streaming kernel lasts (about)."""
MAX_ARRAY_BYTES = 256 << 20
"""The memory stream's arrays: twice the last-level cache each, at most this (a 300 MiB
shared L3 of a cloud socket would otherwise ask for gigabytes)."""
STREAM_BYTES = 12
"""Bytes ``a = s * a + b`` moves per element: a and b read, a written."""


@dataclass(frozen=True)
class Peak:
    """A host's measured limits (fp32)."""

    host: str
    target: str
    cores: int
    lanes: int
    gflops: float
    """FMA peak on every core (GFLOP/s)."""
    gflops_one_core: float
    gbs: float
    """Memory bandwidth on every core (GB/s, 12 bytes per element)."""
    stream_mib: float
    """Size of each array of the memory stream (MiB)."""
    cache_gbs: list[tuple[str, int, float]]
    """``(level, bytes, GB/s)``: the stream's bandwidth on every core with its arrays in
    each core's L1, then L2; bytes: that level's capacity over all cores."""
    tvm: str

    def bandwidth(self, nbytes: float) -> tuple[float, str]:
        """GB/s and the level's name (``"L1"``, ``"L2"``, ``"mem"``) for an operator
        whose tensors take ``nbytes``: the smallest level they fit in."""
        for level, capacity, gbs in self.cache_gbs:
            if nbytes <= capacity:
                return gbs, level
        return self.gbs, "mem"

    def bound(self, flops: float, nbytes: float) -> tuple[float, str]:
        """The roofline of an operator of ``flops`` moving ``nbytes``: attainable GFLOP/s
        and ``"flop"`` or the bandwidth level that limits it (``"L1"``, ``"L2"``,
        ``"mem"``)."""
        gbs, level = self.bandwidth(nbytes)
        memory = flops / nbytes * gbs
        return (self.gflops, "flop") if self.gflops <= memory else (memory, level)


def _fma_kernel(threads: int, lanes: int, iters: int) -> tvm.tirx.PrimFunc:
    """``threads`` x ``CHAINS`` vector accumulators, each ``acc = acc * a + b`` ``iters``
    times: 2 * threads * CHAINS * lanes * iters FLOPs, nothing read from memory."""

    @T.prim_func
    def main(x: T.Buffer((threads, CHAINS, lanes), "float32"),
             y: T.Buffer((threads, CHAINS, lanes), "float32")):
        T.func_attr({"global_symbol": "main", "tirx.noalias": True})
        for p in T.parallel(threads):
            acc = T.alloc_buffer((CHAINS, lanes), "float32", scope="local")
            for c in range(CHAINS):
                for lane in T.vectorized(lanes):
                    acc[c, lane] = x[p, c, lane]
            for _ in range(iters):
                for c in T.unroll(CHAINS):
                    for lane in T.vectorized(lanes):
                        acc[c, lane] = acc[c, lane] * T.float32(0.999) + T.float32(0.001)
            for c in range(CHAINS):
                for lane in T.vectorized(lanes):
                    y[p, c, lane] = acc[c, lane]

    return main


def _stream_kernel(threads: int, lanes: int, rows: int, sweeps: int) -> tvm.tirx.PrimFunc:
    """``a = 0.5 a + b`` over ``threads * rows * lanes`` floats, one block per thread,
    ``sweeps`` times (each sweep depends on the last, so none is skipped)."""

    @T.prim_func
    def main(a: T.Buffer((threads, rows, lanes), "float32"),
             b: T.Buffer((threads, rows, lanes), "float32")):
        T.func_attr({"global_symbol": "main", "tirx.noalias": True})
        for p in T.parallel(threads):
            for _ in range(sweeps):
                for r in range(rows):
                    for lane in T.vectorized(lanes):
                        a[p, r, lane] = a[p, r, lane] * T.float32(0.5) + b[p, r, lane]

    return main


def _seconds(func: tvm.tirx.PrimFunc, target: tvm.target.Target, args: list[np.ndarray],
             repeat: int) -> float:
    """The fastest of ``repeat`` timings of ``func`` (a peak is what the machine can do)."""
    dev = tvm.cpu(0)
    lib = tvm.compile(func, target=target)
    tensors = [tvm.runtime.tensor(a, dev) for a in args]
    timer = lib.mod.time_evaluator("main", dev, number=1, repeat=repeat)
    return min(timer(*tensors).results)


def _fma_gflops(target: tvm.target.Target, threads: int, lanes: int) -> float:
    shape = (threads, CHAINS, lanes)
    args = [np.ones(shape, "float32"), np.zeros(shape, "float32")]
    flops_per_iter = 2 * threads * CHAINS * lanes
    iters = 1024
    seconds = _seconds(_fma_kernel(threads, lanes, iters), target, args, 3)
    iters = max(1024, int(iters * FMA_SECONDS / max(seconds, 1e-9)))  # ~50 ms a run
    seconds = _seconds(_fma_kernel(threads, lanes, iters), target, args, 7)
    return flops_per_iter * iters / seconds / 1e9


def _stream_gbs(target: tvm.target.Target, threads: int, lanes: int,
                per_thread_bytes: int) -> float:
    """Bandwidth (GB/s) of the stream with its two arrays taking ``per_thread_bytes`` per
    thread, swept for about ``FMA_SECONDS`` when they are small."""
    rows = max(1, per_thread_bytes // (2 * 4 * lanes))
    shape = (threads, rows, lanes)
    args = [np.ones(shape, "float32"), np.ones(shape, "float32")]
    sweeps = 1
    seconds = _seconds(_stream_kernel(threads, lanes, rows, sweeps), target, args, 3)
    if seconds < FMA_SECONDS:
        sweeps = max(1, int(FMA_SECONDS / max(seconds, 1e-9)))
        seconds = _seconds(_stream_kernel(threads, lanes, rows, sweeps), target, args, 7)
    return STREAM_BYTES * threads * rows * lanes * sweeps / seconds / 1e9


def measure_peak(target: str | tvm.target.Target | None = None) -> Peak:
    """Time the FMA kernel (all cores, one core) and the stream (in L1, in L2, in memory)
    on this host."""
    tgt = make_target(target)
    if tgt.kind.name != "llvm":
        raise ValueError(f"bench peak: measures CPUs; target is {tgt.kind.name}")
    cores = int(tgt.attrs.get("num-cores", 0)) or os.cpu_count() or 1
    use_tvm_threads(cores)  # TVM would run one thread per two cores on x86
    lanes = Hardware.of(tgt).lanes()
    caches = []
    for level in (1, 2):  # half of each core's cache, the rest for the stack and code
        size = cache_bytes(level)
        caches.append((f"L{level}", size * cores, _stream_gbs(tgt, cores, lanes, size // 2)))
    per_array = min(max(2 * cache_bytes(3), 64 << 20), MAX_ARRAY_BYTES)
    rows = per_array // (4 * lanes * cores)
    return Peak(host=socket.gethostname(), target=str(tgt), cores=cores, lanes=lanes,
                gflops=_fma_gflops(tgt, cores, lanes),
                gflops_one_core=_fma_gflops(tgt, 1, lanes),
                gbs=_stream_gbs(tgt, cores, lanes, 2 * rows * lanes * 4),
                stream_mib=rows * lanes * cores * 4 / 2**20, cache_gbs=caches,
                tvm=tvm.__version__)


def cache_path(target: str | tvm.target.Target | None = None) -> Path:
    """Where this host's peak for ``target`` is cached."""
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "altenv"
    digest = hashlib.sha256(f"{make_target(target)}|{tvm.__version__}".encode()).hexdigest()
    return root / f"peak-{socket.gethostname()}-{digest[:12]}.json"


def cached_peak(target: str | tvm.target.Target | None = None) -> Peak | None:
    """This host's cached peak for ``target``, ``None`` when ``altenv bench peak`` has not
    measured it (or the cache is unreadable)."""
    path = cache_path(target)
    try:
        fields = read_json(path)
        fields["cache_gbs"] = [tuple(level) for level in fields["cache_gbs"]]
        return Peak(**fields)
    except (OSError, KeyError, TypeError, ValueError, UnsafeFileError):
        return None


def host_peak(target: str | tvm.target.Target | None = None, refresh: bool = False) -> Peak:
    """This host's peak for ``target``: cached, measured (and cached) when there is none
    or ``refresh``."""
    peak = None if refresh else cached_peak(target)
    if peak is not None:
        return peak
    peak = measure_peak(target)
    path = cache_path(target)
    make_dir(path.parent)
    write_json(path, asdict(peak))
    return peak


def operator_traffic(workload: Workload, epilogue: Sequence[str] = ()) -> tuple[float, float]:
    """``(FLOPs, bytes)`` of an operator: its tensors (and epilogue inputs) each moved
    once, the least any schedule moves (:meth:`~altenv.ops.operators.Operator.traffic_bytes`
    and the epilogue's residual and bias)."""
    op = operator_for(workload)
    item = np.dtype(op.out_dtype).itemsize
    nbytes = op.traffic_bytes()
    if "residual" in epilogue:
        nbytes += int(np.prod(op.out_shape())) * item
    if "bias" in epilogue:
        nbytes += op.out_shape()[op.channel_axis] * item
    return float(op.flops()), float(nbytes)


def format_peak(peak: Peak, seconds: float | None = None) -> str:
    """The lines ``altenv bench peak`` prints."""
    took = f" (measured in {seconds:.1f} s)" if seconds is not None else " (cached)"
    lines = [f"host {peak.host}, target {peak.target}{took}",
             f"fp32 FMA peak: {peak.gflops:.1f} GFLOP/s on {peak.cores} cores, "
             f"{peak.gflops_one_core:.1f} GFLOP/s on one ({peak.lanes} lanes)"]
    lines += [f"{level} bandwidth (tensors within {size / 2**10:.0f} KiB): {gbs:.1f} GB/s"
              for level, size, gbs in peak.cache_gbs]
    lines.append(f"memory bandwidth (a = s a + b, 2 x {peak.stream_mib:.0f} MiB): "
                 f"{peak.gbs:.1f} GB/s")
    ridges = [f"{peak.gflops / gbs:.1f} in {level}" for level, _, gbs in peak.cache_gbs]
    lines.append(f"ridge point (FLOP/byte): {peak.gflops / peak.gbs:.1f} from memory, "
                 + ", ".join(ridges))
    return "\n".join(lines) + "\n"


def timed_peak(target: str | tvm.target.Target | None, refresh: bool) -> str:
    """``altenv bench peak``'s output: the cached or freshly measured peak."""
    fresh = refresh or cached_peak(target) is None
    start = time.perf_counter()
    peak = host_peak(target, refresh)
    return format_peak(peak, time.perf_counter() - start if fresh else None)

"""Target construction: TVM 0.27 wants dict targets with an explicit CPU and core count."""

from __future__ import annotations

import os
from typing import Any

import tvm


def host_cpu_target(num_cores: int | None = None) -> tvm.target.Target:
    """The LLVM target of this host's CPU (``mcpu`` detected, ``num-cores`` for MetaSchedule)."""
    cores = num_cores or len(os.sched_getaffinity(0))
    return tvm.target.Target(
        {
            "kind": "llvm",
            "mtriple": "x86_64-linux-gnu",
            "mcpu": tvm.target.codegen.llvm_get_system_cpu(),
            "num-cores": cores,
        }
    )


def make_target(spec: str | dict[str, Any] | tvm.target.Target | None) -> tvm.target.Target:
    """Resolve a user's target: ``None``/``"cpu"``/``"llvm"`` is this host, ``"cuda"`` a GPU,
    a dict is passed to TVM as is."""
    if spec is None or (isinstance(spec, str) and spec in ("cpu", "llvm", "host")):
        return host_cpu_target()
    if isinstance(spec, tvm.target.Target):
        return spec
    if isinstance(spec, str) and spec == "cuda":
        return tvm.target.Target({"kind": "cuda", "arch": "sm_90", "max_threads_per_block": 1024,
                                  "max_shared_memory_per_block": 49152, "thread_warp_size": 32})
    if isinstance(spec, dict):
        return tvm.target.Target(spec)
    raise ValueError(
        f"unsupported value {spec!r}; allowed: 'cpu' (this host), 'cuda', or a TVM "
        "target dict"
    )


def check_target(spec: str | dict[str, Any]) -> tvm.target.Target:
    """:func:`make_target` of a user's target, or a ``ValueError`` of one line saying what
    is allowed."""
    if isinstance(spec, str):
        return make_target(spec)
    if isinstance(spec, dict) and spec.get("kind") == "llvm" and "mcpu" in spec:
        _check_mcpu(spec)  # before TVM logs its own complaint about it
    try:
        target = make_target(spec)
    except Exception as err:  # noqa: BLE001 (TVM reports a bad dict in several ways)
        reason = " ".join(str(err).split())
        raise ValueError(f"unsupported value {spec!r} ({reason}); allowed: 'cpu' (this "
                         "host), 'cuda', or a TVM target dict") from None
    if target.kind.name == "llvm" and "num-cores" not in target.attrs:
        raise ValueError("an llvm target dict needs 'num-cores' (the threads MetaSchedule "
                         f"plans for), e.g. {{kind: llvm, mcpu: "
                         f"{tvm.target.codegen.llvm_get_system_cpu()}, num-cores: "
                         f"{len(os.sched_getaffinity(0))}}}")
    return target


def _check_mcpu(spec: dict[str, Any]) -> None:
    """A ``ValueError`` unless the ``mcpu`` of an llvm target dict is a CPU LLVM knows."""
    try:
        plain = tvm.target.Target({k: v for k, v in spec.items() if k in ("kind", "mtriple")})
    except Exception:  # noqa: BLE001 (a bad mtriple: make_target reports it)
        return
    if str(spec["mcpu"]) not in tvm.target.codegen.llvm_get_cpu_archlist(plain):
        raise ValueError(f"mcpu {spec['mcpu']!r} is no CPU LLVM knows; allowed: e.g. "
                         f"{tvm.target.codegen.llvm_get_system_cpu()!r} (this host)")


def check_device(target: tvm.target.Target) -> None:
    """A ``ValueError`` of one line unless the device ``target`` runs on is present here
    (a CUDA target needs a visible GPU; measuring on a missing device fails every trial)."""
    if target.kind.name != "llvm" and not device_of(target).exist:
        raise ValueError(f"{target.kind.name!r} needs a {target.kind.name} device and none is "
                         "visible on this host; allowed here: 'cpu'")


def device_type(target: tvm.target.Target) -> str:
    """Runtime device name of a target kind (``llvm`` runs on ``cpu``)."""
    kind = str(target.kind.name)
    return "cpu" if kind in ("llvm", "c") else kind


def remote_device(session: Any, target: tvm.target.Target) -> tvm.runtime.Device:
    """The device of a TVM RPC ``session`` that programs built for ``target`` run on."""
    return session.device(device_type(target), 0)


def device_of(target: tvm.target.Target) -> tvm.runtime.Device:
    """The device programs built for ``target`` run on (the host CPU for ``llvm``)."""
    return tvm.cpu() if target.kind.name == "llvm" else tvm.device(target.kind.name, 0)


def target_cores(target: tvm.target.Target) -> int:
    """The target's ``num-cores`` (this process's CPUs when unset)."""
    cores = target.attrs.get("num-cores")
    return int(cores) if cores else len(os.sched_getaffinity(0))


def use_tvm_threads(num_threads: int) -> None:
    """Make TVM's CPU thread pool use ``num_threads`` threads, here and in worker processes
    started afterwards (they inherit ``TVM_NUM_THREADS``).

    Without it TVM runs ``hardware_concurrency / 2`` threads on x86 (it assumes SMT): a
    single thread on a 2-vCPU machine, while torch uses both.
    """
    os.environ["TVM_NUM_THREADS"] = str(num_threads)
    tvm.get_global_func("runtime.config_threadpool")(1, num_threads)


def vector_bits(target: tvm.target.Target) -> int:
    """SIMD register width (bits) of an LLVM target. x86 is read off the CPU features
    (``llvm_get_vector_width`` answers 512 for znver3, which has no AVX-512); other
    targets ask LLVM, 128 when it does not know."""
    codegen = tvm.target.codegen
    if "x86" in str(target.attrs.get("mtriple", "")):
        for feature, bits in (("avx512f", 512), ("avx", 256)):
            if codegen.llvm_cpu_has_features(feature, target):
                return bits
        return 128
    bits = int(codegen.llvm_get_vector_width(target))
    return bits if bits > 0 else 128

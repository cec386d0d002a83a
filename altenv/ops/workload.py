"""Workload spec strings: an operator kind and its shape, e.g. ``c2d:N=1,I=64,H=56,...``.

A spec names one of ALT's nine complex operators and its parameters. ``parse_workload``
validates it (a bad spec gets a message listing the operator's keys) and ``str()`` gives
the canonical form, used as the workload key in records.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..datapath import SCHEME, resolve_uri

DTYPES = ("float32", "float16", "int8")

# kind -> (required keys, optional keys with defaults)
_SPATIAL = {1: ("W",), 2: ("H", "W"), 3: ("D", "H", "W")}
_KERNEL = {1: ("KW",), 2: ("KH", "KW"), 3: ("KD", "KH", "KW")}
_CONV_OPT = {"N": 1, "stride": 1, "pad": 0, "dilation": 1}

KEYS: dict[str, tuple[tuple[str, ...], dict[str, int]]] = {
    "c1d": (("I", "O") + _SPATIAL[1] + _KERNEL[1], dict(_CONV_OPT)),
    "c2d": (("I", "O") + _SPATIAL[2] + _KERNEL[2], dict(_CONV_OPT)),
    "c3d": (("I", "O") + _SPATIAL[3] + _KERNEL[3], dict(_CONV_OPT)),
    "grp": (("I", "O", "groups") + _SPATIAL[2] + _KERNEL[2], dict(_CONV_OPT)),
    "dep": (("C",) + _SPATIAL[2] + _KERNEL[2], dict(_CONV_OPT)),
    "dil": (("I", "O") + _SPATIAL[2] + _KERNEL[2], {**_CONV_OPT, "dilation": 2}),
    "gmm": (("M", "N", "K"), {"batch": 1}),
    "t2d": (("I", "O") + _SPATIAL[2] + _KERNEL[2], {"N": 1, "stride": 1, "pad": 0, "opad": 0}),
    "t3d": (("I", "O") + _SPATIAL[3] + _KERNEL[3], {"N": 1, "stride": 1, "pad": 0, "opad": 0}),
}

KINDS = tuple(KEYS)


@dataclass(frozen=True)
class Workload:
    """One complex operator with a concrete shape."""

    kind: str
    params: dict[str, int | tuple[int, ...]] = field(hash=False)
    dtype: str = "float32"

    def __getitem__(self, key: str) -> int | tuple[int, ...]:
        return self.params[key]

    def get(self, key: str, default: int | None = None) -> int | tuple[int, ...] | None:
        return self.params.get(key, default)

    def __str__(self) -> str:
        required, optional = KEYS[self.kind]
        batch = ["N"] if self.kind != "gmm" else []
        keys = batch + list(required) + [k for k in optional if k not in required + tuple(batch)]
        if self.kind == "gmm" and self.params.get("batch", 1) == 1:
            keys.remove("batch")  # a plain matmul keeps the key it had before batches
        if "opad" in keys and self.params.get("opad", 0) == 0:
            keys.remove("opad")  # as does a transposed convolution without output padding
        body = ",".join(f"{k}={_fmt(self.params[k])}" for k in keys)
        if self.dtype != "float32":
            body += f",dtype={self.dtype}"
        return f"{self.kind}:{body}"

    def __hash__(self) -> int:
        return hash(str(self))

    @property
    def key(self) -> str:
        return str(self)


PER_DIM = ("stride", "pad", "dilation", "opad")


def _fmt(value: int | tuple[int, ...]) -> str:
    return "x".join(map(str, value)) if isinstance(value, tuple) else str(value)


def parse_workload(spec: str | Workload) -> Workload:
    """Parse ``kind:key=value,...`` (or a dataset's ``altenv://<dataset>/<workload>``) into a
    :class:`Workload`, with clear errors."""
    if isinstance(spec, Workload):
        return spec
    if str(spec).strip().startswith(SCHEME):
        spec = resolve_uri(str(spec).strip())
    kind, sep, body = str(spec).strip().partition(":")
    if kind not in KEYS:
        raise ValueError(f"workload {spec!r}: unknown operator {kind!r}; "
                         f"allowed: {', '.join(KINDS)}")
    required, optional = KEYS[kind]
    allowed = set(required) | set(optional) | {"dtype"}
    hint = f"keys for {kind}: {', '.join(required)} (required), " + ", ".join(
        f"{k}={v}" for k, v in optional.items()) + ", dtype=float32 (stride, pad, " \
        "dilation and opad also per dim, e.g. stride=1x2x2)"
    if not sep or not body.strip():
        raise ValueError(f"workload {spec!r}: no parameters; {hint}")
    params: dict[str, int] = dict(optional)
    dtype = "float32"
    given: set[str] = set()
    for item in body.split(","):
        key, eq, value = item.strip().partition("=")
        if not eq or key not in allowed:
            raise ValueError(f"workload {spec!r}: bad item {item.strip()!r}; {hint}")
        if key in given:
            raise ValueError(f"workload {spec!r}: {key} is given twice; keep one")
        given.add(key)
        if key == "dtype":
            if value not in DTYPES:
                raise ValueError(f"workload {spec!r}: dtype {value!r} not in {', '.join(DTYPES)}")
            dtype = value
            continue
        try:
            parts = tuple(int(v) for v in value.split("x"))
            if len(parts) > 1 and key not in PER_DIM:
                raise ValueError(value)
            params[key] = parts if len(parts) > 1 and len(set(parts)) > 1 else parts[0]
        except ValueError:
            raise ValueError(f"workload {spec!r}: {key}={value!r} is not an integer; "
                             f"{hint}") from None
    missing = [k for k in required if k not in params]
    if missing:
        raise ValueError(f"workload {spec!r}: missing {', '.join(missing)}; {hint}")
    bad = [k for k, v in params.items()
           if min(v if isinstance(v, tuple) else (v,)) < (0 if k in ("pad", "opad") else 1)]
    if bad:
        raise ValueError(f"workload {spec!r}: {', '.join(bad)} must be positive; {hint}")
    wl = Workload(kind, params, dtype)
    # shape checks live with the operator definitions, which import this module
    from .operators import operator_for

    operator_for(wl)
    return wl

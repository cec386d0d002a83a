"""Structural recognition of complex operators inside fused TIR PrimFuncs.

A fused task's blocks are read as a small dataflow: a reduction block whose update is
``C[...] += A[...] * B[...]`` is a convolution when one operand is indexed by sliding windows
``stride*s + dilation*r`` (``s`` spatial, ``r`` reduction) and a (batch) matmul when both are
indexed by plain loop variables. Pad, zero-dilation and kernel-flip blocks feeding the operands
are traced back to the function parameters, which recovers the unpadded input sizes, the
padding and, for transposed convolutions, the stride. Nothing depends on block or buffer names.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import tvm.ir.expr as ire
import tvm.ir.prim.expr as pe
from tvm import s_tir, tirx
from tvm.sym import detect_linear_equation

SPATIAL, REDUCE = 0, 2


@dataclass(frozen=True)
class ComplexOp:
    """A complex operator recognised in a task.

    Parameters
    ----------
    kind: ``c1d c2d c3d grp dep dil t1d t2d t3d`` (convolutions) or ``gmm`` (matmul/dense,
        batched when ``params["batch"] > 1``).
    params: shape parameters. Convolutions: ``N I O groups`` and per spatial dim (D, H, W order)
        tuples ``size`` (unpadded input), ``out``, ``kernel``, ``stride``, ``pad`` (before),
        ``pad_after``, ``dilation``; transposed ones also ``output_padding``.
        Matmul: ``M N K batch`` and ``trans_b`` (``B`` stored as ``[N, K]``).
    block: name of the reduction block in the PrimFunc.
    data_arg: index of the PrimFunc parameter holding the data (matmul: ``A``) operand.
    weight_arg: index of the PrimFunc parameter holding the weight (matmul: ``B``) operand,
        ``None`` when it is computed inside the function.
    """

    kind: str
    params: dict[str, object]
    block: str
    data_arg: int | None
    weight_arg: int | None

    def spec(self) -> str:
        """Workload spec string, e.g. ``c2d:N=1,I=64,H=56,W=56,O=64,KH=3,KW=3,stride=1,pad=1``.

        Per-dimension values that differ across dims are written ``1x2x2`` (D, H, W order).
        """
        p = self.params
        if self.kind == "gmm":
            text = f"gmm:M={p['M']},N={p['N']},K={p['K']}"
            return text + (f",batch={p['batch']}" if p["batch"] != 1 else "")
        dims = ("W",) if len(p["size"]) == 1 else ("H", "W") if len(p["size"]) == 2 else \
            ("D", "H", "W")
        items = [("N", p["N"])]
        items.append(("C" if self.kind == "dep" else "I", p["I"]))
        items += list(zip(dims, p["size"]))
        if self.kind != "dep" or p["O"] != p["I"]:
            items.append(("O", p["O"]))
        items += list(zip(("K" + d for d in dims), p["kernel"]))
        items += [("stride", _dimval(p["stride"])), ("pad", _dimval(p["pad"]))]
        if self.kind == "dil" or any(d != 1 for d in p["dilation"]):
            items.append(("dilation", _dimval(p["dilation"])))
        if self.kind == "grp" or (self.kind != "dep" and p["groups"] != 1):
            items.append(("groups", p["groups"]))
        if any(p.get("output_padding", ())):
            items.append(("opad", _dimval(p["output_padding"])))
        return f"{self.kind}:" + ",".join(f"{k}={v}" for k, v in items)


def _dimval(values: tuple[int, ...]) -> str:
    return str(values[0]) if len(set(values)) == 1 else "x".join(str(v) for v in values)


@dataclass
class FuncAnalysis:
    """What a task's PrimFunc computes, read from its blocks.

    Parameters
    ----------
    op: the complex operator, if any.
    kind: ``op.kind`` or, for other tasks, ``reduce`` / ``elemwise`` / ``injective``.
    prologue: ops feeding the complex block inside the task (``pad``, ``dilate``, ``transform``).
    epilogue: elementwise ops after the complex block (``bias_add``, ``add``, ``relu``,
        ``clip``, ``mul``, ``sub``, ``div``, ``erf``, ``tanh``, ...).
    pad: for a pure padding task, ``(pad_before, pad_after)`` per dim; else ``None``.
    """

    op: ComplexOp | None
    kind: str
    prologue: list[str] = field(default_factory=list)
    epilogue: list[str] = field(default_factory=list)
    pad: tuple[tuple[int, ...], tuple[int, ...]] | None = None


def get_blocks(func: tirx.PrimFunc) -> list[s_tir.SBlock]:
    """The top-level blocks of a PrimFunc, in program order."""
    sch = s_tir.Schedule(func)
    return [sch.get(b) for b in sch.get_child_blocks(sch.get_sblock("root"))]


def analyze_func(func: tirx.PrimFunc) -> FuncAnalysis:
    """Recognise the complex operator and the elementwise ops of a fused PrimFunc."""
    blocks = get_blocks(func)
    params = list(func.params)
    for pos, blk in enumerate(blocks):
        if not any(iv.iter_type == REDUCE for iv in blk.iter_vars):
            continue
        op = _match_block(blk, blocks, params)
        if op is not None:
            pro = [_prologue_name(b) for b in blocks[:pos]]
            epi = [_epilogue_name(b, params) for b in blocks[pos + 1:]]
            return FuncAnalysis(op, op.kind, pro, epi)
    if any(iv.iter_type == REDUCE for b in blocks for iv in b.iter_vars):
        return FuncAnalysis(None, "reduce")
    if len(blocks) == 1 and (pad := _pad_of(blocks[0])) is not None:
        return FuncAnalysis(None, "injective", pad=pad)
    kind = "elemwise" if all(_is_elementwise(b) for b in blocks) else "injective"
    return FuncAnalysis(None, kind, epilogue=[_epilogue_name(b, params) for b in blocks])


# ----------------------------------------------------------------------------- expressions

def _int(x: object) -> int:
    return int(x)  # IntImm -> int


def _vars_of(expr: pe.Expr) -> list[tirx.Var]:
    return list(tirx.analysis.undefined_vars(expr, []))


def _strip_cast(expr: pe.Expr) -> pe.Expr:
    while isinstance(expr, pe.Cast):
        expr = expr.value
    return expr


def _linear(expr: pe.Expr, ivars: list[tirx.Var]) -> tuple[dict[int, int], int] | None:
    """``expr`` as ``{iter var position: coefficient}, constant`` if affine in ``ivars``."""
    coeffs = detect_linear_equation(expr, ivars)
    if len(coeffs) == 0 or not all(isinstance(c, pe.IntImm) for c in coeffs):
        return None
    terms = {i: _int(c) for i, c in enumerate(coeffs[:-1]) if _int(c) != 0}
    return terms, _int(coeffs[-1])


def _is_param(buf: object, params: list[tirx.Var]) -> int | None:
    for i, p in enumerate(params):
        if p.same_as(buf):
            return i
    return None


def _writer(buf: object, blocks: list[s_tir.SBlock]) -> s_tir.SBlock | None:
    for blk in blocks:
        if blk.writes and blk.writes[0].source.same_as(buf):
            return blk
    return None


def _store(blk: s_tir.SBlock) -> tirx.BufferStore | None:
    body = blk.body
    return body if isinstance(body, tirx.BufferStore) else None


# ----------------------------------------------------------------------------- matching

def _match_block(blk: s_tir.SBlock, blocks: list[s_tir.SBlock],
                 params: list[tirx.Var]) -> ComplexOp | None:
    store = _store(blk)
    if store is None:
        return None
    value = store.value
    if not isinstance(value, pe.Add):
        return None
    acc, prod = value.a, _strip_cast(value.b)
    if not (isinstance(acc, ire.TensorLoad) and acc.source.same_as(store.buffer)):
        acc, prod = _strip_cast(value.b), _strip_cast(value.a)
        if not (isinstance(acc, ire.TensorLoad) and acc.source.same_as(store.buffer)):
            return None
    if not isinstance(prod, pe.Mul):
        return None
    a, b = _strip_cast(prod.a), _strip_cast(prod.b)
    if not (isinstance(a, ire.TensorLoad) and isinstance(b, ire.TensorLoad)):
        return None
    ivars = [iv.var for iv in blk.iter_vars]
    ext = [_int(iv.dom.extent) for iv in blk.iter_vars]
    reduce = {i for i, iv in enumerate(blk.iter_vars) if iv.iter_type == REDUCE}
    out_lin = [_linear(e, ivars) for e in store.indices]
    if any(lin is None or len(lin[0]) != 1 for lin in out_lin):
        return None
    out_vars = [next(iter(lin[0])) for lin in out_lin]  # type: ignore[index]
    for data, weight in ((a, b), (b, a)):
        conv = _match_conv(blk.name_hint, data, weight, ivars, ext, reduce, out_vars, blocks,
                           params)
        if conv is not None:
            return conv
    return _match_matmul(blk.name_hint, a, b, ivars, ext, reduce, out_vars, blocks, params)


def _dim_vars(indices: list[pe.Expr], ivars: list[tirx.Var]) -> list[set[int]]:
    out = []
    for e in indices:
        used = set()
        for v in _vars_of(e):
            for i, iv in enumerate(ivars):
                if iv.same_as(v):
                    used.add(i)
        out.append(used)
    return out


@dataclass
class _Trace:
    """A load traced back through pad / dilate / transform blocks to its source buffer."""

    buffer: object
    shape: tuple[int, ...]
    pad_before: list[int]
    pad_after: list[int]
    dilate: list[int]
    perm: list[int]
    flip: list[bool]
    steps: list[str]


def _trace(buf: object, blocks: list[s_tir.SBlock]) -> _Trace:
    """Follow ``buf`` back through single-input pad, zero-dilate and permute/flip blocks."""
    shape = tuple(_int(d) for d in buf.shape)
    nd = len(shape)
    tr = _Trace(buf, shape, [0] * nd, [0] * nd, [1] * nd, list(range(nd)), [False] * nd, [])
    while (blk := _writer(tr.buffer, blocks)) is not None:
        store = _store(blk)
        if store is None:
            break
        value = store.value
        guarded = isinstance(value, ire.Call) and value.op.name.endswith("if_then_else")
        load = value.args[1] if guarded else value
        if not isinstance(load, ire.TensorLoad) or len(blk.reads) != 1:
            break
        ivars = [iv.var for iv in blk.iter_vars]
        if len(store.indices) != len(ivars) or not all(
                e.same_as(v) for e, v in zip(store.indices, ivars)):
            break
        src_shape = tuple(_int(d) for d in load.source.shape)
        step = _step(load, ivars, guarded, src_shape, tr)
        if step is None:
            break
        tr.steps.append(step)
        tr.buffer, tr.shape = load.source, src_shape
    return tr


def _step(load: ire.TensorLoad, ivars: list[tirx.Var], guarded: bool,
          src_shape: tuple[int, ...], tr: _Trace) -> str | None:
    """Compose one pad / dilate / permute step into ``tr``; ``None`` if it is something else."""
    dst_shape = tr.shape
    if len(src_shape) != len(dst_shape):
        return None
    pad_b, dil, perm, flip = [0] * len(src_shape), [1] * len(src_shape), [], []
    for d, e in enumerate(load.indices):
        if isinstance(e, pe.FloorDiv) and isinstance(e.b, pe.IntImm) and guarded:
            inner = _linear(e.a, ivars)
            if inner is None or inner[0] != {d: 1}:
                return None
            dil[d] = _int(e.b)
            perm.append(d)
            flip.append(False)
            continue
        lin = _linear(e, ivars)
        if lin is None or len(lin[0]) != 1:
            return None
        (var, coef), = lin[0].items()
        if coef == 1:
            pad_b[d] = -lin[1]
        elif coef != -1:
            return None
        perm.append(var)
        flip.append(coef == -1)
    if any(p != 0 for p in pad_b) and not guarded:
        return None
    reshaping = any(p != 0 for p in pad_b) or any(x != 1 for x in dil)
    if reshaping and (perm != list(range(len(perm))) or any(flip)):
        return None
    if any(x != 1 for x in dil):
        for d in range(len(dil)):
            tr.dilate[d] *= dil[d]
        return "dilate"
    if any(p != 0 for p in pad_b):
        for d in range(len(pad_b)):
            tr.pad_before[d] += pad_b[d]
            tr.pad_after[d] += dst_shape[d] - src_shape[d] - pad_b[d]
        return "pad"
    # permutation / flip: source dim d holds destination dim perm[d]
    tr.perm = [tr.perm[p] for p in perm]
    tr.flip = [f != tr.flip[p] for p, f in zip(perm, flip)]
    return "transform"


def _match_conv(name: str, data: ire.TensorLoad, weight: ire.TensorLoad,
                ivars: list[tirx.Var], ext: list[int], reduce: set[int], out_vars: list[int],
                blocks: list[s_tir.SBlock], params: list[tirx.Var]) -> ComplexOp | None:
    wdims = _dim_vars(list(weight.indices), ivars)
    if any(len(u) != 1 for u in wdims):
        return None
    wvars = [next(iter(u)) for u in wdims]
    windows: list[tuple[int, int, int, int, int]] = []  # (data dim, s var, stride, r var, dil)
    for d, e in enumerate(data.indices):
        lin = _linear(e, ivars)
        if lin is None or len(lin[0]) != 2:
            continue
        (v1, c1), (v2, c2) = lin[0].items()
        if (v1 in reduce) == (v2 in reduce):
            continue
        s, cs, r, cr = (v2, c2, v1, c1) if v1 in reduce else (v1, c1, v2, c2)
        if s not in wvars:  # a grouped channel index (o + rc) is not a window
            windows.append((d, s, cs, r, cr))
    if not windows:
        return None
    kernel_vars = {w[3] for w in windows}
    if not kernel_vars <= set(wvars):
        return None
    o_var = [v for v in wvars if v not in reduce]
    c_var = [v for v in wvars if v in reduce and v not in kernel_vars]
    if len(o_var) != 1 or len(c_var) != 1 or set(reduce) != kernel_vars | set(c_var):
        return None
    ddims = _dim_vars(list(data.indices), ivars)
    chan_dim = [d for d, u in enumerate(ddims) if c_var[0] in u]
    spatial_windows = {w[1] for w in windows}
    n_var = [v for v in out_vars if v not in spatial_windows and v != o_var[0]]
    if len(chan_dim) != 1 or len(n_var) != 1:
        return None
    dtr = _trace(data.source, blocks)
    wtr = _trace(weight.source, blocks)
    transposed = any(wtr.flip) or any(dtr.dilate[w[0]] != 1 for w in windows)
    cin = dtr.shape[chan_dim[0]]
    nd = len(windows)
    kernel = tuple(ext[w[3]] for w in windows)
    dilation = tuple(w[4] for w in windows)
    p: dict[str, object] = {
        "N": ext[n_var[0]], "I": cin, "O": ext[o_var[0]], "groups": cin // ext[c_var[0]],
        "size": tuple(dtr.shape[w[0]] for w in windows),
        "out": tuple(ext[w[1]] for w in windows), "kernel": kernel, "dilation": dilation,
    }
    if transposed:
        stride = tuple(dtr.dilate[w[0]] for w in windows)
        pad = tuple(dl * (k - 1) - dtr.pad_before[w[0]]
                    for w, k, dl in zip(windows, kernel, dilation))
        p.update(stride=stride, pad=pad, pad_after=pad, output_padding=tuple(
            o - ((h - 1) * s - 2 * pd + dl * (k - 1) + 1)
            for o, h, s, pd, dl, k in zip(p["out"], p["size"], stride, pad, dilation, kernel)))
        kind = ("t1d", "t2d", "t3d")[nd - 1]
    else:
        p.update(stride=tuple(w[2] for w in windows),
                 pad=tuple(dtr.pad_before[w[0]] for w in windows),
                 pad_after=tuple(dtr.pad_after[w[0]] for w in windows))
        kind = _conv_kind(nd, p["groups"], cin, dilation)  # type: ignore[arg-type]
    return ComplexOp(kind, p, name, _is_param(dtr.buffer, params),
                     _is_param(wtr.buffer, params))


def _conv_kind(nd: int, groups: int, cin: int, dilation: tuple[int, ...]) -> str:
    if nd != 2:
        return "c1d" if nd == 1 else "c3d"
    if groups == cin and cin > 1:
        return "dep"
    if groups > 1:
        return "grp"
    return "dil" if any(d != 1 for d in dilation) else "c2d"


def _match_matmul(name: str, a: ire.TensorLoad, b: ire.TensorLoad, ivars: list[tirx.Var],
                  ext: list[int], reduce: set[int], out_vars: list[int],
                  blocks: list[s_tir.SBlock], params: list[tirx.Var]) -> ComplexOp | None:
    dims = []
    for load in (a, b):
        used = []
        for e in load.indices:
            if isinstance(e, pe.IntImm):
                continue
            lin = _linear(e, ivars)
            if lin is None or len(lin[0]) != 1 or next(iter(lin[0].values())) != 1:
                return None
            used.append(next(iter(lin[0])))
        dims.append(used)
    va, vb, vo = set(dims[0]), set(dims[1]), set(out_vars)
    k_vars = va & vb & reduce
    if not k_vars or k_vars != reduce or not (va | vb) >= vo:
        return None
    prod = _prod
    batch = va & vb & vo
    m_vars, n_vars = (va & vo) - vb, (vb & vo) - va
    kpos = dims[1].index(min(k_vars))
    npos = [dims[1].index(v) for v in n_vars]
    p = {"M": prod(ext, m_vars), "N": prod(ext, n_vars), "K": prod(ext, k_vars),
         "batch": prod(ext, batch), "trans_b": bool(npos) and max(npos) < kpos}
    return ComplexOp("gmm", p, name, _is_param(_trace(a.source, blocks).buffer, params),
                     _is_param(_trace(b.source, blocks).buffer, params))


def _prod(ext: list[int], vars_: set[int]) -> int:
    out = 1
    for v in vars_:
        out *= ext[v]
    return out


# ----------------------------------------------------------------------------- simple blocks

def _is_elementwise(blk: s_tir.SBlock) -> bool:
    store = _store(blk)
    if store is None or any(iv.iter_type != SPATIAL for iv in blk.iter_vars):
        return False
    out_shape = [_int(d) for d in store.buffer.shape]
    for region in blk.reads:
        shape = [_int(d) for d in region.source.shape]
        if shape != out_shape and len(shape) == len(out_shape):
            if any(s not in (1, o) for s, o in zip(shape, out_shape)):
                return False
    return True


def _pad_of(blk: s_tir.SBlock) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    store = _store(blk)
    if store is None or len(blk.reads) != 1:
        return None
    tr = _trace(store.buffer, [blk])
    if tr.steps != ["pad"]:
        return None
    return tuple(tr.pad_before), tuple(tr.pad_after)


def _prologue_name(blk: s_tir.SBlock) -> str:
    store = _store(blk)
    if store is None:
        return "opaque"
    tr = _trace(store.buffer, [blk])
    return tr.steps[0] if tr.steps else "transform"


_BINARY = {pe.Add: "add", pe.Sub: "sub", pe.Mul: "mul", pe.Div: "div"}


def _epilogue_name(blk: s_tir.SBlock, params: list[tirx.Var]) -> str:
    store = _store(blk)
    if store is None:
        return "opaque"
    v = _strip_cast(store.value)
    if isinstance(v, (pe.Max, pe.Min)):
        inner = _strip_cast(v.a)
        const = isinstance(v.b, (pe.FloatImm, pe.IntImm))
        if const and isinstance(inner, (pe.Max, pe.Min)) and \
                isinstance(inner.b, (pe.FloatImm, pe.IntImm)):
            return "clip"
        if const and isinstance(v, pe.Max) and float(v.b.value) == 0.0:
            return "relu"
        return "max" if isinstance(v, pe.Max) else "min"
    for cls, name in _BINARY.items():
        if isinstance(v, cls):
            loads = [x for x in (_strip_cast(v.a), _strip_cast(v.b))
                     if isinstance(x, ire.TensorLoad)]
            out_shape = [_int(d) for d in store.buffer.shape]
            if name == "add" and len(loads) == 2:
                small = [ld for ld in loads if [_int(d) for d in ld.source.shape] != out_shape
                         or any(isinstance(e, pe.IntImm) for e in ld.indices)]
                return "bias_add" if small else "add"
            return name
    if isinstance(v, ire.Call):
        return str(v.op.name).rsplit(".", 1)[-1]
    if isinstance(v, ire.TensorLoad):
        return "copy"
    return "elemwise"

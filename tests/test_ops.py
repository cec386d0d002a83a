"""The nine operators under default, template and random layouts, compiled by TVM and
checked against torch on random inputs."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from tvm import s_tir

from altenv.layout import Layout, random_layout
from altenv.ops import KINDS, LayoutTemplate, generate, parse_workload, run_numpy

SPECS = {
    "c1d": ["c1d:N=1,I=4,O=8,W=16,KW=3,stride=1,pad=1", "c1d:N=2,I=3,O=4,W=15,KW=5,stride=2"],
    "c2d": ["c2d:N=1,I=8,O=16,H=10,W=10,KH=3,KW=3,stride=1,pad=1",
            "c2d:N=1,I=3,O=8,H=23,W=23,KH=7,KW=7,stride=2"],
    "c3d": ["c3d:N=1,I=4,O=8,D=6,H=6,W=6,KD=3,KH=3,KW=3,stride=1,pad=1",
            "c3d:N=1,I=3,O=4,D=4,H=10,W=10,KD=3,KH=5,KW=5,stride=1x2x2,pad=1x2x2"],
    "grp": ["grp:N=1,I=8,O=8,groups=2,H=8,W=8,KH=3,KW=3,pad=1"],
    "dep": ["dep:N=1,C=8,H=10,W=10,KH=3,KW=3,stride=2,pad=1",
            "dep:N=1,C=6,H=9,W=9,KH=3,KW=3,stride=1,pad=1"],
    "dil": ["dil:N=1,I=4,O=8,H=12,W=12,KH=3,KW=3,pad=2"],
    "gmm": ["gmm:M=16,N=24,K=8", "gmm:M=12,N=20,K=18", "gmm:M=8,N=12,K=16,batch=3"],
    "t2d": ["t2d:N=1,I=4,O=6,H=5,W=5,KH=3,KW=3,stride=2,pad=1",
            "t2d:N=1,I=4,O=6,H=5,W=5,KH=4,KW=4,stride=2,pad=1",
            "t2d:N=1,I=4,O=6,H=5,W=4,KH=3,KW=3,stride=2x3,pad=1,opad=1x2"],
    "t3d": ["t3d:N=1,I=4,O=4,D=3,H=4,W=4,KD=3,KH=3,KW=3,stride=2",
            "t3d:N=1,I=4,O=4,D=3,H=4,W=4,KD=3,KH=3,KW=3,stride=2,pad=1,opad=1"],
}
ALL = [s for kind in KINDS for s in SPECS[kind]]


def check(program, seed=0):
    raw = program.random_inputs(seed)
    out = run_numpy(program, raw)
    ref = program.reference(raw)
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)


def test_every_kind_is_covered():
    assert set(SPECS) == set(KINDS)


@pytest.mark.parametrize("spec", ALL)
def test_default_layout(spec):
    check(generate(spec, epilogue=("bias", "relu")))


@pytest.mark.parametrize("levels", [1, 2])
@pytest.mark.parametrize("spec", ALL)
def test_template_layouts(spec, levels):
    template = LayoutTemplate(spec, levels=levels)
    rng = np.random.default_rng(hash(spec) % 1000 + levels)
    factors = template.factors_from_actions(rng.uniform(0, 1, len(template.knobs)))
    layouts = template.layouts(factors)
    check(generate(spec, layouts, epilogue=("bias", "residual", "relu")), seed=levels)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("spec", ALL)
def test_random_legal_layouts(spec, seed):
    program = generate(spec)
    rng = np.random.default_rng(seed)
    layouts = {name: random_layout(layout.logical_shape, rng, steps=4)
               for name, layout in program.layouts.items()}
    check(generate(spec, layouts, epilogue=("bias",)), seed=seed)


def test_c2d_template_matches_alt():
    """ALT §5.1: six tunables; N H/ht W/wt O/ot ht wt ot and the overlapped input tiles."""
    spec = "c2d:N=1,I=16,O=32,H=8,W=8,KH=3,KW=3,pad=1"
    template = LayoutTemplate(spec)
    assert template.knob_names == ["ht", "wt", "ot", "it", "it_w", "ot_w"]
    layouts = template.layouts({"ht": 4, "wt": 2, "ot": 8, "it": 4, "it_w": 2, "ot_w": 16})
    assert layouts["out"].shape == (1, 2, 4, 4, 4, 2, 8)
    # input: N H/ht W/wt I/it (ht+KH-1) (wt+KW-1) it
    assert layouts["data"].shape == (1, 2, 4, 4, 6, 4, 4)
    # weight: O/ot' I/it' KH KW it' ot'
    assert layouts["weight"].shape == (2, 8, 3, 3, 2, 16)
    assert LayoutTemplate("gmm:M=8,N=8,K=8").knob_names == ["mt", "nt", "kt"]


def test_blocked_layouts_are_tvm_nchwc_and_packed_gmm():
    """Channel tiles the largest divisor up to the lanes, spatial dims whole; GMM packs its
    right-hand side in lane-wide columns (``N/nt K nt``)."""
    conv = LayoutTemplate("c2d:N=1,I=3,O=64,H=8,W=8,KH=3,KW=3,pad=1", levels=2)
    assert conv.blocked_factors(16) == {"ht": 8, "ht1": 1, "wt": 8, "wt1": 1, "ot": 16,
                                        "ot1": 1, "it": 3, "it_w": 3, "it_w1": 1,
                                        "ot_w": 16, "ot_w1": 1}
    conv = LayoutTemplate("c2d:N=1,I=3,O=64,H=8,W=8,KH=3,KW=3,pad=1")
    layouts = conv.layouts(conv.blocked_factors(16))
    assert layouts["out"].shape == (1, 1, 1, 4, 8, 8, 16)  # NCHW16c
    assert layouts["data"].shape == (1, 1, 10, 10, 3)  # NCHW3c, padded
    assert layouts["weight"].shape == (4, 1, 3, 3, 3, 16)  # OIHW3i16o
    dep = LayoutTemplate("dep:C=24,H=8,W=8,KH=3,KW=3,pad=1")
    assert dep.blocked_factors(16) == {"ht": 8, "wt": 8, "ot": 12, "it": 12, "it_w": 1,
                                       "ot_w": 12}
    gmm = LayoutTemplate("gmm:M=8,N=48,K=32")
    assert gmm.blocked_factors(16) == {"mt": 1, "nt": 16, "kt": 32}
    assert gmm.layouts(gmm.blocked_factors(16))["weight"].shape == (1, 3, 32, 16)
    check(generate("gmm:M=8,N=48,K=32", gmm.layouts(gmm.blocked_factors(16)), ("bias",)))


@pytest.mark.parametrize("spec, factors", [
    ("gmm:M=20,N=30,K=12,batch=2", {"mt": 8, "nt": 16, "kt": 4}),
    ("c2d:I=3,O=30,H=6,W=6,KH=3,KW=3,pad=1", {"ht": 6, "wt": 3, "ot": 8, "it": 3,
                                             "it_w": 1, "ot_w": 16}),
    ("dep:C=20,H=6,W=6,KH=3,KW=3,pad=1", {"ht": 6, "wt": 6, "ot": 8, "it": 8, "it_w": 1,
                                          "ot_w": 8}),
    ("t2d:I=20,O=30,H=5,W=5,KH=3,KW=3,stride=2,pad=1", {"ht": 1, "wt": 9, "ot": 16,
                                                         "it": 8, "it_w": 8, "ot_w": 8}),
])
def test_padded_tiles_block_awkward_dims(spec, factors):
    """ALT's pad: a channel or GEMM dim takes a vector-wide tile that does not divide it;
    every tensor holding it is zero-padded to the same multiple, the result is cropped, and
    the padded output points read in-bounds zeros rather than being guarded (a guard on a
    vector lane keeps TVM from vectorizing)."""
    template = LayoutTemplate(spec)
    program = template.generate(factors, ("bias", "relu"))
    main = program.func.script().split("T.init()")[1].split("T.sblock")[0]
    assert "if_then_else" not in main
    check(program, seed=1)


def test_padded_tiles_are_choices_within_the_waste_bound():
    gmm = LayoutTemplate("gmm:M=200,N=300,K=120")
    mt, nt, kt = gmm.knobs
    assert [c for c in gmm.choices(nt) if 300 % c] == [8, 16, 32, 64]  # 304, 320
    assert [c for c in gmm.choices(kt) if 120 % c] == [16, 32, 64]  # 128
    assert [c for c in gmm.choices(mt) if 200 % c] == [16, 32]  # 208, 224; 64 pads 28 %
    assert gmm.blocked_factors(16) == {"mt": 1, "nt": 16, "kt": 120}  # was nt=15
    assert gmm.layouts(gmm.blocked_factors(16))["weight"].shape == (1, 19, 120, 16)
    with pytest.raises(ValueError, match="nt=.7. must divide N=300"):
        gmm.layouts({"mt": 1, "nt": 7, "kt": 1})
    grp = LayoutTemplate("grp:I=20,O=30,groups=2,H=6,W=6,KH=3,KW=3,pad=1")
    ot = next(k for k in grp.knobs if k.name == "ot")
    assert grp.choices(ot) == [1, 2, 3, 5, 6, 10, 15, 30]  # a group's channels never pad
    spatial = LayoutTemplate("c2d:I=8,O=8,H=30,W=30,KH=1,KW=1")
    assert all(30 % c == 0 for c in spatial.choices(spatial.knobs[0]))


def test_bias_follows_the_output_channel_tiles():
    """The bias vector is stored split like the output's channels (``O/ot ot``, a reshape
    of the vector), read at plain loop indices, and computes what the logical one does."""
    from altenv.ops.codegen import bias_layout

    spec = "c2d:N=1,I=8,O=32,H=6,W=6,KH=3,KW=3,pad=1"
    template = LayoutTemplate(spec, levels=2)
    factors = {**template.default_factors(), "ot": 4, "ot1": 2, "ht": 3}
    program = generate(spec, template.layouts(factors), ("bias", "relu"))
    assert program.layouts["bias"].shape == (4, 2, 4)
    vector = np.arange(32.0)
    assert np.array_equal(program.layouts["bias"].apply(vector).ravel(), vector)
    assert "bias[v_i3, v_i6, v_i9]" in program.func.script()  # O0 O1 O2: no // or %
    check(program, seed=3)
    fused = Layout((1, 32, 6, 6)).fuse([2, 3])  # not split/reorder only: the vector as is
    assert bias_layout(fused, 1).shape == (32,)


def test_template_factors_must_divide():
    template = LayoutTemplate("gmm:M=12,N=8,K=8")
    message = r"mt=\[5\] must divide M=12 \(choices: \[1, 2, 3, 4, 6, 12\]\)"
    with pytest.raises(ValueError, match=message):
        template.layouts({"mt": 5, "nt": 1, "kt": 1})


def test_split_actor_rounds_to_divisors():
    """ALT Eq. 2: F = R(D * a); O=32, a=0.5 gives 16."""
    template = LayoutTemplate("gmm:M=32,N=30,K=6")
    assert template.factors_from_actions([0.5, 0.5, 0.5]) == {"mt": 16, "nt": 15, "kt": 3}


def test_bias_stored_in_weight():
    """store_at: the bias rides in the weight tensor, read by the epilogue from there."""
    weight = Layout((8, 24), "KN").store_at(Layout((24,), "N"), 0).split(1, [-1, 8])
    program = generate("gmm:M=16,N=24,K=8", {"weight": weight.reorder([1, 0, 2])},
                       epilogue=("bias", "relu"))
    assert program.arg_names == ["data", "weight", "out"]
    check(program)


def test_residual_in_its_own_layout():
    spec = "c2d:N=1,I=4,O=8,H=6,W=6,KH=3,KW=3,pad=1"
    out = Layout((1, 8, 6, 6)).split(1, [-1, 4]).reorder([0, 1, 3, 4, 2])
    residual = Layout((1, 8, 6, 6)).reorder([0, 2, 3, 1])
    check(generate(spec, {"out": out, "residual": residual}, epilogue=("residual", "relu")))


def test_int8_accumulates_in_int32():
    program = generate("gmm:M=8,N=16,K=32,dtype=int8")
    assert program.op.out_dtype == "int32"
    check(program)


def test_transposed_conv_does_no_wasted_work():
    from altenv.ops import operator_for

    op = operator_for(parse_workload("t2d:N=1,I=4,O=4,H=8,W=8,KH=4,KW=4,stride=2,pad=1"))
    # the reduction runs over ceil(K / stride) taps per dim, not K
    assert [e for _, e in op.reduce_extents()] == [4, 2, 2]


@pytest.mark.parametrize("spec", ["t2d:N=1,I=4,O=4,H=7,W=7,KH=4,KW=4,stride=2,pad=1",
                                  "t2d:N=1,I=4,O=4,H=7,W=7,KH=5,KW=5,stride=3,pad=1"],
                         ids=["K%s==0", "K%s!=0"])
def test_transposed_conv_survives_fused_outer_loops(spec):
    """Output rows split into ``stride`` parts of 7, the outer loops fused (as MetaSchedule's
    parallel postprocessor does): TVM 0.27 flattened ``(h + pad) % stride`` in the weight's
    index and lost the ``+ pad`` (wrong numbers); with the taps in output-phase order, zero
    past K, the read is ``h % stride`` and the numbers are torch's."""
    program = generate(spec)
    sch = s_tir.Schedule(program.func)
    n, o, h, w, *_ = sch.get_loops(sch.get_sblock("t2d"))
    h0, h1 = sch.split(h, [program.op.stride[0], 7])
    sch.reorder(n, o, w, h0, h1)
    sch.fuse(w, h0)
    raw = program.random_inputs(0)
    np.testing.assert_allclose(run_numpy(program, raw, func=sch.mod), program.reference(raw),
                               rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("spec, message", [
    ("c4d:N=1", "unknown operator 'c4d'; allowed: c1d, c2d"),
    ("c2d:N=1,I=3,O=8,H=8,W=8,KH=3", "missing KW; keys for c2d: I, O, H, W, KH, KW"),
    ("c2d:N=1,I=3,O=8,H=8,W=8,KH=3,KW=3,bogus=2", "bad item 'bogus=2'; keys for c2d"),
    ("gmm:M=8,N=8,K=x", "K='x' is not an integer"),
    ("gmm:M=8,N=8,K=8,dtype=float64", "dtype 'float64' not in"),
    ("grp:I=6,O=8,groups=4,H=8,W=8,KH=3,KW=3", "groups=4 must divide I=6 and O=8"),
    ("c2d:I=3,O=8,H=2,W=2,KH=3,KW=3", "does not fit"),
    ("dep", "no parameters; keys for dep: C, H, W, KH, KW"),
    ("t2d:I=4,O=4,H=5,W=5,KH=3,KW=3,stride=2,opad=2", "opad (output padding) must be smaller"),
    ("c3d:I=3,O=4,D=4,H=8,W=8,KD=3,KH=3,KW=3,stride=1x2", "stride has 2 values for 3 spatial"),
    ("c2d:I=3x3,O=4,H=8,W=8,KH=3,KW=3", "I='3x3' is not an integer"),
])
def test_bad_specs_name_the_keys(spec, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_workload(spec)


def test_spec_round_trip():
    spec = "c2d:N=1,I=64,H=56,W=56,O=64,KH=3,KW=3,stride=1,pad=1"
    wl = parse_workload(spec)
    assert str(wl) == "c2d:N=1,I=64,O=64,H=56,W=56,KH=3,KW=3,stride=1,pad=1,dilation=1"
    assert parse_workload(str(wl)) == wl
    dep = parse_workload("dep:C=32,H=112,W=112,KH=3,KW=3,stride=1,pad=1")
    assert str(dep).startswith("dep:N=1,C=32")
    assert str(parse_workload("gmm:M=8,N=8,K=8,dtype=int8")) == "gmm:M=8,N=8,K=8,dtype=int8"
    # a plain matmul's key has no batch (records written before batches still match)
    assert str(parse_workload("gmm:M=8,N=8,K=8,batch=1")) == "gmm:M=8,N=8,K=8"
    assert str(parse_workload("gmm:batch=2,M=8,N=8,K=8")) == "gmm:M=8,N=8,K=8,batch=2"
    r3d = "c3d:N=1,I=3,O=64,D=16,H=112,W=112,KD=3,KH=7,KW=7,stride=1x2x2,pad=1x3x3,dilation=1"
    assert str(parse_workload(r3d)) == r3d
    assert parse_workload(r3d.replace("pad=1x3x3", "pad=3x3x3"))["pad"] == 3


def test_batched_gmm_template_keeps_the_batch_outermost():
    layouts = LayoutTemplate("gmm:M=8,N=12,K=16,batch=3").layouts({"mt": 4, "nt": 6, "kt": 8})
    assert layouts["out"].shape == (3, 2, 2, 4, 6)
    assert layouts["data"].shape == (3, 2, 2, 4, 8)
    assert layouts["weight"].shape == (3, 2, 2, 8, 6)


def test_bad_layout_names_and_shapes():
    with pytest.raises(ValueError, match="no tensor named \\['bias'\\]"):
        generate("gmm:M=8,N=8,K=8", {"bias": Layout((8,))})
    with pytest.raises(ValueError, match="does not match the tensor's shape"):
        generate("gmm:M=8,N=8,K=8", {"data": Layout((8, 9))})
    with pytest.raises(ValueError, match="epilogue step 'gelu2': unknown op 'gelu2'"):
        generate("gmm:M=8,N=8,K=8", epilogue=("gelu2",))


def test_relu6_epilogue():
    program = generate("dep:N=1,C=8,H=8,W=8,KH=3,KW=3,pad=1", epilogue=("bias", "relu6"))
    raw = program.random_inputs(0)
    raw["data"] = raw["data"] * 8  # values beyond 6 so the clip bites
    check_raw = run_numpy(program, raw)
    np.testing.assert_allclose(check_raw, program.reference(raw), rtol=1e-4, atol=1e-4)
    assert check_raw.max() == pytest.approx(6.0)


ACTIVATIONS = {
    "sigmoid": torch.sigmoid, "silu": F.silu, "hardswish": F.hardswish,
    "hardsigmoid": F.hardsigmoid, "tanh": torch.tanh, "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "clip(-1.5,2.0)": lambda x: torch.clamp(x, -1.5, 2.0),
    "leaky_relu(0.1)": lambda x: F.leaky_relu(x, 0.1),
    "mul(x,tanh(x))": lambda x: x * torch.tanh(x),
    "float16(mul(x,select(lt(0.0,x),1.0,0.0)))": lambda x: (x * (x > 0).float()).half().float(),
    "fast_sigmoid": torch.sigmoid, "fast_silu": F.silu, "fast_tanh": torch.tanh,
    "fast_gelu": F.gelu, "fast_gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "mul(x,fast_exp(mul(x,-0.5)))": lambda x: x * torch.exp(-0.5 * x),
}


@pytest.mark.parametrize("step", ACTIVATIONS)
def test_activation_epilogues_in_a_blocked_layout(step):
    """Each activation generated in a blocked output layout (``N O/4 H W/3 4 3``) computes
    what torch's own function does after the convolution and bias (values well beyond the
    clips' and hardswish's bounds), and its baseline callable does the same."""
    from altenv.baselines.operator import torch_function

    spec = "c2d:N=1,I=4,O=8,H=6,W=6,KH=3,KW=3,pad=1"
    out = Layout((1, 8, 6, 6)).split(1, [-1, 4]).split(4, [-1, 3]).reorder([0, 1, 3, 4, 2, 5])
    program = generate(spec, {"out": out}, epilogue=("bias", step))
    raw = program.random_inputs(1)
    raw["data"] = raw["data"] * 4
    t = {k: torch.from_numpy(v) for k, v in raw.items()}
    plain = torch.conv2d(t["data"], t["weight"], t["bias"], padding=1)
    assert plain.min() < -3 and plain.max() > 6
    want = ACTIVATIONS[step](plain).numpy()
    np.testing.assert_allclose(run_numpy(program, raw), want, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(program.reference(raw), want, rtol=1e-5, atol=1e-6)
    got = torch_function(program)(t["data"], t["weight"], t["bias"]).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name,low,high,tol", [("exp", -87.0, 87.0, 5e-6),
                                               ("erf", -100.0, 100.0, 1e-6),
                                               ("tanh", -100.0, 100.0, 1e-6)])
def test_fast_math_functions_stay_close_over_the_whole_range(name, low, high, tol):
    """TVM's fast polynomials as one inlined expression (``fast_tanh``'s clamp to [-9, 9]
    included: without it the polynomial is off by 2e4 at -100), relative error within
    ``tol`` of the exact function."""
    import math

    import tvm
    from tvm import te

    from altenv.ops.expr import fast_call

    xs = np.linspace(low, high, 2001).astype("float32")
    x = te.placeholder(xs.shape, "float32", "x")
    y = te.compute(xs.shape, lambda i: fast_call(name, x[i]), name="y")
    out = tvm.runtime.tensor(np.zeros_like(xs))
    tvm.compile(te.create_prim_func([x, y]), target="llvm")["main"](tvm.runtime.tensor(xs), out)
    exact = np.vectorize(getattr(math, name))(xs.astype(np.float64))
    assert (np.abs(out.numpy() - exact) / np.maximum(np.abs(exact), 1e-30)).max() < tol


def test_fast_activations_call_no_libm_function():
    """``fast_math`` turns a step's libm functions into TVM's polynomials (a sigmoid through
    ``fast_exp``), named apart so that records of the two never mix; the generated code of a
    fast step calls none of ``exp``, ``sigmoid``, ``erf``, ``tanh``."""
    from altenv.ops.epilogue import fast_step

    assert [fast_step(s, ("erf", "exp")) for s in ("silu", "gelu", "gelu_tanh", "relu")] == [
        "fast_silu", "fast_gelu", "gelu_tanh", "relu"]
    assert fast_step("mul(x,exp(x))", ("exp",)) == "mul(x,fast_exp(x))"
    assert fast_step("silu", ()) == "silu" and fast_step("tanh", ("tanh",)) == "fast_tanh"
    spec = "c2d:N=1,I=4,O=8,H=6,W=6,KH=3,KW=3,pad=1"
    calls = ("T.exp(", "T.sigmoid(", "T.erf(", "T.tanh(")
    for step, fast in (("silu", "fast_silu"), ("gelu", "fast_gelu"), ("tanh", "fast_tanh")):
        plain = generate(spec, epilogue=("bias", step)).func.script()
        assert any(c in plain for c in calls)
        assert not any(c in generate(spec, epilogue=("bias", fast)).func.script() for c in calls)


def test_activation_steps_round_trip_through_records_keys():
    """Config spellings become one canonical step, which survives a records key
    (``spec|bias+step``, split on ``+``) and parses back to the same tree."""
    from altenv.ops.epilogue import canonical_step, parse_step
    from altenv.training.corpus import split_key
    from altenv.tuning import OpTask

    spellings = {"relu6": "clip(0,6)", "silu": "mul(x, sigmoid(x))",
                 "clip(-1.5,2.0)": "clip(-1.5, 2)", "leaky_relu(0.01)": "leaky_relu(1e-2)",
                 "clip(-1e20,3.0)": "max(min(x, 3), -1e+20)"}
    for want, text in spellings.items():
        step = canonical_step(text)
        assert step == want
        task = OpTask("c2d:N=1,I=4,O=8,H=6,W=6,KH=3,KW=3,pad=1", epilogue=("bias", text))
        assert split_key(task.key) == (str(task.workload), ("bias", step))
        assert parse_step(step) == parse_step(text)
    with pytest.raises(ValueError, match="allowed: bias, residual, relu, relu6, sigmoid"):
        parse_step("swish(x)")


def test_data_converted_in_a_first_stage():
    """``data_stage``: the data argument arrives blocked (NCHW4c) and a first stage converts
    it into the padded layout the operator reads; the numbers are the framework's."""
    import tvm

    spec = "dep:N=1,C=8,H=6,W=6,KH=3,KW=3"
    unpadded = Layout((1, 8, 4, 4))
    stored = unpadded.split(1, [-1, 4]).reorder([0, 1, 3, 4, 2])
    padded = unpadded.pad(2, 1, 1).pad(3, 1, 1)
    program = generate(spec, epilogue=("relu",), data_stage=(stored, padded))
    assert tuple(int(d) for d in program.tensors[0].shape) == stored.shape == (1, 2, 4, 4, 4)
    rng = np.random.default_rng(4)
    x = rng.uniform(-1, 1, (1, 8, 4, 4)).astype("float32")
    w = rng.uniform(-1, 1, (8, 1, 3, 3)).astype("float32")
    raw = {"data": np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1))), "weight": w}
    lib = tvm.compile(program.func, target="llvm")
    args = [tvm.runtime.tensor(a) for a in (stored.apply(x), w, np.zeros((1, 8, 4, 4), "float32"))]
    lib["main"](*args)
    np.testing.assert_allclose(args[-1].numpy(), program.reference(raw), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="data_stage: converts into physical shape"):
        generate(spec, data_stage=(stored, unpadded))

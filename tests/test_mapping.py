"""Intrinsic mappings (AMOS): Alg. 1, enumeration counts, realization as layouts, the
exact AVX2 int8 dot product, tensorized int8 programs, the env action and a tuning run."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import tvm
from gymnasium.utils.env_checker import check_env
from stable_baselines3.common.env_checker import check_env as sb3_check_env
from tvm import te

import agents
import envs
from altenv.config import ConfigError, load_config
from altenv.mapping import (
    INTRINSICS,
    AmosGenerator,
    Mapping,
    MappingTemplate,
    loop_nest,
    realize,
    select_intrinsic,
    validate,
)
from altenv.measure import MeasureConfig, create
from altenv.ops import generate, parse_workload, run_numpy
from altenv.records import RecordDB
from altenv.space import LoopSpace
from altenv.space.avx2 import AVX2_DOT_8x4_INTRIN
from altenv.space.constraints import Hardware, LayoutConstraints
from altenv.space.vnni import VNNI_DOT_16x4_INTRIN
from altenv.target import make_target
from altenv.tuning import Budget, OpTask, TuningSession, tune

TC = INTRINSICS["wmma_16x16x16"]
AVX2 = INTRINSICS["avx2_dot_8x4"]
C1D = "c1d:N=1,I=8,O=8,W=10,KW=3"
C2D = "c2d:N=1,I=8,O=16,H=6,W=6,KH=3,KW=3,pad=1"
C2D_INT8 = C2D + ",dtype=int8"
HAS_AVX2 = tvm.target.codegen.target_has_features("avx2", make_target(None))
needs_avx2 = pytest.mark.skipif(not HAS_AVX2, reason="the CPU has no AVX2")


def _names(mappings: list[Mapping]) -> set[str]:
    return {m.describe() for m in mappings}


# ------------------------------------------------------------------ Alg. 1
def test_alg1_accepts_figure4_and_rejects_mixed_semantics():
    # AMOS Fig. 4: C2D loops n k p q c r s onto Tensor Core i1 i2 r1; rows out, image, weight
    X = np.array([[1, 1, 1, 1, 0, 0, 0],   # out[n, k, p, q]
                  [1, 0, 1, 1, 1, 1, 1],   # image[n, c, p + r, q + s]
                  [0, 1, 0, 0, 1, 1, 1]])  # weight[k, c, r, s]
    Z = np.array([[1, 1, 0],   # Dst[i1, i2]
                  [1, 0, 1],   # Src1[i1, r1]
                  [0, 1, 1]])  # Src2[r1, i2]
    fig3d = np.array([[1, 0, 1, 1, 0, 0, 0],   # i1 <- n p q
                      [0, 1, 0, 0, 0, 0, 0],   # i2 <- k
                      [0, 0, 0, 0, 1, 1, 1]])  # r1 <- c r s
    assert validate(X, fig3d, Z)
    # §5.2's counter-example: n and k on the same intrinsic dim
    n_and_k = fig3d.copy()
    n_and_k[0, 1], n_and_k[1, 1] = 1, 0
    assert not validate(X, n_and_k, Z)
    # a reduction loop on a spatial dim
    c_on_i2 = fig3d.copy()
    c_on_i2[2, 4], c_on_i2[1, 4] = 0, 1
    assert not validate(X, c_on_i2, Z)


def test_enumeration_counts_and_members():
    gen = AmosGenerator()
    c1d, c2d = loop_nest(parse_workload(C1D)), loop_nest(parse_workload(C2D))
    # Tensor Core: i1 <- nonempty subset of {n, w}, i2 <- o, r1 <- nonempty subset of {rc, rw}
    assert len(gen.generate(c1d, TC)) == 9
    assert len(gen.generate(c2d, TC)) == 49
    assert "wmma_16x16x16[i1<-n.h.w, i2<-o, r1<-rc.rh.rw]" in _names(gen.generate(c2d, TC))
    # the dot product: i <- o only (n, h, w index data, which src2 alone does not)
    found = _names(gen.generate(c2d, AVX2))
    assert len(found) == 7 and "avx2_dot_8x4[i<-o, r<-rc]" in found
    assert all("n" not in m.mapped for m in gen.generate(c2d, AVX2))
    assert len(gen.generate(loop_nest(parse_workload("gmm:M=8,N=16,K=8")), TC)) == 1
    # every enumerated mapping passes Mapping.check
    for m in gen.generate(c2d, TC):
        m.check(c2d, TC)


def test_mapping_json_and_padding():
    m = Mapping("avx2_dot_8x4", (("o",), ("rc", "rw")))
    assert Mapping.from_json(m.to_json()) == m
    nest = loop_nest(parse_workload("c2d:N=1,I=3,O=16,H=6,W=6,KH=3,KW=3"))
    assert m.padding(nest, AVX2) == (0, 3)  # 3 * 3 = 9 -> 12
    with pytest.raises(ValueError, match="on R dim"):
        Mapping("avx2_dot_8x4", (("o",), ("h",))).check(nest, AVX2)


# ------------------------------------------------------------------ layouts
def test_realized_layouts_pack_operands_for_the_intrinsic():
    real = realize(parse_workload(C2D_INT8), Mapping("avx2_dot_8x4", (("o",), ("rc",))))
    assert real.layouts["weight"].shape == (2, 3, 3, 2, 8, 4)  # O/8 KH KW I/4 8 4
    assert real.layouts["out"].shape == (1, 2, 6, 6, 8)         # N O/8 H W 8
    assert real.layouts["data"].shape == (1, 8, 8, 2, 4)        # N H W I/4 4
    assert real.reduce.shape == (3, 3, 2, 4)
    im2col = realize(parse_workload(C2D_INT8), Mapping("avx2_dot_8x4", (("o",), ("rw",))))
    assert im2col.layouts["data"].shape[-2:] == (1, 4)  # KW = 3 padded to 4
    with pytest.raises(ValueError, match="groups"):
        realize(parse_workload("grp:N=1,I=8,O=8,groups=2,H=4,W=4,KH=1,KW=1,dtype=int8"),
                Mapping("avx2_dot_8x4", (("o",), ("rc",))))
    with pytest.raises(ValueError, match="batched matmuls .* have no intrinsic mappings"):
        loop_nest(parse_workload("gmm:M=8,N=8,K=8,batch=2,dtype=int8"))


@pytest.mark.parametrize("spec", [C2D_INT8, "c2d:N=1,I=4,O=8,H=7,W=7,KH=3,KW=3,stride=2,"
                                  "dtype=int8", "c1d:N=2,I=4,O=8,W=9,KW=3,pad=1,dtype=int8",
                                  "gmm:M=4,N=16,K=12,dtype=int8"])
def test_every_mapping_generates_the_operator(spec):
    """Untensorized programs under each mapping's layouts match torch exactly."""
    for m in AmosGenerator().generate(loop_nest(parse_workload(spec)), AVX2):
        real = realize(parse_workload(spec), m)
        program = generate(spec, real.layouts, reduce=real.reduce)
        raw = program.random_inputs(3)
        np.testing.assert_array_equal(run_numpy(program, raw), program.reference(raw),
                                      err_msg=m.describe())


def test_int8_means_u8_data_and_i8_weight():
    program = generate(C2D_INT8)
    raw = program.random_inputs(0)
    assert raw["data"].dtype == np.uint8 and raw["weight"].dtype == np.int8
    assert raw["data"].max() > 127 and raw["weight"].min() < -64  # full ranges
    assert [str(t.dtype) for t in program.tensors] == ["uint8", "int8", "int32"]


# ------------------------------------------------------------------ the intrinsic
@pytest.mark.parametrize("intrin, lanes, feature, instruction", [
    (AVX2_DOT_8x4_INTRIN, 8, "avx2", "vpmaddwd"),
    (VNNI_DOT_16x4_INTRIN, 16, "avx512vnni", "vpdpbusd"),
])
def test_x86_dot_products_are_exact(intrin, lanes, feature, instruction):
    from altenv.space.intrin import ensure_registered

    if not tvm.target.codegen.target_has_features(feature, make_target(None)):
        pytest.skip(f"the CPU has no {feature}")
    ensure_registered(intrin)
    M, N, K = 4, 32, 32
    A = te.placeholder((M, K), "uint8", name="A")
    B = te.placeholder((N // lanes, K // 4, lanes, 4), "int8", name="B")
    k = te.reduce_axis((0, K), name="k")
    C = te.compute((M, N), lambda i, j: te.sum(
        A[i, k].astype("int32") * B[j // lanes, k // 4, j % lanes, k % 4].astype("int32"),
        axis=k), name="C")
    sch = tvm.s_tir.Schedule(te.create_prim_func([A, B, C]))
    block = sch.get_sblock("C")
    i, j, kk = sch.get_loops(block)
    jo, ji = sch.split(j, [None, lanes])
    ko, ki = sch.split(kk, [None, 4])
    sch.reorder(i, jo, ko, ji, ki)
    sch.decompose_reduction(block, ko)
    sch.tensorize(ji, intrin)
    lib = tvm.compile(sch.mod, make_target(None))
    assert instruction in lib.mod.inspect_source("asm")
    rng = np.random.default_rng(0)
    a = rng.integers(0, 256, (M, K), dtype=np.uint8)
    a[0] = 255  # extremes: pairs of products that overflow int16
    b = rng.integers(-128, 128, (N, K), dtype=np.int8)
    b[:8] = -128
    packed = b.reshape(N // lanes, lanes, K // 4, 4).transpose(0, 2, 1, 3).copy()
    dev = tvm.cpu()
    c = tvm.runtime.tensor(np.zeros((M, N), np.int32), dev)
    lib["main"](tvm.runtime.tensor(a, dev), tvm.runtime.tensor(packed, dev), c)
    expected = a.astype(np.int64) @ b.astype(np.int64).T
    assert np.abs(expected).max() > 2 ** 15 and np.count_nonzero(expected) > M * N // 2
    np.testing.assert_array_equal(c.numpy(), expected)


@needs_avx2
def test_tensorized_int8_conv_matches_torch():
    task = OpTask(C2D_INT8, mapping="amos")
    assert task.template.intrinsic.name in ("avx2_dot_8x4", "vnni_dot_16x4")
    for k in (0, len(task.template.mappings) - 1):  # channels only; an im2col mapping
        factors = (("mapping", k),)
        space = task.space(factors)
        program = task.program(factors)
        for point in space.sample(2, seed=k):
            mod = space.decode(point).mod
            assert "pmadd" in mod.script() or "vpdpbusd" in mod.script()
            raw = program.random_inputs(5)
            np.testing.assert_array_equal(run_numpy(program, raw, func=mod),
                                          program.reference(raw))


def test_tensorizing_needs_a_matching_block():
    spec = "c2d:N=1,I=8,O=8,H=4,W=4,KH=1,KW=1,dtype=int8"
    with pytest.raises(ValueError, match="cannot tensorize"):
        LoopSpace(generate(spec).func, make_target(None), intrin=AVX2_DOT_8x4_INTRIN)


# ------------------------------------------------------------------ plumbing
def test_mapping_template_and_errors():
    target = make_target(None)
    template = MappingTemplate(parse_workload(C2D_INT8), "amos", target)
    n = len(template.mappings)
    assert n == 7 and template.mappings[0].describe().endswith("r<-rc]")
    assert template.factors_from_actions([1.0]) == {"mapping": n - 1}
    assert template.factors_from_indices([99]) == {"mapping": n - 1}
    obs = template.observation({"mapping": 3})
    assert obs.shape == (2 * (len(template.nest.loops) + 1),) and obs.max() <= 1.0
    assert select_intrinsic(target).name == template.intrinsic.name
    with pytest.raises(ValueError, match="int8 workload"):
        OpTask(C2D, mapping="amos")
    with pytest.raises(ValueError, match="unknown generator"):
        OpTask(C2D_INT8, mapping="nope")


def test_config_mapping_option():
    cfg = load_config(None, name="x", workload=C2D_INT8, mapping="amos")
    assert cfg.mapping == "amos"
    assert load_config(None, name="x", workload=C2D).mapping == "none"
    with pytest.raises(ConfigError, match="mapping.*int8"):
        load_config(None, name="x", workload=C2D, mapping="amos")
    with pytest.raises(ConfigError, match="mapping: Input should be"):
        load_config(None, name="x", workload=C2D_INT8, mapping="tensorize")


@pytest.mark.parametrize("action_type", ["continuous", "discrete"])
def test_envs_take_the_mapping_action(action_type):
    env = envs.JointTuningEnv(C2D_INT8, mapping="amos", reward_source="cost_model",
                              action_type=action_type, batch=4, episode_length=2,
                              walk_length=2, loop_rounds=1)
    assert env.action_space.shape == (1,)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        check_env(env)
        sb3_check_env(env)
    if action_type == "discrete":  # MaskablePPO: every mapping index is a legal action
        assert env.action_masks().tolist() == [True] * int(env.action_space.nvec[0])
    _, _, _, _, info = env.step(env.action_space.sample())
    assert set(info["factors"]) == {"mapping"}
    env.close()


@pytest.mark.slow
@needs_avx2
def test_tuning_with_amos_mapping_resumes(tmp_path):
    with create("local", MeasureConfig(number=1, repeat=2, min_repeat_ms=5)) as measurer:
        task = OpTask(C2D_INT8, mapping="amos")
        db = RecordDB(tmp_path / "records.jsonl")
        session = TuningSession(task, measurer, db)
        best = tune(session, agents.create("random", seed=0), Budget.split(8), batch=16,
                    top_k=4, progress=False)
        assert np.isfinite(best) and session.trials == 8
        records = db.records(task.key)
        assert all(r.ok for r in records), [r.error for r in records]
        assert all("mapping" in r.layouts for r in records)
        cand, _ = session.best
        program = task.program(cand.factors)
        raw = program.random_inputs(9)
        np.testing.assert_array_equal(
            run_numpy(program, raw, func=session.schedule(cand).mod), program.reference(raw))
        db.close()
        resumed = TuningSession(OpTask(C2D_INT8, mapping="amos"), measurer,
                                RecordDB(tmp_path / "records.jsonl"))
        assert resumed.trials == 8 and resumed.best[0] == cand


def test_layout_constraints_draw_mapping_indices():
    """A mapping knob takes the mappings' indices, not the divisors of their count, so the
    evolution and heron agents draw only mappings that exist."""
    task = OpTask("c2d:N=1,I=16,O=16,H=8,W=8,KH=3,KW=3,pad=1,dtype=int8", mapping="amos")
    count = len(task.template.mappings)
    model = LayoutConstraints(task.template, Hardware.of(task.target))
    drawn = {model.factors(g)["mapping"] for g in model.sample(4 * count, np.random.default_rng(0))}
    assert drawn == set(range(count))

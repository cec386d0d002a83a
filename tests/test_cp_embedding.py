"""The cp_embedding mapping generator (Rieber et al. §4-§5): the CP-SAT model's best
solutions on hand-checked cases, its objective against the realized layouts, Alg. 1 on
every solution, the ranking, a tensorized int8 conv and a tuning run."""

from __future__ import annotations

import math

import numpy as np
import pytest
import tvm

import agents
import envs
from altenv.config import load_config
from altenv.mapping import (
    INTRINSICS,
    AmosGenerator,
    CpEmbeddingGenerator,
    MappingTemplate,
    loop_nest,
    mappings_for,
    realize,
    validate,
)
from altenv.mapping.amos import matrices
from altenv.mapping.space import select_intrinsic
from altenv.measure import MeasureConfig, create
from altenv.ops import generate, operator_for, parse_workload, run_numpy
from altenv.records import RecordDB
from altenv.target import make_target
from altenv.tuning import Budget, OpTask, TuningSession, tune

AVX2 = INTRINSICS["avx2_dot_8x4"]
TC = INTRINSICS["wmma_16x16x16"]
RGB = "c2d:N=1,I=3,O=8,H=6,W=6,KH=3,KW=3,pad=1,dtype=int8"  # 3 channels: r needs padding
# on the host's own intrinsic: 16 output channels fill AVX2's 8 lanes and VNNI's 16
HOST_RGB = "c2d:N=1,I=3,O=16,H=6,W=6,KH=3,KW=3,pad=1,dtype=int8"
C2D = "c2d:N=1,I=8,O=16,H=6,W=6,KH=3,KW=3,pad=1,dtype=int8"
HAS_AVX2 = tvm.target.codegen.target_has_features("avx2", make_target(None))
needs_avx2 = pytest.mark.skipif(not HAS_AVX2, reason="the CPU has no AVX2")


def _solve(spec: str, intrinsic=AVX2, **kw):
    return CpEmbeddingGenerator(**kw).embeddings(loop_nest(parse_workload(spec)), intrinsic)


def _by_name(spec: str, **kw):
    return {e.mapping.describe(): e for e in _solve(spec, **kw)}


def test_padding_prefers_the_mapping_with_fewer_wasted_macs():
    # out: 8 x 6 x 6 = 288 elements; each reduces 3 x 3 x 3 = 27 MACs
    found = _solve(RGB)
    best = found[0]
    # all 27 onto r: 27 -> 28, one wasted MAC per output; data unrolled on H and W
    # (6 x 6 windows of 28) and weight 8 x 28, over the originals 3 x 8 x 8 and 8 x 27
    assert best.mapping.describe() == "avx2_dot_8x4[i<-o, r<-rc.rh.rw]"
    assert (best.wasted_macs, best.data_movement, best.reorders) == (288, 1008 - 192 + 8, 0)
    # channels alone: 3 -> 4 wastes a third of 27 per output, for little data movement
    rc = _by_name(RGB)["avx2_dot_8x4[i<-o, r<-rc]"]
    assert (rc.wasted_macs, rc.data_movement) == (288 * 9, 8 * 8 * 4 - 192 + 8 * 9 * 4 - 216)
    assert rc.cost > best.cost
    # the weight vector of §4.4: counting data movement only, channels alone win
    assert _solve(RGB, weights=(0, 1))[0].mapping.describe() == "avx2_dot_8x4[i<-o, r<-rc]"
    # channels that fill the intrinsic: no padding, no rewrite, cost 0
    top = _solve(C2D)[0]
    assert top.mapping.describe() == "avx2_dot_8x4[i<-o, r<-rc]" and top.cost == 0


def test_gmm_maps_trivially():
    (only,) = _solve("gmm:M=4,N=16,K=12")
    assert only.mapping.describe() == "avx2_dot_8x4[i<-n, r<-rk]" and only.cost == 0
    (padded,) = _solve("gmm:M=4,N=16,K=6")  # K = 6 -> 8: two wasted MACs per output
    assert (padded.wasted_macs, padded.data_movement) == (4 * 16 * 2, 4 * 2 + 2 * 16)
    assert [e.mapping.groups for e in _solve("gmm:M=16,N=16,K=16", TC)] == [(("m",), ("n",),
                                                                             ("rk",))]


@pytest.mark.parametrize("spec", [RGB, "c2d:N=1,I=4,O=8,H=7,W=7,KH=3,KW=3,stride=2",
                                  "c2d:N=1,I=4,O=8,H=7,W=7,KH=1,KW=1,stride=2",
                                  "c1d:N=2,I=6,O=8,W=9,KW=3,pad=1",
                                  "c3d:N=1,I=2,O=8,D=4,H=4,W=4,KD=2,KH=3,KW=2"])
def test_objective_terms_match_the_realized_layouts(spec):
    """O_MAC and O_Data of every solution equal what realize's layouts hold: padded
    reduction x outputs, and physical tensor elements over the logical ones."""
    op = operator_for(parse_workload(spec))
    logical = math.prod(op.out_shape()) + sum(math.prod(s) for s in op.input_shapes().values())
    mac_min = math.prod(op.out_shape()) * math.prod(e for _, e in op.reduce_extents())
    for e in _solve(spec):
        real = realize(parse_workload(spec), e.mapping)
        physical = sum(math.prod(lay.shape) for lay in real.layouts.values())
        assert e.data_movement == physical - logical, e.mapping.describe()
        assert e.wasted_macs == math.prod(op.out_shape()) * math.prod(real.reduce.shape) - mac_min


@pytest.mark.parametrize("spec", ["c1d:N=1,I=16,O=16,W=16,KW=3", C2D,
                                  "c3d:N=1,I=16,O=16,D=8,H=8,W=8,KD=3,KH=3,KW=3",
                                  "grp:N=1,I=16,O=32,groups=2,H=8,W=8,KH=3,KW=3",
                                  "dil:N=1,I=16,O=16,H=8,W=8,KH=3,KW=3,dilation=2",
                                  "t2d:N=1,I=16,O=16,H=8,W=8,KH=3,KW=3"])
def test_every_solution_passes_alg1_and_is_ranked(spec):
    nest = loop_nest(parse_workload(spec))
    found = _solve(spec)
    assert found
    for e in found:
        e.mapping.check(nest, AVX2)
        assignment = {n: d for d, g in zip(AVX2.dim_names, e.mapping.groups) for n in g}
        assert validate(*matrices(nest, AVX2, assignment)), e.mapping.describe()
        assert e.mapping.generator == "cp_embedding"
    keys = [(e.cost, e.reorders) for e in found]
    assert keys == sorted(keys)
    assert len({e.mapping for e in found}) == len(found)


def test_solutions_cover_amos_with_reorders():
    """Every subset of reduction loops on r (AMOS's mappings) in every order; the
    nest-ordered ones are exactly AMOS's; dilated windows stay off the intrinsic."""
    nest = loop_nest(parse_workload(C2D))
    found = _solve(C2D)
    assert len(found) == 3 + 3 * 2 + 6  # one, two or three of rc rh rw, in every order
    in_order = {e.mapping.groups for e in found if e.reorders == 0}
    assert in_order == {m.groups for m in AmosGenerator().generate(nest, AVX2)}
    dil = _solve("dil:N=1,I=16,O=16,H=8,W=8,KH=3,KW=3,dilation=2")
    assert [e.mapping.groups for e in dil] == [(("o",), ("rc",))]
    # depthwise: the channel loop reads the data too, so nothing fills the lanes, and the
    # output is never padded (AMOS leaves i empty)
    assert _solve("dep:N=1,C=16,H=8,W=8,KH=3,KW=3") == []
    assert len(_solve("c3d:N=1,I=16,O=16,D=8,H=8,W=8,KD=3,KH=3,KW=3")) == 4 + 12 + 24 + 24
    assert [e.mapping for e in _solve(C2D, limit=4)] == [e.mapping for e in found[:4]]


def test_mapping_template_keeps_the_objective_order():
    host = select_intrinsic(make_target(None))
    workload = parse_workload(HOST_RGB)
    template = MappingTemplate(workload, "cp_embedding", make_target(None))
    assert template.mappings == [e.mapping for e in _solve(HOST_RGB, host)]
    assert [m for m, _ in mappings_for(workload, "cp_embedding", host)] == template.mappings
    assert load_config(None, name="x", workload=RGB, mapping="cp_embedding").mapping == \
        "cp_embedding"


def test_every_solution_generates_the_operator():
    """Untensorized programs under each solution's layouts (reorders included) match the
    reference exactly."""
    for e in _solve(RGB):
        real = realize(parse_workload(RGB), e.mapping)
        program = generate(RGB, real.layouts, reduce=real.reduce)
        raw = program.random_inputs(3)
        np.testing.assert_array_equal(run_numpy(program, raw), program.reference(raw),
                                      err_msg=e.mapping.describe())


@pytest.mark.filterwarnings("ignore:altenv env. the cost model is untrained")
def test_env_mapping_action_picks_a_ranked_mapping():
    env = envs.JointTuningEnv(HOST_RGB, mapping="cp_embedding", reward_source="cost_model",
                              action_type="discrete", batch=4, episode_length=2,
                              walk_length=2, loop_rounds=1)
    host = select_intrinsic(make_target(None))
    assert list(env.action_space.nvec) == [len(_solve(HOST_RGB, host))]
    env.reset(seed=0)
    _, _, _, _, info = env.step(np.array([0]))
    assert info["factors"] == {"mapping": 0}
    env.close()


@needs_avx2
def test_tensorized_int8_conv_under_the_top_mapping_matches_numpy():
    task = OpTask(HOST_RGB, mapping="cp_embedding")
    assert task.template.mappings[0].describe().endswith("r<-rc.rh.rw]")
    factors = (("mapping", 0),)
    program, space = task.program(factors), task.space(factors)
    for point in space.sample(2, seed=1):
        mod = space.decode(point).mod
        assert "pmadd" in mod.script() or "vpdpbusd" in mod.script()
        raw = program.random_inputs(5)
        np.testing.assert_array_equal(run_numpy(program, raw, func=mod), program.reference(raw))


@pytest.mark.slow
@needs_avx2
def test_tuning_with_cp_embedding_mapping(tmp_path):
    with create("local", MeasureConfig(number=1, repeat=2, min_repeat_ms=5)) as measurer:
        task = OpTask(HOST_RGB, mapping="cp_embedding")
        db = RecordDB(tmp_path / "records.jsonl")
        session = TuningSession(task, measurer, db)
        best = tune(session, agents.create("random", seed=0), Budget.split(6), batch=8,
                    top_k=3, progress=False)
        assert np.isfinite(best) and session.trials == 6
        records = db.records(task.key)
        assert all(r.ok for r in records), [r.error for r in records]
        assert all(r.layouts["mapping"]["generator"] == "cp_embedding" for r in records)
        cand, _ = session.best
        program = task.program(cand.factors)
        raw = program.random_inputs(9)
        np.testing.assert_array_equal(
            run_numpy(program, raw, func=session.schedule(cand).mod), program.reference(raw))
        db.close()
        resumed = TuningSession(OpTask(HOST_RGB, mapping="cp_embedding"), measurer,
                                RecordDB(tmp_path / "records.jsonl"))
        assert resumed.trials == 6 and resumed.best[0] == cand

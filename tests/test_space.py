"""Loop space: sampling, JSON/vector round trips, decoding, numerics, moves, caching."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import te, topi

from altenv.space import ComputeLocationSubspace, LoopPoint, LoopSpace, TileSubspace
from altenv.target import make_target

N, C, H, W, O, K = 1, 8, 14, 14, 16, 3
HT, WT, OT = 7, 7, 8


def _matmul() -> tvm.tirx.PrimFunc:
    a = te.placeholder((32, 48), name="A")
    b = te.placeholder((48, 64), name="B")
    k = te.reduce_axis((0, 48), name="k")
    c = te.compute((32, 64), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")
    return te.create_prim_func([a, b, c])


def _conv_nchw() -> tvm.tirx.PrimFunc:
    x = te.placeholder((N, C, H, W), name="X")
    w = te.placeholder((O, C, K, K), name="W")
    return te.create_prim_func([x, w, topi.nn.conv2d_nchw(x, w, 1, 1, 1)])


def _conv_tiled() -> tvm.tirx.PrimFunc:
    """conv2d + ReLU whose output layout is ``N H/ht W/wt O/ot ht wt ot`` (ALT §5.1)."""
    x = te.placeholder((N, C, H, W), name="X")
    w = te.placeholder((O, C, K, K), name="W")
    pad = te.compute(
        (N, C, H + 2, W + 2),
        lambda n, c, h, v: te.if_then_else(
            te.all(h >= 1, h <= H, v >= 1, v <= W), x[n, c, h - 1, v - 1], 0.0),
        name="pad")
    rc, rh, rw = (te.reduce_axis((0, e), name) for e, name in ((C, "rc"), (K, "rh"), (K, "rw")))
    conv = te.compute(
        (N, H // HT, W // WT, O // OT, HT, WT, OT),
        lambda n, h1, w1, o1, h2, w2, o2: te.sum(
            pad[n, rc, h1 * HT + h2 + rh, w1 * WT + w2 + rw] * w[o1 * OT + o2, rc, rh, rw],
            axis=[rc, rh, rw]),
        name="conv")
    relu = te.compute(conv.shape, lambda *i: te.max(conv(*i), 0.0), name="relu")
    return te.create_prim_func([x, w, relu])


def _conv_ref(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    out = np.zeros((N, O, H, W), dtype=np.float64)
    for kh in range(K):
        for kw in range(K):
            out += np.einsum("nchw,oc->nohw", xp[:, :, kh:kh + H, kw:kw + W], w[:, :, kh, kw])
    return out


def _tiled_ref(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    out = np.maximum(_conv_ref(x, w), 0.0)
    out = out.reshape(N, O // OT, OT, H // HT, HT, W // WT, WT)
    return out.transpose(0, 3, 5, 1, 4, 6, 2)


CASES = {
    "matmul": (_matmul, [(32, 48), (48, 64)], lambda a, b: a @ b, (32, 64)),
    "conv_nchw": (_conv_nchw, [(N, C, H, W), (O, C, K, K)], _conv_ref, (N, O, H, W)),
    "conv_tiled": (_conv_tiled, [(N, C, H, W), (O, C, K, K)], _tiled_ref,
                   (N, H // HT, W // WT, O // OT, HT, WT, OT)),
}


@pytest.fixture(scope="session")
def target() -> tvm.target.Target:
    return make_target(None)


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request, target):
    build, in_shapes, ref, out_shape = CASES[request.param]
    space = LoopSpace(build(), target)
    return space, in_shapes, ref, out_shape


def _sampled_decisions(sch) -> list[tuple[int, ...]]:
    out = []
    for inst in sch.trace.insts:
        if inst.kind.name in ("SamplePerfectTile", "SampleCategorical", "SampleComputeLocation"):
            d = sch.trace.get_decision(inst)
            out.append(tuple(int(v) for v in d) if inst.kind.name == "SamplePerfectTile"
                       else (int(d),))
    return out


def test_structure(case):
    space = case[0]
    assert space.num_designs >= 1
    assert space.num_subspaces == len(space.subspace_sizes) == len(space.action_nvec)
    assert space.subspace_sizes[0] == 1 and space.subspaces[0].name == "design"
    assert space.vector_size == sum(space.subspace_sizes)
    assert all(n >= 1 for n in space.action_nvec)
    assert any(isinstance(s, TileSubspace) for s in space.subspaces)


def test_sample_json_decode_round_trip(case, target):
    space = case[0]
    points = space.sample(6, seed=3)
    assert len(points) == 6
    fresh = LoopSpace(space.mod, target)  # shares the design spaces, not the decode cache
    for point in points:
        text = json.dumps(space.to_json(point))
        back = fresh.from_json(json.loads(text))
        assert back == point
        assert space.from_vector(space.to_vector(point)) == point
        sch = fresh.decode(back)
        assert sch is not None
        expected = [point.values[k] for k in space.design_slots(point.design)]
        assert _sampled_decisions(sch) == expected


def test_point_of_reads_back_sampled_and_searched_schedules(case):
    """Decoded points and MetaSchedule's own search candidates (simplified traces) map
    back to the point that decodes to the same program."""
    space = case[0]
    for point in space.sample(4, seed=5):
        assert space.point_of(space.decode(point)) == point
    from tvm.s_tir import meta_schedule as ms

    strategy = ms.search_strategy.ReplayTrace()
    _, design_spaces = space.search_context(strategy, seed=1)
    strategy.pre_tuning(4, 4, design_spaces)
    for candidate in strategy.generate_measure_candidates():
        point = space.point_of(candidate.sch)
        assert point is not None
        assert tvm_ffi.structural_equal(space.decode(point).mod, candidate.sch.mod)


def test_decoded_schedules_compute_correctly(case, target):
    space, in_shapes, ref, out_shape = case
    rng = np.random.default_rng(0)
    dev = tvm.cpu()
    inputs = [rng.uniform(-1, 1, s).astype("float32") for s in in_shapes]
    expected = ref(*inputs)
    points = space.sample(space.num_designs * 2, seed=11)
    for point in points[: max(2, space.num_designs)]:
        lib = tvm.compile(space.decode(point).mod, target=target).jit()
        out = tvm.runtime.tensor(np.zeros(out_shape, "float32"), dev)
        lib["main"](*(tvm.runtime.tensor(x, dev) for x in inputs), out)
        got = out.numpy()
        assert np.abs(got).max() > 0
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


def test_encode_is_normalized(case):
    space = case[0]
    for point in space.sample(4, seed=5):
        enc = space.encode(point)
        assert enc.shape == (space.vector_size,) and enc.dtype == np.float32
        assert np.all((enc >= 0) & (enc <= 1))


def test_moves_stay_valid_and_change_their_subspace(case):
    """Every direction keeps the point valid and touches only its subspace (plus a
    compute location the move invalidated); some direction changes each subspace."""
    space = case[0]
    point = space.sample(1, seed=7)[0]
    active = space.active(point)
    for k, sub in enumerate(space.subspaces):
        changed = False
        for d in range(space.action_nvec[k]):
            moved = space.move(point, k, d)
            others = [i for i, s in enumerate(space.subspaces)
                      if i != k and not isinstance(s, ComputeLocationSubspace)]
            assert [moved.values[i] for i in others] == [point.values[i] for i in others]
            if d == 0:
                assert moved == point
            if active[k]:
                assert space.is_valid(moved)
            changed |= moved.values[k] != point.values[k]
        degenerate = isinstance(sub, TileSubspace) and sub.extent == 1
        assert changed or degenerate, f"no direction moves subspace {sub.name}"


def test_step_applies_a_multidiscrete_action(case):
    space = case[0]
    rng = np.random.default_rng(1)
    point = space.sample(1, seed=2)[0]
    assert space.step(point, [0] * space.num_subspaces) == point
    for _ in range(3):
        point = space.step(point, [int(rng.integers(n)) for n in space.action_nvec])
        assert space.is_valid(point)
    with pytest.raises(ValueError):
        space.step(point, [0])


def test_invalid_points_are_rejected(case):
    space = case[0]
    point = space.sample(1, seed=4)[0]
    bad_size = {"design": 0, "decisions": [[1]] * (space.num_subspaces - 1)}
    with pytest.raises(ValueError):
        space.from_json(bad_size)
    tiles = [k for k in space.design_slots(point.design)
             if isinstance(space.subspaces[k], TileSubspace)]
    k = tiles[0]
    wrong = point.replace(k, (space.subspaces[k].extent + 1,) + point.values[k][1:])
    assert not space.is_valid(wrong)


def test_tile_neighbours_move_prime_factors():
    sub = TileSubspace("t", extent=24, levels=3, max_innermost=4)
    assert sub.num_directions == 7
    direction = {sub.move_of(d): d for d in range(1, sub.num_directions)}
    assert sorted(direction) == [(i, j) for i in range(3) for j in range(3) if i != j]
    moves = list(sub.neighbours((6, 2, 2), direction[0, 1]))
    assert moves == [(3, 4, 2), (2, 6, 2)]  # smallest prime factor first
    assert all(sub.is_valid(m) for m in moves)
    assert list(sub.neighbours((6, 2, 2), direction[1, 2])) == [(6, 1, 4)]
    # the innermost factor would become 8 > max_innermost: no candidate
    assert list(sub.neighbours((3, 2, 4), direction[1, 2])) == []
    assert list(sub.neighbours((1, 24, 1), direction[0, 1])) == []


def test_spaces_are_cached_by_structure(target):
    first = LoopSpace(_conv_nchw(), target)
    again = LoopSpace(_conv_nchw(), target)  # rebuilt, structurally equal
    assert again.context.same_as(first.context)
    other = LoopSpace(_conv_tiled(), target)
    assert not other.context.same_as(first.context)


def test_point_is_hashable_and_replace_is_pure():
    p = LoopPoint(((0,), (2, 3), (1,)))
    q = p.replace(1, (3, 2))
    assert p.values[1] == (2, 3) and q.values[1] == (3, 2)
    assert len({p, q, LoopPoint(((0,), (2, 3), (1,)))}) == 2


@pytest.mark.slow
def test_cuda_space_samples_valid_points():
    space = LoopSpace(_matmul(), make_target("cuda"))
    points = space.sample(2, seed=0, max_tries=64)  # most CUDA draws fail VerifyGPUCode
    assert len(points) == 2
    assert all(space.decode(p) is not None for p in points)
    moved = space.step(points[0], [1] * space.num_subspaces)
    assert space.is_valid(moved)


def test_alt_template_conv_from_ops(target):
    """A C2D generated by ``altenv.ops`` with ALT's template layouts (unfolded input,
    tiled weight and output) gives a space whose samples decode to their own points."""
    codegen = pytest.importorskip("altenv.ops.codegen")
    templates = pytest.importorskip("altenv.ops.templates")
    wl = "c2d:N=1,I=8,O=16,H=14,W=14,KH=3,KW=3,stride=1,pad=1"
    factors = {"ht": 7, "wt": 7, "ot": 8, "it": 4, "it_w": 4, "ot_w": 8}
    program = codegen.generate(wl, templates.LayoutTemplate(wl).layouts(factors),
                               epilogue=("relu",))
    space = LoopSpace(program.func, target)
    for point in space.sample(3, seed=0):
        sch = space.decode(point)
        assert _sampled_decisions(sch) == [point.values[k]
                                           for k in space.design_slots(point.design)]


def test_bias_of_a_channel_blocked_output_is_inlined(target):
    """MetaSchedule inlines the bias add into the convolution's tile in every design when
    the output's channels are blocked (``NCHW16c``), as it does for the framework layout."""
    codegen = pytest.importorskip("altenv.ops.codegen")
    templates = pytest.importorskip("altenv.ops.templates")
    wl = "dep:N=1,C=32,H=7,W=7,KH=3,KW=3,pad=1"
    factors = {"ht": 7, "wt": 7, "ot": 16, "it": 16, "it_w": 1, "ot_w": 16}
    program = codegen.generate(wl, templates.LayoutTemplate(wl).layouts(factors),
                               epilogue=("bias", "relu6"))
    space = LoopSpace(program.func, target)
    assert space.num_designs > 1
    for design in range(space.num_designs):
        kinds = [inst.kind.name for inst in space.design_instructions(design)]
        assert "ComputeInline" in kinds and "CacheWrite" not in kinds


def test_transfer_within_a_space_keeps_the_point(case):
    space = case[0]
    for point in space.sample(4, seed=3):
        assert space.transfer(point, space) == point

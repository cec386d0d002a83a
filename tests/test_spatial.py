"""CPU schedules of the functions a network build does not tune: generated spatial stages
(conversions, regenerated elementwise tasks) and tasks kept as they are (softmax, pooling)."""

from __future__ import annotations

import numpy as np
import tvm
from tvm import s_tir, te, tirx, topi

from altenv.graph.spatial import ITEMS_PER_CORE, parallel_spatial, untuned_schedule
from altenv.layout import Layout
from altenv.layout.convert import conversion_func
from altenv.target import make_target


def loops_of(func: tirx.PrimFunc) -> list[tirx.For]:
    """The loops around every block of ``func``, outermost first."""
    sch = s_tir.Schedule(func)
    return [sch.get(loop) for block in sch.get_child_blocks(sch.get_sblock("root"))
            for loop in sch.get_loops(block)]


def test_outer_loops_fused_until_every_core_has_work_and_inner_vectorized():
    src = Layout((1, 8, 28, 28))
    dst = src.pad(2, 1, 1).pad(3, 1, 1).split(1, [-1, 2]).reorder([0, 1, 3, 4, 2])
    func = parallel_spatial(conversion_func(src, dst), cores=4)
    loops = loops_of(func)
    assert [lp.kind for lp in loops] == [tirx.ForKind.PARALLEL, tirx.ForKind.SERIAL,
                                         tirx.ForKind.VECTORIZED]
    # (1, 4, 30, 30, 2): 1 * 4 < 32 work items, 1 * 4 * 30 >= 32
    assert int(loops[0].extent) == 120 >= ITEMS_PER_CORE * 4
    x = np.random.default_rng(0).standard_normal(src.shape).astype("float32")
    out = tvm.runtime.tensor(np.full(dst.shape, np.nan, "float32"))
    tvm.compile(func, target="llvm")["main"](tvm.runtime.tensor(x), out)
    np.testing.assert_array_equal(out.numpy(), dst.apply(x))


def test_transposing_conversion_is_tiled_by_the_source_cache_line():
    """Channels-innermost blocks to planar with padding (a MobileNet-V2 expand convolution's
    output to its depthwise convolution's input): the channel loop is split by 16 and its
    inner part moved next to the width loop; the numbers are unchanged."""
    src = Layout((1, 48, 10, 10)).split(1, [-1, 16]).reorder([0, 1, 3, 4, 2])
    dst = Layout((1, 48, 10, 10)).pad(2, 1, 1).pad(3, 1, 1)
    func = parallel_spatial(conversion_func(src, dst), cores=2)
    loops = loops_of(func)
    # (n, c/16, h) fused and parallel, then 16 channels, then the row
    assert [int(lp.extent) for lp in loops] == [36, 16, 12]
    assert loops[0].kind == tirx.ForKind.PARALLEL
    x = np.random.default_rng(3).standard_normal(src.logical_shape).astype("float32")
    np.testing.assert_array_equal(_run(func, [src.apply(x)], dst.shape), dst.apply(x))
    # the other way round the source's rows already run along the innermost loops
    back = parallel_spatial(conversion_func(dst, src), cores=2)
    assert [int(lp.extent) for lp in loops_of(back)][-2:] == [10, 16]


def test_small_outputs_and_single_cores_stay_serial():
    small = conversion_func(Layout((4, 8, 8)), Layout((4, 8, 8)).pad(1, 1, 1))
    big = conversion_func(Layout((16, 64, 64)), Layout((16, 64, 64)).pad(1, 1, 1))
    for func in (parallel_spatial(small, cores=8), parallel_spatial(big, cores=1)):
        assert tirx.ForKind.PARALLEL not in [lp.kind for lp in loops_of(func)]


def test_reductions_are_left_alone():
    a = te.placeholder((64, 64), name="a")
    k = te.reduce_axis((0, 64), name="k")
    s = te.compute((64,), lambda i: te.sum(a[i, k], axis=k), name="s")
    func = te.create_prim_func([a, s])
    assert parallel_spatial(func, cores=4) is func


def _run(func: tirx.PrimFunc, inputs: list[np.ndarray], out_shape: tuple[int, ...]
         ) -> np.ndarray:
    out = tvm.runtime.tensor(np.full(out_shape, np.nan, "float32"))
    tvm.compile(func, target="llvm")["main"](*(tvm.runtime.tensor(x) for x in inputs), out)
    return out.numpy()


def test_untuned_softmax_gets_dlight_rows_in_parallel():
    x = te.placeholder((2, 64, 48), name="x")
    func = te.create_prim_func([x, topi.nn.softmax(x, axis=-1)])
    scheduled = untuned_schedule(func, make_target(None), cores=2)
    kinds = [lp.kind for lp in loops_of(scheduled)]
    assert tirx.ForKind.PARALLEL in kinds and tirx.ForKind.VECTORIZED in kinds
    data = np.random.default_rng(1).standard_normal((2, 64, 48)).astype("float32")
    np.testing.assert_allclose(_run(scheduled, [data], (2, 64, 48)),
                               _run(func, [data], (2, 64, 48)), rtol=1e-6)


def test_untuned_pool_inlines_its_padding_and_runs_its_spatial_loops_in_parallel():
    x = te.placeholder((1, 16, 28, 28), name="x")
    pool = topi.nn.pool2d(x, (3, 3), (2, 2), (1, 1), (1, 1, 1, 1), "max")
    func = te.create_prim_func([x, pool])
    sch = s_tir.Schedule(func)
    assert len(sch.get_child_blocks(sch.get_sblock("root"))) == 2  # pad, then the pool
    scheduled = untuned_schedule(func, make_target(None), cores=2)
    loops = loops_of(scheduled)
    assert loops[0].kind == tirx.ForKind.PARALLEL and int(loops[0].extent) >= ITEMS_PER_CORE * 2
    assert all(lp.kind == tirx.ForKind.SERIAL for lp in loops[-2:])  # the window: a reduction
    data = np.random.default_rng(2).standard_normal((1, 16, 28, 28)).astype("float32")
    np.testing.assert_array_equal(_run(scheduled, [data], (1, 16, 14, 14)),
                                  _run(func, [data], (1, 16, 14, 14)))


def test_untuned_leaves_what_neither_rule_fits():
    a = te.placeholder((64, 64), name="a")
    k = te.reduce_axis((0, 64), name="k")
    total = te.compute((1,), lambda i: te.sum(a[k, k], axis=k), name="trace")
    func = te.create_prim_func([a, total])  # no spatial loop to spread
    assert untuned_schedule(func, make_target(None), cores=2) is func


def test_wide_inner_loop_is_split_and_its_inner_part_vectorized():
    """A 512-wide innermost loop (BERT-tiny's GELU) is too wide to vectorize whole: its
    inner 64 are vectorized, the rest stays a serial loop; the numbers are unchanged."""
    x = te.placeholder((128, 512), name="x")
    y = te.compute((128, 512), lambda i, j: x[i, j] * 2.0, name="y")
    func = parallel_spatial(te.create_prim_func([x, y]), cores=2)
    loops = loops_of(func)
    assert [lp.kind for lp in loops] == [tirx.ForKind.PARALLEL, tirx.ForKind.SERIAL,
                                         tirx.ForKind.VECTORIZED]
    assert [int(lp.extent) for lp in loops] == [128, 8, 64]
    a = np.random.default_rng(0).standard_normal((128, 512)).astype("float32")
    np.testing.assert_array_equal(_run(func, [a], (128, 512)), a * 2)

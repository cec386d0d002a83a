"""Layout primitives and their inverses against independent numpy references."""

from __future__ import annotations

import math
import tracemalloc

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from altenv.layout import Layout, Window, random_layout
from altenv.layout import layout as layout_module

shapes = st.lists(st.integers(1, 6), min_size=1, max_size=4).map(tuple)
SETTINGS = settings(max_examples=60, deadline=None)


def rand(shape, seed=0):
    return np.random.default_rng(seed).uniform(0.5, 1.5, size=shape)


# ---------------------------------------------------------------- references
def ref_unfold(x: np.ndarray, dim: int, tile: int, stride: int) -> np.ndarray:
    """Overlapped tiles built element by element with Python loops."""
    size = x.shape[dim]
    tiles = math.ceil((size - tile) / stride) + 1
    moved = np.moveaxis(x, dim, -1)
    out = np.zeros(moved.shape[:-1] + (tiles, tile), dtype=x.dtype)
    for a in range(tiles):
        for b in range(tile):
            if a * stride + b < size:
                out[..., a, b] = moved[..., a * stride + b]
    return np.moveaxis(np.moveaxis(out, -2, dim), -1, dim + 1)


@SETTINGS
@given(shape=shapes, data=st.data())
def test_split_is_reshape(shape, data):
    dim = data.draw(st.integers(0, len(shape) - 1))
    size = shape[dim]
    f = data.draw(st.sampled_from([d for d in range(1, size + 1) if size % d == 0]))
    x = rand(shape)
    layout = Layout(shape).split(dim, [-1, f])
    expected = x.reshape(shape[:dim] + (size // f, f) + shape[dim + 1:])
    np.testing.assert_array_equal(layout.apply(x), expected)
    np.testing.assert_array_equal(layout.invert(expected), x)


@SETTINGS
@given(shape=shapes, data=st.data())
def test_reorder_is_transpose(shape, data):
    perm = data.draw(st.permutations(range(len(shape))))
    x = rand(shape)
    layout = Layout(shape).reorder(perm)
    np.testing.assert_array_equal(layout.apply(x), np.transpose(x, perm))
    assert layout.shape == tuple(shape[p] for p in perm)
    np.testing.assert_array_equal(layout.invert(np.transpose(x, perm)), x)


@SETTINGS
@given(shape=st.lists(st.integers(1, 5), min_size=2, max_size=4).map(tuple), data=st.data())
def test_fuse_is_reshape(shape, data):
    first = data.draw(st.integers(0, len(shape) - 2))
    last = data.draw(st.integers(first + 1, len(shape) - 1))
    x = rand(shape)
    layout = Layout(shape).fuse(list(range(first, last + 1)))
    fused = shape[:first] + (math.prod(shape[first:last + 1]),) + shape[last + 1:]
    np.testing.assert_array_equal(layout.apply(x), x.reshape(fused))
    np.testing.assert_array_equal(layout.invert(x.reshape(fused)), x)


@SETTINGS
@given(shape=shapes, data=st.data())
def test_unfold_and_fold(shape, data):
    dim = data.draw(st.integers(0, len(shape) - 1))
    size = shape[dim]
    tile = data.draw(st.integers(1, size))
    stride = data.draw(st.integers(1, tile))
    x = rand(shape)
    layout = Layout(shape).unfold(dim, tile, stride)
    phys = layout.apply(x)
    np.testing.assert_array_equal(phys, ref_unfold(x, dim, tile, stride))
    np.testing.assert_array_equal(layout.invert(phys), x)
    # fold is the inverse primitive: applying both is the identity on data
    both = layout.fold(dim, stride, size)
    assert both.shape == shape
    np.testing.assert_array_equal(both.apply(x), x)


@SETTINGS
@given(shape=shapes, data=st.data())
def test_pad_and_unpad(shape, data):
    dim = data.draw(st.integers(0, len(shape) - 1))
    before, after = data.draw(st.integers(0, 3)), data.draw(st.integers(0, 3))
    x = rand(shape)
    layout = Layout(shape).pad(dim, before, after)
    widths = [(0, 0)] * len(shape)
    widths[dim] = (before, after)
    np.testing.assert_array_equal(layout.apply(x), np.pad(x, widths))
    np.testing.assert_array_equal(layout.invert(np.pad(x, widths)), x)
    if before or after:
        np.testing.assert_array_equal(layout.unpad(dim, before, after).apply(x), x)


def test_store_at_attaches_bias_to_weight_columns():
    w, b = rand((5, 3)), rand((3,), 1)
    layout = Layout((5, 3), "KN").store_at(Layout((3,), "N"), 0).reorder([1, 0])
    phys = layout.apply(w, b)
    np.testing.assert_array_equal(phys, np.concatenate([w, b[None]], axis=0).T)
    np.testing.assert_array_equal(layout.invert(phys), w)
    np.testing.assert_array_equal(layout.detach(phys), b)
    undone = Layout((5, 3)).store_at(Layout((3,)), 0).decouple_at(0, 1)
    np.testing.assert_array_equal(undone.apply(w, b), w)


def test_store_at_with_a_guest_layout():
    w, g = rand((4, 6)), rand((2, 6), 2)
    guest = Layout((2, 6)).split(1, [3, 2]).reorder([0, 2, 1]).fuse([1, 2])  # permuted columns
    layout = Layout((4, 6)).store_at(guest, 0)
    phys = layout.apply(w, g)
    np.testing.assert_array_equal(phys, np.concatenate([w, guest.apply(g)], axis=0))
    np.testing.assert_array_equal(layout.detach(phys), g)


@settings(max_examples=80, deadline=None)
@given(shape=shapes, seed=st.integers(0, 10_000), steps=st.integers(1, 5))
def test_random_chains_round_trip_and_index_maps_agree(shape, seed, steps):
    rng = np.random.default_rng(seed)
    layout = random_layout(shape, rng, steps=steps)
    x = rand(shape, seed)
    phys = layout.apply(x)
    assert phys.shape == layout.shape
    np.testing.assert_array_equal(layout.invert(phys), x)
    # to_physical on scalar indices points at the same element
    for _ in range(5):
        idx = [int(rng.integers(s)) for s in shape]
        p, valid = layout.to_physical(idx)
        assert valid in (None, True)
        assert phys[tuple(int(v) for v in p)] == x[tuple(idx)]
    # to_logical of every physical position: valid positions hold that element, others zero
    pidx = [int(rng.integers(s)) for s in layout.shape]
    logical, valid = layout.to_logical(pidx)
    if valid is None or bool(valid):
        assert phys[tuple(pidx)] == x[tuple(int(v) for v in logical)]
    else:
        assert phys[tuple(pidx)] == 0
    assert Layout.from_json(layout.to_json()) == layout


def test_alt_example_nohw_to_n_o_ot_h_w_ot():
    """ALT §4.1.1: N O/ot H W ot from NOHW."""
    x = rand((1, 64, 6, 6))
    layout = Layout((1, 64, 6, 6), "NOHW").split(1, [-1, 16]).reorder([0, 1, 3, 4, 2])
    assert layout.shape == (1, 4, 6, 6, 16)
    assert layout.names == ("N", "O0", "H", "W", "O1")
    expected = x.reshape(1, 4, 16, 6, 6).transpose(0, 1, 3, 4, 2)
    np.testing.assert_array_equal(layout.apply(x), expected)


def test_eq1_window_reads_stay_in_one_tile():
    """ALT Eq. 1: tiles matching the windows read tile i // q at offset V*i + r - S*(i // q)."""
    stride, kernel, out_tile = 2, 3, 4
    tile, step = (out_tile - 1) * stride + kernel, out_tile * stride
    size = 21
    layout = Layout((size,)).unfold(0, tile, step)
    x = rand((size,))
    phys = layout.apply(x)
    for i in range((size - kernel) // stride + 1):
        for r in range(kernel):
            (a, b), valid = layout.to_physical([Window(i, r, stride, kernel)])
            assert valid is None
            assert a == i // out_tile and b == stride * i + r - step * (i // out_tile)
            assert phys[a, b] == x[stride * i + r]


def test_unfold_canonical_copy_for_plain_reads():
    layout = Layout((10,)).unfold(0, 4, 3)  # tiles [0..3] [3..6] [6..9]
    assert [layout.to_physical([i])[0] for i in (0, 3, 5, 9)] == [[0, 0], [1, 0], [1, 2], [2, 3]]


def test_past_the_end_positions_are_zero():
    layout = Layout((10,)).unfold(0, 4, 4)  # 3 tiles, the last holds 8, 9, 0, 0
    phys = layout.apply(np.arange(1, 11))
    np.testing.assert_array_equal(phys[2], [9, 10, 0, 0])
    assert layout.has_nontrivial_advanced()
    assert not Layout((10,)).unfold(0, 10, 1).has_nontrivial_advanced()


def test_state_concatenates_primitive_parameters():
    layout = Layout((1, 32, 8)).split(1, [2, 16]).unfold(3, 5, 3)
    assert layout.state() == [2, 16, 2, 5]


@pytest.mark.parametrize("call, message", [
    (lambda L: L.split(3, [2, 2]), "dim 3 out of range"),
    (lambda L: L.split(1, [3, -1]), "do not divide dim 1 of size 4"),
    (lambda L: L.split(1, [3, 2]), "multiply to 6, but dim 1 has size 4"),
    (lambda L: L.split(0, [-1, -1]), "at most one -1"),
    (lambda L: L.reorder([0, 0, 1]), "not a permutation"),
    (lambda L: L.reorder([0, 1]), "not a permutation"),
    (lambda L: L.fuse([0, 2]), "consecutive"),
    (lambda L: L.unfold(2, 6, 1), "tile 6 must be in 1..5"),
    (lambda L: L.unfold(2, 3, 0), "stride must be >= 1"),
    (lambda L: L.pad(1, -1, 0), "before/after must be >= 0"),
    (lambda L: L.fold(0, 1, 3), "not an unfold"),
    (lambda L: L.unpad(2, 3, 2), "cannot remove"),
    (lambda L: L.store_at(Layout((7,)), 0), "does not fit host shape"),
    (lambda L: L.apply(np.ones((2, 2))), "logical shape"),
])
def test_invalid_calls_raise_clear_errors(call, message):
    with pytest.raises(ValueError, match=message):
        call(Layout((3, 4, 5)))


def test_unfold_with_a_gap_skips_elements():
    """stride > tile: the elements between tiles are not stored (a strided 1x1 conv's
    input never reads them) and read back as zero."""
    x = np.arange(1.0, 11.0)
    layout = Layout((10,)).unfold(0, 2, 3)  # tiles [0, 1] [3, 4] [6, 7] [9, -]
    np.testing.assert_array_equal(layout.apply(x), [[1, 2], [4, 5], [7, 8], [10, 0]])
    np.testing.assert_array_equal(layout.invert(layout.apply(x)), [1, 2, 0, 4, 5, 0, 7, 8, 0, 10])
    assert layout.to_physical([2])[1] is False


def test_pad_makes_a_non_dividing_split_legal():
    x = rand((3, 10))
    layout = Layout((3, 10)).pad(1, 0, 2).split(1, [-1, 4])
    assert layout.shape == (3, 3, 4)
    np.testing.assert_array_equal(layout.invert(layout.apply(x)), x)


@pytest.mark.parametrize("shape", [(2, 6, 5, 4), (2, 16, 12, 12)])
@pytest.mark.parametrize("seed", range(6))
def test_conversion_func_matches_numpy(seed, shape):
    """Plain and as the network build schedules it for two cores (the larger shape is
    parallel)."""
    import tvm

    from altenv.graph.spatial import parallel_spatial
    from altenv.layout.convert import conversion_func

    rng = np.random.default_rng(seed)
    src, dst = random_layout(shape, rng, steps=3), random_layout(shape, rng, steps=3)
    x = rand(shape, seed).astype("float32")
    func = conversion_func(src, dst)
    if seed % 2:
        func = parallel_spatial(func, cores=2)
    lib = tvm.compile(func, target="llvm")
    a = tvm.runtime.tensor(src.apply(x))
    b = tvm.runtime.tensor(np.full(dst.shape, np.nan, dtype="float32"))
    lib["main"](a, b)
    np.testing.assert_array_equal(b.numpy(), dst.apply(x))


def test_conversion_between_different_tensors_is_an_error():
    from altenv.layout.convert import conversion_func

    with pytest.raises(ValueError, match="layouts of different tensors"):
        conversion_func(Layout((2, 3)), Layout((3, 2)))


def test_same_storage_is_equal_bytes() -> None:
    nchw = Layout((1, 96, 56, 56))
    unit_split = nchw.split(1, [1, 96]).split(0, [1, 1])  # (1, 1, 1, 96, 56, 56)
    blocked = nchw.split(1, [-1, 16]).reorder([0, 1, 3, 4, 2])
    data = np.random.default_rng(0).standard_normal(nchw.shape).astype("float32")
    assert unit_split.same_storage(nchw) and nchw.same_storage(unit_split)
    assert np.array_equal(unit_split.apply(data).ravel(), data.ravel())
    assert not blocked.same_storage(nchw)
    assert not nchw.pad(2, 1, 1).same_storage(nchw)
    assert not Layout((1, 96, 56, 57)).same_storage(nchw)


@settings(max_examples=40, deadline=None)
@given(shape=shapes, seed=st.integers(0, 10_000), steps=st.integers(1, 5),
       chunk=st.integers(1, 50))
def test_data_moves_chunk_by_chunk_as_in_one_piece(shape, seed, steps, chunk):
    layout = random_layout(shape, np.random.default_rng(seed), steps=steps)
    biased = Layout((5, 8)).store_at(Layout((8,)), 0).split(1, [-1, 2]).reorder([1, 0, 2])
    x, w, b = rand(shape, seed), rand((5, 8)), rand((8,), 1)
    whole, whole_biased = layout.apply(x), biased.apply(w, b)  # one chunk
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(layout_module, "CHUNK", chunk)
        np.testing.assert_array_equal(layout.apply(x), whole)
        np.testing.assert_array_equal(layout.invert(whole), x)
        np.testing.assert_array_equal(biased.apply(w, b), whole_biased)
        np.testing.assert_array_equal(biased.invert(whole_biased), w)
        np.testing.assert_array_equal(biased.detach(whole_biased), b)


def test_moving_data_needs_no_index_vectors_of_the_whole_tensor():
    """A convolution input with unfolded rows and blocked channels: apply and invert stay
    within a few times the tensor (whole-tensor index vectors were 8 bytes per dimension per
    element in each intermediate)."""
    x = rand((2, 64, 130, 130)).astype("float32")
    layout = Layout(x.shape, "NCHW").unfold(2, 10, 8).split(1, [-1, 16]).reorder(
        [0, 1, 2, 4, 3, 5])
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(layout_module, "CHUNK", 1 << 14)  # 162 chunks of the physical tensor
        tracemalloc.start()
        try:
            phys = layout.apply(x)
            back = layout.invert(phys)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    np.testing.assert_array_equal(back, x)
    assert peak < 4 * (phys.nbytes + back.nbytes), peak

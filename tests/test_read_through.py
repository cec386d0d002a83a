"""Staged conversions (:mod:`altenv.graph.read_through`): a convolution converting its input
inside, at a loop of its tuned schedule."""

from __future__ import annotations

import numpy as np
import tvm

from altenv.graph.read_through import fastest_chain, staged_variants
from altenv.layout import Layout
from altenv.measure.chains import kernel_module
from altenv.ops import generate
from altenv.target import make_target
from altenv.tuning import OpTask, freeze

SPEC = "c2d:N=1,I=12,O=8,H=6,W=6,KH=1,KW=1"


def test_staged_variants_at_misaligned_tiles_compute_the_same():
    """The template reads the input in blocks of 6 channels and these two sampled schedules
    split the reduction over the 12 input channels into tiles of 4, so a tile's channels
    may span two blocks: computed inside that loop, the stage's extents vary with the tile.
    Every distinct placement computes the operator's numbers from the input stored in
    blocks of 4 channels and 3 rows."""
    target = make_target("llvm")
    task = OpTask(SPEC, "llvm")
    factors = freeze({"ht": 2, "it": 6, "it_w": 6, "ot": 4, "ot_w": 4, "wt": 3})
    program = task.program(factors)
    assert program.layouts["data"].shape[-1] == 6
    stored = (Layout((1, 12, 6, 6)).split(1, [-1, 4]).split(3, [-1, 3])
              .reorder([0, 1, 3, 5, 4, 2]))
    staged = generate(SPEC, program.layouts, data_stage=(stored, program.layouts["data"]))
    rng = np.random.default_rng(2)
    x = rng.uniform(-1, 1, (1, 12, 6, 6)).astype("float32")
    w = rng.uniform(-1, 1, (8, 12, 1, 1)).astype("float32")
    expected = program.reference({"data": x, "weight": w})
    space = task.space(factors)
    counts = []
    for seed in (6, 9):
        schedule = space.decode(space.sample(1, seed=seed)[0])
        variants = staged_variants(staged.func.without_attr("global_symbol"), schedule.trace,
                                   target)
        counts.append(len(variants))
        for variant in variants.values():
            lib = tvm.compile(kernel_module(variant), target=target)
            args = [tvm.runtime.tensor(a) for a in (
                stored.apply(x), program.layouts["weight"].apply(w),
                np.zeros(program.layouts["out"].shape, "float32"))]
            lib["main"](*args)
            np.testing.assert_allclose(program.layouts["out"].invert(args[-1].numpy()),
                                       expected, rtol=1e-5, atol=1e-5)
    assert max(counts) >= 2


def test_fastest_chain_times_every_chain():
    """Every chain gets its median and the fastest key is the argmin."""
    target = make_target("llvm")
    small = generate("gmm:M=4,N=4,K=4").func.without_attr("global_symbol")
    large = generate("gmm:M=64,N=64,K=64").func.without_attr("global_symbol")
    best, medians = fastest_chain({"small": [small], "both": [small, large]}, target, rounds=2)
    assert set(medians) == {"small", "both"} and all(m > 0 for m in medians.values())
    assert best == min(medians, key=medians.__getitem__)


def test_a_variant_that_compiles_too_long_is_dropped(monkeypatch):
    """Variants are compiled in worker processes first; one that outlasts the build timeout
    (here every one: 1 ms) is dropped, and the choice goes on without it."""
    from altenv.graph import read_through

    task = OpTask(SPEC, "llvm")
    factors = freeze({"ht": 2, "it": 6, "it_w": 6, "ot": 4, "ot_w": 4, "wt": 3})
    program = task.program(factors)
    stored = Layout((1, 12, 6, 6)).split(1, [-1, 4]).reorder([0, 1, 3, 4, 2])
    func = generate(SPEC, program.layouts, data_stage=(stored, program.layouts["data"])).func
    space = task.space(factors)
    trace = space.decode(space.sample(1, seed=0)[0]).trace
    target = make_target("llvm")
    assert staged_variants(func.without_attr("global_symbol"), trace, target)
    monkeypatch.setattr(read_through, "_builder", None)
    monkeypatch.setattr(read_through, "BUILD_TIMEOUT", 0.001)
    try:
        assert staged_variants(func.without_attr("global_symbol"), trace, target) == {}
    finally:
        read_through._builder.shutdown()

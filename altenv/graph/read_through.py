"""Measured choice between converting a convolution's input and reading it as it is stored.

A complex call whose input is stored in another layout than the one its template reads
(the producer is itself a convolution, or a layout the propagation could not push into its
producer) either gets a conversion call first (pad and re-tile into the template's layout)
or reads the stored layout directly through guarded index maps
(:meth:`altenv.graph.lowering.ComplexLowering.read_through_layout`), with the task's tuned
schedule replayed on that variant. The second saves a pass over the tensor but may make
the convolution's own reads slower; :func:`reads_through_faster` times both alone, on the
build's target, interleaved.
"""

from __future__ import annotations

import tvm
from tvm import tirx

from altenv.graph.kernels import KernelChain
from altenv.target import target_cores, use_tvm_threads


def reads_through_faster(variant: tirx.PrimFunc, conversion: tirx.PrimFunc,
                         original: tirx.PrimFunc, target: tvm.target.Target,
                         rounds: int = 5) -> tuple[bool, float, float]:
    """Whether ``variant`` (the call reading its input as stored) is faster than
    ``conversion`` followed by ``original``; also the two median times in seconds."""
    from altenv.baselines.timing import time_interleaved  # baselines import the network

    use_tvm_threads(target_cores(target))
    stats = time_interleaved({"through": KernelChain([variant], target, 0),
                              "convert": KernelChain([conversion, original], target, 0)},
                             rounds=rounds, min_block_seconds=0.005, cooldown_seconds=0.002)
    through, convert = stats["through"].median, stats["convert"].median
    return through < convert, through, convert

"""Measured-trial budgets: one task's stages, and a model run's trials shared over its tasks.

A task's trials go to a joint stage (layouts and loops explored together) and a loop-only
stage (the best layout fixed), 30:70 as ALT §7 splits them. A model run first gives every
task a floor of a few batches, then shares the rest in proportion to a roofline estimate of
each task's latency, so that neither the memory-bound tasks nor the ones called once are
starved.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # a config holds a Budget and is read without torch
    from ..ops.operators import Operator

JOINT_SHARE = 0.3
"""The joint stage's share of a task's searched trials (ALT §7: 30:70)."""

TASK_FLOOR_BATCHES = 4
"""Measured batches every task of a model gets before the rest is split by its roofline
weight: split by FLOPs alone, ResNet-18's 1x1 downsample convolutions got 13 trials and its
classifier 8, and lost to MetaSchedule's, whose task scheduler gives every task at least
64."""

RIDGE_FLOPS_PER_BYTE = 5.0
"""Where tuned kernels turn memory-bound: about 200 GFLOP/s of the best convolutions over
about 40 GB/s of the best depthwise ones, measured on ResNet-18 and MobileNet-V2 runs on
the 2-core CI CPU (docs/tuning.md). Sizes a task's share of the budget."""


@dataclass(frozen=True)
class Budget:
    """Measured trials of the joint and the loop-only stage, and ``extra`` trials after
    them on the best layout (what a model run's task scheduler,
    :mod:`altenv.tuning.scheduler`, hands a task on top of its share)."""

    joint: int
    loop_only: int
    extra: int = 0

    @classmethod
    def split(cls, total: int, joint_fraction: float = JOINT_SHARE) -> Budget:
        """``total`` trials, ``joint_fraction`` of them (rounded) in the joint stage."""
        joint = round(total * joint_fraction)
        return cls(joint, total - joint)

    @property
    def total(self) -> int:
        return self.joint + self.loop_only + self.extra


def task_weight(op: Operator, calls: int) -> float:
    """A task's share of the budget, in proportion to a roofline estimate of its latency:
    ``max(FLOPs, RIDGE x bytes moved) x calls`` of its operator ``op``. FLOPs alone starve
    memory-bound tasks (MobileNet-V2's depthwise convolutions, the classifier GEMV)."""
    return max(float(op.flops()), RIDGE_FLOPS_PER_BYTE * op.traffic_bytes()) * calls


def task_budgets(weights: dict[str, float], total: int, minimum: int) -> dict[str, int]:
    """Split ``total`` trials over tasks: each gets ``minimum`` (when the total allows),
    the rest goes in proportion to ``weights`` (:func:`task_weight`)."""
    floor = min(minimum, total // max(len(weights), 1))
    rest = total - floor * len(weights)
    norm = sum(weights.values()) or 1.0
    shares = {t: floor + int(rest * w / norm) for t, w in weights.items()}
    leftover = total - sum(shares.values())
    for t in sorted(weights, key=weights.get, reverse=True)[:leftover]:
        shares[t] += 1
    return shares

"""A run's TensorBoard log (``<run>/tb``): best latency against measured trials, so a
long run can be watched while it tunes."""

from __future__ import annotations

import math
from pathlib import Path

from torch.utils.tensorboard import SummaryWriter

from ..tuning import TuningSession


class TensorBoardLog:
    """Tuning-loop callback: best latency (ms) against measured trials."""

    def __init__(self, log_dir: Path):
        self.writer = SummaryWriter(str(log_dir))

    def __call__(self, session: TuningSession) -> None:
        best = session.history[-1] if session.history else math.inf
        if math.isfinite(best):
            self.writer.add_scalar("tuning/best_latency_ms", best * 1e3, session.trials)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()

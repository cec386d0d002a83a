"""Models shipped with altenv: the pretrained PPO agent and its cross-workload cost model.

``altenv train configs/pretrain_ppo.yaml`` makes them (a measured corpus of drawn
workloads, a cost model fitted to it, a policy pretrained on cost-model rewards); the
result is copied here with its card (``ppo/card.json``, ``ppo/CARD.md``): the training
workloads, the CPU and TVM target it was measured on, the training time and a hash of
its files. Everything here is data (numpy arrays and JSON), loaded without unpickling.
"""

from __future__ import annotations

import functools
import hashlib
import json
import warnings
from pathlib import Path
from typing import Any

from ..costmodel import CostModel

PPO_CHECKPOINT = Path(__file__).resolve().parent / "ppo"
"""The shipped PPO checkpoint (``altenv.pretrained.ppo``)."""
CARD = "card.json"
COST_MODEL = "costmodel.npz"


def card(checkpoint: str | Path = PPO_CHECKPOINT) -> dict[str, Any] | None:
    """A checkpoint's card, ``None`` where there is none."""
    path = Path(checkpoint) / CARD
    return json.loads(path.read_text()) if path.exists() else None


def files_hash(checkpoint: str | Path, names: list[str]) -> str:
    """SHA-256 over the named files of a checkpoint, in the given order."""
    digest = hashlib.sha256()
    for name in names:
        digest.update(name.encode())
        digest.update((Path(checkpoint) / name).read_bytes())
    return digest.hexdigest()


@functools.lru_cache(maxsize=4)
def _load(path: str) -> CostModel:
    return CostModel.load(path)


def cost_model(checkpoint: str | Path = PPO_CHECKPOINT) -> CostModel | None:
    """The cross-workload cost model of a checkpoint (read once), ``None`` where the
    checkpoint has none."""
    path = Path(checkpoint) / COST_MODEL
    return _load(str(path)) if path.exists() else None


def host_mismatch(checkpoint: str | Path, target: Any) -> str | None:
    """Why a checkpoint may not fit ``target``: the CPU it was measured on differs
    (``None`` when it matches or the card names none)."""
    info = card(checkpoint)
    mine = str(getattr(target, "attrs", {}).get("mcpu", "")) if target is not None else ""
    theirs = (info or {}).get("mcpu", "")
    if not theirs or not mine or theirs == mine:
        return None
    return (f"the checkpoint {checkpoint} was trained on another CPU (mcpu={theirs}, this "
            f"target mcpu={mine}); it still works and fine-tunes on this one's measurements")


def warn_host_mismatch(checkpoint: str | Path, target: Any) -> None:
    """Warn once per checkpoint and target where :func:`host_mismatch` finds a reason."""
    reason = host_mismatch(checkpoint, target)
    if reason:
        warnings.warn(reason, stacklevel=3)

"""Models shipped with altenv: the pretrained PPO agent and its cross-workload cost model.

``altenv train configs/pretrain_ppo.yaml`` makes them (a measured corpus of drawn
workloads, a cost model fitted to it, a policy pretrained on cost-model rewards); the
result is copied to ``ppo/<mcpu>/`` with its card (``card.json``, ``CARD.md``): the
training workloads, the CPU and TVM target it was measured on, the training time and a
hash of its files. What measures fast depends on the CPU (16 float lanes with AVX-512,
8 with AVX2), so there is one checkpoint per CPU it was made on, and a run takes the one
for its target (:func:`ppo_checkpoint`). Everything here is data (numpy
arrays and JSON), loaded without unpickling.
"""

from __future__ import annotations

import functools
import hashlib
import json
import warnings
from pathlib import Path
from typing import Any

import tvm

from ..costmodel import CostModel
from ..files import MB, check_file, read_json
from ..target import make_target, vector_bits

PPO_CHECKPOINTS = Path(__file__).resolve().parent / "ppo"
"""The shipped PPO checkpoints, one folder per CPU (``mcpu``) they were made on."""
CARD = "card.json"
COST_MODEL = "costmodel.npz"
PRETRAINED = "pretrained"
"""The name agents' options give the shipped checkpoint for the run's CPU
(:func:`ppo_checkpoint`)."""


def card(checkpoint: str | Path | None = None) -> dict[str, Any] | None:
    """A checkpoint's card (``None``: the shipped one for this CPU), ``None`` where there
    is none."""
    checkpoint = ppo_checkpoint() if checkpoint is None else checkpoint
    path = Path(checkpoint) / CARD if checkpoint is not None else None
    if path is None or not check_file(path):
        return None
    data = read_json(path, MB)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: not a checkpoint card (the top level is not a mapping)")
    return data


def shipped(root: Path = PPO_CHECKPOINTS) -> list[Path]:
    """The shipped checkpoints (folders of ``root`` with a card), by name."""
    return sorted(p for p in root.iterdir() if (p / CARD).is_file()) if root.is_dir() else []


def ppo_checkpoint(target: Any = None, root: Path = PPO_CHECKPOINTS) -> Path | None:
    """The shipped checkpoint for ``target`` (``None``: this CPU): the one made on its
    ``mcpu``, else one made on a CPU with SIMD registers as wide, else the first;
    ``None`` where none is shipped."""
    return _choose(str(make_target(target)), root)


@functools.lru_cache(maxsize=16)
def _choose(target_json: str, root: Path) -> Path | None:
    candidates = shipped(root)
    if not candidates:
        return None
    target = tvm.target.Target(json.loads(target_json))
    cards = {path: card(path) or {} for path in candidates}
    mine = str(target.attrs.get("mcpu", ""))
    for path, info in cards.items():
        if mine and info.get("mcpu") == mine:
            return path
    if target.kind.name == "llvm":
        bits = vector_bits(target)
        for path, info in cards.items():
            if info.get("target") and vector_bits(
                    tvm.target.Target(json.loads(info["target"]))) == bits:
                return path
    return candidates[0]


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


def cost_model(checkpoint: str | Path | None = None) -> CostModel | None:
    """The cross-workload cost model of a checkpoint (``None``: the shipped one for this
    CPU), read once; ``None`` where the checkpoint has none."""
    checkpoint = ppo_checkpoint() if checkpoint is None else checkpoint
    if checkpoint is None:
        return None
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


def start_from(model: CostModel, checkpoint: str | Path, target: Any) -> Path | None:
    """Make ``model`` (a session's) continue from a checkpoint's cross-workload cost model:
    :data:`PRETRAINED` (the shipped one for ``target``) or a checkpoint directory. Warns
    where the checkpoint was made on another CPU; returns the checkpoint used
    (``None``: none is shipped for ``target``, and ``model`` is left as it is)."""
    path = ppo_checkpoint(target) if checkpoint == PRETRAINED else Path(checkpoint)
    base = cost_model(path) if path is not None else None
    if base is None:
        return None
    warn_host_mismatch(path, target)
    model.adopt(base)
    return path

"""Policy checkpoints as data: tensors in ``.npz`` and settings in JSON, never pickles.

stable-baselines3's ``.zip`` files hold cloudpickled objects, and loading one runs
whatever code it names; checkpoints travel with run directories, so altenv writes a
policy's ``state_dict`` as arrays (``policy.npz``) and its settings as JSON
(``policy.json``). Loading reads both with ``allow_pickle=False`` into a policy that the
loading code built itself from its own configuration; a checkpoint names nothing that
gets imported.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

POLICY = "policy.npz"
SETTINGS = "policy.json"
FORMAT = 1


def save_policy(policy: torch.nn.Module, path: str | Path, settings: dict[str, Any]) -> None:
    """Write ``policy``'s tensors and ``settings`` (plain JSON data) to directory ``path``."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    arrays = {k: v.detach().cpu().numpy() for k, v in policy.state_dict().items()}
    tmp = path / (POLICY + ".tmp")
    with open(tmp, "wb") as fh:
        np.savez(fh, **arrays)
    tmp.replace(path / POLICY)
    (path / SETTINGS).write_text(json.dumps({"format": FORMAT, **settings}, indent=1) + "\n")


def has_policy(path: str | Path) -> bool:
    return (Path(path) / POLICY).exists() and (Path(path) / SETTINGS).exists()


def load_policy(policy: torch.nn.Module, path: str | Path,
                expect: dict[str, Any]) -> dict[str, Any]:
    """Load the tensors at ``path`` into ``policy``; ``expect`` holds settings that must
    match the checkpoint's (spaces, policy class), else ``ValueError`` names the first
    that differs. Returns the checkpoint's settings."""
    path = Path(path)
    settings = json.loads((path / SETTINGS).read_text())
    if settings.get("format") != FORMAT:
        raise ValueError(f"{path}: checkpoint format {settings.get('format')!r}, this altenv "
                         f"reads {FORMAT}")
    for key, value in expect.items():
        if settings.get(key) != value:
            raise ValueError(f"{path}: the checkpoint's {key} is {settings.get(key)!r}, this "
                             f"agent's {value!r}; train a new checkpoint or configure the agent "
                             "as the checkpoint was")
    with np.load(path / POLICY, allow_pickle=False) as data:
        state = {k: torch.from_numpy(np.array(data[k])) for k in data.files}
    policy.load_state_dict(state)
    return settings

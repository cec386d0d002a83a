"""Policy checkpoints as data: tensors in ``.npz`` and settings in JSON, never pickles.

stable-baselines3's ``.zip`` files hold cloudpickled objects, and loading one runs
whatever code it names; checkpoints travel with run directories, so altenv writes a
policy's ``state_dict`` as arrays (``policy.npz``) and its settings as JSON
(``policy.json``). Loading reads both with ``allow_pickle=False`` into a policy that the
loading code built itself from its own configuration; a checkpoint names nothing that
gets imported.
"""

from __future__ import annotations

import io
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from altenv.files import MB, check_file, make_dir, read_bytes, read_json, replacing, write_json

POLICY = "policy.npz"
SETTINGS = "policy.json"
FORMAT = 1
POLICY_LIMIT = 256 * MB
"""Largest ``policy.npz`` read (the shipped policy is under 1 MB)."""


def save_policy(policy: torch.nn.Module, path: str | Path, settings: dict[str, Any]) -> None:
    """Write ``policy``'s tensors and ``settings`` (plain JSON data) to directory ``path``."""
    path = make_dir(path)
    arrays = {k: v.detach().cpu().numpy() for k, v in policy.state_dict().items()}
    with replacing(path / POLICY) as fh:
        np.savez(fh, **arrays)
    write_json(path / SETTINGS, {"format": FORMAT, **settings})


def has_policy(path: str | Path) -> bool:
    """Whether directory ``path`` holds a policy (both of its files; links refused)."""
    return check_file(Path(path) / POLICY) and check_file(Path(path) / SETTINGS)


def check_policy(path: str | Path, expect: dict[str, Any],
                 shapes: dict[str, tuple[int, ...]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The settings and arrays of the checkpoint in ``path``, checked as data before
    anything uses them: both files present and regular, the settings a JSON mapping of
    this :data:`FORMAT` agreeing with ``expect`` (spaces, policy class), and the arrays
    exactly the tensors ``shapes`` names, of those shapes and numeric. Anything else is a
    ``ValueError`` of one line naming the file and what differs."""
    path = Path(path)
    for name in (SETTINGS, POLICY):
        if not check_file(path / name):
            raise ValueError(f"checkpoint {path}: no {name}; a checkpoint holds {SETTINGS} "
                             f"and {POLICY} (written by altenv train or a run's checkpoint/)")
    settings = read_json(path / SETTINGS, MB)
    if not isinstance(settings, dict):
        raise ValueError(f"{path / SETTINGS}: not a checkpoint's settings (the top level is "
                         "not a mapping)")
    if settings.get("format") != FORMAT:
        raise ValueError(f"{path / SETTINGS}: checkpoint format {settings.get('format')!r}, "
                         f"this altenv reads {FORMAT}")
    for key, value in expect.items():
        if settings.get(key) != value:
            raise ValueError(f"{path / SETTINGS}: the checkpoint's {key} is "
                             f"{settings.get(key)!r}, this agent's {value!r}; train a new "
                             "checkpoint or configure the agent as the checkpoint was")
    raw = read_bytes(path / POLICY, POLICY_LIMIT)
    if not zipfile.is_zipfile(io.BytesIO(raw)):
        raise ValueError(f"{path / POLICY}: not an npz archive")
    try:
        with np.load(io.BytesIO(raw), allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as err:
        raise ValueError(f"{path / POLICY}: not an npz of arrays "
                         f"({' '.join(str(err).split())[:120]})") from None
    missing, extra = sorted(set(shapes) - set(arrays)), sorted(set(arrays) - set(shapes))
    if missing or extra:
        raise ValueError(f"{path / POLICY}: " + (f"no tensor {missing[0]}" if missing else
                         f"a tensor {extra[0]} the policy does not have")
                         + f" ({len(missing)} missing, {len(extra)} extra)")
    for name, shape in shapes.items():
        array = arrays[name]
        if tuple(array.shape) != tuple(shape) or array.dtype.kind not in "fiub":
            raise ValueError(f"{path / POLICY}: {name} is {array.dtype} {tuple(array.shape)}, "
                             f"the policy's is {tuple(shape)}")
    return settings, arrays


def load_policy(policy: torch.nn.Module, path: str | Path,
                expect: dict[str, Any]) -> dict[str, Any]:
    """Load the tensors at ``path`` into ``policy`` once :func:`check_policy` passed;
    returns the checkpoint's settings."""
    shapes = {k: tuple(v.shape) for k, v in policy.state_dict().items()}
    settings, arrays = check_policy(path, expect, shapes)
    policy.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in arrays.items()})
    return settings

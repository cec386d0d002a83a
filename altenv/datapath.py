"""Where datasets are found, and ``altenv://<dataset>/<workload>`` URIs resolved to specs.

A workload of a dataset is named by URI wherever a spec string is accepted (configs, the
command line, the environments), as CompilerGym names its benchmarks. A dataset name is
looked up in the directories of ``ALTENV_DATASETS`` (``os.pathsep``-separated), then
among the shipped datasets (``altenv/dataset/shipped/``). Resolving reads the dataset's
``card.json`` only (JSON: no code of the dataset's runs).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

SCHEME = "altenv://"
SHIPPED = Path(__file__).parent / "dataset" / "shipped"
"""The datasets that come with altenv."""
DEFAULT_DATASET = "cpu-v0"
"""The shipped dataset an env draws from when given no workload."""


def search_path() -> list[Path]:
    extra = [Path(p) for p in os.environ.get("ALTENV_DATASETS", "").split(os.pathsep) if p]
    return [*extra, SHIPPED]


def dataset_dir(name_or_path: str | Path) -> Path:
    """A dataset's directory from its path or its name; ``ValueError`` naming what exists."""
    path = Path(name_or_path)
    if (path / "card.json").is_file():
        return path
    for root in search_path():
        if (root / str(name_or_path) / "card.json").is_file():
            return root / str(name_or_path)
    known = sorted({p.parent.name for root in search_path() if root.is_dir()
                    for p in root.glob("*/card.json")})
    raise ValueError(f"dataset {str(name_or_path)!r}: not a dataset directory nor a known "
                     f"dataset; known: {', '.join(known) or 'none'} (ALTENV_DATASETS adds "
                     "directories)")


def resolve_uri(uri: str) -> str:
    """The spec string of ``altenv://<dataset>/<workload>``."""
    name, _, workload = uri[len(SCHEME):].partition("/")
    if not name or not workload:
        raise ValueError(f"workload {uri!r}: a dataset URI is altenv://<dataset>/<workload>")
    card = json.loads((dataset_dir(name) / "card.json").read_text())
    for entry in card.get("workloads", []):
        if entry.get("name") == workload:
            return str(entry["spec"])
    names = [e.get("name") for e in card.get("workloads", [])]
    shown = ", ".join(names[:8]) + (", ..." if len(names) > 8 else "")
    raise ValueError(f"workload {uri!r}: dataset {name!r} has no workload {workload!r}; "
                     f"it has {shown or 'none'}")

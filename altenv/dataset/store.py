"""A measured-program dataset on disk: one Parquet file per workload, read lazily.

A replay or a surrogate needs one workload's programs at a time, and a dataset grows one
workload at a time while it is collected; so each workload is its own Parquet file
(``programs/<name>.parquet``) whose schema metadata holds the workload's description, and
the dataset's ``card.json`` lists them. Opening a :class:`Dataset` reads the card only; a
workload's rows are read when asked for, without the rest. Nothing here imports TVM: a
replay environment steps on these tables alone.

Schema of a program row (:data:`PROGRAM_SCHEMA`):

============== ===================== ===================================================
column         type                  meaning
============== ===================== ===================================================
layout         int32                 index into the workload's ``layouts`` metadata
origin         string                ``sample`` (MetaSchedule's sampling of the layout's
                                     design space), ``search`` (a mutant of the layout's
                                     fastest sampled programs: a short evolutionary step)
                                     ``best`` (among the fastest new programs of a real
                                     search) or ``trial`` (one of that search's other
                                     trials, with the one timing it took)
decisions      list<int32>           the loop-space point (``LoopSpace.to_vector``)
encoding       list<float32>         ``LoopSpace.encode`` of that point, in [0, 1]
features       list<uint8>           mean and max over stores of the program's features
                                     (``altenv.costmodel.feature_summary``) x 255
latencies      list<float64>         seconds, one per interleaved timing round (>= 5;
                                     a ``trial`` row's: the search's one timing); empty
                                     if the program failed
latency        float64               median of ``latencies`` (``inf`` if it failed)
error          string (nullable)     why it failed (build, crash, timeout, wrong result)
reference      float64               the reference kernel's latest latency (s) when this
                                     program was timed: drift of the host shows here
timestamp      float64               Unix time of the measurement
build_seconds  float64               compile time
============== ===================== ===================================================

Workload metadata (the Parquet schema's ``altenv`` key, JSON): ``name``, ``spec``,
``epilogue``, ``target``, ``knobs`` (template knob names and extents), ``layouts`` (one
entry per layout index: ``factors``, ``framework`` (the untiled layout MetaSchedule tunes),
``subspaces`` (the loop space's kind, size and directions per subspace)),
``workload_features``, ``flops`` and, once searched, ``search`` (``agent``, ``trials``
asked, ``measured``, ``bests`` and ``trial_rows`` kept).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ..ops.workload import parse_workload

PROGRAM_SCHEMA = pa.schema([
    ("layout", pa.int32()),
    ("origin", pa.string()),
    ("decisions", pa.list_(pa.int32())),
    ("encoding", pa.list_(pa.float32())),
    ("features", pa.list_(pa.uint8())),
    ("latencies", pa.list_(pa.float64())),
    ("latency", pa.float64()),
    ("error", pa.string()),
    ("reference", pa.float64()),
    ("timestamp", pa.float64()),
    ("build_seconds", pa.float64()),
])
REFERENCE_SCHEMA = pa.schema([("timestamp", pa.float64()), ("latency", pa.float64())])
META_KEY = b"altenv"
CARD = "card.json"
PROGRAMS = "programs"


@dataclass
class WorkloadData:
    """One workload's programs as numpy arrays, with its description (``meta``)."""

    meta: dict[str, Any]
    table: pa.Table

    @property
    def name(self) -> str:
        return str(self.meta["name"])

    @property
    def spec(self) -> str:
        return str(self.meta["spec"])

    @property
    def layouts(self) -> list[dict[str, Any]]:
        return list(self.meta["layouts"])

    def __len__(self) -> int:
        return self.table.num_rows

    @cached_property
    def layout(self) -> np.ndarray:
        return self.table.column("layout").to_numpy()

    @cached_property
    def latency(self) -> np.ndarray:
        """Median latency (s) per program, ``inf`` where it failed."""
        return self.table.column("latency").to_numpy()

    @cached_property
    def latencies(self) -> list[np.ndarray]:
        """Every program's timings (s), one per interleaved round."""
        return [np.asarray(v, dtype=np.float64) for v in self.table.column("latencies").to_pylist()]

    @cached_property
    def decisions(self) -> list[tuple[int, ...]]:
        return [tuple(v) for v in self.table.column("decisions").to_pylist()]

    @cached_property
    def encoding(self) -> list[np.ndarray]:
        return [np.asarray(v, dtype=np.float32) for v in self.table.column("encoding").to_pylist()]

    @cached_property
    def features(self) -> np.ndarray:
        """``(programs, 2 * FEATURE_LENGTH)`` float32 feature summaries in [0, 1]."""
        rows = self.table.column("features").to_pylist()
        width = max((len(r) for r in rows), default=0)
        out = np.zeros((len(rows), width), dtype=np.float32)
        for i, r in enumerate(rows):
            out[i, :len(r)] = np.asarray(r, dtype=np.float32) / 255.0
        return out

    @cached_property
    def origin(self) -> np.ndarray:
        """Where each program came from (``sample``, ``search``, ``best``, ``trial``)."""
        return np.asarray(self.table.column("origin").to_pylist())

    @property
    def best(self) -> float:
        """The fastest program's median latency (s) over the programs timed in interleaved
        rounds (a ``trial`` row's one timing may be a lucky one): the reference of regret."""
        timed = self.latency[(self.origin != "trial") & np.isfinite(self.latency)]
        return float(timed.min()) if timed.size else math.inf

    def framework_layout(self) -> int:
        """Index of the framework layout (the one MetaSchedule tunes)."""
        return next(i for i, lay in enumerate(self.layouts) if lay.get("framework"))


def program_table(rows: Sequence[Mapping[str, Any]], meta: Mapping[str, Any]) -> pa.Table:
    """Rows (dicts of :data:`PROGRAM_SCHEMA`'s columns) as a table carrying ``meta``."""
    columns = {f.name: [r[f.name] for r in rows] for f in PROGRAM_SCHEMA}
    schema = PROGRAM_SCHEMA.with_metadata({META_KEY: json.dumps(meta, sort_keys=True)})
    return pa.Table.from_pydict(columns, schema=schema)


def write_atomic(table: pa.Table, path: Path) -> None:
    """Write ``table`` to ``path`` through a temporary file and a rename, so a killed
    writer leaves the old file or the new one, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    pq.write_table(table, tmp, compression="zstd")
    os.replace(tmp, path)


def write_json_atomic(obj: Any, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(obj, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, path)


@dataclass
class Dataset:
    """A dataset directory: ``card.json``, ``programs/<workload>.parquet`` and
    ``reference.parquet``. Only the card is read on opening.

    Parameters
    ----------
    path:
        The dataset directory.
    """

    path: Path
    card: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def open(cls, path: str | Path) -> Dataset:
        path = Path(path)
        card_path = path / CARD
        if not card_path.is_file():
            raise FileNotFoundError(f"dataset {path}: no {CARD} (not a dataset directory)")
        return cls(path, json.loads(card_path.read_text()))

    @property
    def name(self) -> str:
        return str(self.card.get("name", self.path.name))

    def workloads(self) -> list[str]:
        """Names of the workloads whose programs are in the dataset, in collection order."""
        return [w["name"] for w in self.card.get("workloads", [])
                if (self.path / PROGRAMS / f"{w['name']}.parquet").is_file()]

    def spec_of(self, name: str) -> str:
        for w in self.card.get("workloads", []):
            if w["name"] == name:
                return str(w["spec"])
        raise KeyError(name)

    def name_of(self, key: str) -> str | None:
        """The collected workload whose spec is ``key`` (a records key: specs are compared
        parsed, so their spelling does not matter; a key with an epilogue matches none,
        since a dataset times operators alone), ``None`` if there is none."""
        name = self._names.get(key)  # one file looked at, not every workload's: a replay
        return name if name and (self.path / PROGRAMS / f"{name}.parquet").is_file() else None

    @cached_property
    def _names(self) -> dict[str, str]:
        return {str(parse_workload(w["spec"])): w["name"] for w in self.card.get("workloads", [])}

    def meta(self, name: str) -> dict[str, Any]:
        """A workload's description, read from its file's footer only."""
        schema = pq.read_schema(self._file(name))
        return json.loads(schema.metadata[META_KEY])

    def load(self, name: str) -> WorkloadData:
        """One workload's programs; the other workloads' files are not read."""
        table = pq.read_table(self._file(name))
        return WorkloadData(json.loads(table.schema.metadata[META_KEY]), table)

    def __iter__(self) -> Iterator[WorkloadData]:
        for name in self.workloads():
            yield self.load(name)

    def reference(self) -> pa.Table | None:
        """The reference kernel's timings over the collection (``None`` if absent)."""
        path = self.path / "reference.parquet"
        return pq.read_table(path) if path.is_file() else None

    def _file(self, name: str) -> Path:
        path = self.path / PROGRAMS / f"{name}.parquet"
        if not path.is_file():
            raise KeyError(f"dataset {self.name}: no workload {name!r}; it has "
                           f"{', '.join(self.workloads()) or 'none'}")
        return path

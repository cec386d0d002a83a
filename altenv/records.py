"""Records database: every measurement appended durably to a JSON-lines file.

One line per measured candidate, written with flush + fsync, so a run killed at any
point (even SIGKILL) keeps every completed record. Every line is validated when the file
is opened (fields, types, possible values). A torn last line (a write cut off by a kill:
no newline) is moved to ``<name>.rejected.jsonl`` with a warning; any other bad line stops
the run with a :class:`CorruptRecordsError` naming file and line, unless the database is
opened with ``repair``, which moves bad lines there too and goes on. Records files from
elsewhere are data: nothing in them is executed.
Each record carries a candidate key (hash of workload, target, layouts and schedule) so
a resumed run never measures the same candidate twice. A line ``{"final": ...}`` holds a
workload's finalists re-timed side by side at the end of its tuning (:class:`Final`); the
fastest of them is the workload's best while no later record follows. Records import
from and export to MetaSchedule's ``JSONDatabase``. TVM is imported only by those two
functions, so the database itself loads in milliseconds (resume scripts, report tools).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import statistics
import threading
import time
import warnings
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from .errors import UserError
from .files import MB, check_file, make_dir, open_append, read_bytes, replacing

if TYPE_CHECKING:
    from tvm.ir import IRModule
    from tvm.s_tir.meta_schedule.database import JSONDatabase
    from tvm.tirx import PrimFunc

RECORDS_LIMIT = 1024 * MB
"""Largest records file read (a 2,000-trial network run writes about 20 MB)."""

# MetaSchedule stores failed candidates with this sentinel run time.
_MS_FAILED_SECONDS = 1e9


def plain_json(obj: Any) -> Any:
    """Turn TVM containers and immediates (Array, Map, IntImm, FloatImm, String) from
    e.g. ``Trace.as_json()`` into plain Python JSON values."""
    if obj is None or isinstance(obj, bool | int | float):
        return obj
    if isinstance(obj, str):
        return str(obj)
    if hasattr(obj, "items"):
        return {str(k): plain_json(v) for k, v in obj.items()}
    if hasattr(obj, "value"):
        return plain_json(obj.value)
    if isinstance(obj, Iterable):
        return [plain_json(x) for x in obj]
    raise TypeError(f"not JSON-able: {type(obj).__name__}")


def target_string(target: Any) -> str:
    """A target as stored in records: TVM's JSON text of the target (strings pass through)."""
    return target if isinstance(target, str) else str(target)


def candidate_key(
    workload: str,
    target: Any,
    layouts: Mapping[str, Any],
    trace: Any,
    decisions: Iterable[Any],
) -> str:
    """Stable hash identifying a candidate: same inputs, same key, in any process."""
    payload = [workload, target_string(target), plain_json(layouts), plain_json(trace),
               plain_json(list(decisions))]
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


class Timed:
    """``ok`` and ``median`` of a measurement with ``latencies`` and an ``error``."""

    latencies: list[float]
    error: str | None

    @property
    def ok(self) -> bool:
        """Whether the candidate was measured successfully."""
        return self.error is None and bool(self.latencies)

    @property
    def median(self) -> float:
        """Median latency in seconds; ``inf`` when it failed."""
        return statistics.median(self.latencies) if self.ok else math.inf


class Measurement(Protocol):
    """What :meth:`RecordDB.add_result` records of a measurement
    (:class:`altenv.measure.MeasureResult` is one; records sit below measurement)."""

    latencies: list[float]
    error: str | None
    build_seconds: float
    run_seconds: float


@dataclass
class Record(Timed):
    """One measured candidate.

    Parameters
    ----------
    workload : str
        Workload key, e.g. ``"c2d:N=1,I=64,..."`` or a task name and hash.
    target : str
        Target the candidate was built for (TVM's JSON text).
    layouts : dict
        Opaque JSON description of the tensors' layouts.
    trace : Any
        MetaSchedule trace as JSON (``plain_json(trace.as_json())``), or ``None``.
    decisions : list
        Loop-space decision vector.
    latencies : list[float]
        Measured seconds per run; empty when the candidate failed.
    error : str | None
        Failure reason, ``None`` on success.
    key : str
        :func:`candidate_key` of the fields above.
    timestamp : float
        Unix time of the measurement.
    build_seconds, run_seconds : float
        Time spent building and running the candidate.
    """

    workload: str
    target: str
    layouts: dict[str, Any]
    trace: Any
    decisions: list[Any]
    latencies: list[float]
    error: str | None
    key: str
    timestamp: float = field(default_factory=time.time)
    build_seconds: float = 0.0
    run_seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        """The JSON object written as one line (schedule nested as trace + decisions)."""
        data = asdict(self)
        data["schedule"] = {"trace": data.pop("trace"), "decisions": data.pop("decisions")}
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Record:
        """Inverse of :meth:`to_json`."""
        data = dict(data)
        schedule = data.pop("schedule")
        return cls(trace=schedule["trace"], decisions=schedule["decisions"], **data)


@dataclass
class Final:
    """The finalists of a workload, re-timed side by side once its tuning ended.

    Parameters
    ----------
    workload : str
        Workload key.
    keys : list[str]
        Candidate keys of the finalists (fastest at tuning time first).
    latencies : list[float]
        Re-timed median seconds of each finalist (``inf`` where it failed).
    trials : int
        Records of the workload when the finalists were re-timed; a later record makes the
        re-timing stale.
    cold : bool
        Whether the finalists were timed with their weights flushed from the CPU caches
        before each call (as a network runs them) rather than warm.
    timestamp : float
        Unix time of the re-timing.
    """

    workload: str
    keys: list[str]
    latencies: list[float]
    trials: int
    cold: bool = False
    timestamp: float = field(default_factory=time.time)

    @property
    def winner(self) -> tuple[str, float]:
        """Key and re-timed latency of the fastest finalist."""
        i = min(range(len(self.keys)), key=lambda j: self.latencies[j])
        return self.keys[i], self.latencies[i]


class CorruptRecordsError(UserError):
    """A records file holds a line that is not a record; the message names the file and
    line, what is wrong and how to go on."""


class RecordsRepaired(UserWarning):
    """Lines of a records file were moved to its rejected file."""


_Seconds = Annotated[float, Field(ge=0, allow_inf_nan=False)]
_Latency = Annotated[float, Field(gt=0, lt=86400, allow_inf_nan=False)]  # under a day


class _Line(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class _Schedule(_Line):
    trace: Any
    decisions: list[Any]


class _RecordLine(_Line):
    """What a record line must hold (:meth:`Record.to_json`)."""

    workload: str = Field(min_length=1)
    target: str
    layouts: dict[str, Any]
    schedule: _Schedule
    latencies: list[_Latency]
    error: str | None
    key: str = Field(pattern=r"^[0-9a-f]{32}$")
    timestamp: _Seconds = 0.0
    build_seconds: _Seconds = 0.0
    run_seconds: _Seconds = 0.0


class _FinalFields(_Line):
    workload: str = Field(min_length=1)
    keys: list[str] = Field(min_length=1)
    latencies: list[Annotated[float, Field(gt=0)]]  # inf: the finalist failed
    trials: int = Field(ge=1)
    cold: bool = False
    timestamp: _Seconds = 0.0

    @model_validator(mode="after")
    def _one_latency_each(self) -> _FinalFields:
        if len(self.keys) != len(self.latencies):
            raise ValueError(f"{len(self.keys)} keys but {len(self.latencies)} latencies")
        return self


class _FinalLine(_Line):
    final: _FinalFields


def _problem(err: ValidationError) -> str:
    """The first problem of a line, in one phrase: where and what."""
    first = err.errors()[0]
    where = ".".join(str(p) for p in first["loc"])
    msg = first["msg"].removeprefix("Value error, ")
    return f"{where}: {msg}" if where else msg


@dataclass
class _Bad:
    number: int
    text: bytes
    reason: str


class RecordDB:
    """Append-only JSON-lines database of measurements, indexed in memory.

    Parameters
    ----------
    path : str | Path
        The ``.jsonl`` file; created (with its folder) when missing. One writer at a time
        (runs hold a :class:`~altenv.lock.DirLock` on their directory).
    repair : bool
        Move bad lines to :attr:`rejected_path` and go on, instead of raising
        :class:`CorruptRecordsError` (a torn last line is always moved, with a warning).
    """

    def __init__(self, path: str | Path, repair: bool = False) -> None:
        self.path = Path(path)
        self.repair = repair
        self._writing = threading.Lock()
        make_dir(self.path.parent)
        self._load()
        self._file = open_append(self.path)

    @property
    def rejected_path(self) -> Path:
        """Where bad lines go: ``records.jsonl`` -> ``records.rejected.jsonl``."""
        return self.path.with_name(f"{self.path.stem}.rejected{self.path.suffix}")

    def _load(self) -> None:
        self._records: list[Record] = []
        self._lines: list[int] = []  # the line number of each record
        self._by_key: dict[str, Record] = {}
        self._finals: dict[str, Final] = {}
        self._next_line = 1
        if not check_file(self.path):
            return
        raw = read_bytes(self.path, RECORDS_LIMIT)
        lines = raw.split(b"\n")  # the last item is what follows the last newline
        bad = []
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            reason = self._parse(line, number)
            if reason is not None:
                torn = number == len(lines)
                bad.append(_Bad(number, line, "cut off (a killed write)" if torn else reason))
        hard = [b for b in bad if b.number != len(lines)]
        if hard and not self.repair:
            more = f" (and {len(hard) - 1} more bad lines)" if len(hard) > 1 else ""
            raise self.corrupt(hard[0].number, f"not a record: {hard[0].reason}{more}")
        if bad:
            self._set_aside(lines, bad)
            return
        if raw and not raw.endswith(b"\n"):  # a whole record whose newline was not out
            with open_append(self.path) as f:
                f.write("\n")
                f.flush()
                os.fsync(f.fileno())
            raw += b"\n"
        self._next_line = raw.count(b"\n") + 1

    def _parse(self, line: bytes, number: int) -> str | None:
        """Index one line; what is wrong with it, ``None`` if nothing."""
        try:
            data = json.loads(line)
        except ValueError as err:
            return f"not JSON ({err})"
        except RecursionError:
            return "not JSON (nested too deep)"
        try:
            if isinstance(data, dict) and "final" in data:
                _FinalLine.model_validate(data)
                final = Final(**data["final"])
                unknown = [k for k in final.keys if k not in self._by_key]
                if unknown:
                    return f"final: keys without an earlier record ({unknown[0]})"
                self._finals[final.workload] = final
            else:
                _RecordLine.model_validate(data)
                record = Record.from_json(data)
                key = candidate_key(record.workload, record.target, record.layouts,
                                    record.trace, record.decisions)
                if key != record.key:
                    return (f"key {record.key} is not the key of its content ({key}); the "
                            "line was edited or written by something else")
                if key in self._by_key:
                    return f"the candidate of line {self.line_of(self._by_key[key])} again"
                self._index(record, number)
        except ValidationError as err:
            return _problem(err)
        return None

    def _set_aside(self, lines: Sequence[bytes], bad: Sequence[_Bad]) -> None:
        """Move ``bad`` lines to :attr:`rejected_path` (durably, first), rewrite the file
        without them, index it again and warn."""
        with open_append(self.rejected_path, binary=True) as f:
            f.writelines(b.text + b"\n" for b in bad)
            f.flush()
            os.fsync(f.fileno())
        dropped = {b.number for b in bad}
        with replacing(self.path, durable=True) as f:
            f.writelines(line + b"\n" for number, line in enumerate(lines, 1)
                         if line.strip() and number not in dropped)
        what = "; ".join(f"line {b.number}: {b.reason}" for b in bad[:3])
        more = f"; and {len(bad) - 3} more" if len(bad) > 3 else ""
        warnings.warn(RecordsRepaired(f"{self.path}: moved {len(bad)} bad line(s) to "
                                      f"{self.rejected_path} ({what}{more})"), stacklevel=3)
        self._load()

    def corrupt(self, number: int, reason: str) -> CorruptRecordsError:
        """The error of bad line ``number``: file, line, what is wrong, how to go on."""
        return CorruptRecordsError(
            f"{self.path}:{number}: {reason}; to resume without it, run the same command "
            f"with --repair (bad lines move to {self.rejected_path}), or fix or delete the line")

    def line_of(self, record: Record) -> int:
        """The line of ``record`` in the file (1-based)."""
        return next(n for r, n in zip(self._records, self._lines) if r is record)

    def reject(self, bad: Sequence[tuple[Record, str]]) -> None:
        """Move records that turned out unusable (with a reason each, e.g. not a candidate
        of their workload) to :attr:`rejected_path`, as ``repair`` does with bad lines."""
        self._file.close()
        lines = read_bytes(self.path, RECORDS_LIMIT).split(b"\n")
        self._set_aside(lines, [_Bad(n, lines[n - 1], reason) for n, reason in
                                sorted((self.line_of(r), reason) for r, reason in bad)])
        self._file = open_append(self.path)

    def keep_only(self, workloads: Collection[str], what: str) -> None:
        """Refuse records of workloads other than ``workloads`` (those ``what``, a phrase
        such as ``"run x"``, tunes), naming the first one's line; with ``repair`` they
        move to :attr:`rejected_path` instead."""
        foreign = [(r, f"a record of {r.workload}, which {what} does not tune")
                   for r in self._records if r.workload not in workloads]
        if foreign and not self.repair:
            record, reason = foreign[0]
            raise self.corrupt(self.line_of(record), reason)
        if foreign:
            self.reject(foreign)

    def _index(self, record: Record, line: int) -> None:
        self._records.append(record)
        self._lines.append(line)
        self._by_key[record.key] = record

    def _append(self, data: Mapping[str, Any]) -> None:
        self._file.write(json.dumps(data, separators=(",", ":")) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())
        self._next_line += 1

    def add(self, record: Record) -> Record:
        """Append ``record`` durably (flush + fsync) and index it (one writer: the sessions
        of a network tuning in several threads take turns)."""
        with self._writing:
            line = self._next_line
            self._append(record.to_json())
            self._index(record, line)
        return record

    def add_final(self, final: Final) -> Final:
        """Append a workload's re-timed finalists durably; it replaces an earlier one."""
        unknown = [k for k in final.keys if k not in self._by_key]
        if unknown or len(final.keys) != len(final.latencies) or not final.keys:
            raise ValueError(f"finalists of {final.workload}: keys without records or "
                             f"without a latency each ({unknown or final.keys})")
        with self._writing:
            self._append({"final": asdict(final)})
            self._finals[final.workload] = final
        return final

    def final(self, workload: str) -> Final | None:
        """The workload's re-timed finalists, ``None`` if there are none, or if records of
        the workload came after them, or if none of them ran."""
        final = self._finals.get(workload)
        if final is None or final.trials != self.count(workload) \
                or not math.isfinite(final.winner[1]):
            return None
        return final

    def add_result(
        self,
        workload: str,
        target: Any,
        layouts: Mapping[str, Any],
        trace: Any,
        decisions: Iterable[Any],
        result: Measurement,
    ) -> Record:
        """Record a :class:`~altenv.measure.MeasureResult` of a candidate; ``trace`` is a
        MetaSchedule ``Trace``, its ``as_json()``, or ``None``."""
        if hasattr(trace, "as_json"):
            trace = trace.as_json()
        layouts, trace, decisions = plain_json(layouts), plain_json(trace), plain_json(
            list(decisions))
        return self.add(Record(
            workload=workload,
            target=target_string(target),
            layouts=layouts,
            trace=trace,
            decisions=decisions,
            latencies=list(result.latencies),
            error=result.error,
            key=candidate_key(workload, target, layouts, trace, decisions),
            build_seconds=result.build_seconds,
            run_seconds=result.run_seconds,
        ))

    def has(self, key: str) -> bool:
        """Whether a candidate with this key was measured already."""
        return key in self._by_key

    def seen_keys(self) -> set[str]:
        """Keys of every measured candidate."""
        return set(self._by_key)

    def records(self, workload: str | None = None) -> list[Record]:
        """All records, or those of one workload, in measurement order."""
        return [r for r in self._records if workload is None or r.workload == workload]

    def workloads(self) -> list[str]:
        """Workload keys in order of first appearance."""
        return list(dict.fromkeys(r.workload for r in self._records))

    def best(self, workload: str) -> Record | None:
        """The winner of the workload's re-timed finalists (:meth:`final`) if they are
        current, else the successful record of minimal median latency; ``None`` if there
        is none."""
        final = self.final(workload)
        if final is not None:
            return self._by_key[final.winner[0]]
        ok = [r for r in self._records if r.workload == workload and r.ok]
        return min(ok, key=lambda r: r.median) if ok else None

    def count(self, workload: str | None = None) -> int:
        """Number of records (of one workload)."""
        return len(self.records(workload))

    def __len__(self) -> int:
        return len(self._records)

    def close(self) -> None:
        """Close the file (records are already on disk)."""
        self._file.close()

    def __enter__(self) -> RecordDB:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _entry_module(program: IRModule | PrimFunc) -> IRModule:
    from tvm.ir import IRModule  # TVM only here: the records load in ms without it
    from tvm.tirx import PrimFunc

    if isinstance(program, PrimFunc):
        return IRModule({"main": program.with_attr("global_symbol", "main")})
    return program


def _trace_decisions(trace: Any) -> list[Any]:
    decisions = [trace.get_decision(inst) for inst in trace.insts]
    return [plain_json(d) for d in decisions if d is not None]


def export_metaschedule(
    db: RecordDB,
    modules: Mapping[str, IRModule | PrimFunc],
    work_dir: str | Path,
    only_best: bool = True,
) -> JSONDatabase:
    """Write successful records to a MetaSchedule ``JSONDatabase`` in ``work_dir``
    (``database_workload.json`` + ``database_tuning_record.json``).

    ``modules[workload]`` is the unscheduled program the records' traces were made on
    (layouts applied); workloads without a module are skipped. ``only_best`` exports
    one record per workload, else every successful one.
    """
    from tvm.s_tir import Schedule, Trace  # TVM only here (see the module docstring)
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo
    from tvm.s_tir.meta_schedule.database import JSONDatabase, TuningRecord
    from tvm.target import Target

    Path(work_dir).mkdir(parents=True, exist_ok=True)
    ms_db = JSONDatabase(work_dir=str(work_dir))
    for workload, program in modules.items():
        mod = _entry_module(program)
        chosen = [db.best(workload)] if only_best else db.records(workload)
        for record in chosen:
            if record is None or not record.ok or record.trace is None:
                continue
            sch = Schedule(mod)
            Trace.apply_json_to_schedule(record.trace, sch)
            ms_db.commit_tuning_record(TuningRecord(
                sch.trace,
                ms_db.commit_workload(mod),
                run_secs=record.latencies,
                target=Target(json.loads(record.target)),
                args_info=ArgInfo.from_entry_func(mod),
            ))
    return ms_db


def import_metaschedule(
    db: RecordDB,
    source: JSONDatabase | str | Path,
    modules: Mapping[str, IRModule | PrimFunc] | None = None,
) -> int:
    """Append MetaSchedule's tuning records (a database or its ``work_dir``) to ``db``.

    A record's workload key is the key in ``modules`` whose program is structurally equal
    to its workload, else ``"ms:<structural hash>"``. Layouts are ``{}``; decisions are
    the trace's sampling decisions. Already present candidates are skipped. Returns the
    number of records added.
    """
    import tvm_ffi  # TVM only here (see the module docstring)
    from tvm.s_tir.meta_schedule.database import JSONDatabase

    ms_db = source if isinstance(source, JSONDatabase) else JSONDatabase(work_dir=str(source))
    known = {key: _entry_module(p) for key, p in (modules or {}).items()}
    added = 0
    for tuning in ms_db.get_all_tuning_records():
        mod = tuning.workload.mod
        workload = next((key for key, m in known.items() if tvm_ffi.structural_equal(m, mod)),
                        f"ms:{tvm_ffi.structural_hash(mod) & (2**64 - 1):016x}")
        target = target_string(tuning.target) if tuning.target is not None else ""
        trace = plain_json(tuning.trace.as_json())
        decisions = _trace_decisions(tuning.trace)
        key = candidate_key(workload, target, {}, trace, decisions)
        if db.has(key):
            continue
        latencies = [float(x) for x in tuning.run_secs or []]
        failed = not latencies or max(latencies) >= _MS_FAILED_SECONDS
        db.add(Record(
            workload=workload,
            target=target,
            layouts={},
            trace=trace,
            decisions=decisions,
            latencies=[] if failed else latencies,
            error="failed in MetaSchedule" if failed else None,
            key=key,
        ))
        added += 1
    return added

"""A run directory, ``runs/<name>/``: every file a run keeps, by name, in one place.

Layout of a run directory::

    config.yaml       the resolved configuration
    records.jsonl     every measurement (durable; a killed run resumes from it)
    costmodel.npz     the cost model after the run
    best.json         the best candidate: layout factors, tensor layouts, schedule trace
    summary.json      latency, trials, tuning time, baselines and speedups
    tb/               TensorBoard logs (best latency vs trials)
    checkpoint/       a trainable agent's model
    others/           a network run's MetaSchedule database of its other kernels
    model/            a network run's imported model, kept as data (what export builds)
    in_network.json   a network run's layout choices inside the network, by task
    .lock             held by the process running it (one writer per run directory)

``altenv train`` adds ``corpus/records.jsonl``, ``costmodel-ranking.json`` and
``train-state.json`` (:mod:`altenv.pipeline.train`). A run directory found on disk is only
resumed by a run of the same workload or model (:data:`IDENTITY`), and a second process is
refused while one holds it. Export reads a run directory as data only: it never imports the
model or agent a config names. A run directory may come from someone else: one holding a
link, or something other than files and folders, is refused before anything in it is read
or written, and every file is written without following links (:mod:`altenv.files`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from tvm.s_tir.meta_schedule.database import JSONDatabase

from ..config import ConfigError, RunConfig, TrainConfig
from ..files import check_dir, check_file, check_tree, make_dir, read_text, write_text
from ..lock import DirLock
from ..records import RecordDB
from ..tuning.others import open_database
from ..yamlfile import MAX_BYTES, load_yaml

IDENTITY = {"workload": None, "workloads": None, "model": None, "epilogue": None,
            "target": None, "mapping": "none"}
"""Config keys a resumed run must share with the run on disk, with the value a config
written before the key existed means."""


FILES = ("config", "records", "cost_model", "best", "summary", "in_network", "lock", "corpus",
         "ranking", "train_state")
FOLDERS = ("tensorboard", "checkpoint", "others", "model")


class RunDir:
    """The files of the run directory ``path`` (:mod:`this module <altenv.pipeline.rundir>`
    lists them)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"

    config = property(lambda self: self.path / "config.yaml")
    records = property(lambda self: self.path / "records.jsonl")
    cost_model = property(lambda self: self.path / "costmodel.npz")
    best = property(lambda self: self.path / "best.json")
    summary = property(lambda self: self.path / "summary.json")
    tensorboard = property(lambda self: self.path / "tb")
    checkpoint = property(lambda self: self.path / "checkpoint")
    others = property(lambda self: self.path / "others")
    model = property(lambda self: self.path / "model")
    in_network = property(lambda self: self.path / "in_network.json")
    lock = property(lambda self: self.path / ".lock")
    corpus = property(lambda self: self.path / "corpus" / "records.jsonl")
    ranking = property(lambda self: self.path / "costmodel-ranking.json")
    train_state = property(lambda self: self.path / "train-state.json")

    def check(self) -> None:
        """A one-line error if the directory, or anything in it, is a link or neither a
        regular file nor a folder, or if a folder stands where altenv writes a file or a
        file where it keeps a folder (nothing when the directory is not there yet)."""
        if not (self.path.exists() or self.path.is_symlink()):
            return
        check_tree(self.path)
        for name in FILES:
            check_file(getattr(self, name))
        for name in FOLDERS:
            check_dir(getattr(self, name))

    def saved_config(self) -> dict[str, Any]:
        """``config.yaml`` as a mapping (a one-line error if it is not one)."""
        try:
            data = load_yaml(read_text(self.config, MAX_BYTES))
        except ValueError as err:
            raise ConfigError(f"{self.config}: {err}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{self.config}: not a run config (the top level is not a "
                              "mapping)")
        return data

    @contextlib.contextmanager
    def open(self, cfg: RunConfig | TrainConfig, repair: bool = False) -> Iterator[RecordDB]:
        """Create or reopen the directory of ``cfg`` and hold its lock (a second process is
        refused, naming this one) while the run goes on; yields its records (validated;
        ``repair`` moves bad lines aside, :class:`~altenv.records.RecordDB`). Refuses to
        mix a different run into it (:data:`IDENTITY`)."""
        mine = cfg.model_dump(mode="json")
        make_dir(self.path)  # refuses a link; the lock refuses a linked .lock
        with DirLock(self.lock, f"run directory {self.path}"):
            self.check()  # as the lock holder: nothing changes it from here on
            if self.config.exists():  # before its records are read (or repaired)
                old = self.saved_config()
                for key, default in IDENTITY.items():
                    if old.get(key, default) != mine.get(key, default):
                        raise ConfigError(f"config: {self.path} holds a run with {key}="
                                          f"{old.get(key, default)!r}, not "
                                          f"{mine.get(key, default)!r}; pick another name or "
                                          "output_dir")
            with RecordDB(self.records, repair) as db:
                write_text(self.config, yaml.safe_dump(mine, sort_keys=False))
                print(f"{'resuming' if len(db) else 'new'} run {self.path}"
                      + (f" ({len(db)} records)" if len(db) else ""))
                yield db

    def save_agent(self, agent: Any) -> None:
        """Trainable agents (with ``save``) keep their models in ``checkpoint/``."""
        if hasattr(agent, "save"):
            agent.save(self.checkpoint)

    def others_database(self) -> JSONDatabase | None:
        """The MetaSchedule database of a network run's other kernels
        (:mod:`altenv.tuning.others`), ``None`` for a run without one."""
        if not (self.others / "database_tuning_record.json").exists():
            return None
        return open_database(self.others)

"""Benchmark suites: YAML files in ``configs/bench/`` validated by typed models.

``altenv bench`` runs them; ``altenv train`` reads them too, to never train on a workload a
suite measures (:func:`suite_specs`), so they sit beside the run configs, below both.

An operator suite lists workloads (a spec and an epilogue); a network suite lists models
(a zoo name, ONNX file or ``file.py:factory`` with loader options). Both name their
default budget, tuners and baselines, which the command line may override. A tuner is
``metaschedule``, ``altenv`` (the agent in ``altenv:``), an agent by registered name or
``module:Class`` with default options, or a label from ``agents:`` (an agent with options),
so that variants of one agent are tuned and re-timed side by side.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, PositiveInt, field_validator, model_validator

import agents

from .cluster.settings import RaySettings
from .config import (
    AgentConfig,
    ConfigError,
    DirName,
    SearchConfig,
    TargetSpec,
    WorkloadSpec,
    load_config,
)
from .measure import MeasureConfig
from .ops import Epilogue
from .strict import Strict

SUITE_DIR = Path(__file__).resolve().parents[1] / "configs" / "bench"
"""Where ``--suite NAME`` looks for ``NAME.yaml``."""

OP_BASELINES = ("tvm-default", "torch")
NET_BASELINES = ("tvm-default", "torch")
BUILTIN_TUNERS = ("altenv", "metaschedule")
TIME_TRIAL_CAP = 10
"""Under a wall-clock budget (``seconds``) a cell measures at most this many times its
trial budget."""
"""Tuners with a meaning of their own; any other name is a registered agent."""


class OpEntry(Strict):
    """One operator workload: ``name`` (a short label), ``spec`` and fused ``epilogue``."""

    name: DirName
    spec: WorkloadSpec
    epilogue: list[Epilogue] = Field(default_factory=list)
    note: str = ""


class NetEntry(Strict):
    """One network: ``model`` as ``altenv tune`` takes it, ``options`` for its loader."""

    name: DirName
    model: str
    options: dict[str, Any] = Field(default_factory=dict)
    note: str = ""


class BenchSuite(Strict):
    """A benchmark suite (``configs/bench/*.yaml``)."""

    name: DirName
    kind: Literal["ops", "nets"]
    description: str = ""
    budget: int = Field(200, ge=1)
    #: tuners measured at a budget of their own, e.g. ``{zero-shot: 16}`` beside agents at
    #: ``budget`` (how close a few trials come to a full search); the rest get ``budget``
    budgets: dict[str, PositiveInt] = Field(default_factory=dict)
    #: ops suites: every tuner tunes each cell for this many seconds of wall-clock time
    #: (``bench ops --seconds``): ``budget`` trials are then the agents' plan (their
    #: stages), trials past it go on on the best layout, and a cell stops at the first of
    #: the time or :data:`TIME_TRIAL_CAP` times the budget
    seconds: float | None = Field(None, gt=0)
    seeds: int = Field(1, ge=1)
    tuners: list[str] = Field(default_factory=lambda: ["altenv", "metaschedule"])
    baselines: list[str] = Field(default_factory=lambda: list(OP_BASELINES))
    versus: list[str] = Field(default_factory=lambda: ["metaschedule"])
    altenv: AgentConfig = Field(default_factory=lambda: AgentConfig(name="evolution"))
    agents: dict[str, AgentConfig] = Field(default_factory=dict)
    target: TargetSpec = "cpu"
    measure: MeasureConfig = Field(default_factory=MeasureConfig)
    #: how the agents' cells search, as ``search:`` of a run config (a cell tunes as
    #: ``altenv tune`` of its workload with these settings would)
    search: SearchConfig = Field(default_factory=SearchConfig)
    workloads: list[OpEntry] = Field(default_factory=list)
    models: list[NetEntry] = Field(default_factory=list)
    #: tune the agents' cells on a Ray cluster (builds as Ray tasks, one actor per measuring
    #: device), as ``altenv tune --ray``; MetaSchedule's cells and the re-timing stay here
    ray: RaySettings | None = None

    @field_validator("agents")
    @classmethod
    def _labels(cls, value: dict[str, AgentConfig]) -> dict[str, AgentConfig]:
        for label in value:
            if not re.fullmatch(r"[A-Za-z0-9_-]+", label):
                raise ValueError(f"label {label!r}: letters, digits, '_' and '-' only")
            if label in BUILTIN_TUNERS or label in agents.available():
                raise ValueError(f"label {label!r} is already a tuner; choose another name")
        return value

    @model_validator(mode="after")
    def _tuners(self) -> BenchSuite:
        allowed = sorted({*BUILTIN_TUNERS, *agents.available(), *self.agents})
        for name in self.tuners:
            if name not in allowed and ":" not in name:
                raise ValueError(f"tuners: unknown tuner {name!r}; allowed: "
                                 f"{', '.join(allowed)} or 'module:Class'")
        if len(set(self.tuners)) != len(self.tuners):
            raise ValueError(f"tuners repeat a name: {self.tuners}")
        for name in self.budgets:
            if name not in self.tuners:
                raise ValueError(f"budgets: {name!r} is not one of the tuners "
                                 f"({', '.join(self.tuners)})")
        unknown = [name for name in self.versus if name not in allowed and ":" not in name]
        if unknown or not self.versus:
            raise ValueError(f"versus: unknown tuner {unknown[0] if unknown else '(none)'}; "
                             f"allowed: {', '.join(allowed)}")
        return self

    @model_validator(mode="after")
    def _entries(self) -> BenchSuite:
        allowed = OP_BASELINES if self.kind == "ops" else NET_BASELINES
        for name in self.baselines:
            if name not in allowed:
                raise ValueError(f"baselines: unknown baseline {name!r}; allowed: "
                                 f"{', '.join(allowed)}")
        entries = self.workloads if self.kind == "ops" else self.models
        if not entries:
            raise ValueError(f"a {self.kind} suite needs "
                             f"{'workloads' if self.kind == 'ops' else 'models'}")
        names = [e.name for e in entries]
        if len(set(names)) != len(names):
            raise ValueError(f"entry names repeat: {names}")
        if self.seconds is not None and self.kind != "ops":
            raise ValueError("seconds: a wall-clock budget is for ops suites only")
        if self.ray is not None and self.measure.rpc is not None:
            raise ValueError("ray: measures on the cluster's device actors; measure.rpc is "
                             "allowed only without ray")
        return self

    def agent(self, tuner: str) -> AgentConfig | None:
        """The agent behind a tuner (``None`` for ``metaschedule``)."""
        if tuner == "metaschedule":
            return None
        if tuner == "altenv":
            return self.altenv
        return self.agents.get(tuner) or AgentConfig(name=tuner)

    def budget_of(self, tuner: str) -> int:
        """The measured trials of ``tuner``'s cells (their plan under :attr:`seconds`)."""
        return self.budgets.get(tuner, self.budget)

    def trial_cap(self, tuner: str) -> int:
        """The most trials ``tuner``'s cells measure."""
        budget = self.budget_of(tuner)
        return budget if self.seconds is None else TIME_TRIAL_CAP * budget

    def select(self, pattern: str | None) -> list[OpEntry] | list[NetEntry]:
        """The entries whose name matches the regular expression ``pattern`` (all for
        ``None``); a pattern matching nothing is an error naming the entries."""
        entries = self.workloads if self.kind == "ops" else self.models
        if pattern is None:
            return list(entries)
        try:
            regex = re.compile(pattern)
        except re.error as err:
            raise ConfigError(f"--filter {pattern!r}: not a regular expression ({err})"
                              ) from None
        chosen = [e for e in entries if regex.search(e.name)]
        if not chosen:
            raise ConfigError(f"--filter {pattern!r} matches none of "
                              f"{', '.join(e.name for e in entries)}")
        return chosen


def load_suite(name_or_path: str, **overrides: Any) -> BenchSuite:
    """A suite by name (``configs/bench/NAME.yaml``) or YAML path, with dotted overrides
    (``None`` values ignored); a bad field raises a one-line :class:`ConfigError`."""
    path = Path(name_or_path)
    if not path.suffix:
        path = SUITE_DIR / f"{name_or_path}.yaml"
        if not path.exists():
            known = sorted(p.stem for p in SUITE_DIR.glob("*.yaml"))
            raise ConfigError(f"--suite {name_or_path!r}: no such suite; allowed: "
                              f"{', '.join(known)} or a YAML path")
    return load_config(path, BenchSuite, **overrides)


def suite_specs() -> set[str]:
    """Every operator spec of the shipped suites (``configs/bench/``): what pretraining
    must never draw, so that no benchmark measures a workload a model was trained on."""
    specs: set[str] = set()
    for path in sorted(SUITE_DIR.glob("*.yaml")):
        suite = load_config(path, BenchSuite)
        specs.update(str(e.spec) for e in suite.workloads)
    return specs

"""Run configuration: YAML files validated by typed models.

A bad field gets one line naming it and what is allowed, e.g.
``config configs/x.yaml: budget.joint: Input should be greater than or equal to 0``.
"""

from __future__ import annotations

import re
import string
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    Field,
    PlainSerializer,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

import agents

from .cluster.settings import RaySettings
from .errors import UserError
from .files import UnsafeFileError, read_text
from .measure.config import MeasureConfig
from .ops.epilogue import DEFAULT_FAST_MATH, Epilogue
from .ops.workload import KINDS, Workload, parse_workload
from .strict import Strict
from .tuning.budget import Budget
from .yamlfile import MAX_BYTES, load_yaml

if TYPE_CHECKING:
    from .tuning.job import SearchOptions

Seed = Annotated[int, Field(ge=0, lt=2**31)]
"""A seed of numpy, torch and XGBoost alike."""


class ConfigError(UserError, ValueError):
    """A configuration that does not validate; the message names the field."""


def _dir_name(value: str) -> str:
    """A name that is one directory entry: letters, digits, ``_``, ``-`` and ``.``, not
    ``.`` or ``..`` (which would put a run in, or above, ``output_dir`` itself)."""

    if not re.fullmatch(r"[A-Za-z0-9_.-]{1,200}", value) or value in (".", ".."):
        raise ValueError(f"{value[:40]!r}{'...' if len(value) > 40 else ''} is not a "
                         "directory name; allowed: 1 to 200 letters, digits, '_', '-' and '.' "
                         "(not '.' or '..', no path separators)")
    return value


DirName = Annotated[str, AfterValidator(_dir_name)]
"""A run, suite or entry name: one directory under its output directory."""


def _target(value: str | dict[str, Any]) -> str | dict[str, Any]:
    if isinstance(value, dict) and not isinstance(value.get("kind"), str):
        raise ValueError("a target dict needs a 'kind' (e.g. {kind: llvm, mcpu: znver3, "
                         "num-cores: 2})")
    if isinstance(value, str) and not value.strip():
        raise ValueError("an empty target; allowed: 'cpu' (this host), 'cuda', or a TVM "
                         "target dict")
    return value


TargetSpec = Annotated[str | dict[str, Any], AfterValidator(_target)]
"""``cpu`` (this host), ``cuda``, or a TVM target dict (:func:`altenv.target.make_target`).
Reading a config checks its form only; what TVM makes of it is checked with the device
before a run starts (:func:`altenv.pipeline.checks.check_device`)."""


class BudgetConfig(Strict):
    """Measured trials of the joint (layout + loop) and loop-only stages (a model's are
    spread over its complex tasks) and, for a model, of MetaSchedule on the network's other
    kernels once the layouts are fixed (:mod:`altenv.tuning.others`)."""

    joint: int = Field(19, ge=0)
    loop_only: int = Field(45, ge=0)
    others: int = Field(0, ge=0)

    @model_validator(mode="before")
    @classmethod
    def _total(cls, data: Any) -> Any:
        """``budget: N``: N trials split as :meth:`split` does (no share for others)."""
        if isinstance(data, int) and not isinstance(data, bool):
            if data < 1:
                raise ValueError(f"{data} trials measure nothing; allowed: a whole number >= 1 "
                                 "or {joint: N, loop_only: N, others: N}")
            return cls.split(data).model_dump()
        return data

    @model_validator(mode="after")
    def _measures(self) -> BudgetConfig:
        if self.searched < 1:
            raise ValueError("joint + loop_only is 0: nothing would be measured; allowed: at "
                             "least 1 trial in joint or loop_only")
        return self

    @property
    def searched(self) -> int:
        """Trials of the layout and loop search: ``joint + loop_only``."""
        return self.joint + self.loop_only

    @property
    def total(self) -> int:
        return self.searched + self.others

    @property
    def stages(self) -> Budget:
        """The joint and loop-only stages, as the tuning loop takes them."""
        return Budget(self.joint, self.loop_only)

    @classmethod
    def split(cls, total: int, others_share: float = 0.0) -> BudgetConfig:
        """``total`` trials: ``others_share`` of them for the other kernels, the rest split
        between the joint and loop-only stages as :meth:`Budget.split` splits them."""
        others = round(total * others_share)
        stages = Budget.split(total - others)
        return cls(joint=stages.joint, loop_only=stages.loop_only, others=others)


#: The share of a model run's budget that ``altenv tune --budget N`` and ``altenv bench net``
#: give the other kernels.
OTHERS_SHARE = 0.1


class AgentConfig(Strict):
    """A search strategy: a registered name or ``module:Class``, with its options. The
    default, ``evolution``, is the agent measured on every benchmark, networks included:
    ``ppo`` leads it on single operators at 200 trials but not on a network
    (``docs/agents.md``, "The evolution agent")."""

    name: str = "evolution"
    #: as given in the config; a built-in agent's become its typed options
    #: (:mod:`agents.options`) here, validated once, and are written back as given
    options: Annotated[dict[str, Any] | BaseModel, PlainSerializer(
        lambda v: v.model_dump(exclude_unset=True) if isinstance(v, BaseModel) else v)
    ] = Field(default_factory=dict)

    @field_validator("name")
    @classmethod
    def _known(cls, value: str) -> str:
        if ":" in value:
            return value
        if value not in agents.available():
            raise ValueError(f"unknown agent {value!r}; allowed: {', '.join(agents.available())}"
                             " or 'module:Class'")
        return value

    @field_validator("options")
    @classmethod
    def _options(cls, value: dict[str, Any] | BaseModel, info: ValidationInfo
                 ) -> dict[str, Any] | BaseModel:
        """Options of a registered agent are validated by its typed options
        (:func:`agents.validate_options`, which imports no agent) here, not hours later when
        the agent is built. ``module:Class`` agents are user code: they are imported and
        checked before a run starts (:func:`altenv.pipeline.checks.check_run`), never while a
        config is only read (an exported run's ``config.yaml`` is data)."""
        name = info.data.get("name")
        if name is None or ":" in name or isinstance(value, BaseModel):
            return value
        return agents.validate_options(name, value)

    @property
    def given(self) -> dict[str, Any]:
        """The options as the config gives them."""
        return self.model_dump(mode="json")["options"]


class SearchConfig(Strict):
    """How each batch is explored (ALT §7: batch 128, top-8 measured), and how the best is
    picked at the end: the ``finalists`` fastest re-timed side by side, ``finalist_rounds``
    interleaved runs each (``finalists: 0`` keeps the fastest at tuning time), in
    ``finalist_caches``: ``warm`` (each call right after the last, as tuning times them),
    ``cold`` (every argument but the data flushed from the CPU caches before each call, as
    inside a network, where a kernel's weights were last touched one run ago) or ``auto``
    (cold in model runs, warm in operator runs). In a model
    run, a task first measures ``warm_start`` candidates carried over from the tasks of the
    same operator (other epilogues) tuned before it, and keeps as many trials to measure
    those of the ones tuned after it (:mod:`altenv.tuning.transfer`; 0: off). Once all its
    tasks are tuned, a model run re-times each task's ``in_network`` fastest layouts (those
    within ``in_network_slack`` times its fastest) with the conversions the network runs
    before them, and keeps the fastest there (:mod:`altenv.graph.in_network`; 1: off).
    A model run holds back ``task_scheduler`` of its searched trials and, once every task
    had its share, hands them out a batch (``top_k``) at a time to the task whose latency
    promises to fall most (:mod:`altenv.tuning.scheduler`; 0: off)."""

    batch: int = Field(128, ge=1)
    top_k: int = Field(8, ge=1)
    levels: int = Field(1, ge=1, le=3)
    check: bool = True
    finalists: int = Field(8, ge=0)
    finalist_rounds: int = Field(3, ge=1)
    finalist_caches: Literal["auto", "warm", "cold"] = "auto"
    warm_start: int = Field(4, ge=0)
    in_network: int = Field(3, ge=1)
    in_network_slack: float = Field(1.5, ge=1.0)
    task_scheduler: float = Field(0.15, ge=0.0, lt=1.0)

    def options(self, model: bool = False) -> SearchOptions:
        """What these settings make of a :class:`~altenv.tuning.TuningJob`'s search, for a
        task of a model run (``model``: finalists cold under ``auto``) or an operator run."""
        from .tuning.job import SearchOptions  # the tuning machinery: only for a job

        cold = self.finalist_caches == "cold" or (self.finalist_caches == "auto" and model)
        return SearchOptions(batch=self.batch, top_k=self.top_k, finalists=self.finalists,
                             finalist_rounds=self.finalist_rounds, finalists_cold=cold,
                             check=self.check)


class _Run(Strict):
    """What every run shares: where it goes, the target, budget, agent and measurement."""

    name: DirName
    epilogue: list[Epilogue] = Field(default_factory=list)
    target: TargetSpec = "cpu"
    budget: BudgetConfig = Field(default_factory=BudgetConfig)
    agent: AgentConfig = Field(default_factory=AgentConfig)
    measure: MeasureConfig = Field(default_factory=MeasureConfig)
    search: SearchConfig = Field(default_factory=SearchConfig)
    seed: Seed = 0
    output_dir: str = "runs"

    @field_validator("agent", mode="before")
    @classmethod
    def _agent_shorthand(cls, value: Any) -> Any:
        return {"name": value} if isinstance(value, str) else value

    @property
    def run_dir(self) -> Path:
        return Path(self.output_dir) / self.name


WorkloadSpec = Annotated[Workload, BeforeValidator(parse_workload),
                         PlainSerializer(str, return_type=str)]
"""A workload: a spec string (or ``altenv://<dataset>/<name>``) parsed once, where the config
is read; written back (``config.yaml``, ``model_dump``) as its canonical spec."""


class RunConfig(_Run):
    """One tuning run (``altenv tune CONFIG``)."""

    workload: WorkloadSpec | None = None
    model: str | None = None
    model_options: dict[str, Any] = Field(default_factory=dict)
    mapping: Literal["none", "amos", "cp_embedding"] = "none"
    #: float32 functions a model's generated code (complex tasks' activations, regenerated
    #: elementwise tasks) computes with TVM's fast polynomial versions (``erf``: within
    #: 4.2e-7; ``exp``, also a sigmoid's: relative 4.1e-6); ``[]`` keeps libm's.
    fast_math: list[Literal["erf", "tanh", "exp"]] = Field(
        default_factory=lambda: list(DEFAULT_FAST_MATH))
    #: tune on a Ray cluster (builds as Ray tasks, one actor per measuring device);
    #: ``None`` measures in this process as configured in ``measure``
    ray: RaySettings | None = None

    @model_validator(mode="before")
    @classmethod
    def _model_budget(cls, data: Any) -> Any:
        """``budget: N`` of a model run keeps :data:`OTHERS_SHARE` for its other kernels,
        as ``altenv tune --budget N`` does."""
        if isinstance(data, dict) and data.get("model") is not None:
            budget = data.get("budget")
            if isinstance(budget, int) and not isinstance(budget, bool) and budget >= 1:
                data = {**data, "budget": BudgetConfig.split(budget, OTHERS_SHARE).model_dump()}
        return data

    @model_validator(mode="after")
    def _one_source(self) -> RunConfig:
        if (self.workload is None) == (self.model is None):
            raise ValueError("give exactly one of 'workload' (a spec string) and 'model' "
                             "(a zoo name, an .onnx file or file.py:factory)")
        if self.mapping != "none":
            if self.workload is None or self.workload.dtype != "int8":
                raise ValueError(f"mapping={self.mapping!r} maps int8 operators onto int8 dot "
                                 "products: give an int8 'workload' (…,dtype=int8)")
        if self.workload is not None and self.model_options:
            raise ValueError("model_options: an operator run imports no model; allowed only "
                             "with 'model'")
        if self.workload is not None and self.budget.others:
            raise ValueError("budget.others: an operator run has no other kernels; allowed "
                             "only with 'model'")
        if self.ray is not None and self.measure.rpc is not None:
            raise ValueError("ray: measures on the cluster's device actors; measure.rpc is "
                             "allowed only without ray")
        return self


class DrawConfig(Strict):
    """Workloads drawn as ALT §7.1 draws its test cases (:func:`altenv.ops.draw.draw_workloads`),
    never one of a benchmark suite's."""

    count: int = Field(ge=1)
    seed: Seed = 0
    kinds: list[str] | None = None
    max_gflop: float = Field(0.4, gt=0)

    @field_validator("kinds")
    @classmethod
    def _kinds(cls, value: list[str] | None) -> list[str] | None:
        bad = sorted(set(value or ()) - set(KINDS))
        if bad or value == []:
            raise ValueError(f"unknown kinds {bad or '[]'}; allowed: {', '.join(KINDS)}")
        return value

    def draw(self, exclude: set[str]) -> list[str]:
        from .ops.draw import draw_workloads  # sizes operators with torch: only when drawn

        return draw_workloads(self.count, self.seed, self.kinds or KINDS, self.max_gflop,
                              exclude)


class CorpusConfig(Strict):
    """A measured corpus for the cross-workload cost model: ``trials`` candidates of each
    drawn workload, plus the records files in ``records`` (other runs', bench cells');
    ``holdout`` of the workloads are held out once to report ranking quality."""

    draw: DrawConfig
    trials: int = Field(48, ge=1)
    records: list[str] = Field(default_factory=list)
    holdout: float = Field(0.2, ge=0.0, lt=1.0)


class PretrainConfig(Strict):
    """Policy pretraining with nothing measured: ``timesteps`` environment steps over
    ``envs`` parallel environments, ``batch`` loop points sampled per round; on cost-model
    rewards over the workloads of ``draw``, or (``reward_source: dataset``) replaying every
    workload of ``dataset`` (a name or directory, :mod:`altenv.dataset`)."""

    draw: DrawConfig | None = None
    reward_source: Literal["cost_model", "dataset"] = "cost_model"
    dataset: str = "cpu-v0"
    timesteps: int = Field(ge=1)
    envs: int = Field(2, ge=1)
    batch: int = Field(32, ge=1)

    @model_validator(mode="after")
    def _source(self) -> PretrainConfig:
        if self.reward_source == "cost_model" and self.draw is None:
            raise ValueError("draw: cost-model pretraining needs the workloads to draw; "
                             "give 'draw' or reward_source: dataset")
        if self.reward_source == "dataset":
            from .datapath import dataset_dir

            dataset_dir(self.dataset)
        return self


class TrainConfig(_Run):
    """Training (``altenv train CONFIG``), in stages, each resumable: a measured
    ``corpus`` and the cross-workload cost model fitted to it; ``pretrain``-ing the
    policy on that model's rewards; then the agent tunes each of ``workloads`` (and the
    complex tasks of ``models``) in turn with ``budget`` measured trials apiece (ALT
    §7.3.1, PPO-Pret). The agent is saved to ``<run>/checkpoint`` with a card, and copied
    to ``publish`` when given; ``{mcpu}`` there is the target's CPU (the shipped
    checkpoints: ``altenv/pretrained/ppo/{mcpu}``, one per CPU they were made on)."""

    workloads: list[WorkloadSpec] = Field(default_factory=list)
    models: list[str] = Field(default_factory=list)
    model_options: dict[str, Any] = Field(default_factory=dict)
    corpus: CorpusConfig | None = None
    pretrain: PretrainConfig | None = None
    publish: str | None = None
    agent: AgentConfig = Field(default_factory=lambda: AgentConfig(name="ppo"))

    @field_validator("publish")
    @classmethod
    def _publish(cls, value: str | None) -> str | None:
        fields = {name for _, name, _, _ in string.Formatter().parse(value or "")
                  if name is not None}
        if fields - {"mcpu"}:
            raise ValueError(f"a directory, where '{{mcpu}}' is the only field allowed; got "
                             f"{', '.join(sorted(repr(f) for f in fields - {'mcpu'}))}")
        return value

    @model_validator(mode="after")
    def _something(self) -> TrainConfig:
        if not (self.workloads or self.models or self.corpus or self.pretrain):
            raise ValueError("give at least one of 'workloads', 'models', 'corpus' and "
                             "'pretrain'")
        return self


class CollectionConfig(Strict):
    """How much of each workload a dataset measures (:class:`altenv.dataset.collect.Plan`):
    up to ``layouts`` layouts (the framework layout always among them), per layout
    ``samples`` programs of MetaSchedule's sampling and ``searched`` mutants of the fastest
    of them, then (with ``search_trials``) a real search of ``search_agent``, warm-started
    from those, whose ``bests`` fastest new programs join them; each program timed
    ``rounds`` times interleaved; a reference kernel re-timed every ``reference_every``
    seconds; with ``quiet_host``, a timing on this host waits until nothing else keeps it
    busy."""

    layouts: int = Field(12, ge=1)
    samples: int = Field(17, ge=1)
    searched: int = Field(8, ge=0)
    #: trials of the search after the sampling (0: none); a workload collected without one
    #: gets it when a later collection asks for it
    search_trials: int = Field(0, ge=0)
    bests: int = Field(8, ge=1)
    search_agent: AgentConfig = Field(default_factory=AgentConfig)
    rounds: int = Field(5, ge=5)
    reference_every: float = Field(180.0, gt=0)
    #: time a batch on this host only once other processes leave its cores idle (builds
    #: may overlap other work, timings may not); this host's load says nothing of timings
    #: on RPC devices or a Ray cluster (but ``ray: local``'s), which never wait
    quiet_host: bool = True
    #: a workload whose reference timings moved more than this (max / min) while it was
    #: collected is collected again (up to twice)
    drift: float = Field(1.3, gt=1.0)


class DatasetConfig(Strict):
    """A measured-program dataset (``altenv dataset collect CONFIG``): the workloads of
    ``draw`` (never a benchmark suite's), the complex tasks of ``models`` and the specs of
    ``workloads``, collected into ``output`` as ``collection`` says, timed on this host,
    the RPC devices of ``measure.rpc`` or the device actors of a Ray cluster (``ray``)."""

    output: str
    draw: DrawConfig | None = None
    models: list[str] = Field(default_factory=list)
    workloads: list[WorkloadSpec] = Field(default_factory=list)
    collection: CollectionConfig = Field(default_factory=CollectionConfig)
    target: TargetSpec = "cpu"
    measure: MeasureConfig = Field(default_factory=lambda: MeasureConfig(
        number=1, repeat=1, min_repeat_ms=10))
    seed: Seed = 0
    #: build as Ray tasks and time on the cluster's device actors, as a run's ``ray:``
    ray: RaySettings | None = None

    @model_validator(mode="after")
    def _something(self) -> DatasetConfig:
        if not (self.draw or self.models or self.workloads):
            raise ValueError("give at least one of 'draw', 'models' and 'workloads'")
        if self.ray is not None and self.measure.rpc is not None:
            raise ValueError("ray: measures on the cluster's device actors; measure.rpc is "
                             "allowed only without ray")
        return self


def _one_line(err: ValidationError, source: str) -> str:
    first = err.errors()[0]
    loc = ".".join(p if isinstance(p, str) and p.isprintable() and p and " " not in p
                   else repr(p) for p in first["loc"]) or "(top level)"
    msg = " ".join(first["msg"].removeprefix("Value error, ").split())
    return f"config {source}: {loc}: {msg}"


class _Null:
    """An override that sets a field to null (``--set KEY=null``), where ``None`` means
    that an option was not given."""

    def __repr__(self) -> str:
        return "NULL"


NULL = _Null()


def load_config(path: str | Path | None = None, schema: type[BaseModel] = RunConfig,
                **overrides: Any) -> Any:
    """Read a YAML config (or none), apply ``overrides`` (dotted keys allowed, ``None``
    values ignored, :data:`NULL` sets null) and validate it against ``schema``."""
    data: dict[str, Any] = {}
    source = str(path) if path is not None else "(command line)"
    if path is not None:
        try:
            data = load_yaml(read_text(path, MAX_BYTES, follow=True)) or {}
        except FileNotFoundError:
            raise ConfigError(f"config {source}: no such file") from None
        except UnsafeFileError as err:
            raise ConfigError(f"config {err}") from None
        except ValueError as err:
            raise ConfigError(f"config {source}: {err}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"config {source}: the top level must be a mapping of keys")
    for key, value in overrides.items():
        if value is None:
            continue
        node = data
        *parents, leaf = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ConfigError(f"config {source}: override {key!r}: {p!r} is not a "
                                  "section of fields")
        node[leaf] = None if value is NULL else value
    try:
        return schema.model_validate(data)
    except ValidationError as err:
        raise ConfigError(_one_line(err, source)) from None

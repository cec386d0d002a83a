"""The agent protocol and registry.

An agent proposes batches of joint-space candidates and observes measured latencies.
The default tuning loop ranks each proposed batch with the cost model, measures the
top-k and reports those back; an agent may instead override ``run`` and drive the
environments itself (the PPO agent does, through stable-baselines3). A config names an
agent by its registered name (``"random"``) or as ``"my_module:MyAgent"``.

An agent's options are typed by its ``__init__``: :func:`options_model` makes a pydantic
model of the signature (each keyword parameter a field of its annotated type and default),
and every agent is built through :func:`build`, which validates the options against it.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import typing
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, create_model

from altenv.tuning.budget import Budget
from altenv.tuning.loop import propose_and_measure
from altenv.tuning.session import TuningSession
from altenv.tuning.task import Candidate, Factors


class Agent(ABC):
    """Base class of search strategies.

    ``propose`` is called with ``layout=None`` in the joint stage (the agent picks
    layouts too) and with the fixed best layout in the loop-only stage.
    """

    name = "agent"

    def setup(self, session: TuningSession) -> None:  # noqa: B027 (optional hook)
        """Called once before the first proposal."""

    @abstractmethod
    def propose(self, session: TuningSession, n: int, layout: Factors | None
                ) -> list[Candidate]:
        """A batch of up to ``n`` candidates."""

    def choose(self, session: TuningSession, candidates: Sequence[Candidate], k: int
               ) -> list[Candidate]:
        """Which ``k`` of a proposed batch to measure: by default the cost model's top-k
        of the valid candidates not measured before."""
        return [candidates[i] for i in session.select(candidates, k)]

    def observe(self, candidates: Sequence[Candidate],  # noqa: B027 (optional hook)
                latencies: Sequence[float]) -> None:
        """Measured median latencies (s, ``inf`` for failures) of proposed candidates."""

    def summary(self) -> dict[str, Any]:
        """What a run reports about the agent itself (e.g. how often it learned)."""
        return {}

    def run(self, session: TuningSession, budget: Budget, batch: int, top_k: int,
            report: Callable[[TuningSession], None]) -> None:
        """Tune until the budget is spent. The default asks :meth:`propose` for batches and
        measures the cost model's ``top_k`` of each; agents that drive environments
        themselves (e.g. SB3 algorithms) override this and call ``report(session)`` after
        measurements. The session refuses trials past the budget."""
        self.setup(session)
        propose_and_measure(session, self, budget, batch, top_k, report)


_REGISTRY: dict[str, Callable[..., Agent]] = {}
_BUILTIN = {"random": "agents.random:RandomAgent", "ppo": "agents.ppo:PPOAgent",
            "evolution": "agents.evolution:EvolutionAgent",
            "heron_cga": "agents.heron_cga:HeronCGAAgent",
            "mind_mappings": "agents.mind_mappings:MindMappingsAgent"}
"""Built-in agents, imported on first use (PPO pulls in stable-baselines3)."""


def register(name: str) -> Callable[[type[Agent]], type[Agent]]:
    """Class decorator: make an agent available under ``name``."""

    def wrap(cls: type[Agent]) -> type[Agent]:
        _REGISTRY[name] = cls
        cls.name = name
        return cls

    return wrap


def available() -> list[str]:
    """Registered agent names, built-ins included."""
    return sorted(set(_REGISTRY) | set(_BUILTIN))


def agent_class(spec: str) -> Callable[..., Agent]:
    """The agent class of a registered name or ``"module:Class"`` (importing the module runs
    it: whatever it raises is reported as a ``ValueError`` of one line)."""
    if ":" in spec:
        module, _, cls_name = spec.partition(":")
        try:
            cls = getattr(importlib.import_module(module), cls_name)
        except Exception as err:  # noqa: BLE001 (a user's module may raise anything)
            reason = " ".join(f"{type(err).__name__}: {err}".split())
            raise ValueError(f"agent: cannot import {spec!r} ({reason})") from err
        if not (isinstance(cls, type) and issubclass(cls, Agent)):
            raise ValueError(f"agent: {spec!r} is not a subclass of agents.base.Agent")
        return cls
    if spec not in _REGISTRY and spec in _BUILTIN:
        importlib.import_module(_BUILTIN[spec].partition(":")[0])  # registers itself
    if spec not in _REGISTRY:
        raise ValueError(f"agent: unknown agent {spec!r}; allowed: {', '.join(available())} "
                         "or 'module:Class'")
    return _REGISTRY[spec]


@functools.cache
def options_model(cls: type) -> type[BaseModel]:
    """The typed options of an agent class, made from its ``__init__`` signature: one field
    per keyword parameter, of its annotated type (``Any`` without one) and with its default;
    other options are refused unless ``__init__`` takes ``**kwargs``."""
    try:
        hints = typing.get_type_hints(cls.__init__)
    except (NameError, TypeError):  # an annotation that does not resolve: left untyped
        hints = {}
    fields: dict[str, Any] = {}
    extra = "forbid"
    for name, param in inspect.signature(cls).parameters.items():
        if param.kind is inspect.Parameter.VAR_KEYWORD:
            extra = "allow"
        elif param.kind is not inspect.Parameter.VAR_POSITIONAL:
            default = ... if param.default is inspect.Parameter.empty else param.default
            fields[name] = (hints.get(name, Any), default)
    return create_model(f"{cls.__name__}Options",
                        __config__=ConfigDict(extra=extra, arbitrary_types_allowed=True),
                        **fields)


def check_options(cls: type, options: Mapping[str, Any], label: str) -> dict[str, Any]:
    """``options`` validated by :func:`options_model` (values converted to the annotated
    types); a ``ValueError`` of one line names the first bad option and what is allowed
    (``label``: the agent's name in messages)."""
    model = options_model(cls)
    try:
        valid = model.model_validate(dict(options))
    except ValidationError as err:
        errors = err.errors()
        unknown = [str(e["loc"][0]) for e in errors if e["type"] == "extra_forbidden"]
        if unknown:
            raise ValueError(f"{label} takes no option {', '.join(map(repr, sorted(unknown)))}; "
                             f"allowed: {', '.join(model.model_fields)}") from None
        first = errors[0]
        where = ".".join(str(p) for p in first["loc"])
        got = f" (got {first['input']!r})" if first["type"] != "missing" else ""
        raise ValueError(f"{label} option {where}: {first['msg']}{got}") from None
    return {**{k: getattr(valid, k) for k in valid.model_fields_set}, **(valid.model_extra or {})}


def build(spec: str, options: Mapping[str, Any], defaults: Mapping[str, Any] | None = None
          ) -> Agent:
    """The agent of a registered name or ``"module:Class"``, its ``options`` validated by
    :func:`check_options`; ``defaults`` fill the options it takes that are not given (a
    run's seed, its checkpoint)."""
    cls = agent_class(spec)
    taken = options_model(cls).model_fields
    given = dict(options)
    for key, value in (defaults or {}).items():
        if key in taken:
            given.setdefault(key, value)
    return cls(**check_options(cls, given, spec))


def create(spec: str, /, **options: Any) -> Agent:
    """An agent by registered name or ``"module:Class"``, with keyword options
    (:func:`build`)."""
    return build(spec, options)

"""The agent protocol and registry.

An agent proposes batches of joint-space candidates and observes measured latencies.
The default tuning loop ranks each proposed batch with the cost model, measures the
top-k and reports those back; an agent may instead override ``run`` and drive the
environments itself (the PPO agent does, through stable-baselines3). A config names an
agent by its registered name (``"random"``) or as ``"my_module:MyAgent"``.

An agent's options are one pydantic model (:func:`options_model`): the class's ``Options``
where it declares one (every built-in does, :mod:`agents.options`), and the agent is then
made as ``cls(options)`` from the validated model; otherwise a model made of its
``__init__`` signature (each keyword parameter a field of its annotated type and default),
and the agent is made as ``cls(**options)``. Every agent is built through :func:`build`,
which validates the options once. This module imports no TVM, torch or agent
implementation: :func:`validate_options` checks a built-in agent's options without
importing it.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import typing
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel, ConfigDict, ValidationError, create_model

from .options import BUILTIN

if TYPE_CHECKING:
    from altenv.tuning.budget import Budget
    from altenv.tuning.session import TuningSession
    from altenv.tuning.task import Candidate, Factors


class Agent(ABC):
    """Base class of search strategies.

    ``propose`` is called with ``layout=None`` in the joint stage (the agent picks
    layouts too) and with the fixed best layout in the loop-only stage. A class that
    declares ``Options`` (a pydantic model) is made from one validated instance of it,
    ``cls(options)``; one without is made from the keywords of its ``__init__``.
    """

    name = "agent"
    Options: ClassVar[type[BaseModel]]

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
        from altenv.tuning.loop import propose_and_measure  # TVM: only when tuning

        self.setup(session)
        propose_and_measure(session, self, budget, batch, top_k, report)


_REGISTRY: dict[str, Callable[..., Agent]] = {}


def register(name: str) -> Callable[[type[Agent]], type[Agent]]:
    """Class decorator: make an agent available under ``name``."""

    def wrap(cls: type[Agent]) -> type[Agent]:
        _REGISTRY[name] = cls
        cls.name = name
        return cls

    return wrap


def available() -> list[str]:
    """Registered agent names, built-ins included."""
    return sorted(set(_REGISTRY) | set(BUILTIN))


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
    if spec not in _REGISTRY and spec in BUILTIN:
        importlib.import_module(BUILTIN[spec][0].partition(":")[0])  # registers itself
    if spec not in _REGISTRY:
        raise ValueError(f"agent: unknown agent {spec!r}; allowed: {', '.join(available())} "
                         "or 'module:Class'")
    return _REGISTRY[spec]


def _declared(cls: type) -> type[BaseModel] | None:
    """The ``Options`` model a class declares (``None``: it takes keywords)."""
    return getattr(cls, "Options", None)


@functools.cache
def options_model(cls: type) -> type[BaseModel]:
    """The typed options of an agent class: its ``Options`` where it declares them, else a
    model made from its ``__init__`` signature: one field per keyword parameter, of its
    annotated type (``Any`` without one) and with its default; other options are refused
    unless ``__init__`` takes ``**kwargs``."""
    declared = _declared(cls)
    if declared is not None:
        return declared
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


def _validate(model: type[BaseModel], options: Mapping[str, Any], label: str) -> BaseModel:
    """``options`` validated by ``model``; a ``ValueError`` of one line names the first bad
    option and what is allowed (``label``: the agent's name in messages)."""
    try:
        return model.model_validate(dict(options))
    except ValidationError as err:
        errors = err.errors()
        unknown = [str(e["loc"][0]) for e in errors if e["type"] == "extra_forbidden"]
        if unknown:
            raise ValueError(f"{label} takes no option {', '.join(map(repr, sorted(unknown)))}; "
                             f"allowed: {', '.join(model.model_fields)}") from None
        first = errors[0]
        where = ".".join(str(p) for p in first["loc"])
        msg = " ".join(first["msg"].removeprefix("Value error, ").split())
        got = f" (got {first['input']!r})" if first["type"] != "missing" else ""
        raise ValueError(f"{label} option {where}: {msg}{got}") from None


def check_options(cls: type, options: Mapping[str, Any], label: str) -> BaseModel:
    """``options`` validated, once, by the class's :func:`options_model` (values converted
    to its types): the instance :func:`build` takes. A ``ValueError`` of one line names
    the first bad option and what is allowed (``label``: the agent's name in messages)."""
    return _validate(options_model(cls), options, label)


def validate_options(name: str, options: Mapping[str, Any]) -> BaseModel:
    """The options of the agent ``name`` validated as :func:`check_options` does. A
    built-in's (:data:`agents.options.BUILTIN`) are checked without importing the agent;
    another registered name's against its class, and a ``"module:Class"`` is imported
    (it runs user code)."""
    if name in BUILTIN and name not in _REGISTRY:
        return _validate(BUILTIN[name][1], options, name)
    return check_options(agent_class(name), options, name)


def build(spec: str, options: Mapping[str, Any] | BaseModel,
          defaults: Mapping[str, Any] | None = None) -> Agent:
    """The agent of a registered name or ``"module:Class"``. ``options`` are a mapping,
    validated by :func:`check_options`, or an instance of the class's
    :func:`options_model` validated before (not validated again); ``defaults`` fill the
    options it takes that are not given (a run's seed, its checkpoint)."""
    cls = agent_class(spec)
    model = options_model(cls)
    fill = {k: v for k, v in (defaults or {}).items() if k in model.model_fields}
    if isinstance(options, BaseModel):
        if not isinstance(options, model):
            raise TypeError(f"{spec}: options of type {type(options).__name__}, "
                            f"not {model.__name__}")
        valid = options.model_copy(update={k: v for k, v in fill.items()
                                           if k not in options.model_fields_set})
    else:
        valid = check_options(cls, {**fill, **options}, spec)
    if _declared(cls) is not None:
        return cls(valid)
    return cls(**{k: getattr(valid, k) for k in valid.model_fields_set},
               **(valid.model_extra or {}))


def create(spec: str, /, **options: Any) -> Agent:
    """An agent by registered name or ``"module:Class"``, with keyword options
    (:func:`build`)."""
    return build(spec, options)

"""The agent protocol and registry.

An agent proposes batches of joint-space candidates and observes measured latencies.
The default tuning loop ranks each proposed batch with the cost model, measures the
top-k and reports those back; an agent may instead override ``run`` and drive the
environments itself (the PPO agent does, through stable-baselines3). A config names an
agent by its registered name (``"random"``) or as ``"my_module:MyAgent"``.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any

from altenv.tuning.loop import Budget, propose_and_measure
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
    """The agent class of a registered name or ``"module:Class"``."""
    if ":" in spec:
        module, _, cls_name = spec.partition(":")
        try:
            cls = getattr(importlib.import_module(module), cls_name)
        except (ImportError, AttributeError) as err:
            raise ValueError(f"agent: cannot import {spec!r} ({err})") from err
        if not (isinstance(cls, type) and issubclass(cls, Agent)):
            raise ValueError(f"agent: {spec!r} is not a subclass of agents.base.Agent")
        return cls
    if spec not in _REGISTRY and spec in _BUILTIN:
        importlib.import_module(_BUILTIN[spec].partition(":")[0])  # registers itself
    if spec not in _REGISTRY:
        raise ValueError(f"agent: unknown agent {spec!r}; allowed: {', '.join(available())} "
                         "or 'module:Class'")
    return _REGISTRY[spec]


def create(spec: str, **options: Any) -> Agent:
    """An agent by registered name or ``"module:Class"``, with keyword options."""
    return agent_class(spec)(**options)

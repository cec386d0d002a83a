"""What a run needs beyond its config, checked before its directory is made.

A device that is not there, an agent that does not build, a workload without the template
asked for or a model that does not import is a :class:`~altenv.config.ConfigError` of one
line, and bad input leaves nothing behind. Runs, ``altenv train`` and ``altenv bench`` all
check through here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import agents
from agents.checkpoint import has_policy

from ..config import AgentConfig, ConfigError, RunConfig, SearchConfig, TrainConfig
from ..graph import ImportedModel, load_model
from ..ops.workload import Workload
from ..target import check_device as present
from ..target import check_target
from ..tuning import Budget, OpTask, TuningJob
from .rundir import RunDir


def check_device(target: Any) -> None:
    """A :class:`ConfigError` of one line unless ``target`` (a config's) is one TVM makes
    (:func:`~altenv.target.check_target`: an LLVM CPU, ``num-cores``) and its device is
    present on this host."""
    try:
        present(check_target(target))
    except ValueError as err:
        raise ConfigError(f"target: {err}") from None


def make_agent(agent: AgentConfig, defaults: dict[str, Any]) -> agents.Agent:
    """The agent ``agent`` names, built by :func:`agents.build` (its options typed and
    checked; ``defaults`` fill those it takes and were not given); whatever is wrong (a
    module that does not import, an option of the wrong type or value) is a
    :class:`ConfigError` of one line."""
    try:
        return agents.build(agent.name, agent.options, defaults)
    except (ValueError, TypeError) as err:
        raise ConfigError(f"agent: {' '.join(str(err).removeprefix('agent: ').split())}"
                          ) from None


def check_run(cfg: RunConfig | TrainConfig, **defaults: Any) -> agents.Agent:
    """The target's device is present (:func:`check_device`), the Ray cluster of a run with
    ``ray:`` is joined (:func:`~altenv.cluster.session.connect`), and the agent is built
    (:func:`make_agent`; ``seed``, the run's own checkpoint when resuming and ``defaults``
    fill options it takes). A run directory that is there already must hold only files and
    folders (:meth:`RunDir.check`). Returns the agent; a :class:`ConfigError` of one line
    otherwise."""
    check_device(cfg.target)
    if getattr(cfg, "ray", None) is not None:
        from ..cluster.session import connect  # Ray only for a run that names it

        connect(cfg.ray)
    run_dir = RunDir(cfg.run_dir)
    run_dir.check()  # before its checkpoint is read
    own = run_dir.checkpoint
    if has_policy(own):
        defaults.setdefault("checkpoint", str(own))
    agent = make_agent(cfg.agent, {"seed": cfg.seed, **defaults})
    if isinstance(cfg, TrainConfig) and not hasattr(agent, "save"):
        raise ConfigError(f"agent: {cfg.agent.name!r} has nothing to train (no save()); use an "
                          "agent such as 'ppo'")
    return agent


def make_job(workload: Workload, epilogue: Sequence[str], target: Any, search: SearchConfig,
             budget: Budget, agent: agents.Agent, mapping: str = "none",
             model: bool = False) -> TuningJob:
    """The :class:`~altenv.tuning.TuningJob` of operator ``workload``: ``altenv tune``, a bench
    cell and ``bench scale`` build theirs here from the same settings (``search``, a task of
    a model run with ``model``), so that they tune alike; a template the workload cannot
    have is a :class:`ConfigError` of one line."""
    task = _task(workload, target, epilogue, search.levels, mapping)
    return TuningJob(task, agent, budget, search.options(model))


def op_task(cfg: RunConfig | TrainConfig, workload: Workload, mapping: str = "none") -> OpTask:
    """The :class:`~altenv.tuning.OpTask` of an operator run or of a workload to train on;
    a template the workload cannot have (e.g. no intrinsic mapping of it) is a
    :class:`ConfigError` of one line."""
    return _task(workload, cfg.target, cfg.epilogue, cfg.search.levels, mapping)


def _task(workload: Workload, target: Any, epilogue: Sequence[str], levels: int,
          mapping: str) -> OpTask:
    try:
        return OpTask(workload, target, epilogue, levels, mapping=mapping)
    except ValueError as err:
        raise ConfigError(f"workload {str(workload)!r}: {' '.join(str(err).split())}") from None


def load_user_model(source: str, options: dict[str, Any], seed: int) -> ImportedModel:
    """Import a user's model (:func:`altenv.graph.load_model`; a ``file.py:factory`` or zoo
    model runs Python); anything that goes wrong is a :class:`ConfigError` of one line
    naming the model (a missing or unreadable file, an operator the frontend cannot
    convert, a bad ``model_options`` value, whatever the factory raises)."""
    try:
        return load_model(source, seed=seed, **options)
    except Exception as err:  # noqa: BLE001 (a user's factory may raise anything)
        lines = [line for line in str(err).splitlines() if line.strip()]
        reason = " ".join(lines[0].split()) + (" (...)" if len(lines) > 1 else "") \
            if lines else ""
        raise ConfigError(f"model {source!r}"
                          + (f" with model_options {options}" if options else "")
                          + f": cannot import it ({type(err).__name__}: {reason})") from err

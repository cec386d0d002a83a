"""``altenv train CONFIG``: the stages that make a pretrained agent, each resumable.

1. **corpus**: random joint-space candidates of drawn workloads measured on this CPU
   (``<run>/corpus/records.jsonl``), and the cross-workload cost model fitted to them and
   to any other records named (``<run>/costmodel.npz``), with its ranking quality on
   held-out workloads (``<run>/costmodel-ranking.json``);
2. **pretrain**: the policy on cost-model rewards across other drawn workloads, on
   parallel environments; nothing is measured, so it is cheap;
3. **workloads**: measured tuning of each listed workload (and each complex task of the
   listed models) in turn, the agent learning from measurements.

The agent is saved to ``<run>/checkpoint`` after every stage and workload with a card
(``card.json``, ``CARD.md``): what it was trained on, where, how long, and a hash of its
files. ``publish`` copies the checkpoint, e.g. to ``altenv/pretrained/ppo/{mcpu}``, where
the ``ppo`` agent finds it by default on that CPU.
"""

from __future__ import annotations

import datetime
import functools
import json
import platform
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import numpy as np
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv

import agents
from envs.cross import CrossExplorationEnv
from envs.cross_replay import CrossExplorationReplayEnv

from .. import pretrained
from ..config import ConfigError, TrainConfig
from ..costmodel import CostModel
from ..datapath import dataset_dir
from ..dataset import Dataset
from ..files import check_file, read_json, write_json, write_text
from ..graph.plan import plan_network
from ..graph.tasks import extract_tasks
from ..measure import create
from ..ops.epilogue import DEFAULT_FAST_MATH
from ..records import RecordDB
from ..suites import suite_specs
from ..target import make_target
from ..training import fit_cost_model, measure_corpus, ranking_report, record_examples
from ..tuning import OpTask, TuningJob
from .checks import check_run, load_user_model, op_task
from .rundir import RunDir
from .tensorboard import TensorBoardLog


def model_tasks(cfg: TrainConfig, source: str) -> list[OpTask]:
    """The complex tasks of a model that a run would tune (one per operator and epilogue);
    a model that does not import is a :class:`ConfigError` of one line."""
    graph = extract_tasks(load_user_model(source, cfg.model_options, cfg.seed))
    plan = plan_network(graph, fast_math=DEFAULT_FAST_MATH)
    tasks = dict.fromkeys((low.workload, tuple(low.epilogue)) for low in plan.lowerings.values())
    return [OpTask(workload, cfg.target, epilogue, cfg.search.levels)
            for workload, epilogue in tasks]


class _State:
    """What the stages have done (``<run>/train-state.json``): a killed run resumes."""

    def __init__(self, path: Path):
        self.path = path
        self.data: dict[str, Any] = read_json(path) if check_file(path) else {}
        if not isinstance(self.data, dict):
            raise ConfigError(f"{path}: not the training state altenv writes (the top level "
                              "is not a mapping); delete it to train from the start")

    def __getitem__(self, key: str) -> Any:
        return self.data.get(key)

    def __setitem__(self, key: str, value: Any) -> None:
        self.data[key] = value
        write_json(self.path, self.data)


def _corpus(cfg: TrainConfig, state: _State, specs: list[str], progress: bool) -> CostModel:
    """Stage 1: measure the corpus, fit the cost model, report its held-out ranking."""
    corpus = cfg.corpus
    assert corpus is not None
    run_dir = RunDir(cfg.run_dir)
    model_path = run_dir.cost_model
    start = time.perf_counter()
    measure_corpus(specs, corpus.trials, run_dir.corpus, cfg.target, cfg.measure,
                   lambda seed: agents.create("random", seed=seed), seed=cfg.seed,
                   batch=cfg.search.batch, top_k=cfg.search.top_k, progress=progress)
    state["corpus_seconds"] = (state["corpus_seconds"] or 0.0) + time.perf_counter() - start
    if state["costmodel"] and model_path.exists():
        return CostModel.load(model_path)
    start = time.perf_counter()
    paths = [run_dir.corpus, *map(Path, corpus.records)]
    examples = record_examples(paths, cfg.target, progress=progress)
    rng = np.random.default_rng(cfg.seed)
    held = set(rng.permutation(len(examples))[:round(corpus.holdout * len(examples))].tolist())
    if held:
        report = ranking_report(fit_cost_model([e for i, e in enumerate(examples)
                                                if i not in held], cfg.seed),
                                [e for i, e in enumerate(examples) if i in held], seed=cfg.seed)
        print(report.table())
        write_json(run_dir.ranking, report.to_json())
    model = fit_cost_model(examples, cfg.seed)
    model.save(model_path, records=False)
    state["costmodel"] = {"workloads": len(examples),
                          "records": sum(len(e.latencies) for e in examples),
                          "sources": [str(p) for p in paths],
                          "seconds": time.perf_counter() - start}
    return model


def _pretrain(cfg: TrainConfig, state: _State, agent: Any, cost_model: Path | None) -> None:
    """Stage 2: the policy on cost-model rewards across drawn workloads, or on a dataset's
    replayed ones, on parallel envs;
    the checkpoint and the state are saved every few updates, so a killed run resumes."""
    pre = cfg.pretrain
    assert pre is not None
    done = state["pretrain_steps"] or 0
    if done >= pre.timesteps:
        return
    if pre.reward_source == "dataset":
        options = {k: v for k, v in agent.env_options.items()
                   if k in ("episode_layouts", "loop_rounds", "walk_length")}
        env_fn = functools.partial(CrossExplorationReplayEnv, dataset=pre.dataset,
                                   batch=pre.batch, **options)
        data = Dataset.open(dataset_dir(pre.dataset))
        state["pretrain_workloads"] = [f"altenv://{data.name}/{n}" for n in data.workloads()]
    else:
        assert pre.draw is not None and cost_model is not None
        specs = pre.draw.draw(suite_specs() | set(state["corpus_workloads"] or ()))
        state["pretrain_workloads"] = specs
        env_fn = functools.partial(CrossExplorationEnv, specs, cfg.target,
                                   reward_source="cost_model", cost_model=str(cost_model),
                                   batch=pre.batch, **agent.env_options)
    make = functools.partial(make_vec_env, env_fn, n_envs=pre.envs, seed=cfg.seed + done,
                             vec_env_cls=SubprocVecEnv if pre.envs > 1 else DummyVecEnv)
    every = agent.ppo_options["n_steps"] * pre.envs * 8  # steps between checkpoints
    checkpoint = RunDir(cfg.run_dir).checkpoint
    start = time.perf_counter()

    class Save(BaseCallback):
        def __init__(self) -> None:
            super().__init__()
            self.begin = self.last = 0

        def _on_training_start(self) -> None:
            self.begin = self.last = self.model.num_timesteps

        def _on_step(self) -> bool:
            if self.model.num_timesteps - self.last >= every:
                self.last = self.model.num_timesteps
                seconds = time.perf_counter() - start
                steps = done + self.model.num_timesteps - self.begin
                agent.save(checkpoint)
                state["pretrain_seconds"] = (state["pretrain_seconds_before"] or 0.0) + seconds
                state["pretrain_steps"] = steps
                state["pretrain_steps_per_second"] = (steps - done) / seconds
                print(f"pretrain: {steps}/{pre.timesteps} steps, "
                      f"{(steps - done) / seconds:.1f} env steps/s on {pre.envs} envs")
            return True

    state["pretrain_seconds_before"] = state["pretrain_seconds"] or 0.0
    rate = agent.pretrain(make, pre.timesteps - done, Save())
    agent.save(checkpoint)
    state["pretrain_seconds"] = state["pretrain_seconds_before"] + time.perf_counter() - start
    state["pretrain_steps"] = pre.timesteps
    state["pretrain_steps_per_second"] = rate
    print(f"pretrain: {pre.timesteps} steps, {rate:.1f} env steps/s on {pre.envs} envs")


def _workloads(cfg: TrainConfig, state: _State, agent: Any, cost_model: CostModel | None,
               tasks: list[OpTask], db: RecordDB, progress: bool) -> None:
    """Stage 3: measured tuning of each workload and model task in turn."""
    if not tasks:
        return
    budget = cfg.budget.stages
    shared = CostModel(seed=cfg.seed, base=cost_model) if cost_model is not None \
        else CostModel(seed=cfg.seed)
    run_dir = RunDir(cfg.run_dir)
    log = TensorBoardLog(run_dir.tensorboard)
    start = time.perf_counter()
    with create(None, cfg.measure, cfg.target) as measurer:
        for task in tasks:
            job = TuningJob(task, agent, budget, cfg.search.options())
            session = job.session(measurer, db, shared)
            if session.trials >= budget.total:
                continue
            best = job.run(session, progress, callbacks=[log])
            agent.save(run_dir.checkpoint)
            print(f"{task.key}: best {best * 1e3:.4g} ms after {session.trials} trials")
    log.close()
    state["workloads"] = [t.key for t in tasks]
    state["workloads_seconds"] = (state["workloads_seconds"] or 0.0) + (
        time.perf_counter() - start)


def _git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, timeout=10, cwd=Path(__file__).parent)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def write_card(cfg: TrainConfig, state: _State, checkpoint: Path, command: str
               ) -> dict[str, Any]:
    """``card.json`` and ``CARD.md`` beside the checkpoint's files."""
    target = make_target(cfg.target)
    files = sorted(p.name for p in checkpoint.iterdir()
                   if p.is_file() and p.name not in (pretrained.CARD, "CARD.md"))
    ranking_path = RunDir(cfg.run_dir).ranking
    card = {
        "agent": cfg.agent.name, "options": cfg.agent.given,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": _git_commit(), "command": command, "cpu": _cpu_name(),
        "target": str(target),
        "mcpu": str(target.attrs.get("mcpu", "")),
        "corpus": None if cfg.corpus is None else {
            "workloads": state["corpus_workloads"], "trials_per_workload": cfg.corpus.trials,
            "extra_records": cfg.corpus.records, "seconds": state["corpus_seconds"],
            "cost_model": state["costmodel"],
            "held_out_ranking": json.loads(ranking_path.read_text())
            if ranking_path.exists() else None},
        "pretrain": None if cfg.pretrain is None else {
            "workloads": state["pretrain_workloads"], "timesteps": state["pretrain_steps"],
            "envs": cfg.pretrain.envs, "seconds": state["pretrain_seconds"],
            "env_steps_per_second": state["pretrain_steps_per_second"]},
        "measured_workloads": state["workloads"], "measured_seconds": state["workloads_seconds"],
        "files": files, "sha256": pretrained.files_hash(checkpoint, files),
    }
    write_json(checkpoint / pretrained.CARD, card)
    write_text(checkpoint / "CARD.md", card_markdown(card))
    return card


def card_markdown(card: dict[str, Any]) -> str:
    """A card as a short page a person reads."""
    lines = [f"# Checkpoint card: {card['agent']}", "",
             f"- made {card['created']} at commit {card['commit']} by `{card['command']}`",
             f"- measured on: {card['cpu']}, TVM target `{card['target']}`",
             f"- files: {', '.join(card['files'])}; sha256 `{card['sha256']}`"]
    corpus = card.get("corpus")
    if corpus:
        lines.append(f"- corpus: {len(corpus['workloads'] or [])} drawn workloads x "
                     f"{corpus['trials_per_workload']} measured trials "
                     f"({(corpus['seconds'] or 0) / 60:.0f} min)")
        rank = corpus.get("held_out_ranking")
        if rank:
            lines.append(f"- cost model, held-out ranking ({rank['workloads']} workloads): "
                         + ", ".join(f"{k} rho {v:.2f}" for k, v in rank["spearman"].items()))
    pre = card.get("pretrain")
    if pre:
        lines.append(f"- pretraining: {pre['timesteps']} env steps on {pre['envs']} envs over "
                     f"{len(pre['workloads'] or [])} drawn workloads "
                     f"({(pre['seconds'] or 0) / 60:.0f} min, "
                     f"{pre['env_steps_per_second'] or 0:.1f} steps/s)")
    if card.get("measured_workloads"):
        lines.append(f"- measured tuning: {', '.join(card['measured_workloads'])}")
    lines += ["", "Training workloads are drawn apart from every benchmark suite's "
              "(`configs/bench/`). The files are numpy arrays and JSON: loading them runs no "
              "code.", ""]
    return "\n".join(lines)


def train(cfg: TrainConfig, progress: bool = True, repair: bool = False,
          command: str | None = None) -> Path:
    """Run the configured stages (see the module docstring); returns the checkpoint. What
    the run needs (agent, workloads, models) is checked before its directory is made;
    ``repair`` moves bad lines of its records aside; ``command`` goes on the card."""
    run_dir = RunDir(cfg.run_dir)
    checkpoint = run_dir.checkpoint
    configured = cfg  # what the card says the run was given
    if (checkpoint / "policy.json").exists():  # resume from the run's own, whatever it began from
        options = {**cfg.agent.given, "checkpoint": str(checkpoint)}
        cfg = cfg.model_copy(update={"agent": cfg.agent.model_copy(update={"options": options})})
    agent = check_run(cfg, tensorboard_log=str(run_dir.tensorboard))
    if (cfg.corpus or cfg.pretrain) and not hasattr(agent, "pretrain"):
        raise ConfigError(f"agent: {cfg.agent.name!r} cannot pretrain on cost-model rewards; "
                          "drop 'corpus' and 'pretrain' or use 'ppo'")
    cost_model: CostModel | None = getattr(agent, "base", None)
    if cfg.pretrain is not None and cfg.pretrain.reward_source == "cost_model" \
            and cfg.corpus is None and cost_model is None:
        raise ConfigError("pretrain: needs a cost model: add 'corpus' or start from a "
                          "checkpoint that has one")
    tasks = [op_task(cfg, w) for w in cfg.workloads]
    for source in cfg.models:
        tasks += model_tasks(cfg, source)
    state = _State(run_dir.train_state)  # checked (check_run) and read before anything is written
    with run_dir.open(cfg, repair) as db:
        if cfg.corpus is not None:
            state["corpus_workloads"] = cfg.corpus.draw.draw(suite_specs())
            cost_model = _corpus(cfg, state, state["corpus_workloads"], progress)
            agent.use_cost_model(cost_model)
            agent.save(checkpoint)
        if cfg.pretrain is not None:
            path = run_dir.cost_model if cost_model is not None else None
            if path is not None and not path.exists():
                cost_model.save(path, records=False)
            _pretrain(cfg, state, agent, path)
        _workloads(cfg, state, agent, cost_model, tasks, db, progress)
        agent.save(checkpoint)
        write_card(configured, state, checkpoint, command or f"altenv train {cfg.name}.yaml")
    if cfg.publish:
        made_on = make_target(cfg.target)
        target = Path(cfg.publish.format(mcpu=made_on.attrs.get("mcpu") or made_on.kind.name))
        target.mkdir(parents=True, exist_ok=True)
        for f in checkpoint.iterdir():
            if f.is_file():
                shutil.copy2(f, target / f.name)
        print(f"published {checkpoint} to {target}")
    return checkpoint

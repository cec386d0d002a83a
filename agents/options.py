"""The typed options of the built-in agents, one pydantic model per agent.

A config's ``agent.options`` are validated against these (:func:`agents.validate_options`)
without importing the agents themselves (TVM, torch, stable-baselines3): this module
imports pydantic, the standard library and :mod:`altenv.strict` only. Unknown options are
refused, and so is any value an agent cannot take; an agent is then built from the
validated model (:func:`agents.build`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator

from altenv.strict import Strict

PRETRAINED = "pretrained"
"""The shipped checkpoint for the run's CPU (``altenv.pretrained.PRETRAINED``; that module
imports TVM)."""

Share = Annotated[float, Field(ge=0.0, le=1.0)]
"""A fraction in [0, 1]."""
AtLeastOne = Annotated[int, Field(ge=1)]

LayoutDraws = Literal["solver", "actions"]
LayoutRank = Literal["measured", "predicted"]
LoopSearch = Literal["metaschedule", "evolution"]
LayoutChoice = Literal["race", "bandit"]


class AgentOptions(Strict):
    """The base of the built-in agents' options: unknown options are refused, and so are
    booleans for numbers and ``.inf``/``.nan``, as in every config model."""


class RandomOptions(AgentOptions):
    """Options of the ``random`` agent."""

    seed: int = 0  # of the layout and loop-point draws


class EvolutionOptions(AgentOptions):
    """Options of the ``evolution`` agent (:class:`agents.evolution.EvolutionAgent`)."""

    seed: int = 0  # of sampling, mutation and exploration
    population: int = 64  # points kept per layout between generations
    generations: int = 3  # mutation rounds per batch
    children: int = 96  # made per generation (split over the batch's layouts)
    samples: int = 48  # fresh MetaSchedule samples per layout and batch
    elites: int = 16  # best measured points of a layout that join each batch's parents
    epsilon: Share = 0.125  # share of each measured batch drawn at random from the samples
    # Layouts each given one batch at the start of the joint stage (the default layout and
    # vector-friendly draws from the template); None: one per joint-stage batch, so the
    # joint stage only explores (4 when the agent runs without a budget).
    initial_layouts: AtLeastOne | None = 4
    # Batches each initial layout gets before the joint stage narrows to the best two;
    # None: 2 where the joint stage holds at least three such rounds, else 1. A layout's
    # first batch is picked by a cost model that has seen none of its points
    # (c2d_resnet_3x3's 8x8-channel-blocked layout ran 4.2 ms in its first batch, 2.6 ms in
    # its second and 1.36 ms in the end; one 400-trial run that saw only the first batch
    # never came back to it).
    initial_rounds: AtLeastOne | None = None
    # Batches the vendor-style blocked layout gets in the joint stage at least, after every
    # initial layout had its first (more than initial_rounds gives it): its first batch is
    # picked by a cost model that has seen none of its points, and the blocked layout is
    # the one TVM's own x86 schedules choose.
    blocked_rounds: AtLeastOne = 1
    # How the initial layouts are drawn: "solver" (RandSAT solutions of the layout model)
    # or "actions" (ALT's random layout actions, Eq. 2, kept when the layout model allows
    # them, so large tiles are likelier than small ones; the solver fills up when
    # EvolutionAgent.DRAW_TRIES draws per layout find too few).
    layout_draws: LayoutDraws = "solver"
    explore_layout: float = 0.25  # chance that a joint-stage batch tries a neighbour of the best
    # Search of the loop-only stage: "metaschedule" (MetaSchedule's EvolutionarySearch on
    # the best layout, of ms_population points and ms_batch candidates per iteration) or
    # "evolution" (the joint stage's evolution, kept on the best layout).
    loop_search: LoopSearch = "metaschedule"
    ms_population: int = 512
    ms_batch: int = 64  # tune_tir's num_trials_per_iter
    # Layouts (the joint stage's best) raced at the start of the loop-only stage, each
    # given race_trials more trials per round; fewer when the race would take more than
    # half of that stage, none below two.
    race_layouts: int = Field(4, ge=0)
    race_trials: AtLeastOne = 8
    # Search of the race's batches (and of the runner-ups' turns after a stall):
    # "evolution" (the joint stage's evolution, a few hundred points per batch) or
    # "metaschedule" (a MetaSchedule search of ms_population points started per entrant,
    # most of whose candidates a layout that loses the race never measures).
    race_search: LoopSearch = "evolution"
    # How the loop-only stage shares its trials among layouts: "race" (the race above,
    # then the winner; runner-ups only after a stall, see stall_trials) or "bandit"
    # (agents.layout_bandit: every turn of race_trials goes to one of the joint stage's
    # race_layouts best layouts and the framework layout by a UCB index, the log of how far
    # a layout's best is behind plus bandit_exploration x sqrt(log(trials) / its trials);
    # the framework layout gets a turn whenever it has had less than framework_share of
    # the stage; the best layout is searched by loop_search, the others by race_search).
    layout_choice: LayoutChoice = "race"
    bandit_exploration: Annotated[float, Field(ge=0.0)] = 0.5
    framework_share: Share = 0.125
    # Decisions in which two candidates of one measured batch differ at least while the
    # ranked batch offers enough such (agents.evolution.spread; 1: plain top-k).
    diversity: AtLeastOne = 2
    # Trials of the loop-only stage without a new best after which it revisits the
    # runner-up layouts, revisit_trials each, with the best layout's turn of as many in
    # between (counted from the end of the race, so that 200 trials, 140 of them
    # loop-only, never reach 128); None: never. At 1000 trials on alt9 128 was level on
    # gmm_64x1280x960 and 6 % behind on c1d_512.
    stall_trials: AtLeastOne | None = None
    revisit_trials: AtLeastOne = 64
    # How layouts are ranked where the joint stage narrows to the best two and where the
    # race picks and halves its entrants: "measured" (by each layout's best measured
    # trial) or "predicted" (by the highest cost-model score over the layout's loop
    # population, evolved afresh for the ranking; a layout none of whose trials ran is
    # left out). A predicted ranking is made once per set of layouts in the race, so that
    # the race's rounds do not change as the model retrains (a resumed run ranks again,
    # with the model of its records).
    layout_rank: LayoutRank = "measured"
    # What the session's cost model starts from: None, nothing (it learns from the run's
    # own records; before its first training it ranks at random); "pretrained", the
    # shipped cross-workload model for the session's target (the one the ppo agent
    # continues); or a checkpoint directory holding a costmodel.npz (altenv train's
    # <run>/checkpoint). Trees fitted to the run's records are added to it once it has
    # base_warmup (32) of them.
    cost_model: str | None = None
    # A ppo policy whose layout actor proposes initial layouts (agents.ppo.PPOAgent.layouts,
    # nothing measured): a checkpoint directory (PPOAgent.save, altenv train's publish) or
    # "pretrained" (the shipped one for the run's CPU). Its prior_layouts picks (the most
    # probable first) join the initial layouts right after the default and the blocked one,
    # in place of solver draws; the race then judges them as any other. None: no prior.
    layout_prior: str | None = None
    prior_layouts: AtLeastOne = 1

    @field_validator("layout_prior")
    @classmethod
    def _policy_found(cls, value: str | None) -> str | None:
        if value is None or value == PRETRAINED:
            return value
        from .checkpoint import has_policy  # imports torch: only for a directory of one's own

        if not has_policy(value):
            raise ValueError(f"must be null, {PRETRAINED!r} or a checkpoint directory "
                             "holding a policy (policy.npz and policy.json)")
        return value

    @field_validator("cost_model")
    @classmethod
    def _cost_model_found(cls, value: str | None) -> str | None:
        if value is None or value == PRETRAINED:
            return value
        from altenv import pretrained  # imports TVM: only for a directory of one's own

        if pretrained.cost_model(value) is None:
            raise ValueError(f"must be null, {PRETRAINED!r} or a checkpoint directory "
                             f"holding a {pretrained.COST_MODEL}")
        return value


class PPOOptions(AgentOptions):
    """Options of the ``ppo`` agent (:class:`agents.ppo.PPOAgent`)."""

    seed: int = 0  # of the model and the environments
    # "pretrained" (the shipped checkpoint made on the run's CPU, or on one with SIMD
    # registers as wide: altenv.pretrained.ppo_checkpoint), a directory written by
    # PPOAgent.save or altenv train, or None (no pretraining).
    checkpoint: str | None = PRETRAINED
    # Layout visits per episode, sampled rounds per visit and loop steps per round
    # (altenv/CrossExploration-v0).
    episode_layouts: int = 4
    loop_rounds: int = 2
    walk_length: int = 16
    # PPO hyper-parameters (SB3's meanings); n_steps environment steps per update.
    n_steps: int = 64
    batch_size: int = 64
    n_epochs: int = 4
    learning_rate: float = 3e-4
    gamma: float = 0.99
    gae_lambda: float = 0.95
    ent_coef: float = 0.01
    # SB3's policy ("MlpPolicy" or "module:Class", a MaskableActorCriticPolicy subclass)
    # and its keyword arguments (activation_fn by name, *_class entries as
    # "module:Class"), e.g. a features extractor of one's own.
    policy: str = "MlpPolicy"
    policy_kwargs: dict[str, Any] | None = None
    # Budgets up to zero_shot_budget trials are tuned without learning: the policy
    # searches the cost model for zero_shot_seconds, then the best predicted few are
    # measured; a zero_shot_prior share of the search time and of the measured trials
    # goes to the vendor-style blocked layout (PPOAgent.zero_shot).
    zero_shot_budget: int = 16
    zero_shot_seconds: float = 10.0
    zero_shot_prior: Share = 0.25
    learn: bool = True  # whether the policy keeps learning during a run (False: it only acts)
    tensorboard_log: str | None = None  # directory of SB3's TensorBoard logs
    # Layouts obey the SIMD-length layout constraints that evolution samples under (masked
    # bins; constraints between knobs by projecting the layout actor's choice).
    hardware_constraints: bool = True
    # Random neighbours of the layout's best measured points added to each round's
    # sampled batch, so the loop actors' walks can start next to what measured best.
    mutations: int = 0
    # Share of each update's policy loss carried by the layout actor's steps
    # (agents.ppo.ActorWeights, as ALT's separate actor losses); None: every step weighs
    # the same (SB3's PPO, where layout steps are about 1/33 of the steps).
    layout_share: Annotated[float, Field(gt=0.0, lt=1.0)] | None = 0.5


class HeronCGAOptions(AgentOptions):
    """Options of the ``heron_cga`` agent (:class:`agents.heron_cga.HeronCGAAgent`)."""

    seed: int = 0  # of the solver's random searches, the selection and the mutation
    population: int | None = None  # None: the batch size the tuning loop asks for
    generations: int = Field(2, ge=0)  # evolved per propose call
    key_variables: AtLeastOne = 8  # kept from the XGBoost importance ranking
    min_records: int = 16  # measured records needed to rank key variables (else all genes)
    # Each crossover constraint beyond the one Heron always drops is dropped with this
    # probability.
    mutation_prob: Share = 0.2
    # Layouts drawn for the random part of a joint-stage population (the only new layouts
    # of a propose call: children inherit a parent's).
    layouts: AtLeastOne = 4
    hardware: bool = True  # add the SIMD-length and cache-capacity constraints of the target


class MindMappingsOptions(AgentOptions):
    """Options of the ``mind_mappings`` agent (:class:`agents.mind_mappings.MindMappingsAgent`)."""

    seed: int = 0  # of the surrogate's weights, the chains and the random draws
    # A surrogate written by MindMappingsAgent.save (its directory or the surrogate.pt
    # file), e.g. pretrained across workloads; None starts untrained.
    checkpoint: str | None = None
    hidden_sizes: Sequence[int] = (256, 128)  # of a new surrogate (a checkpoint has its own)
    chains: int = 8  # parallel descent chains per proposed batch
    steps: int = 16  # gradient steps per proposed batch
    # The descent's learning rate: how far (in encoded units) the entry of largest gradient
    # moves per step.
    step_size: float = 0.1
    # Random injections every injection_period steps (0: none), accepted by simulated
    # annealing at temperature (normalized-cost units), which is multiplied by anneal after
    # every batch.
    injection_period: int = 8
    temperature: float = 0.5
    anneal: float = 0.9
    # Surrogate training: Adam learning rate and passes over the records after each
    # measured batch.
    learning_rate: float = 1e-3
    epochs: int = 30
    # Successful measurements (of any workload) needed before a surrogate without
    # checkpoint is trusted; until then batches are random (as the random agent's).
    min_records: int = 8
    best_starts: float = 0.25  # fraction of the chains started at the best measured candidates


class DatasetBestOptions(AgentOptions):
    """Options of the ``dataset_best`` agent (:class:`agents.dataset_best.DatasetBestAgent`)."""

    dataset: str = "cpu-v0"  # a dataset's name (ALTENV_DATASETS, the shipped ones) or path
    top: AtLeastOne = 8  # the dataset's fastest programs of the workload measured, in order


BUILTIN: dict[str, tuple[str, type[AgentOptions]]] = {
    "random": ("agents.random:RandomAgent", RandomOptions),
    "ppo": ("agents.ppo:PPOAgent", PPOOptions),
    "evolution": ("agents.evolution:EvolutionAgent", EvolutionOptions),
    "heron_cga": ("agents.heron_cga:HeronCGAAgent", HeronCGAOptions),
    "mind_mappings": ("agents.mind_mappings:MindMappingsAgent", MindMappingsOptions),
    "dataset_best": ("agents.dataset_best:DatasetBestAgent", DatasetBestOptions),
}
"""The built-in agents: ``"module:Class"`` (imported on first use: PPO pulls in
stable-baselines3) and its options."""

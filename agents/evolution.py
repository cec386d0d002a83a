"""``evolution``: layout exploration plus a cost-model-guided evolutionary loop search.

ALT's two stages (§5.2) with the loop search of Ansor / MetaSchedule's evolutionary
strategy in place of random batches:

- Each batch evolves a population of loop points for a few generations: parents are
  the best measured points of the layout, the best predicted points kept from earlier
  batches and fresh MetaSchedule samples; children are one or two ``LoopSpace.move``
  mutations of parents drawn in proportion to their predicted throughput. The cost
  model scores every point (features cached by the session).
- The batch measures the ``top_k`` best-predicted new points, except that a share
  ``epsilon`` of them is drawn at random from the fresh samples (exploration, as
  MetaSchedule's epsilon-greedy).
- Each batch evolves loops of one layout. The joint stage first gives one batch to each
  of a few initial layouts (the default and vector-friendly draws from the template,
  ``altenv.space.constraints.LayoutConstraints``: its solver's solutions, or ALT's random
  layout actions that it allows), a second round of batches where the stage is long
  enough, then alternates between the two best measured layouts,
  now and then trying a neighbour of the best (one knob moved). The cost model is shared
  by all layouts (normalized per workload).
- The loop-only stage first races the best ``race_layouts`` layouts of the joint stage
  (successive halving: each round gives every entrant ``race_trials`` more trials and
  keeps the faster half), because a layout's first few trials say more about the luck of
  its loop samples than about the layout. It then keeps the winner and, by default, hands
  its loops to MetaSchedule's own ``EvolutionarySearch`` (``altenv.tuning.ms_search``),
  started from the layout's measured records (the race's among them) and ranked by the
  same cost model; ``loop_search="evolution"`` keeps the evolution above instead. The
  race's batches come from the evolution above (``race_search``): a MetaSchedule search
  per entrant costs a population of 512 points for the 8 to 16 trials a loser gets.
  ``layout_choice="bandit"`` plays those layouts and the framework one as a bandit
  instead (``agents.layout_bandit``): each turn of ``race_trials`` goes to the layout of
  highest UCB index, so none is dropped on a batch or two and a stalled one loses turns.
- ``layout_rank="predicted"`` ranks layouts, where the joint stage narrows and where the
  race picks and halves its entrants, by the best the cost model predicts over each
  layout's evolved loop population instead of by its best measured trial: a layout judged
  on one batch of 8 trials is judged on the luck of those samples (the best of
  ``heldout`` c2d_1's 16-channel blocked layout's first 8 trials was 27.9 ms in one seed,
  4.8 ms in two others), while the model ranks every layout by what all layouts' trials
  taught it. Off by default: on alt9 it ranked no better than the measured bests.
- ``cost_model="pretrained"`` starts the session's cost model from the shipped
  cross-workload model (the one the ``ppo`` agent starts from): every layout's first batch
  is then ranked by what other workloads taught, not by a model that has seen none of its
  points.
- ``layout_prior`` names a ``ppo`` policy (e.g. one trained on a measured-program
  dataset) whose layout actor proposes initial layouts: a policy trained on replayed
  measurements knows layouts that run fast on the host, but acting alone it plays one
  layout per workload and never tries another (``heldout`` c2d_2's three output channels,
  where its channel blocking ran 3x slower than the unblocked layout ``evolution`` kept).
  Here its picks are entrants beside the default and the blocked layout, judged by the
  race as any other.
- At large budgets the winner's loop search stalls (on held-out dep_1 and gmm_1 at 1000
  trials altenv's best stopped improving near trials 450 and 421 and the rest went to the
  same layout). With ``stall_trials`` set, once that many trials after the race bring no
  new best, the stage takes the runner-up layouts in turn, ``revisit_trials`` each with
  the best layout's turn in between, until one of them sets a new best (then it is the
  layout kept). Off by default: it has not paid on alt9 (see ``stall_trials``).
"""

from __future__ import annotations

import math
import warnings
from collections import Counter
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from altenv import pretrained
from altenv.space.constraints import Hardware, LayoutConstraints
from altenv.tuning.budget import Budget
from altenv.tuning.ms_search import LayoutLoopSearch
from altenv.tuning.session import TuningSession
from altenv.tuning.task import Candidate, Factors, freeze

from . import layout_bandit
from .base import Agent, register
from .options import EvolutionOptions, PPOOptions

if TYPE_CHECKING:
    from .ppo import PPOAgent


@register("evolution")
class EvolutionAgent(Agent):
    """Evolutionary search over the joint space, ranked by the session's cost model;
    options: :class:`~agents.options.EvolutionOptions`."""

    Options = EvolutionOptions
    DRAW_TRIES = 50
    """Layout actions drawn per wanted layout before the solver fills up."""
    STALL_GAIN = 0.01
    """A new best ends a stall when it is this much faster than the best before: on alt9's
    gmm_64x1280x960 at 1000 trials a 0.1 % gain (0.7207 to 0.7200 ms, under the noise of
    one timing) put off the second runner-up's turn for 128 trials."""

    def __init__(self, options: EvolutionOptions | None = None):
        o = EvolutionOptions() if options is None else options
        self.cost_model, self.layout_rank = o.cost_model, o.layout_rank
        self.loop_search, self.ms_population, self.ms_batch = (
            o.loop_search, o.ms_population, o.ms_batch)
        self.rng = np.random.default_rng(o.seed)
        self.population, self.generations, self.children = (
            o.population, o.generations, o.children)
        self.samples, self.elites, self.epsilon = o.samples, o.elites, o.epsilon
        self.initial_layouts, self.explore_layout = o.initial_layouts, o.explore_layout
        self.initial_rounds, self.blocked_rounds = o.initial_rounds, o.blocked_rounds
        self.layout_draws = o.layout_draws
        self.race_layouts, self.race_trials = o.race_layouts, o.race_trials
        self.race_search = o.race_search
        self.layout_choice, self.framework_share, self.bandit_exploration = (
            o.layout_choice, o.framework_share, o.bandit_exploration)
        self.diversity = o.diversity
        self.stall_trials, self.revisit_trials = o.stall_trials, o.revisit_trials
        self.layout_prior, self.prior_layouts = o.layout_prior, o.prior_layouts
        self._prior: PPOAgent | None = None  # the layout_prior's policy, made on first use
        self.seed = o.seed
        self._task: str | None = None
        self._budget: Budget | None = None
        self._top_k = 0

    def run(self, session: TuningSession, budget: Budget, batch: int, top_k: int,
            report: Callable[[TuningSession], None]) -> None:
        """The default loop; the budget's split sizes the layout race (and, with
        ``initial_layouts=None``, the initial layouts)."""
        self._budget, self._top_k = budget, top_k
        super().run(session, budget, batch, top_k, report)

    def _initial_count(self) -> int:
        """How many initial layouts the joint stage measures."""
        if self.initial_layouts is not None:
            return self.initial_layouts
        if self._budget is None or self._top_k < 1:
            return 4
        return max(1, math.ceil(self._budget.joint / self._top_k))

    def _rounds(self) -> int:
        """How many batches each initial layout gets (see ``initial_rounds``)."""
        if self.initial_rounds is not None:
            return self.initial_rounds
        if self._budget is None or self._top_k < 1:
            return 1
        round_trials = len(self._initial) * self._top_k
        return 2 if self._budget.joint >= 3 * round_trials else 1

    def setup(self, session: TuningSession) -> None:
        """Start a new search state when the agent moves to another task (a model run
        tunes its tasks one after another with the same agent)."""
        if session.task.key == self._task:
            return
        self._task = session.task.key
        if self.cost_model is not None:
            pretrained.start_from(session.cost_model, self.cost_model, session.task.target)
        self._pool: dict[Factors, list[Candidate]] = {}
        self._initial: list[Factors] = []
        self._blocked: Factors | None = None
        self._constraints: LayoutConstraints | None = None
        self._turn = 0
        self._fresh: list[Candidate] = []
        self._loop_searches: dict[Factors, LayoutLoopSearch] = {}
        self._exhausted: set[Factors] = set()
        self._race_ranks: dict[frozenset[Factors], list[Factors]] = {}

    # ----------------------------------------------------------------- layouts
    def _neighbour(self, session: TuningSession, factors: Factors) -> Factors:
        """``factors`` with one knob moved to an adjacent value that the layout model
        allows (``factors`` itself if no move is allowed)."""
        values = dict(factors)
        model = self._layout_model(session)
        choices = {k: sorted(model.knob_values(k)) for k in values}
        movable = [k for k in values if len(choices[k]) > 1]
        for knob in self.rng.permutation(movable):
            options = choices[knob]
            i = min(range(len(options)), key=lambda j: abs(options[j] - values[knob]))
            for step in self.rng.permutation([-1, 1]):
                if 0 <= i + step < len(options):
                    moved = {**values, knob: options[i + step]}
                    if model.holds(model.genes_of(moved)):
                        return freeze(moved)
        return factors

    def _layout_model(self, session: TuningSession) -> LayoutConstraints:
        if self._constraints is None:
            self._constraints = LayoutConstraints(session.task.template,
                                                  Hardware.of(session.task.target))
        return self._constraints

    def _draw_layouts(self, session: TuningSession, n: int) -> list[Factors]:
        """The default layout, the vendor-style blocked one (``NCHW[x]c``, packed GMM
        operands; when the layout model allows it) and distinct vector-friendly draws
        (see ``layout_draws``), ``n`` in all."""
        model = self._layout_model(session)
        layouts = dict.fromkeys([session.task.default_factors()])
        blocked = session.task.blocked_factors(model.hardware.lanes())
        if blocked is not None and model.holds(model.genes_of(dict(blocked))):
            layouts.setdefault(blocked)
        for factors in self._prior_layouts(session):
            if model.holds(model.genes_of(dict(factors))):
                layouts.setdefault(factors)
        if self.layout_draws == "actions":
            for _ in range(self.DRAW_TRIES * n):
                if len(layouts) >= n:
                    break
                factors = session.task.random_factors(self.rng)
                if model.holds(model.genes_of(dict(factors))):
                    layouts.setdefault(factors)
        for genes in model.sample(max(0, n - len(layouts)), self.rng):
            layouts.setdefault(freeze(model.factors(genes)))
        drawn = list(layouts)[:n]
        self._blocked = blocked if blocked in drawn[1:] else None
        return drawn

    def _prior_layouts(self, session: TuningSession) -> list[Factors]:
        """The ``layout_prior`` policy's picks for the task (none without one, or for a
        template its layout heads cannot express: an intrinsic mapping's)."""
        if self.layout_prior is None:
            return []
        from envs.cross import check_template

        from .ppo import PPOAgent  # stable-baselines3 and torch: only with a prior

        try:
            check_template(session.task.template)
        except ValueError as err:
            warnings.warn(f"evolution: layout_prior skipped on {session.task.key}: {err}",
                          stacklevel=2)
            return []
        if self._prior is None:
            self._prior = PPOAgent(PPOOptions(checkpoint=self.layout_prior, seed=self.seed,
                                              learn=False))
        return self._prior.layouts(session, self.prior_layouts, seed=self.seed)

    def _layout(self, session: TuningSession, joint: bool) -> Factors:
        """The layout of the next batch. Loop-only stage: the best. Joint stage: first
        each initial layout (the default and vector-friendly draws) once, in
        :meth:`_rounds` rounds (the blocked one in ``blocked_rounds`` at least); then the
        two best layouts in turn, or with probability ``explore_layout`` a neighbour of
        the best (successive narrowing of the layout candidates by measured latency). A
        layout has had its ``r``-th batch once more than ``r - 1`` batches' worth
        (``top_k``) of its points are measured, so a resumed run goes on where it
        stopped."""
        best, _ = session.best
        if not joint and best is not None:
            return best.factors
        if not self._initial:
            self._initial = self._draw_layouts(session, self._initial_count())
        per_layout: dict[Factors, float] = {}
        counts: Counter[Factors] = Counter()
        for cand, latency in session.measured_items():
            per_layout[cand.factors] = min(per_layout.get(cand.factors, math.inf), latency)
            counts[cand.factors] += 1
        rounds = self._rounds()
        for r in range(max(rounds, self.blocked_rounds)):
            owed = [f for f in self._initial if counts[f] <= r * max(self._top_k, 1)
                    and (r < rounds or f == self._blocked)]
            if owed:
                return owed[0]
        ranked = self._rank(session, per_layout)
        if self.rng.random() < self.explore_layout:
            return self._neighbour(session, ranked[0])
        self._turn += 1
        return ranked[self._turn % min(2, len(ranked))]

    def _rank(self, session: TuningSession, bests: dict[Factors, float]) -> list[Factors]:
        """The layouts of ``bests`` (each one's best measured latency) best first, by
        ``layout_rank``: their measured bests, or the cost model's best score over each
        one's evolved loop population (layouts without a finite trial last)."""
        by_measured = sorted(bests, key=bests.get)
        if self.layout_rank == "measured":
            return by_measured
        ran = [f for f in by_measured if math.isfinite(bests[f])]
        potential = {}
        for factors in ran:
            scores = self._evolve(session, factors)[1]
            finite = scores[np.isfinite(scores)]
            potential[factors] = float(finite.max()) if finite.size else -math.inf
        ranked = sorted(ran, key=lambda f: -potential[f])
        return ranked + [f for f in by_measured if f not in potential]

    def _race_rank(self, session: TuningSession, bests: dict[Factors, float]
                   ) -> list[Factors]:
        """:meth:`_rank` of a race's layouts; a predicted one is made once per set of
        them (a measured one follows from the records: its layouts only gain)."""
        key = frozenset(bests)
        if self.layout_rank == "measured" or key not in self._race_ranks:
            self._race_ranks[key] = self._rank(session, bests)
        return self._race_ranks[key]

    def _race_length(self, entrants: int) -> int:
        """The trials of a race of ``entrants`` layouts run to the end."""
        rounds, left = 0, entrants
        while left > 1:
            rounds, left = rounds + left, math.ceil(left / 2)
        return rounds * self.race_trials

    def _race_entrants(self) -> int:
        """How many layouts the race can take: at most ``race_layouts``, and no more than
        fit in half of the loop-only stage (0: no race)."""
        if self._budget is None:
            return 0
        for n in range(self.race_layouts, 1, -1):
            if self._race_length(n) <= self._budget.loop_only / 2:
                return n
        return 0

    def _revisit(self, session: TuningSession) -> tuple[Factors, int] | None:
        """The layout of the next loop-only batch after the race and the trials left in its
        turn (``None``: the best layout, uncut, as without stall rule or runner-ups left).
        The stall starts ``stall_trials`` after the latest new best by ``STALL_GAIN`` (at
        the earliest that many after the race's planned end); from there turns of
        ``revisit_trials`` go to the runner-ups (ranked by their best when the stall
        started) and the best layout in alternation. Like the race, this follows from the
        records alone."""
        if self.stall_trials is None or self._budget is None:
            return None
        items = session.measured_items()
        best, latest, leader = math.inf, -1, None
        for i, (cand, latency) in enumerate(items):
            if latency < best * (1 - self.STALL_GAIN):
                latest = i
            if latency < best:
                best, leader = latency, cand.factors
        if leader is None:
            return None
        race_end = self._budget.joint + self._race_length(self._race_entrants())
        stalled = max(latest + 1, race_end) + self.stall_trials
        if len(items) < stalled:  # the best layout; its last batch ends where a stall begins
            owed = stalled - len(items)
            return None if owed >= self._top_k or leader in self._exhausted else (leader, owed)
        turn, into = divmod(len(items) - stalled, self.revisit_trials)
        if turn % 2:
            return None if leader in self._exhausted else (leader, self.revisit_trials - into)
        bests: dict[Factors, float] = {}
        for cand, latency in items[:stalled]:
            bests[cand.factors] = min(bests.get(cand.factors, math.inf), latency)
        ranked = sorted((f for f in bests if math.isfinite(bests[f])), key=bests.get)
        runners_up = ranked[1:]  # behind the best when the stall began
        if turn // 2 >= len(runners_up):
            return None
        revisited = runners_up[turn // 2]
        return None if revisited in self._exhausted else (revisited, self.revisit_trials - into)

    def _race(self, session: TuningSession) -> tuple[Factors, int] | None:
        """The raced layout of the next loop-only batch and the trials it still needs in
        this round; once one layout is left, the winner and 0 (``None``: no race, and
        none for a budget's ``extra`` trials, which go to the best layout). The race state
        follows from the records alone (entrants: the best layouts of the first
        ``budget.joint`` trials; rounds: trials since), so a resumed run goes on where it
        stopped."""
        n = self._race_entrants()
        items = session.measured_items()
        joint = self._budget.joint
        if n == 0 or len(items) >= joint + self._budget.loop_only:  # extra trials: no race
            return None
        best: dict[Factors, float] = {}
        for cand, latency in items[:joint]:
            best[cand.factors] = min(best.get(cand.factors, math.inf), latency)
        ran = {f: b for f, b in best.items() if math.isfinite(b)}
        entrants = self._race_rank(session, ran)[:n]
        if len(entrants) < 2:
            return None
        done = Counter(cand.factors for cand, _ in items[joint:])
        for cand, latency in items[joint:]:
            best[cand.factors] = min(best.get(cand.factors, math.inf), latency)
        quota = 0
        while len(entrants) > 1:
            quota += self.race_trials
            for factors in entrants:
                if done[factors] < quota and factors not in self._exhausted:
                    return factors, quota - done[factors]
            entrants = self._race_rank(session, {f: best[f] for f in entrants}
                                       )[:math.ceil(len(entrants) / 2)]
        return entrants[0], 0

    # ----------------------------------------------------------------- loops
    def _elites(self, session: TuningSession, factors: Factors) -> list[Candidate]:
        measured = [(lat, c) for c, lat in session.measured_items() if c.factors == factors
                    and math.isfinite(lat)]
        measured.sort(key=lambda pair: pair[0])
        return [c for _, c in measured[:self.elites]]

    def _mutate(self, session: TuningSession, parent: Candidate) -> Candidate:
        space = session.task.space(parent.factors)
        return Candidate(parent.factors, space.mutate(parent.point, self.rng))

    def _evolve(self, session: TuningSession, factors: Factors
                ) -> tuple[list[Candidate], np.ndarray, list[Candidate]]:
        """The final population of one layout with its predicted scores, and the fresh
        samples (for exploration)."""
        points = session.task.space(factors).sample(self.samples, self.rng)
        fresh = [Candidate(factors, p) for p in points]
        parents = self._elites(session, factors) + self._pool.get(factors, [])
        population = list(dict.fromkeys(parents + fresh))
        scores = session.predict(population)
        for _ in range(self.generations):
            finite = np.isfinite(scores)
            if not finite.any():
                break
            ranks = np.argsort(np.argsort(-np.where(finite, scores, -np.inf)))
            weights = np.where(finite, 1.0 / (1.0 + ranks), 0.0)
            picks = self.rng.choice(len(population), size=self.children, p=weights / weights.sum())
            known = set(population)
            kids = [k for k in dict.fromkeys(self._mutate(session, population[int(i)])
                                             for i in picks) if k not in known]
            if kids:
                population += kids
                scores = np.concatenate([scores, session.predict(kids)])
            keep = np.argsort(-scores, kind="stable")[:self.population]
            population = [population[int(i)] for i in keep]
            scores = scores[keep]
        self._pool[factors] = population
        return population, scores, fresh

    def choose(self, session: TuningSession, candidates: Sequence[Candidate], k: int
               ) -> list[Candidate]:
        """Top-``k`` unmeasured of the batch (ranked best first by :meth:`propose`, spread
        out by ``diversity``), except that a share ``epsilon`` are random fresh samples of
        this batch; never more than the batch holds (a race round's last batch is cut to
        what is left of its quota)."""
        k = min(k, len(candidates))
        explore = min(int(round(self.epsilon * k)), k - 1) if k > 1 and self._fresh else 0
        chosen = spread([c for c in dict.fromkeys(candidates) if session.measured(c) is None],
                        k - explore, self.diversity)
        unmeasured = [c for c in self._fresh if session.measured(c) is None and c not in chosen]
        for i in self.rng.permutation(len(unmeasured))[:k - len(chosen)]:
            chosen.append(unmeasured[int(i)])
        return chosen

    def propose(self, session: TuningSession, n: int, layout: Factors | None
                ) -> list[Candidate]:
        """The evolved population of one layout (the next in the joint stage's schedule,
        or ``layout``), valid points only, best predicted first. In the loop-only stage
        the layout is the race's while it runs (searched by ``race_search``); then the
        winner's, and with ``loop_search="metaschedule"`` the batch is MetaSchedule's next
        picks for it (the evolution's population only if it has none left to offer); after
        a stall, the layout whose turn it is (:meth:`_revisit`; a runner-up's searched by
        ``race_search``). With the bandit, the layout whose turn it is (:meth:`_loop_turn`)."""
        self.setup(session)
        if layout is None:
            return self._loop_batch(session, n, None, "evolution")
        factors, quota, search = self._loop_turn(session, layout)
        if quota is None:
            return self._loop_batch(session, n, factors, search)
        batch = [c for c in self._loop_batch(session, n, factors, search)
                 if session.measured(c) is None][:quota]  # the turn's quota, unmeasured
        if batch:
            return batch
        self._exhausted.add(factors)  # nothing new left on it: out of the race or turn
        return self.propose(session, n, layout)

    def _loop_turn(self, session: TuningSession, layout: Factors
                   ) -> tuple[Factors, int | None, str]:
        """The layout of the next loop-only batch (``layout``: the best so far), the trials
        left in its turn (``None``: a whole batch) and its search: ``loop_search`` for the
        best layout (the race's winner), ``race_search`` for the others."""
        if self.layout_choice == "bandit":
            turn = layout_bandit.next_turn(
                [(c.factors, latency) for c, latency in session.measured_items()],
                self._budget.joint if self._budget else 0, self.race_layouts,
                self.race_trials, session.task.default_factors(), self.framework_share,
                self.bandit_exploration, self._exhausted)
            if turn is None:
                return layout, None, self.loop_search
            return (*turn, self.loop_search if turn[0] == layout else self.race_search)
        turn, search = self._race(session), self.race_search
        if turn is not None and turn[1] == 0:  # the race is over: its winner, unless stalled
            layout, turn = turn[0], None
        if turn is None:
            turn = self._revisit(session)
            if turn is not None and turn[0] == layout:  # the best layout's turn
                search = self.loop_search
        if turn is None:
            return layout, None, self.loop_search
        return turn[0], turn[1], search

    def _loop_batch(self, session: TuningSession, n: int, layout: Factors | None,
                    search: str) -> list[Candidate]:
        """One batch of ``layout`` (``None``: the joint stage's next layout) by ``search``
        (``"metaschedule"`` or ``"evolution"``)."""
        joint = layout is None
        if not joint and search == "metaschedule":
            if layout not in self._loop_searches:
                self._loop_searches[layout] = LayoutLoopSearch(
                    session, layout, seed=int(self.rng.integers(1 << 30)),
                    population=self.ms_population, batch=self.ms_batch)
            self._fresh = []
            picks = self._loop_searches[layout].propose(n)
            if picks:
                return picks
        population, scores, self._fresh = self._evolve(
            session, self._layout(session, joint) if joint else layout)
        order = [int(i) for i in np.argsort(-scores, kind="stable") if np.isfinite(scores[i])]
        return [population[i] for i in order][:n]


def differences(a: Candidate, b: Candidate) -> float:
    """Loop decisions (sampled subspaces) in which two candidates differ; ``inf`` across
    layouts or design spaces."""
    if a.factors != b.factors or a.point.design != b.point.design:
        return math.inf
    return sum(x != y for x, y in zip(a.point.values, b.point.values))


def spread(ranked: Sequence[Candidate], k: int, distance: int) -> list[Candidate]:
    """The first ``k`` of ``ranked`` (best first), passing over each candidate that differs
    from one already taken in fewer than ``distance`` decisions; those passed over fill what
    is left. The diversity-aware pick of AutoTVM (Chen et al., NeurIPS'18, §4.2;
    ``diversity_filter_ratio``) in its simplest form: a cost model that transfers badly to a
    new workload or layout ranks one cluster of near-copies on top (MobileNet-V2's 96 -> 24
    channel 1x1 convolution once measured seven with the same spatial tiles, differing in
    unrolling or the channel splits: six at 2.0 ms, one at 1.0 ms; the batch's random pick
    ran in 0.51 ms), and one of them tells about as much as seven."""
    taken: list[Candidate] = []
    passed: list[Candidate] = []
    for cand in ranked:
        if len(taken) == k:
            break
        near = any(differences(cand, t) < distance for t in taken)
        (passed if near else taken).append(cand)
    return taken + passed[:k - len(taken)]


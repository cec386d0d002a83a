"""What the altenv environments share: the evaluation backend, rewards, observations.

:class:`Backend` holds an env's :class:`~altenv.tuning.OpTask`, its cost model and (made
on first use) a :class:`~altenv.tuning.TuningSession` that measures candidates, records
them and trains the cost model. It also turns latencies into rewards and tracks the best
program the env found. :class:`TuningEnv` is the base class of the envs: it exposes
that best program on ``env.unwrapped``.

The layout actor's state and actions are the template's own
(:class:`~altenv.ops.templates.Template`: ``observation``, ``action_nvec``,
``factors_from_indices``, ``action_mask``); :func:`altenv.costmodel.feature_summary`
reduces MetaSchedule's per-store program features to a fixed length.
"""

from __future__ import annotations

import math
import shutil
import tempfile
import time
import warnings
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from tvm.s_tir import Schedule

from altenv import pretrained
from altenv.costmodel import FEATURE_LENGTH, CostModel, extract_features
from altenv.layout import Layout
from altenv.measure import MeasureConfig, Measurer, create
from altenv.ops.templates import Template
from altenv.records import RecordDB
from altenv.space import LoopPoint, LoopSpace
from altenv.tuning import Candidate, OpTask, TuningSession, freeze
from altenv.tuning.job import open_session
from altenv.tuning.task import Factors

REWARD_SOURCES = ("measure", "cost_model")
FEATURES = FEATURE_LENGTH
"""Length of a store's feature row (``altenv.costmodel.extract_features``)."""
WORST_REWARD = -1.0
"""Reward of a failed candidate, and the floor of ``1 - latency / U``."""


def default_cost_model(target: Any = None) -> CostModel:
    """A cost model that starts from the shipped cross-workload model for ``target``'s
    CPU (:mod:`altenv.pretrained`; ``None``: this one), or an untrained one where none is
    shipped."""
    checkpoint = pretrained.ppo_checkpoint(target)
    base = pretrained.cost_model(checkpoint) if checkpoint is not None else None
    return CostModel(base=base) if base is not None else CostModel()


def finite_action(action: Any) -> np.ndarray:
    """``action`` as a float array; a ``ValueError`` naming the entries that are NaN or
    infinite (a diverged policy: rounding them would silently give factor 1 or an arbitrary
    direction)."""
    values = np.asarray(action, dtype=np.float64)
    bad = np.flatnonzero(~np.isfinite(values))
    if bad.size:
        raise ValueError(f"action {values.tolist()}: entries {bad.tolist()} are NaN or "
                         "infinite; allowed: finite values in the action space")
    return values


RENDER_MODES = ["ansi"]
"""What ``render`` offers: one text line a step (``render_mode="ansi"``)."""


def check_render_mode(render_mode: str | None) -> None:
    """A ``ValueError`` of one line unless ``render_mode`` is ``None`` or in
    :data:`RENDER_MODES`."""
    if render_mode not in (None, *RENDER_MODES):
        raise ValueError(f"render_mode must be None or 'ansi', got {render_mode!r}")


def info_line(info: Mapping[str, Any]) -> str:
    """A step's ``info`` as ``key=value`` pairs (floats to 4 significant digits), for
    ``render()``."""
    return ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                     for k, v in info.items())


def checked_action(space: spaces.Space, action: Any, names: Sequence[str] | None = None
                   ) -> np.ndarray:
    """``action`` checked against ``space``: an array of its shape (``int64`` for a
    ``Discrete`` or ``MultiDiscrete`` space, ``float64`` for a ``Box``), or one one-line
    ``ValueError`` naming the first head outside the space and its allowed range, as
    ``action head 3 is 7: must be an integer in [0, 4] (loop direction 0)``: an env
    never wraps or clips an action it was not offered. A discrete head takes an integral
    value of any dtype; NaN and infinite entries are also listed (``entries [..] are NaN or
    infinite``); a wrong shape names the expected one. ``names``: one per head (flat
    order), shown after the range."""
    try:
        values = np.asarray(action, dtype=np.float64)
    except (TypeError, ValueError) as err:
        raise ValueError(f"action is not an array of numbers ({err}); expected one of shape "
                         f"{space.shape} (a {type(space).__name__} space)") from None
    if values.shape != space.shape:
        raise ValueError(f"action of shape {values.shape}: expected shape {space.shape} "
                         f"(a {type(space).__name__} space)")
    discrete = isinstance(space, spaces.Discrete | spaces.MultiDiscrete)
    if discrete:
        sizes = space.n if isinstance(space, spaces.Discrete) else space.nvec
        low = np.broadcast_to(np.asarray(space.start, dtype=np.float64), space.shape)
        high = low + np.asarray(sizes, dtype=np.float64) - 1
        ok = (values >= low) & (values <= high) & (values == np.round(values))
    elif isinstance(space, spaces.Box):
        low, high = space.low.astype(np.float64), space.high.astype(np.float64)
        ok = (values >= low) & (values <= high)  # False for NaN
    else:
        raise TypeError(f"unsupported action space {space}")
    if not ok.all():
        i = int(np.flatnonzero(~ok)[0])
        lo, hi = low.flat[i], high.flat[i]
        head = "action" if space.shape == () else f"action head {i}"
        allowed = (f"an integer in [{int(lo)}, {int(hi)}]" if discrete
                   else f"in [{float(lo)}, {float(hi)}]")
        value = values.flat[i]
        shown = int(value) if np.isfinite(value) and value == round(value) else value
        message = f"{head} is {shown}: must be {allowed}"
        if names is not None and i < len(names):
            message += f" ({names[i]})"
        nonfinite = np.flatnonzero(~np.isfinite(values))
        if nonfinite.size:
            message += f"; entries {nonfinite.tolist()} are NaN or infinite"
        raise ValueError(message)
    return values.astype(np.int64) if discrete else values


def make_task(workload: str | OpTask | None, target: Any, epilogue: Sequence[str],
              levels: int, session: TuningSession | None, mapping: str = "none") -> OpTask:
    """The env's task: ``workload`` (a spec string or an ``OpTask``), or the session's."""
    if isinstance(workload, OpTask):
        return workload
    if workload is None:
        if session is None:
            raise ValueError("give workload= (a spec such as 'gmm:M=64,N=64,K=64' or an "
                             "OpTask) or session=")
        return session.task
    return OpTask(workload, target=target, epilogue=epilogue, levels=levels, mapping=mapping)


def as_factors(template: Template, layout: Mapping[str, int] | Factors | None) -> Factors:
    """Template factors from a mapping or frozen factors (``None``: the template default)."""
    factors = template.default_factors() if layout is None else dict(layout)
    template.check(factors)
    return freeze(factors)


class Backend:
    """Evaluation for one env: cost-model scores, measurements, rewards and the best program.

    Parameters
    ----------
    task:
        The operator task.
    reward_source:
        ``"measure"`` (time candidates on the device) or ``"cost_model"`` (predict only).
    session:
        A session to share (its task, cost model, records and measurer).
    measurer:
        A measurer to share; without one a local measurer is made on first measurement.
    db_path:
        Records file; without one a temporary file is used and removed on :meth:`close`.
    cost_model:
        A cost model or the path of one saved by ``CostModel.save`` (not with ``session``);
        default: :func:`default_cost_model`.
    reference_latency:
        ``U`` of the latency reward (s); ``None``: the first finite latency measured.
    """

    def __init__(self, task: OpTask, reward_source: str = "measure",
                 session: TuningSession | None = None, measurer: Measurer | None = None,
                 db_path: str | Path | None = None,
                 cost_model: CostModel | str | Path | None = None,
                 reference_latency: float | None = None):
        if reward_source not in REWARD_SOURCES:
            raise ValueError(f"reward_source must be one of {REWARD_SOURCES}, "
                             f"got {reward_source!r}")
        if session is not None and any(x is not None for x in (measurer, db_path, cost_model)):
            raise ValueError("session= already has a measurer, records and a cost model; "
                             "do not also give measurer=, db_path= or cost_model=")
        if session is not None and session.task is not task:
            raise ValueError("session= belongs to another task than workload=")
        if isinstance(cost_model, str | Path):
            cost_model = CostModel.load(cost_model)
        self.task = task
        self.reward_source = reward_source
        self.cost_model: CostModel = (session.cost_model if session else
                                      cost_model or default_cost_model(task.target))
        self.reference_latency = reference_latency
        self.best_candidate: Candidate | None = None
        self.best_latency = math.inf
        self.best_score = -math.inf
        self._session = session
        self._measurer = measurer
        self._db_path = db_path
        self._owned: list[Measurer | RecordDB] = []
        self._tmpdir: str | None = None
        self._warned = False

    @property
    def measures(self) -> bool:
        """Whether rewards come from measurements."""
        return self.reward_source == "measure"

    def session(self) -> TuningSession:
        """The measurement session, made (with measurer and records) on first call."""
        if self._session is None:
            if self._measurer is None:
                self._measurer = create("local", MeasureConfig(number=1, repeat=2,
                                                               min_repeat_ms=5), self.task.target)
                self._owned.append(self._measurer)
            if self._db_path is None:
                self._tmpdir = tempfile.mkdtemp(prefix="altenv-env-")
                self._db_path = Path(self._tmpdir) / "records.jsonl"
            db = RecordDB(self._db_path)
            self._owned.append(db)
            self._session = open_session(self.task, self._measurer, db, self.cost_model)
        return self._session

    # ------------------------------------------------------------------ evaluation
    @contextmanager
    def _cost_model_time(self) -> Iterator[None]:
        """Charge the time of features and predictions to the session's ``cost_model``
        seconds, as the session charges its own: a run's time split names them the same
        whether the agent ranks through the session or steps an env (``ppo``)."""
        start = time.perf_counter()
        try:
            yield
        finally:
            if self._session is not None:
                self._session.seconds["cost_model"] += time.perf_counter() - start

    def features(self, space: LoopSpace, points: Sequence[LoopPoint]) -> list[np.ndarray]:
        """Per-store features of valid points (``altenv.costmodel.extract_features``)."""
        with self._cost_model_time():
            return extract_features(space.context, [space.decode(p) for p in points])

    def scores(self, candidates: Sequence[Candidate], features: Sequence[np.ndarray],
               rng: np.random.Generator) -> np.ndarray:
        """Predicted relative throughput (higher is faster). Before the cost model is
        trained its scores are uniform random; they are drawn from ``rng`` so a seeded
        env stays deterministic (a warning, unless a session's measurements will train it)."""
        if self.cost_model.is_trained:
            with self._cost_model_time():
                scores = np.asarray(self.cost_model.predict(features), dtype=np.float64)
        else:
            if not self.measures and self._session is None and not self._warned:
                warnings.warn("altenv env: the cost model is untrained (no pretrained model "
                              "is shipped for it), so cost_model rewards are random; pass a "
                              "trained cost_model= or a session=", stacklevel=3)
                self._warned = True
            scores = rng.uniform(size=len(candidates))
        for cand, score in zip(candidates, scores):
            if not math.isfinite(self.best_latency) and score > self.best_score:
                self.best_candidate, self.best_score = cand, float(score)
        return scores

    def measure(self, candidates: Sequence[Candidate]) -> list[float]:
        """Median latencies (s, ``inf`` if failed); already measured candidates are
        answered from the records."""
        latencies = self.session().measure(candidates)
        for cand, lat in zip(candidates, latencies):
            if lat < self.best_latency:
                self.best_candidate, self.best_latency = cand, lat
        return latencies

    def measure_top(self, candidates: Sequence[Candidate], scores: np.ndarray, k: int
                    ) -> float:
        """Measure the ``k`` best-scored distinct candidates; their best latency (s)."""
        order = np.argsort(-np.asarray(scores), kind="stable")
        chosen = list(dict.fromkeys(candidates[int(i)] for i in order))[:k]
        return min(self.measure(chosen), default=math.inf)

    def calibrate(self, latency: float) -> None:
        """Take ``latency`` as ``U`` if it is finite and ``U`` is not set yet."""
        if self.reference_latency is None and math.isfinite(latency):
            self.reference_latency = latency

    def reward(self, latency: float) -> float:
        """ALT's ``r = U - l`` scaled by ``U``: ``max(1 - l / U, -1)``; ``U`` is the first
        finite latency unless given; a failure (or no ``U`` yet) gives -1."""
        self.calibrate(latency)
        if self.reference_latency is None or not math.isfinite(latency):
            return WORST_REWARD
        return max(1.0 - latency / self.reference_latency, WORST_REWARD)

    # ------------------------------------------------------------------ best program
    def best_layouts(self) -> dict[str, Layout] | None:
        if self.best_candidate is None:
            return None
        return self.task.template.layouts(dict(self.best_candidate.factors))

    def best_schedule(self) -> Schedule | None:
        if self.best_candidate is None:
            return None
        return self.task.space(self.best_candidate.factors).decode(self.best_candidate.point)

    def close(self) -> None:
        """Close what this backend made (measurer, records); shared objects stay open."""
        for obj in reversed(self._owned):
            obj.close()
        self._owned.clear()
        if self._tmpdir is not None:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
            self._tmpdir = None


class TuningEnv(gym.Env):
    """Base class of the altenv environments: a :class:`Backend` and the best program.

    The best program is the fastest candidate measured by this env; while the env has
    measured nothing (always in ``cost_model`` mode) it is the best-predicted candidate
    and ``best_latency`` is ``inf``.
    """

    metadata = {"render_modes": RENDER_MODES, "render_fps": 4}
    backend: Backend

    @property
    def task(self) -> OpTask:
        return self.backend.task

    @property
    def best_candidate(self) -> Candidate | None:
        """Template factors and loop point of the best program."""
        return self.backend.best_candidate

    @property
    def best_latency(self) -> float:
        """Its measured median latency (s); ``inf`` if nothing was measured."""
        return self.backend.best_latency

    @property
    def best_score(self) -> float:
        """Its predicted score while nothing was measured; ``-inf`` otherwise."""
        return self.backend.best_score

    @property
    def best_layouts(self) -> dict[str, Layout] | None:
        """The layouts (``data``, ``weight``, ``out``) of the best program."""
        return self.backend.best_layouts()

    @property
    def best_schedule(self) -> Schedule | None:
        """The scheduled best program (its ``.mod`` builds with ``tvm.compile``)."""
        return self.backend.best_schedule()

    def best_summary(self) -> str:
        """One line on the best program, for ``render("ansi")``."""
        if self.best_candidate is None:
            return "best: none yet"
        lat = self.best_latency
        value = f"{lat * 1e3:.4g} ms" if math.isfinite(lat) else f"score {self.best_score:.4g}"
        return f"best: {dict(self.best_candidate.factors)} {value}"

    def close(self) -> None:
        self.backend.close()


# ---------------------------------------------------------------------- observations

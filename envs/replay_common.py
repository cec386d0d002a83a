"""What the replay environments share: the dataset and surrogate behind them, and the check
of the arguments that choose them (the check of an action against its space is
:func:`envs.common.checked_action`, every env's).

A replay env (``reward_source="dataset"``) answers from a measured-program dataset
(:mod:`altenv.dataset`) instead of a device or a cost model; its workloads are named by
dataset URI (``altenv://<dataset>/<workload>``) or are all of a dataset's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gymnasium as gym

from altenv.datapath import DEFAULT_DATASET, SCHEME, dataset_dir
from altenv.dataset import Dataset
from altenv.dataset.replay import WorkloadReplay
from altenv.dataset.surrogate import Surrogate, load_or_fit
from altenv.ops import LayoutTemplate


class ReplaySource:
    """The dataset, its workloads and surrogate of a replay env, workloads loaded once.

    It checks the env's arguments: ``reward_source`` must be ``"dataset"``, ``unused``
    (arguments of the live env) empty, and where the env replays one workload (``one``: its
    id) ``workload`` must be one URI.
    """

    def __init__(self, env: gym.Env, workload: str | Sequence[str] | None, dataset: str | None,
                 surrogate: Surrogate | str | None, reward_source: str,
                 unused: dict[str, Any], one: str | None = None):
        if reward_source != "dataset":
            raise ValueError(f"{type(env).__name__} replays a dataset; reward_source must be "
                             f"'dataset', got {reward_source!r}")
        if one is not None and not isinstance(workload, str):
            raise ValueError(f"workload: {one} with reward_source='dataset' needs one dataset "
                             "URI, altenv://<dataset>/<workload>")
        if unused:
            raise ValueError(f"reward_source='dataset' takes no {', '.join(sorted(unused))} "
                             "(a replay has no device, session or cost model)")
        names = [workload] if isinstance(workload, str) else list(workload or [])
        uris = [n for n in names if isinstance(n, str) and n.startswith(SCHEME)]
        if len(uris) != len(names):
            raise ValueError(f"workload {names}: with reward_source='dataset' give dataset "
                             "URIs (altenv://<dataset>/<workload>) or None")
        sets = {u[len(SCHEME):].partition("/")[0] for u in uris} or {dataset or DEFAULT_DATASET}
        if len(sets) > 1:
            raise ValueError(f"workload: URIs of one dataset only, got {sorted(sets)}")
        self.dataset = Dataset.open(dataset_dir(sets.pop()))
        self.names = [u.rpartition("/")[2] for u in uris] or self.dataset.workloads()
        missing = sorted(set(self.names) - set(self.dataset.workloads()))
        if missing or not self.names:
            raise ValueError(f"dataset {self.dataset.name}: no workload {missing or ''}; it "
                             f"has {', '.join(self.dataset.workloads()) or 'none'}")
        self.surrogate = (Surrogate.load(surrogate) if isinstance(surrogate, str)
                          else surrogate or load_or_fit(self.dataset))
        self._loaded: dict[str, tuple[WorkloadReplay, LayoutTemplate]] = {}

    def get(self, name: str) -> tuple[WorkloadReplay, LayoutTemplate]:
        """A workload's replay and its layout template."""
        if name not in self._loaded:
            data = self.dataset.load(name)
            self._loaded[name] = (WorkloadReplay(data, self.surrogate),
                                  LayoutTemplate(data.spec))
        return self._loaded[name]

    def uri(self, name: str) -> str:
        return f"{SCHEME}{self.dataset.name}/{name}"


"""Search efficiency of the agents (ALT Fig. 11): best latency against measured trials.

Tunes one workload with ``random``, ``ppo`` and ``ppo`` loaded from a pretraining
checkpoint (PPO-Pret), several seeds each, and writes ``trials.csv`` (agent, seed, trial,
best latency) and ``best_vs_trials.png`` (median over seeds) to the output directory.

    python examples/search_efficiency.py --output runs/fig11 --trials 48 --seeds 3
"""

from __future__ import annotations

import argparse
import csv
import statistics
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

import agents  # noqa: E402
from altenv.measure import MeasureConfig, create  # noqa: E402
from altenv.records import RecordDB  # noqa: E402
from altenv.tuning import Budget, OpTask, TuningSession, tune  # noqa: E402

WORKLOAD = "c2d:N=1,I=3,O=64,H=230,W=230,KH=7,KW=7,stride=2,pad=0"  # ResNet-18's first conv
PRETRAIN = ["c2d:N=1,I=3,O=32,H=58,W=58,KH=7,KW=7,stride=2,pad=0", "gmm:M=64,N=64,K=64"]


def run(agent: agents.Agent, workload: str, trials: int, measurer, db_path: Path,
        batch: int) -> list[float]:
    """Best latency (s) after each trial of one tuning run."""
    session = TuningSession(OpTask(workload), measurer, RecordDB(db_path))
    tune(session, agent, Budget.split(trials), batch=batch, progress=False)
    session.db.close()
    return session.history


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", default="runs/search_efficiency")
    parser.add_argument("--workload", default=WORKLOAD)
    parser.add_argument("--trials", type=int, default=48)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--pretrain-trials", type=int, default=32)
    parser.add_argument("--batch", type=int, default=64)
    args = parser.parse_args(argv)
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    small = {"walk_length": 16, "loop_episode": 32}
    rows: list[tuple[str, int, int, float]] = []
    with create("local", MeasureConfig(number=2, repeat=3, min_repeat_ms=20)) as measurer:
        pre = agents.create("ppo", seed=100, **small)
        for i, spec in enumerate(PRETRAIN):
            run(pre, spec, args.pretrain_trials, measurer, out / f"pretrain{i}.jsonl", args.batch)
        pre.save(out / "checkpoint")
        for seed in range(args.seeds):
            for name, agent in (
                ("random", agents.create("random", seed=seed)),
                ("ppo", agents.create("ppo", seed=seed, **small)),
                ("ppo-pret", agents.create("ppo", seed=seed, checkpoint=str(out / "checkpoint"),
                                           **small)),
            ):
                history = run(agent, args.workload, args.trials, measurer,
                              out / f"{name}-{seed}.jsonl", args.batch)
                rows += [(name, seed, t + 1, lat) for t, lat in enumerate(history)]
                print(f"{name} seed {seed}: best {history[-1] * 1e3:.3f} ms")
    with (out / "trials.csv").open("w", newline="") as fh:
        csv.writer(fh).writerows([("agent", "seed", "trial", "best_latency_s"), *rows])
    fig, ax = plt.subplots(figsize=(6, 4))
    for name in ("random", "ppo", "ppo-pret"):
        mine = [r for r in rows if r[0] == name]
        trials = sorted({r[2] for r in mine})
        medians = [statistics.median(r[3] for r in mine if r[2] == t) * 1e3 for t in trials]
        ax.plot(trials, medians, label=name)
        print(f"{name}: median best " + ", ".join(
            f"@{t}={medians[t - 1]:.3f} ms" for t in (8, 16, 32, trials[-1]) if t <= len(trials)))
    ax.set_xlabel("measured trials")
    ax.set_ylabel("best latency (ms, median of seeds)")
    ax.set_title(args.workload.split(",stride")[0])
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "best_vs_trials.png", dpi=120)


if __name__ == "__main__":
    main()

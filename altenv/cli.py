"""The ``altenv`` command line: ``demo``, ``tune``, ``train``."""

from __future__ import annotations

import argparse
import sys


def _demo(args: argparse.Namespace) -> int:
    from .demo import run_layout_demo

    run_layout_demo()
    return 0


def _tune(args: argparse.Namespace) -> int:
    from .config import load_config
    from .run import tune_workload

    cfg = load_config(args.config, **{
        "name": args.name, "workload": args.workload, "agent": args.agent,
        "output_dir": args.output_dir, "seed": args.seed,
        "budget.joint": None if args.budget is None else round(args.budget * 0.3),
        "budget.loop_only": None if args.budget is None else args.budget - round(args.budget * 0.3),
    })
    if cfg.model is not None:
        raise SystemExit("altenv tune: whole-network tuning ('model:') is not available yet; "
                         "give a 'workload:'")
    result = tune_workload(cfg, progress=not args.quiet)
    print(f"best {result.best_latency * 1e3:.4f} ms after {result.trials} trials "
          f"({result.tuning_seconds:.0f} s); max rel err vs torch {result.max_rel_err:.1e}; "
          f"run directory {result.run_dir}")
    for name, t in result.timings.items():
        print(f"  {name:14s} median {t['median_s'] * 1e3:9.4f} ms  "
              f"[{t['min_s'] * 1e3:.4f} .. {t['max_s'] * 1e3:.4f}]"
              + ("" if name == "altenv" else
                 f"  altenv speedup {t['median_s'] / result.timings['altenv']['median_s']:.2f}x"))
    return 0


def _train(args: argparse.Namespace) -> int:
    from .config import TrainConfig, load_config
    from .run import train_workloads

    cfg = load_config(args.config, TrainConfig, output_dir=args.output_dir, seed=args.seed)
    checkpoint = train_workloads(cfg, progress=not args.quiet)
    print(f"trained agent saved to {checkpoint}; use it with\n  agent: {{name: "
          f"{cfg.agent.name}, options: {{checkpoint: {checkpoint}}}}}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="altenv", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="run the built-in demo")
    demo.set_defaults(func=_demo)

    tune = sub.add_parser("tune", help="tune a workload from a YAML config (resumes a run)")
    tune.add_argument("config", nargs="?", help="YAML run config (see configs/)")
    tune.add_argument("--workload", help="operator spec, e.g. gmm:M=128,N=128,K=128")
    tune.add_argument("--name", help="run name (directory under output_dir)")
    tune.add_argument("--agent", help="agent name or module:Class")
    tune.add_argument("--budget", type=int, help="measured trials (split 30:70 joint:loop)")
    tune.add_argument("--output-dir", help="where runs go (default runs/)")
    tune.add_argument("--seed", type=int)
    tune.add_argument("--quiet", action="store_true", help="no progress bar")
    tune.set_defaults(func=_tune)

    train = sub.add_parser("train", help="pretrain an agent over a list of workloads")
    train.add_argument("config", help="YAML train config with 'workloads:' (see configs/)")
    train.add_argument("--output-dir", help="where runs go (default runs/)")
    train.add_argument("--seed", type=int)
    train.add_argument("--quiet", action="store_true", help="no progress bar")
    train.set_defaults(func=_train)
    return parser


def main(argv: list[str] | None = None) -> int:
    from .config import ConfigError

    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ConfigError as err:
        print(f"altenv: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

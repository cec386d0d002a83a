"""The ``altenv`` command line: ``demo``, ``tune``, ``tasks``, ``train``, ``export``, ``envs``,
``bench``.

Each command imports what it runs inside its own function: TVM takes seconds to load, and
``altenv --help`` or a mistyped flag answers at once without it.
"""

from __future__ import annotations

import argparse
import re
import signal
import sys
import warnings
from pathlib import Path
from typing import Any, NoReturn

import yaml

from .errors import UserError


def _demo(args: argparse.Namespace) -> int:
    from .demo import run_demo, run_layout_demo  # loads TVM: only when run

    if args.layouts:
        run_layout_demo()
    else:
        run_demo(args.output_dir, progress=not args.quiet)
    return 0


def _tune(args: argparse.Namespace) -> int:
    from .config import load_config  # loads TVM: only when run
    from .pipeline import timing_table, tune_model, tune_workload

    cfg = load_config(args.config, **{
        "name": args.name, "workload": args.workload, "agent": args.agent,
        "output_dir": args.output_dir, "seed": args.seed, "budget": args.budget,
        "ray.address": args.ray, **_set_options(args.set),
    })
    result = (tune_model if cfg.model is not None else tune_workload)(
        cfg, not args.quiet, repair=args.repair)
    print(f"best {result.best_latency * 1e3:.4f} ms after {result.trials} trials "
          f"({result.tuning_seconds:.0f} s); max rel err vs torch {result.max_rel_err:.1e}; "
          f"run directory {result.run_dir}")
    print(timing_table(result.timings), end="")
    return 0


def _tasks(args: argparse.Namespace) -> int:
    from .pipeline.checks import load_user_model  # loads TVM: only when run
    from .pipeline.preview import format_preview, preview

    model = load_user_model(args.model, _set_options(args.option, "--option", fields=False), seed=0)
    print(format_preview(preview(model), as_json=args.json), end="")
    return 0


def _train(args: argparse.Namespace) -> int:
    from .config import TrainConfig, load_config  # loads TVM: only when run
    from .pipeline.train import train

    cfg = load_config(args.config, TrainConfig, output_dir=args.output_dir, seed=args.seed,
                      **_set_options(args.set))
    checkpoint = train(cfg, progress=not args.quiet, repair=args.repair,
                       command=f"altenv train {args.config}")
    print(f"trained agent saved to {checkpoint}; use it with\n  agent: {{name: "
          f"{cfg.agent.name}, options: {{checkpoint: {checkpoint}}}}}")
    return 0


def _dataset_collect(args: argparse.Namespace) -> int:
    from .config import DatasetConfig, load_config
    from .pipeline.dataset import collect_dataset  # loads TVM: only when run

    cfg = load_config(args.config, DatasetConfig, output=args.output, seed=args.seed,
                      **{"ray.address": args.ray})
    out, done = collect_dataset(cfg, progress=not args.quiet,
                                card={"command": f"altenv dataset collect {args.config}"},
                                only=args.workload)
    print(f"dataset {out}: {done.workloads} workloads collected in this call, "
          f"{done.programs} programs ({done.failed} failed); card {out / 'card.json'}")
    return 0


def _dataset_info(args: argparse.Namespace) -> int:
    from .datapath import dataset_dir
    from .dataset.info import format_info

    try:
        path = dataset_dir(args.dataset)
    except ValueError as err:
        print(f"altenv: {err}", file=sys.stderr)
        return 2
    print(format_info(str(path)), end="")
    return 0


def _dataset_surrogate(args: argparse.Namespace) -> int:
    import numpy as np

    from .config import ConfigError
    from .datapath import dataset_dir
    from .dataset import Dataset
    from .dataset.surrogate import (
        CALIBRATION,
        FILE,
        PROGRAM_FILE,
        Calibration,
        card_entry,
        evaluate,
        format_accuracy,
        out_of_fold,
        program_rows,
        write_calibration,
        write_card_entry,
    )

    if not 0 < args.holdout < 1:
        raise ConfigError(f"--holdout: a fraction in (0, 1), got {args.holdout}")
    if args.calibrate is not None and not 0 <= args.calibrate <= 2:
        raise ConfigError(f"--calibrate: a share of the residual spread in [0, 2], got "
                          f"{args.calibrate}")
    try:
        data = Dataset.open(dataset_dir(args.dataset))
    except ValueError as err:
        raise ConfigError(f"dataset: {err}") from None
    if not data.workloads():
        raise ConfigError(f"dataset {data.path}: no workload collected yet")
    scores, model = evaluate(data, args.holdout, args.seed)
    print(f"surrogate of {data.name}: {args.holdout:.0%} of each workload's programs held "
          f"out (seed {args.seed}), fitted on the rest")
    print(format_accuracy(scores), end="")
    program_scores, program_model = evaluate(data, args.holdout, args.seed, rows=program_rows)
    print("program surrogate (the point and the program's features; what `bench offline` "
          "replays with), the same programs held out:")
    print(format_accuracy(program_scores), end="")
    if not args.no_save:
        model.save(data.path / FILE)
        program_model.save(data.path / PROGRAM_FILE)
        write_card_entry(data, {**card_entry(scores, args.holdout, args.seed),
                                "program": card_entry(program_scores, args.holdout,
                                                      args.seed)})
        print(f"saved {data.path / FILE}, {data.path / PROGRAM_FILE} (fitted on every "
              f"program) and {data.path / 'surrogate-accuracy.json'}")
        (data.path / CALIBRATION).unlink(missing_ok=True)  # another fit's, if any
        if args.calibrate is not None:
            calibration = Calibration.fit(out_of_fold(data, seed=args.seed), args.calibrate)
            write_calibration(data, calibration)
            print(f"saved {data.path / CALIBRATION}: replays map predictions through 5-fold "
                  f"out-of-fold quantiles, with {args.calibrate} of a median residual spread "
                  f"of {np.median(list(calibration.residual.values())):.2f} (log2) as noise")
    return 0


def _export(args: argparse.Namespace) -> int:
    from .export import export_run_dir  # loads TVM: only when run

    out = export_run_dir(args.run, args.output, force=args.force)
    print(f"exported {args.run} to {out}")
    return 0


def _envs(args: argparse.Namespace) -> int:
    from envs.describe import describe  # loads TVM: only when run

    try:
        print(describe(args.id), end="")
    except ValueError as err:
        print(f"altenv: {err}", file=sys.stderr)
        return 2
    return 0


def _set_options(items: list[str] | None, flag: str = "--set",
                 fields: bool = True) -> dict[str, Any]:
    """``--set KEY=VALUE`` pairs as config overrides: dotted keys, YAML values
    (``--set measure.enable_cpu_cache_flush=true``; with ``fields``, ``null`` unsets a
    config field, e.g. ``--set publish=null``; else it is ``None``); ``flag`` names the
    option in errors."""
    from .config import NULL, ConfigError  # loads TVM: only when run

    null = NULL if fields else None

    overrides: dict[str, Any] = {}
    for text in items or []:
        key, eq, value = text.partition("=")
        if not (eq and key.strip()):
            raise ConfigError(f"{flag} {text!r}: expected KEY=VALUE, "
                              "e.g. 'measure.enable_cpu_cache_flush=true'")
        try:
            parsed = yaml.safe_load(value)
        except yaml.YAMLError:
            raise ConfigError(f"{flag} {text!r}: the value is not valid YAML") from None
        overrides[key.strip()] = null if parsed is None else parsed
    return overrides


def _names(text: str | None, flag: str) -> list[str] | None:
    """A comma-separated list of names (``None`` when the flag was not given); an empty
    one, or one with an empty name, is a one-line error naming ``flag``."""
    from .config import ConfigError  # loads TVM: only when run

    if text is None:
        return None
    names = [n.strip() for n in text.split(",")]
    if not all(names):
        raise ConfigError(f"{flag} {text!r}: give comma-separated names, none empty")
    return names


def _agent_option(text: str) -> tuple[str, dict[str, Any]]:
    """``--agent LABEL=AGENT`` or ``LABEL=AGENT{key: value, ...}`` (YAML flow mapping)."""
    from .config import ConfigError  # loads TVM: only when run

    label, eq, rest = text.partition("=")
    name, brace, options = rest.partition("{")
    try:
        parsed = yaml.safe_load(brace + options) if brace else {}
    except yaml.YAMLError:
        parsed = None
    if not (eq and label and name.strip()) or not isinstance(parsed, dict):
        raise ConfigError(f"--agent {text!r}: expected LABEL=AGENT or "
                          "LABEL=AGENT{key: value, ...}, e.g. 'evo8=evolution{initial_layouts: 8}'")
    return label.strip(), {"name": name.strip(), "options": parsed}


def _bench(args: argparse.Namespace) -> int:
    from .bench import load_suite  # loads TVM: only when run
    from .bench.report import report
    from .bench.run import run_bench
    from .config import ConfigError, load_config
    from .suites import BenchSuite
    from .target import make_target

    kind = "ops" if args.bench == "ops" else "nets"
    entries = args.workload if kind == "ops" else args.model
    if (args.suite is None) == (not entries):
        what = "--workload SPEC" if kind == "ops" else "--model NAME"
        raise ConfigError(f"bench {args.bench}: give either --suite NAME or {what} (not both)")
    overrides = {"budget": args.budget, "seconds": getattr(args, "seconds", None),
                 "seeds": args.seeds,
                 "tuners": _names(args.tuners, "--tuners"),
                 "baselines": _names(args.baselines, "--baselines"),
                 "versus": _names(args.versus, "--versus"),
                 "altenv.name": args.altenv_agent, "ray.address": args.ray,
                 **_set_options(args.set)}
    for label, agent in map(_agent_option, args.agent or []):
        overrides["altenv" if label == "altenv" else f"agents.{label}"] = agent
    if args.suite is None:
        key = "workloads" if kind == "ops" else "models"
        overrides.update(name="adhoc", kind=kind, **{key: [
            {"name": _entry_name(e), ("spec" if kind == "ops" else "model"): e}
            for e in entries]})
        suite = load_config(None, BenchSuite, **overrides)
    else:
        suite = load_suite(args.suite, **overrides)
    if suite.kind != kind:
        raise ConfigError(f"bench {args.bench}: suite {suite.name!r} is a {suite.kind} suite")
    output = Path(args.output or f"runs/bench-{suite.name}")
    timings = run_bench(suite, output, args.filter, progress=not args.quiet,
                        retime=args.retime, profile=getattr(args, "profile", False),
                        repair=args.repair)
    peak = None
    if kind == "ops" and make_target(suite.target).kind.name == "llvm":
        from .bench.peak import cached_peak

        peak = cached_peak(suite.target)
        if peak is None:
            print("(no roofline column: run `altenv bench peak` once on this host)")
    print(report(timings, output, suite.baselines, suite.versus, peak), end="")
    print(f"results: {output / 'results.csv'}, plots: {output}/*.png")
    return 0


def _bench_offline(args: argparse.Namespace) -> int:

    from .bench.offline import format_summary, plot_summary, run_offline, summarize
    from .config import AgentConfig, ConfigError
    from .datapath import dataset_dir
    from .dataset import Dataset

    try:
        budgets = sorted({int(b) for b in args.budgets.split(",")})
    except ValueError:
        budgets = []
    if not budgets or budgets[0] < 1 or args.seeds < 1:
        raise ConfigError("bench offline: --budgets takes trial counts >= 1 such as "
                          "16,64,200,1000; --seeds must be >= 1")
    try:
        data = Dataset.open(dataset_dir(args.dataset))
        agents = {label: AgentConfig(**agent)
                  for label, agent in map(_agent_option, args.agent or [])}
        output = Path(args.output or f"runs/offline-{data.name}")
        rows = run_offline(data, _names(args.tuners, "--tuners"), args.seeds, budgets, output,
                           args.filter, agents, progress=not args.quiet, jobs=args.jobs)
    except ValueError as err:
        raise ConfigError(f"bench offline: {' '.join(str(err).split())}") from None
    from .files import write_json

    summary = summarize(rows)
    write_json(output / "summary.json", summary)
    plot_summary(summary, output / "regret.png", f"{data.name}: regret over "
                 f"{len({r['workload'] for r in rows})} workloads x {args.seeds} seeds")
    replayed = sum(r["replayed"] for r in rows)
    total = replayed + sum(r["predicted"] for r in rows)
    print(f"dataset {data.name}, {len({r['workload'] for r in rows})} workloads x "
          f"{args.seeds} seeds, budgets {budgets}; "
          f"{replayed / max(total, 1):.0%} of trials replayed, the rest predicted")
    print(format_summary(summary), end="")
    print(f"results: {output / 'results.csv'}, summary: {output / 'summary.json'}, plot: "
          f"{output / 'regret.png'}")
    return 0


def _bench_agree(args: argparse.Namespace) -> int:
    from .bench.agree import (
        agreement,
        format_agreement,
        hardware_ratios,
        hardware_timings,
        offline_ratios,
        plot_agreement,
        surrogate_on_trials,
        write_agreement,
    )
    from .config import ConfigError
    from .datapath import dataset_dir
    from .dataset import Dataset

    offline_csv, hardware = Path(args.offline), Path(args.hardware)
    if offline_csv.is_dir():
        offline_csv = offline_csv / "results.csv"
    if not offline_csv.is_file():
        raise ConfigError(f"bench agree: --offline {args.offline}: no results.csv of a "
                          "`bench offline` run there")
    try:
        data = Dataset.open(dataset_dir(args.dataset))
    except ValueError as err:
        raise ConfigError(f"bench agree: {' '.join(str(err).split())}") from None
    timings = hardware_timings(data, hardware)
    if not timings:
        raise ConfigError(f"bench agree: --hardware {args.hardware}: no re-timed workload of "
                          f"dataset {data.name} there (a `bench ops` directory)")
    result = agreement(offline_ratios(offline_csv, args.budget),
                       hardware_ratios(timings, args.versus), args.relative_to)
    if not result["cells"]:
        raise ConfigError(f"bench agree: no (workload, tuner) in both runs at --budget "
                          f"{args.budget} with --versus {args.versus} on hardware")
    trials = surrogate_on_trials(data, timings, args.versus)
    output = Path(args.output or hardware)
    write_agreement(result, trials, output)
    plot_agreement(result, output / "agree.png",
                   f"{data.name}: {len(result['workloads'])} workloads, "
                   f"{args.budget} trials")
    print(format_agreement(result, trials), end="")
    print(f"cells: {output / 'agree.csv'}, trials: {output / 'agree-trials.csv'}, plot: "
          f"{output / 'agree.png'}")
    return 0


def _bench_peak(args: argparse.Namespace) -> int:
    from .bench.peak import timed_peak  # loads TVM: only when run
    from .config import ConfigError
    from .target import check_target

    if args.target is not None:
        try:
            check_target(args.target)
        except ValueError as err:
            raise ConfigError(f"--target {args.target!r}: {' '.join(str(err).split())}"
                              ) from None
    print(timed_peak(args.target, args.refresh), end="")
    return 0


def _bench_envs(args: argparse.Namespace) -> int:
    from .bench.envs import env_speed, format_rows  # loads TVM: only when run
    from .config import ConfigError
    from .target import make_target

    try:
        counts = [int(n) for n in args.envs.split(",")]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1 or min(args.steps, args.workloads, args.batch) < 1:
        raise ConfigError("bench envs: --envs takes counts >= 1 such as 1,2; --steps, "
                          "--workloads and --batch must be >= 1")
    rows = env_speed(counts, args.steps, args.workloads, args.seed, batch=args.batch,
                     reward_source=args.reward_source, dataset=args.dataset)
    source = (f"dataset {args.dataset or 'cpu-v0'} replayed" if args.reward_source == "dataset"
              else f"cost-model rewards, {args.workloads} drawn workloads")
    print(f"altenv/CrossExploration-v0, {source}, batch {args.batch}, host "
          f"{make_target(None)}")
    print(format_rows(rows))
    return 0


def _bench_scale(args: argparse.Namespace) -> int:
    from .bench.scale import overhead, simulate  # loads TVM: only when run
    from .config import ConfigError
    from .target import make_target

    try:
        devices = [int(n) for n in args.devices.split(",")]
        trials = [int(n) for n in args.trials.split(",")]
    except ValueError:
        devices, trials = [], []
    if not devices or len(devices) != len(trials) or min(devices + trials) < 1:
        raise ConfigError("bench scale: --devices and --trials take as many counts >= 1, "
                          "such as --devices 1,10 --trials 40,120")
    print(f"host {make_target(None)}")
    if not args.no_overhead:
        result = overhead(args.workload, args.overhead_trials, args.rounds)
        print(f"{args.workload}, {args.overhead_trials} trials, {args.rounds} rounds "
              "interleaved: trials/min local "
              + " ".join(f"{m:.1f}" for m in result["trials_per_min"]["local"]) + ", ray "
              + " ".join(f"{m:.1f}" for m in result["trials_per_min"]["ray"])
              + f"; ray/local (medians) {result['ray_over_local']:.2f}")
    if not args.no_simulation:
        print(f"simulated fleets tuning {args.model} (agent {args.agent}):")
        print("devices  trials  trials/min  of linear  device utilization  "
              "driver s/trial: search  cost model")
        for row in simulate(args.model, devices, trials, agent=args.agent):
            print(f"{row['devices']:7d}  {row['trials']:6d}  {row['trials_per_min']:10.1f}  "
                  f"{row['of_linear']:9.2f}  {row['device_utilization']:18.3f}  "
                  f"{row['search_s_per_trial']:22.2f}  {row['cost_model_s_per_trial']:10.2f}")
    return 0


def _entry_name(spec: str) -> str:
    """A directory-safe short name of an ad-hoc workload spec or model."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", spec).strip("_")[:80]


SET_HELP = ("override a config field: dotted key, YAML value, repeatable "
            "(e.g. measure.enable_cpu_cache_flush=true; null unsets it)")
REPAIR_HELP = ("move bad lines of the records to <records>.rejected.jsonl and resume "
               "(without it, a bad line stops the run naming file and line)")


def _natural(text: str) -> int:
    """An ``int`` command-line value that is a count or a seed: 0 to 2**31 - 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if not 0 <= value < 2**31:
        raise argparse.ArgumentTypeError(f"{value} is out of range: allowed 0 to {2**31 - 1}")
    return value


def _positive(text: str) -> int:
    """:func:`_natural`, at least 1."""
    value = _natural(text)
    if value < 1:
        raise argparse.ArgumentTypeError("0 is out of range: allowed 1 or more")
    return value


def _positive_float(text: str) -> float:
    """A finite ``float`` command-line value above 0 (seconds)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text} is out of range: allowed a number above 0")
    return value


class UsageError(UserError):
    """A command line argparse does not accept."""


class _Parser(argparse.ArgumentParser):
    """argparse, with a bad command line as one :class:`UsageError` line (not the usage
    text and an exit from inside the parser)."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see {self.prog} --help)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="altenv", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="tune, export and time the built-in default network")
    demo.add_argument("--layouts", action="store_true",
                      help="instead: a quick tour of the layout primitives on one convolution")
    demo.add_argument("--output-dir", default="runs", help="where the run goes (default runs/)")
    demo.add_argument("--quiet", action="store_true", help="no progress bars")
    demo.set_defaults(func=_demo)

    tune = sub.add_parser("tune", help="tune a workload from a YAML config (resumes a run)")
    tune.add_argument("config", nargs="?", help="YAML run config (see configs/)")
    tune.add_argument("--workload", help="operator spec, e.g. gmm:M=128,N=128,K=128")
    tune.add_argument("--name", help="run name (directory under output_dir)")
    tune.add_argument("--agent", help="agent name or module:Class")
    tune.add_argument("--budget", type=_positive,
                      help="measured trials (split 30:70 joint:loop; for a model, 10%% of "
                           "them first go to its other kernels); same as budget: N")
    tune.add_argument("--output-dir", help="where runs go (default runs/)")
    tune.add_argument("--seed", type=_natural)
    tune.add_argument("--quiet", action="store_true", help="no progress bar")
    tune.add_argument("--set", action="append", metavar="KEY=VALUE", help=SET_HELP)
    tune.add_argument("--repair", action="store_true", help=REPAIR_HELP)
    tune.add_argument("--ray", metavar="ADDRESS",
                      help="tune on a Ray cluster: 'local' (one started here), 'auto' or "
                           "HOST:PORT of its head (docs/scale-out.md)")
    tune.set_defaults(func=_tune)

    tasks = sub.add_parser("tasks", help="what tuning a model would cover: each complex call, "
                                         "tuned with layouts or why not, and the FLOPs share")
    tasks.add_argument("model", help="zoo name, .onnx file or file.py:factory (as model: in a "
                                     "run config)")
    tasks.add_argument("--option", action="append", metavar="KEY=VALUE",
                       help="a model option, YAML value, repeatable (as model_options: in a "
                            "run config, e.g. size=small)")
    tasks.add_argument("--json", action="store_true", help="print JSON instead of a table")
    tasks.set_defaults(func=_tasks)

    train = sub.add_parser("train", help="pretrain an agent over a list of workloads")
    train.add_argument("config", help="YAML train config with 'workloads:' (see configs/)")
    train.add_argument("--output-dir", help="where runs go (default runs/)")
    train.add_argument("--seed", type=_natural)
    train.add_argument("--quiet", action="store_true", help="no progress bar")
    train.add_argument("--set", action="append", metavar="KEY=VALUE", help=SET_HELP)
    train.add_argument("--repair", action="store_true", help=REPAIR_HELP)
    train.set_defaults(func=_train)

    dataset = sub.add_parser("dataset", help="measured-program datasets: collect one, "
                                             "describe one")
    dkinds = dataset.add_subparsers(dest="dataset_command", required=True)
    dcollect = dkinds.add_parser("collect", help="measure a dataset from a YAML config "
                                                 "(resumes; see configs/dataset_cpu.yaml)")
    dcollect.add_argument("config", help="YAML dataset config")
    dcollect.add_argument("--output", help="dataset directory (default: the config's output)")
    dcollect.add_argument("--seed", type=_natural)
    dcollect.add_argument("--quiet", action="store_true", help="no progress bar")
    dcollect.add_argument("--workload", action="append", metavar="NAME",
                          help="collect only this workload of the config (repeatable; "
                               "default: all, in order)")
    dcollect.add_argument("--ray", metavar="ADDRESS",
                          help="measure on a Ray cluster: 'local' (one started here), 'auto' "
                               "or HOST:PORT of its head (docs/scale-out.md)")
    dcollect.set_defaults(func=_dataset_collect)
    dsur = dkinds.add_parser("surrogate", help="fit a dataset's surrogates (points; points "
                                               "and programs), print their held-out Spearman "
                                               "and top-8 recall per workload, save them")
    dsur.add_argument("dataset", help="a dataset directory or the name of a shipped one")
    dsur.add_argument("--holdout", type=float, default=0.2,
                      help="fraction of each workload's programs held out (default 0.2)")
    dsur.add_argument("--seed", type=_natural, default=0)
    dsur.add_argument("--no-save", action="store_true", help="evaluate only")
    dsur.add_argument("--calibrate", type=float, metavar="NOISE",
                      help="also save a calibration for replays (docs/datasets.md): "
                           "out-of-fold quantile mapping plus NOISE (a share, e.g. 0 or 0.5) "
                           "of the residual spread as noise; without it replays are "
                           "uncalibrated")
    dsur.set_defaults(func=_dataset_surrogate)
    dinfo = dkinds.add_parser("info", help="a dataset's card and counts per workload")
    dinfo.add_argument("dataset", help="a dataset directory or the name of a shipped one")
    dinfo.set_defaults(func=_dataset_info)

    export = sub.add_parser("export", help="export a tuned run for deployment")
    export.add_argument("run", help="run directory, e.g. runs/resnet18")
    export.add_argument("--output", required=True, help="directory to write (new or empty)")
    export.add_argument("--force", action="store_true",
                        help="write over the files of an earlier export in --output")
    export.set_defaults(func=_export)

    env_list = sub.add_parser("envs", help="list the Gymnasium environments and their spaces")
    env_list.add_argument("id", nargs="?", help="one env id: print its full description")
    env_list.set_defaults(func=_envs)

    bench = sub.add_parser("bench", help="tuners and baselines side by side at equal budget")
    kinds = bench.add_subparsers(dest="bench", required=True)
    for name, entry_help in (("ops", "operator"), ("net", "network")):
        p = kinds.add_parser(name, help=f"{entry_help} benchmarks (resume from --output)")
        p.add_argument("--suite", help="suite name in configs/bench/ or a YAML path")
        if name == "ops":
            p.add_argument("--workload", nargs="+", action="extend",
                           help="operator specs instead of a suite (repeatable)")
        else:
            p.add_argument("--model", nargs="+", action="extend",
                           help="models instead of a suite (repeatable)")
        p.add_argument("--budget", type=_positive, help="measured trials per tuner and entry")
        if name == "ops":
            p.add_argument("--seconds", type=_positive_float,
                           help="every tuner tunes each entry this long (wall clock); "
                                "--budget trials are then the agents' plan, and a cell "
                                "stops at the first of the time or 10x the budget")
        p.add_argument("--tuners", help="comma-separated: altenv, metaschedule, agent names")
        p.add_argument("--baselines", help="comma-separated: tvm-default, torch")
        p.add_argument("--versus", help="comma-separated tuners every tuner is compared with "
                                        "at the same seed (default: metaschedule)")
        p.add_argument("--seeds", type=_positive, help="seeds per tuner")
        p.add_argument("--altenv-agent", help="the agent behind the altenv tuner")
        p.add_argument("--agent", action="append", metavar="LABEL=AGENT{key: value, ...}",
                       help="define a tuner LABEL: an agent with options (repeatable), "
                            "e.g. 'evo8=evolution{initial_layouts: 8}'")
        p.add_argument("--filter", help="only entries whose name matches this regex")
        p.add_argument("--output", help="results directory (default runs/bench-<suite>)")
        p.add_argument("--retime", action="store_true",
                       help="time finished entries again (tuning results are kept)")
        if name == "net":
            p.add_argument("--profile", action="store_true",
                           help="also time every network's kernels alone, side by side "
                                "(DIR/<entry>/profile.csv, profile.png)")
        p.add_argument("--ray", metavar="ADDRESS",
                       help="tune the agents' cells on a Ray cluster: local, auto or HOST:PORT "
                            "(MetaSchedule's cells and the re-timing stay on this host)")
        p.add_argument("--quiet", action="store_true", help="no progress bars")
        p.add_argument("--set", action="append", metavar="KEY=VALUE", help=SET_HELP)
        p.add_argument("--repair", action="store_true", help=REPAIR_HELP)
        p.set_defaults(func=_bench)
    speed = kinds.add_parser("envs", help="env steps per second: one env against parallel "
                                          "copies (CrossExploration-v0, cost-model rewards)")
    speed.add_argument("--envs", default="1,2", help="comma-separated env counts (default 1,2)")
    speed.add_argument("--steps", type=_positive, default=300, help="timed steps per env")
    speed.add_argument("--workloads", type=_positive, default=64, help="drawn workloads")
    speed.add_argument("--batch", type=_positive, default=16, help="loop points sampled per round")
    speed.add_argument("--seed", type=_natural, default=0)
    speed.add_argument("--reward-source", choices=("cost_model", "dataset"),
                       default="cost_model", help="cost-model rewards (default) or a dataset "
                                                  "replayed")
    speed.add_argument("--dataset", help="with --reward-source dataset: a dataset name or "
                                         "directory (default: the shipped cpu-v0)")
    speed.set_defaults(func=_bench_envs)
    offline = kinds.add_parser("offline", help="agents on a dataset's workloads, replayed: "
                                               "regret curves over seeds and budgets")
    offline.add_argument("--dataset", default="cpu-v0",
                         help="dataset name or directory (default: the shipped cpu-v0)")
    offline.add_argument("--tuners", default="random,altenv",
                         help="comma-separated agents (altenv = evolution, random, ppo, "
                              "heron_cga, mind_mappings, --agent labels, module:Class)")
    offline.add_argument("--agent", action="append", metavar="LABEL=AGENT",
                         help="a labelled agent with options, e.g. "
                              "'evo8=evolution{initial_layouts: 8}' (repeatable)")
    offline.add_argument("--seeds", type=_positive, default=20)
    offline.add_argument("--budgets", default="16,64,200,1000",
                         help="comma-separated trial budgets (each tuned as its own cell)")
    offline.add_argument("--filter", help="regex on workload names")
    offline.add_argument("--output", help="directory (default runs/offline-DATASET; resumes)")
    offline.add_argument("--jobs", type=_positive, default=1,
                         help="cells tuned at once, each in a process of its own (default 1)")
    offline.add_argument("--quiet", action="store_true", help="no progress bars")
    offline.set_defaults(func=_bench_offline)
    agree = kinds.add_parser("agree", help="does the offline bench predict the hardware: "
                                           "a bench offline run against a bench ops run")
    agree.add_argument("--offline", required=True,
                       help="a `bench offline` directory or its results.csv")
    agree.add_argument("--hardware", required=True,
                       help="a `bench ops` directory of the same agents on the dataset's "
                            "workloads, with a dataset_best tuner")
    agree.add_argument("--dataset", default="cpu-v0",
                       help="dataset name or directory (default: the shipped cpu-v0)")
    agree.add_argument("--budget", type=_positive, default=200,
                       help="the offline budget compared (default 200)")
    agree.add_argument("--versus", default="data",
                       help="the hardware run's dataset_best tuner label (default data)")
    agree.add_argument("--relative-to", default="random",
                       help="also compare every agent's ratios over this agent's "
                            "(default random)")
    agree.add_argument("--output", help="where agree.csv and agree.png go (default: "
                                        "the --hardware directory)")
    agree.set_defaults(func=_bench_agree)
    peak = kinds.add_parser("peak", help="this host's fp32 FMA peak and memory bandwidth "
                                         "(the roofline of bench ops tables), cached per host")
    peak.add_argument("--target", help="TVM target (default: this host)")
    peak.add_argument("--refresh", action="store_true", help="measure again, ignoring the cache")
    peak.set_defaults(func=_bench_peak)
    scale = kinds.add_parser("scale", help="scaling out: the Ray path against the local one, "
                                           "and simulated fleets of devices")
    scale.add_argument("--workload", default="gmm:M=64,N=64,K=64",
                       help="operator of the Ray-vs-local comparison")
    scale.add_argument("--overhead-trials", type=_positive, default=32)
    scale.add_argument("--rounds", type=_positive, default=3, help="interleaved runs of each path")
    scale.add_argument("--model", default="resnet18", help="network of the simulation")
    scale.add_argument("--devices", default="1,10,100,1000", help="simulated fleet sizes")
    scale.add_argument("--trials", default="40,120,300,300", help="trials per fleet size")
    scale.add_argument("--agent", default="random", help="agent of the simulation")
    scale.add_argument("--no-overhead", action="store_true", help="skip the comparison")
    scale.add_argument("--no-simulation", action="store_true", help="skip the simulation")
    scale.set_defaults(func=_bench_scale)
    return parser


INTERRUPTED = 130
"""Exit status after Ctrl-C (128 + SIGINT), as shells report it."""


def _one_line(message: object) -> str:
    return " ".join(str(message).split())


def _show_warning(message: Warning | str, category: type[Warning], filename: str,
                  lineno: int, file: Any = None, line: str | None = None) -> None:
    """Warnings as one line each (``altenv: warning: ...``)."""
    print(f"altenv: warning: {_one_line(message)}", file=file or sys.stderr)


def main(argv: list[str] | None = None) -> int:
    """Run the command line; a user's error is one line on stderr and status 2, Ctrl-C
    one line and status 130 (runs resume from their records when run again).

    Ctrl-C raises ``KeyboardInterrupt`` wherever Python runs, which may be a callback TVM
    called (a MetaSchedule builder or runner written in Python): TVM's FFI hands it back as
    a bare ``RuntimeError``. So the handler also notes that Ctrl-C came, and whatever
    exception follows it counts as the interruption."""
    # raised inside torch.export when TVM's frontend imports a model; not actionable here
    warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)`",
                            category=FutureWarning)
    warnings.showwarning = _show_warning
    interrupted = []

    def on_sigint(signum: int, frame: Any) -> None:
        interrupted.append(signum)
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        args = build_parser().parse_args(argv)
        return args.func(args)
    except UserError as err:
        print(f"altenv: {_one_line(err)}", file=sys.stderr)
        return 2
    except Exception:
        if not interrupted:
            raise
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGINT, previous)
    print("altenv: interrupted; run the same command again to resume", file=sys.stderr)
    return INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())

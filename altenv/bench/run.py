"""Running a suite: every entry's cells tuned (or reused), then the entry re-timed.

Finished cells and timings are reused, so an interrupted run picks up where it stopped;
``retime`` times finished cells again (e.g. once the machine is idle); ``profile`` also
times every network's kernels alone (:func:`~altenv.bench.net.profile_net`). Timing runs in a
fresh process, so that nothing the tuning left behind (worker pools, caches, threads) shares
the machine's cores with the contenders.
"""

from __future__ import annotations

import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from ..config import ConfigError
from ..files import as_written, check_tree, make_dir, read_mapping, write_text
from ..measure.signals import exit_on_sigint, sigint_blocked
from ..pipeline.checks import check_device, load_user_model, make_agent
from ..pipeline.devices import SharedMeasurer
from ..suites import BenchSuite
from .net import profile_net, retime_and_profile_net, retime_net, tune_net_cell
from .ops import retime_workload, tune_cell

STATE_FILES = ("suite.json", "timing.json", "cell.json", "progress.json")
"""What a bench output keeps of its cells (JSON objects), read back when it resumes."""

# the measure fields that decide what a latency means; the rest (timeouts, workers) do not
TIMING_FIELDS = ("number", "repeat", "min_repeat_ms", "enable_cpu_cache_flush")


def _check_same_timing(suite: BenchSuite, output: Path) -> None:
    """Refuse to add cells measured one way to an output directory measured another way
    (tuners compare at equal settings, and a resumed cell must go on as it began)."""
    path = output / "suite.json"
    saved = read_mapping(path)
    if saved is None:
        return
    now = suite.measure.model_dump()
    with as_written(path):
        before = dict(saved.get("measure", {}))
        changed = [f for f in TIMING_FIELDS if f in before and before[f] != now[f]]
    if changed:
        was = ", ".join(f"measure.{f}={before[f]}" for f in changed)
        asked = ", ".join(f"{now[f]}" for f in changed)
        raise ConfigError(f"--output {output}: its cells were measured with {was}; this run "
                          f"asks for {asked}. Give the same (--set measure.FIELD=VALUE) or "
                          "another --output")


def check_suite(suite: BenchSuite, entries: list[Any]) -> None:
    """What the cells of ``entries`` need beyond the suite's fields, checked before anything
    is written: the target's device is present, the Ray cluster of ``ray:`` is joined,
    every tuner's agent is built (its options
    typed and checked, :func:`~altenv.pipeline.checks.make_agent`) and every network
    imports (:func:`~altenv.pipeline.checks.load_user_model`); a :class:`ConfigError` of
    one line otherwise."""
    check_device(suite.target)
    if suite.ray is not None:
        from ..cluster.session import connect  # Ray only for a bench that names it

        connect(suite.ray)
    for tuner in suite.tuners:
        agent = suite.agent(tuner)
        if agent is not None:
            make_agent(agent, {"seed": 0})
    for entry in entries if suite.kind == "nets" else ():
        load_user_model(entry.model, entry.options, 0)


def run_bench(suite: BenchSuite, output: str | Path, pattern: str | None = None,
              progress: bool = True, retime: bool = False, profile: bool = False,
              repair: bool = False) -> list[dict[str, Any]]:
    """Tune and re-time the suite's entries whose names match ``pattern``; returns their
    timings (``timing.json`` of each entry); the cells share one measurer. ``profile``
    (network suites) prints and writes each entry's per-kernel profile after its timing;
    ``repair`` moves bad lines of the cells' records aside (:class:`~altenv.records.RecordDB`).
    Everything is checked (:func:`check_suite`) before the output directory is made."""
    if profile and suite.kind != "nets":
        raise ValueError("profile: network suites only (an operator entry is one kernel)")
    tune, time_entry, what = ((tune_cell, retime_workload, "programs") if suite.kind == "ops"
                              else (tune_net_cell, retime_net, "networks"))
    output = Path(output)
    entries = suite.select(pattern)
    check_suite(suite, entries)
    if output.exists() or output.is_symlink():
        check_tree(output)  # cells from elsewhere: no links out of them
        for name in STATE_FILES:  # damaged state refused before anything is written
            for path in sorted(output.rglob(name)):
                read_mapping(path)
    _check_same_timing(suite, output)
    make_dir(output)
    write_text(output / "suite.json", suite.model_dump_json(indent=1))
    timings = []
    with SharedMeasurer(suite.ray, suite.measure, suite.target) as measurers:
        for entry in entries:
            timing_file = output / entry.name / "timing.json"
            timing = None if retime else read_mapping(timing_file)
            if timing is not None:
                with as_written(timing_file):
                    finished = _finished(suite, timing)
                if finished:
                    timings.append(timing)
                    if profile:
                        _profile(suite, entry, timing, output)
                    continue
            cells = []
            for seed in range(suite.seeds):
                for tuner in suite.tuners:
                    budget = suite.budget_of(tuner)
                    print(f"[bench] {entry.name}: {tuner} seed {seed}, {budget} trials"
                          + (f" planned, {suite.seconds:g} s" if suite.seconds else ""))
                    cells.append(tune(suite, entry, tuner, seed, output, budget, measurers,
                                      progress, repair))
            print(f"[bench] {entry.name}: re-timing {len(cells)} {what} and "
                  f"{len(suite.baselines)} baselines interleaved" + (
                      ", then profiling them per kernel" if profile else ""))
            if profile:  # in one process, each network built once
                timing, text = _in_fresh_process(retime_and_profile_net, suite, entry, cells,
                                                 output, suite.baselines)
                print(text, end="")
            else:
                timing = _in_fresh_process(time_entry, suite, entry, cells, output,
                                           suite.baselines)
            timings.append(timing)
    return timings


def _finished(suite: BenchSuite, timing: dict[str, Any]) -> bool:
    """Whether an entry's ``timing.json`` holds every cell of the suite, each at its
    tuner's budget and the suite's wall-clock budget (an older file names one budget for
    all)."""
    cells = timing["cells"]
    return all(cells.get(f"{t}#{s}", {}).get("budget", timing.get("budget"))
               == suite.budget_of(t) and cells.get(f"{t}#{s}", {}).get("seconds") == suite.seconds
               for t in suite.tuners for s in range(suite.seeds))


def _profile(suite: BenchSuite, entry: Any, timing: dict[str, Any], output: Path) -> None:
    """Print ``entry``'s per-kernel profile, taken in a fresh process."""
    cells = [{"tuner": c["tuner"], "seed": c["seed"]} for c in timing["cells"].values()]
    print(f"[bench] {entry.name}: profiling {len(cells)} networks per kernel")
    print(_in_fresh_process(profile_net, suite, entry, cells, output), end="")


def _in_fresh_process(fn: Any, *args: Any) -> Any:
    """``fn(*args)`` in a newly spawned Python process (its result pickled back). The
    process starts with SIGINT blocked and, once it can, leaves on Ctrl-C without a word
    (:func:`~altenv.measure.signals.exit_on_sigint`): this process says it."""
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"),
                             initializer=exit_on_sigint) as pool:
        with sigint_blocked():
            future = pool.submit(fn, *args)
        return future.result()

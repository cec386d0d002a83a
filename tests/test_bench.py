"""``altenv bench``: suites, resumable cells, re-timing, reports and the command line."""

from __future__ import annotations

import csv
import json
import math

import pytest
from conftest import SMALL_EVOLUTION

from altenv.bench import load_suite
from altenv.bench.report import (
    format_table,
    geomean,
    report,
    rows_of,
    summary,
    trials_to_reach,
)
from altenv.cli import _agent_option, build_parser, main
from altenv.config import ConfigError

FAST = {"number": 1, "repeat": 2, "min_repeat_ms": 2}
BENCH = pytest.mark.xdist_group("bench")  # tuning runs share one worker


def _suite_file(tmp_path, kind="ops", **fields):
    import yaml

    data = {"name": "t", "kind": kind, "budget": 4, "measure": FAST,
            "altenv": {"name": "evolution", "options": yaml.safe_load(SMALL_EVOLUTION)},
            "tuners": ["altenv", "metaschedule", "evo-small"],
            "agents": {"evo-small": {"name": "evolution",
                                     "options": {"population": 16, "children": 16,
                                                 "ms_population": 32}}},
            **fields}
    if kind == "ops":
        data.setdefault("workloads", [{"name": "gmm16", "spec": "gmm:M=16,N=16,K=16"}])
    path = tmp_path / "suite.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_shipped_suites_validate():
    smoke, alt9, nets = load_suite("smoke"), load_suite("alt9"), load_suite("nets")
    assert smoke.kind == alt9.kind == "ops" and nets.kind == "nets"
    assert len(alt9.workloads) == 18
    assert {w.spec.kind for w in alt9.workloads} == {
        "c1d", "c2d", "c3d", "grp", "dep", "dil", "gmm", "t2d", "t3d"}
    assert {m.model for m in nets.models} == {"resnet18", "mobilenet_v2", "bert_tiny", "r3d_18",
                                              "mobilenet_v3_small", "efficientnet_b0", "dcgan"}
    batch16 = next(m for m in nets.models if m.name == "resnet18_b16")
    assert batch16.options["input_shapes"] == [[16, 3, 64, 64]]


def test_heldout_suite_is_its_seeded_draw_and_disjoint():
    from altenv.bench.heldout import excluded_specs, heldout_yaml
    from altenv.suites import SUITE_DIR

    assert heldout_yaml() == (SUITE_DIR / "heldout.yaml").read_text()  # same seed, same file
    heldout = load_suite("heldout")
    specs = {str(w.spec) for w in heldout.workloads}
    assert len(specs) == 18 and {s.split(":")[0] for s in specs} == {
        "c1d", "c2d", "c3d", "grp", "dep", "dil", "gmm", "t2d", "t3d"}
    excluded = excluded_specs()
    assert {str(w.spec) for w in load_suite("alt9").workloads} <= excluded
    assert not specs & excluded  # nor alt9's, smoke's or the checkpoint's training


@pytest.mark.parametrize("fields, message", [
    ({"tuners": ["altenv", "nosuch"]}, "unknown tuner 'nosuch'; allowed:"),
    ({"baselines": ["onnxruntime"]}, "unknown baseline 'onnxruntime'; allowed: tvm-default"),
    ({"workloads": [{"name": "x", "spec": "c2d:N=1"}]}, "workloads.0.spec"),
    ({"workloads": []}, "needs workloads"),
    ({"budget": 0}, "budget"),
    ({"budgets": {"nosuch": 3}}, "budgets: 'nosuch' is not one of the tuners"),
    ({"budgets": {"altenv": 0}}, "budgets.altenv: Input should be greater than 0"),
    ({"agents": {"altenv": {"name": "random"}}}, "label 'altenv' is already a tuner"),
    ({"agents": {"a.b": {"name": "random"}}}, "label 'a.b': letters, digits"),
    ({"agents": {"r": {"name": "random", "options": {"sed": 1}}}},
     "agents.r.options: random takes no option 'sed'; allowed: seed"),
])
def test_bad_suite_names_the_field(tmp_path, fields, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        load_suite(str(_suite_file(tmp_path, **fields)))


def test_unknown_suite_and_empty_filter_list_what_exists(tmp_path):
    with pytest.raises(ConfigError, match="allowed: .*smoke"):
        load_suite("nosuch")
    with pytest.raises(ConfigError, match="matches none of gmm16"):
        load_suite(str(_suite_file(tmp_path))).select("conv")


def test_cli_wants_a_suite_or_workloads(capsys):
    assert main(["bench", "ops", "--budget", "4"]) == 2
    assert "give either --suite NAME or --workload SPEC" in capsys.readouterr().err


def test_labelled_agents_are_tuners_with_their_options(tmp_path):
    from altenv.bench.ops import cell_dir
    from altenv.pipeline.checks import make_agent

    suite = load_suite(str(_suite_file(tmp_path)), **{
        "tuners": ["altenv", "metaschedule", "evo-small", "evo8", "random"],
        "agents.evo8": _agent_option("evo8=evolution{initial_layouts: 8, epsilon: 0.5}")[1]})
    evo8 = make_agent(suite.agent("evo8"), {"seed": 3})
    assert (type(evo8).__name__, evo8.initial_layouts, evo8.epsilon) == ("EvolutionAgent", 8, 0.5)
    # the default evolution
    assert make_agent(suite.agent("altenv"), {"seed": 3}).initial_layouts == 4
    assert suite.agent("random").name == "random" and suite.agent("metaschedule") is None
    assert cell_dir(tmp_path, suite.workloads[0], "evo8", 3).name == "evo8-seed3"


def test_cli_agent_option_is_parsed_and_validated(tmp_path, capsys):
    assert _agent_option("r7=random") == ("r7", {"name": "random", "options": {}})
    assert _agent_option("m=pkg.mod:Cls{a: [1, 2]}") == (
        "m", {"name": "pkg.mod:Cls", "options": {"a": [1, 2]}})
    for bad in ("evolution", "x=evolution{a: ", "x=evolution{- 1}", "=random"):
        with pytest.raises(ConfigError, match="expected LABEL=AGENT"):
            _agent_option(bad)
    suite = str(_suite_file(tmp_path))
    assert main(["bench", "ops", "--suite", suite, "--tuners", "altenv,evo8",
                 "--agent", "evo8=evolution{initial_layout: 8}"]) == 2
    err = capsys.readouterr().err
    assert "agents.evo8.options: evolution takes no option 'initial_layout'" in err
    assert main(["bench", "ops", "--suite", suite, "--set", "budgets.evo-small=x"]) == 2
    assert "budgets.evo-small: Input should be a valid integer" in capsys.readouterr().err


def test_repeated_workload_and_model_flags_add_up():
    """``--workload A --workload B`` benches both (the flag appends), as ``--workload A B``."""
    parser = build_parser()
    ops = parser.parse_args(["bench", "ops", "--workload", "gmm:M=8,N=8,K=8", "--workload",
                             "gmm:M=16,N=8,K=8", "gmm:M=32,N=8,K=8"])
    assert ops.workload == ["gmm:M=8,N=8,K=8", "gmm:M=16,N=8,K=8", "gmm:M=32,N=8,K=8"]
    nets = parser.parse_args(["bench", "net", "--model", "resnet18", "--model", "bert_tiny"])
    assert nets.model == ["resnet18", "bert_tiny"]


def _timing(name, tuners, torch_spread=0.1):
    programs = {"tvm-default": {"median_s": 4e-3, "spread": 0.1},
                "torch": {"median_s": 2e-3, "spread": torch_spread}}
    cells = {}
    for tuner, latency in tuners.items():
        programs[f"{tuner}#0"] = {"median_s": latency, "spread": 0.05}
        cells[f"{tuner}#0"] = {"tuner": tuner, "seed": 0, "trials": 4, "tuning_seconds": 1.0,
                               "history": [latency]}
    return {"workload": name, "programs": programs, "cells": cells}


def test_report_geomeans_are_over_workloads():
    timings = [_timing("a", {"altenv": 1e-3, "metaschedule": 2e-3}),
               _timing("b", {"altenv": 1e-3, "metaschedule": 0.5e-3})]
    rows = rows_of(timings, ["tvm-default", "torch"])
    assert [r["speedup_vs_metaschedule"] for r in rows if r["tuner"] == "altenv"] == [2.0, 0.5]
    stats = summary(rows)
    assert stats["altenv"]["speedup_vs_metaschedule"] == pytest.approx(1.0)
    assert stats["altenv"]["speedup_vs_torch"] == pytest.approx(2.0)
    assert stats["metaschedule"]["speedup_vs_tvm-default"] == pytest.approx(math.sqrt(2 * 8))
    assert (stats["altenv"]["speedup_vs_metaschedule_min"],
            stats["altenv"]["speedup_vs_metaschedule_max"]) == (0.5, 2.0)
    table = format_table(timings, rows, ["tvm-default", "torch"])
    assert "geomean x vs metaschedule" in table and table.count("\n") == 9
    assert "*" not in table and all(r["noisy"] == "" for r in rows)
    assert geomean([2.0, 8.0, math.inf, math.nan]) == pytest.approx(4.0)
    assert trials_to_reach([5.0, 3.0, 2.0, 1.0], 2.0) == 3
    assert trials_to_reach([5.0, 3.0], 2.0) == math.inf


def test_report_prints_tuning_time_per_trial_against_metaschedule():
    timings = [_timing("a", {"altenv": 1e-3, "metaschedule": 2e-3}),
               _timing("b", {"altenv": 1e-3, "metaschedule": 0.5e-3})]
    split = {"search": 0.25, "cost_model": 0.125, "build": 0.5, "run": 0.25,
             "measure_wall": 0.5, "finalists": 0.0625}
    timings[0]["cells"]["altenv#0"].update(tuning_seconds=3.0, seconds_per_trial=split)
    rows = rows_of(timings, ["torch"])
    first = next(r for r in rows if r["tuner"] == "altenv" and r["workload"] == "a")
    assert first["s_per_trial"] == 0.75 and first["time_per_trial_vs_metaschedule"] == 3.0
    assert first["s_per_trial_search"] == 0.25
    table = format_table(timings, rows, ["torch"])
    times = next(line for line in table.splitlines() if line.startswith("time/trial x"))
    assert times.split()[-2:] == [f"{math.sqrt(3):.3g}", "1"]  # geomean of 3 and 1
    assert "(altenv, s per trial, median over cells: search 0.25, cost model 0.125, " \
        "measure wall 0.5, finalists 0.0625)" in table


def test_a_wall_clock_budget_is_for_operator_suites_and_plans_the_agents(tmp_path):
    from altenv.bench.ops import cell_job
    from altenv.suites import TIME_TRIAL_CAP

    suite = load_suite(str(_suite_file(tmp_path, seconds=30)))
    job = cell_job(suite, suite.workloads[0], "altenv", 0, 20)
    assert job.seconds == 30 and (job.budget.joint, job.budget.loop_only) == (6, 14)
    assert job.budget.total == suite.trial_cap("altenv") == TIME_TRIAL_CAP * 4
    assert suite.trial_cap("metaschedule") == TIME_TRIAL_CAP * 4
    with pytest.raises(ConfigError, match="seconds: a wall-clock budget is for ops suites"):
        load_suite(str(_suite_file(tmp_path, kind="nets", seconds=30,
                                   models=[{"name": "m", "model": "resnet18"}])))
    assert main(["bench", "ops", "--workload", "gmm:M=16,N=16,K=16", "--seconds", "0"]) == 2


def test_roofline_column_divides_by_the_bound_that_limits():
    """``% roof``: GFLOP/s over min(peak, intensity x bandwidth) of this host's measured
    peak; a timing from another host gets none."""
    from altenv.bench.peak import Peak
    from altenv.bench.peak import operator_traffic as traffic
    from altenv.ops.workload import parse_workload

    def operator_traffic(spec, epilogue=()):
        return traffic(parse_workload(spec), epilogue)

    peak = Peak(host="h", target="llvm -mcpu=x", cores=2, lanes=16, gflops=100.0,
                gflops_one_core=50.0, gbs=10.0, stream_mib=64.0,
                cache_gbs=[("L1", 16 << 10, 400.0), ("L2", 1 << 20, 40.0)], tvm="0")
    gemm = "gmm:M=64,N=64,K=64"  # 524288 FLOP over 3 x 16 KiB: 10.7 FLOP/byte
    flops, nbytes = operator_traffic(gemm)
    assert (flops, nbytes) == (2 * 64**3, 3 * 64 * 64 * 4)
    assert peak.bound(flops, nbytes) == (100.0, "flop")
    vector = "gmm:M=1,N=64,K=64"  # a GEMV: 0.5 FLOP/byte, bandwidth-bound
    flops_v, nbytes_v = operator_traffic(vector, ["bias"])
    assert nbytes_v == (64 + 64 * 64 + 64 + 64) * 4
    assert peak.bound(flops_v, nbytes_v) == (pytest.approx(flops_v / nbytes_v * 40), "L2")
    assert peak.bandwidth(16 << 10) == (400.0, "L1") and peak.bandwidth(2 << 20) == (10, "mem")
    big = "gmm:M=1,N=1024,K=1024"  # 4 MiB of weights: from memory
    assert peak.bound(*operator_traffic(big))[1] == "mem"
    timings = [_timing("g", {"altenv": 1e-5, "metaschedule": 2e-5}),
               _timing("v", {"altenv": 1e-6, "metaschedule": 1e-6}),
               _timing("elsewhere", {"altenv": 1e-5, "metaschedule": 1e-5})]
    for timing, spec, target in zip(timings, [gemm, vector, gemm],
                                    [peak.target, peak.target, "llvm -mcpu=y"]):
        timing.update(spec=spec, target=target, epilogue=["bias"] if spec == vector else [])
    rows = rows_of(timings, ["torch"], peak=peak)
    altenv = {r["workload"]: r for r in rows if r["tuner"] == "altenv"}
    assert altenv["g"]["roof_fraction"] == pytest.approx(flops / 1e-5 / 1e9 / 100)
    assert altenv["v"]["bound"] == "L2" and "roof_fraction" not in altenv["elsewhere"]
    table = format_table(timings, rows, ["torch"], peak=peak)
    assert "best % roof" in table and f"{flops / 1e-5 / 1e11:.0%} flop" in table
    assert "best % roof" not in format_table(timings, rows, ["torch"])


@pytest.mark.slow
def test_bench_peak_measures_and_caches(tmp_path, monkeypatch, capsys):
    """``altenv bench peak``: an FMA kernel that compiles to FMA instructions, a stream in
    L1, L2 and memory, cached per host (small arrays here; the real memory stream goes past
    the last cache)."""
    import tvm

    from altenv.bench import peak as peak_mod
    from altenv.target import make_target

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(peak_mod, "MAX_ARRAY_BYTES", 1 << 20)
    monkeypatch.setattr(peak_mod, "FMA_SECONDS", 0.002)
    target = make_target(None)
    if "x86" in str(target.attrs.get("mtriple", "")) and \
            tvm.target.codegen.llvm_cpu_has_features("fma", target):
        lib = tvm.compile(peak_mod._fma_kernel(1, 8, 4), target=target)
        assert "vfmadd" in lib.mod.inspect_source("asm")
    assert peak_mod.cached_peak() is None
    assert main(["bench", "peak"]) == 0
    first = capsys.readouterr().out
    assert "measured in" in first and "GFLOP/s on one" in first and "L2 bandwidth" in first
    cached = peak_mod.cached_peak()
    assert cached.gflops > 0 and cached.gbs > 0 and cached.stream_mib == 1.0
    assert [level for level, _, gbs in cached.cache_gbs if gbs > 0] == ["L1", "L2"]
    assert peak_mod.cache_path().parent == tmp_path / "altenv"
    assert main(["bench", "peak"]) == 0
    assert "(cached)" in capsys.readouterr().out and peak_mod.host_peak() == cached


def test_reference_tuners_other_than_metaschedule():
    """``--versus random,evolution``: each tuner's speedup over each reference at its seed,
    the trials it took to reach the reference's final best, and the geomean rows."""
    timings = [_timing("a", {"ppo": 1e-3, "random": 2e-3, "evolution": 1e-3}),
               _timing("b", {"ppo": 1e-3, "random": 3e-3, "evolution": 0.5e-3})]
    timings[0]["cells"]["ppo#0"]["history"] = [4e-3, 2e-3, 1e-3]
    timings[0]["cells"]["ppo#0"]["agent"] = {"updates": {"joint": 4, "loop": 9}}
    rows = rows_of(timings, ["torch"], ["random", "evolution"])
    ppo = [r for r in rows if r["tuner"] == "ppo"]
    assert [r["speedup_vs_random"] for r in ppo] == [2.0, 3.0]
    assert [r["speedup_vs_evolution"] for r in ppo] == [1.0, 0.5]
    assert ppo[0]["trials_to_random_best"] == 2 and "speedup_vs_metaschedule" not in ppo[0]
    assert ppo[0]["agent"] == "updates.joint=4 updates.loop=9"
    table = format_table(timings, rows, ["torch"], ["random", "evolution"])
    assert "geomean x vs random" in table and "geomean x vs evolution" in table
    assert summary(rows)["ppo"]["speedup_vs_random"] == pytest.approx(math.sqrt(6))


def test_a_timing_too_spread_is_flagged_and_speedups_on_it_are_marked(tmp_path):
    """A torch baseline whose rounds spread 2x its median (a loaded host) is flagged in the
    table and the CSV, and the speedups over it carry the mark; the others do not."""
    timings = [_timing("a", {"altenv": 1e-3, "metaschedule": 2e-3}, torch_spread=2.0),
               _timing("b", {"altenv": 1e-3, "metaschedule": 0.5e-3})]
    timings[1]["programs"]["metaschedule#0"]["spread"] = 0.3
    table = report(timings, tmp_path, ["tvm-default", "torch"])
    rows = list(csv.DictReader((tmp_path / "results.csv").open()))
    assert [(r["workload"], r["tuner"], r["noisy"]) for r in rows] == [
        ("a", "altenv", "torch"), ("a", "metaschedule", "torch"),
        ("b", "altenv", "metaschedule#0"), ("b", "metaschedule", "metaschedule#0")]
    lines = {line.split("  ")[0]: line for line in table.splitlines()}
    assert lines["a"].split()[-1] == "2*"  # torch's latency (ms)
    assert lines["b"].split()[2] == "0.5*"  # MetaSchedule's
    assert lines["geomean x vs torch"].split()[4].endswith("*")
    assert not lines["geomean x vs tvm-default"].split()[4].endswith("*")
    vs_ms = lines["geomean x vs metaschedule"].split()
    assert vs_ms[4].endswith("*") and vs_ms[7].endswith("*")  # altenv's and MS's own
    assert "too spread to trust" in table


def _records(path):
    """The record lines of a cell (not its re-timed finalists)."""
    return [line for line in (path / "records.jsonl").read_text().splitlines()
            if "final" not in json.loads(line)]


@BENCH
@pytest.mark.slow
def test_ops_bench_end_to_end_and_resume(tmp_path, capsys):
    suite = _suite_file(tmp_path)
    out = tmp_path / "out"
    assert main(["bench", "ops", "--suite", str(suite), "--output", str(out), "--quiet"]) == 0
    printed = capsys.readouterr().out
    assert "geomean x vs metaschedule" in printed and "gmm16" in printed
    with (out / "results.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert {r["tuner"] for r in rows} == {"altenv", "metaschedule", "evo-small"}
    for r in rows:
        assert int(r["trials"]) == 4 and float(r["median_ms"]) > 0
        assert float(r["speedup_vs_torch"]) > 0 and float(r["speedup_vs_tvm-default"]) > 0
    assert (out / "speedup.png").stat().st_size > 0
    assert (out / "convergence.png").stat().st_size > 0
    timing = json.loads((out / "gmm16" / "timing.json").read_text())
    assert set(timing["programs"]) == {"altenv#0", "metaschedule#0", "evo-small#0",
                                       "tvm-default", "torch"}
    assert len(timing["cells"]["metaschedule#0"]["history"]) == 4

    # a run killed inside the evo-small cell: its records stay, nothing is measured twice
    cell = out / "gmm16" / "evo-small-seed0"
    kept = _records(cell)[:2]
    (cell / "records.jsonl").write_text("\n".join(kept) + "\n")
    (cell / "cell.json").unlink()
    (out / "gmm16" / "timing.json").unlink()
    altenv_records = _records(out / "gmm16" / "altenv-seed0")
    assert main(["bench", "ops", "--suite", str(suite), "--output", str(out), "--quiet"]) == 0
    assert _records(cell)[:2] == kept and len(_records(cell)) == 4
    assert _records(out / "gmm16" / "altenv-seed0") == altenv_records  # finished: untouched
    assert json.loads((cell / "cell.json").read_text())["trials"] == 4

    # in one run: a finished cell whose best this version's design space cannot replay is
    # set aside and tuned again; one tuner at a budget of its own goes on from its records
    # (and the entry is re-timed with every cell)
    first = out / "gmm16" / "altenv-seed0"
    summary = json.loads((first / "cell.json").read_text())
    summary["decisions"].append(0)
    (first / "cell.json").write_text(json.dumps(summary))
    evo_records = _records(cell)
    assert main(["bench", "ops", "--suite", str(suite), "--output", str(out), "--quiet",
                 "--set", "budgets.evo-small=6"]) == 0
    assert "does not fit this design space" in capsys.readouterr().out
    assert json.loads((out / "gmm16" / "altenv-seed0-stale" / "cell.json").read_text()
                      )["decisions"] == summary["decisions"]
    assert json.loads((first / "cell.json").read_text())["trials"] == 4
    assert len(_records(first)) == 4
    assert _records(cell)[:4] == evo_records and len(_records(cell)) == 6
    with (out / "results.csv").open() as f:
        trials = {r["tuner"]: int(r["trials"]) for r in csv.DictReader(f)}
    assert trials == {"altenv": 4, "metaschedule": 4, "evo-small": 6}

    # the same directory measured another way is refused, naming what differs
    cold = ["--set", "measure.enable_cpu_cache_flush=true", "--set", "measure.repeat=3"]
    assert main(["bench", "ops", "--suite", str(suite), "--output", str(out), "--quiet",
                 *cold]) == 2
    err = capsys.readouterr().err
    assert "measured with measure.repeat=2, measure.enable_cpu_cache_flush=False; this run " \
        "asks for 3, True" in err


@BENCH
@pytest.mark.slow
def test_net_bench_tiny_model(tmp_path, tiny_model):
    suite = _suite_file(tmp_path, kind="nets", budget=6, tuners=["altenv", "metaschedule"],
                        models=[{"name": "tiny", "model": tiny_model}])
    out = tmp_path / "out"
    assert main(["bench", "net", "--suite", str(suite), "--output", str(out), "--quiet",
                 "--profile"]) == 0
    with (out / "results.csv").open() as f:
        rows = {r["tuner"]: r for r in csv.DictReader(f)}
    assert set(rows) == {"altenv", "metaschedule"}
    assert float(rows["altenv"]["speedup_vs_metaschedule"]) > 0
    share = float(rows["altenv"]["conversion_share"])
    # tiled layouts: each call converts its input first or reads it as stored
    assert share < 1
    assert int(rows["altenv"]["conversions"]) + int(rows["altenv"]["reads_through"]) >= 1
    assert (out / "speedup.png").exists() and not (out / "convergence.png").exists()
    # 6 trials: 1 for the other kernels (10 %), 5 for the layout and loop search
    run = json.loads((out / "tiny" / "altenv-seed0" / "summary.json").read_text())
    assert run["trials"] >= 6
    # the per-kernel profile: every kernel of both programs, the convolutions among them
    with (out / "tiny" / "profile.csv").open() as f:
        kernels = list(csv.DictReader(f))
    assert {k["program"] for k in kernels} == {"altenv#0", "metaschedule#0"}
    kinds = {(k["program"], k["kind"]) for k in kernels}
    assert {("altenv#0", "c2d"), ("metaschedule#0", "c2d"), ("metaschedule#0", "grp")} <= kinds
    assert (("altenv#0", "conversion") in kinds) == (int(rows["altenv"]["conversions"]) > 0)
    assert all(float(k["total_us"]) > 0 and int(k["calls"]) >= 1 for k in kernels)
    assert all(float(k["in_network_us_per_call"]) >= 0 for k in kernels)  # not NaN either
    assert all(float(k["cold_us_per_call"]) > 0 for k in kernels)  # timed cold on the CPU
    assert (out / "tiny" / "profile.png").exists()


@pytest.mark.parametrize("search", [{}, {"batch": 32, "top_k": 4, "finalists": 2,
                                         "finalist_caches": "cold", "levels": 2,
                                         "check": False}])
def test_a_bench_cell_tunes_as_altenv_tune_would(tmp_path, search):
    """A bench cell's job and ``altenv tune``'s job of the same workload, epilogue, agent,
    seed, budget and search settings are the same job (task, budget, search, agent)."""
    from altenv.bench.ops import cell_job
    from altenv.config import load_config
    from altenv.pipeline.checks import check_run, make_job

    agent = {"name": "evolution", "options": {"population": 16, "children": 16}}
    suite = load_suite(str(_suite_file(
        tmp_path, search=search, altenv=agent,
        workloads=[{"name": "g", "spec": "gmm:M=16,N=16,K=16", "epilogue": ["relu"]}])))
    cell = cell_job(suite, suite.workloads[0], "altenv", 3, 40)
    cfg = load_config(None, name="r", workload="gmm:M=16,N=16,K=16", epilogue=["relu"],
                      agent=agent, seed=3, budget=40, search=search,
                      output_dir=str(tmp_path / "runs"))
    run = make_job(cfg.workload, cfg.epilogue, cfg.target, cfg.search, cfg.budget.stages,
                   check_run(cfg), cfg.mapping)
    assert cell.task.key == run.task.key
    assert cell.task.template.levels == run.task.template.levels == search.get("levels", 1)
    assert str(cell.task.target) == str(run.task.target)
    assert cell.budget == run.budget and cell.search == run.search
    assert type(cell.agent) is type(run.agent) and vars(cell.agent).keys() == \
        vars(run.agent).keys()
    assert {k: v for k, v in vars(cell.agent).items() if isinstance(v, int | float | str)} == \
        {k: v for k, v in vars(run.agent).items() if isinstance(v, int | float | str)}

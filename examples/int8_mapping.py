"""Int8 tensorization with AMOS mappings against the same workload without it.

Tunes one int8 operator (u8 data x i8 weight -> i32) twice with the same agent and
trial budget: ``mapping="none"`` (ALT's layout template, LLVM's own vectorization) and
``mapping="amos"`` (the layout choice is an AMOS mapping onto the CPU's int8 dot
product, the loop space tiles around the tensorized intrinsic). The two best programs
are then checked against torch and re-timed side by side, interleaved; prints and
writes ``result.json`` with the ratio.

    python examples/int8_mapping.py --output runs/int8_amos --trials 48 --batch 64 --top-k 4
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import agents
from altenv.baselines import compare, compiled_baseline
from altenv.measure import MeasureConfig, create
from altenv.records import RecordDB
from altenv.tuning import Budget, OpTask, TuningSession, tune

WORKLOAD = "c2d:N=1,I=64,O=64,H=56,W=56,KH=3,KW=3,pad=1,dtype=int8"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", default=WORKLOAD)
    parser.add_argument("--trials", type=int, default=48)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--top-k", type=int, default=4,
                        help="measured per batch (smaller: more layouts/mappings tried)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", type=Path, default=Path("runs/int8_amos"))
    args = parser.parse_args(argv)
    args.output.mkdir(parents=True, exist_ok=True)
    result: dict[str, dict] = {}
    best = {}
    config = MeasureConfig(number=3, repeat=3, min_repeat_ms=50)
    with create("local", config) as measurer:
        for mapping in ("none", "amos"):
            task = OpTask(args.workload, mapping=mapping)
            with RecordDB(args.output / f"records_{mapping}.jsonl") as db:
                session = TuningSession(task, measurer, db)
                start = time.perf_counter()
                latency = tune(session, agents.create("random", seed=args.seed),
                               Budget.split(args.trials), batch=args.batch, top_k=args.top_k,
                               progress=False)
                cand, _ = session.best
                best[mapping] = (task, cand, session.schedule(cand))
                result[mapping] = {
                    "tuned_latency_s": latency, "trials": session.trials,
                    "tuning_seconds": time.perf_counter() - start,
                    "layouts": task.layouts_json(cand.factors)}
                print(f"{mapping}: best {latency * 1e3:.4g} ms after {session.trials} trials, "
                      f"{result[mapping]['tuning_seconds']:.0f} s")
    programs = {m: t.program(c.factors) for m, (t, c, _) in best.items()}
    raw = programs["none"].random_inputs(args.seed + 2)
    runs = [compiled_baseline(m, programs[m], sch.mod, raw=raw)
            for m, (_, _, sch) in best.items()]
    stats = compare(runs, [programs["none"].reference(raw)], rtol=0.0)
    for m, st in stats.items():
        result[m]["retimed_median_s"] = st.median
    ratio = stats["none"].median / stats["amos"].median
    result["speedup_amos_over_none"] = ratio
    result["workload"] = args.workload
    (args.output / "result.json").write_text(json.dumps(result, indent=1))
    print(f"re-timed, interleaved: none {stats['none'].median * 1e3:.4g} ms, amos "
          f"{stats['amos'].median * 1e3:.4g} ms, amos is {ratio:.2f}x faster")


if __name__ == "__main__":
    main()

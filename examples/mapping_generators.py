"""The top mapping of each generator (``amos``, ``cp_embedding``) at an equal budget.

For each workload: how many mappings each generator yields, then each generator's first
mapping (AMOS: least padding, then fewest fused loops; cp_embedding: best objective) is
tuned with the same agent and trial budget, loops only (the mapping fixed), the two best
programs are checked against torch and re-timed side by side, interleaved. Prints and
writes ``result.json``.

    python examples/mapping_generators.py --output runs/mapping_generators --trials 24
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import agents
from altenv.baselines import compare, compiled_baseline
from altenv.measure import MeasureConfig, create
from altenv.records import RecordDB
from altenv.tuning import Budget, OpTask, TuningSession, tune
from altenv.tuning.task import freeze

WORKLOADS = ("c2d:N=1,I=64,O=64,H=56,W=56,KH=3,KW=3,pad=1,dtype=int8",
             "c2d:N=1,I=64,O=64,H=56,W=56,KH=1,KW=1,stride=2,dtype=int8")
GENERATORS = ("amos", "cp_embedding")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", action="append", help="repeatable; default: two c2d")
    parser.add_argument("--trials", type=int, default=24)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--top-k", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", type=Path, default=Path("runs/mapping_generators"))
    args = parser.parse_args(argv)
    args.output.mkdir(parents=True, exist_ok=True)
    results = []
    with create("local", MeasureConfig(number=3, repeat=3, min_repeat_ms=50)) as measurer:
        for w, workload in enumerate(args.workload or WORKLOADS):
            row: dict = {"workload": workload}
            runs, programs = [], {}
            for gen in GENERATORS:
                task = OpTask(workload, mapping=gen)
                top = freeze({"mapping": 0})
                agent = agents.create("random", seed=args.seed)
                with RecordDB(args.output / f"records_{w}_{gen}.jsonl") as db:
                    session = TuningSession(task, measurer, db)
                    if session.best[0] is None:  # the loop-only stage then keeps mapping 0
                        session.measure(agent.propose(session, 1, top))
                    latency = tune(session, agent, Budget(0, args.trials), batch=args.batch,
                                   top_k=args.top_k, progress=False)
                    cand, _ = session.best
                    programs[gen] = task.program(cand.factors)
                    raw = programs[gen].random_inputs(args.seed + 2)
                    runs.append(compiled_baseline(gen, programs[gen],
                                                  session.schedule(cand).mod, raw=raw))
                row[gen] = {"mappings": len(task.template.mappings),
                            "top": task.template.mapping(dict(top)).describe(),
                            "tuned_latency_s": latency, "trials": session.trials}
            expected = programs[GENERATORS[0]].reference(raw)
            stats = compare(runs, [expected], rtol=0.0)
            for gen in GENERATORS:
                row[gen]["retimed_median_s"] = stats[gen].median
                print(f"{workload} {gen}: {row[gen]['mappings']} mappings, top "
                      f"{row[gen]['top']}, re-timed {stats[gen].median * 1e3:.4g} ms")
            row["amos_over_cp_embedding"] = stats["amos"].median / stats["cp_embedding"].median
            results.append(row)
    (args.output / "result.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()

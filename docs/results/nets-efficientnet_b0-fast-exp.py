"""A/B: a finished `altenv bench net` EfficientNet-B0 cell (``OUTPUT/efficientnet_b0``) rebuilt
with the fast_math it was tuned with and with TVM's fast exp in its SiLU/sigmoid epilogues,
on the same layouts and loop decisions; MetaSchedule's network and PyTorch eager beside
them; checked against torch, timed interleaved.

    python docs/results/nets-efficientnet_b0-fast-exp.py OUTPUT
"""
import json
import sys
from pathlib import Path

from altenv.baselines import compare, network_baseline, torch_module_baseline, tuned_relax_baseline
from altenv.config import RunConfig
from altenv.graph import load_model
from altenv.graph.network import build_network
from altenv.graph.tasks import extract_tasks
from altenv.measure.timing import summaries
from altenv.ops.epilogue import fast_step
from altenv.pipeline import RunDir
from altenv.pipeline.replay import replay_best

out = Path(sys.argv[1])
name = sys.argv[2] if len(sys.argv) > 2 else "efficientnet_b0"
cell = out / name / "altenv-seed0"
run_dir = RunDir(cell)
cfg = RunConfig.model_validate(run_dir.saved_config())
target = cfg.target
best = json.loads(run_dir.best.read_text())
model = load_model(name, seed=0)
inputs = model.random_inputs(12345)
expected = model.reference(inputs)
runs = [tuned_relax_baseline(model.mod, model.params, inputs, out / name / "metaschedule-seed0",
                             target=target)]
runs[0].name = "metaschedule"
for label, fm in (("altenv-libm-exp", tuple(cfg.fast_math)), ("altenv-fast-exp", ("erf", "exp"))):
    factors, schedules = {}, {}
    for task, entry in best["tasks"].items():
        epi = [fast_step(s, fm) for s in entry["epilogue"]]
        _, f, sch = replay_best(entry["spec"], epi, target, entry)
        factors[task], schedules[task] = dict(f), sch
    net = build_network(extract_tasks(model), factors, schedules, target,
                        best.get("read_through", "measure"), run_dir.others_database(), fm)
    steps = {low.activation for low in net.plan.lowerings.values() if low.activation}
    print(label, "fast_math", fm, "activations", sorted(steps))
    runs.append(network_baseline(label, net, inputs))
runs.append(torch_module_baseline(model.torch_module, inputs, target=target))
stats = compare(runs, expected, rtol=1e-4, rounds=10)
res = summaries(stats)
print(json.dumps(res, indent=1))
m = {k: v["median_s"] for k, v in res.items()}
print("torch/fast %.3f" % (m["torch"] / m["altenv-fast-exp"]))
libm, fast, ms = m["altenv-libm-exp"], m["altenv-fast-exp"], m["metaschedule"]
print(f"libm/fast {libm / fast:.3f}  MS/libm {ms / libm:.3f}  MS/fast {ms / fast:.3f}")

"""``altenv tasks``: a model's complex calls, tuned with layouts or why not, before tuning."""

from __future__ import annotations

import json

from altenv.cli import main
from altenv.ops import operator_for, parse_workload

NET = '''
import torch
from torch import nn


class Net(nn.Module):
    """A conv the generator covers (bias, relu), then one it does not (a clip before the
    residual add)."""

    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(3, 8, 3, padding=1)
        self.b = nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x):
        y = torch.relu(self.a(x))
        return y + torch.clamp(self.b(y), 0, 6)


def make():
    torch.manual_seed(0)
    return Net().eval(), (torch.randn(1, 3, 6, 6),)
'''


def test_tasks_reports_tuned_calls_reasons_and_flops_share(tmp_path, capsys, caplog):
    source = tmp_path / "net.py"
    source.write_text(NET)
    with caplog.at_level("WARNING"):
        assert main(["tasks", f"{source}:make", "--json"]) == 0
    assert not [r for r in caplog.records if r.name == "altenv.graph.plan"]  # once: below
    report = json.loads(capsys.readouterr().out)
    tuned, fallback = report["calls"]
    assert tuned["tuned"] and tuned["reason"] is None
    assert tuned["spec"] == "c2d:N=1,I=3,H=6,W=6,O=8,KH=3,KW=3,stride=1,pad=1"
    assert tuned["epilogue"] == ["bias", "relu"]
    assert not fallback["tuned"] and fallback["epilogue"] is None and fallback["reason"]
    flops = [operator_for(parse_workload(c["spec"])).flops() for c in report["calls"]]
    assert [c["flops"] for c in report["calls"]] == flops
    assert report["tuned_calls"] == 1
    assert report["tuned_flops_share"] == flops[0] / sum(flops)

    assert main(["tasks", f"{source}:make"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[1].split()[:2] == ["0", "yes"] and "|bias+relu" in table[1]
    assert table[2].split()[:2] == ["1", "no"] and fallback["reason"] in table[2]
    assert table[-1].startswith(f"make: 1 of 2 complex calls tuned with layouts, "
                                f"{flops[0] / sum(flops):.1%}")


def test_tasks_bad_model_is_one_line_and_status_2(tmp_path, capsys):
    assert main(["tasks", "no_such_net"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "model 'no_such_net'" in err
    assert main(["tasks", "resnet18", "--option", "size"]) == 2
    assert "--option 'size': expected KEY=VALUE" in capsys.readouterr().err

"""Shared fixtures: a tiny torch network file for the model-level tests, a loopback
RPC device behind a tracker, SB3 logs kept in pytest's temp directory; slow tests are
handed out first."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from tvm.rpc.server import Server
from tvm.rpc.tracker import Tracker
from tvm.s_tir.meta_schedule.runner import RPCConfig

from altenv.measure import RPCSettings

#: The evolution agent's search at test size, for configs and ``--set agent.options=``: its
#: defaults (populations of 64 and, in MetaSchedule's loop search, 512) spend most of a run
#: this small generating candidates; no behaviour tested depends on them.
SMALL_EVOLUTION = "{ms_population: 32, population: 16, children: 16, samples: 16}"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Slow tests first (a stable sort): pytest-xdist hands tests out in this order, so on a
    2-core machine the long ones start at once instead of running last with one core idle."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture(autouse=True, scope="session")
def _sb3_logs_in_pytests_tmp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Bare SB3 models (the env tests, the SB3 example) log to ``$SB3_LOGDIR``, else to a
    new ``SB3-<time>`` folder in the system's temp directory on every ``learn()``: keep
    them in pytest's."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SB3_LOGDIR", str(tmp_path_factory.mktemp("sb3")))
        yield


TINY_MODEL = '''
import torch
from torch import nn


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1, groups=2)
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        y = torch.relu(self.bn(self.conv1(x)))
        y = torch.relu(self.conv2(y) + y)
        return self.fc(y.mean(dim=(2, 3)))


def factory():
    torch.manual_seed(0)
    model = Tiny().eval()
    with torch.no_grad():
        model.bn.running_mean.uniform_(-0.5, 0.5)
        model.bn.running_var.uniform_(0.5, 1.5)
    return model, (torch.randn(1, 3, 8, 8),)
'''


@pytest.fixture
def tiny_model(tmp_path):
    """``path/tiny.py:factory``: conv + batch norm, a grouped conv with a residual add, mean
    and a linear head, on an 8x8 input (the module is importable as ``tiny`` from
    ``tmp_path``)."""
    (tmp_path / "tiny.py").write_text(TINY_MODEL)
    return f"{tmp_path / 'tiny.py'}:factory"


@pytest.fixture
def loopback_rpc() -> Iterator[RPCSettings]:
    """A tracker and one RPC server on this host, registered under the key ``altenv-test``."""
    tracker = Tracker(host="127.0.0.1", port=9190, port_end=9290, silent=True)
    server = Server(host="127.0.0.1", port=9300, port_end=9400, key="altenv-test",
                    tracker_addr=("127.0.0.1", tracker.port), silent=True)
    settings = RPCSettings(tracker=f"127.0.0.1:{tracker.port}", key="altenv-test")
    config = RPCConfig(tracker_host="127.0.0.1", tracker_port=tracker.port,
                       tracker_key="altenv-test")
    for _ in range(100):  # the server registers asynchronously
        if config.count_num_servers() > 0:
            break
        time.sleep(0.1)
    try:
        yield settings
    finally:
        server.terminate()
        tracker.terminate()

"""Shared fixtures: a tiny torch network file for the model-level tests."""

from __future__ import annotations

import pytest

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

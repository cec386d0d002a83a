"""Mobile networks of the zoo in plain torch: MobileNet-V3, EfficientNet-B0, ShuffleNet-V2.

These are the memory-bound networks where layout tuning gains most, and the constructs
users bring with them: hardswish / SiLU activations, squeeze-excite blocks (1x1 convs on
1x1 spatial tensors, a broadcast multiply back into the feature map) and ShuffleNet's
channel split, concat and shuffle. Written after the papers (and torchvision's layer
settings), with a ``width`` multiplier for small test variants; torchvision's own wheel
does not load here.
"""

from __future__ import annotations

import torch
from torch import nn


def ch(channels: float, width: float, divisor: int = 8) -> int:
    """Scale a channel count by ``width``, rounded to a multiple of ``divisor`` (never below
    it, never more than 10% under the scaled count), as MobileNet's ``_make_divisible``."""
    scaled = max(divisor, int(channels * width + divisor / 2) // divisor * divisor)
    if scaled < 0.9 * channels * width:
        scaled += divisor
    return scaled


def _conv_bn(cin: int, cout: int, kernel: int, stride: int = 1, groups: int = 1,
             act: type[nn.Module] | None = None) -> nn.Sequential:
    layers: list[nn.Module] = [
        nn.Conv2d(cin, cout, kernel, stride, (kernel - 1) // 2, groups=groups, bias=False),
        nn.BatchNorm2d(cout)]
    if act is not None:
        layers.append(act())
    return nn.Sequential(*layers)


class SqueezeExcite(nn.Module):
    """Squeeze-and-excitation (Hu et al.): global pool, 1x1 reduce + activation, 1x1
    expand + gate, channel-wise multiply back into the input."""

    def __init__(self, channels: int, squeeze: int, act: type[nn.Module],
                 gate: type[nn.Module]) -> None:
        super().__init__()
        self.fc1 = nn.Conv2d(channels, squeeze, 1)
        self.act = act()
        self.fc2 = nn.Conv2d(squeeze, channels, 1)
        self.gate = gate()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = nn.functional.adaptive_avg_pool2d(x, 1)
        return x * self.gate(self.fc2(self.act(self.fc1(s))))


class InvertedResidual(nn.Module):
    """Inverted residual with optional squeeze-excite (MobileNet-V2's block, MobileNet-V3
    bneck, EfficientNet MBConv): 1x1 expand, kxk depthwise, SE (``se`` squeezed
    channels, gated by ``gate``), 1x1 linear projection, residual when shapes allow."""

    def __init__(self, cin: int, hidden: int, cout: int, kernel: int, stride: int,
                 act: type[nn.Module], se: int | None = None,
                 gate: type[nn.Module] = nn.Sigmoid) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        if hidden != cin:
            layers.append(_conv_bn(cin, hidden, 1, act=act))
        layers.append(_conv_bn(hidden, hidden, kernel, stride, hidden, act))
        if se is not None:
            layers.append(SqueezeExcite(hidden, se, act if act is nn.SiLU else nn.ReLU, gate))
        layers.append(_conv_bn(hidden, cout, 1))
        self.block = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.block(x)
        return x + out if self.residual else out


class MobileNetV3Small(nn.Module):
    """MobileNet-V3-Small (Howard et al., Table 2): hardswish, squeeze-excite gated by
    hardsigmoid; ``width`` is the width multiplier."""

    # kernel, expansion, out, SE, hardswish, stride
    SETTINGS = ((3, 16, 16, True, False, 2), (3, 72, 24, False, False, 2),
                (3, 88, 24, False, False, 1), (5, 96, 40, True, True, 2),
                (5, 240, 40, True, True, 1), (5, 240, 40, True, True, 1),
                (5, 120, 48, True, True, 1), (5, 144, 48, True, True, 1),
                (5, 288, 96, True, True, 2), (5, 576, 96, True, True, 1),
                (5, 576, 96, True, True, 1))

    def __init__(self, width: float = 1.0, num_classes: int = 1000) -> None:
        super().__init__()
        cin = ch(16, width)
        layers: list[nn.Module] = [_conv_bn(3, cin, 3, 2, act=nn.Hardswish)]
        for k, exp, out, se, hs, s in self.SETTINGS:
            hidden, cout = ch(exp, width), ch(out, width)
            act = nn.Hardswish if hs else nn.ReLU
            layers.append(InvertedResidual(cin, hidden, cout, k, s, act, ch(hidden // 4, 1.0)
                                  if se else None, nn.Hardsigmoid))
            cin = cout
        last = 6 * cin
        layers.append(_conv_bn(cin, last, 1, act=nn.Hardswish))
        self.features = nn.Sequential(*layers)
        head = ch(1024, width)
        self.classifier = nn.Sequential(nn.Linear(last, head), nn.Hardswish(), nn.Dropout(0.2),
                                        nn.Linear(head, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = nn.functional.adaptive_avg_pool2d(self.features(x), 1)
        return self.classifier(torch.flatten(x, 1))


class EfficientNetB0(nn.Module):
    """EfficientNet-B0 (Tan & Le, Table 1): MBConv blocks with SiLU and squeeze-excite
    (reduction 4 of the block input, sigmoid gate); ``width`` scales the channels."""

    # expansion, kernel, stride, out, repeats
    SETTINGS = ((1, 3, 1, 16, 1), (6, 3, 2, 24, 2), (6, 5, 2, 40, 2), (6, 3, 2, 80, 3),
                (6, 5, 1, 112, 3), (6, 5, 2, 192, 4), (6, 3, 1, 320, 1))

    def __init__(self, width: float = 1.0, num_classes: int = 1000) -> None:
        super().__init__()
        cin = ch(32, width)
        layers: list[nn.Module] = [_conv_bn(3, cin, 3, 2, act=nn.SiLU)]
        for t, k, s, c, n in self.SETTINGS:
            cout = ch(c, width)
            for i in range(n):
                layers.append(InvertedResidual(cin, cin * t, cout, k, s if i == 0 else 1, nn.SiLU,
                                      max(1, cin // 4), nn.Sigmoid))
                cin = cout
        last = ch(1280, max(1.0, width))
        layers.append(_conv_bn(cin, last, 1, act=nn.SiLU))
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(last, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = nn.functional.adaptive_avg_pool2d(self.features(x), 1)
        return self.classifier(torch.flatten(x, 1))


def channel_shuffle(x: torch.Tensor, groups: int) -> torch.Tensor:
    """ShuffleNet's channel shuffle: reshape to (groups, C/groups), transpose, flatten."""
    n, c, h, w = x.shape
    return x.reshape(n, groups, c // groups, h, w).transpose(1, 2).reshape(n, c, h, w)


class _ShuffleUnit(nn.Module):
    """ShuffleNet-V2 unit (Ma et al., Fig. 3c/d): split the channels in two (stride 1) or
    feed both branches (stride 2), concat, shuffle."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        half = cout // 2
        self.stride = stride
        if stride > 1:
            self.branch1 = nn.Sequential(_conv_bn(cin, cin, 3, stride, cin),
                                         _conv_bn(cin, half, 1, act=nn.ReLU))
        main_in = cin if stride > 1 else half
        self.branch2 = nn.Sequential(_conv_bn(main_in, half, 1, act=nn.ReLU),
                                     _conv_bn(half, half, 3, stride, half),
                                     _conv_bn(half, half, 1, act=nn.ReLU))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.stride == 1:
            a, b = x.chunk(2, dim=1)
            out = torch.cat((a, self.branch2(b)), dim=1)
        else:
            out = torch.cat((self.branch1(x), self.branch2(x)), dim=1)
        return channel_shuffle(out, 2)


class ShuffleNetV2(nn.Module):
    """ShuffleNet-V2 1.0x (Ma et al., Table 5); ``width`` scales the stage channels."""

    STAGES = ((116, 4), (232, 8), (464, 4))

    def __init__(self, width: float = 1.0, num_classes: int = 1000) -> None:
        super().__init__()
        cin = 24
        layers: list[nn.Module] = [_conv_bn(3, cin, 3, 2, act=nn.ReLU), nn.MaxPool2d(3, 2, 1)]
        for c, n in self.STAGES:
            cout = 2 * ch(c / 2, width, 4)
            for i in range(n):
                layers.append(_ShuffleUnit(cin, cout, 2 if i == 0 else 1))
                cin = cout
        last = ch(1024, max(1.0, width))
        layers.append(_conv_bn(cin, last, 1, act=nn.ReLU))
        self.features = nn.Sequential(*layers)
        self.fc = nn.Linear(last, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.features(x).mean((2, 3)))

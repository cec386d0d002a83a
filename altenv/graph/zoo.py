"""Model zoo in plain torch: ResNet-18, MobileNet-V2, BERT-tiny, R3D-18, a DCGAN generator
and the mobile networks of :mod:`altenv.graph.zoo_mobile`.

Architectures follow the standard definitions (torchvision's ResNet/MobileNetV2/VideoResNet
and Google's BERT) with random seeded weights; a ``width`` multiplier and the ``small``
input sizes keep tests fast.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from altenv.graph.zoo_mobile import (
    EfficientNetB0,
    InvertedResidual,
    MobileNetV3Small,
    ShuffleNetV2,
)
from altenv.graph.zoo_mobile import ch as _ch


class _BasicBlock(nn.Module):
    """ResNet basic block (two 3x3 convs) for 2-D or 3-D inputs."""

    def __init__(self, cin: int, cout: int, stride: int, dims: int) -> None:
        super().__init__()
        conv = nn.Conv2d if dims == 2 else nn.Conv3d
        bn = nn.BatchNorm2d if dims == 2 else nn.BatchNorm3d
        self.conv1 = conv(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = bn(cout)
        self.conv2 = conv(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = bn(cout)
        self.relu = nn.ReLU()
        self.downsample: nn.Module | None = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(conv(cin, cout, 1, stride, bias=False), bn(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class _ResNet18(nn.Module):
    """ResNet-18 body for images (``dims=2``) or video (``dims=3``): a stem, four stages of
    two basic blocks, global average pooling and a linear head."""

    def __init__(self, stem: nn.Module, dims: int, width: float, num_classes: int) -> None:
        super().__init__()
        chans = [_ch(c, width) for c in (64, 128, 256, 512)]
        self.dims = dims
        self.stem = stem
        blocks: list[nn.Module] = []
        cin = chans[0]
        for i, cout in enumerate(chans):
            stride = 1 if i == 0 else 2
            blocks += [_BasicBlock(cin, cout, stride, dims), _BasicBlock(cout, cout, 1, dims)]
            cin = cout
        self.layers = nn.Sequential(*blocks)
        self.fc = nn.Linear(cin, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layers(self.stem(x))
        pool = nn.functional.adaptive_avg_pool2d if self.dims == 2 else \
            nn.functional.adaptive_avg_pool3d
        return self.fc(torch.flatten(pool(x, 1), 1))


class ResNet18(_ResNet18):
    """ResNet-18 (He et al.), ImageNet head; ``width`` scales every channel count."""

    def __init__(self, width: float = 1.0, num_classes: int = 1000) -> None:
        c = _ch(64, width)
        stem = nn.Sequential(nn.Conv2d(3, c, 7, 2, 3, bias=False), nn.BatchNorm2d(c), nn.ReLU(),
                             nn.MaxPool2d(3, 2, 1))
        super().__init__(stem, 2, width, num_classes)


class R3D18(_ResNet18):
    """R3D-18 video ResNet (Tran et al.; torchvision ``r3d_18``), Kinetics-400 head."""

    def __init__(self, width: float = 1.0, num_classes: int = 400) -> None:
        c = _ch(64, width)
        stem = nn.Sequential(nn.Conv3d(3, c, (3, 7, 7), (1, 2, 2), (1, 3, 3), bias=False),
                             nn.BatchNorm3d(c), nn.ReLU())
        super().__init__(stem, 3, width, num_classes)


class MobileNetV2(nn.Module):
    """MobileNet-V2 (Sandler et al.), ImageNet head; ``width`` is the width multiplier."""

    SETTINGS = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2),
                (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1))

    def __init__(self, width: float = 1.0, num_classes: int = 1000) -> None:
        super().__init__()
        cin = _ch(32, width)
        last = _ch(1280, max(1.0, width))
        layers: list[nn.Module] = [nn.Conv2d(3, cin, 3, 2, 1, bias=False), nn.BatchNorm2d(cin),
                                   nn.ReLU6()]
        for t, c, n, s in self.SETTINGS:
            cout = _ch(c, width)
            for i in range(n):
                layers.append(InvertedResidual(cin, cin * t, cout, 3, s if i == 0 else 1,
                                                nn.ReLU6))
                cin = cout
        layers += [nn.Conv2d(cin, last, 1, bias=False), nn.BatchNorm2d(last), nn.ReLU6()]
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(last, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = nn.functional.adaptive_avg_pool2d(self.features(x), 1)
        return self.classifier(torch.flatten(x, 1))


class _BertLayer(nn.Module):
    """One BERT encoder layer: multi-head self-attention and a GELU feed-forward, post-LN."""

    def __init__(self, hidden: int, heads: int, intermediate: int) -> None:
        super().__init__()
        self.heads = heads
        self.query = nn.Linear(hidden, hidden)
        self.key = nn.Linear(hidden, hidden)
        self.value = nn.Linear(hidden, hidden)
        self.attn_out = nn.Linear(hidden, hidden)
        self.attn_norm = nn.LayerNorm(hidden, eps=1e-12)
        self.inter = nn.Linear(hidden, intermediate)
        self.out = nn.Linear(intermediate, hidden)
        self.out_norm = nn.LayerNorm(hidden, eps=1e-12)

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        return x.reshape(b, s, self.heads, h // self.heads).permute(0, 2, 1, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self._split(self.query(x)), self._split(self.key(x)), self._split(self.value(x))
        scores = torch.matmul(q, k.transpose(-1, -2)) / float(q.shape[-1]) ** 0.5
        ctx = torch.matmul(torch.softmax(scores, dim=-1), v)
        ctx = ctx.permute(0, 2, 1, 3).reshape(x.shape)
        x = self.attn_norm(x + self.attn_out(ctx))
        return self.out_norm(x + self.out(nn.functional.gelu(self.inter(x))))


class BertTiny(nn.Module):
    """BERT-tiny (Turc et al.: L=2, H=128, A=2, FFN 512): embeddings, encoder, tanh pooler.

    Takes token ids ``[batch, seq]`` (int64); returns ``(sequence_output, pooled_output)``.
    """

    def __init__(self, layers: int = 2, hidden: int = 128, heads: int = 2,
                 vocab: int = 30522, max_positions: int = 512) -> None:
        super().__init__()
        self.word = nn.Embedding(vocab, hidden)
        self.position = nn.Embedding(max_positions, hidden)
        self.token_type = nn.Embedding(2, hidden)
        self.emb_norm = nn.LayerNorm(hidden, eps=1e-12)
        self.layers = nn.ModuleList(_BertLayer(hidden, heads, 4 * hidden) for _ in range(layers))
        self.pooler = nn.Linear(hidden, hidden)

    def forward(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        pos = torch.arange(ids.shape[1], device=ids.device)
        x = self.word(ids) + self.position(pos)[None] + self.token_type.weight[0]
        x = self.emb_norm(x)
        for layer in self.layers:
            x = layer(x)
        return x, torch.tanh(self.pooler(x[:, 0]))


class DCGANGenerator(nn.Module):
    """DCGAN generator (Radford et al., Fig. 1): a latent ``[N, nz, 1, 1]`` through five
    4x4 transposed convolutions (the first at stride 1 to 4x4, the rest at stride 2; batch
    norm + ReLU, tanh at the end) to a 64x64 image; ``width`` scales the feature maps
    (``ngf = 64 * width``)."""

    def __init__(self, width: float = 1.0, nz: int = 100, channels: int = 3) -> None:
        super().__init__()
        ngf = _ch(64, width)
        chans = [nz, 8 * ngf, 4 * ngf, 2 * ngf, ngf]
        layers: list[nn.Module] = []
        for i, (cin, cout) in enumerate(zip(chans, chans[1:])):
            layers += [nn.ConvTranspose2d(cin, cout, 4, 1 if i == 0 else 2, 0 if i == 0 else 1,
                                          bias=False), nn.BatchNorm2d(cout), nn.ReLU()]
        layers += [nn.ConvTranspose2d(ngf, channels, 4, 2, 1, bias=False), nn.Tanh()]
        self.main = nn.Sequential(*layers)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.main(z)


@dataclass(frozen=True)
class ZooModel:
    """A zoo entry: how to build the module and its example inputs at each size.

    Parameters
    ----------
    name: zoo name.
    build: ``build(**options) -> nn.Module``.
    input_shapes: ``{"small": [...], "full": [...]}``, one shape per input.
    small_options: module options used at the ``small`` size (e.g. a width multiplier).
    input_dtype: dtype of the inputs (``int64`` token ids for BERT).
    int_high: exclusive upper bound of random integer inputs.
    """

    name: str
    build: Callable[..., nn.Module]
    input_shapes: dict[str, list[tuple[int, ...]]]
    small_options: dict[str, float | int]
    input_dtype: str = "float32"
    int_high: int | None = None


IMAGE = {"small": [(1, 3, 32, 32)], "full": [(1, 3, 224, 224)]}
"""Input shapes of the ImageNet classifiers."""
IMAGE_SMALL = {"width": 0.25, "num_classes": 10}
"""Their small variants' options."""

ZOO: dict[str, ZooModel] = {
    "resnet18": ZooModel("resnet18", ResNet18, IMAGE, IMAGE_SMALL),
    "mobilenet_v2": ZooModel("mobilenet_v2", MobileNetV2, IMAGE, IMAGE_SMALL),
    "bert_tiny": ZooModel("bert_tiny", BertTiny, {"small": [(1, 16)], "full": [(1, 128)]},
                          {"vocab": 1000}, input_dtype="int64", int_high=1000),
    "r3d_18": ZooModel("r3d_18", R3D18,
                       {"small": [(1, 3, 4, 16, 16)], "full": [(1, 3, 16, 112, 112)]},
                       {"width": 0.125, "num_classes": 10}),
    "mobilenet_v3_small": ZooModel("mobilenet_v3_small", MobileNetV3Small, IMAGE, IMAGE_SMALL),
    "efficientnet_b0": ZooModel("efficientnet_b0", EfficientNetB0, IMAGE, IMAGE_SMALL),
    "shufflenet_v2": ZooModel("shufflenet_v2", ShuffleNetV2, IMAGE, IMAGE_SMALL),
    "dcgan": ZooModel("dcgan", DCGANGenerator,
                      {"small": [(1, 16, 1, 1)], "full": [(1, 100, 1, 1)]},
                      {"width": 0.125, "nz": 16}),
}


def random_inputs(shapes: list[tuple[int, ...]], dtypes: list[str], seed: int = 0,
                  int_high: int | None = None) -> tuple[torch.Tensor, ...]:
    """Seeded random inputs, never all zeros: N(0, 1) floats, integers in ``[1, int_high)``."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for shape, dtype in zip(shapes, dtypes):
        if dtype.startswith("int"):
            out.append(torch.randint(1, int_high or 2, shape, generator=gen,
                                     dtype=getattr(torch, dtype)))
        else:
            out.append(torch.randn(shape, generator=gen, dtype=getattr(torch, dtype)))
    return tuple(out)


def get_model(name: str, *, size: str = "full", input_shapes: list[tuple[int, ...]] | None = None,
              weights: str | Path | None = None, seed: int = 0,
              **options: float | int) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """Build zoo model ``name`` in eval mode with example inputs.

    ``size`` is ``"small"`` (reduced width and input, for tests) or ``"full"`` (benchmark size);
    ``options`` override the module options (``width``, ``num_classes``, ``vocab``, ...);
    ``input_shapes`` overrides the example input shapes (e.g. BERT's sequence length);
    ``weights`` is a state-dict file, otherwise weights are random with ``seed``.
    """
    if name not in ZOO:
        raise KeyError(f"zoo: unknown model {name!r}; known: {', '.join(sorted(ZOO))}")
    if size not in ("small", "full"):
        raise ValueError(f"zoo: size must be 'small' or 'full', not {size!r}")
    entry = ZOO[name]
    opts = dict(entry.small_options) if size == "small" else {}
    opts.update(options)
    torch.manual_seed(seed)
    module = entry.build(**opts)
    if weights is not None:
        module.load_state_dict(torch.load(weights, map_location="cpu", weights_only=True))
    else:
        _randomize_norm_stats(module, seed)
    module.eval()
    shapes = input_shapes or entry.input_shapes[size]
    high = opts.get("vocab", entry.int_high)
    inputs = random_inputs(shapes, [entry.input_dtype] * len(shapes), seed,
                           None if high is None else int(high))
    return module, inputs


def _randomize_norm_stats(module: nn.Module, seed: int) -> None:
    """Give batch-norm layers non-trivial running statistics, so inference numerics test them."""
    gen = torch.Generator().manual_seed(seed + 1)
    for mod in module.modules():
        if isinstance(mod, nn.modules.batchnorm._BatchNorm):
            n = mod.num_features
            mod.running_mean.copy_(0.1 * torch.randn(n, generator=gen))
            mod.running_var.copy_(0.5 + torch.rand(n, generator=gen))
            mod.weight.data.copy_(0.5 + torch.rand(n, generator=gen))
            mod.bias.data.copy_(0.1 * torch.randn(n, generator=gen))

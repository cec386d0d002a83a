"""All of a ``MultiDiscrete`` policy's masked heads as one tensor.

sb3-contrib's ``MaskableMultiCategoricalDistribution`` builds one torch ``Categorical`` per
head, each validating its arguments, on every forward pass. The cross-exploration action has
64 heads, so in pretraining that bookkeeping cost more than the environment's cost-model
step (profiled on a small GEMM: 7 s of 16 against 6 s). :class:`MaskedHeads` is the same
distribution (masked logits at sb3-contrib's ``-1e8``, masked entries adding nothing to the
entropy) on a ``(batch, heads, widest head)`` tensor, the shorter heads padded with entries
that are never chosen; the policy network and its checkpoints are unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from sb3_contrib.common.maskable.distributions import (
    MaskableMultiCategoricalDistribution,
    MaybeMasks,
)

MASKED = -1e8
"""sb3-contrib's logit for a masked choice."""
PADDING = -1e9
"""Logit of the entries past a head's size: below ``MASKED``, so a head whose every choice
is masked stays uniform over its own choices, as in sb3-contrib."""


class MaskedHeads(MaskableMultiCategoricalDistribution):
    """A masked multi-categorical distribution evaluated in one batch (see the module)."""

    def __init__(self, action_dims: Sequence[int]):
        super().__init__([int(d) for d in action_dims])
        dims = torch.as_tensor(self.action_dims)
        self.heads, self.width = len(self.action_dims), int(dims.max())
        self._real = torch.arange(self.width)[None, :] < dims[:, None]
        self._index = self._real.flatten().nonzero().squeeze(1)
        self._fill = torch.where(self._real, MASKED, PADDING)  # a masked entry's logit
        self._raw = torch.empty(0)
        self.masks = torch.empty(0, dtype=torch.bool)
        self.logits = torch.empty(0)

    def _padded(self, flat: torch.Tensor, fill: float | bool) -> torch.Tensor:
        out = flat.new_full((flat.shape[0], self.heads * self.width), fill)
        out[:, self._index] = flat
        return out.view(-1, self.heads, self.width)

    def proba_distribution(self, action_logits: torch.Tensor) -> MaskedHeads:
        self._raw = self._padded(action_logits.view(-1, sum(self.action_dims)), PADDING)
        self.apply_masking(None)
        return self

    def apply_masking(self, masks: MaybeMasks) -> None:
        if masks is None:
            self.masks = self._real.expand(self._raw.shape[0], -1, -1)
        else:
            flat = torch.as_tensor(masks, dtype=torch.bool).view(-1, sum(self.action_dims))
            self.masks = self._padded(flat, False)
        logits = torch.where(self.masks, self._raw, self._fill.to(self._raw.dtype))
        self.logits = logits - logits.logsumexp(-1, keepdim=True)

    def log_prob(self, actions: torch.Tensor) -> torch.Tensor:
        index = actions.view(-1, self.heads, 1).long()
        return self.logits.gather(-1, index).squeeze(-1).sum(-1)

    def entropy(self) -> torch.Tensor:
        p_log_p = torch.where(self.masks, self.logits * self.logits.exp(), 0.0)
        return -p_log_p.sum((-2, -1))

    def sample(self) -> torch.Tensor:
        probs = self.logits.exp().view(-1, self.width)
        return torch.multinomial(probs, 1).view(-1, self.heads)

    def mode(self) -> torch.Tensor:
        return self.logits.argmax(-1)

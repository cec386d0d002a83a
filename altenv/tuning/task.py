"""``OpTask``: one operator workload as a tuning unit (layout template x loop space).

A point of the joint space is a :class:`Candidate`: template factors (the layouts of the
operator's tensors, ALT §5.1) and a point of the loop space of the program those layouts
generate (§4.3). The loop space is rebuilt, and cached, per layout.

With ``mapping="amos"`` the layout choice is an intrinsic mapping instead (AMOS §5): the
factors are ``{"mapping": k}``, the program is generated under the mapping's layouts and
its loop space tiles around the tensorized intrinsic (``altenv.mapping``).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import tvm

from ..mapping import MappingTemplate
from ..measure import CorrectnessCheck
from ..ops import LayoutTemplate, OpProgram, parse_workload
from ..ops.epilogue import canonical_step
from ..ops.templates import Template
from ..ops.workload import Workload
from ..space import LoopPoint, LoopSpace
from ..target import make_target

Factors = tuple[tuple[str, int], ...]


def freeze(factors: Mapping[str, int]) -> Factors:
    """A hashable form of template factors."""
    return tuple(sorted((str(k), int(v)) for k, v in factors.items()))


@dataclass(frozen=True)
class Candidate:
    """A point of the joint space: layout template factors and a loop-space point."""

    factors: Factors
    point: LoopPoint


class OpTask:
    """An operator workload with its layout template, tuned for one target.

    Parameters
    ----------
    workload:
        A :class:`~altenv.ops.Workload` (what runs and suites pass: their configs parsed
        it) or a spec string such as ``"c2d:N=1,I=64,O=64,H=56,W=56,KH=3,KW=3,pad=1"``,
        parsed here.
    target:
        A target (``None``: this host's CPU).
    epilogue:
        Elementwise steps fused after the operator (``bias``, ``residual``, activations
        such as ``relu`` or ``clip(-1,2)``), kept in canonical form so that one epilogue
        has one records key.
    levels:
        Tiling levels of the layout template.
    cache_size:
        Layouts whose programs and loop spaces are kept.
    mapping:
        ``"none"`` (ALT's layout template) or a mapping generator (``"amos"``,
        ``"cp_embedding"``): the layout knob then picks one of the generator's mappings of
        the (int8) operator onto the target's dot-product intrinsic, tensorized.
    """

    def __init__(self, workload: str | Workload, target: Any = None,
                 epilogue: Sequence[str] = (), levels: int = 1, cache_size: int = 16,
                 mapping: str = "none"):
        self.workload: Workload = parse_workload(workload)
        self.target: tvm.target.Target = make_target(target)
        self.epilogue = tuple(canonical_step(step) for step in epilogue)
        self.mapping = mapping
        self.template: Template = (
            LayoutTemplate(self.workload, levels=levels) if mapping == "none" else
            MappingTemplate(self.workload, mapping, self.target))
        self._cache: OrderedDict[Factors, tuple[OpProgram, LoopSpace]] = OrderedDict()
        self._cache_size = cache_size

    @property
    def key(self) -> str:
        """The workload key of records: the spec plus any epilogue."""
        return str(self.workload) + ("|" + "+".join(self.epilogue) if self.epilogue else "")

    def default_factors(self) -> Factors:
        return freeze(self.template.default_factors())

    def blocked_factors(self, lanes: int) -> Factors | None:
        """The vendor-style blocked layout for ``lanes``-element vectors
        (:meth:`LayoutTemplate.blocked_factors`); ``None`` for an intrinsic mapping."""
        factors = self.template.blocked_factors(lanes)
        return None if factors is None else freeze(factors)

    def random_factors(self, rng: np.random.Generator) -> Factors:
        """Template factors of uniformly drawn layout actions (ALT Eq. 2: each knob takes
        the divisor nearest a uniform fraction of what the outer levels left, so large
        tiles are likelier than small ones)."""
        actions = rng.uniform(0, 1, len(self.template.knobs))
        return freeze(self.template.factors_from_actions(actions))

    def _entry(self, factors: Factors) -> tuple[OpProgram, LoopSpace]:
        if factors in self._cache:
            self._cache.move_to_end(factors)
            return self._cache[factors]
        program = self.template.generate(dict(factors), self.epilogue)
        entry = (program, LoopSpace(program.func, self.target, intrin=self.template.tensor_intrin))
        self._cache[factors] = entry
        while len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)
        return entry

    def program(self, factors: Factors) -> OpProgram:
        """The operator generated under the layouts of ``factors``."""
        return self._entry(factors)[0]

    def space(self, factors: Factors) -> LoopSpace:
        """The loop space of that program (built on MetaSchedule's design spaces)."""
        return self._entry(factors)[1]

    def layouts_json(self, factors: Factors) -> dict[str, Any]:
        """What records store about a layout: the factors and every tensor's layout (and
        the intrinsic mapping, if any)."""
        program = self.program(factors)
        return {"factors": dict(factors),
                "tensors": {n: lay.to_json() for n, lay in program.layouts.items()},
                **self.template.choice_json(dict(factors))}

    def check(self, factors: Factors, seed: int = 0) -> CorrectnessCheck:
        """A correctness check of a scheduled program against torch on random inputs
        (consistent physical inputs made from logical ones, never zeros), within the
        tolerance of the operator's dtype (:meth:`~altenv.ops.operators.Operator.tolerance`)."""
        program = self.program(factors)

        def case(rng: np.random.Generator) -> tuple[list[np.ndarray], np.ndarray]:
            raw = program.random_inputs(int(rng.integers(1 << 30)))
            expected = program.layouts["out"].apply(program.reference(raw))
            return program.physical_args(raw)[:-1], expected

        return CorrectnessCheck(case=case, seed=seed, rtol=program.op.tolerance())

"""The mapping choice as a tuning dimension: pick the target's intrinsic, enumerate and
realize its mappings, and expose them like a layout template (one knob, ``mapping``).

``OpTask(spec, mapping="amos")`` uses :class:`MappingTemplate` in place of ALT's layout
template: a candidate's factors are ``{"mapping": k}``, the index of a mapping in
:attr:`MappingTemplate.mappings`, and its layouts are the mapping's realization (AMOS
has the mapping decide the data layouts; ALT's tiling factors do not apply).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from collections.abc import Mapping as MappingType
from typing import Any

import numpy as np
import tvm
from tvm.target.codegen import target_has_features

from ..layout import Layout
from ..ops import OpProgram, generate, operator_for
from ..ops.templates import Knob
from ..ops.workload import Workload
from .base import GENERATORS, Intrinsic, Mapping
from .intrinsics import INTRINSICS, X86_PREFERENCE
from .nest import loop_nest
from .realize import Realization, realize

MAPPING_GENERATORS = ("amos", "cp_embedding")


def select_intrinsic(target: tvm.target.Target) -> Intrinsic:
    """The best x86 int8 dot product the target's CPU has (VNNI, else AVX2; TVM's
    saturating AVX-512BW one only when named explicitly)."""
    if target.kind.name != "llvm":
        raise ValueError(f"mapping: no intrinsic implemented for {target.kind.name} targets "
                         "(x86 dot products only; CUDA Tensor Cores are not implemented)")
    for name in X86_PREFERENCE:
        intrin = INTRINSICS[name]
        if name != "avx512_dot_16x4" and all(target_has_features(f, target)
                                             for f in intrin.features):
            return intrin
    raise ValueError(f"mapping: the target CPU {target.attrs.get('mcpu')} has none of "
                     f"{[INTRINSICS[n].features for n in X86_PREFERENCE]}")


def _waste(workload: Workload, mapping: Mapping, intrin: Intrinsic) -> float:
    """Fraction of the intrinsic's work spent on padding."""
    nest = loop_nest(workload)
    used = math.prod(mapping.fused_extent(nest, k) for k in range(len(intrin.dims)))
    padded = math.prod(mapping.fused_extent(nest, k) + p
                       for k, p in enumerate(mapping.padding(nest, intrin)))
    return 1.0 - used / padded


def check_generator(generator: str) -> None:
    """Raise ``ValueError`` unless ``generator`` names a mapping generator."""
    if generator not in MAPPING_GENERATORS or generator not in GENERATORS:
        raise ValueError(f"mapping: unknown generator {generator!r}; allowed: none, "
                         f"{', '.join(MAPPING_GENERATORS)}")


def mappings_for(wl: Workload, generator: str, intrin: Intrinsic
                 ) -> list[tuple[Mapping, Realization]]:
    """The mappings ``generator`` finds for ``wl`` on ``intrin`` that can be
    generated here, with their layouts: in the generator's order if it ranks them
    (``cp_embedding``: by its objective), else least padding first, then fewest fused
    loops."""
    check_generator(generator)
    gen = GENERATORS[generator]()
    found = gen.generate(loop_nest(wl), intrin)
    out = []
    for m in found:
        try:
            out.append((m, realize(wl, m)))
        except ValueError:
            continue
    if not out:
        raise ValueError(f"mapping: none of the {len(found)} {generator} mappings of {wl} onto "
                         f"{intrin.name} can be generated")
    if gen.ranked:
        return out
    nest = loop_nest(wl)
    order = {n: i for i, n in enumerate(nest.names)}
    out.sort(key=lambda mr: (round(_waste(wl, mr[0], intrin), 6), len(mr[0].mapped),
                             [order[n] for n in mr[0].mapped]))
    return out


class MappingTemplate:
    """A layout template whose only knob picks an intrinsic mapping
    (:class:`~altenv.ops.templates.Template`).

    Parameters
    ----------
    workload:
        An int8 operator (u8 data x i8 weight).
    generator:
        ``"amos"`` or ``"cp_embedding"``.
    target:
        Chooses the intrinsic (:func:`select_intrinsic`).
    """

    levels = 1

    def __init__(self, workload: Workload, generator: str, target: tvm.target.Target):
        self.workload = workload
        if self.workload.dtype != "int8":
            raise ValueError(f"mapping={generator!r}: the intrinsics are int8 dot products; "
                             f"use an int8 workload (…,dtype=int8), not {self.workload.dtype}")
        self.op = operator_for(self.workload)
        self.generator = generator
        self.intrinsic = select_intrinsic(target)
        found = mappings_for(self.workload, generator, self.intrinsic)
        self.mappings: list[Mapping] = [m for m, _ in found]
        self._realized = [r for _, r in found]
        self.knobs = [Knob("mapping", "mapping", len(self.mappings))]
        self.nest = loop_nest(self.workload)

    @property
    def knob_names(self) -> list[str]:
        return ["mapping"]

    @property
    def tensor_intrin(self) -> str:
        """The intrinsic the programs are tensorized with."""
        return self.intrinsic.tvm_intrin

    def default_factors(self) -> dict[str, int]:
        """The first mapping (least padding; the best objective for ``cp_embedding``)."""
        return {"mapping": 0}

    def choices(self, knob: Knob) -> list[int]:
        """Every mapping's index."""
        return list(range(len(self.mappings)))

    def blocked_factors(self, lanes: int) -> None:
        """None: the mapping decides the layouts."""
        return None

    def factors_from_actions(self, actions: Sequence[float]) -> dict[str, int]:
        """Action ``a`` in [0, 1] picks mapping ``floor(a * n)`` (the last for ``a = 1``)."""
        if len(actions) != 1:
            raise ValueError(f"expected 1 action (mapping), got {len(actions)}")
        n = len(self.mappings)
        return {"mapping": min(int(float(actions[0]) * n), n - 1)}

    def factors_from_indices(self, indices: Sequence[int]) -> dict[str, int]:
        """Discrete action: the mapping index (clipped to the last)."""
        return {"mapping": min(int(indices[0]), len(self.mappings) - 1)}

    def action_nvec(self) -> np.ndarray:
        return np.array([len(self.mappings)], dtype=np.int64)

    def action_mask(self, allowed: Callable[[str], set[int]]) -> np.ndarray:
        """Every mapping index is legal."""
        return np.ones(int(self.action_nvec().sum()), dtype=bool)

    def check(self, factors: MappingType[str, int]) -> None:
        if set(factors) != {"mapping"} or not 0 <= int(factors["mapping"]) < len(self.mappings):
            raise ValueError(f"mapping factors: expected {{'mapping': 0..{len(self.mappings) - 1}}}"
                             f", got {dict(factors)}")

    def mapping(self, factors: MappingType[str, int]) -> Mapping:
        self.check(factors)
        return self.mappings[int(factors["mapping"])]

    def realization(self, factors: MappingType[str, int]) -> Realization:
        self.check(factors)
        return self._realized[int(factors["mapping"])]

    def layouts(self, factors: MappingType[str, int] | None = None) -> dict[str, Layout]:
        return self.realization(factors or self.default_factors()).layouts

    def generate(self, factors: MappingType[str, int], epilogue: Sequence[str] = ()
                 ) -> OpProgram:
        """The operator generated under the mapping's layouts, its reduction split as the
        intrinsic reads it."""
        real = self.realization(factors)
        return generate(self.workload, real.layouts, epilogue, reduce=real.reduce)

    def choice_json(self, factors: MappingType[str, int]) -> dict[str, Any]:
        """The mapping itself, beside the layouts it gives."""
        return {"mapping": self.mapping(factors).to_json()}

    def observation(self, factors: MappingType[str, int]) -> np.ndarray:
        """Per intrinsic dim and loop of the nest: ``log(extent) / log(fused)`` if the loop
        is fused onto the dim, else 0; then per dim the padded fraction. Length
        ``dims * (loops + 1)``, fixed per operator kind."""
        m = self.mapping(factors)
        state = []
        pads = m.padding(self.nest, self.intrinsic)
        for k, group in enumerate(m.groups):
            fused = m.fused_extent(self.nest, k)
            scale = math.log(fused) if fused > 1 else 1.0
            state += [math.log(lp.extent) / scale if lp.name in group and lp.extent > 1 else
                      float(lp.name in group) for lp in self.nest.loops]
            state.append(pads[k] / (fused + pads[k]))
        return np.clip(np.asarray(state, dtype=np.float32), 0.0, 1.0)

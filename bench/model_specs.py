"""The released models for the benchmarks (flux_iteration.py --model NAME, model_memory.py, paper_costs.py): the
package's own table (models/releases.py: each adapter file's RELEASES), which `policy.weights = "random"` builds
from. No weights: each denoiser is built from its release's config, on the meta device or with random
weights."""

from __future__ import annotations

from typing import Any

from treegrpo_cli.models.releases import Release as Spec
from treegrpo_cli.models.releases import random_module, releases, text_shapes

MODELS: dict[str, Spec] = releases()
TRANSFORMERS = [k for k, v in MODELS.items() if v.tiny]  # what flux_iteration.py runs


def build(spec: Spec, tiny: bool, device: Any, dtype: Any, seed: int = 0) -> Any:
    """The spec's denoiser with seeded random weights on `device` (no download)."""
    return random_module(spec.transformer, spec.tiny if tiny else spec.config, device, dtype, seed)


def embed_shapes(spec: Spec, tiny: bool) -> dict[str, tuple[int, ...]]:
    """One prompt's cached embedding shapes (tiny: the tiny denoiser's widths, 8 text tokens)."""
    return text_shapes(spec, tiny, 8 if tiny else None)

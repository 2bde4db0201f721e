"""The released models of bench/model_specs.json, for the GPU iteration benchmark (flux_iteration.py --model NAME)
and the memory table (model_memory.py). No weights: each denoiser is built from its release's config, on the
meta device or with random weights.

Per model: the hub id, the adapter (models/<adapter>.py), the diffusers class and the release's config, a tiny
variant of the same architecture that runs the same code on the CPU, one prompt's cached embedding shapes,
the references' resolution, how the model is guided, its text encoders' sizes and the attributes a stand-in
pipeline needs beyond the denoiser.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Spec:
    hub_id: str
    adapter: str
    transformer: str
    config: dict[str, Any]
    tiny: dict[str, Any]  # empty: no tiny variant (flux_iteration.py runs the transformers only)
    embeds: dict[str, list[int]]
    resolution: int
    guidance: str
    text_encoders: dict[str, float]
    pipe: dict[str, Any]


MODELS = {
    k: Spec(**v) for k, v in json.loads((Path(__file__).parent / "model_specs.json").read_text())["models"].items()
}
TRANSFORMERS = [k for k, v in MODELS.items() if v.tiny]  # what flux_iteration.py runs


def build(spec: Spec, tiny: bool, device: Any, dtype: Any, seed: int = 0) -> Any:
    """The spec's transformer with its parameters on the meta device (accelerate's init_empty_weights; buffers
    such as RoPE tables are built for real), then seeded-normal weights allocated on `device` (no download)."""
    import diffusers
    import torch
    from accelerate import init_empty_weights

    with init_empty_weights(include_buffers=False):
        net = getattr(diffusers, spec.transformer)(**(spec.tiny if tiny else spec.config))
    gen = torch.Generator(device=device).manual_seed(seed)
    for module in net.modules():
        for name, p in list(module.named_parameters(recurse=False)):
            w = torch.empty(p.shape, device=device, dtype=dtype).normal_(0.0, 0.02, generator=gen)
            setattr(module, name, torch.nn.Parameter(w, requires_grad=p.requires_grad))
    return net.to(device).eval()


def embed_shapes(spec: Spec, tiny: bool) -> dict[str, tuple[int, ...]]:
    """The cached embeddings' shapes; tiny: 8 text tokens of the tiny transformer's width."""
    if not tiny:
        return {k: tuple(v) for k, v in spec.embeds.items()}
    width = spec.tiny.get("joint_attention_dim", spec.tiny.get("text_dim", 32))
    pooled = spec.tiny.get("pooled_projection_dim", 32)
    text = 8 + (77 if spec.adapter == "sd3" else 0)  # SD3: 77 CLIP tokens before the T5 ones
    return {k: ((text, width) if k == "prompt_embeds" else (pooled,)) for k in spec.embeds}

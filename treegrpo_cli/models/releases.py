"""The released models at their real sizes with seeded random weights: `policy.weights = "random"`.

Each release an adapter's card names (models/catalog.py: its --model name and hub id) has an entry in releases.json
with its denoiser's config (transformer/config.json or unet/config.json), its autoencoder's and scheduler's, its
pipeline class, the shapes of its cached text embeddings and a tiny variant of the same architectures
(`policy.size = "tiny"`, what the adapter tests run on the CPU). From these a real diffusers pipeline is assembled
with no text encoder and nothing downloaded: the denoiser and the autoencoder are built on the meta device, then
filled on the target device from a seeded normal, and each prompt gets a deterministic random embedding of the
text encoder's real shape (a hash of the prompt seeds it). The whole CLI path (train, resume, rollout, eval,
export) then runs at the release's size: the GPU check uses it, and users can size memory and time before
fetching any weights.

Random weights are the same for the same seed, release, size, dtype and device type (CUDA's and the CPU's
random streams differ).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from ..errors import ConfigError
from . import catalog

SPECS = Path(__file__).with_name("releases.json")
SEED = 0  # of the random weights (the run's seed drives sampling, not the weights)
TINY_TEXT_TOKENS = 8  # text tokens of a tiny model's prompts (SD3: 77 CLIP tokens before them)
TINY_FRAMES = 5  # video frames at the tiny size (2 latent frames)


@dataclass(frozen=True)
class Release:
    hub_id: str  # from the card of the adapter that serves it
    adapter: str  # that adapter's name
    transformer: str  # the denoiser's diffusers class
    config: dict[str, Any]  # its release config
    tiny: dict[str, Any]  # the same architecture at test sizes (empty: none)
    embeds: dict[str, list[int]]  # one prompt's cached embeddings: key -> shape without the batch
    resolution: int  # the references' resolution
    guidance: str
    text_encoders: dict[str, float]  # billions of parameters
    pipeline: str  # the diffusers pipeline class
    pipeline_config: dict[str, Any]  # its own registered settings (FLUX.2 [klein]: is_distilled)
    vae: dict[str, Any]  # {"class", "config" (the release's; {}: the class defaults are it), "tiny"}
    scheduler: dict[str, Any]  # {"class", "config"}
    tiny_resolution: int
    denoiser_b: float  # billions of denoiser parameters


@cache
def releases() -> dict[str, Release]:
    """Every release's spec, in releases.json's order (tests/test_models_catalog.py: the names the cards serve)."""
    models = json.loads(SPECS.read_text())["models"]
    served = catalog.known()
    return {k: Release(*served[k], **v) for k, v in models.items()}


def release(name: str) -> Release:
    """The release of a --model name, or one line listing the names random weights know."""
    found = releases().get(name)
    if found is None:
        raise ConfigError(
            f'policy.weights = "random" builds a released model from its config; {name!r} is none of '
            f"{', '.join(releases())}"
        )
    return found


def check_random(name: str, size: str) -> None:
    """policy.weights = "random" names a release (and one with a tiny variant at policy.size = "tiny")."""
    if release(name).adapter == "wan-i2v":
        raise ConfigError(
            f"{name} is image-to-video: it conditions on its image encoder's features of real first frames, which "
            "random weights do not provide; use a text-to-video release (wan2.1-t2v-1.3b, wan2.1-t2v-14b)"
        )
    if size == "tiny" and not release(name).tiny:
        raise ConfigError(f'{name} has no tiny variant (policy.size = "tiny"); use the full size')


# --- modules from configs -----------------------------------------------------------------------


def random_module(cls_name: str, config: dict[str, Any], device: Any, dtype: torch.dtype, seed: int) -> nn.Module:
    """A diffusers model of `config` with its parameters built on the meta device (buffers such as RoPE tables
    for real), then seeded random ones allocated on `device`: matrices N(0, 1/fan_in) so activations keep their
    scale through deep stacks, 1-D weights (norm scales) one, biases zero."""
    import diffusers
    from accelerate import init_empty_weights

    with init_empty_weights(include_buffers=False):
        net = getattr(diffusers, cls_name)(**config)
    gen = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for module in net.modules():
            for name, p in list(module.named_parameters(recurse=False)):
                w = torch.empty(p.shape, device=device, dtype=dtype)
                if p.dim() >= 2:
                    w.normal_(0.0, float(p[0].numel()) ** -0.5, generator=gen)
                else:
                    w.fill_(1.0 if name == "weight" else 0.0)
                setattr(module, name, nn.Parameter(w, requires_grad=p.requires_grad))
    return net.to(device).eval()


def empty_module(cls_name: str, config: dict[str, Any]) -> nn.Module:
    """A diffusers model of `config` with every parameter on the meta device: its shapes, no memory, no values."""
    import diffusers

    with torch.device("meta"):  # parameters and buffers (a position table's arithmetic costs nothing there)
        return getattr(diffusers, cls_name)(**config).eval()


def random_pipeline(
    spec: Release, tiny: bool, device: Any, dtype: torch.dtype, seed: int = SEED, meta: bool = False
) -> Any:
    """The release's diffusers pipeline: random denoiser and autoencoder, its scheduler, no text encoders (meta: the
    modules' parameters on the meta device, shapes without values: what a model costs, models/estimate.py)."""
    import inspect

    import diffusers

    def module(cls_name: str, config: dict[str, Any], offset: int) -> nn.Module:
        return empty_module(cls_name, config) if meta else random_module(cls_name, config, device, dtype, seed + offset)

    denoiser = module(spec.transformer, spec.tiny if tiny else spec.config, 0)
    vae = module(spec.vae["class"], spec.vae["tiny"] if tiny else spec.vae["config"], 1)
    scheduler = getattr(diffusers, spec.scheduler["class"])(**spec.scheduler["config"])
    cls = getattr(diffusers, spec.pipeline)
    params = inspect.signature(cls.__init__).parameters
    parts: dict[str, Any] = {p: None for p in params if p.startswith(("text_encoder", "tokenizer"))}
    parts.update({p: None for p in ("image_encoder", "feature_extractor", "safety_checker") if p in params})
    if "requires_safety_checker" in params:
        parts["requires_safety_checker"] = False
    denoiser_attr = "unet" if "unet" in params else "transformer"
    return cls(**parts, vae=vae, scheduler=scheduler, **{denoiser_attr: denoiser}, **spec.pipeline_config)


# --- prompts ---------------------------------------------------------------------------------


def text_shapes(spec: Release, tiny: bool, tokens: int | None) -> dict[str, tuple[int, ...]]:
    """One prompt's embedding shapes: the text encoder's real ones, at `tokens` text tokens when given (SD3: 77
    CLIP tokens before the T5 ones; SD1.5: always CLIP's 77); tiny: the tiny denoiser's widths."""
    clip = 77 if spec.adapter == "sd3" else 0
    out: dict[str, tuple[int, ...]] = {}
    for key, shape in spec.embeds.items():
        if key == "pooled":
            width = spec.tiny.get("pooled_projection_dim", 32) if tiny else shape[0]
            out[key] = (width,)
            continue
        c = spec.tiny
        width = c.get("joint_attention_dim", c.get("text_dim", c.get("cross_attention_dim", 32))) if tiny else shape[1]
        length = shape[0] if spec.adapter == "sd" else clip + (tokens or shape[0] - clip)
        out[key] = (length, width)
    return out


class RandomText:
    """A text encoder's stand-in: each prompt's embeddings drawn from a normal seeded by a hash of the prompt, so
    the same prompt always gets the same condition and different prompts different ones."""

    def __init__(self, shapes: dict[str, tuple[int, ...]], seed: int = SEED):
        self.shapes, self.seed = shapes, seed

    def __call__(self, prompts: list[str]) -> dict[str, Tensor]:
        out: dict[str, list[Tensor]] = {k: [] for k in self.shapes}
        for prompt in prompts:
            for key, shape in self.shapes.items():
                digest = hashlib.sha256(f"{self.seed}|{key}|{prompt}".encode()).digest()
                gen = torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") >> 1)
                out[key].append(torch.randn(1, *shape, generator=gen))
        return {k: torch.cat(v) for k, v in out.items()}  # {key: [n, ...]} fp32 on the CPU


def tiny_options(opts: Any, spec: Release) -> Any:
    """The [policy] settings a tiny build needs where the user left them unset: a small image, few text tokens,
    a short clip."""
    video = catalog.entries()[spec.adapter].card.video
    return dataclasses.replace(
        opts,
        resolution=opts.resolution or spec.tiny_resolution,
        max_sequence_length=opts.max_sequence_length or TINY_TEXT_TOKENS,
        frames=opts.frames or (TINY_FRAMES if video else None),
    )

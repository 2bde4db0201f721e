"""The released models at their real sizes with seeded random weights: `policy.weights = "random"`.

Each release an adapter's card names (models/catalog.py: its --model name and hub id) has a ReleaseSpec in its
adapter file's `RELEASES` (release name -> spec): its denoiser's config (transformer/config.json or
unet/config.json), its autoencoder's and scheduler's, its pipeline class, the shapes of its cached text embeddings
and a tiny variant of the same architectures (`policy.size = "tiny"`, what the adapter tests run on the CPU). From
these a real diffusers pipeline is assembled with no text encoder and nothing downloaded: the denoiser and the
autoencoder are built on the meta device, then filled on the target device from a seeded normal, and each prompt
gets a deterministic random embedding of the text encoder's real shape (a hash of the prompt seeds it). The whole
CLI path (train, resume, rollout, eval, export) then runs at the release's size: the GPU check uses it, and users
can size memory and time before fetching any weights.

Random weights are the same for the same seed, release, size, dtype and device type (CUDA's and the CPU's
random streams differ).
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
from dataclasses import dataclass, field, fields
from functools import cache
from typing import Any

import torch
from torch import Tensor, nn

from ..errors import ConfigError
from . import catalog

SEED = 0  # of the random weights (the run's seed drives sampling, not the weights)
TINY_TEXT_TOKENS = 8  # text tokens of a tiny model's prompts (SD3: 77 CLIP tokens before them)
TINY_FRAMES = 5  # video frames at the tiny size (2 latent frames)


@dataclass(frozen=True, kw_only=True)
class ReleaseSpec:
    """One release's configs, as its adapter file declares them (`RELEASES`)."""

    transformer: str  # the denoiser's diffusers class
    config: dict[str, Any]  # its release config
    embeds: dict[str, list[int]]  # one prompt's cached embeddings: key -> shape without the batch
    resolution: int  # the references' resolution
    guidance: str  # how the release is guided, in words (docs/models.md's memory table)
    text_encoders: dict[str, float]  # billions of parameters (their model cards')
    pipeline: str  # the diffusers pipeline class
    vae: dict[str, Any]  # {"class", "config" (the release's; {}: the class defaults are it), "tiny"}
    scheduler: dict[str, Any]  # {"class", "config"}
    denoiser_b: float  # billions of denoiser parameters
    tiny: dict[str, Any] = field(default_factory=dict)  # the same architecture at test sizes (empty: none)
    pipeline_config: dict[str, Any] = field(default_factory=dict)  # its own registered settings (is_distilled)
    tiny_resolution: int = 32
    # text tokens ahead of the ones max_sequence_length counts (SD3: CLIP's 77 before the T5 ones)
    text_prefix: int = 0
    text_fixed: bool = False  # the embeddings' length is the encoder's, whatever max_sequence_length (SD1.5)


@dataclass(frozen=True, kw_only=True)
class Release(ReleaseSpec):
    """A release's spec with what its adapter's card says of it."""

    hub_id: str  # from the card of the adapter that serves it
    adapter: str  # that adapter's name


@cache
def releases() -> dict[str, Release]:
    """Every release with a spec, in the cards' order: each adapter file's `RELEASES` for the releases its cards
    serve (imports the adapter modules)."""
    out: dict[str, Release] = {}
    for name, entry in catalog.entries().items():
        specs = getattr(importlib.import_module(f".{entry.module}", __package__), "RELEASES", {})
        for release, hub_id in entry.card.releases.items():
            if release in specs:
                spec = {f.name: getattr(specs[release], f.name) for f in fields(ReleaseSpec)}
                out[release] = Release(hub_id=hub_id, adapter=name, **spec)
    return out


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
    """policy.weights = "random" names a release whose adapter random weights can stand in for (its class's
    `no_random_weights` says why not), and one with a tiny variant at policy.size = "tiny"."""
    refused = catalog.adapter_class(release(name).adapter).no_random_weights
    if refused:
        raise ConfigError(f"{name} {refused}")
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
    """One prompt's embedding shapes: the text encoder's real ones, at `tokens` text tokens when given (after the
    spec's text_prefix ones; none with text_fixed); tiny: the tiny denoiser's widths."""
    pre = spec.text_prefix
    out: dict[str, tuple[int, ...]] = {}
    for key, shape in spec.embeds.items():
        if key == "pooled":
            width = spec.tiny.get("pooled_projection_dim", 32) if tiny else shape[0]
            out[key] = (width,)
            continue
        c = spec.tiny
        width = c.get("joint_attention_dim", c.get("text_dim", c.get("cross_attention_dim", 32))) if tiny else shape[1]
        length = shape[0] if spec.text_fixed else pre + (tokens or shape[0] - pre)
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

"""What a model costs, without its weights: its parameters (the denoiser's, the trained ones, the autoencoder's and
the text encoders'), the latent shape, network rows per latent row and the FLOPs of one denoiser row; what
`train --dry-run` plans with (training/dryrun.py).

* The embedded models (tiny-shapes, tiny-shapes-video, a weights file of either kind): from the file's safetensors
  header (the DiT config and every tensor's shape; no tensor is read), FLOPs by `dit_flops`, the count the training
  logs (DiTPolicy.flops_per_row).
* A released diffusers model (a release with configs in its adapter file, or its hub id; pretrained, or
  policy.weights = "random" at either size): its adapter is built over the release's pipeline with every parameter
  on the meta device (models/releases.py, the release's own configs: no memory, no file, no download), so the
  adapter's own code gives the latent shape, the LoRA or full trained parameters, CFG's rows and its FLOP formula.
  Text encoders count at their model cards' sizes (the release's spec) unless random weights stand in for them.
* Anything else (the pixel networks, a local diffusers folder, another hub id) is not estimated: None.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import TreegrpoError
from . import catalog, hub
from .base import PolicyConfig


@dataclass(frozen=True)
class Cost:
    denoiser: int  # denoiser parameters (without LoRA adapters)
    trained: int  # parameters the update trains (the LoRA adapters, or every denoiser weight)
    autoencoder: int  # VAE / autoencoder parameters (frozen)
    text_encoders: int  # text-encoder parameters loaded (0: none: random weights' stand-in, the DiT's own words)
    latent_shape: tuple[int, ...]
    evals_per_row: int  # network rows per latent row (2 under true CFG)
    row_flops: tuple[int, int] | None  # (forward, backward) denoiser FLOPs of one network row; None: no formula
    full: bool  # every denoiser weight trained in fp32 (else frozen weights in the compute dtype and LoRA)
    source: str  # where the numbers come from
    dtype: str | None = None  # the compute dtype when the model fixes it (the embedded DiT: fp32); None: policy.dtype


def cost(name: str, opts: PolicyConfig) -> Cost | None:
    """The cost of --model `name` under the [policy] options, or None where it cannot be known without loading it.
    Raises TreegrpoError for a file that is not a model's (an embedded model's header)."""
    from .registry import EMBEDDED

    if name in EMBEDDED or name.endswith(".safetensors"):
        return _dit_cost(EMBEDDED.get(name, (Path(name), ""))[0])
    release = name if name in hub.KNOWN else hub.release_of(name) if hub.HUB_ID.match(name) else None
    if release is None or (opts.weights != "random" and hub.local_dir(name) is not None):
        return None
    return _release_cost(release, opts)


def _dit_cost(path: Path) -> Cost:
    """The embedded DiT's cost from its file's header: config, tensor shapes and guidance (CFG doubles the rows)."""
    from .dit import dit_flops
    from .latent_file import dit_config_from

    try:
        with open(path, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(n)) if 0 < n < 100_000_000 else {}
        meta = header.get("__metadata__", {})
        cfg = dit_config_from(json.loads(meta["dit_config"]))
        guidance = float(json.loads(meta.get("treegrpo", "{}")).get("guidance", 1.0))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        raise TreegrpoError(
            f"{path}: not a treegrpo latent shapes model (no readable DiT config in its header)"
        ) from None
    sizes = {k: math.prod(v["shape"]) for k, v in header.items() if k != "__metadata__"}
    dit = sum(v for k, v in sizes.items() if k.startswith("dit."))
    return Cost(
        denoiser=dit,
        trained=dit,
        autoencoder=sum(v for k, v in sizes.items() if k.startswith("ae.")),
        text_encoders=0,
        latent_shape=(cfg.channels, cfg.image_size, cfg.image_size),
        evals_per_row=1 if guidance == 1.0 else 2,
        row_flops=dit_flops(cfg, cfg.max_words),
        full=True,
        source=f"{path.name}'s header",
        dtype="fp32",
    )


def _release_cost(name: str, opts: PolicyConfig) -> Cost:
    """A release's adapter over its pipeline on the meta device: shapes from its configs, no values anywhere."""
    import torch

    from . import releases
    from .diffusers_base import quiet_diffusers
    from .registry import adapter_class, require_extra

    require_extra(("diffusers", "transformers", "peft", "accelerate"), "models", f"estimating {name}")
    spec = releases.release(name)
    random = opts.weights == "random"
    tiny = random and opts.size == "tiny"
    opts = releases.tiny_options(opts, spec) if tiny else opts
    opts = dataclasses.replace(opts, compile="off", attention="default")  # nothing runs: no kernels to pick
    quiet_diffusers()
    pipe = releases.random_pipeline(spec, tiny, "meta", torch.float32, meta=True)
    with torch.device("meta"):  # the LoRA adapters too
        policy = adapter_class(spec.adapter)(pipe, opts, name=name, device="meta")
    trained = sum(p.numel() for p in policy.trainable_parameters())
    full = opts.finetune == "full"
    every = sum(p.numel() for p in policy.denoiser.parameters())
    module = catalog.entries()[spec.adapter].module  # the adapter file that holds the release's configs
    return Cost(
        denoiser=every if full else every - trained,
        trained=trained,
        autoencoder=sum(p.numel() for p in pipe.vae.parameters()),
        text_encoders=0 if random else round(sum(spec.text_encoders.values()) * 1e9),
        latent_shape=tuple(policy.latent_shape),
        evals_per_row=int(policy.evals_per_row),
        row_flops=policy.flops_per_row() if policy.flop_formula() is not None else None,
        full=full,
        source=f"{name}'s release configs (models/{module}.py{', tiny size' if tiny else ''})",
    )


def describe(c: Cost) -> dict[str, Any]:
    """The cost as JSON-able numbers."""
    return dataclasses.asdict(c)

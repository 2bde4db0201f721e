"""What the model adapters share: the `[policy]` config section and the pixel-network plumbing.

The Policy protocol itself (what the engine needs from a text-to-image model) lives with the engine
that calls it, in engine/protocols.py; it is re-exported here for the adapters.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ..engine.protocols import Conditions, Policy, select  # noqa: F401  (re-exported for the adapters)
from ..errors import ConfigError, shown
from .speed import ATTENTION_DEFAULT, attention_backends

FINETUNES = ("lora", "full")
CFG_UNCOND = ("grad", "detach")
DTYPES = ("auto", "bf16", "fp32")
DTYPE_NAMES = {"bfloat16": "bf16", "float32": "fp32"}  # torch's spellings, accepted for policy.dtype
WEIGHTS = ("pretrained", "random")
SIZES = ("full", "tiny")
COMPILES = ("off", "blocks")


@dataclass(frozen=True)
class PolicyConfig:
    """How a diffusers model is loaded and trained: the `[policy]` config section.

    The built-in pixel and tiny-shapes models ignore it. None means "the adapter's default"
    (docs/models.md lists them)."""

    revision: str | None = None  # hub revision (branch, tag or commit) of --model
    download: bool = False  # allow fetching --model from the hub when it is not in the local cache
    finetune: str = "lora"  # "lora": a peft adapter on the denoiser | "full": every denoiser weight
    lora_rank: int | None = None  # None: the adapter's (docs/models.md lists them)
    lora_alpha: float | None = None  # None: the adapter's
    lora_targets: tuple[str, ...] = ()  # module-name suffixes (peft target_modules); empty: the adapter's
    dtype: str = "auto"  # weights: "auto" = bf16 on CUDA, fp32 elsewhere; sampler math is always fp32
    gradient_checkpointing: bool = False  # recompute the denoiser's activations in the backward (less memory)
    guidance: float | None = None  # distilled guidance (FLUX) or true CFG scale; None: the adapter's
    cfg_uncond: str = "grad"  # true CFG in training: "grad" backpropagates through the unconditional half
    # (the guided policy's exact gradient) | "detach": Flow-GRPO's released code
    resolution: int | None = None  # square image side in pixels; None: the adapter's
    max_sequence_length: int | None = None  # text tokens; None: the adapter's
    frames: int | None = None  # video models: frames of a clip; None: the adapter's (Wan 33)
    images: str = ""  # image-to-video: a .jsonl of {"prompt", "image"} rows, each prompt's first frame
    ddim_eta: float = 1.0  # SD only: eta of the stochastic DDIM steps (DDPO: 1.0)
    prompt_cache: str = ""  # folder of prompt embeddings on disk ("": in memory only)
    free_text_encoders: bool = False  # train: embed every train and eval prompt first, then free the encoders
    # CUDA: let SDPA pick cuDNN's attention kernels. Off by default: with torch 2.11+cu130 on an H100, cuDNN's
    # attention backward failed on FLUX.1-dev at 720 px (docs/models.md); flash attention ran the same step
    cudnn_attention: bool = False
    # "pretrained": the release's files (local folder or hub cache) | "random": a released model built from its
    # configs with seeded random weights and random prompt embeddings, nothing downloaded (models/releases.py)
    weights: str = "pretrained"
    size: str = "full"  # with weights = "random": "full" (the release's size) | "tiny" (its architecture, tiny)
    # the denoiser's attention kernel: "default" (the model's own, torch SDPA) or a diffusers attention backend,
    # such as "_native_flash", "_native_cudnn", "flash" (flash-attn), "_flash_3" (FlashAttention-3) (models/speed.py)
    attention: str = "default"
    compile: str = "off"  # "blocks": torch.compile each repeated transformer block (compiles on the first forward)
    # with gradient_checkpointing: the share of the repeated blocks recomputed in the backward (1: all; 0.5: every
    # second block keeps its activations, more memory for less recomputation)
    checkpoint_blocks: float = 1.0

    def validate(self) -> None:
        if self.finetune not in FINETUNES:
            raise ConfigError(f"policy.finetune must be one of {', '.join(FINETUNES)}; got {shown(self.finetune)}")
        if self.cfg_uncond not in CFG_UNCOND:
            raise ConfigError(f"policy.cfg_uncond must be one of {', '.join(CFG_UNCOND)}; got {shown(self.cfg_uncond)}")
        if self.dtype not in DTYPES:
            raise ConfigError(f"policy.dtype must be one of {', '.join(DTYPES)}; got {shown(self.dtype)}")
        if self.weights not in WEIGHTS:
            raise ConfigError(f"policy.weights must be one of {', '.join(WEIGHTS)}; got {shown(self.weights)}")
        if self.size not in SIZES:
            raise ConfigError(f"policy.size must be one of {', '.join(SIZES)}; got {shown(self.size)}")
        if self.size == "tiny" and self.weights != "random":
            raise ConfigError(
                'policy.size = "tiny" builds a small model from config: it needs policy.weights = "random"'
            )
        if self.compile not in COMPILES:
            raise ConfigError(f"policy.compile must be one of {', '.join(COMPILES)}; got {shown(self.compile)}")
        if not 0.0 <= self.checkpoint_blocks <= 1.0:
            raise ConfigError(
                f"policy.checkpoint_blocks is a share of the blocks, 0 to 1; got {self.checkpoint_blocks}"
            )
        if self.attention != ATTENTION_DEFAULT and self.attention not in attention_backends():
            raise ConfigError(
                f"policy.attention must be one of {', '.join(attention_backends())}; got {shown(self.attention)}"
            )
        for name in ("lora_rank", "lora_alpha", "resolution", "max_sequence_length", "frames"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ConfigError(f"policy.{name} must be > 0, got {value}")
        if (self.guidance is not None and self.guidance < 0) or self.ddim_eta < 0:
            raise ConfigError("policy.guidance and policy.ddim_eta must be >= 0")

    def warnings(self) -> list[str]:
        """Legal values that are almost surely a mistake (on a model that reads [policy])."""
        if self.checkpoint_blocks != 1.0 and not self.gradient_checkpointing:
            return [
                f"warning: policy.checkpoint_blocks = {self.checkpoint_blocks:g} takes effect only with "
                "policy.gradient_checkpointing = true"
            ]
        if self.checkpoint_blocks == 0 and self.gradient_checkpointing:
            return [
                "warning: policy.checkpoint_blocks = 0 recomputes no block: the same as "
                "policy.gradient_checkpointing = false"
            ]
        return []


class PixelNetPolicy:
    """Shared plumbing of the adapters whose latents are pixels in [-1, 1] and whose whole
    network (self.net, taking x, sigma and the condition tensors) is trained."""

    net: nn.Module
    _flops_row: tuple[int, int] | None = None  # flops_per_row()'s measurement

    @property
    def evals_per_row(self) -> int:
        return 1  # one network evaluation per latent row (no true CFG)

    def velocity(self, x: Tensor, sigma: Tensor, cond: Conditions) -> Tensor:
        return self.net(x, sigma, cond["ids"], cond["mask"])

    def decode(self, latents: Tensor) -> Tensor:
        return (latents.float().clamp(-1, 1) + 1) / 2

    def trainable_parameters(self) -> list[nn.Parameter]:
        return list(self.net.parameters())

    def trainable_state(self) -> dict[str, Tensor]:
        return {k: v.detach() for k, v in self.net.named_parameters()}

    def load_trainable_state(self, state: dict[str, Tensor]) -> None:
        self.net.load_state_dict(state, strict=True)

    def _device(self) -> torch.device:
        return next(self.net.parameters()).device

    def flops_per_row(self) -> tuple[int, int] | None:
        """(forward, backward) denoiser FLOPs of one network row, MEASURED once with FlopCounterMode on a
        probe input (models/flops.py), not derived from the shapes; cached on the instance."""
        if self._flops_row is None:
            from .flops import measure_policy_flops

            self._flops_row = measure_policy_flops(self, "a probe prompt")
        return self._flops_row

"""Shared plumbing of the diffusers adapters (flux.py, flux2.py, sd3.py, sd.py, qwenimage.py, wan.py).

Loading a pipeline from a local folder, weights in bf16 (or fp32) with fp32 sampler math, LoRA through
peft or full fine-tuning of the denoiser, gradient checkpointing, the prompt-embedding cache (memory,
optionally disk) with freeable text encoders, the KL reference (the adapter disabled, no copy) and
export in diffusers' own format, and the one guided forward (`model_output`: classifier-free guidance's batch
doubling and combine). An adapter subclass declares its card (models/catalog.py) and adds its conditioning,
latent layout, one batched denoiser call (`denoise`) and VAE scaling; its file also holds its releases' configs
(`RELEASES`, models/releases.py) and the tests' tiny pipelines (`TINY_PIPELINES`, models/tiny.py).
"""

from __future__ import annotations

import copy
import gc
import hashlib
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from ..compat import ensure_torchvision
from ..errors import ConfigError, TreegrpoError
from ..store.shards import sorted_metadata
from .base import Conditions, PolicyConfig
from .catalog import AdapterCard
from .flops import Formula
from .hub import TEXT_PARTS
from .lora import LoraDefaults, adapters_disabled, config_targets, lora_config
from .speed import checkpoint_share, compile_blocks, set_attention

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
ENCODE_BATCH = 16  # prompts per text-encoder call
DECODE_BATCH = 4  # latents per VAE decode


def torch_dtype(name: str, device: str | torch.device) -> torch.dtype:
    """'auto' is bf16 on CUDA and fp32 elsewhere (bf16 matmuls are slow on most CPUs)."""
    if name == "auto":
        return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32
    return DTYPES[name]


def quiet_diffusers() -> None:
    """No progress bars or info logs from diffusers/transformers: library code never prints."""
    ensure_torchvision()
    import diffusers
    import transformers

    diffusers.utils.logging.set_verbosity_error()
    diffusers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()


def load_pipeline(
    folder: Path, pipeline_cls: Any, dtype: torch.dtype, text_encoders: bool = True, options: dict | None = None
) -> Any:
    """pipeline_cls.from_pretrained(folder, **options) with local files only (options: the adapter's
    `load_options`); without text encoders for export. (pipeline_cls: a diffusers pipeline class; diffusers' own
    hints name placeholder classes for them.)"""
    quiet_diffusers()
    skip: dict[str, Any] = {p: None for p in TEXT_PARTS if not text_encoders} | (options or {})
    import warnings

    try:
        with warnings.catch_warnings():  # diffusers' and torch's warnings on a refused file: the error says it
            warnings.simplefilter("ignore")
            return pipeline_cls.from_pretrained(folder, dtype=dtype, local_files_only=True, **skip)
    except (OSError, ValueError, KeyError, RuntimeError, TypeError, ImportError) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise TreegrpoError(f"{folder}: could not load the {pipeline_cls.__name__} ({first})") from None


def cuda_backends(opts: PolicyConfig) -> None:
    """Process-wide CUDA settings of a diffusers policy: fp32 matmuls that remain (sampler math) on TF32, and
    SDPA without cuDNN's attention unless policy.cudnn_attention (its backward failed on an H100, docs/models.md)."""
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    torch.backends.cuda.enable_cudnn_sdp(opts.cudnn_attention)


class DiffusersPolicy(ABC):
    """A Policy over a diffusers pipeline. Subclasses declare their `card` (what they serve and their config
    defaults), set the class attributes and implement _encode_text, denoise, _latent_shape and _vae_in."""

    card: AdapterCard  # each adapter class its own, in its class body (models/catalog.py reads it from the source)
    denoiser_attr = "transformer"
    text_encoder_attrs: tuple[str, ...] = ("text_encoder", "text_encoder_2")
    lora_defaults = LoraDefaults(32, 64.0, ("to_k", "to_q", "to_v", "to_out.0"))
    default_guidance = 1.0
    default_resolution = 512
    uses_negative = False  # true classifier-free guidance: the negative prompt is embedded too
    negative_prompt = ""  # the unconditional half's prompt
    default_text_tokens = 512  # max_sequence_length when policy.max_sequence_length is not set
    _flops_row: tuple[int, int] | None = None  # flops_per_row()'s measurement
    weights = "pretrained"  # "random (full size)" / "random (tiny size)": built by models/releases.py
    # prompts -> {key: [n, ...]} embeddings in place of the text encoders (random weights: releases.RandomText)
    text_stand_in: Any = None
    load_options: dict[str, Any] = {}  # from_pretrained's arguments beyond the dtype (SD1.5: no safety checker)
    no_random_weights = ""  # why policy.weights = "random" cannot build its releases ("" : it can)

    def __init__(self, pipe: Any, opts: PolicyConfig, name: str, source: str = "", device: str | torch.device = "cpu"):
        opts.validate()
        self.pipe, self.opts, self.name, self.source = pipe, opts, name, source
        self.device = torch.device(device)
        self.dtype = torch_dtype(opts.dtype, self.device)
        self.guidance = float(opts.guidance if opts.guidance is not None else self.default_guidance)
        self.resolution = int(opts.resolution or self.default_resolution)
        # the pipeline's diffusers model (FLUX/SD3 transformer, SD1.5 UNet: an nn.Module with peft's adapter
        # mixin and a config of the adapter's own fields), as dynamic as the pipeline itself
        self.denoiser: Any = getattr(pipe, self.denoiser_attr)
        self._cache: dict[str, dict[str, Tensor]] = {}  # prompt -> {key: [1, ...] on the CPU}
        self._encoders_freed = all(getattr(pipe, a, None) is None for a in self.text_encoder_attrs)
        self._place()
        self._setup_training()
        set_attention(self.denoiser, opts.attention)
        if opts.compile == "blocks":
            compile_blocks(self.denoiser)
        self.latent_shape: tuple[int, ...] = self._latent_shape()

    @property
    def adapter(self) -> str:
        return self.card.name

    # -- set-up ------------------------------------------------------------------------------
    def _place(self) -> None:
        """Every module in the compute dtype, except a fully fine-tuned denoiser: its weights are the fp32
        master copy (an lr-1e-5 update to a bf16 weight rounds away) and its forward runs under autocast."""
        if self.device.type == "cuda":
            cuda_backends(self.opts)
        for attr in ("vae", *self.text_encoder_attrs, self.denoiser_attr):
            module = getattr(self.pipe, attr, None)
            if isinstance(module, nn.Module):
                master = attr == self.denoiser_attr and self.opts.finetune == "full"
                module.to(self.device, torch.float32 if master else self.dtype).requires_grad_(False).eval()

    def autocast(self):
        """bf16 autocast for the denoiser's forward when the compute dtype is bf16 (LoRA adapters and full
        fine-tuning keep fp32 weights; their matmuls run in bf16); a no-op in fp32."""
        return torch.autocast(self.device.type, dtype=self.dtype, enabled=self.dtype != torch.float32)

    def _lora_config(self) -> Any:
        return lora_config(self.lora_defaults, self.opts)

    def _setup_training(self) -> None:
        """LoRA: a peft adapter (B = 0, so the policy starts as the model), trained in fp32 over the frozen
        base in the compute dtype. Full: every denoiser weight, fp32 master weights (see _place)."""
        net = self.denoiser
        if self.opts.finetune == "full":
            net.requires_grad_(True)
        else:
            try:
                net.add_adapter(self._lora_config())
            except ValueError as e:
                raise ConfigError(f"policy.lora_targets: {str(e).splitlines()[0]}") from None
            for p in net.parameters():
                if p.requires_grad:
                    p.data = p.data.float()
        if self.opts.gradient_checkpointing and self.opts.checkpoint_blocks >= 1.0:
            net.enable_gradient_checkpointing()
        elif self.opts.gradient_checkpointing:
            checkpoint_share(net, self.opts.checkpoint_blocks)

    # -- the Policy protocol -----------------------------------------------------------------
    def kernel(self, cfg: Any) -> Any:
        """FlowSDE on the configured grid; sampler.grid = "model" takes the pipeline scheduler's own grid."""
        from ..engine.sde import FlowSDE

        return FlowSDE(cfg, self.model_sigmas(cfg.steps) if cfg.grid == "model" else None)

    def model_sigmas(self, steps: int) -> Tensor:
        """[T+1] the sigmas the pipeline samples with at this resolution: its scheduler's set_timesteps on
        linspace(1, 1/T, T), with the dynamic shift mu of the image's token count where the scheduler has one."""
        import numpy as np
        from diffusers import FlowMatchEulerDiscreteScheduler

        sched = FlowMatchEulerDiscreteScheduler.from_config(self.pipe.scheduler.config)
        if sched.config.use_dynamic_shifting:
            sched.set_timesteps(sigmas=np.linspace(1.0, 1 / steps, steps), mu=self.shift_mu(steps))
        else:
            sched.set_timesteps(steps)
        return sched.sigmas.double().cpu()  # float32 values, as the pipeline steps with them

    def shift_mu(self, steps: int) -> float:
        """The dynamic shift of FluxPipeline and QwenImagePipeline: linear in the packed image's token count
        between the scheduler's (base_image_seq_len, base_shift) and (max_image_seq_len, max_shift)."""
        c = self.pipe.scheduler.config
        n0, n1 = c.get("base_image_seq_len", 256), c.get("max_image_seq_len", 4096)
        m0, m1 = c.get("base_shift", 0.5), c.get("max_shift", 1.15)
        return (self.image_tokens() - n0) * (m1 - m0) / (n1 - n0) + m0

    def image_tokens(self) -> int:
        """Tokens of one latent in the transformer (2x2 patches by default)."""
        return self.latent_shape[-2] * self.latent_shape[-1] // 4

    @property
    def true_cfg(self) -> bool:
        """Whether a row is classifier-free guided: a negative prompt and a guidance scale other than 1."""
        return self.uses_negative and self.guidance != 1.0

    @property
    def evals_per_row(self) -> int:
        return 2 if self.true_cfg else 1

    def velocity(self, x: Tensor, sigma: Tensor, cond: Conditions) -> Tensor:
        with self.autocast():
            return self.model_output(self.denoiser, x, sigma, cond).float()

    def model_output(self, net: Any, x: Tensor, sigma: Tensor, cond: Conditions) -> Tensor:
        """The prediction (velocity or epsilon) [B, ...] fp32 of the denoiser `net` (self.denoiser or a frozen copy
        of it) for sampler latents x [B, ...] at sigma [B]: one denoise of the B rows, or under true CFG one
        batched denoise of 2B rows (the conditional ones, then the same latents and sigmas with the negative
        prompt's conditions) combined by guide(conditional, unconditional)."""
        if not self.true_cfg:
            return self.denoise(net, x, sigma, cond)
        both = self.with_negative(cond, self.negative(x.shape[0]))
        out = self.denoise(net, torch.cat([x, x]), torch.cat([sigma, sigma]), both)  # [2B, ...]
        return self.guide(*out.chunk(2))

    @abstractmethod
    def denoise(self, net: Any, x: Tensor, sigma: Tensor, cond: Conditions) -> Tensor:
        """One batched call of the denoiser `net`: x [R, ...] fp32, sigma [R], cond {key: [R, ...]} -> the
        unguided prediction [R, ...] fp32 of each row."""

    def with_negative(self, cond: Conditions, neg: Conditions) -> Conditions:
        """[2B, ...] conditions of CFG's batched forward: each of cond's tensors [B, ...] followed by the negative
        prompt's; a condition the negative prompt has none of (an image-to-video first frame) is repeated."""
        return {k: torch.cat([v, neg.get(k, v)]) for k, v in cond.items()}

    def flop_formula(self) -> Formula | None:
        """The denoiser's FLOP formula (models/flops.py `formula`), or None: flops_per_row() measures instead."""
        return None

    def flop_tokens(self) -> tuple[int, int]:
        """(image tokens, text tokens) of one row, as the formula takes them: the latent's tokens and
        max_sequence_length text tokens (what the pipelines pad to); adapters with other text override it."""
        return self.image_tokens(), self.max_sequence_length()

    def max_sequence_length(self) -> int:
        """Text tokens of a prompt: policy.max_sequence_length, else the adapter's default_text_tokens."""
        return self.opts.max_sequence_length or self.default_text_tokens

    def flops_per_row(self) -> tuple[int, int] | None:
        """(forward, backward) denoiser FLOPs of one network row: the adapter's formula on its config, shapes and
        LoRA or full fine-tuning as configured; without one, MEASURED once with FlopCounterMode on a probe latent
        and a cached prompt (models/flops.py) and cached."""
        count = self.flop_formula()
        if count is not None:
            lora = self._lora_config() if self.opts.finetune == "lora" else None
            rank, targets = (lora.r, config_targets(lora)) if lora else (None, None)
            recompute = self.opts.checkpoint_blocks if self.opts.gradient_checkpointing else 0.0
            return count(self.denoiser.config, *self.flop_tokens(), rank, targets, recompute)
        if self._flops_row is None:
            from .flops import measure_policy_flops

            self._flops_row = measure_policy_flops(self, next(iter(self._cache), ""))
        return self._flops_row

    def trainable_parameters(self) -> list[nn.Parameter]:
        return [p for p in self.denoiser.parameters() if p.requires_grad]

    def trainable_state(self) -> dict[str, Tensor]:
        """LoRA runs: the adapter weights only; full runs: every denoiser weight."""
        return {k: p.detach() for k, p in self.denoiser.named_parameters() if p.requires_grad}

    def load_trainable_state(self, state: dict[str, Tensor]) -> None:
        params = {k: p for k, p in self.denoiser.named_parameters() if p.requires_grad}
        if set(state) != set(params):
            extra, missing = sorted(set(state) - set(params)), sorted(set(params) - set(state))
            raise TreegrpoError(
                f"checkpoint does not fit {self.name} ({self.opts.finetune}): "
                f"{len(missing)} weights missing (e.g. {missing[:1]}), {len(extra)} unexpected "
                f"(e.g. {extra[:1]}); was it trained with other policy.* settings?"
            )
        with torch.no_grad():
            for k, p in params.items():
                if state[k].shape != p.shape:
                    raise TreegrpoError(
                        f"checkpoint tensor {k} has shape {tuple(state[k].shape)}, the model "
                        f"{tuple(p.shape)}; was it trained with another policy.lora_rank?"
                    )
                p.copy_(state[k].to(p.device, p.dtype))

    def reference(self) -> ReferencePolicy:
        """The KL reference: LoRA runs disable the adapter (no copy); full runs keep a frozen copy."""
        if self.opts.finetune == "lora":
            return ReferencePolicy(self, None)
        frozen = copy.deepcopy(self.denoiser).requires_grad_(False).to(self.dtype)  # inference only: compute dtype
        return ReferencePolicy(self, frozen)

    def describe(self) -> dict[str, Any]:
        lora = None
        if self.opts.finetune == "lora":
            c = self._lora_config()
            t = c.target_modules
            lora = {"rank": c.r, "alpha": c.lora_alpha, "targets": t if isinstance(t, str) else sorted(t)}
        return {
            "name": self.name,
            "adapter": self.adapter,
            "source": self.source,
            "revision": self.opts.revision,
            "pipeline": type(self.pipe).__name__,
            "weights": self.weights,
            "finetune": self.opts.finetune,
            "lora": lora,
            "dtype": str(self.dtype).removeprefix("torch."),
            "guidance": self.guidance,
            "resolution": self.resolution,
            "latent_shape": list(self.latent_shape),
        }

    # -- prompts -----------------------------------------------------------------------------
    def encode(self, prompts: list[str]) -> Conditions:
        """Cached embeddings of the prompts, each tensor [P, ...] on the device."""
        if not prompts:
            raise TreegrpoError("no prompts to encode")
        self._fill_cache(list(prompts) + ([self.negative_prompt] if self.uses_negative else []))
        keys = self._cache[prompts[0]].keys()
        return {k: torch.cat([self._cache[p][k] for p in prompts]).to(self.device) for k in keys}

    def guide(self, cond_out: Tensor, uncond_out: Tensor) -> Tensor:
        """True classifier-free guidance u + w (c - u); policy.cfg_uncond = "detach" stops the gradient
        through the unconditional half (Flow-GRPO's released code)."""
        if self.opts.cfg_uncond == "detach":
            uncond_out = uncond_out.detach()
        return uncond_out + self.guidance * (cond_out - uncond_out)

    def negative(self, rows: int) -> Conditions:
        """The negative prompt's embeddings repeated for `rows` rows (the unconditional half of CFG)."""
        return {k: v.to(self.device).expand(rows, *v.shape[1:]) for k, v in self._cache[self.negative_prompt].items()}

    def cache_prompts(self, prompts: list[str]) -> None:
        """Embed and cache every prompt; then free the text encoders when policy.free_text_encoders."""
        self._fill_cache(list(prompts) + ([self.negative_prompt] if self.uses_negative else []))
        if self.opts.free_text_encoders:
            self.free_text_encoders()

    def put_cached(self, prompt: str, tensors: dict[str, Tensor]) -> None:
        """Install embeddings [1, ...] for a prompt (benchmarks use random ones of the right shapes)."""
        self._cache[prompt] = {k: v.detach().cpu() for k, v in tensors.items()}

    def free_text_encoders(self) -> None:
        for attr in self.text_encoder_attrs:
            if getattr(self.pipe, attr, None) is not None:
                setattr(self.pipe, attr, None)
        self._encoders_freed = True
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def _fill_cache(self, prompts: list[str]) -> None:
        todo = [p for p in dict.fromkeys(prompts) if p not in self._cache]
        todo = [p for p in todo if not self._from_disk(p)]
        if todo and self._encoders_freed and self.text_stand_in is None:
            raise TreegrpoError(
                f"prompt {todo[0]!r} has no cached embedding and the text encoders were freed; "
                "cache every prompt first (policy.free_text_encoders embeds train and eval prompts)"
            )
        for a in range(0, len(todo), ENCODE_BATCH):
            chunk = todo[a : a + ENCODE_BATCH]
            with torch.no_grad():
                out = (self.text_stand_in or self._encode_text)(chunk)  # {key: [n, ...]}
            for j, p in enumerate(chunk):
                self.put_cached(p, {k: v[j : j + 1] for k, v in out.items()})
                self._to_disk(p)

    @abstractmethod
    def _encode_text(self, prompts: list[str]) -> dict[str, Tensor]:
        """Run the text encoders on a batch of prompts: {name: [B, ...]} embeddings."""

    def _disk_path(self, prompt: str) -> Path | None:
        if not self.opts.prompt_cache:
            return None
        key = f"{self.adapter}|{self.source}|{self.opts.revision}|{self.opts.max_sequence_length}|{prompt}"
        return Path(self.opts.prompt_cache) / f"{hashlib.sha256(key.encode()).hexdigest()[:40]}.safetensors"

    def _from_disk(self, prompt: str) -> bool:
        path = self._disk_path(prompt)
        if path is None or not path.is_file():
            return False
        from safetensors.torch import load_file

        self._cache[prompt] = load_file(path)
        return True

    def _to_disk(self, prompt: str) -> None:
        path = self._disk_path(prompt)
        if path is None:
            return
        from safetensors.torch import save

        from ..store.shards import atomic_write

        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, save({k: v.contiguous() for k, v in self._cache[prompt].items()}))

    # -- images ------------------------------------------------------------------------------
    @abstractmethod
    def _latent_shape(self) -> tuple[int, ...]:
        """The (C, H, W) shape of one sampler latent at the configured resolution."""

    @abstractmethod
    def _vae_in(self, latents: Tensor) -> Tensor:
        """Sampler latents -> what the VAE decodes (undo its scaling and shift)."""

    def _vae_decode(self, z: Tensor) -> Tensor:
        """[B, C, h, w] VAE latents -> [B, 3, H, W] in [-1, 1]."""
        return self.pipe.vae.decode(z, return_dict=False)[0]

    def _check_resolution(self, multiple: int) -> int:
        if self.resolution % multiple:
            raise ConfigError(f"policy.resolution {self.resolution} must be a multiple of {multiple} for {self.name}")
        return self.resolution

    def decode(self, latents: Tensor) -> Tensor:
        """latents [B, C, h, w] -> images [B, 3, H, W] float in [0, 1] (VAE in chunks)."""
        vae = self.pipe.vae
        out = []
        with torch.no_grad():
            for chunk in latents.split(DECODE_BATCH):
                z = self._vae_in(chunk.to(self.device).float()).to(vae.dtype)
                out.append(self._vae_decode(z).float())
        return ((torch.cat(out) + 1) / 2).clamp(0, 1)

    # -- export ------------------------------------------------------------------------------
    def export(self, out: Path, state: dict[str, Tensor]) -> list[str]:
        """Write `state` in diffusers' format: pytorch_lora_weights.safetensors for LoRA runs (with the
        adapter config as metadata, for pipe.load_lora_weights), a full denoiser folder otherwise."""
        self.load_trainable_state(state)
        out.mkdir(parents=True, exist_ok=True)
        if self.opts.finetune == "full":
            self.denoiser.save_pretrained(out / self.denoiser_attr)
            return [f"{self.denoiser_attr}/"]
        from peft.utils import get_peft_model_state_dict

        layers = self._lora_layers(get_peft_model_state_dict(self.denoiser))
        meta = self.denoiser.peft_config["default"].to_dict()  # sets sorted: the same export gives the same bytes
        meta = {k: sorted(v) if isinstance(v, set) else v for k, v in meta.items()}
        type(self.pipe).save_lora_weights(
            out, **{f"{self.denoiser_attr}_lora_layers": layers, f"{self.denoiser_attr}_lora_adapter_metadata": meta}
        )
        sorted_metadata(out / "pytorch_lora_weights.safetensors")  # the same export, the same bytes
        return ["pytorch_lora_weights.safetensors"]

    def _lora_layers(self, peft_state: dict[str, Tensor]) -> dict[str, Tensor]:
        return peft_state


class ReferencePolicy:
    """The KL reference of a DiffusersPolicy: the same denoiser with the LoRA adapter disabled, or a
    frozen copy of it for full fine-tuning. Shares the prompt cache and the VAE."""

    def __init__(self, policy: DiffusersPolicy, frozen: nn.Module | None):
        self.policy, self.frozen = policy, frozen
        self.name = f"{policy.name}-reference"
        self.latent_shape = policy.latent_shape
        self.evals_per_row = policy.evals_per_row

    def velocity(self, x: Tensor, sigma: Tensor, cond: Conditions) -> Tensor:
        if self.frozen is not None:
            with self.policy.autocast():
                return self.policy.model_output(self.frozen, x, sigma, cond).float()
        with adapters_disabled(self.policy.denoiser), self.policy.autocast():
            return self.policy.model_output(self.policy.denoiser, x, sigma, cond).float()

    def encode(self, prompts: list[str]) -> Conditions:
        return self.policy.encode(prompts)

    def decode(self, latents: Tensor) -> Tensor:
        return self.policy.decode(latents)

    def trainable_parameters(self) -> list[nn.Parameter]:
        return []

    def trainable_state(self) -> dict[str, Tensor]:
        return {}

    def load_trainable_state(self, state: dict[str, Tensor]) -> None:
        raise TreegrpoError("the reference policy is frozen")

    def describe(self) -> dict[str, Any]:
        return {**self.policy.describe(), "name": self.name, "reference": True}

    def reference(self) -> ReferencePolicy:
        return self

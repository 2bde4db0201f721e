"""Qwen-Image through diffusers' QwenImagePipeline.

* Denoiser: QwenImageTransformer2DModel (MMDiT, 60 blocks, 20B parameters) predicting the flow velocity,
  called with timestep = sigma and the packed latent's (1, h/2, w/2) shape for its 3-axis RoPE.
* Latents: the policy's latent is the unpacked, normalised VAE latent [16, H/8, W/8]; velocity() packs 2x2
  patches into tokens [(H/16)(W/16), 64] as FLUX does (models/flux.py pack/unpack).
* True classifier-free guidance (true_cfg_scale 4.0, the pipeline's and the model card's): the prompt's and
  the negative prompt's rows in one batched forward, then QwenImagePipeline's renormalisation: the guided
  velocity is rescaled per token to the conditional velocity's norm, v = c' ||v_c|| / ||c'|| with
  c' = v_u + w (v_c - v_u). The negative prompt is " " (the model card's). 2 model evaluations per row.
* Text: Qwen2.5-VL-7B's last hidden states [L, 3584] under the pipeline's system template (its first 34
  tokens dropped), L the prompt's own length: rows of a batch are zero-padded to the longest and masked.
* Time grid: the scheduler's own (sampler.grid = "model"): dynamic shift mu linear in the token count, the
  exponential time shift and shift_terminal, as the pipeline samples.
* Decode: latent * latents_std + latents_mean (the VAE config's per-channel statistics), then the video
  VAE on a single frame.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ..errors import TreegrpoError
from .base import Conditions
from .diffusers_base import DiffusersPolicy, LoraDefaults
from .flops import Formula
from .flux import pack, unpack

# VeRL's Qwen-Image Flow-GRPO recipe (examples/flowgrpo_trainer): r 64, alpha 128, the joint attention's
# projections and both streams' feed-forward layers
QWEN_LORA = LoraDefaults(
    64,
    128.0,
    (
        "attn.to_q",
        "attn.to_k",
        "attn.to_v",
        "attn.to_out.0",
        "attn.add_q_proj",
        "attn.add_k_proj",
        "attn.add_v_proj",
        "attn.to_add_out",
        "img_mlp.net.0.proj",
        "img_mlp.net.2",
        "txt_mlp.net.0.proj",
        "txt_mlp.net.2",
    ),
)


def pad_rows(embeds: list[Tensor]) -> tuple[Tensor, Tensor]:
    """[1, L_i, D] each -> ([n, L, D] zero-padded to the longest, [n, L] mask of the real tokens)."""
    L = max(e.shape[1] for e in embeds)
    out = torch.cat([torch.nn.functional.pad(e, (0, 0, 0, L - e.shape[1])) for e in embeds])
    mask = torch.stack([torch.arange(L) < e.shape[1] for e in embeds]).long()
    return out, mask


class QwenImagePolicy(DiffusersPolicy):
    adapter = "qwenimage"
    uses_negative = True  # true CFG against the model card's negative prompt
    negative_prompt = " "
    default_guidance = 4.0
    text_encoder_attrs = ("text_encoder",)
    lora_defaults = QWEN_LORA
    default_resolution = 1024

    def _latent_shape(self) -> tuple[int, ...]:
        sf = int(self.pipe.vae_scale_factor)
        side = self._check_resolution(sf * 2) // sf
        return (self.denoiser.config.in_channels // 4, side, side)

    def flop_formula(self) -> Formula:
        from .flops_models import qwen_image_flops

        return qwen_image_flops

    def flop_tokens(self) -> tuple[int, int]:
        """The packed 2x2 tokens and the text at the longest cached prompt's length (a batch's padded length at
        most; prompts keep their own lengths here, so a row's cost follows its prompts)."""
        text = max((e["prompt_embeds"].shape[1] for e in self._cache.values()), default=self.max_sequence_length())
        return self.image_tokens(), text

    def _encode_text(self, prompts: list[str]) -> dict[str, Tensor]:
        embeds, mask = self.pipe.encode_prompt(
            prompt=prompts, device=self.device, max_sequence_length=self.max_sequence_length()
        )  # [n, L, 3584], [n, L] or None (all real)
        lengths = mask.sum(1).tolist() if mask is not None else [embeds.shape[1]] * len(prompts)
        # the cache holds each prompt at its own length (no padding); encode() pads a batch
        return {"prompt_embeds": embeds, "length": torch.tensor(lengths)}

    def put_cached(self, prompt: str, tensors: dict[str, Tensor]) -> None:
        if "length" in tensors:
            n = int(tensors.pop("length").reshape(-1)[0])
            tensors = {"prompt_embeds": tensors["prompt_embeds"][:, :n]}
        super().put_cached(prompt, tensors)

    def encode(self, prompts: list[str]) -> Conditions:
        """{"prompt_embeds": [P, L, D], "prompt_mask": [P, L]}, L the longest prompt of the batch."""
        if not prompts:
            raise TreegrpoError("no prompts to encode")
        self._fill_cache(list(prompts) + [self.negative_prompt])
        embeds, mask = pad_rows([self._cache[p]["prompt_embeds"] for p in prompts])
        return {"prompt_embeds": embeds.to(self.device), "prompt_mask": mask.to(self.device)}

    def negative(self, rows: int) -> Conditions:
        e = self._cache[self.negative_prompt]["prompt_embeds"].to(self.device)  # [1, L, D]
        return {"prompt_embeds": e.expand(rows, *e.shape[1:]), "prompt_mask": torch.ones(rows, e.shape[1]).long()}

    def model_output(self, net: Any, x: Tensor, sigma: Tensor, cond: Conditions) -> Tensor:
        """x [B, C, h, w] fp32, sigma [B] -> guided velocity [B, C, h, w] fp32."""
        B, _, h, w = x.shape
        emb, mask = cond["prompt_embeds"], cond["prompt_mask"]
        cfg = self.guidance != 1.0
        if cfg:
            neg = self.negative(B)
            emb, mask = _join(emb, mask, neg)
        rows = emb.shape[0]
        out = net(
            hidden_states=pack(torch.cat([x, x]) if cfg else x).to(self.dtype),
            timestep=(torch.cat([sigma, sigma]) if cfg else sigma).to(self.dtype),
            encoder_hidden_states=emb.to(self.dtype),
            encoder_hidden_states_mask=None if bool(mask.all()) else mask.to(x.device),
            img_shapes=[[(1, h // 2, w // 2)]] * rows,
            return_dict=False,
        )[0].float()  # [rows, (h/2)(w/2), 4C]
        if cfg:
            v_c, v_u = out.chunk(2)
            guided = self.guide(v_c, v_u)
            out = guided * (v_c.norm(dim=-1, keepdim=True) / guided.norm(dim=-1, keepdim=True))
        return unpack(out, h, w)

    def _vae_in(self, latents: Tensor) -> Tensor:
        c = self.pipe.vae.config
        mean = torch.tensor(c.latents_mean, device=latents.device).view(1, -1, 1, 1)
        std = torch.tensor(c.latents_std, device=latents.device).view(1, -1, 1, 1)
        return latents * std + mean

    def _vae_decode(self, z: Tensor) -> Tensor:
        return self.pipe.vae.decode(z.unsqueeze(2), return_dict=False)[0][:, :, 0]  # one frame

    def describe(self) -> dict:
        return {**super().describe(), "max_sequence_length": self.max_sequence_length()}


def _join(emb: Tensor, mask: Tensor, neg: Conditions) -> tuple[Tensor, Tensor]:
    """The conditional rows then the negative ones, padded to a common length: [2B, L, D], [2B, L]."""
    ne, nm = neg["prompt_embeds"], neg["prompt_mask"].to(mask.device)
    L = max(emb.shape[1], ne.shape[1])
    pad = lambda t, n: torch.nn.functional.pad(t, (0, 0, 0, n - t.shape[1]) if t.dim() == 3 else (0, n - t.shape[1]))  # noqa: E731
    return torch.cat([pad(emb, L), pad(ne, L)]), torch.cat([pad(mask, L), pad(nm, L)])

"""Pretraining of the latent shapes model on rendered scenes with noisy captions, in two stages.

1. Autoencoder: reconstruct rendered scenes from their 8x8x4 latents (decoder on slightly noisy
   latents); then fit the per-channel latent normaliser.
2. Rectified flow of the DiT on the normalised latents of freshly rendered scenes:
    z0 = encode(render(scene)),  eps ~ N(0, I),  sigma = shift(u), u ~ U(0, 1)
    z_sigma = (1 - sigma) * z0 + sigma * eps,     target v = eps - z0
    loss = || v_theta(z_sigma, sigma, caption) - v ||^2

Data is infinite: every batch draws captions (a form uniformly, then a prompt) and random scenes from
a seeded generator, with the world's caption noise (world.shapes.noisy_scene). Evaluation samples
the test prompts and a fixed sample of the pretraining captions with the deterministic ODE sampler
and scores them with the strict `shapes` reward.
"""

from __future__ import annotations

import io
import json
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch

from ..engine.sde import FlowSDE, SamplerConfig, time_shift
from ..errors import TreegrpoError
from ..models.dit import DiTConfig, TinyDiT
from ..models.latent import AEConfig, LatentDiTPolicy, ShapesAE, latent_dit_config
from ..models.latent_file import dit_config_from, load_weights, save_weights
from ..rewards.base import reward_images
from ..rewards.shapes import ShapesReward, shapes_scores
from ..store.safeio import loads_json
from ..store.shards import atomic_write
from ..world.shapes import CAPTION_NOISE, load_split, render_pretrain_batch, sample_pretrain_prompts
from .sampling import sample_scores


@dataclass(frozen=True)
class PretrainConfig:
    steps: int = 20000  # DiT optimizer steps (the schedule's length)
    minutes: float = 0.0  # stop the DiT stage early after this many minutes (0 = run all steps)
    batch: int = 128
    lr: float = 1e-3  # peak AdamW learning rate of the DiT
    warmup: int = 200
    decay_from: float = 0.5  # cosine decay to lr_min over the last (1 - decay_from) of the steps
    lr_min: float = 1e-5
    weight_decay: float = 0.01
    shift: float = 1.0  # time shift of the noise-level sampling (1 = uniform sigma)
    eval_every: int = 1000
    ema: float = 0.999  # EMA of the DiT weights, which is what gets evaluated and saved (0 = off)
    eval_steps: int = 10  # ODE steps of the evaluation sampler
    caption_noise: float = CAPTION_NOISE
    ae_steps: int = 1500  # autoencoder stage (0: keep the autoencoder of --init)
    ae_batch: int = 64
    ae_lr: float = 2e-3
    word_std: float = 0.02  # init std of the DiT's word embeddings: the word positions' scale (DiTConfig.word_std)
    text_layers: int = 0  # the DiT's text layers (DiTConfig.text_layers)
    depth: int = 6  # the DiT's transformer blocks (DiTConfig.depth)
    dim: int = 128  # the DiT's width (DiTConfig.dim)
    seed: int = 0

    @property
    def dit_shape(self) -> dict[str, Any]:
        """The DiTConfig fields this config sets (latent_dit_config's keywords)."""
        return {"word_std": self.word_std, "text_layers": self.text_layers, "depth": self.depth, "dim": self.dim}


def lr_at(cfg: PretrainConfig, step: int, steps: int | None = None, peak: float | None = None) -> float:
    steps, peak = steps or cfg.steps, peak or cfg.lr
    if step < cfg.warmup:
        return peak * (step + 1) / cfg.warmup
    start = int(cfg.decay_from * steps)
    if step < start:
        return peak
    t = min(1.0, (step - start) / max(1, steps - start))
    return cfg.lr_min + 0.5 * (peak - cfg.lr_min) * (1 + math.cos(math.pi * t))


def _batch(
    cfg: PretrainConfig, prompts: list[str], n: int, g: torch.Generator, noise: float | None = None
) -> tuple[list[str], torch.Tensor]:
    """n captions and their images (caption noise cfg.caption_noise unless `noise` is given)."""
    captions = sample_pretrain_prompts(prompts, n, g)
    return captions, render_pretrain_batch(captions, g, cfg.caption_noise if noise is None else noise)


def train_autoencoder(
    cfg: PretrainConfig,
    prompts: list[str],
    g: torch.Generator,
    log: Callable[[dict[str, Any]], None],
    ae_cfg: AEConfig = AEConfig(),
) -> ShapesAE:
    """Stage 1: the autoencoder, then its latent normaliser fitted on 1024 fresh scenes."""
    ae = ShapesAE(ae_cfg)
    opt = torch.optim.AdamW(ae.parameters(), lr=cfg.ae_lr, weight_decay=0.0)
    ema_loss = None
    for step in range(cfg.ae_steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(cfg, step, cfg.ae_steps, cfg.ae_lr)
        loss = ae.reconstruction_loss(_batch(cfg, prompts, cfg.ae_batch, g)[1], g)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        ema_loss = loss.item() if ema_loss is None else 0.98 * ema_loss + 0.02 * loss.item()
        if (step + 1) % 100 == 0:
            log({"stage": "autoencoder", "step": step + 1, "loss": ema_loss})
    ae.fit_normaliser(_batch(cfg, prompts, 1024, g)[1])
    with torch.no_grad():  # clean renders: their captions are right
        captions, images = _batch(cfg, prompts, 256, g, noise=0.0)
        rec = ae.decode(ae.encode(images))
        log(
            {
                "stage": "autoencoder",
                "step": cfg.ae_steps,
                "recon_mse": float(((rec - images) ** 2).mean()),
                "recon_reward": float(shapes_scores(reward_images(rec), captions).mean()),
            }
        )
    return ae.requires_grad_(False).eval()


def flow_loss(
    net: TinyDiT, policy: LatentDiTPolicy, prompts: list[str], latents: torch.Tensor, g: torch.Generator, shift: float
) -> torch.Tensor:
    eps = torch.randn(latents.shape, generator=g)  # [B, 4, 8, 8]
    sigma = time_shift(torch.rand(latents.shape[0], generator=g, dtype=torch.float64), shift).float()
    s = sigma.view(-1, 1, 1, 1)
    cond = policy.encode(prompts)
    v = net((1 - s) * latents + s * eps, sigma, cond["ids"], cond["mask"])
    return torch.mean((v - (eps - latents)) ** 2)


def evaluate(policy: LatentDiTPolicy, prompts: list[str], steps: int, seed: int = 1234) -> float:
    """Mean `shapes` reward of one ODE sample per prompt: one rollout of them all from `seed` (the pretraining's
    own, not a named stream), sampled, decoded and scored through sampling.py."""
    sde = FlowSDE(SamplerConfig(steps=steps))
    scores = sample_scores(policy, sde, prompts, {"shapes": ShapesReward()}, seed, batch=max(len(prompts), 1))
    return float(scores["shapes"].mean())


def own_distribution_prompts(n: int = 120, seed: int = 777) -> list[str]:
    """A fixed sample of the pretraining captions (forms balanced, as the data draws them)."""
    return sample_pretrain_prompts(load_split("pretrain"), n, torch.Generator().manual_seed(seed))


def _save_state(
    path: Path,
    net: TinyDiT,
    ae: ShapesAE,
    opt: torch.optim.Optimizer,
    ema: Any,
    g: torch.Generator,
    cfg: PretrainConfig,
    row: dict[str, Any],
) -> None:
    """Everything the DiT stage needs to go on exactly where it stopped (torch pickle, written atomically)."""
    state = {
        "pretrain": asdict(cfg),
        "row": json.dumps(row),
        "dit_config": asdict(net.cfg),
        "ae_config": asdict(ae.cfg),
        "dit": net.state_dict(),
        "ae": ae.state_dict(),
        "opt": opt.state_dict(),
        "ema": ema.state_dict() if ema else None,
        "generator": g.get_state(),
        "torch_rng": torch.get_rng_state(),
    }
    buf = io.BytesIO()
    torch.save(state, buf)
    atomic_write(Path(path), buf.getvalue())


# Fields added to PretrainConfig after weights had been recorded, with what every older run did.
PREDATED = {"word_std": 1.0, "text_layers": 0, "depth": 4, "dim": 128}


def recorded_config(fields: dict[str, Any]) -> PretrainConfig:
    """The config a weights or state file records; a field it predates gets what runs did before it existed."""
    return PretrainConfig(**{**PREDATED, **fields})


def _load_state(path: Path, cfg: PretrainConfig) -> dict[str, Any]:
    try:
        state = torch.load(path, weights_only=True)
        same = replace(recorded_config(state["pretrain"]), minutes=0.0) == replace(cfg, minutes=0.0)
    except Exception as e:  # a torn or foreign file: say which
        raise TreegrpoError(
            f"{path}: not a pretraining state file ({str(e).splitlines()[0][:120]}); delete it to start over"
        ) from None
    if not same:
        raise TreegrpoError(
            f"{path} was written by a pretraining with other settings; "
            "resume with the same options or delete it to start over"
        )
    return state


def resume_step(path: Path, cfg: PretrainConfig) -> int | None:
    """The DiT step a pretraining with this state file would go on from (None: no file, a fresh start)."""
    return loads_json(_load_state(Path(path), cfg)["row"])["step"] if Path(path).exists() else None


def _restore(
    resumed: dict[str, Any], opt: torch.optim.Optimizer, ema: Any, g: torch.Generator
) -> tuple[int, float, float, dict[str, Any]]:
    """Optimizer, EMA and random generators from a state file -> (next step, loss EMA, minutes, last row)."""
    opt.load_state_dict(resumed["opt"])
    if ema:
        ema.load_state_dict(resumed["ema"])
    g.set_state(resumed["generator"])
    torch.set_rng_state(resumed["torch_rng"])
    row = loads_json(resumed["row"])
    return row["step"], row["loss"], row["minutes"], row


def _models(
    cfg: PretrainConfig,
    init: Path | None,
    dit: DiTConfig | None,
    ae_cfg: AEConfig,
    prompts: list[str],
    g: torch.Generator,
    log: Callable[[dict[str, Any]], None],
    resumed: dict[str, Any] | None,
    ae_from: Path | None = None,
) -> tuple[TinyDiT, ShapesAE]:
    """The DiT and the (trained, frozen) autoencoder: from a resumed state, from `init`, or new (its
    autoencoder trained here, or taken from the weights file `ae_from`)."""
    if resumed:
        net, ae = TinyDiT(dit_config_from(resumed["dit_config"])), ShapesAE(AEConfig(**resumed["ae_config"]))
        net.load_state_dict(resumed["dit"])
        ae.load_state_dict(resumed["ae"])
        return net, ae.requires_grad_(False).eval()
    if init:
        net, ae = load_weights(init)[:2]
        return net, (train_autoencoder(cfg, prompts, g, log, ae_cfg) if cfg.ae_steps else ae)
    given = load_weights(ae_from)[1].requires_grad_(False).eval() if ae_from else None
    # the DiT before the autoencoder's init: the global RNG's order
    net = TinyDiT(dit or latent_dit_config(given.cfg if given else ae_cfg, **cfg.dit_shape))
    return net, given or train_autoencoder(cfg, prompts, g, log, ae_cfg)


def pretrain(
    cfg: PretrainConfig,
    out: Path,
    init: Path | None = None,
    dit: DiTConfig | None = None,
    log: Callable[[dict[str, Any]], None] = lambda row: None,
    ae_cfg: AEConfig = AEConfig(),
    state: Path | None = None,
    ae_from: Path | None = None,
) -> dict[str, Any]:
    """Both stages from scratch (or the DiT stage from `init`, reusing its autoencoder when ae_steps is 0,
    or a new DiT on the autoencoder of the weights file `ae_from`, which skips the autoencoder stage);
    writes the weights to `out` at every evaluation; returns the last evaluation row. With `state`, the whole
    training state is written there at every evaluation too, and a call whose `state` file exists goes on
    from it: the same weights and log rows as a run that was never stopped."""
    torch.manual_seed(cfg.seed)
    g = torch.Generator().manual_seed(cfg.seed)
    train_prompts, test_prompts, own = load_split("pretrain"), load_split("test"), own_distribution_prompts()
    resumed = _load_state(Path(state), cfg) if state is not None and Path(state).exists() else None
    net, ae = _models(cfg, init, dit, ae_cfg, train_prompts, g, log, resumed, ae_from)
    policy = LatentDiTPolicy(net.cfg, net, ae)
    opt = torch.optim.AdamW(net.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    ema = (
        torch.optim.swa_utils.AveragedModel(net, multi_avg_fn=torch.optim.swa_utils.get_ema_multi_avg_fn(cfg.ema))
        if cfg.ema
        else None
    )
    shown = policy
    if ema:
        assert isinstance(ema.module, TinyDiT)  # AveragedModel holds a deepcopy of net
        shown = LatentDiTPolicy(net.cfg, ema.module, ae)
    start, ema_loss, done_minutes, row = _restore(resumed, opt, ema, g) if resumed else (0, None, 0.0, {})
    t0 = time.perf_counter() - 60 * done_minutes
    for step in range(start, cfg.steps):
        prompts, images = _batch(cfg, train_prompts, cfg.batch, g)
        loss = flow_step(net, policy, opt, ema, prompts, policy.encode_images(images), g, cfg.shift, lr_at(cfg, step))
        ema_loss = loss if ema_loss is None else 0.98 * ema_loss + 0.02 * loss
        minutes = (time.perf_counter() - t0) / 60
        last = step == cfg.steps - 1 or bool(cfg.minutes and minutes >= cfg.minutes)
        if (step + 1) % cfg.eval_every == 0 or last:
            row = {
                "stage": "dit",
                "step": step + 1,
                "loss": ema_loss,
                "lr": lr_at(cfg, step),
                "minutes": minutes,
                "images": (step + 1) * cfg.batch,
                "test_reward": evaluate(shown, test_prompts, cfg.eval_steps),
                "pretrain_reward": evaluate(shown, own, cfg.eval_steps),
            }
            meta = {
                "pretrain": asdict(cfg),
                "log": row,
                "guidance": 1.0,
                **({"ae_from": str(ae_from)} if ae_from else {}),
            }
            save_weights(out, shown.net, ae, meta)
            if state is not None:
                _save_state(Path(state), net, ae, opt, ema, g, cfg, row)
            log(row)
        elif (step + 1) % 50 == 0:
            log({"stage": "dit", "step": step + 1, "loss": ema_loss, "lr": lr_at(cfg, step), "minutes": minutes})
        if last:
            break
    return row


def flow_step(
    net: TinyDiT, policy: LatentDiTPolicy, opt, ema, captions: list, latents: torch.Tensor, g, shift: float, lr: float
) -> float:
    """One flow-matching step of `net` at learning rate `lr` (and the EMA after it, if any); its loss."""
    for group in opt.param_groups:
        group["lr"] = lr
    loss = flow_loss(net, policy, captions, latents, g, shift)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
    opt.step()
    if ema:
        ema.update_parameters(net)
    return loss.item()

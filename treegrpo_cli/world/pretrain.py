"""Rectified-flow pretraining of the tiny DiT on rendered shapes scenes.

    x0 = render(scene) * 2 - 1,  eps ~ N(0, I),  sigma = shift(u), u ~ U(0, 1)
    x_sigma = (1 - sigma) * x0 + sigma * eps,     target v = eps - x0
    loss = || v_theta(x_sigma, sigma, prompt) - v ||^2

Data is infinite: every batch draws pretraining prompts and fresh random scenes from a seeded
generator. Evaluation samples the held-out test prompts with the deterministic ODE sampler and
scores them with the `shapes` reward.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from ..engine.rollout import TreeConfig, rollout
from ..engine.sde import FlowSDE, SamplerConfig, time_shift
from ..errors import TreegrpoError
from ..models.dit import DiTConfig, DiTPolicy, TinyDiT
from ..rewards.shapes import shapes_scores
from ..store.shards import atomic_write
from .shapes import load_split, render_prompts


@dataclass(frozen=True)
class PretrainConfig:
    steps: int = 8000           # optimizer steps (the schedule's length): ~60 min at ~145 images/s
    minutes: float = 0.0        # stop early after this many minutes (0 = run all steps)
    batch: int = 64
    lr: float = 6e-4            # peak AdamW learning rate
    warmup: int = 300
    decay_from: float = 0.6     # cosine decay to lr_min over the last (1 - decay_from) of the steps
    lr_min: float = 1e-5
    weight_decay: float = 0.01
    shift: float = 1.0          # time shift of the noise-level sampling (1 = uniform sigma)
    eval_every: int = 1000
    ema: float = 0.998          # EMA of the weights, which is what gets evaluated and saved (0 = off)
    eval_steps: int = 20        # ODE steps of the evaluation sampler
    uncond: float = 0.1         # probability of training on the empty prompt (classifier-free guidance)
    guidance: float = 5.0       # guidance scale of the evaluation sampler, stored with the weights
    seed: int = 0


def lr_at(cfg: PretrainConfig, step: int) -> float:
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    start = int(cfg.decay_from * cfg.steps)
    if step < start:
        return cfg.lr
    t = min(1.0, (step - start) / max(1, cfg.steps - start))
    return cfg.lr_min + 0.5 * (cfg.lr - cfg.lr_min) * (1 + math.cos(math.pi * t))


def flow_loss(net: TinyDiT, policy: DiTPolicy, prompts: list[str], images: torch.Tensor,
              g: torch.Generator, shift: float, uncond: float = 0.0) -> torch.Tensor:
    x0 = images * 2 - 1                                                   # [B, 3, H, W]
    eps = torch.randn(x0.shape, generator=g)
    sigma = time_shift(torch.rand(x0.shape[0], generator=g, dtype=torch.float64), shift).float()
    s = sigma.view(-1, 1, 1, 1)
    cond = policy.encode(prompts)
    keep = (torch.rand(x0.shape[0], generator=g) >= uncond)[:, None]      # [B, 1]: False = empty prompt
    v = net(((1 - s) * x0 + s * eps), sigma, cond["ids"] * keep, cond["mask"] & keep)
    return torch.mean((v - (eps - x0)) ** 2)


def evaluate(policy: DiTPolicy, prompts: list[str], steps: int, seed: int = 1234, guidance: float = 1.0) -> float:
    """Mean `shapes` reward of one ODE sample per prompt (at this guidance scale)."""
    policy = DiTPolicy(policy.cfg, policy.net, guidance=guidance)
    sde = FlowSDE(SamplerConfig(steps=steps))
    tree, _ = rollout(policy, prompts, list(range(len(prompts))), sde, TreeConfig(sde_steps=()), seed)
    with torch.no_grad():
        images = policy.decode(tree.image_latent)
    return float(shapes_scores(images, prompts).mean())


def save_weights(path: Path, net: TinyDiT, meta: dict[str, Any]) -> None:
    cfg = asdict(net.cfg)
    cfg["vocab"] = list(cfg["vocab"])
    tensors = {k: v.detach().cpu().contiguous() for k, v in net.state_dict().items()}
    atomic_write(Path(path), st_save(tensors, metadata={"dit_config": json.dumps(cfg), "treegrpo": json.dumps(meta)}))


def load_weights(path: Path) -> tuple[TinyDiT, dict[str, Any]]:
    path = Path(path)
    if not path.is_file():
        raise TreegrpoError(f"model weights not found: {path}")
    data = path.read_bytes()
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n]).get("__metadata__", {})
    if "dit_config" not in header:
        raise TreegrpoError(f"{path}: not a treegrpo tiny DiT weights file (no dit_config metadata)")
    cfg = json.loads(header["dit_config"])
    cfg["vocab"] = tuple(cfg["vocab"])
    try:
        net = TinyDiT(DiTConfig(**cfg))
        state, own = st_load(data), net.state_dict()
        odd = sorted(set(state) ^ set(own)) + [k for k in state if k in own and state[k].shape != own[k].shape]
        if odd:
            raise ValueError(f"{len(odd)} tensors differ, e.g. {odd[0]}")
        net.load_state_dict(state, strict=True)
    except (TypeError, ValueError, RuntimeError) as e:
        raise TreegrpoError(f"{path}: weights do not fit this version's tiny DiT ({str(e).splitlines()[0]}); "
                            "rebuild them with `python scripts/pretrain_shapes.py`") from None
    return net, json.loads(header.get("treegrpo", "{}"))


WORLD_DIT = DiTConfig(text_ada=True)   # the architecture of the shipped tiny-shapes weights


def pretrain(cfg: PretrainConfig, out: Path, init: Path | None = None, dit: DiTConfig = WORLD_DIT,
             log: Callable[[dict[str, Any]], None] = lambda row: None) -> dict[str, Any]:
    """Train from scratch (or from `init`) and write the weights to `out`; returns the last log row."""
    torch.manual_seed(cfg.seed)
    net = load_weights(init)[0] if init else TinyDiT(dit)
    policy = DiTPolicy(net.cfg, net)
    opt = torch.optim.AdamW(net.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    ema = torch.optim.swa_utils.AveragedModel(net, multi_avg_fn=torch.optim.swa_utils.get_ema_multi_avg_fn(cfg.ema)) \
        if cfg.ema else None
    shown = DiTPolicy(net.cfg, ema.module) if ema else policy
    g = torch.Generator().manual_seed(cfg.seed)
    train_prompts, test_prompts = load_split("pretrain"), load_split("test")
    t0, ema_loss, row = time.perf_counter(), None, {}
    for step in range(cfg.steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(cfg, step)
        idx = torch.randint(len(train_prompts), (cfg.batch,), generator=g).tolist()
        prompts = [train_prompts[i] for i in idx]
        loss = flow_loss(net, policy, prompts, render_prompts(prompts, g), g, cfg.shift, cfg.uncond)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        opt.step()
        if ema:
            ema.update_parameters(net)
        value = loss.item()
        ema_loss = value if ema_loss is None else 0.98 * ema_loss + 0.02 * value
        minutes = (time.perf_counter() - t0) / 60
        last = step == cfg.steps - 1 or (cfg.minutes and minutes >= cfg.minutes)
        if (step + 1) % cfg.eval_every == 0 or last:
            row = {"step": step + 1, "loss": ema_loss, "lr": lr_at(cfg, step), "minutes": minutes,
                   "images": (step + 1) * cfg.batch,
                   "test_reward": evaluate(shown, test_prompts, cfg.eval_steps, guidance=cfg.guidance),
                   "pretrain_reward": evaluate(shown, train_prompts[::13][:56], cfg.eval_steps, guidance=cfg.guidance),
                   "test_reward_unguided": evaluate(shown, test_prompts, cfg.eval_steps)}
            save_weights(out, shown.net, {"pretrain": asdict(cfg), "log": row, "guidance": cfg.guidance})
            log(row)
        elif (step + 1) % 50 == 0:
            log({"step": step + 1, "loss": ema_loss, "lr": lr_at(cfg, step), "minutes": minutes})
        if last:
            break
    return row

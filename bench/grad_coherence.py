"""How much signal is in one iteration's GRPO gradient? Cosine between independent batches.

    python bench/grad_coherence.py --preset branch --batches 6 --depths 0-2,3-9,10-19
    python bench/grad_coherence.py --preset tree-grpo --reward redness --depths 0-0,1-1,2-2

For a fixed set of training prompts, roll out --batches independent tree batches (different seeds),
score them, compute advantages and the GRPO loss gradient of the trained edges, grouped by the
denoising step of the edge's parent (--depths buckets), without updating the model. If g_i is the
gradient of batch i, the mean pairwise cosine cos(g_i, g_j) estimates |signal|^2 / (|signal|^2 +
|noise|^2) of a single batch: near 1, one iteration knows where to go; near 0, the step is mostly
noise and only many iterations (or momentum) average it out. --line-search then steps the weights
along the summed gradient of all batches (and against it) and reports the ODE reward: whether a
gradient from that many leaves points uphill. `redness` (mean R - (G+B)/2 of the
image) is a smooth reward with no prompt in it, a control for the `shapes` reward.
Writes a JSON file (default bench/results/grad_coherence-<preset>-<reward>.json).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Iterable
from dataclasses import replace
from itertools import combinations
from pathlib import Path
from typing import Any, cast

import torch

from treegrpo_cli.config import load_config
from treegrpo_cli.engine.grpo import Batch, grpo_update
from treegrpo_cli.engine.rollout import mix_seed, rollout
from treegrpo_cli.rewards.base import register, score_leaves
from treegrpo_cli.training.heldout import heldout_reward
from treegrpo_cli.training.sampling import leaf_images
from treegrpo_cli.training.steps import credit
from treegrpo_cli.training.trainer import Trainer
from treegrpo_cli.world.shapes import load_split


class Redness:
    name = "redness"

    def __call__(self, images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        return (images[:, 0] - (images[:, 1] + images[:, 2]) / 2).mean((1, 2)).float()


class Capture:
    """An optimizer stand-in: keeps the flattened gradient of each step instead of stepping."""

    param_groups = [{"lr": 0.0}]

    def __init__(self, params: list[torch.nn.Parameter]):
        self.params = params
        self.grad: torch.Tensor | None = None

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            p.grad = None

    def step(self) -> None:
        self.grad = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).flatten() for p in self.params])


def tensor_sum(ts: Iterable[torch.Tensor]) -> torch.Tensor:
    """sum() of tensors (its start 0 comes back only when there are none: an error here)."""
    total = sum(ts)
    if not isinstance(total, torch.Tensor):
        raise ValueError("no tensors to sum")
    return total


def batch_gradients(
    tr: Trainer, prompts: list[str], seed: int, buckets: list[tuple[int, int]]
) -> tuple[list[torch.Tensor | None], float]:
    """Summed edge gradients [params] per depth bucket of one scored tree batch, and its mean reward."""
    cfg = tr.cfg
    tree, _ = rollout(
        tr.policy, prompts, list(range(len(prompts))), tr.sde, cfg.tree, seed, max_batch=cfg.rollout.max_batch
    )
    leaf_prompts = [prompts[int(p)] for p in tree.tree_prompt[tree.tree[tree.leaves()]]]
    scores = score_leaves(tr.rewards, leaf_images(tr.policy, tree), leaf_prompts)
    adv, trained = credit(cfg, tree, scores, 0)
    parent_depth = tree.depth[tree.parent.clamp(min=0)]
    cap = Capture(list(tr.policy.trainable_parameters()))
    # the gradient of the whole objective, whatever the preset's update schedule: one step over every trained edge
    # of the bucket, their mean loss, unclipped (x n below: the sum over the edges)
    whole = replace(cfg.train, minibatches=1, loss_norm="mean", max_grad_norm=math.inf)
    out: list[torch.Tensor | None] = []
    for lo, hi in buckets:
        mask = trained & (tree.parent >= 0) & (parent_depth >= lo) & (parent_depth <= hi)
        n = int(mask.sum())
        if n == 0:
            out.append(None)
            continue
        grpo_update(
            tr.policy,
            cast(torch.optim.Optimizer, cap),  # a stand-in: grpo_update calls only its zero_grad and step
            tr.sde,
            Batch(tree, mask, adv.edge, tr.policy.encode(prompts)),
            whole,
            torch.Generator().manual_seed(seed),
            max_batch=cfg.rollout.max_batch,
        )
        assert cap.grad is not None  # grpo_update stepped it: the bucket has trained edges
        out.append(cap.grad * n)  # undo the mean over the bucket's edges
    return out, float(tensor_sum(scores.values()).mean())


GROUPS = {
    "text": ("words", "word_pos", "text_pool"),
    "time": ("time.",),
    "attention": (".qkv", ".proj"),
    "mlp": (".mlp",),
    "modulation": (".ada", "ada_out"),
    "patches": ("patch_in", "patch_out", "pos"),
    "refiner": ("refiner",),
}


def group_slices(policy) -> dict[str, torch.Tensor]:
    """{group: bool mask over the flattened trainable parameters} for the TinyDiT's parts."""
    names = [(n, p.numel()) for n, p in policy.net.named_parameters()]
    out = {}
    for g, keys in GROUPS.items():
        out[g] = torch.cat([torch.full((k,), any(key in n for key in keys)) for n, k in names])
    return out


def coherence(gs: list[torch.Tensor]) -> dict[str, float | None]:
    pair = [cosine(a, b) for a, b in combinations(gs, 2)]
    half = len(gs) // 2
    return {
        "mean_pairwise_cos": sum(pair) / len(pair) if pair else None,
        "halves_cos": cosine(tensor_sum(gs[:half]), tensor_sum(gs[half:])) if half else None,
        "grad_norm_per_batch": sum(float(g.norm()) for g in gs) / max(len(gs), 1),
    }


def bucket_rows(
    grads: list[list[torch.Tensor | None]], buckets: list[tuple[int, int]], masks: dict[str, torch.Tensor]
) -> list[dict[str, Any]]:
    """Each depth bucket's coherence over the batches, of the whole gradient and of each part's (masks)."""
    rows: list[dict[str, Any]] = []
    for k, (lo, hi) in enumerate(buckets):
        gs = [x for x in (batch[k] for batch in grads) if x is not None]
        row: dict[str, Any] = {"depths": [lo, hi], **coherence(gs)}
        row["by_part"] = {
            name: coherence([g[m] for g in gs])["mean_pairwise_cos"] for name, m in masks.items() if m.any()
        }
        rows.append(row)
    return rows


def line_search(
    tr: Trainer, prompts: list[str], grad: torch.Tensor, sizes: list[float], sign: bool = False
) -> list[dict]:
    """ODE rewards (training prompts x 16, every 4th test prompt x 2) after moving the weights along the
    ascent (-grad) and descent (+grad) directions (and with `sign` along -sign(grad)), scaled to a weight
    RMS of each size; then restores them."""
    params = list(tr.policy.trainable_parameters())
    theta0 = [p.detach().clone() for p in params]
    units = {
        "ascent": -grad / grad.norm() * grad.numel() ** 0.5,  # ascent direction with weight RMS 1
        "descent": grad / grad.norm() * grad.numel() ** 0.5,
    }
    if sign:  # what Adam's first steps do: every weight moves by the same amount, the gradient's sign
        units["sign-ascent"] = -torch.sign(grad) / torch.sign(grad).pow(2).mean().sqrt()

    def ev(ps: list[str], samples: int) -> float:
        return heldout_reward(tr.policy, tr.sde, ps, tr.rewards, tr.weights, samples=samples, seed=777)["reward_mean"]

    def rewards() -> dict[str, float]:
        return {"train_prompts": ev(prompts, 16), "test_prompts": ev(load_split("test")[::4], 2)}

    out = [{"rms": 0.0, "direction": "none", **rewards()}]
    for rms in sizes:
        for name, unit in units.items():
            with torch.no_grad():
                for p, t, d in zip(params, theta0, (rms * unit).split([p.numel() for p in params]), strict=True):
                    p.copy_(t + d.view_as(p))
            out.append({"rms": rms, "direction": name, **rewards()})
    with torch.no_grad():
        for p, t in zip(params, theta0, strict=True):
            p.copy_(t)
    return out


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(a @ b / (a.norm() * b.norm()).clamp(min=1e-30))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="branch")
    ap.add_argument("--reward", default="shapes", help="shapes | redness | any registered reward")
    ap.add_argument("--set", action="append", default=[], help="config override KEY=VALUE (repeatable)")
    ap.add_argument("--prompts", type=int, default=8, help="training prompts per batch (every 9th of shapes-train)")
    ap.add_argument("--batches", type=int, default=6)
    ap.add_argument("--depths", default="0-2,3-9,10-19", help="buckets of the parent's step, e.g. 0-0,1-4")
    ap.add_argument("--line-search", default="", help="weight RMS list, e.g. 3e-5,1e-4: step along +-(summed gradient)")
    ap.add_argument("--sign", action="store_true", help="line search also along -sign(gradient), Adam's first step")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    register("redness", Redness)
    buckets = [(int(lo), int(hi)) for lo, hi in (b.split("-") for b in args.depths.split(","))]
    cfg = load_config(
        args.preset,
        sets=['model="tiny-shapes"', f'reward.names=["{args.reward}"]', *args.set],  # unclipped: batch_gradients
    )
    tr, prompts, t0 = Trainer(cfg, "cpu"), load_split("rl_train")[::9][: args.prompts], time.perf_counter()
    grads: list[list[torch.Tensor | None]] = []
    rewards: list[float] = []
    for i in range(args.batches):
        g, r = batch_gradients(tr, prompts, mix_seed(123, i), buckets)
        grads.append(g)
        rewards.append(r)
    rows = bucket_rows(grads, buckets, group_slices(tr.policy) if hasattr(tr.policy, "net") else {})
    if args.line_search:
        total = tensor_sum(g for batch in grads for g in batch if g is not None)
        rows.append(
            {"line_search": line_search(tr, prompts, total, [float(v) for v in args.line_search.split(",")], args.sign)}
        )
    result = {
        "preset": args.preset,
        "reward": args.reward,
        "sets": args.set,
        "prompts": prompts,
        "batches": args.batches,
        "batch_reward_mean": rewards,
        "buckets": rows,
        "seconds": time.perf_counter() - t0,
        "threads": args.threads,
    }
    out = args.out or Path(f"bench/results/grad_coherence-{args.preset}-{args.reward}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    for row in rows:
        print(row)


if __name__ == "__main__":
    main()

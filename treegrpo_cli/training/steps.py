"""The steps of one training iteration, shared by the online loop (loop.py) and the staged pipeline
(stages.py): which prompts and tree shape, the credit, the seeded RNGs, and the metrics row (rewards and the
leaves' images: sampling.py)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import Tensor

from ..config import Config
from ..engine.budgets import PromptStats, allocate, replace_tied
from ..engine.credit import assign_credit
from ..engine.dynamic import Shape
from ..engine.rollout import TreeConfig, mix_seed
from ..engine.schedules import tree_for_iteration
from ..engine.splits import adaptive_steps, progress_steps
from ..engine.tree import Tree
from ..engine.update import Credited  # noqa: F401  (the trees an update trains on: built here and in stages.py)
from ..errors import ConfigError
from ..rewards.base import weighted_sum
from .runlog import MetricsRow


@dataclass(frozen=True)
class IterationPlan:
    """What the online loop samples at one iteration: which prompts, the tree's shape, the noise seed."""

    prompt_ids: list[int]
    tree: TreeConfig
    seed: int
    shapes: list[Shape] | None = None  # per prompt: split steps and leaf budget ([splits], [budget]); None: the tree's
    skipped: tuple[int, ...] = ()  # prompts budget.replace_after swapped out (they rest: engine/budgets.py)


def plan_iteration(
    cfg: Config, num_available: int, it: int, num_prompts: int | None = None, stats: PromptStats | None = None
) -> IterationPlan:
    """Iteration `it`'s prompts (a seeded draw from the num_available), tree shape (the preset's
    [schedule], [splits] and [budget]) and root seed: what `train` samples and what `rollout --iteration it`
    writes. stats: the run's per-prompt estimates so far (engine/budgets.py), where the config reads them."""
    if stats is None and it > 0 and needs_stats(cfg):
        raise ConfigError(
            f"iteration {it} of this config depends on the rewards of the iterations before it (budget.mode or "
            "splits.kind = 'adaptive'); only `train` has them (a staged rollout can write iteration 0)"
        )
    k = num_prompts or cfg.rollout.num_prompts
    ids = sample_prompt_ids(num_available, k, cfg.seed, it)
    order = sample_prompt_ids(num_available, num_available, cfg.seed, it)  # the draw's whole permutation
    ids, skipped = replace_tied(ids, order, stats, cfg.budget.replace_after)
    T, decode = cfg.sampler.steps, cfg.sampler.decode
    tree_cfg = tree_for_iteration(cfg.tree, cfg.schedule, T, it, cfg.seed, decode)
    if cfg.splits.kind == "progress":
        moved = progress_steps(cfg.splits, T, decode, it, cfg.train.iterations, cfg.seed)
        tree_cfg = dataclasses.replace(tree_cfg, split_steps=moved)
        tree_cfg.validate(T, decode)
    shapes = None
    if cfg.splits.kind == "adaptive" or cfg.budget.mode != "off":
        base = tuple(sorted(s for s in set(tree_cfg.split_steps) if 0 <= s < T))
        widths = allocate(cfg.budget, stats, ids, tree_cfg.leaves(T))
        shapes = [
            Shape(
                adaptive_steps(
                    cfg.splits, base, steps=T, decode=decode, it=it, seed=cfg.seed, prompt_id=p, stats=stats
                ),
                w,
            )
            if cfg.splits.kind == "adaptive"
            else Shape(base, w)
            for p, w in zip(ids, widths, strict=True)
        ]
    return IterationPlan(ids, tree_cfg, mix_seed(cfg.seed, it), shapes, tuple(skipped))


def needs_stats(cfg: Config) -> bool:
    """Does the config plan from the run's per-prompt reward estimates?"""
    return cfg.budget.mode != "off" or cfg.splits.kind == "adaptive"


def new_stats(cfg: Config) -> PromptStats | None:
    return PromptStats(cfg.budget.decay, cfg.splits.bounds_decay) if needs_stats(cfg) else None


def dynamic_row(stats: dict[str, int], per_row: tuple[int, int] | None) -> dict[str, int]:
    """The rollout's early stops, fallbacks, x0-predictions scored, and the forwards (and FLOPs) its stops saved
    against the same trees undisturbed."""
    saved = int(stats.get("evals_saved", 0))
    return {
        "early_stops": int(stats.get("early_stops", 0)),
        "fallbacks": int(stats.get("fallbacks", 0)),
        "judged_images": int(stats.get("judged_images", 0)),
        "evals_saved": saved,
        "flops_saved": saved * per_row[0] if per_row else 0,
    }


def on_nodes(tree: Tree, leaf_values: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """{name: [L]} values of a tree batch's leaves -> {name: [N]} float32 over its nodes, NaN off the leaves."""
    leaves = tree.leaves()
    return {
        n: torch.full((tree.num_nodes,), float("nan")).index_put_((leaves,), v.float()) for n, v in leaf_values.items()
    }


def credit(cfg: Config, tree: Tree, scores: dict[str, torch.Tensor], it: int):
    """Leaf scores {name: [L]} -> edge advantages and the trained-edge mask [N] of a batch of trees."""
    return assign_credit(
        tree,
        on_nodes(tree, scores),
        weights=cfg.reward.weight_map(),
        combine_mode=cfg.reward.combine,
        advantage=cfg.advantage,
        pruning=cfg.pruning,
        steps=cfg.sampler.steps,
        decode=cfg.sampler.decode,
        iteration=it,
        max_iterations=cfg.train.iterations,
    )


def update_generator(cfg: Config, it: int) -> torch.Generator:
    """The generator of iteration it's minibatch order."""
    return torch.Generator().manual_seed(mix_seed(cfg.seed, it, 0xB47C))


def peak_memory_mib(device: str) -> float:
    """Peak memory so far: the device's allocated tensors on CUDA, the process's resident set on the CPU."""
    if str(device).startswith("cuda"):
        return torch.cuda.max_memory_allocated(torch.device(device)) / 2**20
    try:
        import resource
    except ImportError:  # not on Windows
        return float("nan")
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def rng_states() -> dict[str, torch.Tensor]:
    """Every global RNG state torch keeps: the CPU generator and each CUDA device's."""
    states = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        states.update({f"cuda.{i}": s for i, s in enumerate(torch.cuda.get_rng_state_all())})
    return states


def set_rng_states(states: dict[str, torch.Tensor]) -> None:
    torch.set_rng_state(states["torch"])
    cuda = [states[k] for k in sorted((k for k in states if k.startswith("cuda.")), key=lambda k: int(k[5:]))]
    if cuda and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(cuda[: torch.cuda.device_count()])


def sample_prompt_ids(n: int, k: int, seed: int, iteration: int) -> list[int]:
    """k prompt ids for one iteration: a seeded permutation, cycled when k > n."""
    g = torch.Generator().manual_seed(mix_seed(seed, iteration, 0x9A11))
    perm = torch.randperm(n, generator=g).tolist()
    return [perm[i % n] for i in range(k)]


def group_spread(total: torch.Tensor, group: torch.Tensor) -> dict[str, float]:
    """Of the leaves' rewards [L] by prompt group [L]: the fraction of groups whose rewards all tie (zero
    within-group std: no advantage, nothing to learn there), the fraction of leaves in those groups (what the ties
    cost, where groups differ in size) and the mean within-group std (population std, as DiffusionNFT's
    calculate_zero_std_ratio)."""
    _, inv = torch.unique(group, return_inverse=True)
    k = int(inv.max()) + 1 if inv.numel() else 0
    x = total.double()
    count = torch.zeros(k, dtype=torch.float64).index_add_(0, inv, torch.ones_like(x))
    mean = torch.zeros(k, dtype=torch.float64).index_add_(0, inv, x) / count
    std = (torch.zeros(k, dtype=torch.float64).index_add_(0, inv, (x - mean[inv]) ** 2) / count).sqrt()
    lo = torch.full((k,), math.inf, dtype=torch.float64).scatter_reduce_(0, inv, x, "amin")
    hi = torch.full((k,), -math.inf, dtype=torch.float64).scatter_reduce_(0, inv, x, "amax")
    tied = hi == lo  # [k]
    return {
        "zero_std_ratio": float(tied.double().mean()),
        "tied_leaf_share": float(count[tied].sum() / count.sum()) if k else 0.0,
        "reward_group_std": float(std.mean()),
    }


def metrics_row(c: Credited, it: int, adv_trained: Tensor, upd: dict[str, Any], lr: float) -> MetricsRow:
    """Iteration it's row: rewards (total and per reward, their spread within prompt groups), the trained
    edges' advantages adv_trained, model evaluations, the learning rate and the update's metrics upd."""
    scores, nfe, sde_steps = c.scores, c.nfe, c.sde_steps
    group = c.whole.group()[c.whole.leaves()]  # [L] each leaf's prompt group
    total = weighted_sum(scores, c.weights)
    leaves = int(total.numel())
    row: dict[str, Any] = {
        "iteration": it,
        "reward_mean": float(total.mean()),
        "reward_std": float(total.std()) if total.numel() > 1 else 0.0,
        # the leaves' extremes: reward.png's std band stays inside them
        "reward_min": float(total.min()) if leaves else float("nan"),
        "reward_max": float(total.max()) if leaves else float("nan"),
        **group_spread(total, group),
    }
    for n, s in scores.items():
        row[f"rewards/{n}/mean"], row[f"rewards/{n}/std"] = float(s.mean()), float(s.std()) if s.numel() > 1 else 0.0
    a = adv_trained.float()
    row.update(
        {
            "adv_mean": float(a.mean()) if a.numel() else 0.0,
            "adv_std": float(a.std()) if a.numel() > 1 else 0.0,
            "adv_abs_max": float(a.abs().max()) if a.numel() else 0.0,
            "trained_edges": int(a.numel()),
            "leaves": leaves,
            "rollout_evals": nfe,
            "rollout_evals_per_leaf": nfe / leaves,
            "train_evals_per_leaf": upd.get("train_evals", 0) / leaves,
            "lr": lr,
            "sde_steps": list(sde_steps) if sde_steps is not None else "all",
        }
    )
    row.update(upd)
    return cast(MetricsRow, row)  # in the order metrics.jsonl has always held


def throughput(row: MetricsRow, per_row: tuple[int, int] | None, extra: int, peak: float | None) -> dict[str, float]:
    """Milliseconds per image of each phase and images per second of the iteration, from row["seconds"]; model
    FLOPs utilisation of the rollout and the update where the device's peak FLOP/s is known."""
    sec, images = row["seconds"], max(int(row.get("leaves", 0)), 1)
    phases = {"rollout": sec["rollout"], "score": sec["score"], "update": sec["update"]}
    out = {f"ms_per_image/{k}": 1000 * s / images for k, s in phases.items()}
    out["images_per_second"] = images / sec["total"] if sec["total"] > 0 else 0.0
    if peak and per_row:
        fwd, bwd = per_row
        done = {
            "rollout": row.get("rollout_evals", 0) * fwd,
            "update": row.get("train_evals", 0) * (fwd + bwd + extra * fwd),
        }
        out.update({f"mfu/{k}": f / (phases[k] * peak) for k, f in done.items() if phases[k] > 0})
    return out


def iteration_flops(per_row: tuple[int, int] | None, rollout_evals: float, train_evals: float, extra: int = 0) -> int:
    """Denoiser FLOPs of an iteration, from the evaluations it ran and the model's per-row count
    (models/flops.py): each rollout evaluation a forward, each training evaluation a forward and a
    backward, plus `extra` forwards beside each (the reference's when a KL term is on, NFT's old policy).
    0 where the policy cannot say."""
    if per_row is None:
        return 0
    fwd, bwd = per_row
    return int(rollout_evals * fwd + train_evals * (fwd + bwd + extra * fwd))

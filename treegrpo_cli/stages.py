"""The staged pipeline as library calls: rollout -> trees on disk, score -> rewards and advantages.

Each command of the CLI calls one function here. Nothing here prints: progress goes through a
callback `progress(phase, done, total)`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from PIL import Image

from . import rundir
from .config import Config, as_json, config_from_dict
from .engine.advantages import AdvantageConfig
from .engine.credit import assign_credit
from .engine.grpo import Batch, grpo_update
from .engine.tree import cat_trees
from .errors import TreegrpoError
from .loop import Trainer
from .engine.pruning import PruneConfig
from .engine.rollout import Progress, rollout
from .engine.sde import make_kernel
from .models.registry import load_policy
from .prompts import take
from .rewards.base import get_reward, score_leaves
from .store.checkpoint import save_checkpoint
from .store.shards import ShardStore
from .store.trees import KIND, TreeShard, open_trees, read_tree_shard, shard_name, to_uint8, write_tree_shard



def _noop(phase: str, done: int, total: int) -> None:
    pass


# --- rollout ---------------------------------------------------------------------------------

@dataclass
class RolloutRequest:
    config: Config
    prompts: list[str]
    out: Path
    num_prompts: int = 4
    prompts_per_shard: int = 8
    save_images: bool = False
    overwrite: bool = False
    device: str = "cpu"
    command: str = ""


def run_rollout(req: RolloutRequest, progress: Progress = _noop) -> dict[str, Any]:
    """Roll out trees for num_prompts prompts and write them as shards under req.out."""
    cfg = req.config
    policy = load_policy(cfg.model, req.device, cfg.policy)
    sde = make_kernel(policy, cfg.sampler)
    ids = take(req.prompts, req.num_prompts)
    meta = {"command": req.command, "config": cfg.to_dict(), "model": policy.describe(),
            "seed": cfg.seed, "num_prompts": len(ids), "trees_per_prompt": cfg.tree.trees_per_prompt,
            "evals_per_tree": cfg.tree.model_evals(cfg.sampler.steps) * policy.evals_per_row, "complete": False}
    store = ShardStore.create(req.out, KIND, meta, overwrite=req.overwrite)
    nfe, offset, chunks = 0, 0, range(0, len(ids), req.prompts_per_shard)
    for k, a in enumerate(chunks):
        chunk = ids[a:a + req.prompts_per_shard]
        tree, n = rollout(policy, [req.prompts[i] for i in chunk], chunk, sde, cfg.tree, cfg.seed,
                          cfg.rollout.max_batch, lambda ph, d, t: progress(f"rollout {k + 1}/{len(chunks)}", d, t))
        images = to_uint8(policy.decode(tree.image_latent))
        shard = TreeShard(k, tree, images, {i: req.prompts[i] for i in chunk}, offset, n)
        write_tree_shard(store, shard)
        if req.save_images:
            _save_images(req.out / "images", shard)
        nfe, offset = nfe + n, offset + tree.num_trees
    store.update_meta(nfe=nfe, num_trees=offset, complete=True)
    return {"out": str(req.out), "trees": offset, "shards": len(chunks), "nfe": nfe,
            "nfe_per_tree": nfe / max(offset, 1), "leaves_per_tree": cfg.tree.leaves(cfg.sampler.steps)}


def _save_images(folder: Path, s: TreeShard) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    leaves = s.tree.leaves()
    for j, node in enumerate(leaves.tolist()):
        t = s.tree_offset + int(s.tree.tree[node])
        Image.fromarray(s.leaf_image[j].permute(1, 2, 0).numpy()).save(folder / f"tree{t:05d}-node{node:05d}.png")


# --- score -----------------------------------------------------------------------------------

@dataclass
class ScoreRequest:
    root: Path
    rewards: dict[str, float]               # name -> weight
    combine: str = "rewards"
    advantage: AdvantageConfig | None = None  # None: the rollout preset's estimator
    pruning: PruneConfig | None = None
    iteration: int = 0
    max_iterations: int = 1
    batch_size: int = 64


def run_score(req: ScoreRequest, progress: Progress = _noop) -> dict[str, Any]:
    """Score every leaf, then write rewards, advantages and trained-edge masks beside the trees."""
    store = open_trees(req.root)
    cfg = config_from_dict(store.meta["config"])
    adv_cfg, prune_cfg = req.advantage or cfg.advantage, req.pruning or cfg.pruning
    adv_cfg.validate(), prune_cfg.validate()
    rewards = {name: get_reward(name) for name in req.rewards}
    shards = [read_tree_shard(store, n) for n in store.names("trees")]
    scores = [_score_shard(s, rewards, req.batch_size, progress) for s in shards]
    store.remove("rewards"), store.remove("advantages")
    for s, sc in zip(shards, scores):
        total = sum(w * sc[name] for name, w in req.rewards.items())
        tensors = {f"reward/{k}": v for k, v in sc.items()} | {"reward": total}
        store.write(shard_name("rewards", s.index), "rewards", tensors, {"weights": req.rewards})
    adv = _advantages(shards, scores, req, adv_cfg, prune_cfg, cfg)
    for s, a in zip(shards, adv):
        store.write(shard_name("advantages", s.index), "advantages", a)
    scoring = {"rewards": req.rewards, "combine": req.combine, "advantage": as_json(adv_cfg),
               "pruning": as_json(prune_cfg), "iteration": req.iteration, "max_iterations": req.max_iterations}
    store.update_meta(scoring=scoring)
    leaf_r = torch.cat([sum(w * sc[n] for n, w in req.rewards.items())[s.tree.leaves()] for s, sc in zip(shards, scores)])
    trained = sum(int(a["trained"].sum()) for a in adv)
    return {"leaves": int(leaf_r.numel()), "reward_mean": float(leaf_r.mean()),
            "reward_std": float(leaf_r.std()) if leaf_r.numel() > 1 else 0.0,
            "trained_edges": trained, "estimator": adv_cfg.estimator}


def _score_shard(s: TreeShard, rewards: dict, batch: int, progress: Progress) -> dict[str, torch.Tensor]:
    """{name: [N] float32 with the score on leaves and NaN elsewhere}."""
    leaves = s.tree.leaves()
    scores = score_leaves(rewards, s.leaf_image, s.leaf_prompts(), batch, progress)
    out = {}
    for name, vals in scores.items():
        full = torch.full((s.tree.num_nodes,), float("nan"))
        full[leaves] = vals
        out[name] = full
    return out


def _advantages(shards: list[TreeShard], scores: list[dict], req: ScoreRequest, adv_cfg: AdvantageConfig,
                prune_cfg: PruneConfig, cfg: Config) -> list[dict[str, torch.Tensor]]:
    """Advantages over all shards at once (groups and global statistics span the folder)."""
    parent, depth, tree, group, lp, sde, sizes = [], [], [], [], [], [], []
    node_off = 0
    for s in shards:
        t = s.tree
        parent.append(torch.where(t.parent >= 0, t.parent + node_off, t.parent))
        depth.append(t.depth), tree.append(t.tree + s.tree_offset), group.append(t.group())
        lp.append(t.log_prob), sde.append(t.sde), sizes.append(t.num_nodes)
        node_off += t.num_nodes
    P, D, TR, G, LP, SDE = (torch.cat(x) for x in (parent, depth, tree, group, lp, sde))
    R = {name: torch.cat([sc[name] for sc in scores]) for name in req.rewards}
    A, trained = assign_credit(P, D, TR, G, SDE, LP, R, req.rewards, req.combine, adv_cfg, prune_cfg,
                               cfg.sampler.steps, cfg.sampler.decode, req.iteration, req.max_iterations)
    out, a = [], 0
    for n in sizes:
        sl = slice(a, a + n)
        out.append({"advantage": A.edge[sl], "valid": A.valid[sl], "trained": trained[sl],
                    "fused": A.fused[sl], "leaf_advantage": A.leaf[sl]})
        a += n
    return out


# --- one staged update -----------------------------------------------------------------------

@dataclass
class StagedRequest:
    trees: Path              # a scored tree folder
    run_dir: Path
    sets: list[str]
    device: str = "cpu"
    command: str = ""


def train_from_trees(req: StagedRequest, progress: Progress = _noop) -> dict[str, Any]:
    """One GRPO update from scored shards (rollout + score), written as checkpoint step-1 of a run."""
    store = open_trees(req.trees)
    if "scoring" not in store.meta:
        raise TreegrpoError(f"{req.trees} is not scored yet; run `treegrpo score {req.trees}` first")
    cfg = config_from_dict(store.meta["config"], req.sets)
    shards = [read_tree_shard(store, n) for n in store.names("trees")]
    adv = [store.read(shard_name("advantages", s.index))[0] for s in shards]
    tree = cat_trees([s.tree for s in shards])
    prompts = [s.prompts[int(p)] for s in shards for p in s.tree.tree_prompt]
    trainer = Trainer(cfg, req.device)
    rundir.create(req.run_dir, cfg, req.command)
    batch = Batch(tree, torch.cat([a["trained"] for a in adv]), torch.cat([a["advantage"] for a in adv]),
                  trainer.policy.encode(prompts))
    gen = torch.Generator().manual_seed(cfg.seed)
    progress("update", 0, 1)
    metrics = grpo_update(trainer.policy, trainer.opt, trainer.sde, batch, cfg.train, gen,
                          cfg.rollout.max_batch, trainer.ref, trainer.update_ema)
    progress("update", 1, 1)
    trainer.step = 1
    leaves = int(tree.is_leaf().sum())
    rundir.append_metrics(req.run_dir, {"iteration": 0, "source": str(req.trees), "leaves": leaves,
                                        "train_evals_per_leaf": metrics.get("train_evals", 0) / leaves, **metrics})
    path = save_checkpoint(req.run_dir / "checkpoints", trainer.checkpoint({"config": cfg.to_dict()}), cfg.train.keep_last)
    return {"run_dir": str(req.run_dir), "checkpoint": str(path), **metrics}

"""The staged pipeline as library calls: rollout -> trees on disk, score -> rewards and advantages.

Each command of the CLI calls one function here. Nothing here prints: progress goes through a
callback `progress(phase, done, total)`.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from PIL import Image

from ..config import MAX_PROMPTS, Config, as_json, config_from_dict, parse_set
from ..engine.rollout import Progress, rollout
from ..engine.sde import make_kernel
from ..engine.tree import cat_trees
from ..errors import ConfigError, TreegrpoError
from ..models.registry import load_policy
from ..rewards.base import score_leaves, weighted_sum
from ..store import faults
from ..store.shards import ShardStore, atomic_write, sweep_temp
from ..store.trees import (
    IMAGES,
    KIND,
    TreeShard,
    TreeStore,
    open_trees,
    read_tree_shard,
    shard_name,
    write_tree_shard,
)
from . import rundir, runlock, runlog
from .sampling import build_rewards, leaf_images, make_judge
from .steps import Credited, credit, on_nodes, plan_iteration
from .trainer import Trainer


def _noop(phase: str, done: int, total: int) -> None:
    pass


# --- rollout ---------------------------------------------------------------------------------


@dataclass
class RolloutRequest:
    config: Config
    prompts: list[str]
    out: Path
    num_prompts: int | None = None  # None: the config's rollout.num_prompts, as `train` draws them
    prompts_per_shard: int = 8
    save_images: bool = False
    overwrite: bool = False
    device: str = "cpu"
    command: str = ""
    iteration: int = 0  # write the trees the online loop samples at this iteration


def _labelled(progress: Progress, label: str) -> Progress:
    """progress reporting under one phase label."""
    return lambda phase, done, total: progress(label, done, total)


def run_rollout(req: RolloutRequest, progress: Progress = _noop) -> dict[str, Any]:
    """Roll out the trees of one online iteration (its prompts, [schedule] and noise) as shards under req.out."""
    cfg = req.config
    if req.iteration < 0:
        raise TreegrpoError(f"--iteration must be >= 0, got {req.iteration}")
    if req.num_prompts is not None and req.num_prompts < 1:
        raise TreegrpoError(f"--num-prompts must be >= 1, got {req.num_prompts}")
    if req.num_prompts is not None and req.num_prompts > MAX_PROMPTS:
        raise TreegrpoError(f"--num-prompts {req.num_prompts:,} is more than the maximum of {MAX_PROMPTS:,} prompts")
    if not req.prompts:
        raise TreegrpoError("no prompts to roll out")
    policy = load_policy(cfg.model, req.device, cfg.policy)
    cfg.check_tree_memory(tuple(policy.latent_shape), req.prompts_per_shard)  # one shard is in memory at once
    sde = make_kernel(policy, cfg.sampler)
    plan = plan_iteration(cfg, len(req.prompts), req.iteration, req.num_prompts)
    ids, T = plan.prompt_ids, cfg.sampler.steps
    meta = {
        "command": req.command,
        "config": cfg.to_dict(),
        "model": policy.describe(),
        "seed": cfg.seed,
        "iteration": req.iteration,
        "num_prompts": len(ids),
        "trees_per_prompt": plan.tree.trees_per_prompt,
        "split_steps": list(plan.tree.split_steps),
        "sde_steps": list(plan.tree.sde_steps) if plan.tree.sde_steps is not None else "all",
        "evals_per_tree": plan.tree.model_evals(T) * policy.evals_per_row,
        "complete": False,
    }
    TreeStore.check_target(req.out, req.overwrite)  # before the lock creates the folder: never in a foreign one
    with runlock.lock(req.out, create=True):  # one writer per tree folder
        return _write_rollout(req, policy, sde, plan, meta, progress)


def _write_rollout(
    req: RolloutRequest, policy: Any, sde: Any, plan: Any, meta: dict[str, Any], progress: Progress
) -> dict[str, Any]:
    cfg, ids, T = req.config, plan.prompt_ids, req.config.sampler.steps
    rewards = build_rewards(cfg.reward, req.device) if cfg.tree.dynamic == "reward" else {}
    judge = make_judge(cfg.tree, cfg.reward, policy, rewards)  # tree.dynamic = "reward" scores x0-predictions
    store = TreeStore.create(req.out, KIND, meta, overwrite=req.overwrite)  # a killed rollout's folder: replaced
    nfe, offset, leaves, chunks = 0, 0, 0, range(0, len(ids), req.prompts_per_shard)
    repeats = max(Counter(ids).values()) * plan.tree.trees_per_prompt  # the most trees of one prompt
    written: dict[int, int] = {}  # prompt id -> leaf images written
    names: dict[str, str] = {}  # leaf image file -> its prompt
    digits = (max(2, len(str(len(req.prompts) - 1))), max(2, len(str(repeats * plan.tree.leaves(T) - 1))))
    for k, a in enumerate(chunks):
        chunk = ids[a : a + req.prompts_per_shard]
        tree, n = rollout(
            policy,
            [req.prompts[i] for i in chunk],
            chunk,
            sde,
            plan.tree,
            plan.seed,
            max_batch=cfg.rollout.max_batch,
            progress=_labelled(progress, f"rollout {k + 1}/{len(chunks)}"),
            earlier_ids=ids[:a],
            shapes=plan.shapes[a : a + req.prompts_per_shard] if plan.shapes else None,
            judge=judge,
        )
        shard = TreeShard(k, tree, leaf_images(policy, tree), {i: req.prompts[i] for i in chunk}, offset, n)
        write_tree_shard(store, shard)
        if req.save_images:
            _save_images(req.out / IMAGES, shard, written, *digits, names)
        faults.point("rollout.shard")
        nfe, offset, leaves = nfe + n, offset + tree.num_trees, leaves + int(tree.is_leaf().sum())
    if req.save_images:  # the image -> prompt map `eval --images` reads
        atomic_write(req.out / IMAGES / "prompts.json", (json.dumps(names, indent=1) + "\n").encode())
    store.update_meta(nfe=nfe, num_trees=offset, complete=True)  # last: the folder is whole
    return {
        "out": str(req.out),
        "trees": offset,
        "shards": len(chunks),
        "nfe": nfe,
        "iteration": req.iteration,
        "nfe_per_tree": nfe / max(offset, 1),
        "leaves_per_tree": plan.tree.leaves(T) if leaves == offset * plan.tree.leaves(T) else round(leaves / offset, 2),
        "prompts_given": len(req.prompts),
        "num_prompts": len(ids),
        "distinct_prompts": len(set(ids)),
        "trees_per_prompt": plan.tree.trees_per_prompt,
        "most_trees_of_a_prompt": repeats,
    }


SLUG_CHARS = 40  # the most characters of a prompt in a leaf image's name


def slug(prompt: str, most: int = SLUG_CHARS) -> str:
    """The prompt as a file name's part: lower-case ASCII letters and digits, runs of anything else one '-',
    at most `most` characters ('prompt' when nothing is left)."""
    text = re.sub(r"[^a-z0-9]+", "-", prompt.lower().encode("ascii", "ignore").decode()).strip("-")
    return text[:most].rstrip("-") or "prompt"


def leaf_image_name(prompt_id: int, prompt: str, leaf: int, id_digits: int = 2, leaf_digits: int = 2) -> str:
    """p<prompt id>-<prompt slug>-leaf<the prompt's leaf number>.png, e.g. p00-a-red-fox-leaf03.png."""
    return f"p{prompt_id:0{id_digits}d}-{slug(prompt)}-leaf{leaf:0{leaf_digits}d}.png"


def _save_images(
    folder: Path, s: TreeShard, counts: dict[int, int], id_digits: int, leaf_digits: int, names: dict[str, str]
) -> None:
    """Each leaf as a PNG named by its prompt and its number among that prompt's leaves so far (`counts`: prompt
    id -> leaves written, over every shard; a prompt drawn again, or with several trees, keeps counting); `names`
    gets each file's prompt."""
    folder.mkdir(parents=True, exist_ok=True)
    for j, node in enumerate(s.tree.leaves().tolist()):
        pid = int(s.tree.tree_prompt[s.tree.tree[node]])
        k = counts.get(pid, 0)
        counts[pid] = k + 1
        name = leaf_image_name(pid, s.prompts[pid], k, id_digits, leaf_digits)
        Image.fromarray(s.leaf_image[j].permute(1, 2, 0).numpy()).save(folder / name)
        names[name] = s.prompts[pid]


# --- score -----------------------------------------------------------------------------------

SCORE_SECTIONS = ("reward", "advantage", "pruning")


@dataclass
class ScoreRequest:
    root: Path
    sets: list[str] = field(
        default_factory=list
    )  # reward.*, advantage.* and pruning.* overrides of the rollout's config
    iteration: int | None = None  # None: the rollout's iteration (pruning schedules)
    max_iterations: int | None = None  # None: the config's train.iterations (pruning.active_until)
    batch_size: int = 64
    device: str = "cpu"
    command: str = ""  # recorded while the pass runs: what to run again if it is killed


def scoring_config(store: ShardStore, sets: list[str]) -> Config:
    """The rollout's config with score-time overrides; keys that change the trees or training are refused."""
    for item in sets:
        key = parse_set(item)[0]
        if key.split(".")[0] not in SCORE_SECTIONS:
            raise ConfigError(
                f"score cannot change {key}: it only sets {', '.join(s + '.*' for s in SCORE_SECTIONS)} "
                "(roll out again to change the trees, or pass training keys to `treegrpo train --trees`)"
            )
    return config_from_dict(store.meta["config"], sets)


def run_score(req: ScoreRequest, progress: Progress = _noop) -> dict[str, Any]:
    """Score every leaf with the config's rewards (options, device), then write rewards, advantages and
    trained-edge masks beside the trees: the online loop's scoring and credit assignment, over all shards.
    One writer per tree folder: a second score (or a rollout) of the same folder is refused while it runs."""
    open_trees(req.root, scores=False)  # a whole rollout, before its lock file is made; rescoring is allowed
    with runlock.lock(req.root):
        return _score_locked(req, progress)


def _score_locked(req: ScoreRequest, progress: Progress) -> dict[str, Any]:
    store = open_trees(req.root, scores=False)
    sweep_temp(req.root)  # what a killed score left besides its record
    cfg = scoring_config(store, req.sets)
    it = store.meta.get("iteration", 0) if req.iteration is None else req.iteration
    if req.max_iterations is not None:
        cfg = replace(cfg, train=replace(cfg.train, iterations=req.max_iterations))
    cfg.advantage.validate()
    cfg.pruning.validate()
    weights, rewards = cfg.reward.weight_map(), build_rewards(cfg.reward, req.device)
    shards = [read_tree_shard(store, n) for n in store.names("trees")]
    scores = [score_leaves(rewards, s.leaf_image, s.leaf_prompts(), req.batch_size, progress) for s in shards]
    tree = cat_trees([s.tree for s in shards])
    adv, trained = credit(cfg, tree, {n: torch.cat([sc[n] for sc in scores]) for n in weights}, it)
    # the earlier scoring record goes before its shards do; the new one comes after the last new shard
    store.update_meta("scoring", scoring_pass=req.command or f"treegrpo score {req.root}")
    faults.point("score.cleared")
    _write_scores(store, shards, scores, weights, adv, trained)
    store.update_meta(
        "scoring_pass",
        scoring={
            "rewards": weights,
            "combine": cfg.reward.combine,
            "options": list(cfg.reward.options),
            "advantage": as_json(cfg.advantage),
            "pruning": as_json(cfg.pruning),
            "sets": list(req.sets),
            "iteration": it,
            "max_iterations": cfg.train.iterations,
        },
    )
    leaf_r = torch.cat([weighted_sum(sc, weights) for sc in scores])
    return {
        "leaves": int(leaf_r.numel()),
        "reward_mean": float(leaf_r.mean()),
        "reward_std": float(leaf_r.std()) if leaf_r.numel() > 1 else 0.0,
        "trained_edges": int(trained.sum()),
        "estimator": cfg.advantage.estimator,
    }


def _write_scores(store, shards: list, scores: list[dict[str, torch.Tensor]], weights: dict, adv, trained) -> None:
    """Each tree shard's rewards (every node's, per reward and weighted) and advantages, in place of any earlier."""
    store.remove("rewards")
    store.remove("advantages")
    a = 0
    for s, sc in zip(shards, scores, strict=True):
        full = on_nodes(s.tree, sc)
        tensors = {f"reward/{k}": v for k, v in full.items()} | {"reward": weighted_sum(full, weights)}
        store.write(shard_name("rewards", s.index), "rewards", tensors, {"weights": weights})
        sl = slice(a, a + s.tree.num_nodes)  # this shard's nodes in the concatenated tree
        advantages = {
            "advantage": adv.edge[sl],
            "valid": adv.valid[sl],
            "trained": trained[sl],
            "fused": adv.fused[sl],
            "leaf_advantage": adv.leaf[sl],
        }
        store.write(shard_name("advantages", s.index), "advantages", advantages)
        faults.point("score.shard")
        a += s.tree.num_nodes


# --- one staged update -----------------------------------------------------------------------


@dataclass
class StagedRequest:
    trees: Path  # a scored tree folder
    run_dir: Path
    sets: list[str]
    device: str = "cpu"
    command: str = ""


def train_from_trees(req: StagedRequest, progress: Progress = _noop) -> dict[str, Any]:
    """One update (GRPO, or NFT with train.objective = nft) from scored shards (rollout + score), through the
    online iteration's update path (Trainer.learn, its metrics row, Trainer.save), written as checkpoint step-1
    of a run: the run's iteration 0, its trees those the rollout sampled at its --iteration."""
    store = open_trees(req.trees)
    if "scoring" not in store.meta:
        raise TreegrpoError(f"{req.trees} is not scored yet; run `treegrpo score {req.trees}` first")
    cfg = staged_config(store, req.sets)
    c, prompts = credited_trees(store)
    trainer = Trainer(cfg, req.device)
    with runlock.lock(req.run_dir, create=True):  # one writer per run folder
        rundir.create(req.run_dir, cfg, req.command)
        # the old policy of an NFT update is the one that rolled the trees out: the start
        row = trainer.learn(c, prompts, store.meta.get("iteration", 0), progress)
        trainer.step = 1
        row["iteration"] = 0  # the run's first update, whatever iteration's seeds its trees have
        row["source"] = str(req.trees)
        runlog.append_metrics(req.run_dir, row)
        path = trainer.save(req.run_dir)
    return {"run_dir": str(req.run_dir), "checkpoint": str(path), **row}


TRAIN_SECTIONS = ("train", "nft", "awm", "dgpo", "policy")
TRAIN_KEYS = ("rollout.max_batch", "name", "description")


def staged_config(store: ShardStore, sets: list[str]) -> Config:
    """The rollout's config with `train --trees` overrides: keys that would change the trees, their scores or
    their seeds cannot apply to trees already rolled out and scored, and are refused rather than ignored."""
    for item in sets:
        key = parse_set(item)[0]
        if key.split(".")[0] not in TRAIN_SECTIONS and key not in TRAIN_KEYS:
            raise ConfigError(
                f"train --trees cannot change {key}: the trees were rolled out and scored with it; it only sets "
                f"{', '.join(s + '.*' for s in TRAIN_SECTIONS)} and {TRAIN_KEYS[0]} (roll out again to change the "
                "trees, or score again for reward.*, advantage.*, pruning.*)"
            )
    return config_from_dict(store.meta["config"], sets)


def staged_warnings(trees: Path, sets: list[str]) -> list[str]:
    """What `train --trees` has to warn about: the warnings its overrides add to those the rollout printed."""
    store = open_trees(trees)
    return staged_config(store, sets).new_warnings(config_from_dict(store.meta["config"]))


def credited_trees(store: ShardStore) -> tuple[Credited, list[str]]:
    """A scored tree folder's trees, leaf scores and advantages as one batch (one process), and each tree's
    prompt."""
    shards = [read_tree_shard(store, n) for n in store.names("trees")]
    rewards = [store.read(shard_name("rewards", s.index))[0] for s in shards]
    adv = [store.read(shard_name("advantages", s.index))[0] for s in shards]
    tree = cat_trees([s.tree for s in shards])
    weights = {n: float(w) for n, w in store.meta["scoring"]["rewards"].items()}
    pairs = list(zip(shards, rewards, strict=True))
    scores = {n: torch.cat([r[f"reward/{n}"][s.tree.leaves()] for s, r in pairs]) for n in weights}  # {name: [L]}

    def cat(key: str) -> torch.Tensor:
        return torch.cat([a[key] for a in adv])

    steps = store.meta["sde_steps"]
    c = Credited(
        tree=tree,
        whole=tree,
        starts=[0, tree.num_nodes],
        scores=scores,
        weights=weights,
        edge=cat("advantage"),
        trained=cat("trained"),
        leaf=cat("leaf_advantage"),
        nfe=int(store.meta["nfe"]),
        sde_steps=None if steps == "all" else tuple(steps),
    )
    return c, [s.prompts[int(p)] for s in shards for p in s.tree.tree_prompt]

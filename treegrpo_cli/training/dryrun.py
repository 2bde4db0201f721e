"""`treegrpo train --dry-run`: what a run would use and what it costs, resolved without loading any weights.

The config and its layers, the prompts (how many, an iteration, a process), the rewards, and the pre-flight of
training/needs.py (every missing model file or reward weight named); then one iteration's ledger and the memory a
process needs, so a user knows before a download whether the job fits their cards.

The ledger is the training's own: iteration 0's plan (steps.plan_iteration: prompts, the preset's tree shape, its
window under a schedule, per-prompt budgets), rolled out by engine/rollout.py with a stand-in policy of no cost (a
one-number latent, zero velocity, the real model's network rows per latent row), credited by steps.credit on untied
random scores and minibatched by engine/grpo.py: the rollout's forwards, the trained edges and the update's
evaluations are counted by the same code that counts them in metrics.jsonl. Denoiser FLOPs follow with the model's
per-row count (models/estimate.py) and steps.iteration_flops. Rewards can only lower the trained edges (tied groups
under pruning.skip_zero_advantage; tree.dynamic = "reward" stops trees early): the counts are what the rewards allow
at most.

Memory per process (GB = 1e9 bytes) is arithmetic, as bench/model_memory.py and docs/models.md's table: frozen weights
in the compute dtype (policy.dtype; auto counted as bf16, what it is on CUDA); LoRA adapters or a fully trained
denoiser in fp32 with their gradients and Adam's two moments (16 bytes a parameter), the EMA (4), the KL reference
of a full fine-tune (the compute dtype), NFT's sampling policy (4); FSDP shards a full fine-tune's state over the
processes; text encoders until policy.free_text_encoders frees them. Activations come on top (they grow with the
resolution and rollout.max_batch; gradient checkpointing cuts them). The rollout's tree latents are host memory.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, cast

import torch
from torch import Tensor, nn

from ..config import Config
from ..engine.protocols import Policy
from ..errors import TreegrpoError
from ..models.estimate import Cost

GB = 1e9


def dry_run(preset: str | None, config_file: Path | None, sets: list[str], resume: Path | None, nproc: int) -> dict:
    """The dry run's report (JSON-able); report["missing"] lists what the run lacks (empty: it can start)."""
    from ..config import config_layers, load_config, user_warnings
    from . import dist, needs, resumecheck, rundir

    world = nproc if nproc > 1 else int(os.environ.get("WORLD_SIZE", "1") or 1)
    if resume is not None:
        cfg = resumecheck.resume_config(resume, sets)
        layers: list[dict[str, Any]] = [{"layer": f"the run's own config ({resume})", "keys": None}]
        layers += [{"layer": "--set", "keys": len(sets)}] if sets else []
        warnings = cfg.new_warnings(rundir.load_config(resume))
    else:
        cfg = load_config(preset, config_file, sets)
        named = config_layers(preset, config_file, sets)
        layers = [{"layer": name, "keys": len(values)} for name, values in named if values]
        warnings = user_warnings(cfg, named)
    n = cfg.rollout.num_prompts if resume is not None else dist.scaled_prompts(cfg.rollout.num_prompts, world)
    missing = [str(e) for e in needs.train_missing(cfg)]
    prompts, problem = _prompt_counts(cfg)
    missing += [problem] if problem else []
    if n % world:
        missing.append(f"rollout.num_prompts = {n} must be divisible by the {world} processes")
    report: dict[str, Any] = {
        "run": cfg.name,
        "model": cfg.model,
        "weights": f"{cfg.policy.weights} weights" + (f", {cfg.policy.size} size" * (cfg.policy.weights == "random")),
        "config_layers": layers,
        "warnings": warnings,
        "rewards": list(cfg.reward.names),
        "prompts": {**prompts, "per_iteration": n, "per_process": n // world},
        "processes": world,
        "iterations": cfg.train.iterations,
    }
    report.update(_costs(cfg, n, world, prompts.get("train", 0) or n))
    return {**report, "missing": missing}


def _prompt_counts(cfg: Config) -> tuple[dict[str, Any], str | None]:
    """The training and held-out prompt lists and their sizes, or the one line that says why they cannot be read."""
    from ..prompts import run_prompts

    r = cfg.rollout
    out: dict[str, Any] = {"train_source": r.prompts, "eval_source": r.eval_prompts}
    try:
        train, held_out = run_prompts(r.prompts, r.eval_prompts, r.eval_split, cfg.seed)
    except TreegrpoError as e:
        return out, str(e)
    return {**out, "train": len(train), "eval": len(held_out)}, None


def _costs(cfg: Config, n: int, world: int, available: int) -> dict[str, Any]:
    """The model's cost, iteration 0's ledger and FLOPs, and the memory a process needs (None where the model cannot
    be estimated without loading it)."""
    from ..models.estimate import cost as model_cost
    from ..models.estimate import describe

    try:
        c = model_cost(cfg.model, cfg.policy)
    except TreegrpoError:  # an unknown model, a missing or foreign file: the missing list names it
        c = None
    if c is None:
        return {"model_cost": None, "iteration": None, "memory": None}
    ledger = iteration_ledger(cfg, available, n, c.evals_per_row)
    extra = int(cfg.train.kl_beta > 0) + _own_forwards(cfg) + _dgpo_forwards(cfg)  # the reference's, the update's
    flops = _iteration_flops(c.row_flops, ledger["rollout_evals"], ledger["train_evals"], extra)
    ledger.update(flops=flops, denoiser_tflops=None if flops is None else flops / 1e12)
    return {"model_cost": describe(c), "iteration": ledger, "memory": memory(cfg, c, world, n)}


def _own_forwards(cfg: Config) -> int:
    """Forwards of the update's own beside each trained one, each of a copy of the trained weights: NFT's old
    policy, AWM's anchor, DGPO's old policy (engine/update.py Update.extra_forwards; DGPO's no-gradient forward of
    the trained weights and its own initial policy's are in _dgpo_forwards)."""
    d = cfg.dgpo
    dgpo = cfg.train.objective == "dgpo" and (d.clip_range > 0 or d.reference == "old")
    return int(cfg.train.objective == "nft" or (cfg.train.objective == "awm" and cfg.awm.anchor_beta > 0) or dgpo)


def _dgpo_forwards(cfg: Config) -> int:
    """DGPO's forwards beside each trained one that are not of a copy (engine/dgpo.py DGPOUpdate.extra_forwards): the
    trained weights' without gradients, and its own initial policy's when no KL reference is kept."""
    if cfg.train.objective != "dgpo":
        return 0
    return 1 + int(cfg.dgpo.reference == "initial" and cfg.train.kl_beta <= 0)


def _iteration_flops(row: tuple[int, int] | None, rollout_evals: int, train_evals: int, extra: int) -> int | None:
    from .steps import iteration_flops

    return None if row is None else iteration_flops(row, rollout_evals, train_evals, extra)


class Shadow:
    """A policy of no cost with a model's network rows per latent row: a one-number latent and zero velocity, so
    that the engine's rollout builds an iteration's trees (their shape, not their values) in no time. It has what
    `engine.rollout.rollout` reads of a policy (latent_shape, trainable_parameters, encode, velocity,
    evals_per_row), nothing more."""

    name = "shadow"
    latent_shape = (1, 1, 1)

    def __init__(self, evals_per_row: int):
        self.evals_per_row = evals_per_row
        self.p = nn.Parameter(torch.zeros(()))

    def encode(self, prompts: list[str]) -> dict[str, Tensor]:
        return {"rows": torch.zeros(len(prompts), 1)}

    def velocity(self, x: Tensor, sigma: Tensor, cond: dict[str, Tensor]) -> Tensor:
        return torch.zeros_like(x)

    def trainable_parameters(self) -> list[nn.Parameter]:
        return [self.p]


def iteration_ledger(cfg: Config, available: int, num_prompts: int, evals_per_row: int, it: int = 0) -> dict[str, Any]:
    """Iteration `it`'s counts over every process: rollout forwards (model evaluations), leaves, trained edges and
    the update's model evaluations, from the training's own plan, rollout, credit and minibatches."""
    from ..engine.rollout import rollout
    from ..engine.sde import FlowSDE
    from .steps import credit, plan_iteration

    plan = plan_iteration(cfg, available, it, num_prompts)
    gen = torch.Generator().manual_seed(0)
    judge = (lambda x0, prompts: torch.rand(len(prompts), generator=gen)) if plan.tree.dynamic == "reward" else None
    names = [f"prompt {i}" for i in plan.prompt_ids]
    sde = FlowSDE(cfg.sampler)
    shadow = Shadow(evals_per_row)
    tree, nfe = rollout(
        cast(Policy, shadow), names, plan.prompt_ids, sde, plan.tree, plan.seed, shapes=plan.shapes, judge=judge
    )
    leaves = int(tree.is_leaf().sum())
    scores = {name: torch.rand(leaves, generator=gen) for name in cfg.reward.names}  # untied: no group is dropped
    adv, trained = credit(cfg, tree, scores, it)
    if cfg.train.objective == "nft":  # every leaf at the trained noise levels (engine/nft.py)
        edges, train_evals = leaves, leaves * cfg.nft.trained_levels(cfg.sampler.steps)
    elif cfg.train.objective == "awm":  # every leaf at awm.levels noise levels (engine/awm.py)
        edges, train_evals = leaves, leaves * cfg.awm.levels
    elif cfg.train.objective == "dgpo":  # every leaf at dgpo.levels noise levels (engine/dgpo.py)
        edges, train_evals = leaves, leaves * cfg.dgpo.levels
    else:
        edges, train_evals = int(trained.sum()), _update_evals(cfg, tree, trained, adv.edge, it) * evals_per_row
    ledger: dict[str, Any] = {"iteration": it, "rollout_evals": nfe, "leaves": leaves}
    return {**ledger, "trained_edges": edges, "train_evals": train_evals, "rewards_may_lower": _lowered_by(cfg, plan)}


def _lowered_by(cfg: Config, plan: Any) -> list[str]:
    """What the rewards of a real iteration can lower these counts by (none: they are exact)."""
    out = ["tree.dynamic = reward stops trees early"] if plan.tree.dynamic == "reward" else []
    if cfg.train.objective not in ("nft", "awm", "dgpo") and cfg.pruning.skip_zero_advantage:
        out.append("edges of zero advantage (a tied prompt group) are not trained")
    return out


def _update_evals(cfg: Config, tree: Any, trained: Tensor, advantage: Tensor, it: int) -> int:
    """Forwards of a GRPO update: one per distinct parent of each minibatch's trained edges (engine/grpo.py)."""
    from ..engine.grpo import Batch, minibatches
    from .steps import update_generator

    plan = minibatches(Batch(tree, trained, advantage, {}), cfg.train, update_generator(cfg, it))
    return sum(len(torch.unique(tree.parent[mb])) for mb in plan)


def memory(cfg: Config, c: Cost, world: int, num_prompts: int) -> dict[str, Any]:
    """GB a process holds for weights, trained state and text encoders (no activations), and the rollout's tree
    latents (host memory) for its share of the prompts."""
    p = cfg.policy
    dtype = c.dtype or ("fp32" if p.dtype == "fp32" else "bf16")
    b = 4 if dtype == "fp32" else 2
    sharded = cfg.train.parallel == "fsdp" and world > 1
    parts: dict[str, float] = {"frozen weights": (0 if c.full else c.denoiser * b) + c.autoencoder * b}
    copy = max(_own_forwards(cfg), int(cfg.train.objective == "dgpo"))  # NFT's, DGPO's old policy, AWM's anchor
    state = 16 + 4 * (cfg.train.ema_decay > 0) + 4 * copy
    parts["trained weights and optimizer"] = c.trained * state / (world if sharded and c.full else 1)
    own_ref = cfg.train.objective == "dgpo" and cfg.dgpo.reference == "initial"  # DGPO keeps one without KL too
    parts["KL reference"] = c.denoiser * b if c.full and (cfg.train.kl_beta > 0 or own_ref) else 0
    parts["text encoders"] = c.text_encoders * b
    gb = {k: v / GB for k, v in parts.items()}
    rest = gb["frozen weights"] + gb["KL reference"]
    text, train = gb["text encoders"], gb["trained weights and optimizer"]
    peak = rest + (max(text, train) if p.free_text_encoders else text + train)
    nodes, _ = cfg.rollout_nodes(max(num_prompts // world, 1))
    tree_gib = nodes * math.prod(c.latent_shape) * 4 / 2**30
    return {"peak_gb_per_process": peak, "dtype": dtype, "parts_gb": gb, "fsdp": sharded, "tree_latents_gib": tree_gib}


def lines(r: dict[str, Any]) -> list[str]:
    """The report as the lines the CLI prints."""
    p = r["prompts"]
    counts = f"{p['train']} training, {p['eval']} held out" if "train" in p else "not readable"
    out = [
        f"dry run of {r['run']}: model {r['model']} ({r['weights']}); nothing loaded, nothing downloaded",
        "config: " + " < ".join(_layer(x) for x in r["config_layers"]),
        *r["warnings"],
        f"rewards: {', '.join(r['rewards'])}",
        f"prompts: {p['train_source']} (held out: {p['eval_source']}): {counts}; {p['per_iteration']} an iteration",
        f"processes: {r['processes']}, {p['per_process']} prompt{'s' * (p['per_process'] != 1)} each",
    ]
    return out + _cost_lines(r) + _missing_lines(r["missing"])


def _layer(x: dict[str, Any]) -> str:
    n = x["keys"]
    return x["layer"] if n is None else f"{x['layer']} ({n} key{'s' * (n != 1)})"


def _cost_lines(r: dict[str, Any]) -> list[str]:
    it, mem = r["iteration"], r["memory"]
    if it is None:
        return ["cost: not estimated for this model (the released models and the embedded ones are)"]
    flops = "not counted (no FLOP formula)"
    if it["flops"] is not None:
        total = it["denoiser_tflops"] * r["iterations"]
        flops = f"{_num(it['denoiser_tflops'])} TFLOPs (about {_num(total)} over {r['iterations']} iterations)"
    parts = ", ".join(f"{k} {_num(v)}" for k, v in mem["parts_gb"].items() if v)
    return [
        f"iteration {it['iteration']}: {it['rollout_evals']:,} model evaluations (rollout forwards), "
        f"{it['leaves']:,} leaves, {'at most ' * bool(it['rewards_may_lower'])}{it['trained_edges']:,} trained edges "
        f"({it['train_evals']:,} update evaluations); denoiser {flops}",
        f"memory per process: {_num(mem['peak_gb_per_process'])} GB at peak ({mem['dtype']}{', FSDP' * mem['fsdp']}: "
        f"{parts} GB; activations not included); tree latents {_num(mem['tree_latents_gib'])} GiB of host memory",
    ]


def _num(x: float) -> str:
    """1,234,567 and 12.3 and 0.00123: whole thousands with separators, else three significant digits."""
    return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.3g}"


def _missing_lines(missing: list[str]) -> list[str]:
    if not missing:
        return ["nothing missing: the run can start"]
    return [f"missing ({len(missing)}): " + "; ".join(f"({i}) {m}" for i, m in enumerate(missing, 1))]

"""One run's trainer: the policy, its optimizer, EMA and NFT sampling policy, one online iteration (rollout ->
score -> credit -> update), and the update path every iteration ends with, the online loop's (loop.py) and the
staged `train --trees`' (stages.py): the NFT or GRPO update, its metrics row and the checkpoint."""

from __future__ import annotations

import time
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import torch

from ..config import Config
from ..engine import awm as _awm  # noqa: F401  (registers the AWM update)
from ..engine import nft as _nft  # noqa: F401  (registers the NFT update)
from ..engine.budgets import PromptStats
from ..engine.grpo import lr_at, make_optimizer, set_lr
from ..engine.rollout import Progress, mix_seed
from ..engine.sde import make_kernel
from ..engine.update import Context, OneProcess, Ranks, make_update
from ..models.base import Policy
from ..models.flops import device_peak_flops
from ..models.registry import load_policy
from ..rewards.base import weighted_sum
from ..rewards.monitors import image_stats
from ..store.checkpoint import Checkpoint, follow_checkpoint_gathers, save_checkpoint
from . import dist, rundir, runlog
from .dist import SINGLE, Dist
from .overlap import MONITOR, chunk_count, rollout_and_score
from .parallel import Processes, shard_policy, whole_batch
from .runlog import MetricsRow
from .sampling import build_rewards, make_judge
from .steps import (
    Credited,
    credit,
    dynamic_row,
    iteration_flops,
    metrics_row,
    new_stats,
    peak_memory_mib,
    plan_iteration,
    rng_states,
    set_rng_states,
    throughput,
    update_generator,
)

TOTALS = ("flops_total", "reward_images_total")  # the run's compute so far, in every metrics row


class Trainer:
    """Holds the policy, optimizer and EMA of one run."""

    def __init__(self, cfg: Config, device: str, d: Dist = SINGLE):
        cfg.train.validate()
        self.cfg, self.device, self.d = cfg, device, d
        torch.manual_seed(mix_seed(cfg.seed, 0x6E0B))  # the global generators (LoRA init, anything unseeded) too
        self.policy: Policy = load_policy(cfg.model, device, cfg.policy)
        cfg.check_tree_memory(tuple(self.policy.latent_shape))
        self.sde = make_kernel(self.policy, cfg.sampler)  # FlowSDE, or the policy's own (DDIM for SD1.5)
        self.ref = self.policy.reference() if cfg.train.kl_beta > 0 else None  # whole on every rank
        self.flops_row = getattr(self.policy, "flops_per_row", lambda: None)()  # (fwd, bwd) of one row, unsharded
        self.sharded = cfg.train.parallel == "fsdp" and d.active  # one process: nothing to shard
        if self.sharded:
            shard_policy(self.policy, device)
        self.opt = make_optimizer(list(self.policy.trainable_parameters()), cfg.train)
        self.update = make_update(cfg, self.policy, self.sde)  # the objective's update (engine/update.py)
        self.ranks: Ranks = Processes(cfg, d, self.sharded) if d.active else OneProcess()
        self.ema = (
            {k: v.detach().clone() for k, v in self.policy.trainable_state().items()}
            if cfg.train.ema_decay > 0
            else None
        )
        self.rewards = build_rewards(cfg.reward, device)
        gold = cfg.guard.rewards if cfg.guard.enabled else ()
        self.gold = build_rewards(cfg.reward, device, names=gold) if gold else {}  # the guard's, never trained on
        self.weights = cfg.reward.weight_map()
        self.judge = make_judge(cfg.tree, cfg.reward, self.policy, self.rewards)  # tree.dynamic = "reward"
        self.prompt_stats = new_stats(cfg)  # per-prompt reward estimates ([budget], adaptive [splits])
        self.step = 0
        self.totals = dict.fromkeys(TOTALS, 0)  # the run's compute so far (cumulative metrics)
        self.opt_steps = 0  # optimizer steps over the run (the EMA's cadence and warm-up count them)
        self.ema_updates = 0  # EMA updates in the current iteration

    def update_ema(self) -> None:
        """One EMA update at the decay of optimizer step `opt_steps` (train.ema_warmup: Flow-GRPO's warm-up)."""
        if self.ema is None:
            return
        d, s = self.cfg.train.ema_decay, self.opt_steps
        d = min((1 + s) / (10 + s), d) if self.cfg.train.ema_warmup else d
        with torch.no_grad():
            for k, v in self.policy.trainable_state().items():
                self.ema[k].mul_(d).add_(v.to(self.ema[k].device), alpha=1 - d)
        self.ema_updates += 1

    @property
    def extra_forwards(self) -> int:
        """Forwards beside each trained one: the KL reference's, the update's own (NFT's old policy's)."""
        return int(self.ref is not None) + self.update.extra_forwards

    def add_to_totals(self, row: MetricsRow) -> dict[str, int]:
        """An iteration's denoiser FLOPs and reward-model images, and the run's totals with them."""
        flops = iteration_flops(
            self.flops_row, row.get("rollout_evals", 0), row.get("train_evals", 0), self.extra_forwards
        )
        now = {"flops": flops, "reward_images": int(row.get("leaves", 0)) + int(row.get("judged_images", 0))}
        self.totals = {f"{k}_total": self.totals[f"{k}_total"] + v for k, v in now.items()}
        return {**now, **self.totals}

    def after_step(self) -> None:
        """After each optimizer step: count it (over the run) and update the EMA when its cadence says so."""
        self.opt_steps += 1
        every = self.cfg.train.ema_every
        if every and (self.opt_steps + 1) % every == 0:
            self.update_ema()

    def sampling_policy(self) -> AbstractContextManager[None]:
        """The weights rollouts sample with: the update's (NFT's old policy), else the trained ones."""
        return self.update.sampling(list(self.policy.trainable_parameters()))

    def checkpoint(self, extra: dict[str, Any]) -> Checkpoint:
        """The run's state (a sharded run's tensors are its shards: save_checkpoint gathers them)."""
        state = {"step": self.step, "seed": self.cfg.seed, "optimizer_steps": self.opt_steps, **self._stats(), **extra}
        return Checkpoint(
            step=self.step,
            model=self.policy.trainable_state(),
            ema=self.ema,
            optimizer=self.opt.state_dict(),
            rng=rng_states(),
            state=state,
            update_state=self.update.state(list(self.policy.trainable_state())),
        )

    def _stats(self) -> dict[str, Any]:
        """The per-prompt estimates a resumed run plans from (engine/budgets.py), when the config keeps them."""
        return {"prompt_stats": self.prompt_stats.to_json()} if self.prompt_stats is not None else {}

    def restore(self, ck: Checkpoint) -> None:
        """Load a checkpoint (whole tensors, written by any number of processes, sharded or not)."""
        model, opt, ema = ck.model, ck.optimizer, ck.ema
        if self.sharded:
            like = self.policy.trainable_state()
            model = dist.shard_like(model, like)
            opt = dist.shard_optimizer_state(opt, list(self.policy.trainable_parameters()))
            ema = dist.shard_like(ema, like) if ema is not None else None
        self.policy.load_trainable_state(model)
        self.opt.load_state_dict(opt)
        if self.ema is not None and ema is not None:
            self.ema = {k: v.clone() for k, v in ema.items()}
        self.update.load(ck.update_state, list(self.policy.trainable_state()), ck.step)
        set_rng_states(ck.rng)
        if self.prompt_stats is not None and "prompt_stats" in ck.state:
            self.prompt_stats = PromptStats.from_json(ck.state["prompt_stats"])
        self.step = ck.step
        self.opt_steps = int(ck.state.get("optimizer_steps", 0))

    # -- one iteration -------------------------------------------------------------------
    def iteration(self, prompts: list[str], progress: Progress) -> MetricsRow:
        """Roll out this rank's share of the iteration's prompts, credit over the whole batch, update."""
        cfg, it, d = self.cfg, self.step, self.d
        t0 = time.perf_counter()
        plan = plan_iteration(cfg, len(prompts), it, stats=self.prompt_stats)
        part = dist.shard(len(plan.prompt_ids), d)
        mine = plan.prompt_ids[part]
        with self.sampling_policy():
            out = rollout_and_score(
                self.policy,
                prompts,
                mine,
                earlier=plan.prompt_ids[: part.start],
                sde=self.sde,
                cfg=plan.tree,
                seed=plan.seed,
                max_batch=cfg.rollout.max_batch,
                rewards=self.rewards,
                chunks=chunk_count(cfg.rollout.score_overlap, list(cfg.reward.names)),
                progress=progress,
                shapes=plan.shapes[part] if plan.shapes else None,
                judge=self.judge,
                watch=image_stats if cfg.guard.enabled and cfg.guard.stats else None,
            )
        tree = out.tree
        t1 = t0 + out.seconds["rollout"]
        whole, scores, starts = whole_batch(tree, out.scores, d)
        leaf_monitors = {k: scores.pop(k) for k in list(scores) if k.startswith(MONITOR)}  # not rewards
        if self.prompt_stats is not None:  # from the whole batch: the same estimates on every rank
            self.prompt_stats.update(whole.group()[whole.leaves()], weighted_sum(scores, self.weights), plan.skipped)
        adv, trained = credit(cfg, whole, scores, it)
        nfe = sum(dist.gather(out.nfe, d))
        c = Credited(
            tree=tree, whole=whole, starts=starts, scores=scores, weights=self.weights, edge=adv.edge, trained=trained,
            leaf=adv.leaf, nfe=nfe, sde_steps=plan.tree.sde_steps,
        )  # fmt: skip
        t2 = time.perf_counter()
        row = self.learn(c, [prompts[int(p)] for p in tree.tree_prompt], it, progress)
        t3 = time.perf_counter()
        self.step += 1
        hidden = max(out.seconds["score_busy"] - out.seconds["score"], 0.0)  # scoring the rollout overlapped
        row["seconds"] = {"rollout": t1 - t0, "score": t2 - t1, "update": t3 - t2, "total": t3 - t0}
        row["seconds"]["score_hidden"] = hidden
        row["peak_mib"] = peak_memory_mib(self.device)
        runlog.add_fields(row, {k: float(v.double().mean()) for k, v in leaf_monitors.items()})
        if plan.tree.budgeted() or plan.shapes is not None:  # what the adaptive trees did, over every rank's
            dyn = dynamic_row({k: sum(dist.gather(v, d)) for k, v in out.dynamic.items()}, self.flops_row)
            runlog.add_fields(row, {**dyn, "replaced": len(plan.skipped)})
        runlog.add_fields(row, throughput(row, self.flops_row, self.extra_forwards, device_peak_flops(self.device)))
        return row

    # -- the end of every iteration, online and staged ------------------------------------
    def learn(self, c: Credited, prompts: list[str], it: int, progress: Progress | None = None) -> MetricsRow:
        """Iteration `it`'s update of credited trees (`prompts`: this process's, one per tree): NFT on every leaf's
        advantage, or GRPO on the trained edges (every process's batch planned together); then its metrics row."""
        cfg = self.cfg
        lr = lr_at(cfg.train, it)  # the iteration's rate (train.lr_schedule), set before its first step
        set_lr(self.opt, lr)
        cond = self.policy.encode(prompts)
        self.ema_updates = 0
        ctx = Context(
            policy=self.policy,
            opt=self.opt,
            sde=self.sde,
            ref=self.ref,
            ranks=self.ranks,
            gen=update_generator(cfg, it),
            max_batch=cfg.rollout.max_batch,
            after_step=self.after_step,
            optimizer_steps=lambda: self.opt_steps,
            progress=progress,
        )
        out, credited = self.update.learn(c, cond, it, ctx)
        if cfg.train.ema_every == 0:  # once per iteration, after its last step (DanceGRPO's code)
            self.update_ema()
        after = self.update.follow(list(self.policy.trainable_parameters()), ctx)
        upd = {**out, "ema_updates": self.ema_updates, **after}
        return metrics_row(c, it, credited, upd, lr)

    def save(self, run: Path, main: bool = True, folder: str = rundir.CHECKPOINTS) -> Path | None:
        """The checkpoint of the run so far under run/checkpoints/step-N (keep-last rotation) or run/best/step-N
        (the one best held-out evaluation), written by the main process (a sharded model's other ranks take part in
        gathering each tensor as it is written); its path there."""
        ck = self.checkpoint({"config": self.cfg.to_dict()})
        if main:
            keep = 1 if folder == rundir.BEST else self.cfg.train.keep_last
            return save_checkpoint(run / folder, ck, keep)
        if self.sharded:
            follow_checkpoint_gathers(ck)
        return None

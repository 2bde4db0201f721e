"""The online training loop: rollout -> score -> advantages -> pruning -> GRPO update, with exact resume.

Everything random in an iteration is seeded by (seed, iteration): the prompts, the window, every
node's noise and the minibatch order. A checkpoint therefore only needs the weights, the EMA, the
optimizer and the iteration counter for a resumed run to repeat an uninterrupted one bit for bit.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, ExitStack, closing, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch

from ..config import Config
from ..engine.budgets import PromptStats
from ..engine.grpo import (
    Batch,
    Parallel,
    grpo_update,
    make_optimizer,
)
from ..engine.nft import NFTBatch, OldPolicy, decay_at, nft_update
from ..engine.rollout import Progress, mix_seed
from ..engine.sde import FlowSDE, make_kernel
from ..errors import TreegrpoError
from ..models.base import Policy
from ..models.flops import device_peak_flops
from ..models.registry import load_policy
from ..rewards.base import weighted_sum
from ..store.checkpoint import Checkpoint, follow_checkpoint_gathers, list_checkpoints, load_checkpoint, save_checkpoint
from . import dist, rundir, runlock, runlog, tracking
from .dist import SINGLE, Dist
from .heldout import heldout_row
from .nft import nft_batch
from .overlap import chunk_count, rollout_and_score
from .parallel import parallel_plan, shard_policy, whole_batch
from .steps import (
    build_rewards,
    credit,
    dynamic_row,
    iteration_flops,
    make_judge,
    metrics_row,
    new_stats,
    peak_memory_mib,
    plan_iteration,
    rng_states,
    set_rng_states,
    throughput,
    update_generator,
)


@dataclass
class TrainRequest:
    config: Config
    prompts: list[str]  # training prompts
    eval_prompts: list[str]  # prompts of the sample grids
    run_dir: Path
    resume: bool = False
    device: str = "cpu"
    command: str = ""
    dist: Dist = SINGLE  # this process's rank in a data-parallel run (dist.py)


@dataclass
class Hooks:
    progress: Progress = lambda phase, done, total: None
    on_row: Callable[[dict[str, Any]], None] = lambda row: None
    note: Callable[[str], None] = lambda message: None  # resume, fallback and stall messages
    should_stop: Callable[[], bool] = lambda: False
    on_eval: Callable[[dict[str, Any]], None] = lambda row: None  # a held-out evaluation's row, once written
    on_image: Callable[[str, Path, int], None] = lambda tag, path, step: None  # a sample grid, once written
    started: Callable[[], None] = lambda: None  # the run folder is this process's (locked, checked): loading begins


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
        self.old = OldPolicy(list(self.policy.trainable_parameters())) if cfg.train.objective == "nft" else None
        if self.old is not None and not isinstance(self.sde, FlowSDE):
            raise TreegrpoError(
                f"train.objective = nft trains a flow-matching model's velocity; {self.policy.name} samples "
                "with its own kernel (an epsilon-prediction model): use a GRPO preset"
            )
        self.ema = (
            {k: v.detach().clone() for k, v in self.policy.trainable_state().items()}
            if cfg.train.ema_decay > 0
            else None
        )
        self.rewards = build_rewards(cfg, device)
        self.weights = cfg.reward.weight_map()
        self.judge = make_judge(cfg, self.policy, self.rewards)  # tree.dynamic = "reward"
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
        """Forwards beside each trained one: the KL reference's, NFT's old policy's."""
        return int(self.ref is not None) + int(self.old is not None)

    def add_to_totals(self, row: dict[str, Any]) -> dict[str, int]:
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

    def update(
        self, batch: Batch, gen: torch.Generator, parallel: Parallel | None = None, progress: Progress | None = None
    ) -> dict[str, Any]:
        """One iteration's GRPO update, with the EMA updates its schedule asks for (train.ema_every)."""
        self.ema_updates = 0
        out = grpo_update(
            self.policy,
            self.opt,
            self.sde,
            batch,
            self.cfg.train,
            gen,
            self.cfg.rollout.max_batch,
            self.ref,
            self.after_step,
            parallel,
            progress=progress,
        )
        if self.cfg.train.ema_every == 0:  # once per iteration (DanceGRPO's code)
            self.update_ema()
        return {**out, "ema_updates": self.ema_updates}

    def sampling_policy(self) -> AbstractContextManager[None]:
        """The weights rollouts sample with: NFT's old policy, else the trained one."""
        return self.old.swapped(list(self.policy.trainable_parameters())) if self.old is not None else nullcontext()

    def update_nft(self, b: NFTBatch, progress: Progress | None = None) -> dict[str, Any]:
        """One iteration's NFT update; then the old policy trails the trained one (nft.decay)."""
        self.ema_updates = 0
        cfg, params = self.cfg, list(self.policy.trainable_parameters())
        sync = (lambda ps: dist.sum_gradients(ps, self.d)) if self.d.active else None
        gather = (lambda x: torch.cat(dist.gather(x, self.d))) if self.d.active else None
        out = nft_update(
            self.policy,
            cast(OldPolicy, self.old),
            self.opt,
            self.sde.sigmas,
            b,
            cfg.nft,
            cfg.train.kl_beta,
            cfg.train.max_grad_norm,
            mix_seed(cfg.seed, 0x4EF7),
            cfg.rollout.max_batch,
            self.ref,
            self.after_step,
            sync,
            gather,
            progress=progress,
        )
        if cfg.train.ema_every == 0:
            self.update_ema()
        decay = decay_at(self.opt_steps, cfg.nft.decay)
        cast(OldPolicy, self.old).follow(params, decay)
        return {**out, "ema_updates": self.ema_updates, "old_decay": decay}

    def checkpoint(self, extra: dict[str, Any]) -> Checkpoint:
        """The run's state (a sharded run's tensors are its shards: save_checkpoint gathers them)."""
        return Checkpoint(
            self.step,
            self.policy.trainable_state(),
            self.ema,
            self.opt.state_dict(),
            rng_states(),
            {
                "step": self.step,
                "seed": self.cfg.seed,
                "optimizer_steps": self.opt_steps,
                **self._stats_state(),
                **extra,
            },
            old=self.old_state(),
        )

    def _stats_state(self) -> dict[str, Any]:
        return {"prompt_stats": self.prompt_stats.to_json()} if self.prompt_stats is not None else {}

    def old_state(self) -> dict[str, torch.Tensor] | None:
        """The NFT sampling policy's tensors under the trainable state's names (None: not an NFT run)."""
        if self.old is None:
            return None
        return dict(zip(self.policy.trainable_state(), self.old.tensors, strict=True))

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
        if self.old is not None:
            if ck.old is None:
                raise TreegrpoError(f"checkpoint step-{ck.step} holds no NFT sampling policy (old-*.safetensors)")
            pairs = zip(self.policy.trainable_state(), self.old.tensors, strict=True)  # NFT runs unsharded
            self.old.tensors = [ck.old[k].to(t.device, t.dtype).clone() for k, t in pairs]
        set_rng_states(ck.rng)
        if self.prompt_stats is not None and "prompt_stats" in ck.state:
            self.prompt_stats = PromptStats.from_json(ck.state["prompt_stats"])
        self.step = ck.step
        self.opt_steps = int(ck.state.get("optimizer_steps", 0))

    # -- one iteration -------------------------------------------------------------------
    def iteration(self, prompts: list[str], progress: Progress) -> dict[str, Any]:
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
                plan.prompt_ids[: part.start],
                self.sde,
                plan.tree,
                plan.seed,
                cfg.rollout.max_batch,
                self.rewards,
                chunk_count(cfg.rollout.score_overlap, list(cfg.reward.names)),
                progress,
                shapes=plan.shapes[part] if plan.shapes else None,
                judge=self.judge,
            )
        tree, nfe, scores = out.tree, out.nfe, out.scores
        t1 = t0 + out.seconds["rollout"]
        whole, all_scores, starts = whole_batch(tree, scores, d)
        if self.prompt_stats is not None:  # from the whole batch: the same estimates on every rank
            self.prompt_stats.update(
                whole.group()[whole.leaves()], weighted_sum(all_scores, self.weights), plan.skipped
            )
        adv, trained = credit(cfg, whole, all_scores, it)
        t2 = time.perf_counter()
        cond = self.policy.encode([prompts[int(p)] for p in tree.tree_prompt])
        if self.old is not None:
            upd = self.update_nft(nft_batch(cfg, it, tree, whole, adv.leaf, starts, d.rank, cond), progress)
            trained = whole.is_leaf()  # NFT trains every leaf, on its advantage
            credited = adv.leaf[trained]
        else:
            own = slice(starts[d.rank], starts[d.rank] + tree.num_nodes)
            batch = Batch(tree, trained[own], adv.edge[own], cond)
            whole_plan = Batch(whole, trained, adv.edge, {})
            par = parallel_plan(whole_plan, cfg, it, starts, d, self.sharded) if d.active else None
            upd = self.update(batch, update_generator(cfg, it), par, progress)
            credited = adv.edge[trained]
        t3 = time.perf_counter()
        self.step += 1
        nfe = sum(dist.gather(nfe, d))
        group = whole.group()[whole.leaves()]
        row = metrics_row(it, all_scores, self.weights, credited, group, nfe, upd, plan.tree, self.opt)
        if plan.tree.budgeted() or plan.shapes is not None:  # what the adaptive trees did, over every rank's
            row.update(dynamic_row({k: sum(dist.gather(v, d)) for k, v in out.dynamic.items()}, self.flops_row))
            row["replaced"] = len(plan.skipped)
        hidden = max(out.seconds["score_busy"] - out.seconds["score"], 0.0)  # scoring the rollout overlapped
        row["seconds"] = {"rollout": t1 - t0, "score": t2 - t1, "update": t3 - t2, "total": t3 - t0}
        row["seconds"]["score_hidden"] = hidden
        row["peak_mib"] = peak_memory_mib(self.device)
        row.update(throughput(row, self.flops_row, self.extra_forwards, device_peak_flops(self.device)))
        return row


TOTALS = ("flops_total", "reward_images_total")


# --- the run ---------------------------------------------------------------------------------


def train(req: TrainRequest, hooks: Hooks = Hooks()) -> dict[str, Any]:
    """Train online until cfg.train.iterations (or train.max_minutes); resumable from the last good
    checkpoint. With several processes every rank trains and rank 0 alone writes the run folder; the
    sample grids, held-out evaluations and checkpoints are rank 0's work, or, for a sharded model, every
    rank's (each forward is a collective)."""
    tracking.check_available(req.config.train.log)  # a missing tracker package: before anything is written
    with ExitStack() as held:
        if req.resume and req.dist.main:  # one writer per run folder: refused before the model loads
            held.enter_context(runlock.lock(req.run_dir))
        if req.resume:
            rundir.check_resumable(req.run_dir, req.config)  # damaged files: refused before anything is written
        hooks.started()
        return _train(req, hooks, held)


def _train(req: TrainRequest, hooks: Hooks, held: ExitStack) -> dict[str, Any]:
    cfg, d = req.config, req.dist
    t0 = time.perf_counter()
    trainer = Trainer(cfg, req.device, d)
    hooks.note(f"{trainer.policy.name} ready on {req.device} in {time.perf_counter() - t0:.1f}s")
    works = d.main or trainer.sharded  # this rank runs the grids', evaluations' and checkpoints' forwards
    if cfg.policy.free_text_encoders and hasattr(trainer.policy, "cache_prompts"):
        trainer.policy.cache_prompts(req.prompts + req.eval_prompts)  # embed once, then free the encoders
    if req.resume:
        _resume(trainer, req, hooks)
    elif d.main:
        held.enter_context(runlock.lock(req.run_dir, create=True))
        model: dict[str, Any] = getattr(trainer.policy, "describe", dict)()
        prompts = {"train": req.prompts, "eval": req.eval_prompts}
        rundir.create(req.run_dir, cfg, req.command, prompts, {"device": req.device, "model": model})
    if cfg.train.log and d.main:
        track = tracking.Tracking(req.run_dir, cfg.train.log, cfg.to_dict(), trainer.step if req.resume else None)
        hooks = tracking.tracked(hooks, held.enter_context(closing(track)))
    if not req.resume and cfg.train.sample_every and works:
        _grid(trainer, req, 0, hooks)
    if cfg.train.eval_samples and _main_says(lambda: not runlog.read_evals(req.run_dir), trainer, d):
        _heldout(trainer, req, hooks, 0.0)
    dist.barrier(d)
    done_rows = runlog.read_metrics(req.run_dir)
    start, wall = trainer.step, (done_rows[-1].get("wall", 0.0) if done_rows else 0.0)
    trainer.totals = {k: int(done_rows[-1].get(k, 0)) if done_rows else 0 for k in TOTALS}
    wall0, budget = time.perf_counter() - wall, cfg.train.max_minutes * 60
    spent = lambda: bool(cfg.train.max_tflops and trainer.totals["flops_total"] >= cfg.train.max_tflops * 1e12)  # noqa: E731
    finished = trainer.step >= cfg.train.iterations or bool(budget and wall >= budget) or spent()
    stopped, stall = False, 0
    while not finished:
        row = trainer.iteration(req.prompts, hooks.progress)  # phases rollout, score, update
        row["wall"], last_wall = time.perf_counter() - wall0, wall
        last_tflops = trainer.totals["flops_total"] / 1e12
        row.update(trainer.add_to_totals(row))
        wall = row["wall"]
        _check_finite(row, req.run_dir)
        votes = dist.gather((hooks.should_stop(), bool(budget and wall >= budget)), d)
        stopped = any(v[0] for v in votes)
        finished = trainer.step == cfg.train.iterations or votes[0][1] or spent()  # rank 0's clock decides the budget
        if d.main:  # the other ranks go on; the next iteration's gather waits for rank 0
            stall = _record(req, hooks, row, stall)
        if works:
            _outputs(trainer, req, stopped, finished, hooks)
            due = _crossed(cfg.train.eval_every_minutes * 60, last_wall, wall) or _crossed(
                cfg.train.eval_every_tflops, last_tflops, trainer.totals["flops_total"] / 1e12
            )
            if not (finished or stopped) and due:
                t = time.perf_counter()
                _heldout(trainer, req, hooks, wall)
                wall0 += time.perf_counter() - t  # held-out evaluations do not count as training time
        if stopped:
            break

    def last_eval() -> int:
        return runlog.read_evals(req.run_dir)[-1]["iteration"]

    if finished and works and cfg.train.sample_every and trainer.step:
        _missing_pictures(trainer, req, hooks)  # a resume repeats what a stopped run did not finish
    if cfg.train.eval_samples and finished and _main_says(lambda: last_eval() < trainer.step, trainer, d):
        _heldout(trainer, req, hooks, wall)  # also after a run killed between its last checkpoint and this
    if finished and d.main and cfg.train.sample_every:  # titled with the last held-out reward
        path = rundir.before_after(req.run_dir, trainer.step)
        if path is not None:
            hooks.on_image("before_after", path, trainer.step)
    dist.barrier(d)
    # a stop asked for during the last iteration came too late to stop anything: the run is complete
    return rundir.summary(req.run_dir, start, stopped and not finished) if d.main else {}


def _main_says(question: Callable[[], bool], trainer: Trainer, d: Dist) -> bool:
    """Rank 0's answer to a question about the run folder; the other ranks of a sharded run learn it (they
    take part in what follows), those of a replicated one answer no."""
    if not trainer.sharded:
        return d.main and question()
    return bool(dist.gather(question() if d.main else None, d)[0])


def _crossed(every: float, before: float, now: float) -> bool:
    """Did a counter (training seconds, TFLOPs) cross a multiple of `every` between `before` and `now`?"""
    return every > 0 and int(now // every) > int(before // every)


def _record(req: TrainRequest, hooks: Hooks, row: dict[str, Any], stall: int) -> int:
    """Rank 0's bookkeeping of an iteration: metrics, hooks, stall warning."""
    runlog.append_metrics(req.run_dir, row)
    hooks.on_row(row)
    stall = stall + 1 if runlog.stalled(row) else 0
    if stall == runlog.STALL_ITERATIONS:
        hooks.note(runlog.stall_message(row["iteration"] - stall + 1, row["iteration"]))
    return stall


def _outputs(trainer: Trainer, req: TrainRequest, stopped: bool, last: bool, hooks: Hooks) -> None:
    """The checkpoint and sample grid due after an iteration."""
    cfg = trainer.cfg
    if last or stopped or trainer.step % cfg.train.save_every == 0:
        _save(trainer, req)
    if cfg.train.sample_every and (last or trainer.step % cfg.train.sample_every == 0):
        _grid(trainer, req, trainer.step, hooks)


def _missing_pictures(trainer: Trainer, req: TrainRequest, hooks: Hooks) -> None:
    """The last sample grid, reward.png and before_after.png of a finished run, when its last try stopped
    before writing them (a full disk, a kill)."""
    grid = req.run_dir / "samples" / f"step-{trainer.step}.png"
    if _main_says(lambda: not grid.is_file(), trainer, req.dist):
        _grid(trainer, req, trainer.step, hooks)
    if req.dist.main and (path := rundir.missing_pictures(req.run_dir, trainer.step)) is not None:
        hooks.on_image("before_after", path, trainer.step)


def _grid(trainer: Trainer, req: TrainRequest, step: int, hooks: Hooks) -> None:
    path = rundir.sample_grid(
        req.run_dir,
        trainer.policy,
        trainer.sde,
        req.eval_prompts,
        trainer.rewards,
        trainer.cfg,
        step,
        write=req.dist.main,
    )
    if req.dist.main:
        hooks.on_image("samples", path, step)


def _resume(trainer: Trainer, req: TrainRequest, hooks: Hooks) -> None:
    """Restore the newest checkpoint that verifies (a damaged one is named and skipped with a warning), say
    which, and drop the metrics and evaluations of the iterations after it (they are recomputed)."""
    run = req.run_dir
    rows = runlog.read_metrics(run)
    runlog.read_evals(run)  # damaged lines: refuse before anything
    said = req.dist.main  # rank 0 speaks for the run
    if said and (change := rundir.code_change(run)):
        hooks.note(change)
    good, other = rundir.scan_checkpoints(run)
    for name, why in other:
        hooks.note(f"warning: {run / rundir.CHECKPOINTS / name}: {why}; skipped")
    damaged = bool(other)
    for path in reversed(good):
        try:
            ck = load_checkpoint(path)
        except (TreegrpoError, OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            hooks.note(f"warning: checkpoint {path.name} is damaged ({e}); falling back to the one before it")
            damaged = True
            continue
        trainer.restore(ck)
        hooks.note(
            f"resuming {run} from checkpoint {path.name} (iteration {trainer.step} of {trainer.cfg.train.iterations})"
        )
        break
    else:
        if damaged and rows:
            hooks.note(
                f"warning: {run} has no usable checkpoint left: starting again from iteration 0; the "
                f"{len(rows)} rows of {runlog.METRICS} are recomputed (same seeds: the same rows)"
            )
        else:
            hooks.note(f"{run} has no usable checkpoint yet: starting again from iteration 0")
    dist.barrier(req.dist)  # every rank has read the checkpoint before rank 0 trims the logs
    if req.dist.main:
        runlog.truncate_metrics(run, trainer.step)
        runlog.truncate_evals(run, trainer.step)


def _check_finite(row: dict[str, Any], run: Path) -> None:
    """A non-finite loss or gradient stops the run before anything of this iteration is saved."""
    bad = [k for k in ("loss", "grad_norm", "reward_mean") if k in row and not math.isfinite(row[k])]
    if bad:
        done = list_checkpoints(run / "checkpoints")
        keep = f"the last good checkpoint is {done[-1].name}" if done else "no checkpoint was written"
        raise TreegrpoError(
            f"iteration {row['iteration']}: {bad[0]} is {row[bad[0]]}; training stopped without "
            f"saving this iteration ({keep}); lower train.lr or check the reward"
        )


def _heldout(trainer: Trainer, req: TrainRequest, hooks: Hooks, wall: float) -> None:
    """The held-out evaluation of the weights `eval` and `export` use (heldout.py) -> eval.jsonl, with the
    seconds of training so far."""
    cfg = trainer.cfg
    if req.dist.main:
        n = f"{len(req.eval_prompts)} prompts x {cfg.train.eval_samples}"
        hooks.note(f"held-out evaluation at iteration {trainer.step}: {n}, ODE samples ...")
    row = heldout_row(
        trainer.policy,
        trainer.sde,
        req.eval_prompts,
        trainer.rewards,
        trainer.weights,
        trainer.ema,
        cfg.train.eval_samples,
        mix_seed(cfg.seed, 0x4E1D),
        cfg.rollout.max_batch,
        lambda ph, d, t: hooks.progress("eval", d, t),
    )
    if req.dist.main:
        row = {"iteration": trainer.step, "wall": wall, **trainer.totals, **row}
        runlog.append_eval(req.run_dir, row)
        rundir.reward_plot(req.run_dir)  # with its held-out curve
        hooks.on_eval(row)


def _save(trainer: Trainer, req: TrainRequest) -> None:
    """Rank 0 writes the checkpoint, streamed shard by shard; a sharded model's other ranks take part in
    gathering each tensor as it is written."""
    ck = trainer.checkpoint({"config": trainer.cfg.to_dict()})
    if req.dist.main:
        save_checkpoint(req.run_dir / "checkpoints", ck, trainer.cfg.train.keep_last)
        rundir.reward_plot(req.run_dir)
    elif trainer.sharded:
        follow_checkpoint_gathers(ck)

"""The run configuration's schema: one Config of sections (the engine's, the models' and the run's own), the
checks that need more than one section, and the stated maxima of the work one iteration may ask for."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from ..engine.advantages import AdvantageConfig
from ..engine.awm import AWMConfig
from ..engine.budgets import BudgetConfig
from ..engine.dgpo import DGPOConfig
from ..engine.dynamic import Inherited, never
from ..engine.grpo import TrainConfig
from ..engine.nft import NFTConfig
from ..engine.pruning import PruneConfig
from ..engine.rollout import TreeConfig
from ..engine.schedules import ScheduleConfig
from ..engine.sde import MAX_STEPS, SamplerConfig
from ..engine.splits import SplitConfig, check_adaptive, densest_steps, sampled_tree
from ..errors import ConfigError, shown
from ..models.base import PolicyConfig
from .guard import GuardConfig

COMBINES = ("rewards", "advantages")

# Stated maxima of the counts that scale the work of an iteration or an evaluation, checked in closed form
# before anything is loaded or sampled (generous: the references train on 16 to 64 prompts an iteration,
# with at most a few thousand nodes per tree). Steps: engine.sde.MAX_STEPS; trees per prompt:
# engine.rollout.MAX_TREES_PER_PROMPT.
MAX_PROMPTS = 100_000  # rollout.num_prompts: prompts of one rollout
MAX_NODES = 100_000_000  # rollout.max_nodes may not be raised past this: nodes of one rollout, each keeping a latent
MAX_IMAGES = 100_000  # images of one evaluation: eval's prompts x --num-images, train.eval_samples per prompt
MAX_NAME_BYTES = 200  # a run name (the folder runs/<name>-<time>), in UTF-8 bytes
MAX_BUDGET_SPAN = 1024  # Config.budget_nodes looks at this many widths at most (past it: all at the widest)


@dataclass(frozen=True)
class RewardConfig:
    names: tuple[str, ...] = ("jpeg-compressibility",)  # rewards scored on every leaf (`treegrpo eval --help`
    # lists the names), or http://HOST:PORT of a `treegrpo serve-reward`
    weights: tuple[float, ...] = ()  # empty: 1 for each reward
    combine: str = "rewards"  # "rewards": weighted sum of scores; "advantages": of per-reward advantages (MixGRPO)
    options: tuple[str, ...] = ()  # "NAME.KEY=VALUE" reward options, e.g. "shapes.kind=soft"
    frame_stride: int = 1  # videos: an image reward scores every frame_stride-th frame and takes the mean

    def weight_map(self) -> dict[str, float]:
        if self.frame_stride < 1:
            raise ConfigError(f"reward.frame_stride must be >= 1, got {self.frame_stride}")
        if not self.names:
            raise ConfigError("reward.names is empty: name at least one reward (e.g. --reward shapes)")
        twice = sorted({n for n in self.names if self.names.count(n) > 1})
        if twice:
            raise ConfigError(f"reward.names has {shown(twice[0])} twice; name each reward once, with one weight")
        w = self.weights or tuple(1.0 for _ in self.names)
        if len(w) != len(self.names):
            raise ConfigError(f"reward.weights has {len(w)} values for {len(self.names)} rewards")
        if all(x == 0 for x in w):
            raise ConfigError(
                f"reward.weights are all zero ({shown(list(w))}): every image would score 0 and nothing would train"
            )
        if self.combine not in COMBINES:
            raise ConfigError(f"reward.combine must be one of {', '.join(COMBINES)}; got {shown(self.combine)}")
        return dict(zip(self.names, map(float, w), strict=True))


@dataclass(frozen=True)
class RolloutConfig:
    num_prompts: int = 4  # prompts per rollout (per training iteration)
    max_batch: int = 64  # rows per model forward
    prompts: str = (
        "default"  # training prompts: a file, or a built-in list (default, shapes-train, shapes-test, shapes-pretrain)
    )
    eval_prompts: str = "default"  # held-out prompts: the held-out reward, sample grids, before_after.png, eval
    # held out from `prompts` instead of `eval_prompts`: a whole count >= 1 or a share in (0, 1) of the list, drawn
    # with the seed (0 = off)
    eval_split: float = 0.0
    max_nodes: int = 1_000_000  # refuse a rollout whose trees would hold more nodes than this (each keeps its latent)
    max_tree_gib: float = 32.0  # refuse a rollout whose node latents would take more host memory than this
    # chunks of an iteration's prompts whose scoring overlaps the next chunk's rollout (training/overlap.py);
    # 0: 4 when a reward is served over HTTP, else 1 (no overlap)
    score_overlap: int = 0

    def validate(self) -> None:
        for name in ("num_prompts", "max_batch", "max_nodes"):
            if getattr(self, name) < 1:
                raise ConfigError(f"rollout.{name} must be >= 1, got {getattr(self, name)}")
        if not 0 <= self.score_overlap <= MAX_PROMPTS:
            raise ConfigError(
                f"rollout.score_overlap must be 0 (automatic) to {MAX_PROMPTS:,}, got {self.score_overlap}"
            )
        for name, most, what in (("num_prompts", MAX_PROMPTS, "prompts"), ("max_nodes", MAX_NODES, "nodes")):
            if getattr(self, name) > most:
                raise ConfigError(
                    f"rollout.{name} = {getattr(self, name):,} is more than the maximum of {most:,} {what} per rollout"
                )
        if not self.max_tree_gib > 0:
            raise ConfigError(f"rollout.max_tree_gib must be > 0, got {self.max_tree_gib}")
        split = self.eval_split
        if not (0 <= split < MAX_PROMPTS) or (split >= 1 and split != int(split)):
            raise ConfigError(
                f"rollout.eval_split must be 0 (off), a share in (0, 1) or a whole count >= 1, got {shown(split)}"
            )


PARALLELS = ("replicate", "fsdp")
TRACKERS = ("tensorboard", "wandb")


@dataclass(frozen=True)
class RunConfig:
    """The run's own keys of the [train] section: its cadence, budgets, trackers and processes (training/)."""

    save_every: int = 25  # checkpoint every N iterations (and at the end)
    keep_last: int = 2  # checkpoints kept
    sample_every: int = 25  # captioned sample grid every N iterations (0 = off)
    eval_samples: int = 2  # ODE draws per eval prompt for the held-out reward before and after (0 = off)
    eval_every: int = 0  # also a held-out evaluation every this many iterations (0 = off)
    eval_every_minutes: float = 0.0  # also a held-out evaluation every this many minutes of training (0 = off)
    max_minutes: float = 0.0  # finish after the iteration that reaches this many minutes of training (0 = off)
    eval_every_tflops: float = 0.0  # also a held-out evaluation every this many denoiser TFLOPs of training (0 = off)
    max_tflops: float = 0.0  # finish after the iteration that reaches this many denoiser TFLOPs (0 = off): a budget
    # that does not move with the machine's load, so a rerun repeats a run exactly
    log: tuple[str, ...] = ()  # run trackers fed beside metrics.jsonl: "tensorboard", "wandb" (training/tracking.py)
    parallel: str = "replicate"  # several processes: "replicate" (whole weights on every rank, gradients summed:
    # DDP's scheme) | "fsdp" (FSDP2 fully_shard of the denoiser, for full fine-tuning)

    def validate(self) -> None:
        if self.parallel not in PARALLELS:
            raise ConfigError(f"train.parallel must be one of {', '.join(PARALLELS)}; got {shown(self.parallel)}")
        bad = [x for x in self.log if x not in TRACKERS]
        if bad or len(set(self.log)) != len(self.log):
            raise ConfigError(
                f"train.log takes each of {', '.join(TRACKERS)} at most once; got {shown(list(self.log))}"
            )
        for name in ("save_every", "keep_last"):
            if getattr(self, name) < 1:
                raise ConfigError(f"train.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("sample_every", "eval_samples", "eval_every", "eval_every_minutes", "max_minutes"):
            if not getattr(self, name) >= 0:
                raise ConfigError(f"train.{name} must be >= 0 (0 = off), got {getattr(self, name)}")
        for name in ("eval_every_tflops", "max_tflops"):
            if not getattr(self, name) >= 0:
                raise ConfigError(f"train.{name} must be >= 0 (0 = off), got {getattr(self, name)}")


@dataclass(frozen=True)
class TrainSection(RunConfig, TrainConfig):
    """The [train] section: the update's keys (engine/grpo.py TrainConfig) and the run's (RunConfig) in one
    table, so a preset or config file sets both as train.KEY."""

    def validate(self) -> None:
        TrainConfig.validate(self)
        RunConfig.validate(self)


SECTIONS: dict[str, type] = {
    "sampler": SamplerConfig,
    "tree": TreeConfig,
    "advantage": AdvantageConfig,
    "pruning": PruneConfig,
    "reward": RewardConfig,
    "rollout": RolloutConfig,
    "schedule": ScheduleConfig,
    "splits": SplitConfig,
    "budget": BudgetConfig,
    "train": TrainSection,
    "nft": NFTConfig,
    "awm": AWMConfig,
    "dgpo": DGPOConfig,
    "policy": PolicyConfig,
    "guard": GuardConfig,
}
TOP_LEVEL = {"name": str, "description": str, "model": str, "seed": int}


@dataclass(frozen=True)
class Config:
    name: str = "custom"
    description: str = ""
    model: str = "tiny-shapes"
    seed: int = 0
    sampler: SamplerConfig = field(default_factory=SamplerConfig)
    tree: TreeConfig = field(default_factory=TreeConfig)
    advantage: AdvantageConfig = field(default_factory=AdvantageConfig)
    pruning: PruneConfig = field(default_factory=PruneConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    splits: SplitConfig = field(default_factory=SplitConfig)  # split steps that move with training (engine/splits.py)
    budget: BudgetConfig = field(default_factory=BudgetConfig)  # per-prompt leaf budgets (engine/budgets.py)
    train: TrainSection = field(default_factory=TrainSection)
    nft: NFTConfig = field(default_factory=NFTConfig)  # train.objective = "nft" only (engine/nft.py)
    awm: AWMConfig = field(default_factory=AWMConfig)  # train.objective = "awm" only (engine/awm.py)
    dgpo: DGPOConfig = field(default_factory=DGPOConfig)  # train.objective = "dgpo" only (engine/dgpo.py)
    policy: PolicyConfig = field(default_factory=PolicyConfig)  # diffusers models only (models/base.py)
    guard: GuardConfig = field(default_factory=GuardConfig)  # reward-hacking monitors and rules (training/guard.py)

    def validate(self) -> Config:
        check_run_name(self.name)
        self.sampler.validate()
        self.tree.validate(self.sampler.steps, self.sampler.decode)
        self.advantage.validate()
        self.pruning.validate()
        self.reward.weight_map()
        self.schedule.validate(self.sampler.steps, self.sampler.decode)
        self._check_scheduled_tree()
        check_adaptive(self.tree, self.schedule.split, self.splits, self.budget, self.sampler)
        any_sde = (
            self.tree.sde_steps is None
            or bool(self.tree.sde_steps)
            or bool(self.tree.split_steps)
            or self.schedule.kind != "static"
        )
        self.nft.validate()
        if self.train.objective == "nft" and self.train.parallel == "fsdp":
            raise ConfigError("train.objective = nft runs with train.parallel = replicate (FSDP2 is not supported yet)")
        self.dgpo.validate()
        if self.train.objective == "dgpo" and self.train.parallel == "fsdp":
            raise ConfigError("train.objective = dgpo runs with train.parallel = replicate (FSDP2 is not supported)")
        self.awm.validate()
        if self.train.objective == "awm":
            self.awm.grid(self.sampler.steps)
            if self.train.parallel == "fsdp":
                raise ConfigError("train.objective = awm runs with train.parallel = replicate (FSDP2 is not supported)")
        if self.sampler.eta == 0 and any_sde:
            raise ConfigError(
                "sampler.eta = 0 makes the SDE steps deterministic (their log-probs are undefined); "
                "set sampler.eta > 0, or tree.sde_steps = [] for an ODE-only rollout"
            )
        last = self.sampler.steps - 1
        if self.sampler.noise == "cps" and last in self.largest_tree().split_steps:
            raise ConfigError(
                f"sampler.noise = cps draws no noise at the last step ({last}, sigma' = 0): a split there gives "
                f"identical children; take step {last} out of tree.split_steps"
            )
        self.train.validate()
        if self.train.ratio_norm != "none" and self.sampler.log_prob_form != "gaussian":
            raise ConfigError(
                "train.ratio_norm normalises a Gaussian step's log-ratio: it needs sampler.log_prob_form = gaussian"
            )
        if self.train.eval_samples > MAX_IMAGES:
            raise ConfigError(
                f"train.eval_samples = {self.train.eval_samples:,} is more than the maximum of {MAX_IMAGES:,} "
                "images per prompt"
            )
        self.policy.validate()
        self.guard.validate(self.reward.names)
        if self.policy.weights == "random":
            from ..models.releases import check_random

            check_random(self.model, self.policy.size)
        self.rollout.validate()
        self._check_size()
        return self

    def warnings(self, inherited: Inherited = never) -> list[str]:
        """Legal values that are almost surely a mistake, one line each (for the commands to print); `inherited`
        says which keys an earlier layer set than the switch that ignores them (layers.user_warnings)."""
        out = [
            f"warning: reward {name!r} has weight 0: it is scored and logged but does not count"
            for name, w in self.reward.weight_map().items()
            if w == 0
        ]
        out += self._policy_warnings()
        out += self.advantage.warnings(inherited) + self.tree.warnings(inherited) + self.splits.warnings(inherited)
        width = sampled_tree(self.tree, self.splits).leaves(self.sampler.steps)
        out += self.budget.warnings(width, self.splits.kind == "adaptive", inherited)
        if self.train.lr >= 1:
            out.append(f"warning: train.lr = {self.train.lr:g} is far above the references' 1e-5 to 1e-3")
        out += self.train.warnings()
        if self.train.clip_range >= 1:
            out.append(
                f"warning: train.clip_range = {self.train.clip_range:g} clips nothing (ratios from 0 up pass); "
                "the references use 1e-4 to 1e-2"
            )
        return out

    def new_warnings(self, before: Config) -> list[str]:
        """The warnings this config adds to `before`'s (a resume's or `train --trees`' overrides, whose run or
        rollout said the rest when it started)."""
        said = set(before.warnings())
        return [w for w in self.warnings() if w not in said]

    def ignored(self) -> set[str]:
        """The keys the adaptive trees' switches leave without effect (tree.dynamic, budget.mode, splits.kind):
        runs that differ only in these ran the same thing."""
        adaptive = self.splits.kind == "adaptive"
        return {
            f"{section}.{k}"
            for section, names in (
                ("tree", self.tree.ignored()),
                ("budget", self.budget.ignored(adaptive)),
                ("splits", self.splits.ignored()),
            )
            for k in names
        }

    def _policy_warnings(self) -> list[str]:
        """[policy] keys set for a built-in model (pixel, tiny-shapes): it ignores the section; a diffusers model's
        [policy] values that are surely a mistake (PolicyConfig.warnings)."""
        from ..models.registry import MODELS as BUILT_IN

        default = PolicyConfig()
        changed = [
            f.name for f in dataclasses.fields(PolicyConfig) if getattr(self.policy, f.name) != getattr(default, f.name)
        ]
        if self.model not in BUILT_IN:
            return self.policy.warnings()
        if not changed:
            return []
        keys = ", ".join(f"policy.{k}" for k in changed)
        return [
            f"warning: {keys} set, but {self.model} is a built-in model and ignores [policy] (diffusers models read it)"
        ]

    def largest_tree(self) -> TreeConfig:
        """The iteration tree with the most nodes at the tree's own width: the static tree, or the schedule's window
        at its earliest start (an earlier split leaves more steps at the wider width), [splits] at their earliest
        steps (per-prompt budgets: budget_nodes)."""
        tree = self.scheduled_tree()
        if self.splits.kind != "static":  # every split as early as it may go
            dense = densest_steps(self.splits, tuple(sorted(set(tree.split_steps))))
            tree = dataclasses.replace(tree, split_steps=dense)
        return tree

    def scheduled_tree(self) -> TreeConfig:
        """The tree of the [schedule]'s window at its earliest start (the static tree without a schedule)."""
        if self.schedule.kind == "static":
            return self.tree
        start = 0 if self.schedule.kind == "geometric" else self.schedule.start
        window = tuple(range(start, start + self.schedule.window))
        splits = {"none": self.tree.split_steps, "first": (start,), "all": window}[self.schedule.split]
        return dataclasses.replace(self.tree, sde_steps=window, split_steps=splits)

    def _check_scheduled_tree(self) -> None:
        """A [schedule] that sets the split steps keeps the [tree] rules (tree.dynamic's two splits, tree.max_evals)
        at every iteration, said before anything is loaded rather than at the first rollout."""
        if self.schedule.kind == "static" or self.schedule.split == "none":
            return
        tree = self.scheduled_tree()
        try:
            tree.validate(self.sampler.steps, self.sampler.decode)
        except ConfigError as e:
            raise ConfigError(
                f"schedule.split = {shown(self.schedule.split)} splits at {shown(list(tree.split_steps))} "
                f"(schedule.window = {self.schedule.window}): {e}"
            ) from None

    def rollout_nodes(self, num_prompts: int | None = None) -> tuple[int, int]:
        """(nodes of one rollout, nodes per tree), in closed form; with a schedule, of its largest tree; with
        per-prompt budgets, the most a tree holds on average (budget_nodes)."""
        tree, steps = self.largest_tree(), self.sampler.steps
        per_tree = self.budget_nodes() if self.budget.mode != "off" else tree.model_evals(steps) + tree.leaves(steps)
        return per_tree * self.tree.trees_per_prompt * (num_prompts or self.rollout.num_prompts), per_tree

    def budget_nodes(self) -> int:
        """Per-prompt budgets keep an iteration's leaves at w a tree on average (w the tree's own leaves), so its
        trees hold on average at most g(w) nodes, g the upper concave envelope of nodes(b) over the widths b the
        budget allows: no mix of widths with mean w holds more (Jensen), though every tree at the widest would."""
        tree, steps = self.largest_tree(), self.sampler.steps
        w = tree.leaves(steps)
        lo, hi = self.budget.bounds(w)
        if hi - lo > MAX_BUDGET_SPAN:  # too many widths to look at: every tree at the widest (a bound too)
            return dataclasses.replace(tree, width=hi, max_evals=0).model_evals(steps) + hi
        nodes = [(b, dataclasses.replace(tree, width=b, max_evals=0).model_evals(steps) + b) for b in range(lo, hi + 1)]
        hull: list[tuple[int, int]] = []  # upper hull, left to right
        for b, n in nodes:
            while len(hull) > 1 and (hull[-1][0] - hull[-2][0]) * (n - hull[-2][1]) >= (b - hull[-2][0]) * (
                hull[-1][1] - hull[-2][1]
            ):
                hull.pop()  # hull[-1] lies on or below the chord from hull[-2] to (b, n)
            hull.append((b, n))
        if len(hull) == 1:  # one width allowed: w
            return hull[0][1]
        (a, fa), (c, fc) = next((p, q) for p, q in zip(hull, hull[1:], strict=False) if p[0] <= w <= q[0])
        return math.ceil(fa + (fc - fa) * (w - a) / (c - a))

    def check_tree_memory(self, latent_shape: tuple[int, ...], num_prompts: int | None = None) -> None:
        """Bounded memory, once the model's latent shape is known: every node keeps an fp32 latent."""
        nodes, _ = self.rollout_nodes(num_prompts)
        gib = nodes * math.prod(latent_shape) * 4 / 2**30
        if gib > self.rollout.max_tree_gib:
            raise ConfigError(
                f"one rollout would keep {nodes:,} node latents of shape {tuple(latent_shape)}: "
                f"{gib:.3g} GiB of host memory, more than rollout.max_tree_gib = "
                f"{self.rollout.max_tree_gib:g}; lower rollout.num_prompts or the tree's size, or "
                "raise rollout.max_tree_gib"
            )

    def _check_size(self) -> None:
        """Bounded work: the nodes of one iteration's trees, before anything is sampled."""
        nodes, per_tree = self.rollout_nodes()
        if nodes > self.rollout.max_nodes:
            sizes = ["tree.branch", "the split steps"]  # and the keys that set a budgeted tree's size
            sizes += [f"tree.{k}" for k in ("width", "max_evals") if getattr(self.tree, k)]
            sizes += ["budget.max_width"] if self.budget.mode != "off" else []
            raise ConfigError(
                f"one rollout would hold {nodes:,} nodes ({per_tree:,} per tree"
                f"{' on average, as per-prompt budgets may spread them' if self.budget.mode != 'off' else ''} x "
                f"{self.tree.trees_per_prompt} trees x "
                f"{self.rollout.num_prompts} prompts), more than rollout.max_nodes = {self.rollout.max_nodes:,}; "
                f"lower {', '.join(sizes)} or rollout.num_prompts, or raise rollout.max_nodes"
            )

    def to_dict(self) -> dict[str, Any]:
        return as_json(self)


def check_run_name(name: str) -> None:
    """A run name is a name, not a path: the default run folder is runs/<name>-<time>."""
    for bad, why in (
        (not name, "is empty"),
        ("/" in name or "\\" in name, "holds a / or \\"),
        (name in (".", ".."), "is . or .."),
        (not name.isprintable(), "holds a control character"),
        (len(name.encode()) > MAX_NAME_BYTES, f"is longer than {MAX_NAME_BYTES} bytes"),
    ):
        if bad:
            raise ConfigError(
                f"name {shown(name)} {why}: a run name is a name, not a path (the run folder is runs/<name>-<time>)"
            )


def check_eval_size(num_prompts: int, num_images: int, steps: int | None) -> None:
    """Bounded work of an evaluation, before any model is loaded: --steps, --num-images and their product with
    the prompts."""
    if steps is not None and steps > MAX_STEPS:
        raise ConfigError(f"--steps {steps:,} is more than the maximum of {MAX_STEPS:,} denoising steps")
    if num_images > MAX_IMAGES:
        raise ConfigError(f"--num-images {num_images:,} is more than the maximum of {MAX_IMAGES:,} images per prompt")
    if num_prompts * num_images > MAX_IMAGES:
        raise ConfigError(
            f"{num_prompts:,} prompts x {num_images:,} images = {num_prompts * num_images:,} images, more than the "
            f"maximum of {MAX_IMAGES:,} of one evaluation; lower --num-images or --num-prompts"
        )


def as_json(obj: Any) -> dict[str, Any]:
    """A config dataclass as JSON-able values (tuples -> lists, inf -> "inf")."""
    return _jsonable(dataclasses.asdict(obj))


def _jsonable(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, float) and math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return x

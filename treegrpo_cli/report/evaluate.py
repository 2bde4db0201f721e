"""Evaluation: the held-out reward of training runs, and `treegrpo eval` (reward metrics of a model,
a training checkpoint or a folder of images, optionally against a baseline).

`run_eval` streams: it generates (or reads) at most `batch` images at a time, scores them with every
metric, keeps the per-image scores and the first few images for the sample grid, and drops the rest.
Images are sampled through training/sampling.py from the held-out evaluation's seed stream: sample j of
prompt p is the same whatever the batch size, a model and its baseline see the same noises (a paired
comparison), and `--checkpoint RUN --seed S` draws the images of the run's own held-out evaluation when
S is the run's seed. Nothing here prints; progress goes through `progress(phase, done, total)`.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from ..config import Config, config_from_dict, load_config
from ..engine.protocols import Kernel
from ..engine.rollout import Progress
from ..engine.sde import SamplerConfig, make_kernel
from ..errors import ConfigError, TreegrpoError
from ..models import hub
from ..models.base import Policy
from ..models.registry import MODELS, load_policy
from ..rewards.base import DTYPES, Reward, parse_reward_options, spec
from ..store.checkpoint import MANIFEST, check_checkpoint, damaged_checkpoints, list_checkpoints, load_checkpoint
from ..training.sampling import BATCH, Chunk, build_rewards, sample_chunks, score, stream_seed
from .evalio import GRID_IMAGES, Scored, Source, image_folder

if TYPE_CHECKING:
    from ..training.needs import ModelNeed

# --- treegrpo eval ---------------------------------------------------------------------------


@dataclass
class EvalRequest:
    metrics: tuple[str, ...] = ("shapes",)
    prompts: list[str] = field(default_factory=list)  # generation: the prompt list
    model: str | None = None  # a model name or weights file (default: Config().model)
    checkpoint: Path | None = None  # a training checkpoint: step-N folder, its checkpoints/ folder or the run
    ema: bool = True  # a checkpoint's EMA weights when it has them
    num_images: int = 1  # samples per prompt (the CLI's default: default_num_images)
    seed: int = 0
    sde: bool = False  # SDE sampling at every step instead of the ODE
    steps: int | None = None  # denoising steps (default: the config's)
    images: Path | None = None  # score this folder instead of generating (see image_folder)
    prompts_file: Path | None = None  # --images: the image -> prompt map (default: the folder's prompts.json/.csv)
    baseline: str | None = None  # a model, a checkpoint or (with images) another image folder
    batch: int = 16  # images generated and scored at a time
    max_batch: int = 64  # rows per model forward
    device: str = "cpu"
    reward_dtype: str | None = None  # float32 (default), bfloat16 or float16 for the reward models
    reward_options: dict[str, dict[str, str]] = field(default_factory=dict)
    preset: str | None = None  # --model's config: this preset (default: the base config) ...
    config: Path | None = None  # ... with this config file ...
    sets: tuple[str, ...] = ()  # ... and these --set items over it


def source_config(req: EvalRequest) -> Config:
    """The config a request samples with, read without loading weights: a checkpoint's own (its run's sampler,
    held-out prompts and rewards), else --model's under the preset, config file and --set items given."""
    check_sources(req)
    if req.checkpoint is not None:
        if req.preset or req.config or req.sets:
            raise ConfigError(
                "a checkpoint samples with its run's config; --preset, --config and --set apply to --model"
            )
        state = check_checkpoint(find_checkpoint(req.checkpoint))
        if "config" not in state:
            raise TreegrpoError(f"{req.checkpoint}: the checkpoint does not record its config")
        return config_from_dict(state["config"])
    sets = [*req.sets, *([f"model={json.dumps(req.model)}"] if req.model else [])]
    return load_config(req.preset, req.config, sets)


def default_num_images(req: EvalRequest, cfg: Config) -> int:
    """Samples per prompt when --num-images is not given: a checkpoint's run's held-out evaluation's
    (train.eval_samples), else 1."""
    return cfg.train.eval_samples if req.checkpoint is not None and cfg.train.eval_samples > 0 else 1


def eval_rewards(req: EvalRequest) -> dict[str, Reward]:
    """Every metric's reward on req.device (fails before any image is generated), with the source config's
    reward options and frame stride (a checkpoint's run's: scored as its held-out evaluation was) under
    --reward-opt's."""
    names = list(dict.fromkeys(req.metrics))
    if not names:
        raise ConfigError("--metric needs at least one reward name")
    for name in names:
        spec(name)
    stray = sorted(set(req.reward_options) - set(names))
    if stray:
        raise ConfigError(f"reward options for {stray[0]!r}, which --metric does not name")
    reward = source_config(req).reward if req.images is None else Config().reward
    return build_rewards(reward, req.device, names=names, options=req.reward_options, dtype=req.reward_dtype)


def check_needs(req: EvalRequest) -> None:
    """The pre-flight of `eval` (training/needs.py): the model (--model's or the checkpoint's), the baseline's and
    every metric's reward, with their files; one error line naming all that is missing, before any image is made."""
    from ..training.needs import ModelNeed, check

    stray = sorted(set(req.reward_options) - set(req.metrics))
    if stray:
        raise ConfigError(f"reward options for {stray[0]!r}, which --metric does not name")
    cfg = source_config(req) if req.images is None else None  # the model's or the checkpoint's run's config
    models = []
    if cfg is not None:
        models.append(ModelNeed(cfg.model, cfg.policy, f"--checkpoint {req.checkpoint}" if req.checkpoint else ""))
        models += [_baseline_need(req.baseline)] if req.baseline else []
    reward = cfg.reward if cfg is not None else Config().reward
    options = {n: o for n, o in parse_reward_options(reward.options).items() if n in req.metrics}
    for n, o in req.reward_options.items():
        options[n] = {**options.get(n, {}), **o}
    check(models, req.metrics, options)


def _baseline_need(baseline: str) -> ModelNeed:
    """--baseline as the model it loads: a checkpoint's (its run's config) or a model name under its defaults."""
    from ..training.needs import ModelNeed

    if Path(baseline).is_dir():
        state = check_checkpoint(find_checkpoint(Path(baseline)))
        if "config" not in state:
            raise TreegrpoError(f"{baseline}: the checkpoint does not record its config")
        cfg = config_from_dict(state["config"])
    else:
        cfg = load_config(sets=[f"model={json.dumps(baseline)}"])  # as load_source_policy builds it
    return ModelNeed(cfg.model, cfg.policy, f"--baseline {baseline}")


def run_eval(
    req: EvalRequest, progress: Progress = lambda phase, done, total: None
) -> tuple[dict[str, Any], dict[str, Scored]]:
    """Score the request's images with every metric. Returns (summary, scored): the summary is JSON-able,
    {"metrics": {name: {"mean", "std", "n"[, "baseline_mean", "baseline_std", "baseline_n", "delta"]}},
    "source": ..., ...}; scored holds the per-image rows and grid images of each source (write_outputs).
    The baseline's policy is loaded only after the model's is released."""
    _check(req)
    rewards = eval_rewards(req)
    sampler = None
    folder_base: Source | None = None  # the baseline as a folder (with --images)
    base_spec: tuple[str | None, Path | None] | None = None  # the baseline as a model (without)
    if req.images is not None:
        main = image_folder(req.images, req.prompts_file, req.batch)
        folder_base = image_folder(Path(req.baseline), None, req.batch) if req.baseline else None
    else:
        base_spec = _baseline_spec(req.baseline) if req.baseline else None
        main, sampler = policy_source(req, req.model, req.checkpoint, None)
    scored = {"model": score_source(main, rewards, progress, "")}
    summary = {
        "metrics": {},
        "source": main.info,
        "images": main.total,
        "seed": req.seed,
        "sampling": "folder" if sampler is None else ("sde" if req.sde else "ode"),
    }
    del main  # release the model before the baseline
    if req.baseline:
        if folder_base is not None:  # --images: the baseline is a folder too
            base = folder_base
        else:
            assert base_spec is not None  # parsed above whenever there is a baseline and no --images
            base = policy_source(req, *base_spec, sampler)[0]
        scored["baseline"] = score_source(base, rewards, progress, "baseline ")
        summary["baseline"] = base.info
    summary["metrics"] = _metrics(scored)
    if sampler is not None:
        summary.update(sampler=dataclasses.asdict(sampler), num_images=req.num_images, prompts=len(req.prompts))
    return summary, scored


def _check(req: EvalRequest) -> None:
    if req.num_images < 1 or req.batch < 1 or req.max_batch < 1:
        raise ConfigError("--num-images, --batch and --max-batch must be >= 1")
    if req.reward_dtype is not None and req.reward_dtype not in DTYPES:
        raise ConfigError(f"--reward-dtype {req.reward_dtype!r} is not a dtype; use one of {', '.join(DTYPES)}")
    if req.images is None and not req.prompts:
        raise ConfigError("no prompts to generate from")
    check_sources(req)


def check_sources(req: EvalRequest) -> None:
    if req.images is not None and (req.model or req.checkpoint):
        raise ConfigError("--images scores a folder; leave out --model and --checkpoint")
    if req.model and req.checkpoint:
        raise ConfigError("give --model or --checkpoint, not both (a checkpoint names its model)")


def _baseline_spec(spec_: str) -> tuple[str | None, Path | None]:
    """A folder is a checkpoint (or a run); anything else a model name or weights file. Checked now, before
    the model is generated: the name, or the checkpoint's own files, config and model (no weight is read)."""
    if Path(spec_).is_dir():
        step = find_checkpoint(Path(spec_))
        state = check_checkpoint(step)
        if "config" not in state:
            raise TreegrpoError(f"{step}: the checkpoint does not record its config")
        check_model_name(config_from_dict(state["config"]).model)
        return None, step
    check_model_name(spec_)
    return spec_, None


def check_model_name(name: str) -> None:
    """A model name or weights file that load_policy accepts, checked without loading anything."""
    if name in MODELS or hub.is_diffusers_name(name):
        return
    if name.endswith(".safetensors"):
        if not Path(name).is_file():
            raise TreegrpoError(f"model weights not found: {name}")
        return
    load_policy(name)  # no loader takes this name: raises the registry's one line (available models, a hint)


# --- sources ---------------------------------------------------------------------------------


def find_checkpoint(path: Path) -> Path:
    """A step-N folder, or the newest complete one under a checkpoints/ folder or a run folder."""
    path = Path(path)
    if (path / MANIFEST).is_file():
        return path
    done = list_checkpoints(path) or list_checkpoints(path / "checkpoints")
    if not done:
        damaged = damaged_checkpoints(path) or damaged_checkpoints(path / "checkpoints")
        if damaged:  # named, never used
            raise TreegrpoError(f"{path}: no complete checkpoint; {damaged[-1][1]}")
        raise TreegrpoError(f"{path}: no training checkpoint (a step-N folder with {MANIFEST}, or a run folder)")
    return done[-1]


def load_source_policy(
    model: str | None, checkpoint: Path | None, ema: bool, device: str, base: Config | None = None
) -> tuple[Policy, Config, dict[str, Any]]:
    """The policy of a model name/file (under `base`, the config it samples with, when given) or of a training
    checkpoint (EMA weights when asked and present)."""
    if checkpoint is None:
        cfg = base or load_config(sets=[f"model={json.dumps(model or Config().model)}"])  # the model's defaults
        return load_policy(cfg.model, device, cfg.policy), cfg, {"model": cfg.model}
    step = find_checkpoint(checkpoint)
    ck = load_checkpoint(step)
    if "config" not in ck.state:
        raise TreegrpoError(f"{step}: the checkpoint does not record its config")
    cfg = config_from_dict(ck.state["config"])
    policy = load_policy(cfg.model, device, cfg.policy)
    ema_state = ck.ema if ema else None  # the EMA weights, when asked for and present
    use_ema = ema_state is not None
    policy.load_trainable_state(ema_state if ema_state is not None else ck.model)
    return (
        policy,
        cfg,
        {"model": cfg.model, "checkpoint": str(step), "step": ck.step, "weights": "ema" if use_ema else "trained"},
    )


def policy_source(
    req: EvalRequest, model: str | None, checkpoint: Path | None, sampler: SamplerConfig | None
) -> tuple[Source, SamplerConfig]:
    """Generated images; the sampler is the source's config (or the one given, for a baseline)."""
    base = source_config(req) if sampler is None and checkpoint is None else None  # the main source's config
    policy, cfg, info = load_source_policy(model, checkpoint, req.ema, req.device, base)
    if sampler is None:
        sampler = dataclasses.replace(cfg.sampler, steps=req.steps) if req.steps else cfg.sampler
        sampler.validate()
    sde = make_kernel(policy, sampler)
    total = len(req.prompts) * req.num_images
    label = info.get("checkpoint", info["model"])

    def chunks() -> Iterator[Chunk]:
        return generate(
            policy,
            sde,
            req.prompts,
            num_images=req.num_images,
            seed=req.seed,
            stochastic=req.sde,
            batch=req.batch,
            max_batch=req.max_batch,
        )

    return Source(label, total, chunks, info), sampler


def generate(
    policy: Policy,
    sde: Kernel,
    prompts: list[str],
    *,
    num_images: int,
    seed: int,
    stochastic: bool = False,
    batch: int = BATCH,
    max_batch: int = 64,
) -> Iterator[Chunk]:
    """num_images samples of every prompt, at most `batch` per rollout, from the held-out evaluation's seed
    stream (sampling.py): sample j of prompt p is the one a run seeded with `seed` evaluates."""
    return sample_chunks(
        policy,
        sde,
        prompts,
        stream_seed(seed, "heldout"),
        samples=num_images,
        batch=batch,
        max_batch=max_batch,
        stochastic=stochastic,
    )


def score_source(source: Source, rewards: dict[str, Reward], progress: Progress, prefix: str) -> Scored:
    """Every metric of every image of a source, streamed chunk by chunk (one chunk in memory)."""
    rows: list[dict[str, Any]] = []
    scores: dict[str, list[Tensor]] = {n: [] for n in rewards}
    grid: list[Tensor] = []
    captions: list[str] = []
    first = next(iter(rewards))
    for chunk in source.chunks():
        progress(f"{prefix}generate", len(rows) + len(chunk.prompts), source.total)
        vals = score(rewards, chunk)  # {name: [b]}
        for k, prompt in enumerate(chunk.prompts):
            rows.append(
                {"index": len(rows), **chunk.keys[k], "prompt": prompt, **{n: float(v[k]) for n, v in vals.items()}}
            )
            if len(grid) < GRID_IMAGES and (not grid or grid[0].shape == chunk.images[k].shape):
                grid.append((chunk.images[k].clamp(0, 1) * 255).round().to(torch.uint8))  # [3, (F,) H, W]
                captions.append(f"{prompt} ({first} {float(vals[first][k]):.3f})")
        for n, v in vals.items():
            scores[n].append(v)
        progress(f"{prefix}score", len(rows), source.total)
    return Scored(
        rows,
        {n: torch.cat(v) if v else torch.zeros(0) for n, v in scores.items()},
        torch.stack(grid) if grid else None,
        captions,
    )


def _metrics(scored: dict[str, Scored]) -> dict[str, dict[str, Any]]:
    out = {}
    for name, v in scored["model"].scores.items():
        out[name] = _stats(v)
        if "baseline" in scored:
            b = _stats(scored["baseline"].scores[name])
            out[name].update(
                baseline_mean=b["mean"], baseline_std=b["std"], baseline_n=b["n"], delta=out[name]["mean"] - b["mean"]
            )
    return out


def _stats(v: Tensor) -> dict[str, Any]:
    n = int(v.numel())
    return {"mean": float(v.mean()) if n else float("nan"), "std": float(v.std()) if n > 1 else 0.0, "n": n}

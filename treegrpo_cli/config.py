"""Run configuration: presets (TOML files), a config file and `--set key=value` compose into one Config.

Precedence: preset < --config FILE < --set (the command line wins). Unknown keys are an error
naming the key and the closest valid one.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .engine.advantages import AdvantageConfig
from .engine.budgets import BudgetConfig
from .engine.grpo import TrainConfig
from .engine.nft import NFTConfig
from .engine.pruning import PruneConfig
from .engine.rollout import TreeConfig
from .engine.schedules import ScheduleConfig
from .engine.sde import MAX_STEPS, SamplerConfig
from .engine.splits import SplitConfig, check_adaptive
from .errors import ConfigError
from .models.base import DTYPE_NAMES, PolicyConfig
from .store.safeio import TooDeep, loads_toml, shown

PRESET_DIRS = (Path(__file__).parent / "presets", Path(__file__).resolve().parents[1] / "presets")
COMBINES = ("rewards", "advantages")

# Stated maxima of the counts that scale the work of an iteration or an evaluation, checked in closed form
# before anything is loaded or sampled (generous: the references train on 16 to 64 prompts an iteration,
# with at most a few thousand nodes per tree). Steps: engine.sde.MAX_STEPS; trees per prompt:
# engine.rollout.MAX_TREES_PER_PROMPT.
MAX_PROMPTS = 100_000  # rollout.num_prompts: prompts of one rollout
MAX_NODES = 100_000_000  # rollout.max_nodes may not be raised past this: nodes of one rollout, each keeping a latent
MAX_IMAGES = 100_000  # images of one evaluation: eval's prompts x --num-images, train.eval_samples per prompt
MAX_NAME_BYTES = 200  # a run name (the folder runs/<name>-<time>), in UTF-8 bytes


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
            raise ConfigError(f"reward.names has {twice[0]!r} twice; name each reward once, with one weight")
        w = self.weights or tuple(1.0 for _ in self.names)
        if len(w) != len(self.names):
            raise ConfigError(f"reward.weights has {len(w)} values for {len(self.names)} rewards")
        if all(x == 0 for x in w):
            raise ConfigError(
                f"reward.weights are all zero ({list(w)}): every image would score 0 and nothing would train"
            )
        if self.combine not in COMBINES:
            raise ConfigError(f"reward.combine must be one of {', '.join(COMBINES)}; got {self.combine!r}")
        return dict(zip(self.names, map(float, w), strict=True))


@dataclass(frozen=True)
class RolloutConfig:
    num_prompts: int = 4  # prompts per rollout (per training iteration)
    max_batch: int = 64  # rows per model forward
    prompts: str = (
        "default"  # training prompts: a file, or a built-in list (default, shapes-train, shapes-test, shapes-pretrain)
    )
    eval_prompts: str = "default"  # prompts of the sample grids
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
    "train": TrainConfig,
    "nft": NFTConfig,
    "policy": PolicyConfig,
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
    train: TrainConfig = field(default_factory=TrainConfig)
    nft: NFTConfig = field(default_factory=NFTConfig)  # train.objective = "nft" only (engine/nft.py)
    policy: PolicyConfig = field(default_factory=PolicyConfig)  # diffusers models only (models/base.py)

    def validate(self) -> Config:
        check_run_name(self.name)
        self.sampler.validate()
        self.tree.validate(self.sampler.steps, self.sampler.decode)
        self.advantage.validate()
        self.pruning.validate()
        self.reward.weight_map()
        self.schedule.validate(self.sampler.steps, self.sampler.decode)
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
        if self.train.eval_samples > MAX_IMAGES:
            raise ConfigError(
                f"train.eval_samples = {self.train.eval_samples:,} is more than the maximum of {MAX_IMAGES:,} "
                "images per prompt"
            )
        self.policy.validate()
        if self.policy.weights == "random":
            from .models.releases import check_random

            check_random(self.model, self.policy.size)
        self.rollout.validate()
        self._check_size()
        return self

    def warnings(self) -> list[str]:
        """Legal values that are almost surely a mistake, one line each (for the commands to print)."""
        out = [
            f"warning: reward {name!r} has weight 0: it is scored and logged but does not count"
            for name, w in self.reward.weight_map().items()
            if w == 0
        ]
        if self.train.lr >= 1:
            out.append(f"warning: train.lr = {self.train.lr:g} is far above the references' 1e-5 to 1e-3")
        if self.train.clip_range >= 1:
            out.append(
                f"warning: train.clip_range = {self.train.clip_range:g} clips nothing (ratios from 0 up pass); "
                "the references use 1e-4 to 1e-2"
            )
        return out

    def largest_tree(self) -> TreeConfig:
        """The iteration tree with the most nodes: the static tree, or the schedule's window at its earliest
        start (an earlier split leaves more steps at the wider width); [splits] at their earliest steps, and the
        widest per-prompt budget."""
        tree = self.tree
        if self.schedule.kind != "static":
            start = 0 if self.schedule.kind == "geometric" else self.schedule.start
            window = tuple(range(start, start + self.schedule.window))
            splits = {"none": self.tree.split_steps, "first": (start,), "all": window}[self.schedule.split]
            tree = dataclasses.replace(self.tree, sde_steps=window, split_steps=splits)
        if self.splits.kind != "static":  # every split as early as it may go
            m = len(self.splits.early) if self.splits.kind == "progress" else len(tree.split_steps)
            tree = dataclasses.replace(tree, split_steps=tuple(range(m)))
        if self.budget.mode != "off":
            width = self.budget.bounds(tree.leaves(self.sampler.steps))[1]
            tree = dataclasses.replace(tree, width=width, max_evals=0)
        return tree

    def rollout_nodes(self, num_prompts: int | None = None) -> tuple[int, int]:
        """(nodes of one rollout, nodes per tree), in closed form; with a schedule, of its largest tree."""
        tree, steps = self.largest_tree(), self.sampler.steps
        per_tree = tree.model_evals(steps) + tree.leaves(steps)
        return per_tree * self.tree.trees_per_prompt * (num_prompts or self.rollout.num_prompts), per_tree

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
            raise ConfigError(
                f"one rollout would hold {nodes:,} nodes ({per_tree:,} per tree x {self.tree.trees_per_prompt} trees x "
                f"{self.rollout.num_prompts} prompts), more than rollout.max_nodes = {self.rollout.max_nodes:,}; "
                "lower tree.branch, the split steps or rollout.num_prompts, or raise rollout.max_nodes"
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
                f"name {name!r} {why}: a run name is a name, not a path (the run folder is runs/<name>-<time>)"
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


# --- presets ---------------------------------------------------------------------------------


def preset_path(name: str) -> Path:
    for d in PRESET_DIRS:
        p = d / f"{name}.toml"
        if p.is_file():
            return p
    names = preset_names()
    close = difflib.get_close_matches(name, names, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    raise ConfigError(f"unknown preset {name!r} (available: {', '.join(names)}){hint}")


def preset_names() -> list[str]:
    for d in PRESET_DIRS:
        if d.is_dir() and any(d.glob("*.toml")):
            return sorted(p.stem for p in d.glob("*.toml"))
    return []


def read_toml(path: Path) -> dict[str, Any]:
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"config file not found: {path}")
    if not path.is_file():  # a folder, a FIFO (reading it would block), a device such as /dev/zero
        raise ConfigError(f"config file {path} is not a regular file")
    try:
        return loads_toml(path.read_bytes().decode("utf-8-sig"))  # a byte-order mark (Windows editors) reads too
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: not valid TOML ({e})") from None


# --- composing -------------------------------------------------------------------------------


def _valid_keys() -> list[str]:
    keys = list(TOP_LEVEL)
    for sec, cls in SECTIONS.items():
        keys += [f"{sec}.{f.name}" for f in dataclasses.fields(cls)]
    return keys


# names other trainers (diffusers' scripts, flow_grpo, DanceGRPO, TRL) give a setting -> the key here
SYNONYMS = {
    "learning_rate": "lr",
    "lr_rate": "lr",
    "num_iterations": "iterations",
    "max_steps": "iterations",
    "num_train_steps": "iterations",
    "num_inference_steps": "steps",
    "num_steps": "steps",
    "sample_steps": "steps",
    "guidance_scale": "guidance",
    "cfg_scale": "guidance",
    "mixed_precision": "dtype",
    "precision": "dtype",
    "rank": "lora_rank",
    "alpha": "lora_alpha",
    "batch_size": "num_prompts",
    "train_batch_size": "num_prompts",
    "weight_decay": "weight_decay",
    "beta": "kl_beta",
    "kl_coef": "kl_beta",
    "clip_ratio": "clip_range",
    "cliprange": "clip_range",
    "resolution": "resolution",
    "image_size": "resolution",
    "height": "resolution",
    "width": "resolution",
    "seed": "seed",
}


def _synonym(key: str) -> str | None:
    """The valid key another trainer's name for a setting stands for (train.learning_rate -> train.lr)."""
    word = key.rsplit(".", 1)[-1].lower()
    target = SYNONYMS.get(word)
    if target is None:
        return None
    valid = _valid_keys()
    section = key.split(".", 1)[0] if "." in key else ""
    matches = [k for k in valid if k == target or k.endswith("." + target)]
    same = [k for k in matches if k.startswith(section + ".")]
    found = same or matches
    return found[0] if found else None


def _unknown(key: str) -> ConfigError:
    close = None
    if len(key) < 100:  # a huge key is named short, without a fuzzy match over it
        close = _synonym(key) or next(iter(difflib.get_close_matches(key, _valid_keys(), n=1, cutoff=0.5)), None)
    hint = f"; did you mean {close!r}?" if close and close != key else ""
    return ConfigError(f"unknown config key {shown(key, 100)}{hint}")


def flatten(d: dict[str, Any]) -> dict[str, Any]:
    """{'tree': {'branch': 2}, 'name': 'x'} -> {'tree.branch': 2, 'name': 'x'}, checking every key."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        if k in SECTIONS:
            if not isinstance(v, dict):
                raise ConfigError(f"config section [{k}] must be a table")
            for kk, vv in v.items():
                out[f"{k}.{kk}"] = vv
        else:
            out[k] = v
    valid = set(_valid_keys())
    for k in out:
        if k not in valid:
            raise _unknown(k)
    return out


def parse_set(item: str) -> tuple[str, Any]:
    """'tree.branch=3' -> ('tree.branch', 3); values are TOML literals, bare words are strings."""
    if "=" not in item:
        hint = ""
        if item.strip() in set(_valid_keys()):
            hint = f" (the value goes after '=' in the same argument: --set {item.strip()}=VALUE)"
        raise ConfigError(f"--set expects key=value, got {shown(item)}{hint}")
    key, raw = (s.strip() for s in item.split("=", 1))
    try:
        value = loads_toml(f"v = {raw}")["v"]
    except TooDeep as e:
        raise ConfigError(f"--set {shown(key)}: {e}") from None
    except tomllib.TOMLDecodeError:
        value = raw
    if key not in set(_valid_keys()):
        raise _unknown(key)
    return key, value


def _coerce(cls: type, name: str, value: Any) -> Any:
    f = {f.name: f for f in dataclasses.fields(cls)}[name]
    typ = str(f.type)
    if isinstance(value, str) and value.lower() in ("none", "all") and f.default is None:
        return None
    if isinstance(value, str) and value.strip().lower() == "none" and typ.endswith("| None"):
        return None  # "none" turns off an optional number (advantage.clamp), as the type message promises
    if isinstance(value, list):
        return tuple(value)
    if "float" in typ and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if "tuple" in typ and value is not None and not isinstance(value, tuple):
        return (value,)
    return value


ALLOW_INF = {"tree.branch_s"}  # the one float key where inf means something (independent children)
_TYPE_WORDS = {"int": "an integer", "float": "a number", "str": "a string", "bool": "true or false"}


def _describe(typ: str) -> str:
    base = typ.removesuffix(" | None")
    if base.startswith("tuple["):
        word = _TYPE_WORDS[base[len("tuple[") :].split(",")[0]]
        text = f"a list of {word.split(' ', 1)[1]}s" if " " in word else f"a list of {word}"
    else:
        text = _TYPE_WORDS[base]
    return text + (" or none" if typ.endswith("| None") else "")


def _type_ok(base: str, value: Any) -> bool:
    if base == "bool":
        return isinstance(value, bool)
    if base == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if base == "float":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if base == "str":
        return isinstance(value, str)
    if base.startswith("tuple["):
        inner = base[len("tuple[") :].split(",")[0]
        return isinstance(value, tuple) and all(_type_ok(inner, v) for v in value)
    return True


def _check_value(key: str, typ: str, value: Any) -> None:
    """Type and finiteness of one config value, from its dataclass annotation; one line naming the key."""
    if value is None and typ.endswith("| None"):
        return
    base = typ.removesuffix(" | None")
    if not _type_ok(base, value):
        raise ConfigError(f"{key} must be {_describe(typ)}, got {shown(value)}")
    nums = value if isinstance(value, tuple) else (value,)
    for v in nums:
        if isinstance(v, float) and (math.isnan(v) or (math.isinf(v) and key not in ALLOW_INF)):
            raise ConfigError(f"{key} must be a finite number, got {shown(value)}")


def build(flat: dict[str, Any]) -> Config:
    if isinstance(flat.get("policy.dtype"), str):  # torch's spellings too: bfloat16, float32
        flat = {**flat, "policy.dtype": DTYPE_NAMES.get(flat["policy.dtype"], flat["policy.dtype"])}
    top = {k: v for k, v in flat.items() if "." not in k}
    sections = {}
    for sec, cls in SECTIONS.items():
        vals = {k.split(".", 1)[1]: v for k, v in flat.items() if k.startswith(sec + ".")}
        types = {f.name: str(f.type) for f in dataclasses.fields(cls)}
        coerced = {k: _coerce(cls, k, v) for k, v in vals.items()}
        for k, v in coerced.items():
            _check_value(f"{sec}.{k}", types[k], v)
        sections[sec] = cls(**coerced)
    for k, typ in TOP_LEVEL.items():
        if k in top and not _type_ok(typ.__name__, top[k]):
            raise ConfigError(f"{k} must be {_TYPE_WORDS[typ.__name__]}, got {shown(top[k])}")
    return Config(**top, **sections).validate()


def load_config(
    preset: str | None = None, config_file: Path | None = None, sets: list[str] | tuple[str, ...] = ()
) -> Config:
    """Layered as: preset < the model's defaults < a released model's task < [for_model.MODEL] tables (the
    preset's, then the file's) < --config file < --set (config_layers)."""
    flat: dict[str, Any] = {}
    for _, values in config_layers(preset, config_file, sets):
        flat.update(values)
    return build(flat)


def config_layers(
    preset: str | None = None, config_file: Path | None = None, sets: list[str] | tuple[str, ...] = ()
) -> list[tuple[str, dict[str, Any]]]:
    """[(layer, {key: value})] in the order they apply, the later winning: what `config show --explain` names."""
    from .models.registry import model_defaults

    first: dict[str, Any] = {}
    per_model: list[tuple[str, Any]] = []
    if preset:
        table = read_toml(preset_path(preset))
        per_model.append((f"preset {preset}", table.pop("for_model", {})))
        first.update(flatten(table))
        first.setdefault("name", preset)
    file_values: dict[str, Any] = {}
    if config_file:
        table = read_toml(config_file)
        per_model.append((str(config_file), table.pop("for_model", {})))
        try:
            file_values = flatten(table)
        except ConfigError as e:
            raise ConfigError(f"{config_file}: {e}") from None
    set_values = dict(parse_set(item) for item in sets)
    model = str(set_values.get("model", file_values.get("model", first.get("model", Config.model))))
    layers = [(f"preset {preset}", first), (f"model defaults of {model}", model_defaults(model))]
    layers.append((f"released model {model} (paper reward, general prompts)", release_task(model, preset)))
    layers += [(f"[for_model.{model}] of {src}", for_model(tables, model, src)) for src, tables in per_model]
    return layers + [(f"--config {config_file}", file_values), ("--set", set_values)]


def schedule_warnings(cfg: Config, layers: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """A non-static [schedule] sets the SDE window (and, with schedule.split, the split steps) every iteration: a
    tree.sde_steps / tree.split_steps given by the user's own layers would be silently overridden."""
    if cfg.schedule.kind == "static":
        return []
    owned = ["tree.sde_steps"] + (["tree.split_steps"] if cfg.schedule.split != "none" else [])
    return [
        f"warning: {key} from {layer} is overridden every iteration by schedule.kind = {cfg.schedule.kind!r} "
        f'(set schedule.kind = "static" to keep it)'
        for layer, values in layers
        if layer.startswith(("--config", "--set"))
        for key in owned
        if key in values
    ]


# the reward each method's paper trains a released model on (methods.md); the others HPS-v2.1, as BranchGRPO,
# TreeGRPO and DanceGRPO do; video releases VideoAlign, as DanceGRPO's video runs
PAPER_REWARDS: dict[str, list[str]] = {"flow-grpo": ["pick"], "mix-grpo": ["hps", "pick", "imagereward"]}


def release_task(model: str, preset: str | None) -> dict[str, Any]:
    """What a released model (--model flux-dev, ...) trains on unless told: its preset's paper reward and the
    shipped general prompts, never the embedded world's."""
    from .models import catalog, hub

    if model not in hub.KNOWN:
        return {}
    video = catalog.entries()[hub.KNOWN[model][1]].card.video
    reward = ["videoalign"] if video else PAPER_REWARDS.get(preset or "", ["hps"])
    return {"reward.names": reward, "rollout.prompts": "general-train", "rollout.eval_prompts": "general-test"}


def for_model(tables: Any, model: str, source: str) -> dict[str, Any]:
    """The settings a preset or config file gives one model, e.g. `[for_model.tiny-shapes]` / `train.lr = 3e-5`:
    the presets hold the papers' values, sized for FLUX, and may say what a sweep found best on another model.
    Every model's table is checked, so that a typo fails whichever model runs."""
    if not isinstance(tables, dict) or not all(isinstance(v, dict) for v in tables.values()):
        raise ConfigError(f"{source}: [for_model] must hold one table per model, e.g. [for_model.tiny-shapes]")
    flat = {name: flatten(v) for name, v in tables.items()}
    for name, vals in flat.items():
        if "model" in vals:
            raise ConfigError(f"{source}: [for_model.{name}] cannot set the model")
    return flat.get(model, {})


def config_from_dict(
    d: dict[str, Any], sets: list[str] | tuple[str, ...] = (), overrides: dict[str, Any] | None = None
) -> Config:
    """Rebuild a Config from Config.to_dict() output (as stored in shard metadata), then override."""
    flat = flatten(d)
    for k, v in flat.items():
        if v in ("inf", "-inf"):
            flat[k] = float(v)
    for item in sets:
        k, v = parse_set(item)
        flat[k] = v
    flat.update(overrides or {})
    return build(flat)

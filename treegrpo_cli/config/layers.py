"""Composing a run's configuration: presets (TOML files), the model's defaults, a config file and `--set key=value`
into one Config (config/schema.py).

Precedence: preset < --config FILE < --set (the command line wins). Unknown keys are an error
naming the key and the closest valid one.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..models.base import DTYPE_NAMES
from ..store.safeio import TooDeep, loads_toml, read_text, shown
from .schema import SECTIONS, TOP_LEVEL, Config

# the presets shipped inside the package (treegrpo_cli.presets), else the repository's presets/ folder
PRESET_DIRS = (Path(__file__).resolve().parents[1] / "presets", Path(__file__).resolve().parents[2] / "presets")


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
    text = read_text(path, "config file", ConfigError)  # a byte-order mark (Windows editors) reads too
    try:
        return loads_toml(text)
    except ValueError as e:  # a TOMLDecodeError, or an integer of more than 4,300 digits
        raise ConfigError(f"{path}: not valid TOML ({str(e)[:200]})") from None


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
    except ValueError:  # not a TOML literal (or an integer of more than 4,300 digits): a bare word
        value = _bare_list(key, raw)
    if key not in set(_valid_keys()):
        raise _unknown(key)
    return key, value


FREE_TEXT_LISTS = {"reward.options"}  # entries (NAME.KEY=VALUE) whose value may hold a comma: never split


def _bare_list(key: str, raw: str) -> Any:
    """A --set value that is no TOML literal: a bare word, or for a list key a comma-separated list as train's
    options take them (reward.names=shapes,jpeg-compressibility: words; tree.split_steps=0,3: numbers), with or
    without the brackets (a shell drops the quotes of reward.names=["shapes","hps"] unless the item is quoted)."""
    section, _, name = key.partition(".")
    fields = {f.name: str(f.type) for f in dataclasses.fields(SECTIONS[section])} if section in SECTIONS else {}
    typ = fields.get(name, "")
    bracketed = raw.startswith("[") and raw.endswith("]")
    if not typ.startswith("tuple[") or key in FREE_TEXT_LISTS or not ("," in raw or bracketed):
        return raw
    body = raw[1:-1] if bracketed else raw
    if typ.startswith("tuple[str"):
        return [w.strip() for w in body.split(",") if w.strip()]
    try:
        return loads_toml(f"v = [{body}]")["v"]
    except (ValueError, TooDeep):
        raise ConfigError(
            f"--set {key}: {shown(raw, 60)} is not a list of numbers; write it comma separated ({key}=0,3) or as a "
            f"TOML list, quoted for the shell (--set '{key}=[0, 3]')"
        ) from None


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
MAX_ENTRIES = 1000  # of a list value (no list of steps is longer than the 1,000 steps a sampler takes)
MAX_CHARS = 4096  # of a string value (a path longer than this is no path on Linux)
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
    _check_size(key, value)
    nums = value if isinstance(value, tuple) else (value,)
    for v in nums:
        if isinstance(v, float) and (math.isnan(v) or (math.isinf(v) and key not in ALLOW_INF)):
            raise ConfigError(f"{key} must be a finite number, got {shown(value)}")


def _check_size(key: str, value: Any) -> None:
    """A list or string of a size no setting takes is refused here, by its size: later checks quote what they
    refuse, and a 2-million-entry list or a path longer than the system takes is never passed on."""
    if isinstance(value, tuple) and len(value) > MAX_ENTRIES:
        raise ConfigError(f"{key} has {len(value):,} entries, more than the maximum of {MAX_ENTRIES:,}")
    texts = value if isinstance(value, tuple) else (value,)
    for v in texts:
        if isinstance(v, str) and len(v) > MAX_CHARS:
            raise ConfigError(
                f"{key}: {shown(v, 60)} is {len(v):,} characters long, more than the maximum of {MAX_CHARS:,}"
            )


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
        if k in top:
            _check_size(k, top[k])
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
    from ..models.registry import model_defaults

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


def user_warnings(cfg: Config, layers: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """What a command says of the config its `layers` built: Config.warnings, with a key counted as the user's
    mistake only where it was set in the same layer as, or a later one than, the switch that ignores it
    (`--preset treepo --set tree.dynamic=off` leaves the preset's tree.stop_tol unused, and says nothing), and the
    [schedule] overrides of the user's own layers."""

    def last(key: str) -> int:
        return max((i for i, (_, values) in enumerate(layers) if key in values), default=-1)

    return [*cfg.warnings(lambda key, switch: last(key) < last(switch)), *schedule_warnings(cfg, layers)]


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
    from ..models import catalog, hub

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
            raise ConfigError(f"{source}: [for_model.{shown(name)}] cannot set the model")
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

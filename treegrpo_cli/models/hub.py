"""Where a diffusers model's files are: a local folder, or the local Hugging Face cache; never the network
unless `policy.download = true`.

`--model` takes a known name (KNOWN: a release an adapter's card names), a hub id ("org/name", with
`policy.revision`) or a local folder holding a diffusers pipeline (model_index.json and one folder per component).
The adapter follows from model_index.json's `_class_name`. This module imports neither torch nor diffusers (the
adapters' cards are read from their source, models/catalog.py), so the config layer can ask for an adapter's
defaults cheaply.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from ..errors import ConfigError, TreegrpoError
from ..store.safeio import loads_json, shown
from . import catalog

# derived from the adapters' cards (models/catalog.py): release name -> (hub id, adapter); pipeline class -> adapter;
# hub id -> the settings of one release beyond its adapter's
KNOWN: dict[str, tuple[str, str]] = catalog.known()
PIPELINES: dict[str, str] = catalog.pipelines()
RELEASE_DEFAULTS: dict[str, dict[str, object]] = catalog.release_defaults()
GATED: set[str] = catalog.gated()  # hub ids of the gated releases (their cards')
TEXT_PARTS = ("text_encoder", "text_encoder_2", "text_encoder_3", "tokenizer", "tokenizer_2", "tokenizer_3")
OPTIONAL_PARTS = ("safety_checker", "feature_extractor", "image_encoder")
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
WEIGHTS = ("*.safetensors", "*.bin", "*.safetensors.index.json", "*.bin.index.json")


def local_dir(name: str) -> Path | None:
    """`name` as an existing local folder, else None (also for a string no path can be: too long, a NUL byte)."""
    try:
        folder = Path(name).expanduser()
        return folder if folder.is_dir() else None
    except (OSError, ValueError, RuntimeError):
        return None


def is_diffusers_name(name: str) -> bool:
    """A known name, an existing folder or something shaped like a hub id (not a .safetensors file)."""
    if name in KNOWN or local_dir(name) is not None:
        return True
    return bool(HUB_ID.match(name)) and not name.endswith(".safetensors")


def hub_cache_dir() -> Path:
    """The hub cache, from the environment at call time (HF_HUB_CACHE, else HF_HOME/hub)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    xdg = Path(os.environ.get("XDG_CACHE_HOME", "~/.cache")).expanduser()
    return Path(os.environ.get("HF_HOME", xdg / "huggingface")).expanduser() / "hub"


def repo_id(name: str) -> str:
    return KNOWN[name][0] if name in KNOWN else name


def gated_note(repo: str) -> str:
    """What a gated hub repository asks before `hf download` can fetch it ("" for an open one)."""
    if repo.lower() not in {g.lower() for g in GATED}:
        return ""
    return (
        f"{repo} is a gated repository: accept its terms at https://huggingface.co/{repo} while logged in, then "
        "give the hub a token of that account (`hf auth login`, or $HF_TOKEN) before downloading"
    )


def release_of(name: str) -> str | None:
    """The release (KNOWN name) that `name` spells another way: its hub id or the id's last part, in any case
    ('black-forest-labs/FLUX.1-dev', 'FLUX.1-dev', 'Flux-Dev' -> 'flux-dev'); None when none is."""
    low = name.strip().lower()
    for release, (repo, _) in KNOWN.items():
        if low in (release, repo.lower(), repo.split("/")[-1].lower()):
            return release
    return None


def resolve(name: str, revision: str | None = None, download: bool = False) -> Path:
    """The local folder of --model: the folder itself, or its snapshot in the hub cache."""
    folder = local_dir(name)
    if folder is not None:
        return folder
    repo = repo_id(name)
    if not HUB_ID.match(repo):
        raise ConfigError(f"--model {name!r} is neither a folder nor a hub id (org/name)")
    from huggingface_hub import snapshot_download

    cache = hub_cache_dir()
    try:
        return Path(snapshot_download(repo, revision=revision, cache_dir=cache, local_files_only=not download))
    except Exception as e:  # LocalEntryNotFoundError offline; network and auth errors with download on
        what = f"{name!r} ({repo}@{revision})" if revision else (f"{name!r} ({repo})" if repo != name else repr(name))
        how = (
            f"the download failed ({type(e).__name__})"
            if download
            else "downloads are off (policy.download = true allows one)"
        )
        gate = gated_note(repo)
        known = release_of(name) if name not in KNOWN else None
        raise TreegrpoError(
            f"model weights for {what} are missing: no snapshot (model_index.json, transformer/ or "
            f"unet/, vae/, text_encoder/, tokenizer/, scheduler/) in the local Hugging Face cache "
            f"{cache} ($HF_HUB_CACHE, else $HF_HOME/hub), and {how}; fetch them with `hf download {repo}`, or "
            "pass --model with a local folder holding the diffusers pipeline"
            + (f" ({gate})" if gate else "")
            + (f"; did you mean --model {known!r} (the release, with its card's settings)?" if known else "")
        ) from None


def model_index(folder: Path) -> dict:
    path = folder / "model_index.json"
    if not path.is_file():
        raise TreegrpoError(
            f"{folder}: missing model_index.json; pass --model with a folder written by a "
            "diffusers pipeline's save_pretrained"
        )
    try:
        index = loads_json(path.read_bytes())
    except (ValueError, UnicodeDecodeError) as e:
        raise TreegrpoError(f"{path}: not valid JSON ({str(e)[:100]})") from None
    return checked_index(index, path)


def checked_index(index: object, path: Path) -> dict:
    """model_index.json as the tool reads it: an object, `_class_name` a string, and every component (a list)
    [library, class] of two strings or nulls; one line naming the field otherwise. Other values (a pipeline's
    own settings, such as requires_safety_checker) are the pipeline's to read."""
    if not isinstance(index, dict):
        raise TreegrpoError(f"{path}: must be an object of pipeline components, got {shown(index, 60)}")
    if not isinstance(index.get("_class_name", "?"), str):
        raise TreegrpoError(f"{path}: _class_name must be a string, got {shown(index['_class_name'], 60)}")
    for part, lib_cls in index.items():
        if part.startswith("_") or not isinstance(lib_cls, list):
            continue
        if len(lib_cls) != 2 or not all(x is None or isinstance(x, str) for x in lib_cls):
            raise TreegrpoError(f'{path}: {part} must be ["library", "Class"] or null, got {shown(lib_cls, 60)}')
    return index


def scheduler_number(sched: dict, key: str, default: float, folder: Path | None, whole: bool = False) -> float:
    """A positive finite number of a model folder's scheduler_config.json (its default when absent)."""
    value = sched.get(key, default)
    if value is None:
        return default
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < 1e12
    if not ok or (whole and value != int(value)):
        what = "a positive whole number" if whole else "a positive number"
        raise TreegrpoError(f"{folder}/scheduler/scheduler_config.json: {key} must be {what}, got {shown(value, 60)}")
    return int(value) if whole else float(value)


def pipeline_kind(folder: Path) -> str:
    """The adapter's name (its card's: 'flux', 'sd3', ...) from model_index.json's _class_name."""
    cls = model_index(folder).get("_class_name", "?")
    if cls not in PIPELINES:  # a string: checked_index
        raise TreegrpoError(f"{folder}: pipeline {cls} is not supported (supported: {', '.join(PIPELINES)})")
    return PIPELINES[cls]


def _part_missing(folder: Path, part: str, lib_cls: list) -> list[str]:
    """Files a component needs that are not there (a dangling cache symlink counts as missing)."""
    sub = folder / part
    cls = str(lib_cls[1])
    if "Tokenizer" in cls:
        return [] if sub.is_dir() and any(p.is_file() for p in sub.iterdir()) else [f"{part}/tokenizer files"]
    if "Scheduler" in cls:
        return [] if (sub / "scheduler_config.json").is_file() else [f"{part}/scheduler_config.json"]
    if "Processor" in cls or "FeatureExtractor" in cls:
        return [] if (sub / "preprocessor_config.json").is_file() else [f"{part}/preprocessor_config.json"]
    missing = [] if (sub / "config.json").is_file() else [f"{part}/config.json"]
    if not any(p.is_file() for pattern in WEIGHTS for p in sub.glob(pattern)):
        missing.append(f"{part}/*.safetensors")
    return missing


def missing_files(folder: Path, text_encoders: bool = True) -> list[str]:
    """Files the pipeline in `folder` needs and lacks (sharded weights: the index file counts)."""
    index = model_index(folder)
    missing: list[str] = []
    for part, lib_cls in sorted(index.items()):
        if part.startswith("_") or not isinstance(lib_cls, list) or lib_cls[0] is None or part in OPTIONAL_PARTS:
            continue
        if text_encoders or part not in TEXT_PARTS:
            missing += _part_missing(folder, part, lib_cls)
    return missing


def check_complete(folder: Path, text_encoders: bool = True, name: str | None = None) -> None:
    """Every file the pipeline needs is in `folder` (the text encoders' too, unless text_encoders is False); `name`:
    the --model it came from (a hub snapshot's says how to complete it)."""
    missing = missing_files(folder, text_encoders)
    if missing:
        shown = ", ".join(missing[:6]) + (f" and {len(missing) - 6} more" if len(missing) > 6 else "")
        repo = repo_id(name) if name is not None and local_dir(name) is None else None
        fetch = f"complete the snapshot with `hf download {repo}`, or " if repo else ""
        gate = gated_note(repo) if repo else ""
        raise TreegrpoError(
            f"{folder}: missing {shown}; {fetch}pass --model with a local folder holding the complete diffusers "
            "pipeline" + (f" ({gate})" if gate else "")
        )


# --- config layering --------------------------------------------------------------------------


def _kind_and_folder(name: str) -> tuple[str | None, Path | None]:
    """Adapter and local folder of --model when they can be found without loading anything."""
    folder: Path | None = local_dir(name)
    if folder is None and HUB_ID.match(repo_id(name)) and not name.endswith(".safetensors"):
        try:
            from huggingface_hub import snapshot_download

            folder = Path(snapshot_download(repo_id(name), cache_dir=hub_cache_dir(), local_files_only=True))
        except Exception:
            folder = None
    kind = KNOWN[name][1] if name in KNOWN else None
    if folder is not None and folder.is_dir() and (folder / "model_index.json").is_file():
        try:
            kind = PIPELINES.get(str(model_index(folder).get("_class_name")), kind)
        except TreegrpoError:
            pass  # said when the model is loaded
        return kind, folder
    return kind, None


def _scheduler_config(folder: Path | None) -> dict:
    """The folder's scheduler/scheduler_config.json, or {} when it is not there or not JSON."""
    path = folder / "scheduler" / "scheduler_config.json" if folder else None
    if path is None or not path.is_file():
        return {}
    try:
        sched = loads_json(path.read_bytes())
    except (ValueError, UnicodeDecodeError):
        return {}
    return sched if isinstance(sched, dict) else {}


def adapter_defaults(name: str) -> dict[str, object]:
    """Settings a diffusers adapter layers over a method preset (preset < these < --config < --set): its card's
    defaults, its sampling grid, the settings it reads from the model folder's scheduler config (SD3's
    FlowMatchEuler shift, Wan's flow shift) and the release's own (models/catalog.py AdapterCard)."""
    if not is_diffusers_name(name):
        return {}
    kind, folder = _kind_and_folder(name)
    entry = catalog.entries().get(kind or "")
    out: dict[str, object] = {}
    if entry is not None:
        card = entry.card
        out.update(card.defaults)
        if card.grid != "preset":
            out["sampler.grid"] = card.grid
        sched = _scheduler_config(folder) if card.scheduler else {}
        out.update({key: _from_scheduler(sched, *how, folder=folder) for key, how in card.scheduler.items()})
    out.update(RELEASE_DEFAULTS.get(repo_id(name), {}))
    return out


def _from_scheduler(sched: dict, *names_then_default: object, folder: Path | None) -> float:
    """The first of the names the scheduler config sets (every one it sets is checked), else the default (an int
    default asks for a whole number)."""
    *names, default = names_then_default
    if not isinstance(default, (int, float)):
        raise TypeError(f"a card's scheduler default must be a number, got {default!r}")
    value = default
    for key in reversed(names):
        value = scheduler_number(sched, str(key), value, folder, whole=isinstance(default, int))
    return value

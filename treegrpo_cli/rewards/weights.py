"""Where reward-model weights come from, read-only and offline: nothing here ever downloads.

A needed file (or folder) is looked up, in order, at
    1. the reward's option (e.g. `hps.checkpoint=PATH`, from the caller or `--reward-opt`),
    2. its environment variable(s) (e.g. TREEGRPO_HPS_CHECKPOINT),
    3. ~/.cache/treegrpo/<file> and the usual place of the official tool, when it has one,
    4. the Hugging Face hub cache ($HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub):
       the usual repository and file name, in the snapshot of refs/main or else the newest one.
When anything is missing, `resolve` raises ONE TreegrpoError naming every missing file and how to
supply it. Pickles load with `weights_only=True`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from ..errors import TreegrpoError

CACHE = Path.home() / ".cache" / "treegrpo"


@dataclass(frozen=True)
class Needed:
    """One file or folder a reward model needs, and where it is usually found."""

    what: str  # "HPS v2.1 checkpoint"
    option: str  # "hps.checkpoint"
    env: tuple[str, ...] = ()  # environment variables, first set wins
    hub: tuple[tuple[str, str], ...] = ()  # (repo id, file in the snapshot; "" = the snapshot folder)
    places: tuple[Path, ...] = ()  # other usual places
    needs: tuple[str, ...] = ()  # a folder: it must hold one of these files


def hub_cache() -> Path:
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    return Path.home() / ".cache" / "huggingface" / "hub"


def hub_file(repo: str, filename: str = "", needs: tuple[str, ...] = ()) -> Path | None:
    """A file (or, with filename "", the snapshot folder holding `needs`) of a cached hub repo."""
    root = hub_cache() / f"models--{repo.replace('/', '--')}"
    snaps = root / "snapshots"
    if not snaps.is_dir():
        return None
    ref = root / "refs" / "main"
    order = [snaps / ref.read_text().strip()] if ref.is_file() else []
    order += sorted((p for p in snaps.iterdir() if p.is_dir()), key=lambda p: p.stat().st_mtime, reverse=True)
    for snap in order:
        path = snap / filename if filename else snap
        if _usable(path, needs):
            return path
    return None


def _usable(path: Path, needs: tuple[str, ...]) -> bool:
    return any((path / n).is_file() for n in needs) if needs else path.is_file()


def find(n: Needed, given: str | Path | None) -> Path | None:
    """The path of one needed file; a TreegrpoError when an explicit path or variable points nowhere."""
    if given:
        path = Path(given).expanduser()
        if not _usable(path, n.needs):
            inside = f" holding {' or '.join(n.needs)}" if n.needs else ""
            raise TreegrpoError(f"{n.option}: no {n.what}{inside} at {path}")
        return path
    for var in n.env:
        if os.environ.get(var):
            path = Path(os.environ[var]).expanduser()
            if not _usable(path, n.needs):
                raise TreegrpoError(f"${var}: no {n.what} at {path}")
            return path
    for path in n.places:
        if _usable(path, n.needs):
            return path
    for repo, filename in n.hub:
        hit = hub_file(repo, filename, n.needs)
        if hit is not None:
            return hit
    return None


def resolve(reward: str, items: list[tuple[Needed, str | Path | None]]) -> list[Path]:
    """Every path in order, or one error line naming all the missing ones and how to supply them."""
    found = [find(n, given) for n, given in items]
    missing = [n for (n, _), p in zip(items, found, strict=True) if p is None]
    if missing:
        how = "; ".join(_how(n) for n in missing)
        raise TreegrpoError(f"{reward} weights not found: {how}; nothing is downloaded (see docs/rewards.md)")
    return [p for p in found if p is not None]


def _how(n: Needed) -> str:
    """'HPS v2.1 checkpoint HPS_v2.1_compressed.pt (hub xswu/HPSv2): set $VAR or pass --reward-opt OPT=PATH'."""
    name = next((f for _, f in n.hub if f), "") or next((p.name for p in n.places), "")
    where = f" (hub {n.hub[0][0]})" if n.hub else ""
    ways = [f"set ${n.env[0]}"] if n.env else []
    return f"{n.what}{' ' + name if name else ''}{where}: {' or '.join(ways + [f'pass --reward-opt {n.option}=PATH'])}"


# --- loading ---------------------------------------------------------------------------------


def load_state_dict(path: Path) -> dict[str, Tensor]:
    """Tensors of a .safetensors file or a torch pickle (weights_only), unwrapping 'state_dict' and 'module.'."""
    sd: Any  # whatever the file holds, checked below
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            sd = load_file(str(path))
        else:
            sd = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch.load and safetensors raise many types for a bad file
        raise TreegrpoError(f"{path}: not a loadable weights file ({_short(e)})") from None
    if isinstance(sd, dict) and isinstance(sd.get("state_dict"), dict):
        sd = sd["state_dict"]
    if not isinstance(sd, dict) or not all(torch.is_tensor(v) for v in sd.values()):
        raise TreegrpoError(f"{path}: not a state dict of tensors")
    if sd and all(k.startswith("module.") for k in sd):
        sd = {k[len("module.") :]: v for k, v in sd.items()}
    return sd


def load_strict(module: nn.Module, sd: dict[str, Tensor], path: Path, what: str) -> None:
    """load_state_dict(strict=True), with a one-line error listing what is missing, extra or misshapen."""
    own = module.state_dict()
    missing = [k for k in own if k not in sd]
    extra = [k for k in sd if k not in own]
    shapes = [k for k in own if k in sd and tuple(sd[k].shape) != tuple(own[k].shape)]
    if missing or extra or shapes:
        parts = [f"{len(missing)} tensors missing (e.g. {missing[0]})"] if missing else []
        parts += [f"{len(extra)} unexpected (e.g. {extra[0]})"] if extra else []
        parts += (
            [
                f"{len(shapes)} of another shape (e.g. {shapes[0]}: {tuple(sd[shapes[0]].shape)} "
                f"vs {tuple(own[shapes[0]].shape)})"
            ]
            if shapes
            else []
        )
        raise TreegrpoError(f"{path}: not a {what}: {'; '.join(parts)}")
    module.load_state_dict(sd, strict=True)


def _short(e: BaseException) -> str:
    return " ".join(str(e).split())[:160]

"""Training checkpoints: RUN/checkpoints/step-N/ written to a temporary folder and renamed.

    model.safetensors       the trainable weights
    ema.safetensors         their exponential moving average (when enabled)
    optimizer.safetensors   optimizer tensors (state.<param>.<key>) + optimizer.json (groups, scalars)
    rng.safetensors         torch's RNG states: the CPU generator, and every CUDA device's when there are any
    trainer_state.json      iteration, seed, wall time
    manifest.json           sha256 of every file above; written last, checked on load
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from ..errors import CorruptFileError, TreegrpoError
from .shards import atomic_write, sha256

MANIFEST = "manifest.json"


@dataclass
class Checkpoint:
    step: int                              # completed iterations
    model: dict[str, torch.Tensor]
    ema: dict[str, torch.Tensor] | None
    optimizer: dict[str, Any]              # torch optimizer state_dict
    rng: dict[str, torch.Tensor]           # "torch": the CPU generator's state; "cuda.<i>": each CUDA device's
    state: dict[str, Any]                  # trainer state (JSON-able)


def _optimizer_files(sd: dict[str, Any]) -> tuple[bytes, bytes]:
    tensors, scalars = {}, {}
    for pid, st in sd["state"].items():
        for k, v in st.items():
            if torch.is_tensor(v):
                tensors[f"state.{pid}.{k}"] = v.detach().cpu().contiguous()
            else:
                scalars[f"{pid}.{k}"] = v
    meta = {"param_groups": sd["param_groups"], "scalars": scalars}
    return st_save(tensors), json.dumps(meta).encode()


def _optimizer_from_files(tensor_bytes: bytes, meta_bytes: bytes) -> dict[str, Any]:
    meta = json.loads(meta_bytes)
    state: dict[int, dict[str, Any]] = {}
    for key, t in st_load(tensor_bytes).items():
        _, pid, k = key.split(".", 2)
        state.setdefault(int(pid), {})[k] = t
    for key, v in meta["scalars"].items():
        pid, k = key.split(".", 1)
        state.setdefault(int(pid), {})[k] = v
    return {"state": state, "param_groups": meta["param_groups"]}


def save_checkpoint(folder: Path, ck: Checkpoint, keep_last: int) -> Path:
    """Write step-N atomically (temp folder, fsync, rename), then drop all but the newest keep_last."""
    folder.mkdir(parents=True, exist_ok=True)
    files = {"model.safetensors": st_save({k: v.detach().cpu().contiguous() for k, v in ck.model.items()}),
             "rng.safetensors": st_save({k: v.cpu().contiguous() for k, v in ck.rng.items()}),
             "trainer_state.json": json.dumps(ck.state, indent=1).encode()}
    files["optimizer.safetensors"], files["optimizer.json"] = _optimizer_files(ck.optimizer)
    if ck.ema is not None:
        files["ema.safetensors"] = st_save({k: v.detach().cpu().contiguous() for k, v in ck.ema.items()})
    tmp = Path(tempfile.mkdtemp(prefix=f".step-{ck.step}.", dir=folder))
    for name, data in files.items():
        atomic_write(tmp / name, data)
    atomic_write(tmp / MANIFEST, json.dumps({n: sha256(d) for n, d in files.items()}, indent=1).encode())
    final = folder / f"step-{ck.step}"
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    _fsync_dir(folder)
    for old in list_checkpoints(folder)[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def list_checkpoints(folder: Path) -> list[Path]:
    """Complete checkpoints (those with a manifest), oldest first."""
    if not folder.is_dir():
        return []
    done = [p for p in folder.glob("step-*") if (p / MANIFEST).is_file() and p.name[5:].isdigit()]
    return sorted(done, key=lambda p: int(p.name[5:]))


def load_checkpoint(path: Path) -> Checkpoint:
    """Read and verify one step-N folder."""
    path = Path(path)
    try:
        manifest = json.loads((path / MANIFEST).read_text())
    except FileNotFoundError:
        raise TreegrpoError(f"{path}: not a complete checkpoint (no {MANIFEST})") from None
    except ValueError:
        raise CorruptFileError(f"{path / MANIFEST}: not valid JSON") from None
    data = {}
    for name, digest in manifest.items():
        try:
            blob = (path / name).read_bytes()
        except FileNotFoundError:
            raise CorruptFileError(f"{path / name}: missing (listed in {MANIFEST})") from None
        if sha256(blob) != digest:
            raise CorruptFileError(f"{path / name}: corrupt, its sha256 does not match {MANIFEST}")
        data[name] = blob
    state = json.loads(data["trainer_state.json"])
    return Checkpoint(step=int(state["step"]), model=st_load(data["model.safetensors"]),
                      ema=st_load(data["ema.safetensors"]) if "ema.safetensors" in data else None,
                      optimizer=_optimizer_from_files(data["optimizer.safetensors"], data["optimizer.json"]),
                      rng=st_load(data["rng.safetensors"]), state=state)

"""Training checkpoints: RUN/checkpoints/step-N/ written to a temporary folder and renamed.

    model-00001-of-0000K.safetensors ...   the trainable weights, in shards of at most SHARD_BYTES,
    model.index.json                       with the index of which tensor is in which shard
    ema-*.safetensors, ema.index.json      their exponential moving average (when enabled)
    STEM-*.safetensors, STEM.index.json    an update's own tensors (engine/update.py state(): DiffusionNFT's
                                           sampling policy is `old`)
    optimizer-*.safetensors, optimizer.index.json   optimizer tensors (state.<param>.<key>)
    optimizer.json                         param groups and scalar state
    rng.safetensors                        torch's RNG states: the CPU generator and every CUDA device's
    trainer_state.json                     iteration, seed, wall time
    manifest.json                          sha256 of every file above; written last, checked on load

A process killed at any moment leaves nothing a reader takes as whole. A checkpoint is written in a
dot-named temporary folder and renamed to step-N; keep-last retires an old one by renaming it back to a
dot-name before deleting it. Readers list only step-N folders whose manifest lists every file a
checkpoint needs and whose listed files are all there (`problem`); the next save (or resume) of the same
run sweeps the dot-named leftovers of a killed writer (`tidy`).

Reading validates the folder's own files as a whole before any weight is read (`check_checkpoint`):
manifest.json maps plain file names of the folder (no separator, no '..', no link out) to sha256s and
lists every file a checkpoint needs; the shard indexes name only files the manifest lists;
trainer_state.json is an object with a whole-number step.

Shards are written one at a time, each moved to the CPU only while it is written, and hashed from the
file in chunks: a 12B-parameter state never sits in RAM as one buffer. Checkpoints written as single
model.safetensors / ema.safetensors / optimizer.safetensors files (before shards) still load.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from safetensors.torch import save as st_save

from ..errors import CorruptFileError, TreegrpoError, disk_full, no_space, shown
from . import faults
from .safeio import loads_json
from .shards import SHA256_HEX, atomic_write, check_file_name, file_sha256, kind_of

MANIFEST = "manifest.json"
OWN_STEMS = ("model", "optimizer", "ema")  # the run's tensor groups; any other STEM.index.json is the update's
SHARD_STEM = re.compile(r"[a-z][a-z0-9_]*\Z")
STATE = "trainer_state.json"
REQUIRED = (STATE, "optimizer.json", "rng.safetensors")  # besides the model and optimizer tensors


@dataclass
class Checkpoint:
    step: int  # completed iterations
    model: dict[str, torch.Tensor]
    ema: dict[str, torch.Tensor] | None
    optimizer: dict[str, Any]  # torch optimizer state_dict
    rng: dict[str, torch.Tensor]  # "torch": the CPU generator's state; "cuda.<i>": each CUDA device's
    state: dict[str, Any]  # trainer state (JSON-able)
    # the update's own tensor groups, {file stem: tensors} (DiffusionNFT: {"old": its sampling policy})
    update_state: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)

    @property
    def old(self) -> dict[str, torch.Tensor] | None:
        """DiffusionNFT's sampling policy, trailing the trained one (None: not an NFT checkpoint)."""
        return self.update_state.get("old")


SHARD_BYTES = 2 * 2**30


def _optimizer_parts(sd: dict[str, Any]) -> tuple[dict[str, torch.Tensor], bytes]:
    tensors, scalars = {}, {}
    for pid, st in sd["state"].items():
        for k, v in st.items():
            if torch.is_tensor(v):
                tensors[f"state.{pid}.{k}"] = v
            else:
                scalars[f"{pid}.{k}"] = v
    meta = {"param_groups": sd["param_groups"], "scalars": scalars}
    return tensors, json.dumps(meta).encode()


def _write_sharded(folder: Path, stem: str, tensors: dict[str, torch.Tensor], limit: int) -> list[str]:
    """stem-0000i-of-0000K.safetensors (at most `limit` bytes each, one tensor at least) and stem.index.json."""
    groups: list[list[str]] = [[]]
    size = 0
    for k, v in tensors.items():
        n = v.numel() * v.element_size()
        if groups[-1] and size + n > limit:
            groups.append([])
            size = 0
        groups[-1].append(k)
        size += n
    files, index = [], {}
    for i, keys in enumerate(groups, 1):
        name = f"{stem}-{i:05d}-of-{len(groups):05d}.safetensors"
        part = {k: _whole(tensors[k]).cpu().contiguous() for k in keys}  # only this shard on the CPU
        save_file(part, str(folder / name))
        _fsync_file(folder / name)
        faults.point("checkpoint.shard")
        files.append(name)
        index.update({k: name for k in keys})
    atomic_write(folder / f"{stem}.index.json", json.dumps({"weight_map": index}, indent=1).encode())
    return files + [f"{stem}.index.json"]


def _whole(t: torch.Tensor) -> torch.Tensor:
    """A tensor's whole value; a sharded one (a DTensor of FSDP) is gathered here, one tensor at a time
    (a collective: the ranks that write nothing run follow_checkpoint_gathers meanwhile)."""
    d = t.detach()
    full = getattr(d, "full_tensor", None)  # a DTensor's gather
    return full() if full is not None else d


def follow_checkpoint_gathers(ck: Checkpoint) -> None:
    """A rank that writes nothing while another saves a sharded checkpoint: gather every tensor in the
    order save_checkpoint does and drop it (no rank holds the whole state)."""
    opt_tensors, _ = _optimizer_parts(ck.optimizer)
    extra = [
        *(ck.ema.values() if ck.ema is not None else []),
        *(t for g in ck.update_state.values() for t in g.values()),
    ]
    for t in [*ck.model.values(), *opt_tensors.values(), *extra]:
        if hasattr(t, "full_tensor"):
            _whole(t)


def _fsync_file(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def _optimizer_from_files(tensors: dict[str, torch.Tensor], meta_bytes: bytes) -> dict[str, Any]:
    meta = loads_json(meta_bytes)
    state: dict[int, dict[str, Any]] = {}
    for key, t in tensors.items():
        _, pid, k = key.split(".", 2)
        state.setdefault(int(pid), {})[k] = t
    for key, v in meta["scalars"].items():
        pid, k = key.split(".", 1)
        state.setdefault(int(pid), {})[k] = v
    return {"state": state, "param_groups": meta["param_groups"]}


def save_checkpoint(folder: Path, ck: Checkpoint, keep_last: int, shard_bytes: int | None = None) -> Path:
    """Write step-N atomically (temp folder, fsync, rename), then retire all but the newest keep_last.
    The caller holds the run's lock: the dot-named leftovers of an earlier, killed save are swept first."""
    folder.mkdir(parents=True, exist_ok=True)
    sweep(folder)
    tmp = Path(tempfile.mkdtemp(prefix=f".step-{ck.step}.", dir=folder))
    try:
        _write_parts(tmp, ck, shard_bytes or SHARD_BYTES)
    except BaseException as e:  # the partial step goes; the checkpoints before it are untouched
        shutil.rmtree(tmp, ignore_errors=True)
        if no_space(e):
            raise disk_full(folder, _state_bytes(ck)) from None
        raise
    faults.point("checkpoint.written")
    final = folder / f"step-{ck.step}"
    if final.exists():
        retire(final)
    os.replace(tmp, final)
    _fsync_dir(folder)
    faults.point("checkpoint.renamed")
    rotate(folder, keep_last)
    return final


def retire(path: Path) -> None:
    """Delete a checkpoint so that no reader ever sees part of one: renamed to a dot-name first (one atomic
    step, after which no reader lists it), then removed; a kill in between leaves a leftover `sweep` removes."""
    hidden = path.with_name(f".{path.name}.retired-{os.getpid()}")
    os.replace(path, hidden)
    _fsync_dir(path.parent)
    faults.point("checkpoint.retire")
    shutil.rmtree(hidden, ignore_errors=True)


def rotate(folder: Path, keep_last: int, damaged: bool = True) -> None:
    """Keep the newest keep_last complete checkpoints; retire every other step-N (damaged ones too, unless
    `damaged` is False: a resume names them and leaves them to the next save)."""
    done = list_checkpoints(folder)
    keep = set(done[-keep_last:]) if keep_last > 0 else set()
    for path in _step_folders(folder) if damaged else done:
        if path not in keep:
            retire(path)


def sweep(folder: Path) -> list[str]:
    """Remove what killed writers left in a checkpoints folder: the dot-named temporary folders of a save or
    a retirement (never a step-N). The caller holds the run's lock. Returns the names removed."""
    if not folder.is_dir():
        return []
    gone = []
    for p in folder.iterdir():
        if p.name.startswith(".step-") and p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
            gone.append(p.name)
    return sorted(gone)


def tidy(folder: Path, keep_last: int) -> list[str]:
    """A resume's first write: leftovers swept and keep-last applied to the complete checkpoints, as the save a
    kill interrupted would have left them. Returns the names swept."""
    gone = sweep(folder)
    rotate(folder, keep_last, damaged=False)
    return gone


def _state_bytes(ck: Checkpoint) -> int:
    """The bytes of a checkpoint's tensors (what a step folder needs, give or take its small files)."""
    parts = [ck.model, _optimizer_parts(ck.optimizer)[0], ck.ema or {}, *ck.update_state.values()]
    return sum(t.numel() * t.element_size() for p in parts for t in p.values())


def _write_parts(tmp: Path, ck: Checkpoint, limit: int) -> list[str]:
    """Every file of a checkpoint into the temporary folder tmp, its manifest last; their names."""
    opt_tensors, opt_meta = _optimizer_parts(ck.optimizer)
    names = _write_sharded(tmp, "model", ck.model, limit) + _write_sharded(tmp, "optimizer", opt_tensors, limit)
    if ck.ema is not None:
        names += _write_sharded(tmp, "ema", ck.ema, limit)
    for stem, tensors in sorted(ck.update_state.items()):
        if stem in OWN_STEMS or not SHARD_STEM.match(stem):
            raise ValueError(f"an update's checkpoint tensors may not be named {stem!r}")
        names += _write_sharded(tmp, stem, tensors, limit)
    small = {
        "rng.safetensors": st_save({k: v.cpu().contiguous() for k, v in ck.rng.items()}),
        "trainer_state.json": json.dumps(ck.state, indent=1).encode(),
        "optimizer.json": opt_meta,
    }
    for name, data in small.items():
        atomic_write(tmp / name, data)
    names += list(small)
    atomic_write(tmp / MANIFEST, json.dumps({n: file_sha256(tmp / n) for n in names}, indent=1).encode())
    return names


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _step_folders(folder: Path) -> list[Path]:
    """Every step-N folder (complete or not), oldest first."""
    if not folder.is_dir():
        return []
    steps = [
        p
        for p in folder.glob("step-*")
        if p.name[5:].isdigit() and p.name[5:].isascii() and p.is_dir() and not p.is_symlink()
    ]
    return sorted(steps, key=lambda p: int(p.name[5:]))


def problem(path: Path) -> str | None:
    """Why a step-N folder is not a complete checkpoint (None when it is): its manifest read and checked as a
    whole, every file it lists present. Hashes nothing."""
    try:
        read_manifest(path)
    except TreegrpoError as e:
        return str(e)
    return None


def damaged_checkpoints(folder: Path) -> list[tuple[Path, str]]:
    """(step-N, why) of every step-N folder that is not a complete checkpoint, oldest first."""
    return [(p, why) for p in _step_folders(folder) if (why := problem(p)) is not None]


def list_checkpoints(folder: Path) -> list[Path]:
    """Complete checkpoints (a manifest that lists every file a checkpoint needs, all present), oldest first."""
    return [p for p in _step_folders(folder) if problem(p) is None]


def _read_json(path: Path) -> Any:
    try:
        return loads_json(path.read_text())
    except FileNotFoundError:
        raise CorruptFileError(f"{path}: missing") from None
    except (ValueError, UnicodeDecodeError):
        raise CorruptFileError(f"{path}: not valid JSON") from None
    except OSError as e:
        raise TreegrpoError(f"{path}: cannot be read ({e.strerror or e})") from None


def read_manifest(path: Path) -> dict[str, str]:
    """manifest.json of a step-N folder, validated as a whole: an object of plain file names of the folder
    (each present) and their sha256s, listing every file a checkpoint needs. Hashes nothing."""
    path = Path(path)
    where = path / MANIFEST
    if not where.is_file():
        raise TreegrpoError(f"{path}: not a complete checkpoint (no {MANIFEST})")
    manifest = _read_json(where)
    if not isinstance(manifest, dict):
        raise CorruptFileError(f"{where}: must be an object of file names and their sha256, got {kind_of(manifest)}")
    for name, digest in manifest.items():
        check_file_name(path, name, f"{where}: the file name")
        if not isinstance(digest, str) or not SHA256_HEX.match(digest):
            raise CorruptFileError(f"{where}: the sha256 of {name} must be 64 hex digits, got {shown(digest)}")
        if not (path / name).is_file():
            what = "not a regular file" if (path / name).exists() else "missing"
            raise CorruptFileError(f"{path / name}: {what} (listed in {MANIFEST})")
    for stem in ("model", "optimizer"):
        if not _has(path, stem, manifest):
            raise CorruptFileError(f"{where}: lists neither {stem}.index.json nor {stem}.safetensors")
    for name in REQUIRED:
        if name not in manifest:
            raise CorruptFileError(f"{where}: does not list {name}")
    return manifest


def read_state(path: Path) -> dict[str, Any]:
    """trainer_state.json of a step-N folder: an object with a whole-number step (and a config object)."""
    where = Path(path) / STATE
    state = _read_json(where)
    if not isinstance(state, dict):
        raise CorruptFileError(f"{where}: must be an object, got {kind_of(state)}")
    step = state.get("step")
    if type(step) is not int or step < 0:
        raise CorruptFileError(f"{where}: step must be a whole number >= 0, got {shown(step)}")
    if "config" in state and not isinstance(state["config"], dict):
        raise CorruptFileError(f"{where}: config must be an object, got {kind_of(state['config'])}")
    return state


def _weight_map(path: Path, stem: str, manifest: dict[str, str]) -> dict[str, str]:
    """stem.index.json's weight_map: tensor name -> a shard file of this folder that the manifest lists."""
    where = path / f"{stem}.index.json"
    index = _read_json(where)
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict):
        raise CorruptFileError(
            f"{where}: weight_map must be an object of tensor names and files, got {kind_of(weight_map)}"
        )
    seen: set[str] = set()
    for name in weight_map.values():
        if isinstance(name, str) and name in seen:
            continue
        check_file_name(path, name, f"{where}: the weight_map file")
        if name not in manifest:
            raise CorruptFileError(f"{where}: weight_map names {shown(name)}, which {MANIFEST} does not list")
        seen.add(name)
    return weight_map


def _validated(path: Path) -> tuple[dict[str, str], dict[str, Any]]:
    manifest = read_manifest(path)
    for stem in _stems(manifest):
        if f"{stem}.index.json" in manifest:
            _weight_map(path, stem, manifest)
    return manifest, read_state(path)


def check_checkpoint(path: Path) -> dict[str, Any]:
    """Validate a step-N folder's own files (manifest, shard indexes, trainer state) without hashing or
    loading any weight; returns the trainer state. One line naming the file and the field."""
    return _validated(Path(path))[1]


def load_checkpoint(path: Path) -> Checkpoint:
    """Read and verify one step-N folder: its own files validated first (check_checkpoint), then every
    file's sha256 against the manifest (streamed), then the tensors."""
    path = Path(path)
    if not path.exists():  # listed a moment ago: keep-last retired it while this process read the folder
        raise TreegrpoError(f"{path}: no longer there (the run's keep-last rotation removed it); run the command again")
    manifest, _ = _validated(path)
    for name, digest in manifest.items():
        if file_sha256(path / name) != digest:
            raise CorruptFileError(f"{path / name}: corrupt, its sha256 does not match {MANIFEST}")
    state = read_state(path)  # read again: the hashed bytes
    try:
        optimizer = _optimizer_from_files(
            _read_tensors(path, "optimizer", manifest), (path / "optimizer.json").read_bytes()
        )
    except (KeyError, ValueError, TypeError, AttributeError) as e:
        raise CorruptFileError(f"{path / 'optimizer.json'}: not an optimizer state ({shown(e)})") from None
    return Checkpoint(
        step=state["step"],
        model=_read_tensors(path, "model", manifest),
        ema=_read_tensors(path, "ema", manifest) if _has(path, "ema", manifest) else None,
        optimizer=optimizer,
        rng=_load(path / "rng.safetensors"),
        state=state,
        update_state={s: _read_tensors(path, s, manifest) for s in _stems(manifest) if s not in OWN_STEMS},
    )


def _stems(manifest: dict[str, str]) -> list[str]:
    """The tensor groups a checkpoint's manifest lists: model, optimizer, ema and the update's own."""
    sharded = [n[: -len(".index.json")] for n in manifest if n.endswith(".index.json")]
    return [*sharded, *(s for s in ("model", "optimizer", "ema") if f"{s}.safetensors" in manifest)]


def _has(path: Path, stem: str, manifest: dict) -> bool:
    return f"{stem}.index.json" in manifest or f"{stem}.safetensors" in manifest


def _load(file: Path) -> dict[str, torch.Tensor]:
    try:
        return load_file(str(file))
    except Exception as e:  # safetensors raises its own error types
        raise CorruptFileError(f"{file}: unreadable safetensors ({shown(str(e))})") from None


def _read_tensors(path: Path, stem: str, manifest: dict) -> dict[str, torch.Tensor]:
    """The tensors of stem: its shards through stem.index.json, or the single stem.safetensors."""
    if f"{stem}.index.json" not in manifest:
        return _load(path / f"{stem}.safetensors")
    out: dict[str, torch.Tensor] = {}
    weight_map = _weight_map(path, stem, manifest)
    for name in sorted(set(weight_map.values())):
        out.update(_load(path / name))
    if set(out) != set(weight_map):
        raise CorruptFileError(f"{path / (stem + '.index.json')}: its shards hold other tensors than it lists")
    return out

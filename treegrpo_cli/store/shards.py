"""A folder of safetensors shards described by one index.json.

    DIR/index.json               {"format": "treegrpo", "version": 1, "kind": ..., "meta": {...},
                                  "shards": {"trees-00000": {"file", "sha256", "bytes", "role"}, ...}}
    DIR/trees-00000.safetensors  tensors + __metadata__ {"treegrpo": "<JSON object>"}

Every write goes to a temporary file in the same folder, is flushed to disk and renamed over the
target, so a crash leaves either the old file or the new one. Every read checks the sha256 that the
index recorded, and a mismatch is one clear error naming the file.

index.json is validated as a whole when a folder is opened, before anything is read, written or deleted:
every field's type, and every shard's `file` is `<name>.safetensors`, a plain file name of the folder
that does not resolve outside it (`check_file_name`, also used for the names in a checkpoint's manifest).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any, Self

import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from ..errors import CorruptFileError, TreegrpoError, disk_full, no_space, shown
from .safeio import contained, loads_json

FORMAT = "treegrpo"
VERSION = 1
INDEX = "index.json"
META_KEY = "treegrpo"  # the one __metadata__ entry: a JSON object
SHARD_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*\Z")  # a shard's name: letters, digits, '-' and '_'
SHA256_HEX = re.compile(r"[0-9a-f]{64}\Z")
LEFTOVERS = (".lock",)  # what a folder's writer holds (training/runlock.py) or leaves: not someone else's files
# atomic_write's temporary file of an index or a shard (a writer killed mid-write): swept by the next writer
TEMP = re.compile(r"\.(index\.json|[A-Za-z0-9][A-Za-z0-9_-]*\.safetensors)\.[A-Za-z0-9_]{8}\.tmp\Z")


def atomic_write(path: Path, data: bytes) -> None:
    """Write bytes to path through a temporary sibling and an atomic rename."""
    path = Path(path)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as e:
        raise (disk_full(path.parent, len(data)) if no_space(e) else e) from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException as e:
        Path(tmp).unlink(missing_ok=True)
        if no_space(e):  # the old file (if any) is untouched
            raise disk_full(path.parent, len(data)) from None
        raise


def sorted_metadata(path: Path) -> None:
    """Rewrite a safetensors file's header in place with its __metadata__ entries in sorted order (safetensors
    writes them in a random order, so the same tensors and metadata give other bytes in another process). The
    header keeps its length (padded with spaces, as safetensors pads it); a header that would grow is left as is."""
    with open(path, "r+b") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
        meta = header.get("__metadata__")
        if not isinstance(meta, dict):
            return
        header["__metadata__"] = dict(sorted(meta.items()))
        new = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
        if len(new) <= n:
            f.seek(8)
            f.write(new + b" " * (n - len(new)))


def sweep_temp(root: Path) -> None:
    """Remove a killed writer's temporary files (atomic_write's, of an index or a shard) from a folder of shards;
    the caller is its one writer (it holds the folder's lock)."""
    for p in Path(root).iterdir():
        if TEMP.match(p.name) and p.is_file() and not p.is_symlink():
            p.unlink(missing_ok=True)


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def file_sha256(path: Path, chunk: int = 1 << 23) -> str:
    """sha256 of a file, read in chunks (a large shard is never one buffer)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(chunk), b""):
            h.update(block)
    return h.hexdigest()


def kind_of(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), f"a {type(value).__name__}"
    )


def check_file_name(root: Path, name: Any, where: str) -> Path:
    """root / name for a file name read from one of treegrpo's own files (an index, a manifest): a plain
    name of a file in root (no path separator, no '..', not absolute) that does not resolve outside root
    through a link. `where` names the file and the field in the one-line error. Reads nothing."""
    root = Path(root)
    if not isinstance(name, str) or not name:
        raise CorruptFileError(f"{where} must be a file name, got {shown(name)}")
    seps = {"/", "\\", os.sep, os.altsep or "/"}
    if name in (".", "..") or "\x00" in name or any(s in name for s in seps) or Path(name).is_absolute():
        raise CorruptFileError(
            f"{where} is {shown(name)}: not a plain file name; the files it names must lie inside {root} "
            "(no path separator, no '..')"
        )
    path = root / name
    try:
        real, base = path.resolve(), root.resolve()
    except (OSError, RuntimeError) as e:  # a link loop
        raise CorruptFileError(f"{where} is {shown(name)}, which does not resolve ({e})") from None
    if real.parent != base:
        raise CorruptFileError(f"{where} is {shown(name)}, a link that resolves outside {root} (to {real})")
    return path


def validate_index(index: Any, path: Path, root: Path) -> dict[str, Any]:
    """index.json as a whole: its header, `meta` an object, and every shard entry (file, sha256, bytes,
    role) with its file confined to root. One CorruptFileError line naming the field; reads no shard."""
    if not isinstance(index, dict) or index.get("format") != FORMAT:
        raise CorruptFileError(f"{path}: not a treegrpo index")
    version = index.get("version")
    if type(version) is not int or version != VERSION:
        raise CorruptFileError(f"{path}: format version {shown(version)} (this treegrpo reads {VERSION})")
    if not isinstance(index.get("kind"), str):
        raise CorruptFileError(f"{path}: kind must be a string, got {shown(index.get('kind'))}")
    if not isinstance(index.get("meta"), dict):
        raise CorruptFileError(f"{path}: meta must be an object, got {kind_of(index.get('meta'))}")
    shards = index.get("shards")
    if not isinstance(shards, dict):
        raise CorruptFileError(f"{path}: shards must be an object of shard entries, got {kind_of(shards)}")
    for name, entry in shards.items():
        if not SHARD_NAME.match(name):
            raise CorruptFileError(f"{path}: shard name {shown(name)} is not a plain name (letters, digits, - and _)")
        field = f"{path}: shards[{name!r}]"
        if not isinstance(entry, dict):
            raise CorruptFileError(f"{field} must be an object with file, sha256, bytes and role, got {kind_of(entry)}")
        for key in ("file", "sha256", "bytes", "role"):
            if key not in entry:
                raise CorruptFileError(f"{field} has no {key}")
        if not isinstance(entry["sha256"], str) or not SHA256_HEX.match(entry["sha256"]):
            raise CorruptFileError(f"{field}.sha256 must be 64 hex digits, got {shown(entry['sha256'])}")
        if type(entry["bytes"]) is not int or entry["bytes"] < 0:
            raise CorruptFileError(f"{field}.bytes must be a whole number >= 0, got {shown(entry['bytes'])}")
        if not isinstance(entry["role"], str) or not SHARD_NAME.match(entry["role"]):
            raise CorruptFileError(f"{field}.role must be a plain name, got {shown(entry['role'])}")
        check_file_name(root, entry["file"], f"{field}.file")
        if entry["file"] != f"{name}.safetensors":
            raise CorruptFileError(f"{field}.file must be {name}.safetensors, got {shown(entry['file'])}")
    return index


def _parse_meta(data: bytes, path: Path) -> dict[str, Any]:
    try:
        n = int.from_bytes(data[:8], "little")
        header = loads_json(data[8 : 8 + n])
        raw = header.get("__metadata__", {}) or {}
        meta = loads_json(raw[META_KEY]) if META_KEY in raw else {}
    except (ValueError, UnicodeDecodeError, AttributeError, TypeError) as e:
        raise CorruptFileError(f"{path}: unreadable safetensors header ({e})") from None
    if not isinstance(meta, dict):
        raise CorruptFileError(f"{path}: its {META_KEY} metadata must be an object, got {kind_of(meta)}")
    return meta


class ShardStore:
    """Read and write the shards of one folder; the index is the source of truth."""

    def __init__(self, root: Path, index: dict[str, Any]):
        self.root, self.index = Path(root), index

    # -- opening ---------------------------------------------------------------------------
    @classmethod
    def create(cls, root: Path, kind: str, meta: dict[str, Any], overwrite: bool = False) -> Self:
        root = Path(root)
        old = cls.check_target(root, overwrite)
        if old is not None:  # overwrite: delete the old folder's shards (its own files), not just forget them
            for entry in old.index["shards"].values():
                (root / entry["file"]).unlink(missing_ok=True)
            old.sweep()
        root.mkdir(parents=True, exist_ok=True)
        sweep_temp(root)
        store = cls(root, {"format": FORMAT, "version": VERSION, "kind": kind, "meta": meta, "shards": {}})
        store._write_index()
        return store

    @classmethod
    def open(cls, root: Path, kind: str | None = None) -> Self:
        root = Path(root)
        path = root / INDEX
        if not root.is_dir():
            raise TreegrpoError(f"{root}: no such folder")
        if not path.is_file():
            raise TreegrpoError(f"{root}: no {INDEX}; not a folder written by treegrpo")
        contained(root, path, f"tree folder {root}")
        try:
            index = loads_json(path.read_text())
        except (ValueError, UnicodeDecodeError) as e:
            raise CorruptFileError(f"{path}: not valid JSON ({e})") from None
        except OSError as e:
            raise TreegrpoError(f"{path}: cannot be read ({e.strerror or e})") from None
        validate_index(index, path, root)
        if kind is not None and index.get("kind") != kind:
            raise TreegrpoError(f"{root} holds {index.get('kind')!r} shards, expected {kind!r}")
        store = cls(root, index)
        store.validate()
        return store

    def validate(self) -> None:
        """Checks of a kind of folder beyond the index's own (a subclass's); none here."""

    def sweep(self) -> None:
        """Remove the files of this folder's own writer besides its shards (a subclass's: sample images)."""

    @classmethod
    def check_target(cls, root: Path, overwrite: bool, option: str = "--out") -> Self | None:
        """Read-only checks before a folder of shards is created at root: a new or empty folder, or a treegrpo
        folder whose index is intact that is replaced (with overwrite) or is a killed writer's leftover (a
        subclass's `leftover`), returned so that its own shards can be deleted. A non-empty folder without an
        index is someone else's: never written into (a killed writer's temporary files aside)."""
        root = Path(root)
        if root.exists() and not root.is_dir():
            raise TreegrpoError(f"{option} {root} exists and is not a folder")
        if (root / INDEX).exists():
            if overwrite:
                return cls.open(root)
            try:
                old = cls.open(root)
            except TreegrpoError:
                old = None
            if old is not None and old.leftover():
                return old
            raise TreegrpoError(f"{root} already holds a treegrpo {INDEX}; choose another {option} or pass --overwrite")
        try:
            foreign = root.is_dir() and any(p.name not in LEFTOVERS and not TEMP.match(p.name) for p in root.iterdir())
        except OSError as e:
            raise TreegrpoError(f"{option} {root}: cannot list it ({e.strerror or e})") from None
        if foreign:
            raise TreegrpoError(
                f"{option} {root} is not empty and is not a treegrpo folder (no {INDEX}); choose a new or empty folder"
            )
        return None

    def leftover(self) -> bool:
        """Is this folder what a killed writer left (the same command may replace it)? A subclass says; no here."""
        return False

    # -- index -----------------------------------------------------------------------------
    @property
    def meta(self) -> dict[str, Any]:
        return self.index["meta"]

    def update_meta(self, *drop: str, **values: Any) -> None:
        """Set meta fields and drop others, in one write of the index."""
        for key in drop:
            self.index["meta"].pop(key, None)
        self.index["meta"].update(values)
        self._write_index()

    def names(self, role: str | None = None) -> list[str]:
        return sorted(n for n, s in self.index["shards"].items() if role is None or s["role"] == role)

    def _write_index(self) -> None:
        atomic_write(self.root / INDEX, (json.dumps(self.index, indent=1, sort_keys=True) + "\n").encode())

    # -- shards ----------------------------------------------------------------------------
    def write(self, name: str, role: str, tensors: dict[str, torch.Tensor], meta: dict[str, Any] | None = None) -> None:
        """Write one shard (replacing any shard of that name) and record its hash in the index."""
        tensors = {k: v.detach().cpu().contiguous() for k, v in tensors.items()}
        # one metadata key holding sorted JSON: safetensors' own metadata map has no stable order,
        # and the same trees must give the same bytes (and sha256)
        data = st_save(tensors, metadata={META_KEY: json.dumps(meta or {}, sort_keys=True)})
        file = f"{name}.safetensors"
        atomic_write(self.root / file, data)
        self.index["shards"][name] = {"file": file, "sha256": sha256(data), "bytes": len(data), "role": role}
        self._write_index()

    def remove(self, role: str) -> None:
        """Forget (and delete) every shard of a role, e.g. before rescoring."""
        for name in self.names(role):
            entry = self.index["shards"].pop(name)
            self._write_index()
            (self.root / entry["file"]).unlink(missing_ok=True)

    def read(self, name: str) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """Load one shard after checking its size and sha256 against the index."""
        entry = self.index["shards"].get(name)
        if entry is None:
            raise TreegrpoError(f"{self.root}: no shard named {name!r}")
        path = self.root / entry["file"]
        if not path.exists():
            raise CorruptFileError(f"{path}: missing (listed in {INDEX})")
        if not path.is_file():  # a folder, a FIFO, a device: never read
            raise CorruptFileError(f"{path}: not a regular file (listed in {INDEX})")
        if path.stat().st_size != entry["bytes"]:  # checked before reading it
            raise CorruptFileError(f"{path}: corrupt, its size does not match {INDEX}")
        try:
            data = path.read_bytes()
        except OSError as e:
            raise CorruptFileError(f"{path}: cannot be read ({e.strerror or e})") from None
        if len(data) != entry["bytes"] or sha256(data) != entry["sha256"]:
            raise CorruptFileError(f"{path}: corrupt, its sha256 does not match {INDEX}")
        meta = _parse_meta(data, path)
        try:
            return st_load(data), meta
        except Exception as e:  # safetensors raises its own error types
            raise CorruptFileError(f"{path}: unreadable safetensors ({e})") from None

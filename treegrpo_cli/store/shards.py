"""A folder of safetensors shards described by one index.json.

    DIR/index.json               {"format": "treegrpo", "version": 1, "kind": ..., "meta": {...},
                                  "shards": {"trees-00000": {"file", "sha256", "bytes", "role"}, ...}}
    DIR/trees-00000.safetensors  tensors + __metadata__ {"treegrpo": "<JSON object>"}

Every write goes to a temporary file in the same folder, is flushed to disk and renamed over the
target, so a crash leaves either the old file or the new one. Every read checks the sha256 that the
index recorded, and a mismatch is one clear error naming the file.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from ..errors import CorruptFileError, TreegrpoError

FORMAT = "treegrpo"
VERSION = 1
INDEX = "index.json"
META_KEY = "treegrpo"  # the one __metadata__ entry: a JSON object


def atomic_write(path: Path, data: bytes) -> None:
    """Write bytes to path through a temporary sibling and an atomic rename."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def file_sha256(path: Path, chunk: int = 1 << 23) -> str:
    """sha256 of a file, read in chunks (a large shard is never one buffer)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(chunk), b""):
            h.update(block)
    return h.hexdigest()


def _parse_meta(data: bytes, path: Path) -> dict[str, Any]:
    try:
        n = int.from_bytes(data[:8], "little")
        header = json.loads(data[8 : 8 + n])
        raw = header.get("__metadata__", {}) or {}
        return json.loads(raw[META_KEY]) if META_KEY in raw else {}
    except (ValueError, UnicodeDecodeError) as e:
        raise CorruptFileError(f"{path}: unreadable safetensors header ({e})") from None


class ShardStore:
    """Read and write the shards of one folder; the index is the source of truth."""

    def __init__(self, root: Path, index: dict[str, Any]):
        self.root, self.index = Path(root), index

    # -- opening ---------------------------------------------------------------------------
    @classmethod
    def create(cls, root: Path, kind: str, meta: dict[str, Any], overwrite: bool = False) -> ShardStore:
        root = Path(root)
        if (root / INDEX).exists() and not overwrite:
            raise TreegrpoError(f"{root} already holds a treegrpo {INDEX}; choose another --out or pass --overwrite")
        if root.exists() and not root.is_dir():
            raise TreegrpoError(f"{root} exists and is not a folder")
        if (root / INDEX).exists():  # overwrite: delete the old folder's shards, not just forget them
            for entry in cls.open(root).index["shards"].values():
                (root / entry["file"]).unlink(missing_ok=True)
        root.mkdir(parents=True, exist_ok=True)
        store = cls(root, {"format": FORMAT, "version": VERSION, "kind": kind, "meta": meta, "shards": {}})
        store._write_index()
        return store

    @classmethod
    def open(cls, root: Path, kind: str | None = None) -> ShardStore:
        root = Path(root)
        path = root / INDEX
        if not root.is_dir():
            raise TreegrpoError(f"{root}: no such folder")
        if not path.is_file():
            raise TreegrpoError(f"{root}: no {INDEX}; not a folder written by treegrpo")
        try:
            index = json.loads(path.read_text())
        except (ValueError, UnicodeDecodeError) as e:
            raise CorruptFileError(f"{path}: not valid JSON ({e})") from None
        if not isinstance(index, dict) or index.get("format") != FORMAT or "shards" not in index:
            raise CorruptFileError(f"{path}: not a treegrpo index")
        if index.get("version") != VERSION:
            raise CorruptFileError(f"{path}: format version {index.get('version')} (this treegrpo reads {VERSION})")
        if kind is not None and index.get("kind") != kind:
            raise TreegrpoError(f"{root} holds {index.get('kind')!r} shards, expected {kind!r}")
        return cls(root, index)

    # -- index -----------------------------------------------------------------------------
    @property
    def meta(self) -> dict[str, Any]:
        return self.index["meta"]

    def update_meta(self, **values: Any) -> None:
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
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise CorruptFileError(f"{path}: missing (listed in {INDEX})") from None
        if len(data) != entry["bytes"] or sha256(data) != entry["sha256"]:
            raise CorruptFileError(f"{path}: corrupt, its sha256 does not match {INDEX}")
        meta = _parse_meta(data, path)
        try:
            return st_load(data), meta
        except Exception as e:  # safetensors raises its own error types
            raise CorruptFileError(f"{path}: unreadable safetensors ({e})") from None

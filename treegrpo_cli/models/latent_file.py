"""The latent shapes model's weights file: the DiT under `dit.`, the autoencoder under `ae.`, both configs and
the training record in the safetensors metadata (what `scripts/pretrain_shapes.py` writes and `--model tiny-shapes`
loads)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from safetensors import SafetensorError
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from ..errors import TreegrpoError
from ..store.safeio import loads_json
from ..store.shards import atomic_write
from .dit import DiTConfig, TinyDiT
from .latent import AEConfig, ShapesAE


def dit_config_from(fields: dict[str, Any]) -> DiTConfig:
    """A DiT config from its fields as JSON or a state file give them back (the vocabulary as a list)."""
    return DiTConfig(**dict(fields, vocab=tuple(fields["vocab"])))


def save_weights(path: Path, net: TinyDiT, ae: ShapesAE, meta: dict[str, Any]) -> None:
    """One safetensors file: the DiT under `dit.`, the autoencoder under `ae.`, both configs in the metadata."""
    tensors = {f"dit.{k}": v.detach().cpu().contiguous() for k, v in net.state_dict().items()}
    tensors.update({f"ae.{k}": v.detach().cpu().contiguous() for k, v in ae.state_dict().items()})
    atomic_write(
        Path(path),
        st_save(
            tensors,
            metadata={
                "dit_config": json.dumps(asdict(net.cfg)),
                "ae_config": json.dumps(asdict(ae.cfg)),
                "treegrpo": json.dumps(meta),
            },
        ),
    )


def load_weights(path: Path, sha256: str | None = None) -> tuple[TinyDiT, ShapesAE, dict[str, Any]]:
    """The DiT, the autoencoder and the metadata of a weights file; with `sha256`, the bytes read must have it
    (the shipped weights: a damaged install is refused)."""
    path = Path(path)
    if not path.is_file():
        raise TreegrpoError(f"model weights not found: {path}")
    data = path.read_bytes()
    if sha256 is not None and (digest := hashlib.sha256(data).hexdigest()) != sha256:
        raise TreegrpoError(
            f"{path} is damaged (sha256 {digest[:12]}..., expected {sha256[:12]}...); reinstall treegrpo"
        )
    try:
        n = int.from_bytes(data[:8], "little")
        header = loads_json(data[8 : 8 + n]).get("__metadata__", {})
    except (ValueError, UnicodeDecodeError):
        raise TreegrpoError(f"{path}: not a safetensors file") from None
    if "dit_config" not in header or "ae_config" not in header:
        raise TreegrpoError(
            f"{path}: not a treegrpo latent shapes model (no dit_config/ae_config metadata); "
            "build one with `python scripts/pretrain_shapes.py`"
        )
    try:
        net, ae = (
            TinyDiT(dit_config_from(loads_json(header["dit_config"]))),
            ShapesAE(AEConfig(**loads_json(header["ae_config"]))),
        )
        try:
            state = st_load(data)
        except SafetensorError as e:
            raise TreegrpoError(f"{path}: not a complete safetensors file ({str(e).splitlines()[0]})") from None
        for prefix, module in (("dit.", net), ("ae.", ae)):
            part = {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}
            own = module.state_dict()
            odd = sorted(set(part) ^ set(own)) + [k for k in part if k in own and part[k].shape != own[k].shape]
            if odd:
                raise ValueError(f"{len(odd)} tensors differ, e.g. {prefix}{odd[0]}")
            module.load_state_dict(part, strict=True)
    except (TypeError, ValueError, KeyError, RuntimeError) as e:
        raise TreegrpoError(
            f"{path}: weights do not fit this version's latent shapes model "
            f"({str(e).splitlines()[0]}); rebuild them with `python scripts/pretrain_shapes.py`"
        ) from None
    return net, ae.requires_grad_(False).eval(), loads_json(header.get("treegrpo", "{}"))

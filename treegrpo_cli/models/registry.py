"""Model names -> Policy adapters."""

from __future__ import annotations

import difflib
import importlib
import importlib.util
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from ..errors import ConfigError, TreegrpoError, shown
from . import catalog, hub
from .base import Policy, PolicyConfig
from .pixel import PixelConfig, PixelPolicy

if TYPE_CHECKING:
    from .diffusers_base import DiffusersPolicy

TINY_SHAPES = Path(__file__).resolve().parents[1] / "data" / "tiny-shapes.safetensors"
TINY_SHAPES_SHA256 = "78fd3c79300d4463254af762d29a62717fad97c63b70c2016d2217f502972b90"  # verified at every load
TINY_SHAPES_VIDEO = TINY_SHAPES.with_name("tiny-shapes-video.safetensors")
TINY_SHAPES_VIDEO_SHA256 = "c5944dbe80f498c7a6871de9d91cfc97dd9c1672b5a779b3f2977441880128bc"  # verified at every load
EMBEDDED = {
    "tiny-shapes": (TINY_SHAPES, TINY_SHAPES_SHA256),
    "tiny-shapes-video": (TINY_SHAPES_VIDEO, TINY_SHAPES_VIDEO_SHA256),
}

MODELS = {
    "tiny-shapes": "the embedded shapes world's model: a 1.7M-parameter DiT on the 8x8x4 latents of a small "
    "autoencoder (weights built by scripts/pretrain_shapes.py); the default",
    "tiny-shapes-video": "the moving-shapes world's video model: the same DiT with 8 frames in its channels, on "
    "tiny-shapes' autoencoder (weights built by scripts/pretrain_shapes_video.py)",
    "pixel": "a small pixel-space flow network with seeded random weights (engine tests and benchmarks)",
    "pixel-tiny": "the same network at 8x8 pixels and 8 channels (smoke tests)",
}
_PIXEL = {"pixel": PixelConfig(), "pixel-tiny": PixelConfig(image_size=8, width=8, blocks=1, text_dim=16)}


# Settings a model needs on top of a method preset (the presets hold the papers' values, sized for
# 12B-parameter FLUX). Layered as: preset < model defaults < the preset's
# [for_model.NAME] table < --config file < --set (config.load_config).
MODEL_DEFAULTS: dict[str, dict[str, object]] = {
    # a 56k-parameter network from random weights: a larger step size and small batches so that a
    # CPU run shows learning in minutes
    "pixel": {"train.lr": 1e-3, "train.clip_range": 1e-2, "rollout.num_prompts": 2, "train.iterations": 300},
    "pixel-tiny": {"train.lr": 3e-4, "train.clip_range": 1e-2, "rollout.num_prompts": 2, "train.iterations": 2},
    # the embedded world: its own prompts, verifiable reward and test list, and a step size and budget for
    # a 1.7M-parameter latent DiT that keep `treegrpo train` (tree-grpo-mean preset) within 15 minutes on 2 CPU cores
    "tiny-shapes": {
        "reward.names": ["shapes"],
        "rollout.prompts": "shapes-train",
        "rollout.eval_prompts": "shapes-test",
        "train.lr": 1e-4,
        "train.clip_range": 1e-2,
        "rollout.num_prompts": 16,
        "train.iterations": 200,
        "train.eval_samples": 4,
    },
    # the moving-shapes world: the image world's settings on its clips, prompts and motion reward; 150 iterations
    # (a clip decodes 8 frames, so an iteration costs about twice an image one) keep `train` within 20 minutes
    "tiny-shapes-video": {
        "reward.names": ["motion-shapes"],
        "rollout.prompts": "motion-train",
        "rollout.eval_prompts": "motion-test",
        "train.lr": 1e-4,
        "train.clip_range": 1e-2,
        "rollout.num_prompts": 16,
        "train.iterations": 150,
        "train.eval_samples": 4,
    },
}


def model_defaults(name: str) -> dict[str, object]:
    if name in MODEL_DEFAULTS:
        return dict(MODEL_DEFAULTS[name])
    return hub.adapter_defaults(name)  # the diffusers adapters' (their cards): models/hub.py


def load_policy(
    name: str, device: str | torch.device = "cpu", opts: PolicyConfig | None = None, text_encoders: bool = True
) -> Policy:
    """The policy of --model. `opts` (the [policy] section) and `text_encoders` (False: skip loading
    them, e.g. for export) concern the diffusers models only."""
    if opts is not None and opts.weights == "random":
        return _load_random(name, device, opts)
    if name in _PIXEL:
        policy = PixelPolicy(_PIXEL[name], name=name)
        policy.net.to(device)
        return policy
    if name in EMBEDDED or name.endswith(".safetensors"):
        return _load_dit(name, device)
    if hub.is_diffusers_name(name):
        return _load_diffusers(name, device, opts or PolicyConfig(), text_encoders)
    raise unknown_model(name) or ConfigError(f"unknown model {shown(name)}")


def unknown_model(name: str) -> ConfigError | None:
    """None when a loader takes `name` (a built-in, a release, a weights file, a folder or a hub id); else the one
    line that says it is unknown, naming the model meant where one is close in any case or hub spelling
    ('FLUX.1-dev' and 'Flux-Dev' -> 'flux-dev'). Reads no file but the folder test."""
    if name in _PIXEL or name in EMBEDDED or name.endswith(".safetensors") or hub.is_diffusers_name(name):
        return None
    names = [*MODELS, *hub.KNOWN]
    low = name.strip().lower()
    close = hub.release_of(name) or next((n for n in names if n.lower() == low), None)
    close = close or next(iter(difflib.get_close_matches(low, names, n=1)), None)
    hint = f"; did you mean {close!r}?" if close else ""
    return ConfigError(
        f"unknown model {shown(name)} (available: {', '.join(names)}, a hub id or a diffusers folder){hint}"
    )


def _load_diffusers(name: str, device: str | torch.device, opts: PolicyConfig, text_encoders: bool) -> Policy:
    """A local folder or cached hub snapshot -> the adapter its model_index.json's pipeline class names."""
    opts.validate()
    require_extra(("diffusers", "transformers", "peft"), "models", name)
    folder = hub.resolve(name, opts.revision, opts.download)
    kind = hub.pipeline_kind(folder)
    hub.check_complete(folder, text_encoders, name)
    from .diffusers_base import load_pipeline, quiet_diffusers, torch_dtype

    quiet_diffusers()  # the torchvision guard first: transformers imports it
    pipeline_cls = getattr(importlib.import_module("diffusers"), _class_name(folder))  # checked by pipeline_kind
    adapter = adapter_class(kind)
    pipe = load_pipeline(folder, pipeline_cls, torch_dtype(opts.dtype, device), text_encoders, adapter.load_options)
    shown = name if name in hub.KNOWN or hub.local_dir(name) is None else Path(name).expanduser().name
    return adapter(pipe, opts, name=shown, source=str(folder), device=device)


def check_available(name: str, opts: PolicyConfig) -> None:
    """--model names a model and the files it needs are there (a weights file; a diffusers model's snapshot
    complete, its text encoders' files included): one line naming what is missing and how to supply it, before a run
    prints or writes anything. Loads nothing."""
    unknown = unknown_model(name)
    if unknown is not None:
        raise unknown
    if opts.weights == "random":
        from . import releases

        releases.check_random(name, opts.size)
        require_extra(("diffusers", "transformers", "peft", "accelerate"), "models", f"{name} with random weights")
        return
    if name in EMBEDDED or name.endswith(".safetensors"):
        path = EMBEDDED.get(name, (Path(name), ""))[0]
        if not _is_file(path):
            raise _dit_missing(name, path)
        return
    if hub.is_diffusers_name(name):
        require_extra(("diffusers", "transformers", "peft"), "models", name)
        hub.check_complete(hub.resolve(name, opts.revision, opts.download), name=name)


def _is_file(path: Path) -> bool:
    try:
        return path.is_file()
    except (OSError, ValueError):  # no file can have this name (too long, a NUL byte)
        return False


def _dit_missing(name: str, path: Path) -> TreegrpoError:
    script = "pretrain_shapes_video.py" if name == "tiny-shapes-video" else "pretrain_shapes.py"
    how = (
        f"reinstall treegrpo, or rebuild them with `python scripts/{script}`"
        if name in EMBEDDED
        else "pass --model with a file written by scripts/pretrain_shapes.py or pretrain_shapes_video.py"
    )
    return TreegrpoError(f"model weights not found: {path}; {how}")


def _load_random(name: str, device: str | torch.device, opts: PolicyConfig) -> Policy:
    """A released model from its configs with seeded random weights, random prompt embeddings of the text
    encoders' shapes, nothing read from disk or the network (models/releases.py)."""
    from . import releases

    opts.validate()
    require_extra(("diffusers", "transformers", "peft", "accelerate"), "models", f"{name} with random weights")
    spec = releases.release(name)
    releases.check_random(name, opts.size)
    tiny = opts.size == "tiny"
    opts = releases.tiny_options(opts, spec) if tiny else opts
    from .diffusers_base import quiet_diffusers, torch_dtype

    quiet_diffusers()
    pipe = releases.random_pipeline(spec, tiny, torch.device(device), torch_dtype(opts.dtype, device))
    adapter = adapter_class(spec.adapter)
    source = f"random weights (seed {releases.SEED}, {opts.size} size, no download)"
    policy = adapter(pipe, opts, name=name, source=source, device=device)
    policy.text_stand_in = releases.RandomText(releases.text_shapes(spec, tiny, opts.max_sequence_length))
    policy.weights = f"random ({opts.size} size)"
    return policy


# adapter name -> (module, class) of its Policy: every adapter class in models/ with a card (models/catalog.py)
ADAPTERS: dict[str, tuple[str, str]] = {name: (e.module, e.cls) for name, e in catalog.entries().items()}


def adapter_class(name: str) -> type[DiffusersPolicy]:
    """The adapter class of an adapter name (a card's), imported."""
    module, cls_name = ADAPTERS[name]
    return getattr(importlib.import_module(f".{module}", __package__), cls_name)


def _class_name(folder: Path) -> str:
    return str(hub.model_index(folder).get("_class_name"))


def _load_dit(name: str, device: str | torch.device) -> Policy:
    """The embedded worlds' models (tiny-shapes, tiny-shapes-video) or a weights file of either kind; a file with
    a frame count in its metadata is a video model."""
    from .latent import LatentDiTPolicy
    from .latent_file import load_weights
    from .video_latent import VideoLatentPolicy

    path, sha256 = EMBEDDED.get(name, (Path(name), ""))
    if not _is_file(path):
        raise _dit_missing(name, path)
    net, ae, meta = load_weights(path, sha256 or None)
    cls = VideoLatentPolicy if meta.get("frames") else LatentDiTPolicy
    return cls(
        net.cfg,
        net.to(device),
        ae.to(device),
        name=name if name in EMBEDDED else path.stem,
        source=str(path),
        guidance=meta.get("guidance", 1.0),
    )


def require_extra(modules: tuple[str, ...], extra: str, what: str) -> None:
    """One line naming the pip extra when a module that `what` needs is not installed, or the import error
    of one that is installed but does not import."""
    from ..compat import ensure_torchvision

    ensure_torchvision()  # transformers and peft import torchvision; the CPU stack needs the shim first
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        raise TreegrpoError(
            f"{what} needs {', '.join(missing)}, not installed here: "
            f"pip install 'treegrpo[{extra}]' (or pip install {' '.join(missing)})"
        )
    for m in modules:
        try:
            importlib.import_module(m)
        except ImportError as e:
            raise TreegrpoError(
                f"{what} needs {m}, which is installed but does not import: "
                f"{str(e).splitlines()[0] if str(e) else type(e).__name__}"
            ) from None

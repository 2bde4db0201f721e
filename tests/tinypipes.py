"""The tests' tiny diffusers pipelines: each adapter file declares its own (`TINY_PIPELINES`: name -> a builder of no
arguments; random weights, tiny text encoders and tokenizers made in memory, models/tiny.py), collected here over
the catalog's adapters (TINY), and the helpers that save them and drive them through `--model PATH`."""

import importlib
from collections.abc import Callable

import torch

from treegrpo_cli.models import catalog
from treegrpo_cli.models.flux import tiny_flux  # noqa: F401  (the names the adapter tests import from here)
from treegrpo_cli.models.flux2 import flux2_transformer  # noqa: F401
from treegrpo_cli.models.qwenimage import tiny_qwen_image  # noqa: F401
from treegrpo_cli.models.sd import tiny_sd  # noqa: F401
from treegrpo_cli.models.sd3 import sd3_large_shaped, tiny_sd3, tiny_sd3_transformer  # noqa: F401
from treegrpo_cli.models.tiny import byte_vocab  # noqa: F401
from treegrpo_cli.models.wan import tiny_wan, tiny_wan_i2v  # noqa: F401


def tiny_pipelines() -> dict[str, Callable]:
    """name -> builder: every adapter file's TINY_PIPELINES, in the catalog's order; a name twice is an error."""
    out: dict[str, Callable] = {}
    for module in dict.fromkeys(e.module for e in catalog.entries().values()):
        own = getattr(importlib.import_module(f"{catalog.__package__}.{module}"), "TINY_PIPELINES", {})
        for name, build in own.items():
            assert name not in out, f"models/{module}.py: tiny pipeline {name!r} is declared twice"
            out[name] = build
    return out


TINY = tiny_pipelines()
BUILDERS = {k: TINY[k] for k in ("qwenimage", "flux2-dev", "flux2-klein", "flux2-klein-distilled")}  # image models


def saved(tmp_path_factory, builders) -> dict:
    """{name: folder} of tiny pipelines, each built after seeding 0 and saved with save_pretrained."""
    out = {}
    for name, build in builders.items():
        torch.manual_seed(0)
        out[name] = tmp_path_factory.mktemp("models") / name
        build().save_pretrained(out[name])
    return out


def policy_of(folder, **policy):
    from treegrpo_cli.models.base import PolicyConfig
    from treegrpo_cli.models.registry import load_policy

    return load_policy(str(folder), "cpu", PolicyConfig(dtype="fp32", resolution=16, max_sequence_length=8, **policy))


def outputs(policy, net, prompt="a red cat", seed=0):
    """The adapter's model output with `net` as the denoiser, on fixed inputs [1, C, h, w]."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(1, *policy.latent_shape, generator=g)
    sigma = torch.tensor([0.501])  # t/1000 = 0.501 for SD, sigma 0.501 for the flows
    with torch.no_grad():
        return policy.model_output(net, x, sigma, policy.encode([prompt]))


def load_pipe(folder):
    from diffusers import DiffusionPipeline

    return DiffusionPipeline.from_pretrained(folder, local_files_only=True)

"""policy.attention and policy.compile (models/speed.py): options that change how fast the denoiser runs, never
what it computes. On the CPU: the same velocities and gradients with and without them, at tiny release sizes."""

import pytest
import torch
from clitools import one_line_error, run

from treegrpo_cli.config import load_config
from treegrpo_cli.errors import ConfigError
from treegrpo_cli.models.registry import load_policy
from treegrpo_cli.models.speed import checkpoint_share, repeated_blocks, set_attention

TINY = ['policy.weights="random"', 'policy.size="tiny"']


def tiny_policy(model: str, *sets: str):
    cfg = load_config("tree-grpo-mean", sets=[f'model="{model}"', *TINY, *sets])
    return load_policy(model, "cpu", cfg.policy), cfg


def velocity_and_grad(policy):
    """One guided forward on fixed inputs and the gradient of its mean square over the trainable weights."""
    cond = policy.encode(["a red square", "a blue circle"])
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, *policy.latent_shape, generator=g)
    sigma = torch.tensor([0.7, 0.4])
    params = policy.trainable_parameters()
    for p in params:  # LoRA's B starts at zero: give the adapter something to differentiate through
        with torch.no_grad():
            p.add_(0.01 * torch.randn(p.shape, generator=g))
    v = policy.velocity(x, sigma, cond)
    grads = torch.autograd.grad(v.square().mean(), params)
    return v.detach(), grads


@pytest.mark.parametrize("model", ["flux-dev", "sd3.5-medium"])
def test_blocks_are_found_for_every_transformer(model):
    policy, _ = tiny_policy(model)
    blocks = repeated_blocks(policy.denoiser)
    assert blocks and all(b in list(policy.denoiser.modules()) for b in blocks)
    # FLUX declares its repeated block classes; SD3 does not, and its transformer_blocks list is used instead
    assert {type(b).__name__ for b in blocks} <= {
        "FluxTransformerBlock",
        "FluxSingleTransformerBlock",
        "JointTransformerBlock",
    }


def test_native_attention_backends_compute_the_same():
    torch.manual_seed(0)
    base, _ = tiny_policy("flux-dev")
    v0, g0 = velocity_and_grad(base)
    for backend in ("native", "_native_math"):
        torch.manual_seed(0)
        other, _ = tiny_policy("flux-dev", f'policy.attention="{backend}"')
        v1, g1 = velocity_and_grad(other)
        torch.testing.assert_close(v1, v0, rtol=1e-4, atol=1e-5)
        for a, b in zip(g1, g0, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-6)
        procs = [
            m.processor
            for m in other.denoiser.modules()
            if hasattr(getattr(m, "processor", None), "_attention_backend")
        ]
        assert procs and all(p._attention_backend.value == backend for p in procs)
    # the backend is this model's only: diffusers' process-wide default is left as it was
    from diffusers.models.attention_dispatch import _AttentionBackendRegistry

    assert _AttentionBackendRegistry.get_active_backend()[0].value == "native"


@pytest.mark.slow
def test_compiled_blocks_compute_the_same():
    """Inductor on the CPU (a C++ compiler): the compiled blocks give the eager velocities and gradients, and a
    second batch size runs without error (automatic dynamic shapes)."""
    torch.manual_seed(0)
    eager, _ = tiny_policy("flux-dev")
    v0, g0 = velocity_and_grad(eager)
    torch.manual_seed(0)
    compiled, cfg = tiny_policy("flux-dev", 'policy.compile="blocks"')
    blocks = repeated_blocks(compiled.denoiser)
    assert cfg.policy.compile == "blocks" and all(b._compiled_call_impl is not None for b in blocks)
    assert all(b._compiled_call_impl is None for b in repeated_blocks(eager.denoiser))
    v1, g1 = velocity_and_grad(compiled)
    torch.testing.assert_close(v1, v0, rtol=1e-3, atol=1e-4)
    for a, b in zip(g1, g0, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-2, atol=1e-5)
    cond = compiled.encode(["one", "two", "three"])
    out = compiled.velocity(torch.randn(3, *compiled.latent_shape), torch.full((3,), 0.5), cond)
    assert out.shape == (3, *compiled.latent_shape) and torch.isfinite(out).all()


def test_selective_checkpointing_recomputes_a_share_of_the_blocks_and_the_same_gradients():
    torch.manual_seed(0)
    plain, _ = tiny_policy("flux-dev")
    n = len(repeated_blocks(plain.denoiser))
    assert checkpoint_share(plain.denoiser, 0.0) == [] and len(checkpoint_share(plain.denoiser, 1.0)) == n
    torch.manual_seed(0)
    v0, g0 = velocity_and_grad(tiny_policy("flux-dev")[0])
    for share in (0.5, 1.0):
        torch.manual_seed(0)
        policy, _ = tiny_policy("flux-dev", "policy.gradient_checkpointing=true", f"policy.checkpoint_blocks={share}")
        wrapped = [b for b in repeated_blocks(policy.denoiser) if "forward" in vars(b)]
        # 0.5: every second block (its own forward wrapped); 1.0: diffusers' checkpointing of every block
        assert len(wrapped) == (n // 2 if share == 0.5 else 0) and policy.denoiser.is_gradient_checkpointing == (
            share == 1
        )
        v1, g1 = velocity_and_grad(policy)
        torch.testing.assert_close(v1, v0)
        for a, b in zip(g1, g0, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-7)
    # the backward's FLOPs count the recomputed share: none < half < all
    bwd = [
        tiny_policy("flux-dev", f"policy.gradient_checkpointing={c}", f"policy.checkpoint_blocks={s}")[
            0
        ].flops_per_row()[1]
        for c, s in (("false", 1.0), ("true", 0.5), ("true", 1.0))
    ]
    assert bwd[0] < bwd[1] < bwd[2] and abs(2 * bwd[1] - bwd[0] - bwd[2]) <= 1


def test_an_attention_backend_that_cannot_run_is_one_line():
    policy, _ = tiny_policy("flux-dev")
    with pytest.raises(ConfigError, match="cannot run here|must be one of"):
        set_attention(policy.denoiser, "_flash_3")  # FlashAttention-3: a Hopper GPU and its package


@pytest.mark.parametrize(
    "sets, needle",
    [
        (['policy.compile="all"'], "policy.compile must be one of off, blocks"),
        (['policy.attention="fast"'], "policy.attention must be one of default,"),
        (["policy.checkpoint_blocks=1.5"], "policy.checkpoint_blocks is a share of the blocks, 0 to 1; got 1.5"),
    ],
)
def test_bad_speed_settings_are_one_line(sets, needle):
    args = ["train", "--iterations", "1"]
    for s in sets:
        args += ["--set", s]
    one_line_error(run(*args), needle)

"""sampler.solver = "dpm2": the second-order multistep DPM-Solver++ on the ODE steps (DiffusionNFT's sampler),
against the released solver's numbers, its convergence order, and the rollout's use of it."""

import math

import pytest
import torch

from treegrpo_cli.engine.rollout import TreeConfig, rollout
from treegrpo_cli.engine.sde import FlowSDE, SamplerConfig
from treegrpo_cli.models.registry import load_policy


def _velocity(x, sigma):
    return 0.5 * x - 0.3 * torch.sin(3 * x) + 0.2 * sigma


def _solve(solver: str, steps: int, z: torch.Tensor, shift: float = 3.0) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The kernel's ODE steps from z, each fed the x0-prediction of the step before (as the rollout does)."""
    sde = FlowSDE(SamplerConfig(steps=steps, shift=shift, solver=solver))
    x, prev, path = z, None, [z]
    for i in range(steps):
        n = x.shape[0]
        res = sde.step(
            x, _velocity(x, float(sde.sigmas[i])), torch.full((n,), i), torch.zeros(n, dtype=torch.bool), prev
        )
        x, prev = res.mean, res.x0
        path.append(x)
    return x, path


# NVlabs/DiffusionNFT flow_grpo/diffusers_patch/solver.py, run_sampling(v, z, sigmas, solver="dpm2",
# determistic=True) with sigmas = the shifted grid (10 steps, shift 3), z = linspace(-1.5, 1.5, 8) as
# [2, 1, 2, 2] and v(x, sigma) = 0.5 x - 0.3 sin(3 x) + 0.2 sigma: the final latent and the latent after 3 steps.
RELEASED_FINAL = [-0.91442, -0.807946, -0.677438, -0.403562, 0.172025, 0.545179, 0.707864, 0.822017]
RELEASED_STEP3 = [-1.397163, -1.028451, -0.660893, -0.24753, 0.199374, 0.615053, 0.983917, 1.351474]


def test_dpm2_equals_the_released_solver():
    z = torch.linspace(-1.5, 1.5, 8).view(2, 1, 2, 2)
    final, path = _solve("dpm2", 10, z)
    torch.testing.assert_close(final.flatten(), torch.tensor(RELEASED_FINAL), rtol=0, atol=2e-6)
    torch.testing.assert_close(path[3].flatten(), torch.tensor(RELEASED_STEP3), rtol=0, atol=2e-6)
    euler, _ = _solve("euler", 10, z)
    assert (euler - final).abs().max() > 1e-3  # a different solver, not Euler under another name


@pytest.mark.slow
def test_dpm2_converges_faster_than_euler():
    """Against a 1000-step solution of the same ODE (no shift): DPM2's error is a tenth of Euler's or less, and
    halving the step size cuts it by more than first order (measured: 2.8x for 10 -> 20 steps, Euler 2.0x;
    the first and last steps are first order, as in the released solver)."""
    z = torch.linspace(-1.5, 1.5, 8).view(2, 1, 2, 2)
    exact, _ = _solve("dpm2", 1000, z, shift=1.0)
    err = {
        (s, n): float((_solve(s, n, z, shift=1.0)[0] - exact).abs().max()) for s in ("euler", "dpm2") for n in (10, 20)
    }
    euler_rate = math.log2(err["euler", 10] / err["euler", 20])
    dpm_rate = math.log2(err["dpm2", 10] / err["dpm2", 20])
    assert err["dpm2", 10] < err["euler", 10] / 10 and err["dpm2", 20] < err["euler", 20] / 10, err
    assert euler_rate < 1.1 and dpm_rate > 1.3, err


def test_the_rollout_feeds_each_node_its_parent_x0_and_restarts_after_noise():
    """An ODE rollout with dpm2 equals the kernel loop above on the policy's velocity (each node is given its
    parent's x0-prediction); after a stochastic step the next ODE step is first order."""
    policy = load_policy("pixel-tiny")
    cfg = SamplerConfig(steps=6, solver="dpm2")
    ode, _ = rollout(policy, ["a red circle"], [0], FlowSDE(cfg), TreeConfig(sde_steps=()), seed=1)
    sde, cond = FlowSDE(cfg), policy.encode(["a red circle"])
    x, prev = ode.latent[ode.depth == 0], None
    with torch.no_grad():
        for i in range(6):
            v = policy.velocity(x, torch.full((1,), float(sde.sigmas[i])), cond)
            res = sde.step(x, v, torch.tensor([i]), torch.tensor([False]), prev)
            x, prev = res.mean, res.x0
    torch.testing.assert_close(ode.latent[ode.depth == 6], x, rtol=0, atol=1e-6)
    euler, _ = rollout(policy, ["a red circle"], [0], FlowSDE(SamplerConfig(steps=6)), TreeConfig(sde_steps=()), 1)
    assert (euler.latent[euler.depth == 6] - x).abs().max() > 1e-5
    # after the stochastic step 1 the history restarts: step 2 is the first-order (Euler) step
    mixed, _ = rollout(policy, ["a red circle"], [0], sde, TreeConfig(sde_steps=(1,)), seed=1)
    assert mixed.sde[mixed.depth == 2].all() and not mixed.sde[mixed.depth == 3].any()
    x2, x3 = mixed.latent[mixed.depth == 2], mixed.latent[mixed.depth == 3]
    with torch.no_grad():
        v2 = policy.velocity(x2, torch.full((1,), float(sde.sigmas[2])), cond)
    torch.testing.assert_close(x3, x2 + float(sde.sigmas[3] - sde.sigmas[2]) * v2, rtol=0, atol=1e-6)


@pytest.mark.parametrize("bad", ["dpm3", "heun"])
def test_an_unknown_solver_is_refused(bad):
    from treegrpo_cli.errors import ConfigError

    with pytest.raises(ConfigError, match="sampler.solver"):
        SamplerConfig(solver=bad).validate()

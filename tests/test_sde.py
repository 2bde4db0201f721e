import math

import pytest
import torch

from treegrpo_cli.engine.sde import FlowSDE, SamplerConfig, gaussian_log_prob, sigma_grid
from treegrpo_cli.errors import ConfigError


def test_shifted_grid_golden_values():
    # methods.md 1.1, shift 3
    want10 = [1, 0.964, 0.923, 0.875, 0.818, 0.750, 0.667, 0.563, 0.429, 0.250, 0]
    got = sigma_grid(SamplerConfig(steps=10)).tolist()
    assert got == pytest.approx(want10, abs=1e-3)
    want20 = [
        1,
        0.983,
        0.964,
        0.944,
        0.923,
        0.900,
        0.875,
        0.848,
        0.818,
        0.786,
        0.750,
        0.711,
        0.667,
        0.618,
        0.563,
        0.500,
        0.429,
        0.346,
        0.250,
        0.136,
        0,
    ]
    assert sigma_grid(SamplerConfig(steps=20)).tolist() == pytest.approx(want20, abs=1e-3)


def test_flow_match_euler_grid_matches_diffusers_values():
    # FlowMatchEulerDiscreteScheduler(shift=3.0).set_timesteps(10).sigmas, diffusers 0.42
    want = [1.0, 0.960129, 0.913349, 0.857692, 0.790368, 0.707278, 0.602151, 0.464876, 0.278049, 0.008929, 0.0]
    got = sigma_grid(SamplerConfig(steps=10, grid="flow-match-euler")).tolist()
    assert got == pytest.approx(want, abs=1e-6)


def test_flow_match_euler_grid_against_installed_diffusers():
    diffusers = pytest.importorskip("diffusers")
    for steps, shift in ((10, 3.0), (28, 1.0), (40, 3.0)):
        s = diffusers.FlowMatchEulerDiscreteScheduler(shift=shift)
        s.set_timesteps(steps)
        got = sigma_grid(SamplerConfig(steps=steps, shift=shift, grid="flow-match-euler"))
        assert torch.allclose(got.float(), s.sigmas.float(), atol=1e-6)


def _explicit_sde(x, v, sigma, sigma_next, g):
    d = sigma_next - sigma
    mean = x + d * v + (g**2 / (2 * sigma)) * (x + (1 - sigma) * v) * d
    return mean, g * math.sqrt(-d)


@pytest.mark.parametrize("noise,eta", [("dance", 0.3), ("flow", 0.7)])
def test_sde_step_mean_and_std(noise, eta):
    cfg = SamplerConfig(steps=10, noise=noise, eta=eta)
    sde = FlowSDE(cfg)
    torch.manual_seed(0)
    x, v = torch.randn(3, 2, 4, 4), torch.randn(3, 2, 4, 4)
    i = torch.tensor([0, 4, 9])
    res = sde.step(x, v, i, torch.tensor([True, True, True]))
    s = sde.sigmas
    for b, step in enumerate(i.tolist()):
        sig, nxt = float(s[step]), float(s[step + 1])
        if noise == "dance":
            g = eta
        else:  # at sigma = 1 the denominator uses the next grid value (Flow-GRPO guard)
            g = eta * math.sqrt(sig / (1 - (float(s[1]) if sig >= 1 else sig)))
        mean, std = _explicit_sde(x[b].double(), v[b].double(), sig, nxt, g)
        assert torch.allclose(res.mean[b].double(), mean, atol=1e-5)
        assert res.std[b].item() == pytest.approx(std, rel=1e-5)
        assert torch.allclose(res.x0[b], x[b] - sig * v[b], atol=1e-6)


def test_ode_step_is_euler():
    sde = FlowSDE(SamplerConfig(steps=10))
    x, v = torch.randn(2, 3, 4, 4), torch.randn(2, 3, 4, 4)
    res = sde.step(x, v, torch.tensor([2, 5]), torch.tensor([False, False]))
    d = (sde.sigmas[[3, 6]] - sde.sigmas[[2, 5]]).float().view(-1, 1, 1, 1)
    assert torch.allclose(res.mean, x + d * v, atol=1e-6)
    assert torch.all(res.std == 0)


def test_log_prob_against_torch_normal():
    torch.manual_seed(1)
    x, mean = torch.randn(4, 3, 5, 5), torch.randn(4, 3, 5, 5)
    std = torch.tensor([0.1, 0.5, 1.0, 2.0])
    ref = torch.distributions.Normal(mean, std.view(-1, 1, 1, 1)).log_prob(x)
    assert torch.allclose(gaussian_log_prob(x, mean, std, "mean"), ref.flatten(1).mean(1), atol=1e-5)
    assert torch.allclose(gaussian_log_prob(x, mean, std, "sum"), ref.flatten(1).sum(1), atol=1e-3)


def test_log_prob_golden_value():
    # one element, x - mean = 1, std = 0.5: -1/(2*0.25) - log 0.5 - 0.5 log(2 pi)
    lp = gaussian_log_prob(torch.ones(1, 1), torch.zeros(1, 1), torch.tensor([0.5]))
    assert lp.item() == pytest.approx(-2.0 + math.log(2) - 0.5 * math.log(2 * math.pi), abs=1e-6)


def test_log_prob_is_fp32_for_bf16_inputs():
    x = torch.randn(2, 3, 4, 4)
    lp = gaussian_log_prob(x.bfloat16(), torch.zeros_like(x).bfloat16(), torch.tensor([1.0, 1.0]))
    assert lp.dtype == torch.float32


@pytest.mark.parametrize("bad", [dict(steps=0), dict(noise="ddim"), dict(decode="latent"), dict(eta=-1.0)])
def test_bad_sampler_config(bad):
    with pytest.raises(ConfigError):
        SamplerConfig(**bad).validate()


# --- the SDE checked against the exact marginals of Gaussian data ----------------------------------

M, S = 0.5, 0.3  # data x0 ~ N(M, S^2) in every latent element


def _exact_velocity(x: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
    """E[eps - x0 | x_sigma] for x_sigma = (1 - sigma) x0 + sigma eps, x0 ~ N(M, S^2), eps ~ N(0, 1)."""
    a = 1 - sigma
    var = a**2 * S**2 + sigma**2
    return (sigma - a * S**2) / var * (x - a * M) - M


def _marginal(sigma: float) -> tuple[float, float]:
    a = 1 - sigma
    return a * M, a**2 * S**2 + sigma**2


@pytest.mark.slow
@pytest.mark.parametrize("noise, eta", [("dance", 0.7), ("flow", 0.3)])
def test_sde_steps_keep_the_marginals_of_gaussian_data(noise, eta):
    """With the exact velocity of Gaussian data, every SDE step must leave x_sigma distributed as the
    forward process says, N((1 - sigma) M, (1 - sigma)^2 S^2 + sigma^2): mean and variance within
    sampling and discretisation error at every noise level (a wrong score-correction term drifts the
    variance off by far more)."""
    sde = FlowSDE(SamplerConfig(steps=200, shift=1.0, noise=noise, eta=eta))
    g = torch.Generator().manual_seed(0)
    n = 100_000
    x = torch.randn(n, 1, 1, 1, generator=g)  # sigma = 1: N(0, 1)
    worst = 0.0
    for i in range(sde.cfg.steps - 1):  # down to sigma = 1/200
        sigma = sde.sigmas[i].float()
        out = sde.step(x, _exact_velocity(x, sigma), torch.full((n,), i), torch.ones(n, dtype=torch.bool))
        assert float(out.std[0]) > 0
        x = out.mean + out.std.view(-1, 1, 1, 1) * torch.randn(x.shape, generator=g)
        mean, var = _marginal(float(sde.sigmas[i + 1]))
        assert abs(float(x.mean()) - mean) < 0.01, (i, float(x.mean()), mean)
        worst = max(worst, abs(float(x.var()) / var - 1))
    assert worst < 0.03, worst


def test_ode_step_is_the_euler_step_and_the_sde_mean_tends_to_it():
    x, v = torch.randn(4, 3, 2, 2), torch.randn(4, 3, 2, 2)
    i = torch.tensor([0, 3, 5, 8])
    sigmas = sigma_grid(SamplerConfig(steps=10)).float()
    euler = x + (sigmas[i + 1] - sigmas[i]).view(-1, 1, 1, 1) * v
    ode = FlowSDE(SamplerConfig(steps=10)).step(x, v, i, torch.zeros(4, dtype=torch.bool))
    assert torch.equal(ode.std, torch.zeros(4))
    torch.testing.assert_close(ode.mean, euler, rtol=0, atol=1e-6)
    gaps = [
        float(
            (FlowSDE(SamplerConfig(steps=10, eta=eta)).step(x, v, i, torch.ones(4, dtype=torch.bool)).mean - euler)
            .abs()
            .max()
        )
        for eta in (0.4, 0.2, 0.1)
    ]
    assert (
        gaps[0] > 0
        and gaps[1] == pytest.approx(gaps[0] / 4, rel=1e-3)
        and gaps[2] == pytest.approx(gaps[0] / 16, rel=1e-3)
    )

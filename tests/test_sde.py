import math

import pytest
import torch

from treegrpo_cli.engine.sde import FlowSDE, SamplerConfig, gaussian_log_prob, sigma_grid
from treegrpo_cli.errors import ConfigError


def test_shifted_grid_golden_values():
    # methods.md 1.1, shift 3
    want10 = [1, .964, .923, .875, .818, .750, .667, .563, .429, .250, 0]
    got = sigma_grid(SamplerConfig(steps=10)).tolist()
    assert got == pytest.approx(want10, abs=1e-3)
    want20 = [1, .983, .964, .944, .923, .900, .875, .848, .818, .786, .750, .711, .667, .618, .563,
              .500, .429, .346, .250, .136, 0]
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

"""The protocols the engine calls: what it needs from a text-to-image model.

The engine knows nothing of diffusers or GRPO-specific model code: every adapter (treegrpo_cli.models)
turns prompts into conditions, (latent, sigma, condition) into a velocity, and latents into images.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from torch import Tensor, nn

Conditions = dict[str, Tensor]  # every tensor has the prompt batch as its first dim


@runtime_checkable
class Policy(Protocol):
    name: str

    # read-only to the engine: adapters may hold them as attributes or properties
    @property
    def latent_shape(self) -> tuple[int, ...]:
        """(C, H, W) of one latent."""

    @property
    def evals_per_row(self) -> int:
        """Model evaluations per latent row (2 with true CFG)."""

    def encode(self, prompts: list[str]) -> Conditions:
        """Prompts -> conditions, each tensor [P, ...]."""

    def velocity(self, x: Tensor, sigma: Tensor, cond: Conditions) -> Tensor:
        """x [B, C, H, W], sigma [B] in [0, 1], cond rows [B, ...] -> v [B, C, H, W].

        The model output that the policy's transition kernel expects: the flow velocity for
        FlowSDE, the noise prediction epsilon for engine.sde.DDIMKernel (SD1.5)."""

    def decode(self, latents: Tensor) -> Tensor:
        """latents [B, C, H, W] -> images [B, 3, H', W'] float in [0, 1]."""

    def trainable_parameters(self) -> list[nn.Parameter]:
        """The parameters GRPO updates (LoRA or all)."""

    def describe(self) -> dict[str, Any]:
        """JSON-able identity of the model (name, source, config) for shard metadata."""

    def trainable_state(self) -> dict[str, Tensor]:
        """Named tensors of the trainable parameters (what a checkpoint stores)."""

    def load_trainable_state(self, state: dict[str, Tensor]) -> None:
        """Load what trainable_state() returned (strict: every key, no extra)."""

    def reference(self) -> Policy:
        """A frozen copy of the current policy (the KL reference), sharing nothing trainable."""

    # Optional: `kernel(sampler_cfg) -> transition kernel`. A policy without it is sampled with
    # engine.sde.FlowSDE(sampler_cfg); see engine.sde.make_kernel.
    # Optional: `flops_per_row() -> (forward, backward) | None`: denoiser FLOPs of one network row (one CFG
    # half); callers multiply by the evaluations run (models/flops.py).


@dataclass
class StepResult:
    """What a Kernel's step returns (engine.sde.FlowSDE, engine.sde.DDIMKernel)."""

    mean: Tensor  # [B, C, H, W] fp32 mean of the next state (the ODE step when std is 0)
    std: Tensor  # [B] fp32 per-sample std of the transition (0 for an ODE step)
    x0: Tensor  # [B, C, H, W] fp32 clean-image prediction x - sigma*v


@runtime_checkable
class Kernel(Protocol):
    """One denoising transition x_i -> x_{i+1} on a fixed grid: engine.sde.FlowSDE for flow models,
    engine.sde.DDIMKernel for SD1.5 (a policy's own, see make_kernel)."""

    cfg: Any  # the SamplerConfig: steps, decode, log_prob_reduction, ...
    sigmas: Tensor  # [T+1] float64, the model's time input at every grid point

    def step(self, x: Tensor, out: Tensor, i: Tensor, sde: Tensor, prev_x0: Tensor | None = None) -> StepResult:
        """x [B, ...], the model output [B, ...], step indices [B], stochastic [B] bool -> mean, std [B], x0.
        prev_x0: the x0-predictions of the step before on the same paths (a multistep solver's history)."""

    def has_noise(self, step: int) -> bool:
        """Whether a stochastic step from `step` draws noise (CPS's last step does not: it is an ODE step)."""

    def log_prob(self, x_next: Tensor, mean: Tensor, std: Tensor) -> Tensor:
        """[B] Gaussian log-density of x_next under N(mean, std^2 I)."""


def select(cond: Conditions, rows: Tensor) -> Conditions:
    """Pick condition rows, e.g. the prompt of every frontier node."""
    return {k: v[rows] for k, v in cond.items()}

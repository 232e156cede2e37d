"""The maths of a fused PPO group: `adapters.ppo`'s network, advantages and loss for N members.

Each function is its single-member namesake in `adapters/ppo.py` with a member axis first, the
operations in the same order, so that a member's rows compute what its trial computes alone
(docs/fused.md, "PPO's fused loop"). The members' networks are rows of one `[N, P]` tensor
(`fused.stack` of their `Weights.flat`); each layer is one batched product (`fused.linear`);
every per-member hyperparameter is a tensor of N (`PPOHyper`).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

from adapters._rl import fused
from orchestrator.imports import LazyImport

if TYPE_CHECKING:
    import torch
    import torch.nn.functional as F
else:
    torch = LazyImport("torch")
    F = LazyImport("torch.nn.functional")


@dataclass
class PPOHyper:
    """The per-member values a fused PPO step reads, each a float32 tensor of N. Sums and
    differences of a trial's parameters are taken in Python's doubles first, as the single
    loop takes them (`gamma * gae_lambda`, `1 - clip_coef`), then rounded once."""

    gamma: torch.Tensor
    gamma_lambda: torch.Tensor
    clip_low: torch.Tensor
    clip_high: torch.Tensor
    vf_coef: torch.Tensor
    entropy_coefficient: torch.Tensor
    max_grad_norm: torch.Tensor

    @classmethod
    def of(cls, configs: Sequence[Any], device: torch.device | str = "cpu") -> PPOHyper:
        """From the members' `PPOConfig`s."""

        def column(values: list[float]) -> torch.Tensor:
            return torch.tensor(values, device=device)

        return cls(
            column([c.gamma for c in configs]),
            column([c.gamma * c.gae_lambda for c in configs]),
            column([1 - c.clip_coef for c in configs]),
            column([1 + c.clip_coef for c in configs]),
            column([c.vf_coef for c in configs]),
            column([c.entropy_coefficient for c in configs]),
            column([c.max_grad_norm for c in configs]),
        )

    def rows(self, index: torch.Tensor) -> PPOHyper:
        """The values of the members at `index` (a long tensor of rows)."""
        return PPOHyper(*(getattr(self, f.name).index_select(0, index) for f in fields(self)))


def tower(net: Mapping[str, torch.Tensor], name: str, obs: torch.Tensor) -> torch.Tensor:
    """`adapters.ppo.tower` for N members: obs [N, B, obs_dim] -> [N, B, outputs]."""
    w1, b1, w2, b2, w3, b3 = (
        net[f"{name}_{layer}"] for layer in ("w1", "b1", "w2", "b2", "w3", "b3")
    )
    h = torch.tanh(linear(obs, w1, b1))
    return linear(torch.tanh(linear(h, w2, b2)), w3, b3)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """`fused.linear` (x [N, B, in], weight [N, out, in], bias [N, out] -> [N, B, out]) whose
    sums run in the order of `F.linear`'s, forward and backward, so that each member's rows
    are what its trial computes alone, bit for bit on this CPU's MKL (`_Linear`)."""
    if torch.is_grad_enabled() and weight.requires_grad:
        return _linear_function().apply(x, weight, bias)
    return _products(x, weight, bias)  # acting and scoring: no graph, no Function's cost


def _products(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """The forward of `linear`. A single output (the critic's value) is a row of weights times
    the inputs' columns, as `F.linear` computes it."""
    if weight.shape[1] == 1:
        return torch.bmm(weight, x.transpose(1, 2)).transpose(1, 2) + bias.unsqueeze(1)
    return torch.baddbmm(bias.unsqueeze(1), x, weight.transpose(1, 2))


@functools.cache
def _linear_function() -> type:
    """`_Linear`, built on first use (torch is imported lazily)."""

    class _Linear(torch.autograd.Function):
        """N linear layers with `F.linear`'s order of sums. Its backward takes the weights'
        gradient as grad^T x and the bias's as grad summed over rows, as `addmm`'s backward
        does for `F.linear` (autograd's own for `baddbmm` takes x^T grad and sums the bias
        over a broadcast: the same numbers in another order)."""

        @staticmethod
        def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> Any:
            ctx.save_for_backward(x, weight)
            return _products(x, weight, bias)

        @staticmethod
        def backward(ctx: Any, grad: torch.Tensor) -> Any:
            x, weight = ctx.saved_tensors
            grad_x = torch.bmm(grad, weight) if ctx.needs_input_grad[0] else None
            return grad_x, torch.bmm(grad.transpose(1, 2), x), grad.sum(1)

    return _Linear


def advantages(
    net: Mapping[str, torch.Tensor],
    hyper: PPOHyper,
    obs: torch.Tensor,
    final_obs: torch.Tensor,
    reward: torch.Tensor,
    terminated: torch.Tensor,
    done: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`adapters.ppo.advantages` for N members: observations [T, N, envs, obs_dim], the rest
    [T, N, envs]; GAE advantages and returns [T, N, envs], each member with its own gamma and
    lambda."""
    steps, n, envs, obs_dim = obs.shape
    with torch.no_grad():
        # Each member's rows in its trial's order: all observations, then all final ones.
        both = torch.cat([obs, final_obs]).transpose(0, 1).reshape(n, -1, obs_dim)
        values = tower(net, "critic", both).view(n, 2, steps, envs).permute(1, 2, 0, 3)
        value, next_value = values[0], values[1] * ~terminated
        gamma = hyper.gamma.unsqueeze(1)  # [N, 1] against each step's [N, envs]
        delta = reward + gamma * next_value - value
        carry = hyper.gamma_lambda.unsqueeze(1) * ~done
        backwards = [delta[-1]]
        for t in range(steps - 2, -1, -1):
            backwards.append(torch.addcmul(delta[t], carry[t], backwards[-1]))
        advantage = torch.stack(backwards[::-1])
    return advantage, advantage + value


def losses(
    online: torch.Tensor,
    shapes: Mapping[str, tuple[int, ...]],
    batch: torch.Tensor,
    hyper: PPOHyper,
    obs_dim: int,
) -> torch.Tensor:
    """`adapters.ppo.loss_on` for N members: each member's loss [N] (graph to `online`) on its
    own minibatch, batch [N, B, obs_dim + 4] (obs, action, logprob, advantage, return)."""
    net = fused.views(online, shapes)
    obs, action = batch[..., :obs_dim], batch[..., obs_dim].long()
    old_logprob, adv, ret = (
        batch[..., obs_dim + 1],
        batch[..., obs_dim + 2],
        batch[..., obs_dim + 3],
    )
    log_probs = F.log_softmax(tower(net, "actor", obs), dim=2)
    new_logprob = log_probs.gather(2, action.unsqueeze(2)).squeeze(2)
    entropy = -(log_probs.exp() * log_probs).sum(dim=2).mean(dim=1)
    ratio = (new_logprob - old_logprob).exp()
    std, mean = torch.std_mean(adv, dim=1, keepdim=True)
    adv = (adv - mean) / (std + 1e-8)
    clipped = ratio.clamp(hyper.clip_low.unsqueeze(1), hyper.clip_high.unsqueeze(1))
    policy_loss = -torch.min(adv * ratio, adv * clipped).mean(dim=1)
    value_loss = 0.5 * (tower(net, "critic", obs).squeeze(2) - ret).square().mean(dim=1)
    return policy_loss + hyper.vf_coef * value_loss - hyper.entropy_coefficient * entropy


def clip_grad_norm(grad: torch.Tensor, max_norm: torch.Tensor) -> None:
    """`Weights.clip_grad_norm` per row of grad [N, P], each with its own limit. A trial's
    `max_norm / norm` divides a Python number by a tensor, which torch computes as the
    reciprocal times the number: so does this, for the same last bit."""
    norm = torch.linalg.vector_norm(grad, dim=1)
    grad.mul_(((norm + 1e-6).reciprocal() * max_norm).clamp_max(1.0).unsqueeze(1))


def greedy(net: Mapping[str, torch.Tensor], obs: torch.Tensor) -> torch.Tensor:
    """`adapters.ppo.greedy` for N members: obs [N, B, obs_dim] -> actions [N, B]."""
    return tower(net, "actor", obs).argmax(dim=2)

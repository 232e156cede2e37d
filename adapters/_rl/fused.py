"""Fused training maths: N same-shaped networks trained as one (the building block of `--fuse`).

Horizontal fusion (HFTA, MLSys 2021): the members of a group share every shape, so their
parameters stack into one `[N, P]` tensor and each layer of N small networks becomes one
batched product (`torch.baddbmm`) over all of them. One process then pays the interpreter once
per step for N trials, and a GPU sees one kernel N times the size instead of N tiny ones.
docs/fused.md has the design; this module is its maths only and is NOT yet wired into the pool
or the trial process: nothing calls it but `benchmarks/bench_fused.py` and
`tests/test_fused_maths.py`.

What is per member stays per member, as tensors with a leading member axis:

- the parameters and Adam's moments (`FusedAdam`: one functional Adam over the stacked rows,
  a learning rate and a step count per member; a member outside a step keeps its state);
- the gradient clip (each row's own norm);
- DQN's Huber delta and soft-backup temperature (`DQNHyper`); gamma and n-step are already in
  each member's replayed returns and discounts, so they need nothing here;
- the batch: each member's batch is padded to the group's largest and a mask says which rows
  are real (`pad_batches`); the loss is each member's mean over its own rows, so a member's
  gradient is the one it would have alone (`batch_bands` cuts a group into bands instead).

The sum of the members' losses is back-propagated once: the members share no parameter, so its
gradient with respect to row i of the stack is member i's own gradient. `vmap_grad` does the
same with `torch.func` (vmap of grad over a per-member loss), for networks written for one
member, such as `adapters.dqn.q_values`.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from orchestrator.imports import LazyImport

if TYPE_CHECKING:
    import torch
    import torch.nn.functional as F
else:
    torch = LazyImport("torch")
    F = LazyImport("torch.nn.functional")


def views(flat: torch.Tensor, shapes: Mapping[str, tuple[int, ...]]) -> dict[str, torch.Tensor]:
    """Named views of one member's `[P]` parameters, or of stacked `[N, P]` ones (`[N, *shape]`)."""
    lead = flat.shape[:-1]
    sizes = [math.prod(shape) for shape in shapes.values()]
    pieces = flat.split(sizes, dim=-1)
    return {
        name: piece.reshape(*lead, *shape)
        for (name, shape), piece in zip(shapes.items(), pieces, strict=True)
    }


def stack(flats: Sequence[torch.Tensor]) -> torch.Tensor:
    """The members' flat parameter tensors (`Weights.flat`) as one `[N, P]` leaf (`aligned`)."""
    return aligned(torch.stack([flat.detach() for flat in flats]))


ROW_ALIGNMENT = 16  # floats: 64 bytes, the alignment of a trial's own `Weights.flat`


def aligned(rows: torch.Tensor) -> torch.Tensor:
    """Rows [n, P] copied into a buffer whose rows start every multiple of `ROW_ALIGNMENT`
    floats, as a leaf view [n, P]. MKL's products sum in an order that depends on where their
    operands start in memory: a member's weights at row k of a plain [N, P] tensor would start
    where its trial's never do, and its products would part from its trial's in the last bits."""
    n, size = rows.shape
    padded = -(-size // ROW_ALIGNMENT) * ROW_ALIGNMENT
    buffer = torch.zeros(n, padded, dtype=rows.dtype, device=rows.device)
    buffer[:, :size] = rows.detach()
    return buffer[:, :size].requires_grad_()


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """N linear layers at once: x [N, B, in], weight [N, out, in], bias [N, out] -> [N, B, out]."""
    return torch.baddbmm(bias.unsqueeze(1), x, weight.transpose(1, 2))


def dueling_q_values(net: Mapping[str, torch.Tensor], obs: torch.Tensor) -> torch.Tensor:
    """`adapters.dqn.q_values` for N members: obs [N, B, obs_dim] -> Q [N, B, n_actions]."""
    h = F.relu(linear(obs, net["w1"], net["b1"]))
    h = F.relu(linear(h, net["w2"], net["b2"]))
    fold = dueling_map(net["head_b"].shape[-1] - 1, obs.device)
    return linear(h, fold.T @ net["head_w"], net["head_b"] @ fold)


@functools.cache
def dueling_map(n_actions: int, device: torch.device) -> torch.Tensor:
    """`adapters.dqn.dueling_map`: row 0 (the value) all ones, then I - 1/n."""
    with torch.inference_mode(False):
        identity = torch.eye(n_actions, device=device)
        return torch.cat([torch.ones(1, n_actions, device=device), identity - 1 / n_actions])


@dataclass
class DQNHyper:
    """The per-member values a fused DQN step reads, each a tensor of N."""

    huber_delta: torch.Tensor
    entropy_coefficient: torch.Tensor  # 0: double DQN; above 0: the soft backup
    max_grad_norm: torch.Tensor

    @classmethod
    def of(cls, configs: Sequence[Any], device: torch.device | str = "cpu") -> DQNHyper:
        """From the members' `DQNConfig`s."""

        def column(name: str) -> torch.Tensor:
            return torch.tensor([float(getattr(c, name)) for c in configs], device=device)

        return cls(column("huber_delta"), column("entropy_coefficient"), column("max_grad_norm"))


@dataclass
class Batch:
    """N members' replayed batches padded to the largest: every field [N, B] (obs [N, B, d])."""

    obs: torch.Tensor
    next_obs: torch.Tensor
    action: torch.Tensor
    ret: torch.Tensor
    discount: torch.Tensor
    importance: torch.Tensor  # 1 where a member replays uniformly
    mask: torch.Tensor  # 1 on a member's own rows, 0 on padding


def pad_batches(batches: Sequence[tuple[torch.Tensor, ...]]) -> Batch:
    """Each member's (obs, next_obs, action, ret, discount, importance or None), padded."""
    largest = max(len(b[0]) for b in batches)
    fields: list[list[torch.Tensor]] = [[] for _ in range(7)]
    for obs, next_obs, action, ret, discount, importance in batches:
        rows = len(obs)
        ones = torch.ones(rows, device=obs.device)
        own = (obs, next_obs, action, ret, discount, ones if importance is None else importance)
        for field, value in zip(fields, (*own, ones), strict=True):
            pad = [0, 0] * (value.dim() - 1) + [0, largest - rows]
            field.append(F.pad(value, pad) if rows < largest else value)
    return Batch(*(torch.stack(field) for field in fields))


def batch_bands(batch_sizes: Sequence[int], ratio: float = 2.0) -> list[list[int]]:
    """The members (by index) cut into bands whose batch sizes are within `ratio` of the band's
    smallest: each band is one fused step, padding at most `ratio` times the real rows."""
    order = sorted(range(len(batch_sizes)), key=lambda i: batch_sizes[i])
    bands: list[list[int]] = []
    for i in order:
        if bands and batch_sizes[i] <= ratio * batch_sizes[bands[-1][0]]:
            bands[-1].append(i)
        else:
            bands.append([i])
    return bands


def huber(error: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
    """Elementwise Huber loss with a delta per member (delta [N], error [N, B])."""
    delta = delta.unsqueeze(1)
    size = error.abs()
    return torch.where(size < delta, 0.5 * size * size, delta * (size - 0.5 * delta))


def dqn_losses(
    online: torch.Tensor,
    target: torch.Tensor,
    shapes: Mapping[str, tuple[int, ...]],
    batch: Batch,
    hyper: DQNHyper,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each member's loss [N] (graph to `online`) and TD errors [N, B], as `Learner.gradient_step`."""
    net = views(online, shapes)
    with torch.no_grad():
        next_q = dueling_q_values(views(target, shapes), batch.next_obs)
        online_next_q = dueling_q_values(net, batch.next_obs)
        best = online_next_q.argmax(dim=2, keepdim=True)
        next_value = next_q.gather(2, best).squeeze(2)
        alpha = hyper.entropy_coefficient
        if bool((alpha > 0).any()):  # the soft backup, where a member asks for it
            temperature = torch.where(alpha > 0, alpha, 1.0)[:, None, None]
            log_pi = F.log_softmax(online_next_q / temperature, dim=2)
            soft = (log_pi.exp() * (next_q - temperature * log_pi)).sum(dim=2)
            next_value = torch.where(alpha[:, None] > 0, soft, next_value)
        target_value = torch.addcmul(batch.ret, batch.discount, next_value)
    q = dueling_q_values(net, batch.obs)
    # A one-hot product, not gather: gather's backward scatters, slower on CPU at these sizes.
    chosen = F.one_hot(batch.action.long(), q.shape[-1]).to(q.dtype)
    predicted = (q * chosen).sum(dim=2)
    per_row = batch.importance * huber(predicted - target_value, hyper.huber_delta) * batch.mask
    losses = per_row.sum(dim=1) / batch.mask.sum(dim=1)
    return losses, (target_value - predicted).detach()


def clip_per_member(grad: torch.Tensor, max_norm: torch.Tensor) -> None:
    """As `Weights.clip_grad_norm`, one L2 norm and one limit per row of grad [N, P]."""
    norm = torch.linalg.vector_norm(grad, dim=1)
    # A trial's `max_norm / norm` divides a Python number by a tensor, which torch computes as
    # the reciprocal times the number: so does this, for the same last bit.
    grad.mul_(((norm + 1e-6).reciprocal() * max_norm).clamp_max(1.0).unsqueeze(1))


class FusedAdam:
    """Adam (torch.optim.Adam's update, no weight decay) over stacked rows, a learning rate per
    member. A member left out of a step (`active` False) keeps its parameters, moments and
    step count, as a trial that takes no gradient step this time."""

    def __init__(self, params: torch.Tensor, betas: tuple[float, float] = (0.9, 0.999)) -> None:
        self.params = params
        self.beta1, self.beta2 = betas
        self.exp_avg = torch.zeros_like(params, requires_grad=False)
        self.exp_avg_sq = torch.zeros_like(params, requires_grad=False)
        self.steps = torch.zeros(len(params), device=params.device)

    @torch.no_grad()
    def step(
        self,
        grad: torch.Tensor,
        lr: torch.Tensor,
        eps: torch.Tensor | float = 1e-8,
        active: torch.Tensor | None = None,
    ) -> None:
        """One Adam step of every active row; `lr` (and `eps`) one value per member."""
        steps = self.steps + (1.0 if active is None else active.float())
        counted = steps.clamp_min(1.0)  # an inactive member at step 0 divides by nothing
        exp_avg = self.exp_avg.lerp(grad, 1 - self.beta1)
        exp_avg_sq = self.exp_avg_sq.mul(self.beta2).addcmul_(grad, grad, value=1 - self.beta2)
        correction1 = 1 - self.beta1**counted
        correction2_sqrt = (1 - self.beta2**counted).sqrt()
        eps = torch.as_tensor(eps, device=grad.device).expand(len(grad))
        denom = (exp_avg_sq.sqrt() / correction2_sqrt[:, None]).add_(eps[:, None])
        update = exp_avg / denom * (lr / correction1)[:, None]
        if active is None:
            self.exp_avg, self.exp_avg_sq = exp_avg, exp_avg_sq
            self.params.sub_(update)
        else:
            rows = active[:, None]
            self.exp_avg = torch.where(rows, exp_avg, self.exp_avg)
            self.exp_avg_sq = torch.where(rows, exp_avg_sq, self.exp_avg_sq)
            self.params.sub_(torch.where(rows, update, 0.0))
        self.steps = steps

    @torch.no_grad()
    def step_rows(
        self, rows: Sequence[int], grads: torch.Tensor, lrs: Sequence[float], eps: float = 1e-8
    ) -> None:
        """One Adam step of the members at `rows` (grads[k] is row rows[k]'s gradient), each
        with its own learning rate, by the very kernel a trial's `torch.optim.Adam(fused=True)`
        runs: a member's step is bit for bit the one it takes alone. The other rows keep their
        parameters, moments and step count. On a CPU this costs less than `step`'s operations
        over the whole stack (one pass over each member's row instead of about ten over all of
        them); where torch has no fused Adam for the tensors, it is `step` with `active`."""
        fused_kernel = self.params.device.type in ("cpu", "cuda") and hasattr(torch, "_fused_adam_")
        if not fused_kernel:
            full = torch.zeros_like(self.params)
            full[list(rows)] = grads
            active = torch.zeros(len(self.params), dtype=torch.bool, device=self.params.device)
            active[list(rows)] = True
            lr = torch.zeros(len(self.params), device=self.params.device)
            lr[list(rows)] = torch.tensor(list(lrs), device=lr.device)
            self.step(full, lr, eps, active=active)
            return
        steps = [self.steps[row] for row in rows]
        torch._foreach_add_(steps, 1)  # as torch's Adam counts before it steps
        for k, row in enumerate(rows):
            torch._fused_adam_(
                [self.params[row]],
                [grads[k]],
                [self.exp_avg[row]],
                [self.exp_avg_sq[row]],
                [],
                [steps[k]],
                amsgrad=False,
                lr=float(lrs[k]),
                beta1=self.beta1,
                beta2=self.beta2,
                weight_decay=0.0,
                eps=eps,
                maximize=False,
                grad_scale=None,
                found_inf=None,
            )

    def keep(self, rows: Sequence[int], params: torch.Tensor) -> FusedAdam:
        """This Adam's state of the members at `rows` only, for `params` (those rows' stack)."""
        kept = FusedAdam.__new__(FusedAdam)
        index = torch.tensor(list(rows), dtype=torch.long, device=params.device)
        kept.params, kept.beta1, kept.beta2 = params, self.beta1, self.beta2
        kept.exp_avg = self.exp_avg.index_select(0, index)
        kept.exp_avg_sq = self.exp_avg_sq.index_select(0, index)
        kept.steps = self.steps.index_select(0, index)
        return kept

    def load_member(self, index: int, state: Mapping[str, Any]) -> None:
        """Row `index` from one trial's `torch.optim.Adam` state (one flat parameter)."""
        self.exp_avg[index] = state["exp_avg"]
        self.exp_avg_sq[index] = state["exp_avg_sq"]
        self.steps[index] = float(state["step"])

    def member_state(self, index: int) -> dict[str, torch.Tensor] | None:
        """Row `index` as one trial's `torch.optim.Adam` keeps its state (None before a step)."""
        if float(self.steps[index]) == 0:
            return None
        return {
            "step": self.steps[index].clone(),
            "exp_avg": self.exp_avg[index].clone(),
            "exp_avg_sq": self.exp_avg_sq[index].clone(),
        }


@dataclass
class FusedDQN:
    """N DQN members' online and target networks and their fused Adam."""

    online: torch.Tensor  # [N, P] leaf
    target: torch.Tensor  # [N, P]
    shapes: dict[str, tuple[int, ...]]
    adam: FusedAdam
    learning_rate: torch.Tensor  # [N]
    hyper: DQNHyper

    @classmethod
    def of(cls, q_nets: Sequence[Any], targets: Sequence[Any], configs: Sequence[Any]) -> FusedDQN:
        """From the members' `Weights` (online and target) and `DQNConfig`s."""
        online = stack([net.flat for net in q_nets])
        lr = torch.tensor([float(c.learning_rate) for c in configs], device=online.device)
        return cls(
            online,
            torch.stack([t.flat for t in targets]).clone(),
            dict(q_nets[0].shapes),
            FusedAdam(online),
            lr,
            DQNHyper.of(configs, online.device),
        )

    def gradient_step(self, batch: Batch, active: torch.Tensor | None = None) -> tuple[Any, Any]:
        """One fused update of every (active) member; its losses [N] and TD errors [N, B]."""
        losses, td_error = dqn_losses(self.online, self.target, self.shapes, batch, self.hyper)
        self.online.grad = None
        losses.sum().backward()
        grad = self.online.grad
        clip_per_member(grad, self.hyper.max_grad_norm)
        self.adam.step(grad, self.learning_rate, active=active)
        return losses.detach(), td_error

    @torch.no_grad()
    def refresh_targets(self, due: torch.Tensor) -> None:
        """Copy the online rows of the members whose target period came round (due [N] bool)."""
        self.target.copy_(torch.where(due[:, None], self.online, self.target))


def vmap_grad(
    member_loss: Callable[..., torch.Tensor], params: torch.Tensor, *data: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gradients [N, P] and losses [N] of `member_loss(flat [P], *member_data)` for each row of
    params [N, P] and of every tensor in `data`, by `torch.func.vmap(torch.func.grad_and_value)`."""
    from torch.func import grad_and_value, vmap

    return vmap(grad_and_value(member_loss))(params.detach(), *data)

"""A trading environment vectorised in torch: many episodes step at once on the trial's device.

One asset, one price series. A position is an integer number of units in
[-max_position, +max_position]; one unit is a fixed notional of one unit of capital, re-marked
every step (so its mark-to-market change over a step is the price's simple return).

Actions: 0 sell one unit, 1 hold, 2 buy one unit. An order that would pass the position limit
is not executed (and costs nothing).

At time t (the agent has seen prices up to t), with position p_old and action a:

    p_new   = clamp(p_old + a - 1, -max_position, +max_position)
    traded  = |p_new - p_old|
    pnl     = p_new * R[t] - cost_rate * traded                    # the real net return
    reward  = reward_scale * (p_new * R[t]
                              - cost_rate * cost_multiplier * traded
                              - hold_penalty_weight * hold_cost * |p_new|)

where R[t] = price[t+1] / price[t] - 1. `pnl` is what the strategy really earns (the held-out
Sharpe ratio is computed from it); `cost_multiplier` and the hold penalty (a carrying charge on
open inventory, `hold_cost` per unit per step) only shape the training reward.

The observation at time t is the last `window` log returns (up to price[t]) divided by
`return_scale` and clipped to [-5, 5], followed by p_old / max_position.

Episodes last `episode_steps` steps or until the series ends (both are truncations, never
terminations: the market does not end). An episode that ends restarts at once with a flat
position, at a random start (or at the first possible one, `start + window`, with
`random_starts=False`); `final_obs` holds the observation the step really led to, for
bootstrapping.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from adapters.envs.base import StepResult
from orchestrator.imports import LazyImport

if TYPE_CHECKING:
    import numpy as np
    import torch
else:
    torch = LazyImport("torch")

SELL, HOLD, BUY = 0, 1, 2
OBS_CLIP = 5.0
RETURNS_KEPT = 256


def _check_range(start: int, end: int, window: int, length: int) -> None:
    if end - 2 < start + window:
        raise ValueError(
            f"prices [{start}, {end}) are too short for a window of {window}: "
            f"need at least {window + 2} prices"
        )
    if start < 0 or end > length:
        raise ValueError(f"prices [{start}, {end}) are outside the series of {length}")


class TradingEnv:
    """`num_envs` independent episodes over one price series, stepped with tensor operations."""

    n_actions = 3

    def __init__(
        self,
        prices: np.ndarray | torch.Tensor,
        *,
        num_envs: int = 1,
        window: int = 32,
        max_position: int = 1,
        cost_rate: float = 5e-4,
        cost_multiplier: float = 1.0,
        hold_penalty_weight: float = 0.0,
        hold_cost: float = 1e-4,
        reward_scale: float = 100.0,
        episode_steps: int = 256,
        start: int = 0,
        end: int | None = None,
        random_starts: bool = True,
        return_scale: float | None = None,
        device: torch.device | str = "cpu",
        seed: int = 0,
    ) -> None:
        if max_position < 1:
            raise ValueError(f"max_position must be at least 1, not {max_position}")
        if window < 1:
            raise ValueError(f"window must be at least 1, not {window}")
        self.device = torch.device(device)
        # Accounting in float64: small returns minus small costs lose digits in float32.
        price = torch.as_tensor(prices, dtype=torch.float64).to(self.device)
        self.prices = price
        end = len(price) if end is None else end
        # Prices [start, end): the first decision needs `window` returns behind it, the last
        # needs one price after it.
        self.first_t = start + window
        self.last_t = end - 2
        _check_range(start, end, window, len(price))
        self.num_envs = num_envs
        self.window = window
        self.max_position = max_position
        self.cost_rate = cost_rate
        self.cost_multiplier = cost_multiplier
        self.hold_penalty_weight = hold_penalty_weight
        self.hold_cost = hold_cost
        self.reward_scale = reward_scale
        self.episode_steps = episode_steps
        self.random_starts = random_starts
        self.obs_dim = window + 1

        self.simple_returns = price[1:] / price[:-1] - 1.0  # R[t]: from price t to t+1
        log_returns = torch.log(price[1:] / price[:-1])
        # By default, normalise by the spread of returns in this env's own range (its training part).
        scale = return_scale or float(log_returns[start : end - 1].std().clamp_min(1e-12))
        self.return_scale = scale
        self.scaled_returns = (log_returns / scale).clamp(-OBS_CLIP, OBS_CLIP).float()
        self.offsets = torch.arange(-window, 0, device=self.device)
        self._start_state(num_envs, seed)

    def _start_state(self, num_envs: int, seed: int) -> None:
        """Every episode's clock, position and running return, on the env's device."""
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(seed)
        self.t = torch.zeros(num_envs, dtype=torch.long, device=self.device)
        self.steps = torch.zeros(num_envs, dtype=torch.long, device=self.device)
        self.position = torch.zeros(num_envs, dtype=torch.long, device=self.device)
        self.episode_return = torch.zeros(num_envs, dtype=torch.float64, device=self.device)
        self.pnl = torch.zeros(num_envs, dtype=torch.float64, device=self.device)
        # Returns of ended episodes stay on the device (NaN where none ended) until asked for,
        # or until `RETURNS_KEPT` steps' worth: reading them is a wait for the device.
        self._ended_returns: list[torch.Tensor] = []
        self._finished_returns: list[float] = []
        # On a GPU, asking whether any episode ended would wait for the device, so every step
        # restarts where needed without asking; on the CPU asking is free and most steps skip it.
        self.ask_before_restart = self.device.type == "cpu"

    def _starts(self, count: int) -> torch.Tensor:
        if not self.random_starts:
            return torch.full((count,), self.first_t, dtype=torch.long, device=self.device)
        # Leave room for a whole episode where the range allows it.
        latest = max(self.first_t, self.last_t - self.episode_steps + 1)
        return torch.randint(
            self.first_t,
            latest + 1,
            (count,),
            generator=self.generator,
            device=self.device,
        )

    def observe(self) -> torch.Tensor:
        # scaled_returns[k] is the log return from price k to k+1, so the window ending at
        # price t is scaled_returns[t - window : t].
        returns = self.scaled_returns[self.t.unsqueeze(1) + self.offsets]
        position = (self.position.float() / self.max_position).unsqueeze(1)
        return torch.cat([returns, position], dim=1)

    def reset(self) -> torch.Tensor:
        self.t = self._starts(self.num_envs)
        self.steps.zero_()
        self.position.zero_()
        self.episode_return.zero_()
        return self.observe()

    def step(self, actions: torch.Tensor) -> StepResult:
        actions = actions.to(self.device).long()
        new_position = (self.position + actions - 1).clamp(-self.max_position, self.max_position)
        traded = (new_position - self.position).abs().double()
        held = new_position.double()
        market = held * self.simple_returns[self.t]
        self.pnl = market - self.cost_rate * traded
        shaped = (
            market
            - self.cost_rate * self.cost_multiplier * traded
            - self.hold_penalty_weight * self.hold_cost * held.abs()
        )
        reward = self.reward_scale * shaped
        self.episode_return += reward

        self.position = new_position
        self.t = self.t + 1
        self.steps += 1
        truncated = (self.steps >= self.episode_steps) | (self.t > self.last_t)
        final_obs = self.observe()
        obs = final_obs
        if not self.ask_before_restart or bool(truncated.any()):
            obs = self._restart(truncated)
        return StepResult(obs, reward.float(), torch.zeros_like(truncated), truncated, final_obs)

    def _restart(self, ended: torch.Tensor) -> torch.Tensor:
        """Start new episodes, flat, where `ended`; keep the ended ones' returns. The next obs."""
        self._ended_returns.append(torch.where(ended, self.episode_return, torch.nan))
        if len(self._ended_returns) >= RETURNS_KEPT:
            self._collect_returns()
        self.episode_return = torch.where(ended, 0.0, self.episode_return)
        self.t = torch.where(ended, self._starts(self.num_envs), self.t)
        self.steps = torch.where(ended, 0, self.steps)
        self.position = torch.where(ended, 0, self.position)
        return self.observe()

    def _collect_returns(self) -> None:
        if self._ended_returns:
            ended = torch.stack(self._ended_returns)
            self._finished_returns.extend(ended[~ended.isnan()].tolist())
            self._ended_returns.clear()

    @property
    def finished_returns(self) -> list[float]:
        """The return of every episode that ended, in the order they ended."""
        self._collect_returns()
        return self._finished_returns

    def close(self) -> None:
        """Nothing to release: the environment is tensors (the interface of every env here)."""

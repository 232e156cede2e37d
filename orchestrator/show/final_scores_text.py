"""The selected trial's trusted scores as lines: validation, confirmed means, test, baselines."""

from __future__ import annotations

from orchestrator.record.final_scores import FinalScores


def _pm(mean: float, std: float | None, seeds: int) -> str:
    return f"{mean:.4g}" if seeds <= 1 or std is None else f"{mean:.4g} +- {std:.2g}"


def final_score_lines(scores: FinalScores) -> list[str]:
    """What `run` ends with and `best` and `status` show, a person's lines."""
    metric = scores.metric
    lines = [
        f"selected on validation: trial #{scores.selected_trial}, {metric} {scores.validation:.4g}"
    ]
    if scores.confirmed:
        runs = ", ".join(
            f"#{c.trial} {_pm(c.mean, c.std, len(c.values))} (was {c.validation:.4g})"
            for c in scores.confirmed
        )
        lines.append(f"confirmed on {len(scores.confirmed[0].values)} seeds, best first: {runs}")
    if scores.test is not None:
        seeds = f", {scores.seeds} seeds" if scores.seeds > 1 else ""
        lines.append(
            f"test (a part no trial saw{seeds}): {metric} {_pm(scores.test, scores.test_std, scores.seeds)}"
        )
    if scores.baselines:
        periods = sorted(
            {p for by_period in scores.baselines.values() for p in by_period},
            key=lambda p: (p != "validation", p),
        )
        lines.append("baselines: " + "   ".join(periods))
        for name, by_period in scores.baselines.items():
            cells = "   ".join(f"{by_period.get(p, float('nan')):.4g}" for p in periods)
            lines.append(f"  {name.replace('_', '-')}: {cells}")
    return lines

"""The selected trial's trusted scores as lines: validation, confirmed means, test, baselines.

The same facts in four shapes: lines for `best` and `status`, one line for the end of `run`
(`side_by_side`), markdown for the study's optuna-dashboard note, HTML for the report.
"""

from __future__ import annotations

import html

from orchestrator.record.study.final_scores import FinalScores, final_scores_of


def _pm(mean: float, std: float | None, seeds: int) -> str:
    return f"{mean:.4g}" if seeds <= 1 or std is None else f"{mean:.4g} +- {std:.2g}"


def _validation(scores: FinalScores) -> str:
    """The selected value, with the spread of its seeds where the study ran repeats."""
    seeds = len(scores.validation_values)
    text = _pm(scores.validation, scores.validation_std, seeds)
    return f"{text} over {seeds} seeds" if seeds > 1 else text


def _periods(scores: FinalScores) -> list[str]:
    found = {p for by_period in scores.baselines.values() for p in by_period}
    return sorted(found, key=lambda p: (p != "validation", p))


def _baseline_name(name: str) -> str:
    return name.replace("_", "-")


def final_score_lines(scores: FinalScores, *, valued_now: int | None = None) -> list[str]:
    """What `best` and `status` show, a person's lines (`valued_now`: the study's completed
    trials with a value now, to say when the scores are older than the study)."""
    metric = scores.metric
    by = (
        f"selected by the confirmation (ranked first on {len(scores.confirmed[0].values)} seeds)"
        if scores.confirmed
        else "selected on validation"
    )
    lines = [f"{by}: trial #{scores.selected_trial}, {metric} {_validation(scores)}"]
    if valued_now is not None and valued_now != scores.complete_trials:
        lines.append(
            f"scored when the study had {scores.complete_trials} completed trials, it has "
            f"{valued_now} now: these scores are older than the study "
            f"(`best --confirm {len(scores.confirmed)}` scores it again)"
        )
    if scores.confirmed:
        runs = ", ".join(
            f"#{c.trial} {_pm(c.mean, c.std, len(c.values))} (was {c.validation:.4g})"
            for c in scores.confirmed
        )
        lines.append(f"confirmed on {len(scores.confirmed[0].values)} seeds, best first: {runs}")
    if scores.test is not None:
        seeds = f", {scores.seeds} seeds" if scores.seeds > 1 else ""
        test = _pm(scores.test, scores.test_std, scores.seeds)
        lines.append(f"test (a part no trial saw{seeds}): {metric} {test}")
    if scores.baselines:
        periods = _periods(scores)
        lines.append("baselines: " + "   ".join(periods))
        for name, by_period in scores.baselines.items():
            cells = "   ".join(f"{by_period.get(p, float('nan')):.4g}" for p in periods)
            lines.append(f"  {_baseline_name(name)}: {cells}")
    return lines


def side_by_side(scores: FinalScores) -> str:
    """One line: validation, test and buy-and-hold (else the first baseline) on both parts, each
    figure named by its part, e.g.
    `sharpe: validation 1.26 (trial #7), test 0.41; buy-and-hold: validation 0.63, test 0.85`."""
    if scores.confirmed:  # the re-ranked mean: the figure the selection now stands on
        first = scores.confirmed[0]
        seeds = len(first.values)
        parts = [f"validation {_pm(first.mean, first.std, seeds)} over {seeds} seeds"]
    else:
        parts = [f"validation {_validation(scores)}"]
    parts[0] += f" (trial #{scores.selected_trial})"
    if scores.test is not None:
        parts.append(f"test {_pm(scores.test, scores.test_std, scores.seeds)}")
    if scores.baselines:
        name = (
            "buy_and_hold" if "buy_and_hold" in scores.baselines else next(iter(scores.baselines))
        )
        by_period = scores.baselines[name]
        shown = ", ".join(
            f"{p} {by_period[p]:.4g}" for p in ("validation", "test") if p in by_period
        )
        return f"{scores.metric}: " + ", ".join(parts) + f"; {_baseline_name(name)}: {shown}"
    return f"{scores.metric}: " + ", ".join(parts)


def _table_rows(scores: FinalScores) -> list[tuple[str, str, str]]:
    """(what, validation, test) rows: the selected trial, then each baseline."""
    test = "-" if scores.test is None else _pm(scores.test, scores.test_std, scores.seeds)
    rows = [(f"trial #{scores.selected_trial}", _validation(scores), test)]
    for name, by_period in scores.baselines.items():
        cells = [by_period.get(p) for p in ("validation", "test")]
        rows.append(
            (_baseline_name(name), *("-" if v is None else f"{v:.4g}" for v in cells))  # type: ignore[arg-type]
        )
    return rows


def _confirmed_text(scores: FinalScores) -> str | None:
    if not scores.confirmed:
        return None
    runs = ", ".join(
        f"#{c.trial} {_pm(c.mean, c.std, len(c.values))} (was {c.validation:.4g})"
        for c in scores.confirmed
    )
    return f"Confirmed on {len(scores.confirmed[0].values)} seeds, best first: {runs}."


def final_scores_markdown(scores: FinalScores) -> str:
    """The study's optuna-dashboard note: the selected trial beside the baselines."""
    lines = [
        f"### Scores to trust ({scores.metric})",
        "",
        "Selected on the validation part; tested once on a part no trial saw.",
        "",
        "| | validation | test |",
        "|---|---:|---:|",
    ]
    lines += [f"| {what} | {val} | {test} |" for what, val, test in _table_rows(scores)]
    confirmed = _confirmed_text(scores)
    if confirmed:
        lines += ["", confirmed]
    return "\n".join(lines) + "\n"


def final_scores_html(scores: FinalScores | None) -> str:
    """The report's section (empty when the study has no stored scores)."""
    if scores is None:
        return ""
    cells = "".join(
        f"<tr><td>{html.escape(what)}</td><td>{html.escape(val)}</td>"
        f"<td>{html.escape(test)}</td></tr>"
        for what, val, test in _table_rows(scores)
    )
    confirmed = _confirmed_text(scores)
    note = f"<p>{html.escape(confirmed)}</p>" if confirmed else ""
    return (
        f'<section id="final-scores"><h2>Scores to trust ({html.escape(scores.metric)})</h2>'
        "<p>The best trial was selected on the validation part, and tested once on a part no "
        "trial saw; the baselines are scored on the same parts.</p>"
        "<table><thead><tr><th></th><th>validation</th><th>test</th></tr></thead>"
        f"<tbody>{cells}</tbody></table>{note}</section>"
    )


def final_scores_section(user_attrs: dict) -> str:
    """The report's section from a study's user attributes ("" when nothing was stored)."""
    return final_scores_html(final_scores_of(user_attrs))

"""The recommended trial beside the best observed one, as every view says it.

A study's best observed value is the luckiest of many noisy runs: on a noisy task the trial
that holds it is seldom the best configuration the search tried. The recommendation
(`samplers/_model/recommend.py`) is the configuration the study's model expects to be best,
from every trial it ran (several observations of one configuration, its re-runs, count
together). Users should deploy the recommended trial; the best observed one is shown beside
it, with both values and why they differ, or one line when they are the same trial.

`recommended_of` reads it from a study's trials; the rest shapes it for `best`, `status`,
the report, the end of `run` and the study's optuna-dashboard note.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from orchestrator.imports import LazyImport
from orchestrator.record.checkpoints.lineage import is_segment
from orchestrator.show.run_facts import params_yaml

if TYPE_CHECKING:
    from optuna.trial import FrozenTrial

    from samplers._model import recommend
else:
    recommend = LazyImport("samplers._model.recommend")

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Recommended:
    """The recommended trial, and the best observed one it is shown beside."""

    trial: int
    value: float  # the recommended trial's own value, as stored
    params: dict[str, Any]
    expected: float  # what the model expects of its configuration
    observed: float  # its configuration's observed value (the mean of its runs)
    repeats: int  # observations of its configuration
    best_observed: int  # the trial with the best observed value
    best_observed_value: float
    best_observed_params: dict[str, Any]
    reason: str  # one line: why the two differ
    modelled: bool = True  # False: too few configurations for a model, `expected` is observed

    @property
    def same(self) -> bool:
        return self.trial == self.best_observed

    def as_dict(self) -> dict[str, Any]:
        """For JSON: the best observed trial by number (`best` shows it whole beside)."""
        shown = {k: v for k, v in asdict(self).items() if not k.startswith("best_observed_")}
        return {**shown, "same_as_best_observed": self.same}


def recommended_of(trials: Sequence[FrozenTrial], directions: Sequence[str]) -> Recommended | None:
    """The recommendation among these trials; None with several objectives, no completed trial,
    or a study of population-based training (a lineage's segments are stages of one run, not
    configurations to compare: its best lineage is shown instead)."""
    if len(directions) != 1 or any(is_segment(t) for t in trials):
        return None
    try:
        found = recommend.recommendation(trials, directions)
    except (ValueError, ArithmeticError) as error:  # a model that cannot be fitted on these
        logger.warning("no recommended trial: the model could not be fitted (%s)", error)
        return None
    if found is None:
        return None
    lucky = found.best_observed
    return Recommended(
        trial=found.trial.number,
        value=float(found.trial.values[0]),
        params=dict(found.trial.params),
        expected=float(found.expected),
        observed=float(found.observed),
        repeats=int(found.repeats),
        best_observed=lucky.number,
        best_observed_value=float(lucky.values[0]),
        best_observed_params=dict(lucky.params),
        reason=found.reason,
        modelled=bool(found.modelled),
    )


def _times(repeats: int) -> str:
    return "once" if repeats == 1 else f"mean of {repeats} runs"


def lines(rec: Recommended, metric: str, *, with_best_observed: bool = True) -> list[str]:
    """A person's lines: one when the recommended trial is the best observed one, else three
    (two without the best observed trial's own line, for a view that shows it already)."""
    observed = f"observed {rec.observed:.4g} ({_times(rec.repeats)})"
    if rec.same:  # the reason says whether a model was fitted (too few configurations: none)
        expects = "" if rec.expected == rec.observed else f", expected {rec.expected:.4g}"
        return [
            f"recommended: trial #{rec.trial}, the best observed too: {metric} {observed}"
            f"{expects} ({rec.reason})"
        ]
    lucky = f"best observed: trial #{rec.best_observed}, {metric} {rec.best_observed_value:.4g}"
    expects = f"{metric} expected {rec.expected:.4g}, " if rec.modelled else f"{metric} "
    return [
        f"recommended: trial #{rec.trial}, {expects}{observed}",
        *([lucky] if with_best_observed else []),
        f"why they differ: {rec.reason}",
    ]


def about(rec: Recommended, study: str) -> str:
    """One line for stderr beside what `best` writes."""
    observed = f"observed {rec.observed:.6g}, {_times(rec.repeats)}"
    head = f"recommended in {study!r}: trial #{rec.trial}, " + (
        f"expected {rec.expected:.6g} ({observed})" if rec.modelled else observed
    )
    if rec.same:
        return head + f"; the best observed too ({rec.reason})"
    return head + f"; best observed: trial #{rec.best_observed}, {rec.best_observed_value:.6g}"


def markdown(rec: Recommended, metric: str) -> str:
    """The study's optuna-dashboard note: the trial to deploy first, its parameters below."""
    out = [f"### Recommended: trial {rec.trial}", ""]
    out += [f"- {line}" for line in lines(rec, metric)]
    out += ["", "Its parameters:", "", "```yaml", params_yaml(rec.params).rstrip("\n"), "```", ""]
    return "\n".join(out)


def front_of(study: Any) -> list[int]:
    """Several objectives: the trials on the front of the model's expected values (by number),
    or [] when the model cannot say."""
    try:
        return sorted(t.number for t in recommend.recommend_front(study))
    except (ValueError, ArithmeticError, RuntimeError) as error:
        logger.warning("no front of expected values: %s", error)
        return []

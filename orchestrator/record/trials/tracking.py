"""MLflow tracking: each finished trial as one MLflow run, under an experiment named after the study.

Optional: `pip install -e ".[mlflow]"` brings MLflow's tracking client (`mlflow-skinny`, without
the server's dependencies). Where trials are logged is `run --mlflow-uri URI`, else
`$MLFLOW_TRACKING_URI`; `run` stores the URI with the study's settings so that workers on other
nodes log to the same place, and a node's own `$MLFLOW_TRACKING_URI` wins over the stored one.

A run holds the trial's parameters, its value per epoch as the metric named after the adapter's
metric (one step per epoch), the final value as `final_<metric>`, `vram_peak_mb` and
`vram_planned_mb` as metrics, the GPU, host, slots, batch bounds, OOM and state as tags, and the
trial's start and end times. A trial is logged once: logging it again finds its run and adds nothing.
"""

from __future__ import annotations

import importlib.util
import logging
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from orchestrator.errors import UserError
from orchestrator.imports import LazyImport
from orchestrator.record.trials import attr_names as names

if TYPE_CHECKING:
    import mlflow
    from optuna.trial import FrozenTrial

    from orchestrator.record.study.spec import StudySpec
else:
    mlflow = LazyImport("mlflow")

logger = logging.getLogger(__name__)

MLFLOW_ENV = "MLFLOW_TRACKING_URI"
OFF = ("", "none", "off")  # `--mlflow-uri none` stops a resumed study's logging
INSTALL_HINT = 'pip install -e ".[mlflow]"'
# Tags that find a trial's run again (so a trial is never logged twice).
STUDY_TAG = "optuna.study_name"
NUMBER_TAG = "optuna.trial_number"
# MLflow run status for each Optuna trial state; a pruned trial was stopped on purpose.
RUN_STATUS = {"COMPLETE": "FINISHED", "PRUNED": "KILLED", "FAIL": "FAILED"}
VRAM_METRICS = (names.VRAM_PEAK_MB, names.VRAM_PLANNED_MB)
TAGGED_ATTRS = (
    names.GPU,
    names.GPU_INDEX,
    names.HOST,
    names.CONCURRENCY,
    names.BATCH_BOUNDS,
    names.OOM,
    names.ERROR,
)
MAX_PARAM_CHARS = 6000  # MLflow's limit on a parameter's value


def mlflow_installed() -> bool:
    return importlib.util.find_spec("mlflow") is not None


def has_password(uri: str) -> bool:
    try:
        return urlsplit(uri).password is not None
    except ValueError:
        return False


def tracking_uri_to_store(flag: str | None) -> str | None:
    """What `run` stores with the study: the flag's URI, else $MLFLOW_TRACKING_URI's; "" switches
    logging off; None leaves what is stored. Checked: MLflow installed, no password in it."""
    from_env = flag is None
    uri = os.environ.get(MLFLOW_ENV) if from_env else flag
    if uri is None:
        return None
    if uri.strip().lower() in OFF:
        return ""
    if has_password(uri):
        if from_env:
            return None  # the environment's URI is used where it is set, never stored
        raise UserError(
            "--mlflow-uri must not hold a password (it is stored with the study, which the "
            f"dashboard shows): set {MLFLOW_ENV} on each node, or MLflow's "
            "MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD"
        )
    where = "$" + MLFLOW_ENV if from_env else "--mlflow-uri"
    if not is_tracking_uri(uri):
        # Else MLflow warns once per trial process and the whole study runs untracked.
        raise UserError(
            f"{where} {uri!r} is not a tracking URI MLflow takes: give a server "
            "(http://HOST:5000), a database (sqlite:///mlflow.db) or databricks"
        )
    if not mlflow_installed():
        raise UserError(f"{where} needs MLflow: {INSTALL_HINT}")
    return uri


# The stores MLflow's tracking client opens; a database's driver may follow a '+'.
TRACKING_SCHEMES = ("http", "https", "file", "sqlite", "postgresql", "mysql", "mssql")


def is_tracking_uri(uri: str) -> bool:
    """Whether MLflow can open `uri` as a tracking store: a scheme it knows, written SCHEME://
    (a bare path is MLflow's file store, which the MLflow we use no longer writes)."""
    text = uri.strip()
    if text == "databricks" or text.startswith(("databricks://", "databricks-uc")):
        return True
    try:
        parts = urlsplit(text)
    except ValueError:
        return False
    return parts.scheme.split("+")[0].lower() in TRACKING_SCHEMES and "://" in text


def tracking_uri_for(stored: str | None, environ: Mapping[str, str] = os.environ) -> str | None:
    """Where a trial process logs: nowhere when switched off, else this node's
    $MLFLOW_TRACKING_URI, else the study's stored URI."""
    if stored is not None and stored.strip().lower() in OFF:
        return None
    return environ.get(MLFLOW_ENV) or stored or None


def tracker_for(spec: StudySpec, study_name: str, *, metric: str) -> TrialTracker | None:
    """The tracker a trial process keeps (make it once per process), or None if not tracking."""
    uri = tracking_uri_for(spec.mlflow_uri)
    if uri is None:
        return None
    if not mlflow_installed():
        logger.warning(
            "MLflow tracking to %s skipped: MLflow is not installed (%s)", uri, INSTALL_HINT
        )
        return None
    return TrialTracker(uri, experiment=study_name, metric=metric)


class TrialTracker:
    """Logs finished trials of one study to an MLflow tracking store (a server, a database, files)."""

    def __init__(self, tracking_uri: str, *, experiment: str, metric: str = "value") -> None:
        self.tracking_uri = tracking_uri
        self.experiment = experiment
        self.metric = metric
        self._mlflow: Any = None  # MlflowClient, opened on first use: a store that is down
        self._experiment_id: str | None = None  # then costs a warning, never the constructor

    @property
    def _client(self) -> Any:
        if self._mlflow is None:
            self._mlflow = mlflow.tracking.MlflowClient(tracking_uri=self.tracking_uri)
        return self._mlflow

    def experiment_id(self) -> str:
        """The study's experiment, made on first use (by whichever process gets there first)."""
        if self._experiment_id is None:
            found = self._client.get_experiment_by_name(self.experiment)
            if found is None:
                try:
                    self._experiment_id = self._client.create_experiment(self.experiment)
                    return self._experiment_id
                except mlflow.exceptions.MlflowException:  # another process made it a moment ago
                    found = self._client.get_experiment_by_name(self.experiment)
                    if found is None:
                        raise
            self._experiment_id = found.experiment_id
        return self._experiment_id

    def find_run(self, trial_number: int) -> str | None:
        runs = self._client.search_runs(
            [self.experiment_id()],
            filter_string=f"tags.`{NUMBER_TAG}` = '{trial_number}'",
            max_results=1,
        )
        return runs[0].info.run_id if runs else None

    def prepare(self) -> bool:
        """Make the store's schema and the study's experiment now, once, before trial processes
        log to it at the same moment (an SQLite store would have them race to create tables).
        Never raises: False and one warning when the store is away."""
        try:
            self.experiment_id()
            return True
        except Exception as error:  # any store error, as in log_trial
            logger.warning("MLflow at %s is not ready: %s", self.tracking_uri, error)
            return False

    def log_trial(self, trial: FrozenTrial) -> str | None:
        """Log one finished trial as a run; its run id. Never raises: tracking that is down must
        not cost a trial, so a failure is one warning and None."""
        try:
            return self._log(trial)
        except Exception as error:  # any store error: MlflowException, OSError, SQLAlchemyError
            logger.warning(
                "trial %d not logged to MLflow at %s: %s", trial.number, self.tracking_uri, error
            )
            return None

    def _log(self, trial: FrozenTrial) -> str:
        existing = self.find_run(trial.number)
        if existing is not None:
            return existing
        run = self._client.create_run(
            self.experiment_id(),
            start_time=_ms(trial.datetime_start),
            tags=run_tags(trial, self.experiment),
            run_name=f"trial {trial.number}",
        )
        run_id = run.info.run_id
        end = _ms(trial.datetime_complete) or _ms(trial.datetime_start)
        stamp = end or 0
        metrics = [
            mlflow.entities.Metric(k, v, stamp, step)
            for k, v, step in run_metrics(trial, self.metric)
        ]
        params = [mlflow.entities.Param(k, v) for k, v in run_params(trial).items()]
        # One batch call takes at most 1000 metrics and 100 parameters.
        for i in range(0, max(len(metrics), len(params), 1), 100):
            self._client.log_batch(run_id, metrics=metrics[i : i + 100], params=params[i : i + 100])
        status = RUN_STATUS.get(trial.state.name, "FAILED")
        self._client.set_terminated(run_id, status=status, end_time=end)
        return run_id


def run_params(trial: FrozenTrial) -> dict[str, str]:
    return {name: str(value)[:MAX_PARAM_CHARS] for name, value in trial.params.items()}


def run_metrics(trial: FrozenTrial, metric: str) -> list[tuple[str, float, int]]:
    """(name, value, step): the value per epoch, the final value, and the VRAM figures."""
    rows = [(metric, float(v), int(step)) for step, v in sorted(trial.intermediate_values.items())]
    if trial.state.name == "COMPLETE" and trial.value is not None:  # a pruned trial's value is
        rows.append((f"final_{metric}", float(trial.value), 0))  # only its last epoch's
    for name in VRAM_METRICS:
        value = trial.user_attrs.get(name)
        if isinstance(value, int | float) and not isinstance(value, bool):
            rows.append((name, float(value), 0))
    return rows


def run_tags(trial: FrozenTrial, study_name: str) -> dict[str, str]:
    tags = {STUDY_TAG: study_name, NUMBER_TAG: str(trial.number), "state": trial.state.name}
    for name in TAGGED_ATTRS:
        if name in trial.user_attrs and trial.user_attrs[name] is not None:
            tags[name] = str(trial.user_attrs[name])[:5000]
    for name, value in trial.user_attrs.items():  # anything else the trial recorded
        if name not in tags and name not in VRAM_METRICS and isinstance(value, str | int | float):
            tags[name] = str(value)[:5000]
    return tags


def _ms(moment: Any) -> int | None:
    return int(moment.timestamp() * 1000) if moment is not None else None

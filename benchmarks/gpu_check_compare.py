"""What `benchmarks/gpu_check.py` decides, as pure functions: readings and records in, checks out.

Nothing here touches a GPU, a process or a database, so every rule is tested on a CPU
(tests/test_gpu_check.py). Times are seconds since the epoch (`time.time()` and
`datetime.timestamp()` on the same machine agree).
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

# Probes agree when totals and free memory differ by at most this share of the total: CUDA keeps
# a few hundred MB out of its total that NVML counts, and free memory moves between two reads.
PROBE_TOLERANCE = 0.01
# A trial's vram_peak_mb against what NVML saw for its process, less the CUDA context.
VRAM_TOLERANCE = 0.05
SIMULATED_OOM = "(simulated)"


@dataclass(frozen=True)
class Check:
    """One thing the GPU check proves. `ok` is None when it cannot be checked on this machine."""

    stage: str
    name: str
    ok: bool | None
    detail: str

    def as_dict(self) -> dict[str, Any]:
        return {"stage": self.stage, "name": self.name, "ok": self.ok, "detail": self.detail}


def verdict(checks: Iterable[Check]) -> bool:
    """True when no check failed (checks that could not run do not fail the run)."""
    return all(check.ok is not False for check in checks)


# --- 0. the command line of the orchestrator ---------------------------------------------

_PART_FORM = re.compile(r"(?<![\w:])(?:\d+|N|INDEX|GPU|I):(?:MB|\d{3,})\b")


def supports_gpu_part(help_text: str) -> bool:
    """Does `run --help` offer a part of a real GPU (`--gpus 0:24576`, `INDEX:MB`)? sim:MB is not."""
    return bool(_PART_FORM.search(help_text.replace("sim:MB", "")))


# --- 1. NVML and torch see the same GPU ---------------------------------------------------


@dataclass(frozen=True)
class GpuReading:
    """One probe's view of one GPU."""

    source: str  # "nvml" or "torch"
    name: str
    uuid: str
    total_mb: float
    free_mb: float


def compare_probes(
    nvml: GpuReading | None, torch: GpuReading | None, *, tolerance: float = PROBE_TOLERANCE
) -> list[Check]:
    """Name, UUID, total and free memory of the first GPU, as NVML and as torch report them."""
    stage = "probe"
    if nvml is None and torch is None:
        return [Check(stage, "NVML and torch agree", True, "both report no GPU")]
    if nvml is None or torch is None:
        seen, blind = ("NVML", "torch") if torch is None else ("torch", "NVML")
        return [Check(stage, "NVML and torch agree", False, f"{seen} sees a GPU, {blind} none")]
    checks = [
        Check(stage, "same name", nvml.name == torch.name, f"{nvml.name!r} / {torch.name!r}"),
        Check(stage, "same UUID", nvml.uuid == torch.uuid, f"{nvml.uuid} / {torch.uuid}"),
    ]
    limit = tolerance * nvml.total_mb
    for what, a, b in (
        ("total", nvml.total_mb, torch.total_mb),
        ("free", nvml.free_mb, torch.free_mb),
    ):
        detail = f"NVML {a:,.0f} MB, torch {b:,.0f} MB (differ by {abs(a - b):,.0f}, at most {limit:,.0f})"
        checks.append(Check(stage, f"same {what} memory", abs(a - b) <= limit, detail))
    return checks


# --- 2. calibration: declared against measured --------------------------------------------

_CALIBRATED = re.compile(r"^calibrated (?P<adapter>\S+) on (?P<gpu>.+?) \((?P<peaks>[^)]*)\)")
_PEAK = re.compile(r"batch (?P<batch>\d+): (?P<mb>[\d,.]+) MB")


def parse_calibrated(text: str) -> dict[str, list[tuple[int, float]]]:
    """`plan --calibrate`'s lines "calibrated tft on GPU (batch 64: 1,234 MB, ...)" as peaks."""
    found: dict[str, list[tuple[int, float]]] = {}
    for line in text.splitlines():
        match = _CALIBRATED.match(line.strip())
        if match:
            found[match["adapter"]] = [
                (int(peak["batch"]), float(peak["mb"].replace(",", "")))
                for peak in _PEAK.finditer(match["peaks"])
            ]
    return found


def planned_mb(model: Mapping[str, float], batch_size: int) -> float:
    return float(model["model_overhead_mb"]) + batch_size * float(model["per_sample_mb"])


def calibration_checks(
    adapter: str,
    *,
    peaks: Sequence[tuple[int, float]],
    measured: Mapping[str, Any] | None,
) -> list[Check]:
    """The plan now uses a measured model, and it covers every peak the calibration measured."""
    stage = "calibrate"
    source = str((measured or {}).get("source", ""))
    used = measured is not None and source.startswith("measured (calibration")
    checks = [Check(stage, f"{adapter}: plan uses the measured model", used, source or "no plan")]
    if not peaks:
        checks.append(Check(stage, f"{adapter}: peaks measured", False, "no 'calibrated' line"))
        return checks
    if measured is None:
        return checks
    short = [
        f"batch {batch}: {peak:,.0f} MB > {planned_mb(measured, batch):,.0f}"
        for batch, peak in peaks
        if planned_mb(measured, batch) < peak - 0.5
    ]
    detail = "; ".join(short) or ", ".join(f"batch {b}: {p:,.0f} MB" for b, p in peaks)
    checks.append(Check(stage, f"{adapter}: the model covers its peaks", not short, detail))
    return checks


# --- 3. the study: OOMs caught and re-run, no trial lost, the budget exact -----------------


@dataclass(frozen=True)
class TrialRecord:
    """What the check needs of one trial, from Optuna's storage."""

    number: int
    state: str  # COMPLETE, PRUNED, FAIL, RUNNING, WAITING
    start: float | None  # datetime_start as seconds since the epoch
    end: float | None  # datetime_complete
    user_attrs: Mapping[str, Any] = field(default_factory=dict)
    params: Mapping[str, Any] = field(default_factory=dict)
    retry_history: tuple[int, ...] = ()  # the failed trials this one re-runs, first to last

    @property
    def pid(self) -> int | None:
        value = self.user_attrs.get("pid")
        return int(value) if value is not None else None

    @property
    def oom(self) -> bool:
        return bool(self.user_attrs.get("oom"))

    @property
    def error(self) -> str:
        return str(self.user_attrs.get("error") or "")

    @property
    def vram_peak_mb(self) -> float | None:
        value = self.user_attrs.get("vram_peak_mb")
        return float(value) if value is not None else None

    @property
    def batch_size(self) -> int | None:
        value = self.params.get("batch_size")
        return int(value) if value is not None else None


@dataclass(frozen=True)
class StudyFacts:
    """A finished study as the check sees it: its trials, budget and the pool's decisions."""

    trials: Sequence[TrialRecord]
    budget: int
    counted: int  # orchestrator.record.study.spec.count_trials(...).counted
    max_retries: int
    run_exit: int
    event_reasons: Sequence[tuple[str, str]]  # (reason, detail) of orch_concurrency_events
    real_gpu: bool


def lost_trials(trials: Sequence[TrialRecord]) -> list[str]:
    """Trials that ended in a way the pool should never leave: still running or waiting, or
    failed by anything but a caught out-of-memory error (a crash, a killed process)."""
    lost = []
    for trial in trials:
        if trial.state in ("RUNNING", "WAITING"):
            lost.append(f"#{trial.number} {trial.state}")
        elif trial.state == "FAIL" and not trial.oom:
            lost.append(f"#{trial.number} FAIL: {trial.error[:120] or 'no error recorded'}")
    return lost


def reruns_of_ooms(trials: Sequence[TrialRecord]) -> list[TrialRecord]:
    """Trials that re-run an out-of-memory trial's parameters and have finished."""
    oom_numbers = {trial.number for trial in trials if trial.oom}
    return [
        trial
        for trial in trials
        if trial.retry_history
        and trial.retry_history[-1] in oom_numbers
        and trial.state in ("COMPLETE", "PRUNED", "FAIL")
    ]


def reactions_to_oom(event_reasons: Sequence[tuple[str, str]]) -> int:
    """Changes of the pool that answer an out-of-memory error (halving, degrading, re-admitting)."""
    return sum(
        1
        for reason, detail in event_reasons
        if reason in ("oom", "degrade") or "out of memory" in (detail or "")
    )


def study_checks(facts: StudyFacts) -> list[Check]:
    stage = "study"
    ooms = [trial for trial in facts.trials if trial.oom]
    real = [trial for trial in ooms if SIMULATED_OOM not in trial.error]
    kind = "real CUDA" if facts.real_gpu else "simulated"
    wanted = real if facts.real_gpu else ooms
    lost = lost_trials(facts.trials)
    reruns = reruns_of_ooms(facts.trials)
    reactions = reactions_to_oom(facts.event_reasons)
    return [
        Check(stage, "run finished", facts.run_exit == 0, f"exit status {facts.run_exit}"),
        Check(
            stage,
            f"{kind} OOMs happened and were caught",
            bool(wanted) and all("out of memory" in t.error for t in ooms),
            f"{len(ooms)} trial(s) out of memory, {len(real)} of them from CUDA",
        ),
        Check(stage, "the pool reacted to OOMs", reactions > 0, f"{reactions} slot change(s)"),
        Check(stage, "OOM'd trials were re-run", bool(reruns), f"{len(reruns)} re-run(s)"),
        Check(stage, "no trial lost", not lost, "; ".join(lost[:5]) or "none lost"),
        Check(
            stage,
            "budget exact",
            facts.counted == facts.budget,
            f"{facts.counted} counted of a budget of {facts.budget}",
        ),
    ]


def max_overlap(intervals: Iterable[tuple[float, float]]) -> int:
    """The most intervals that hold one moment in common (an end and a start at the same
    moment do not overlap: the one ended first)."""
    points = []
    for start, end in intervals:
        points.append((start, 1))
        points.append((end, -1))
    points.sort(key=lambda point: (point[0], point[1]))
    best = current = 0
    for _, step in points:
        current += step
        best = max(best, current)
    return best


def trials_at_once(trials: Sequence[TrialRecord]) -> int:
    """The most trials that ran at the same moment, from their start and end times."""
    return max_overlap(
        (trial.start, trial.end)
        for trial in trials
        if trial.start is not None and trial.end is not None
    )


# --- 4. VRAM: each trial's record against what NVML saw for its process --------------------


@dataclass(frozen=True)
class Sample:
    """One NVML reading of one process's memory on the GPU."""

    at: float
    pid: int
    used_mb: float


def nvml_peaks(trials: Sequence[TrialRecord], samples: Sequence[Sample]) -> dict[int, float]:
    """Trial number -> the most NVML saw its process hold between the trial's start and end.

    Matched by pid and by the trial's time window, so a process that runs several trials in turn
    gives each trial only the readings of its own time."""
    by_pid: dict[int, list[Sample]] = {}
    for sample in samples:
        by_pid.setdefault(sample.pid, []).append(sample)
    peaks = {}
    for trial in trials:
        if trial.pid is None or trial.start is None or trial.end is None:
            continue
        seen = [s.used_mb for s in by_pid.get(trial.pid, ()) if trial.start <= s.at <= trial.end]
        if seen:
            peaks[trial.number] = max(seen)
    return peaks


def pids_by_time(trials: Sequence[TrialRecord], samples: Sequence[Sample]) -> dict[int, int]:
    """Trial number -> pid, guessed from time alone where NVML's pids are not the trials' own
    (a GPU process seen inside a container has the host's pid): each trial takes the process
    first seen closest to its start that lived through its window and no earlier trial took."""
    spans: dict[int, tuple[float, float]] = {}
    for sample in samples:
        first, last = spans.get(sample.pid, (sample.at, sample.at))
        spans[sample.pid] = (min(first, sample.at), max(last, sample.at))
    taken: set[int] = set()
    guessed = {}
    timed = [t for t in trials if t.start is not None and t.end is not None]
    for trial in sorted(timed, key=lambda t: t.start or 0.0):
        candidates = [
            (abs(first - trial.start), pid)
            for pid, (first, last) in spans.items()
            if pid not in taken and first <= trial.end and last >= trial.start
        ]
        if candidates:
            pid = min(candidates)[1]
            taken.add(pid)
            guessed[trial.number] = pid
    return guessed


def most_at_once(samples: Sequence[Sample], pids: set[int]) -> int:
    """The most of `pids` that one NVML reading (one moment) saw on the GPU together."""
    by_time: dict[float, set[int]] = {}
    for sample in samples:
        if sample.pid in pids:
            by_time.setdefault(sample.at, set()).add(sample.pid)
    return max((len(seen) for seen in by_time.values()), default=0)


@dataclass(frozen=True)
class VramComparison:
    trial: int
    batch_size: int | None
    vram_peak_mb: float
    nvml_peak_mb: float
    context_mb: float

    @property
    def error(self) -> float:
        """(NVML's peak less the CUDA context, minus the recorded peak) / the recorded peak."""
        return (self.nvml_peak_mb - self.context_mb - self.vram_peak_mb) / self.vram_peak_mb

    def as_dict(self) -> dict[str, Any]:
        return {
            "trial": self.trial,
            "batch_size": self.batch_size,
            "vram_peak_mb": self.vram_peak_mb,
            "nvml_peak_mb": round(self.nvml_peak_mb, 1),
            "context_mb": round(self.context_mb, 1),
            "error": round(self.error, 4),
        }


def compare_vram(
    trials: Sequence[TrialRecord], peaks: Mapping[int, float], context_mb: float
) -> list[VramComparison]:
    """Every trial that ran to its end (or was pruned) with a recorded peak and NVML readings.

    Out-of-memory trials are left out: after the error the trial process empties its cache, so
    its record and NVML's readings describe different moments."""
    return [
        VramComparison(
            trial.number, trial.batch_size, trial.vram_peak_mb, peaks[trial.number], context_mb
        )
        for trial in trials
        if trial.state in ("COMPLETE", "PRUNED") and trial.vram_peak_mb and trial.number in peaks
    ]


def vram_checks(
    trials: Sequence[TrialRecord],
    comparisons: Sequence[VramComparison],
    *,
    tolerance: float = VRAM_TOLERANCE,
    nvml_note: str = "",
) -> list[Check]:
    stage = "vram"
    measured = [t for t in trials if t.state in ("COMPLETE", "PRUNED") and t.vram_peak_mb]
    if not comparisons:
        return [Check(stage, "vram_peak_mb matches NVML", False, nvml_note or "no NVML readings")]
    worst = max(comparisons, key=lambda c: abs(c.error))
    unmatched = sorted({t.number for t in measured} - {c.trial for c in comparisons})
    return [
        Check(
            stage,
            f"vram_peak_mb matches NVML within {tolerance:.0%}",
            abs(worst.error) <= tolerance,
            f"{len(comparisons)} trials, worst {worst.error:+.1%} (trial #{worst.trial}), "
            f"median {statistics.median(c.error for c in comparisons):+.1%}",
        ),
        Check(
            stage,
            "NVML saw every measured trial",
            not unmatched,
            ", ".join(f"#{n}" for n in unmatched[:10]) or f"all {len(measured)}",
        ),
    ]


# --- 4b. the dashboard shows the numbers ---------------------------------------------------

DASHBOARD_KEYS = ("vram_peak_mb", "vram_planned_mb", "gpu", "gpu_index", "oom")


def dashboard_mismatches(
    shown: Mapping[int, Mapping[str, str]], rows: Sequence[Mapping[str, Any]]
) -> list[str]:
    """Where the dashboard's user attributes (strings, by trial number) differ from the rows
    the trials wrote to orch_trial_vram."""
    problems = []
    for row in rows:
        number = int(row["trial_number"])
        attrs = shown.get(number)
        if attrs is None:
            problems.append(f"#{number} not on the dashboard")
            continue
        missing = [key for key in DASHBOARD_KEYS if key not in attrs]
        if row.get("vram_peak_mb") is None:
            missing = [key for key in missing if key != "vram_peak_mb"]
        if row.get("vram_planned_mb") is None:
            missing = [key for key in missing if key != "vram_planned_mb"]
        if missing:
            problems.append(f"#{number} lacks {', '.join(missing)}")
            continue
        for key in ("vram_peak_mb", "vram_planned_mb"):
            if row.get(key) is not None and abs(float(attrs[key]) - float(row[key])) > 0.051:
                problems.append(
                    f"#{number} {key} {attrs[key]} on the dashboard, {row[key]:.1f} stored"
                )
        if attrs["gpu"] != row["gpu_name"]:
            problems.append(f"#{number} gpu {attrs['gpu']!r}, stored {row['gpu_name']!r}")
    return problems


def dashboard_checks(
    shown: Mapping[int, Mapping[str, str]] | None, rows, note: str = ""
) -> list[Check]:
    stage = "dashboard"
    if shown is None:
        return [Check(stage, "trial attributes hold the numbers", None, note)]
    problems = dashboard_mismatches(shown, rows)
    detail = "; ".join(problems[:5]) or f"{len(rows)} trials, {', '.join(DASHBOARD_KEYS)} as stored"
    return [Check(stage, "trial attributes hold the numbers", bool(rows) and not problems, detail)]


# --- 5. the gpu-marked tests ------------------------------------------------------------------

_PYTEST_COUNT = re.compile(r"(\d+) (passed|failed|skipped|deselected|errors?|xfailed|xpassed)")


def parse_pytest_summary(text: str) -> dict[str, int]:
    """The counts of pytest's last summary line ("3 passed, 580 deselected in 41.20s")."""
    lines = [
        line
        for line in text.splitlines()
        if re.search(r"\d+ (passed|failed|skipped|deselected|errors?)", line)
    ]
    if not lines:
        return {}
    counts: dict[str, int] = {}
    for number, word in _PYTEST_COUNT.findall(lines[-1]):
        counts["error" if word.startswith("error") else word] = int(number)
    return counts


def gpu_test_checks(counts: Mapping[str, int], exit_code: int) -> list[Check]:
    """On a GPU every gpu-marked test must run and pass: a skip means it did not see CUDA."""
    passed = counts.get("passed", 0)
    bad = counts.get("failed", 0) + counts.get("error", 0) + counts.get("skipped", 0)
    detail = ", ".join(f"{n} {word}" for word, n in counts.items()) or f"exit status {exit_code}"
    return [
        Check("tests", "gpu-marked tests pass", exit_code == 0 and passed > 0 and not bad, detail)
    ]


def count_collected(text: str) -> int:
    """Tests `pytest --collect-only -q` listed (one `path::name` line each)."""
    return sum(1 for line in text.splitlines() if "::" in line)


def oom_predictions(
    trials: Sequence[TrialRecord], model: Mapping[str, float], part_mb: float, margin: float = 0.1
) -> dict[str, int]:
    """How the calibrated model's verdicts compare with what happened: of the trials whose
    batch needs more than the part (by `margin`), how many ran out of memory, and of those that
    need clearly less, how many did (those ran out because the GPU itself was full)."""
    counts = dict.fromkeys(("over", "over_oom", "under", "under_oom"), 0)
    for trial in trials:
        if trial.batch_size is None or trial.state not in ("COMPLETE", "PRUNED", "FAIL"):
            continue
        need = planned_mb(model, trial.batch_size)
        side = (
            "over"
            if need > part_mb * (1 + margin)
            else "under"
            if need < part_mb * (1 - margin)
            else ""
        )
        if side:
            counts[side] += 1
            counts[f"{side}_oom"] += int(trial.oom)
    return counts

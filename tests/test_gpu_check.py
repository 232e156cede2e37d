"""benchmarks/gpu_check.py: its decisions as tables of cases, and the script itself as a process.

Where there is no GPU the script runs its CPU-side checks and exits 0; `--simulate` runs the study
step on a simulated GPU, so the whole path from `run` to the storage, the dashboard's API and the
results file is exercised here too. What needs a real GPU is marked in docs/gpu.md.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import optuna
import pytest

from adapters.base import memory_model_of, parse_options
from benchmarks import gpu_check_adapter, gpu_check_report
from benchmarks.gpu_check_compare import (
    Check,
    GpuReading,
    Sample,
    StudyFacts,
    TrialRecord,
    calibration_checks,
    compare_probes,
    compare_vram,
    count_collected,
    dashboard_checks,
    dashboard_mismatches,
    gpu_test_checks,
    lost_trials,
    max_overlap,
    most_at_once,
    nvml_peaks,
    oom_predictions,
    parse_calibrated,
    parse_pytest_summary,
    pids_by_time,
    study_checks,
    supports_gpu_part,
    verdict,
    vram_checks,
)
from tests.cli_helpers import cli_env, run_cli

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"


def run_script(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    env = cli_env(PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    env.pop("OUT", None)
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=timeout,
        env=env,
    )


# --- the orchestrator's --gpus forms -----------------------------------------------------


def test_todays_run_help_offers_a_part_of_a_gpu() -> None:
    # `--gpus 0:MB` is offered, so the GPU check exercises it on a real GPU.
    helped = run_cli("run", "--help")
    assert helped.returncode == 0
    assert "sim:MB" in helped.stdout
    assert supports_gpu_part(helped.stdout)


@pytest.mark.parametrize(
    ("text", "offered"),
    [
        ("--gpus SPEC  auto, none, 0,2, sim:MB[,sim:MB...], or 0:MB (at most MB of GPU 0)", True),
        ("e.g. --gpus 0:24576 to use 24 GB of GPU 0", True),
        ("--gpus INDEX:MB", True),
        ("simulated devices sim:MB[,sim:MB...]", False),
        ("indices such as 0,2", False),
        ("at 12:30 the run", False),
    ],
)
def test_a_part_of_a_gpu_is_recognised_in_help_text(text: str, offered: bool) -> None:
    assert supports_gpu_part(text) is offered


# --- 1. probes -----------------------------------------------------------------------------

H200 = GpuReading("nvml", "NVIDIA H200", "GPU-1234", 143771.0, 143000.0)


def by_torch(**changes: object) -> GpuReading:
    fields = {"source": "torch", "name": "NVIDIA H200", "uuid": "GPU-1234"}
    fields |= {"total_mb": 143150.0, "free_mb": 142400.0} | changes
    return GpuReading(**fields)  # type: ignore[arg-type]


def test_probes_that_agree_pass_every_check() -> None:
    checks = compare_probes(H200, by_torch())
    assert [c.name for c in checks] == [
        "same name",
        "same UUID",
        "same total memory",
        "same free memory",
    ]
    assert all(c.ok for c in checks)


@pytest.mark.parametrize(
    ("changes", "failing"),
    [
        ({"name": "NVIDIA H100"}, "same name"),
        ({"uuid": "GPU-9999"}, "same UUID"),
        ({"total_mb": 143771.0 * 0.98}, "same total memory"),
        ({"free_mb": 120000.0}, "same free memory"),
    ],
)
def test_probes_that_disagree_fail_the_check_that_differs(changes, failing: str) -> None:
    checks = compare_probes(H200, by_torch(**changes))
    assert [c.name for c in checks if not c.ok] == [failing]


def test_one_probe_blind_fails_and_both_blind_is_no_gpu() -> None:
    assert compare_probes(H200, None)[0].ok is False
    assert "NVML sees a GPU, torch none" in compare_probes(H200, None)[0].detail
    assert compare_probes(None, None) == [
        Check("probe", "NVML and torch agree", True, "both report no GPU")
    ]


# --- 2. calibration ----------------------------------------------------------------------


def calibrated_line(adapter: str, gpu: str, peaks: list[tuple[int, float]]) -> str:
    """The line `plan --calibrate` prints (orchestrator/commands/plan.py), built the same way."""
    shown = ", ".join(f"batch {batch}: {mb:,.0f} MB" for batch, mb in peaks)
    return f"calibrated {adapter} on {gpu} ({shown}); stored in sqlite:///calibrate.db"


def test_calibrated_lines_give_each_adapters_peaks() -> None:
    text = "\n".join(
        [
            calibrated_line("tft", "NVIDIA H200", [(64, 1534.0), (4096, 81234.0)]),
            "plan for tft: swarm of 20; supervised is GPU-bound",
            calibrated_line("dqn", "NVIDIA H200", [(64, 312.0), (2048, 330.0)]),
        ]
    )
    assert parse_calibrated(text) == {
        "tft": [(64, 1534.0), (4096, 81234.0)],
        "dqn": [(64, 312.0), (2048, 330.0)],
    }
    assert parse_calibrated("no GPU found (--gpus none)") == {}


def test_a_measured_model_must_be_used_and_cover_its_peaks() -> None:
    peaks = [(64, 1534.0), (4096, 81234.0)]
    good = {
        "model_overhead_mb": 300.0,
        "per_sample_mb": 19.8,
        "source": "measured (calibration, 2 samples)",
    }
    assert all(c.ok for c in calibration_checks("tft", peaks=peaks, measured=good))
    low = {**good, "per_sample_mb": 10.0}
    assert [c.ok for c in calibration_checks("tft", peaks=peaks, measured=low)] == [True, False]
    declared = {**good, "source": "declared"}
    assert calibration_checks("tft", peaks=peaks, measured=declared)[0].ok is False
    assert calibration_checks("tft", peaks=[], measured=good)[1].ok is False


# --- 3. the study --------------------------------------------------------------------------

CUDA_OOM = "out of memory: CUDA out of memory. Tried to allocate 2.00 GiB."


def trial(number: int, state: str = "COMPLETE", **attrs: object) -> TrialRecord:
    retry = attrs.pop("retry_history", ())
    batch = attrs.pop("batch_size", 256)
    start = float(attrs.pop("start", 100 + 10 * number))
    end = attrs.pop("end", start + 8)
    return TrialRecord(
        number=number,
        state=state,
        start=start,
        end=None if end is None else float(end),  # type: ignore[arg-type]
        user_attrs={"oom": False, "vram_peak_mb": 2000.0, "pid": 1000 + number, **attrs},
        params={"batch_size": batch},
        retry_history=tuple(retry),  # type: ignore[arg-type]
    )


def facts(trials: list[TrialRecord], **changes: object) -> StudyFacts:
    fields = {
        "trials": trials,
        "budget": 3,
        "counted": 3,
        "max_retries": 2,
        "run_exit": 0,
        "event_reasons": [("start", "plan allows 8"), ("oom", "trial 1 ran out of memory")],
        "real_gpu": True,
    } | changes
    return StudyFacts(**fields)  # type: ignore[arg-type]


GOOD_STUDY = [
    trial(0),
    trial(1, "FAIL", oom=True, error=CUDA_OOM, batch_size=4096),
    trial(2, retry_history=[1], batch_size=2048),
    trial(3, "PRUNED"),
]


def test_a_study_whose_ooms_were_caught_and_re_run_passes() -> None:
    checks = study_checks(facts(GOOD_STUDY))
    assert [(c.name, c.ok) for c in checks] == [
        ("run finished", True),
        ("real CUDA OOMs happened and were caught", True),
        ("the pool reacted to OOMs", True),
        ("OOM'd trials were re-run", True),
        ("no trial lost", True),
        ("budget exact", True),
    ]


@pytest.mark.parametrize(
    ("trials", "changes", "failing"),
    [
        (GOOD_STUDY, {"run_exit": 1}, "run finished"),
        (
            [trial(0), trial(2)],
            {},
            "real CUDA OOMs happened and were caught|OOM'd trials were re-run",
        ),
        (
            [
                trial(0),
                trial(1, "FAIL", oom=True, error="out of memory: (simulated) 1 MB"),
                trial(2, retry_history=[1]),
            ],
            {},
            "real CUDA OOMs happened and were caught",
        ),
        (
            GOOD_STUDY,
            {"event_reasons": [("start", ""), ("rampup", "")]},
            "the pool reacted to OOMs",
        ),
        (GOOD_STUDY[:2] + GOOD_STUDY[3:], {}, "OOM'd trials were re-run"),
        (GOOD_STUDY + [trial(4, "RUNNING", end=None)], {}, "no trial lost"),
        (
            GOOD_STUDY + [trial(5, "FAIL", error="trial process exited with code -9")],
            {},
            "no trial lost",
        ),
        (GOOD_STUDY, {"counted": 2}, "budget exact"),
    ],
)
def test_a_study_check_fails_on_what_went_wrong(trials, changes, failing: str) -> None:
    checks = study_checks(facts(trials, **changes))
    assert [c.name for c in checks if not c.ok] == failing.split("|")


def test_simulated_ooms_count_on_a_simulated_gpu() -> None:
    simulated = [
        trial(0),
        trial(1, "FAIL", oom=True, error="out of memory: CUDA out of memory (simulated)"),
        trial(2, retry_history=[1]),
    ]
    assert verdict(study_checks(facts(simulated, real_gpu=False)))


def test_lost_trials_name_the_trial_and_why() -> None:
    lost = lost_trials([trial(0, "WAITING", end=None), trial(1, "FAIL", error="KeyError: 'x'")])
    assert lost == ["#0 WAITING", "#1 FAIL: KeyError: 'x'"]


@pytest.mark.parametrize(
    ("intervals", "most"),
    [
        ([], 0),
        ([(0, 10)], 1),
        ([(0, 10), (5, 15), (9, 20)], 3),
        ([(0, 10), (10, 20), (20, 30)], 1),  # one ends as the next starts: never two at once
        ([(0, 100), (1, 2), (3, 4), (5, 6)], 2),
    ],
)
def test_most_intervals_at_once(intervals, most: int) -> None:
    assert max_overlap(intervals) == most


# --- 4. VRAM against NVML ------------------------------------------------------------------


def test_nvml_peaks_match_by_pid_and_by_the_trials_time() -> None:
    # One long-lived process (pid 7) runs trial 0 and then trial 1; trial 2 has its own process.
    trials = [
        trial(0, pid=7, start=0, end=10),
        trial(1, pid=7, start=10.5, end=20),
        trial(2, pid=8, start=0, end=20),
    ]
    samples = [
        Sample(1, 7, 900.0),
        Sample(5, 7, 3000.0),
        Sample(12, 7, 3100.0),  # still cached from trial 0, then trial 1's own peak
        Sample(15, 7, 5200.0),
        Sample(25, 7, 9999.0),  # after trial 1 ended: nobody's
        Sample(3, 8, 1500.0),
        Sample(4, 9, 7777.0),  # another process on the GPU
    ]
    assert nvml_peaks(trials, samples) == {0: 3000.0, 1: 5200.0, 2: 1500.0}
    assert most_at_once(samples, {7, 8}) == 1
    assert most_at_once([Sample(1, 7, 1.0), Sample(1, 8, 1.0), Sample(1, 9, 1.0)], {7, 8}) == 2


def test_pids_are_guessed_by_time_where_nvml_has_other_pids() -> None:
    trials = [trial(0, pid=1, start=0, end=10), trial(1, pid=2, start=2, end=12)]
    samples = [Sample(0.5, 501, 800.0), Sample(9, 501, 2000.0), Sample(2.4, 502, 700.0)]
    samples.append(Sample(11, 502, 2500.0))
    assert pids_by_time(trials, samples) == {0: 501, 1: 502}


def test_vram_error_is_nvml_less_the_context_against_the_record() -> None:
    trials = [trial(0, vram_peak_mb=10000.0), trial(1, vram_peak_mb=2000.0, batch_size=64)]
    trials.append(trial(2, "FAIL", oom=True, error=CUDA_OOM, vram_peak_mb=24000.0))
    peaks = {0: 10500.0, 1: 2520.0, 2: 9000.0}
    comparisons = compare_vram(trials, peaks, context_mb=500.0)
    assert [c.trial for c in comparisons] == [0, 1]  # the OOM'd trial is left out
    assert [round(c.error, 4) for c in comparisons] == [0.0, 0.01]
    checks = vram_checks(trials, comparisons)
    assert all(c.ok for c in checks)
    assert "worst +1.0% (trial #1)" in checks[0].detail

    off = compare_vram(trials, {0: 11100.0, 1: 2520.0}, context_mb=500.0)
    assert vram_checks(trials, off)[0].ok is False  # +6%
    unseen = compare_vram(trials, {0: 10500.0}, context_mb=500.0)
    assert [c.ok for c in vram_checks(trials, unseen)] == [True, False]
    assert vram_checks(trials, [], nvml_note="NVML lists no processes")[0].detail == (
        "NVML lists no processes"
    )


def test_oom_predictions_count_both_sides_of_the_part() -> None:
    model = {"model_overhead_mb": 1000.0, "per_sample_mb": 20.0}  # batch 1180: 24,600 MB
    trials = [
        trial(0, batch_size=2048, oom=True, state="FAIL"),
        trial(1, batch_size=4096, oom=True, state="FAIL"),
        trial(2, batch_size=256),
        trial(3, batch_size=128, oom=True, state="FAIL"),
        trial(4, batch_size=1180),  # within the margin: no verdict
    ]
    assert oom_predictions(trials, model, 24576) == {
        "over": 2,
        "over_oom": 2,
        "under": 2,
        "under_oom": 1,
    }


# --- 4b. the dashboard ---------------------------------------------------------------------

ROW = {
    "trial_number": 0,
    "vram_peak_mb": 2048.4,
    "vram_planned_mb": 204.8,
    "gpu_name": "NVIDIA H200",
}
SHOWN = {"vram_peak_mb": "2048.4", "vram_planned_mb": "204.8", "gpu": "NVIDIA H200"}
SHOWN |= {"gpu_index": "0", "oom": "False"}


def test_dashboard_attributes_that_match_the_records_pass() -> None:
    assert dashboard_mismatches({0: SHOWN}, [ROW]) == []
    assert dashboard_checks({0: SHOWN}, [ROW])[0].ok is True
    assert dashboard_checks(None, [ROW], "optuna-dashboard is not installed")[0].ok is None


@pytest.mark.parametrize(
    ("shown", "problem"),
    [
        ({}, "#0 not on the dashboard"),
        ({0: {k: v for k, v in SHOWN.items() if k != "vram_peak_mb"}}, "#0 lacks vram_peak_mb"),
        ({0: SHOWN | {"vram_peak_mb": "2100.0"}}, "#0 vram_peak_mb 2100.0 on the dashboard"),
        ({0: SHOWN | {"gpu": "cpu"}}, "#0 gpu 'cpu'"),
    ],
)
def test_dashboard_mismatches_say_what_differs(shown, problem: str) -> None:
    found = dashboard_mismatches(shown, [ROW])
    assert len(found) == 1 and found[0].startswith(problem)


def test_an_oom_trial_without_a_peak_needs_no_peak_on_the_dashboard() -> None:
    row = ROW | {"vram_peak_mb": None}
    shown = {k: v for k, v in SHOWN.items() if k != "vram_peak_mb"}
    assert dashboard_mismatches({0: shown}, [row]) == []


# --- 5. the gpu-marked tests ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("output", "counts", "ok"),
    [
        ("...\n3 passed, 580 deselected in 41.20s\n", {"passed": 3, "deselected": 580}, True),
        (
            "2 passed, 1 skipped, 580 deselected in 9s",
            {"passed": 2, "skipped": 1, "deselected": 580},
            False,
        ),
        ("1 failed, 2 passed in 3.1s", {"failed": 1, "passed": 2}, False),
        ("1 error in 0.5s", {"error": 1}, False),
        ("ImportError while loading conftest", {}, False),
    ],
)
def test_gpu_tests_pass_only_when_all_ran_and_passed(output: str, counts, ok: bool) -> None:
    assert parse_pytest_summary(output) == counts
    assert gpu_test_checks(counts, 0 if ok else 1)[0].ok is ok


def test_collected_tests_are_counted() -> None:
    text = "tests/test_gpu.py::test_real_gpu_probes_agree\ntests/test_a.py::test_b\n\n2 tests collected"
    assert count_collected(text) == 2


# --- 6. the results and the docs page ----------------------------------------------------

RESULTS = {
    "command": "PYTHONPATH=. python benchmarks/gpu_check.py",
    "started_at": "2026-12-01 10:00 UTC",
    "seconds": 312.4,
    "mode": "24,576 MB per trial process (memory fraction)",
    "gpu": {"name": "NVIDIA H200", "total_mb": 143771.0},
    "study": {"planned_at_once": 8, "achieved_at_once": 7, "ooms": 5, "cuda_ooms": 5, "reruns": 4},
    "vram": {"compared": 17, "worst_error": 0.021, "median_error": 0.004},
    "calibration": {
        "tft": {
            "options": ["max_width=512"],
            "declared": {"model_overhead_mb": 678.5, "per_sample_mb": 63.15},
            "measured": {"model_overhead_mb": 312.0, "per_sample_mb": 19.8},
            "peaks": [[64, 1579.0], [4096, 81412.0]],
        }
    },
    "checks": [
        {"stage": "probe", "name": "same name", "ok": True, "detail": "'NVIDIA H200'"},
        {"stage": "dashboard", "name": "attrs", "ok": None, "detail": "not installed"},
    ],
}


def test_the_summary_table_has_one_row_with_the_numbers() -> None:
    header, rule, row = gpu_check_report.summary_table(RESULTS)
    assert header.startswith("| GPU | limit | planned at once | achieved at once | OOMs |")
    assert rule.count("---") == 8
    assert row == (
        "| NVIDIA H200 (143,771 MB) | 24,576 MB per trial process (memory fraction) | 8 | 7 "
        "| 5 (5 from CUDA), 4 re-run | +2.1% worst, +0.4% median (17 trials) | 312 "
        "| 1 of 1 passed, 1 not applicable |"
    )


def test_the_docs_section_replaces_only_what_is_between_its_markers() -> None:
    page = (
        "# The GPU check\n\nintro\n\n" + gpu_check_report.docs_section({}) + "\n\n## After\nkept\n"
    )
    updated = gpu_check_report.replace_section(page, gpu_check_report.docs_section(RESULTS))
    assert updated.startswith("# The GPU check\n\nintro\n\n")
    assert updated.endswith("\n\n## After\nkept\n")
    assert "| tft | max_width=512 | 678 MB + 63.15 MB/sample | 312 MB + 19.8 MB/sample |" in updated
    assert updated.count(gpu_check_report.START) == 1
    again = gpu_check_report.replace_section(updated, gpu_check_report.docs_section(RESULTS))
    assert again == updated
    appended = gpu_check_report.replace_section(
        "# A page\n", gpu_check_report.docs_section(RESULTS)
    )
    assert appended.startswith("# A page\n\n" + gpu_check_report.START)


def test_check_lines_are_aligned_and_say_pass_fail_or_na() -> None:
    lines = gpu_check_report.check_lines(RESULTS["checks"])
    assert lines[0].split()[:4] == ["probe", "same", "name", "pass"]
    assert "n/a" in lines[1]
    assert lines[0].index("pass") == lines[1].index("n/a")


# --- the check's own adapter ---------------------------------------------------------------

SMALL = ["max_width=32", "max_window=24", "max_depth=2", "steps=400"]


def test_the_checks_model_is_tfts_times_the_undersize_factor() -> None:
    from adapters import tft as supervised

    adapter = gpu_check_adapter.adapter
    options = parse_options(adapter, [*SMALL, "undersize=0.25"])
    tft = memory_model_of(supervised.adapter, parse_options(supervised.adapter, SMALL))
    model = memory_model_of(adapter, options)
    assert model.model_overhead_mb == pytest.approx(tft.model_overhead_mb * 0.25)
    assert model.per_sample_mb == pytest.approx(tft.per_sample_mb * 0.25)


@pytest.mark.parametrize(
    ("part_mb", "total_bytes", "fraction"),
    [(0, 80 * 2**30, None), (24576, 96 * 2**30, 0.25), (24576, 16 * 2**30, 1.0)],
)
def test_the_part_of_the_gpu_as_a_fraction(part_mb, total_bytes, fraction) -> None:
    assert gpu_check_adapter.memory_fraction(part_mb, total_bytes) == fraction


def test_suggest_keeps_the_largest_model_and_searches_the_rest() -> None:
    adapter = gpu_check_adapter.adapter
    options = parse_options(adapter, SMALL)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    trial = study.ask()
    params = adapter.suggest(trial, options)
    assert (params["width"], params["window"], params["depth"]) == (32, 24, 2)
    assert set(trial.params) == {"learning_rate", "batch_size", "dropout", "weight_decay"}
    value = adapter.train(
        params | {"batch_size": 64},
        epochs=1,
        device=__import__("torch").device("cpu"),
        options=options,
        report=lambda epoch, value: None,
    )
    assert value == value and value < float("inf")  # a finite validation loss


@pytest.mark.parametrize(
    ("option", "words"), [("undersize=0", "undersize must be"), ("part_mb=-1", "part_mb must be")]
)
def test_bad_options_of_the_checks_adapter_are_one_line(option: str, words: str, tmp_path) -> None:
    db = tmp_path / "study.db"
    done = run_cli(
        "run", "--adapter-path", gpu_check_adapter.__name__ + ":adapter", "--gpus", "none",
        "--trials", "1", "--storage", f"sqlite:///{db}", "--option", option,
        env=cli_env(PYTHONPATH=str(ROOT)),
    )  # fmt: skip
    assert done.returncode == 2
    assert words in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert not db.exists()


# --- the script as a process ---------------------------------------------------------------


def test_without_a_gpu_it_says_so_runs_the_cpu_checks_and_exits_0(tmp_path) -> None:
    done = run_script(
        "--work-dir",
        str(tmp_path / "work"),
        "--results",
        str(tmp_path / "gpu.json"),
        "--docs",
        str(tmp_path / "gpu.md"),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    said = [line for line in done.stdout.splitlines() if "no GPU here" in line]
    assert len(said) == 1
    results = json.loads((tmp_path / "gpu.json").read_text())
    assert results["passed"] is True and results["mode"] == "CPU-side checks only"
    names = {(c["stage"], c["name"]): c["ok"] for c in results["checks"]}
    assert names[("probe", "NVML and torch agree")] is True
    assert names[("plan", "--calibrate without a GPU: one line, exit 2")] is True
    assert names[("tests", "gpu-marked tests are collected")] is True
    page = (tmp_path / "gpu.md").read_text()
    assert gpu_check_report.START in page and "| no GPU | CPU-side checks only |" in page
    assert (tmp_path / "work" / "plan-calibrate-cpu.log").exists()


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--trials", "0"], "--trials must be more than 0"),
        (["--swarm-size", "1"], "--swarm-size must be at least 2"),
        (["--simulate", "-5"], "--simulate takes the simulated GPU's size"),
        (["--budget-seconds", "soon"], "invalid float value: 'soon'"),
        (["--nope"], "unrecognized arguments: --nope"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args: list[str], words: str, tmp_path) -> None:
    done = run_script(*args, "--work-dir", str(tmp_path))
    assert done.returncode == 2
    assert words in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert "Traceback" not in done.stderr and not (tmp_path / "gpu.json").exists()


@pytest.mark.slow
def test_the_study_step_on_a_simulated_gpu_catches_ooms_and_keeps_the_budget(tmp_path) -> None:
    done = run_script(
        "--simulate", "1000", "--sim-memory-scale", "60", "--swarm-size", "4", "--trials", "6",
        "--epochs", "1", "--skip-tests", "--work-dir", str(tmp_path / "work"),
        "--results", str(tmp_path / "gpu.json"), "--docs", str(tmp_path / "gpu.md"),
        "--copy-to", str(tmp_path / "out"),
    )  # fmt: skip
    results = json.loads((tmp_path / "gpu.json").read_text())
    failed = [c for c in results["checks"] if c["ok"] is False]
    assert done.returncode == 0 and not failed, (failed, done.stdout[-3000:])
    study = results["study"]
    assert study["ooms"] >= 1 and study["cuda_ooms"] == 0  # simulated, and said so
    assert study["counted"] == study["budget"] == 6
    assert study["reruns"] >= 1 and study["planned_at_once"] == 4
    assert 1 <= study["achieved_at_once"] <= 4
    ok = {c["name"]: c["ok"] for c in results["checks"]}
    assert ok["trial attributes hold the numbers"] is True
    assert ok["simulated OOMs happened and were caught"] is True
    copied = sorted(path.name for path in (tmp_path / "out").iterdir())
    assert "gpu.json" in copied and "gpu.md" in copied and "study.log" in copied
    assert len(copied) <= 8  # what the device machine hands back


# --- NVML readings, over a stand-in for pynvml ---------------------------------------------


def fake_pynvml(rounds: list[list[tuple[int, int | None]]], fail_after: int | None = None):
    """pynvml with one GPU whose compute processes are `rounds[i]` at the i-th reading."""
    import types

    module = types.ModuleType("pynvml")
    calls = {"n": 0}

    def processes(handle: str) -> list:
        assert handle == "handle-GPU-1234"
        n = calls["n"]
        calls["n"] += 1
        if fail_after is not None and n >= fail_after:
            raise RuntimeError("NVML_ERROR_GPU_IS_LOST")
        listed = rounds[min(n, len(rounds) - 1)]
        return [types.SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in listed]

    module.nvmlInit = lambda: None
    module.nvmlDeviceGetHandleByUUID = lambda uuid: f"handle-{uuid}"
    module.nvmlDeviceGetHandleByIndex = lambda index: "handle-GPU-1234"
    module.nvmlDeviceGetComputeRunningProcesses = processes
    return module


def test_the_sampler_records_each_process_and_skips_unknown_memory(monkeypatch) -> None:
    import time

    from benchmarks.gpu_check_nvml import NvmlSampler

    mib = 1024 * 1024
    rounds = [
        [(11, 600 * mib)],
        [(11, 2600 * mib), (12, None)],
        [(11, 2600 * mib), (12, 700 * mib)],
    ]
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(rounds))
    with NvmlSampler("GPU-1234", interval_s=0.01) as sampler:
        deadline = time.monotonic() + 5
        while sampler.readings < 4 and time.monotonic() < deadline:
            time.sleep(0.01)
    assert sampler.error is None and sampler.readings >= 4
    assert [(s.pid, s.used_mb) for s in sampler.samples[:4]] == [
        (11, 600.0),
        (11, 2600.0),  # pid 12's memory was not available at that reading: no sample
        (11, 2600.0),
        (12, 700.0),
    ]


def test_the_sampler_gives_up_on_a_lost_gpu_and_says_why(monkeypatch) -> None:
    from benchmarks.gpu_check_nvml import NvmlSampler, process_used_mb

    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml([[(5, 1024 * 1024)]], fail_after=1))
    with NvmlSampler("GPU-1234", interval_s=0.001) as sampler:
        sampler._thread.join(timeout=5)  # it stops by itself after repeated failures
    assert not sampler._thread.is_alive()
    assert sampler.readings == 1 and "GPU_IS_LOST" in (sampler.error or "")
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml([[(5, 3 * 1024 * 1024), (6, None)]]))
    assert process_used_mb(5) == 3.0
    assert process_used_mb(6) is None and process_used_mb(7) is None


def test_docs_gpu_md_has_one_results_section_for_a_gpu_run_to_replace() -> None:
    page = (ROOT / "docs" / "gpu.md").read_text()
    assert page.count(gpu_check_report.START) == 1 and page.count(gpu_check_report.END) == 1
    updated = gpu_check_report.replace_section(page, gpu_check_report.docs_section(RESULTS))
    assert "Not yet run on a GPU" not in updated and "| NVIDIA H200 (143,771 MB) |" in updated
    assert updated.split(gpu_check_report.START)[0] == page.split(gpu_check_report.START)[0]
    assert updated.split(gpu_check_report.END)[1] == page.split(gpu_check_report.END)[1]


def test_a_command_that_outlives_its_time_is_stopped_and_logged(tmp_path) -> None:
    import argparse
    import time

    from benchmarks.gpu_check_run import CheckRun, run_logged

    run = CheckRun(argparse.Namespace(budget_seconds=60), tmp_path, time.monotonic())
    started = time.monotonic()
    sleeper = [sys.executable, "-c", "import time; print('started', flush=True); time.sleep(60)"]
    done = run_logged(run, "sleeper", sleeper, timeout=2)
    assert time.monotonic() - started < 30 and done.returncode != 0
    log = (tmp_path / "sleeper.log").read_text()
    assert "started" in log and "[gpu_check] stopped: it ran out of time" in log


def test_a_step_that_breaks_fails_a_check_and_the_run_goes_on(tmp_path) -> None:
    import argparse
    import time

    from benchmarks.gpu_check import guarded
    from benchmarks.gpu_check_run import CheckRun

    run = CheckRun(argparse.Namespace(budget_seconds=60), tmp_path, time.monotonic())
    guarded(run, lambda r: {}["calibration"])
    guarded(run, lambda r: r.add([Check("tests", "after it", True, "ran")]))
    assert [(c.name, c.ok) for c in run.checks] == [
        ("a step ran to its end", False),
        ("after it", True),
    ]
    assert "KeyError: 'calibration'" in run.checks[0].detail
    assert "Traceback" in (tmp_path / "crash.log").read_text()

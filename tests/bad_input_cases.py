"""Every kind of bad input we try, and the one line each must get: one source of truth.

tests/test_bad_inputs.py runs each case against a folder that holds a stored study (its
default storage, `orchestrator.db`, with two finished trials) and checks: exit status 2, one
line on stderr and nothing on stdout, no traceback, the study unchanged, no other file made,
and that docs/reliability.md shows the case with that very line. To regenerate the table after
a message changed, run each case for real and rewrite the docs:

    python tests/bad_input_cases.py --write docs/reliability.md

Commands run in the study's folder, so the paths in them (`prices/`, `missing.csv`) are
relative to it, as a user would type them.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field

LONG_NAME = "s" * 600


@dataclass(frozen=True)
class Case:
    kind: str  # what is wrong, in the user's words
    argv: tuple[str, ...]
    expect: str  # a part of the one line
    env: dict[str, str] = field(default_factory=dict)
    # Also tried in an empty folder, where it must make no file: no database, no lock beside one.
    fresh: bool = False

    @property
    def command(self) -> str:
        shown = tuple(
            "s" * 12 + "...(600 characters)" if arg == LONG_NAME else arg for arg in self.argv
        )
        prefix = "".join(f"{key}={shlex.quote(value)} " for key, value in self.env.items())
        return f"{prefix}python -m orchestrator {shlex.join(shown)}"


def case(kind: str, *argv: str, expect: str, fresh: bool = False, **env: str) -> Case:
    return Case(kind, argv, expect, env, fresh)


PG = "postgresql://alice:s3cret@"  # a password that must never be printed

# fmt: off
CASES: tuple[Case, ...] = (
    # --- where the study lives -----------------------------------------------------------
    case("storage URL whose port is not a number", "status", "--storage", f"{PG}localhost:abc/db", expect="its port is not a number"),
    case("IPv6 host without its closing bracket", "status", "--storage", f"{PG}[::1/db", expect="needs its closing bracket"),
    case("port out of range", "status", "--storage", f"{PG}localhost:99999/db", expect="has port 99999"),
    case("host with a space in it", "status", "--storage", f"{PG}local host/db", expect="has no readable host"),
    case("not a URL at all", "status", "--storage", "nonsense", expect="it is malformed"),
    case("a database this tool does not use", "status", "--storage", "mysql://alice:s3cret@db/studies", expect="names 'mysql'"),
    case("empty --storage", "status", "--storage", "", expect="--storage is empty"),
    case("a NUL character in the password", "status", "--storage", "postgresql://alice:s3%00cret@db/studies", expect="holds a NUL character"),
    case("no server at that address", "status", "--storage", f"{PG}127.0.0.1:1/studies", expect="cannot reach the storage (PostgreSQL at 127.0.0.1:1)"),
    case("bad URL in the environment", "status", expect="it is malformed", ORCHESTRATOR_STORAGE="nonsense"),
    case("in-memory SQLite for trial processes", "run", "synthetic", "--storage", "sqlite://", expect="in-memory SQLite storage cannot be shared"),
    case("SQLite file in a folder that does not exist", "run", "synthetic", "--storage", "sqlite:////nonexistent/dir/x.db", expect="its folder /nonexistent/dir does not exist"),
    case("a text file as the SQLite database", "run", "synthetic", "--storage", "sqlite:///notadb.db", expect="the file notadb.db is not an SQLite database"),
    case("a folder as the SQLite database", "run", "synthetic", "--storage", "sqlite:///dirdb.db", expect="(SQLite file dirdb.db) is a folder, not a file"),
    case("SQLite file that is not there, to read", "status", "--storage", "sqlite:///nowhere/study.db", expect="no study database at SQLite file nowhere/study.db"),
    case("worker for a study that does not exist", "worker", "--study", "nosuchstudy", expect="no study 'nosuchstudy'"),
    case("flag abbreviated (taken for another)", "manifests", "dqn", "--study", "s", "--workers", "1", "--stor", f"{PG}db/studies", expect="unrecognized arguments: --stor postgresql://alice:***@db/studies"),
    case("a flag the command does not take", "adapters", "--storage", f"{PG}db/studies", expect="unrecognized arguments: --storage postgresql://alice:***@db/studies"),
    # --- numbers ------------------------------------------------------------------------
    case("zero trials", "run", "synthetic", "--trials", "0", expect="--trials 0 must be at least 1"),
    case("negative trials", "run", "synthetic", "--trials", "-3", expect="--trials -3 must be at least 1"),
    case("trials that are not a number", "run", "synthetic", "--trials", "many", expect="--trials 'many' is not a whole number"),
    case("more trials than the database can number", "run", "synthetic", "--trials", "99999999999999999999", expect="is more than 2,147,483,647"),
    case("fewer trials than the study already counts", "run", "synthetic", "--trials", "1", expect="already counts 2 trials"),
    case("zero epochs", "run", "synthetic", "--epochs", "0", expect="--epochs 0 must be at least 1"),
    case("negative seed", "run", "synthetic", "--seed", "-1", expect="--seed -1 must be at least 0"),
    case("seed too large", "run", "synthetic", "--seed", "4294967296", expect="give at most --seed 4294967295"),
    case("a swarm of one", "run", "synthetic", "--swarm-size", "1", "--study", "new", expect="a swarm needs at least 2 particles"),
    case("negative retries", "run", "synthetic", "--max-retries", "-1", expect="--max-retries -1 must be at least 0"),
    case("zero trials at once", "run", "synthetic", "--concurrency", "0", expect="--concurrency 0 must be at least 1"),
    case("zero trials per fused group", "run", "synthetic", "--fuse", "0", expect="--fuse 0 must be at least 1"),
    case("a fused group that is not a number", "run", "synthetic", "--fuse", "all", expect="--fuse 'all' is not a whole number"),
    case("a fused group too large", "worker", "--study", "synthetic", "--fuse", "1000", expect="give at most --fuse 256"),
    case("timeout that is not a number", "run", "synthetic", "--timeout", "nan", expect="--timeout 'nan' is not a finite number"),
    case("negative timeout", "run", "synthetic", "--timeout", "-5", expect="--timeout -5 must be more than 0"),
    case("grace that is not a number", "run", "synthetic", "--grace", "nan", expect="--grace 'nan' is not a finite number"),
    case("negative grace", "run", "synthetic", "--grace", "-1", expect="--grace -1 must be at least 0"),
    case("grace longer than a day", "run", "synthetic", "--grace", "1e15", expect="--grace 1e+15 is more than a day"),
    case("infinite memory scale", "run", "synthetic", "--sim-memory-scale", "inf", expect="--sim-memory-scale 'inf' is not a finite number"),
    case("zero memory scale", "run", "synthetic", "--sim-memory-scale", "0", expect="--sim-memory-scale 0 must be more than 0"),
    case("outage bound that is not a number", "run", "synthetic", "--storage-retry-seconds", "nan", expect="--storage-retry-seconds 'nan' is not a finite number"),
    case("recycling after zero trials", "run", "synthetic", "--recycle-after", "0", expect="--recycle-after 0 must be at least 1"),
    case("negative VRAM rows", "status", "--limit", "-1", expect="--limit -1 must be at least 0"),
    case("port out of range for the dashboard", "dashboard", "--port", "70000", expect="is more than 65,535"),
    case("heartbeat that is not a number", "run", "synthetic", "--study", "new", expect="must be a whole number of seconds", ORCHESTRATOR_HEARTBEAT_INTERVAL="often"),
    # --- adapter options ---------------------------------------------------------------
    case("negative trial duration", "run", "synthetic", "--option", "trial_seconds=-1", expect="--option trial_seconds=-1 must be at least 0"),
    case("memory overhead that is not a number", "run", "synthetic", "--option", "overhead_mb=nan", expect="--option overhead_mb=nan must be a finite number"),
    case("infinite trial duration", "run", "synthetic", "--option", "trial_seconds=inf", expect="--option trial_seconds=inf must be a finite number"),
    case("a process's part above the whole overhead", "run", "synthetic", "--option", "context_mb=900", "--option", "overhead_mb=500", expect="give a context_mb of at most overhead_mb"),
    case("option of the wrong type", "run", "synthetic", "--option", "trial_seconds=slow", expect="must be a number, e.g. --option trial_seconds=0.5"),
    case("option the adapter does not have", "run", "synthetic", "--option", "bogus=1", expect="has no option 'bogus'"),
    case("option without a value", "run", "synthetic", "--option", "trial_seconds", expect="is not KEY=VALUE"),
    case("negative seed of an RL adapter", "run", "dqn", "--study", "new", "--option", "seed=-4", expect="--option seed=-4 must be at least 0"),
    case("model width below the smallest", "plan", "tft", "--option", "max_width=10", expect="--option max_width=10 must be at least 16"),
    # --- names, files, choices -----------------------------------------------------------
    case("empty study name", "run", "synthetic", "--study", "", expect="--study '' is empty"),
    case("study name with a newline", "run", "synthetic", "--study", 'two\nlines', expect="holds a control character"),
    case("study name longer than the database holds", "run", "synthetic", "--study", LONG_NAME, expect="--study is 600 characters long"),
    case("price data that is a directory", "run", "dqn", "--data", "prices", expect="--data prices is a directory"),
    case("price data that is not there", "run", "dqn", "--data", "missing.csv", expect="--data missing.csv does not exist"),
    case("price data for an adapter without prices", "run", "synthetic", "--data", "prices/close.csv", expect="takes no --data"),
    case("price data with a date twice", "run", "dqn", "--data", "prices.csv", expect="date '2020-04-10' appears twice (lines 102 and 202)"),
    case("price data with a date that is not ISO", "run", "dqn", "--data", "eu.csv", expect="line 252: date '31/01/2020' is not a date"),
    case("environment for an adapter without one", "run", "synthetic", "--env", "CartPole-v1", expect="takes no --env"),
    case("unknown adapter", "run", "nosuchadapter", expect="unknown adapter 'nosuchadapter'"),
    case("no adapter named", "run", expect="name an adapter"),
    case("adapter module that does not exist", "run", "--adapter-path", "nosuchmodule:adapter", expect="--adapter-path 'nosuchmodule:adapter' cannot be used"),
    case("a study of another adapter", "run", "tft", "--study", "synthetic", expect="study 'synthetic' tunes 'synthetic', not 'tft'"),
    case("a --config file that is not there", "run", "synthetic", "--config", "missing.toml", expect="missing.toml"),
    case("unknown sampler", "run", "synthetic", "--sampler", "annealing", expect="invalid choice: 'annealing'"),
    case("a --config file of binary garbage", "run", "synthetic", "--config", "garbage.toml", expect="--config garbage.toml is not a text file"),
    case("an MLflow URI that is no URI", "run", "synthetic", "--mlflow-uri", "::::", expect="--mlflow-uri '::::' is not a tracking URI MLflow takes"),
    case("a log folder that is a file", "run", "synthetic", "--log-dir", "prices/close.csv", expect="--log-dir prices/close.csv is a file"),
    case("a log folder that cannot be made", "run", "synthetic", "--log-dir", "/proc/nope", expect="--log-dir /proc/nope cannot hold the trials' logs"),
    case("a study resumed with other settings", "run", "synthetic", "--epochs", "6", "--sampler", "random", expect="study 'synthetic' was run with other settings: --epochs 6 (stored: 1), --sampler random (stored: pso)"),
    case("workloads file that is not there", "plan", "synthetic", "--workloads", "missing.toml", expect="workloads file 'missing.toml' does not exist"),
    case("workloads file for run that is not there", "run", "synthetic", "--workloads", "missing.toml", expect="workloads file 'missing.toml' does not exist"),
    case("best of a study that does not exist", "best", "--study", "nosuchstudy", expect="no study 'nosuchstudy'"),
    case("best in an unknown format", "best", "--study", "synthetic", "--format", "xml", expect="invalid choice: 'xml'"),
    # --- GPUs: refused before any database is opened --------------------------------------
    case("simulated size that is not a number", "run", "synthetic", "--gpus", "sim:abc", expect="the simulated size must be a number of MB"),
    case("a GPU this machine does not have", "run", "synthetic", "--gpus", "3", expect="no GPU 3 on this machine"),
    case("negative simulated size", "run", "synthetic", "--gpus", "sim:-5", expect="must be more than 0 MB"),
    case("a simulated GPU larger than any", "run", "synthetic", "--gpus", "sim:1e30", expect="a simulated GPU of more than 1,048,576 MB"),
    case("real and simulated GPUs mixed", "run", "synthetic", "--gpus", "sim:24576,0", expect="real and simulated GPUs do not mix"),
    case("the same GPU twice", "run", "synthetic", "--gpus", "0,0", expect="names a GPU twice"),
    case("a part of a GPU that is not a size", "run", "synthetic", "--gpus", "0:lots", expect="must be a number of MB more than 0"),
    case("GPUs named by words", "plan", "synthetic", "--gpus", "all", expect="use auto, none, GPU indices"),
    case("a model that fits no GPU", "run", "synthetic", "--study", "tiny", "--gpus", "sim:100", expect="only 80 MB are usable"),
    # --- the search, checked before a study is stored ---------------------------------------
    case("a grid value outside the search space", "run", "synthetic", "--study", "new", "--sampler", "grid", "--grid", "x=abc", expect="--grid: x = 'abc' must be within -5..5"),
    case("a grid parameter the adapter lacks", "run", "synthetic", "--study", "new", "--sampler", "grid", "--grid", "nope=1", expect="--grid nope: not a parameter of the adapter"),
    case("more directions than the adapter returns", "run", "synthetic", "--study", "new", "--directions", "maximize,minimize", expect="returns 1 value(s) (minimize): give one direction for each"),
    case("a one-objective sampler for two objectives", "run", "synthetic", "--study", "new", "--sampler", "cmaes", "--objectives", "loss,seconds", expect="The sampler 'cmaes' optimises one objective only"),
    case("an objective that is neither the adapter's nor measured", "run", "synthetic", "--study", "new", "--objectives", "loss,bogus", expect="error: --objectives loss,bogus:"),
    case("objectives that are no names", "run", "synthetic", "--study", "new", "--objectives", ",", expect="error: --objectives ',': give names separated by commas"),
    case("a memory model no GPU can hold", "run", "synthetic", "--option", "per_sample_mb=1e308", expect="more than any GPU holds"),
    case("a binary --enqueue file", "run", "synthetic", "--study", "new", "--enqueue", "garbage.toml", expect="--enqueue garbage.toml is not a text file"),
    case("a trial number past the database's", "logs", "--study", "synthetic", "--trial", "99999999999999999999", expect="--trial 99999999999999999999 is more than 2,147,483,647"),
    case("an SQLite URL with two slashes", "status", "--storage", "sqlite://cli.db", expect="use three, sqlite:///cli.db"),
    case("a mistyped flag", "run", "synthetic", "--trails", "3", expect="did you mean --trials?"),
    case("a Slurm dry run on an SQLite file", "slurm", "synthetic", "--nodes", "1", "--gpus-per-node", "1", "--dry-run", "--storage", "sqlite:///study.db", expect="--storage is an SQLite file: workers on several nodes need a database server"),
    case("a price file name with a newline", "run", "dqn", "--data", "a\nb", expect="--data 'a\\nb' does not exist"),
    # --- read before any file is made: the environment, the workloads table, a population ---
    case("a binary workloads file in the environment", "run", "synthetic", expect="workloads file 'garbage.toml' is not a text file", fresh=True, ORCHESTRATOR_WORKLOADS="garbage.toml"),
    case("a folder as the workloads file in the environment", "run", "synthetic", expect="workloads file 'prices' is a folder", fresh=True, ORCHESTRATOR_WORKLOADS="prices"),
    case("a workloads file in the environment that is not there", "run", "synthetic", expect="workloads file 'missing.toml' does not exist", fresh=True, ORCHESTRATOR_WORKLOADS="missing.toml"),
    case("a workloads file in the environment that is not TOML", "run", "synthetic", expect="workloads file 'notadb.db' is not valid TOML", fresh=True, ORCHESTRATOR_WORKLOADS="notadb.db"),
    case("a binary --workloads file", "plan", "synthetic", "--workloads", "garbage.toml", expect="workloads file 'garbage.toml' is not a text file", fresh=True),
    case("a folder as --workloads", "run", "synthetic", "--workloads", "prices", expect="workloads file 'prices' is a folder", fresh=True),
    case("a population of one", "run", "synthetic", "--study", "new", "--sampler", "pbt", "--swarm-size", "1", expect="--swarm-size 1: a population needs at least 2 members", fresh=True),
    case("population-based training of two objectives", "run", "synthetic", "--study", "new", "--sampler", "pbt", "--objectives", "loss,seconds", expect="The sampler 'pbt' optimises one objective only", fresh=True),
    case("an SQLite wait that is not a number", "run", "synthetic", expect="ORCHESTRATOR_SQLITE_BUSY_TIMEOUT='soon' must be a number of seconds", fresh=True, ORCHESTRATOR_SQLITE_BUSY_TIMEOUT="soon"),
    case("a study setting for Slurm without the adapter", "slurm", "--study", "synthetic", "--nodes", "1", "--gpus-per-node", "1", "--epochs", "2", expect="--epochs is a study setting: give the ADAPTER too", fresh=True),
    # --- Kubernetes manifests ---------------------------------------------------------------
    case("image name that Docker would refuse", "manifests", "dqn", "--study", "s", "--workers", "1", "--image", "UPPER CASE:!!", expect="is not a container image reference"),
    case("zero workers", "manifests", "dqn", "--study", "s", "--workers", "0", expect="--workers 0 must be at least 1"),
    case("Secret name Kubernetes would refuse", "manifests", "dqn", "--study", "s", "--workers", "1", "--storage-secret", "Bad_Name", expect="is not a Kubernetes Secret name"),
)
# fmt: on


def table(lines: dict[str, str]) -> str:
    """The docs' table: each kind of bad input, what was typed, and the line it got."""
    rows = ["| bad input | what was typed | the one line (exit status 2) |", "| --- | --- | --- |"]
    for item in CASES:
        rows.append(f"| {item.kind} | {_cell(item.command)} | {_cell(lines[item.command])} |")
    return "\n".join(rows)


def _cell(text: str) -> str:
    # Double backticks: the lines quote commands in single ones.
    return "`` " + text.replace("|", "\\|").replace("\n", "\\n") + " ``"


def row(item: Case, line: str) -> str:
    return f"| {item.kind} | {_cell(item.command)} | {_cell(line)} |"


BEGIN, END = "<!-- bad inputs: begin -->", "<!-- bad inputs: end -->"


def _run_all() -> dict[str, str]:
    """Run every case for real, in a folder with a stored study; the first line each got."""
    import os
    import subprocess
    import sys
    import tempfile

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from tests.test_bad_inputs import make_study_folder

    lines = {}
    with tempfile.TemporaryDirectory() as folder:
        make_study_folder(folder)
        for item in CASES:
            done = subprocess.run(
                [sys.executable, "-m", "orchestrator", *item.argv],
                capture_output=True,
                text=True,
                cwd=folder,
                env={**os.environ, **item.env},
                timeout=120,
            )
            lines[item.command] = done.stderr.strip()
            print(f"{done.returncode}  {item.command}\n   {done.stderr.strip()}", file=sys.stderr)
    return lines


def main(argv: list[str]) -> int:
    lines = _run_all()
    text = table(lines)
    if argv[:1] == ["--write"]:
        path = argv[1]
        with open(path, encoding="utf-8") as handle:
            page = handle.read()
        head, _, rest = page.partition(BEGIN)
        _, _, tail = rest.partition(END)
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(f"{head}{BEGIN}\n{text}\n{END}{tail}")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    import sys

    raise SystemExit(main(sys.argv[1:]))

"""docker-compose.yml, Dockerfile and .env.example: structure (no Docker engine on the build machines)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from orchestrator.cli import build_parser
from orchestrator.deploy.compose import CLAIMS_DIR

REPO = Path(__file__).resolve().parents[1]
VARIABLE = re.compile(r"\$\{(?P<name>[A-Z_][A-Z0-9_]*)(?P<rest>[^}]*)\}")


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((REPO / "docker-compose.yml").read_text())


@pytest.fixture(scope="module")
def example_env() -> dict[str, str]:
    pairs = {}
    for line in (REPO / ".env.example").read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            pairs[key.strip()] = value.strip()
    return pairs


def interpolate(value: str, env: dict[str, str]) -> str:
    """Compose's ${VAR}, ${VAR:-default} and ${VAR:?error}, for checking what a service would run."""

    def one(match: re.Match) -> str:
        name, rest = match["name"], match["rest"]
        if env.get(name):
            return env[name]
        if rest.startswith(":-"):
            return rest[2:]
        raise AssertionError(f"${{{name}}} is unset and has no default")

    return VARIABLE.sub(one, value)


def test_the_four_services(compose: dict) -> None:
    assert set(compose["services"]) == {"postgres", "migrate", "dashboard", "worker"}


def test_postgres_keeps_data_in_a_named_volume_and_has_a_healthcheck(compose: dict) -> None:
    postgres = compose["services"]["postgres"]
    volume, _, target = postgres["volumes"][0].partition(":")
    assert volume in compose["volumes"] and target == "/var/lib/postgresql/data"
    test = postgres["healthcheck"]["test"]
    assert test[0] == "CMD-SHELL" and "pg_isready" in test[1]
    user, db = postgres["environment"]["POSTGRES_USER"], postgres["environment"]["POSTGRES_DB"]
    assert f"-U {user}" in test[1] and f"-d {db}" in test[1]


def test_the_password_comes_from_an_uncommitted_env_file(compose: dict, example_env: dict) -> None:
    postgres = compose["services"]["postgres"]
    assert postgres["env_file"] == ".env"
    assert "POSTGRES_PASSWORD" not in postgres["environment"]
    assert "POSTGRES_PASSWORD" in example_env and example_env["POSTGRES_PASSWORD"] == ""
    ignored = subprocess.run(["git", "check-ignore", "-q", ".env"], cwd=REPO)
    assert ignored.returncode == 0, ".env must be in .gitignore"
    tracked = subprocess.run(
        ["git", "ls-files", "--error-unmatch", ".env.example"], cwd=REPO, capture_output=True
    )
    assert tracked.returncode == 0, ".env.example must be committed"
    # No password is written in the compose file: the storage URL interpolates it, and refuses an empty one.
    url = compose["services"]["worker"]["environment"]["ORCHESTRATOR_STORAGE"]
    assert "${POSTGRES_PASSWORD:?" in url


def test_every_variable_is_in_the_example_or_has_a_default(
    compose: dict, example_env: dict
) -> None:
    text = (REPO / "docker-compose.yml").read_text()
    for match in VARIABLE.finditer(text):
        assert match["name"] in example_env or match["rest"].startswith(":-"), match[0]


def test_the_storage_url_names_the_postgres_service_user_and_database(compose: dict) -> None:
    postgres = compose["services"]["postgres"]
    user, db = postgres["environment"]["POSTGRES_USER"], postgres["environment"]["POSTGRES_DB"]
    for name in ("migrate", "dashboard", "worker"):
        url = interpolate(
            compose["services"][name]["environment"]["ORCHESTRATOR_STORAGE"],
            {"POSTGRES_PASSWORD": "pw"},
        )
        assert url == f"postgresql+psycopg2://{user}:pw@postgres:5432/{db}"


def test_migrate_runs_db_upgrade_once_postgres_is_healthy(compose: dict) -> None:
    migrate = compose["services"]["migrate"]
    assert migrate["command"] == ["db", "upgrade"]
    assert migrate["depends_on"] == {"postgres": {"condition": "service_healthy"}}
    assert migrate["restart"] == "no"


def test_the_dashboard_is_bound_to_localhost_after_migration(compose: dict) -> None:
    dashboard = compose["services"]["dashboard"]
    assert all(port.startswith("127.0.0.1:") for port in dashboard["ports"])
    assert dashboard["depends_on"] == {"migrate": {"condition": "service_completed_successfully"}}
    args = build_parser().parse_args(dashboard["command"])
    assert args.command == "dashboard" and args.port == 8080


def test_postgres_is_published_on_localhost_unless_a_private_address_is_chosen(
    compose: dict, example_env: dict
) -> None:
    (port,) = compose["services"]["postgres"]["ports"]
    assert interpolate(port, {}) == "127.0.0.1:5432:5432"
    assert interpolate(port, example_env) == "127.0.0.1:5432:5432"


def test_workers_reserve_gpus_and_scale(compose: dict) -> None:
    worker = compose["services"]["worker"]
    (device,) = worker["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"]
    assert device["count"] == "all"  # each replica then claims one (below)
    # --scale worker=N needs no fixed container name and no published port.
    assert "container_name" not in worker and "ports" not in worker
    assert "replicas" not in worker.get("deploy", {})
    assert worker["depends_on"] == {"migrate": {"condition": "service_completed_successfully"}}


def test_each_worker_replica_claims_one_gpu_through_a_shared_volume(compose: dict) -> None:
    worker = compose["services"]["worker"]
    entrypoint = worker["entrypoint"]
    assert entrypoint[:4] == ["python", "-m", "orchestrator.deploy.compose", "claim-gpu"]
    locks = entrypoint[entrypoint.index("--locks") + 1]
    assert locks == CLAIMS_DIR
    (mount,) = worker["volumes"]
    volume, _, target = mount.partition(":")
    assert target == locks and volume in compose["volumes"]
    # A fresh named volume takes the image directory's owner: the non-root user must own it.
    dockerfile = (REPO / "Dockerfile").read_text()
    assert re.search(rf"mkdir -p [^\n]*{re.escape(locks)}", dockerfile)
    assert re.search(r"chown -R orchestrator:orchestrator [^\n]*/var/lib/orchestrator", dockerfile)


def test_the_worker_command_parses_with_the_real_cli(compose: dict, example_env: dict) -> None:
    worker = compose["services"]["worker"]
    entrypoint = worker["entrypoint"]
    after = entrypoint[entrypoint.index("--") + 1 :]
    assert after == ["python", "-m", "orchestrator"]
    argv = [interpolate(part, example_env) for part in worker["command"]] + [
        "--gpus",
        "0",
    ]  # claim-gpu adds it
    args = build_parser().parse_args(argv)
    assert (args.command, args.adapter, args.study, args.trials, args.gpus) == (
        "run",
        "dqn",
        "dqn",
        200,
        "0",
    )
    args = build_parser().parse_args([interpolate(part, {}) for part in worker["command"]])
    assert args.adapter == "dqn"


def test_the_dockerfile_installs_the_way_the_readme_does() -> None:
    readme = REPO / "README.md"
    if not readme.exists():
        pytest.skip("README.md is not written yet")
    text = readme.read_text()
    dockerfile = (REPO / "Dockerfile").read_text()
    run_lines = [
        line.strip()[4:].strip()
        for line in dockerfile.splitlines()
        if line.strip().startswith("RUN ")
    ]
    assert "pip install -e ." in text, "the README's install step is `pip install -e .`"
    assert "pip install -e ." in run_lines
    # The image's torch is the README's version (its CUDA build, from the default index).
    readme_torch = re.search(r"pip install torch==([\w.+]+)", text)
    docker_torch = re.search(r"^ARG TORCH_VERSION=([\w.+]+)", dockerfile, re.MULTILINE)
    assert readme_torch and docker_torch and readme_torch.group(1) == docker_torch.group(1)
    assert "RUN pip install torch==${TORCH_VERSION}" in dockerfile


def test_the_dockerfile_runs_as_a_non_root_user_with_cache_free_layers() -> None:
    dockerfile = (REPO / "Dockerfile").read_text()
    users = re.findall(r"^USER (\S+)", dockerfile, re.MULTILINE)
    assert users and users[-1].split(":")[0] not in ("root", "0")
    assert "PIP_NO_CACHE_DIR=1" in dockerfile
    base = re.search(r"^FROM (\S+)", dockerfile, re.MULTILINE).group(1)
    assert "python" in base and "slim" in base
    # The heavy torch layer comes before any COPY, so code changes never rebuild it.
    assert dockerfile.index("RUN pip install torch==") < dockerfile.index("COPY ")
    entrypoint = re.search(r"^ENTRYPOINT (.+)$", dockerfile, re.MULTILINE).group(1)
    assert yaml.safe_load(entrypoint) == ["python", "-m", "orchestrator"]


def test_everything_the_dockerfile_copies_exists_and_is_in_the_build_context() -> None:
    dockerfile = (REPO / "Dockerfile").read_text()
    ignored = [
        line.strip()
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert ".env" in ignored and ".git" in ignored
    for source in re.findall(r"^COPY (\S+) ", dockerfile, re.MULTILINE):
        if source == "README.md" and not (REPO / source).exists():
            continue  # written with the README; the test above says so
        assert (REPO / source).exists(), source
        assert source not in ignored, source


def test_docker_compose_accepts_the_file_where_it_is_installed(tmp_path) -> None:
    docker = shutil.which("docker")
    if (
        docker is None
        or subprocess.run([docker, "compose", "version"], capture_output=True).returncode != 0
    ):
        pytest.skip("the docker compose plugin is not installed here")
    # A copy beside a throwaway .env: the real .env is the user's and is never read by tests.
    shutil.copy(REPO / "docker-compose.yml", tmp_path / "docker-compose.yml")
    (tmp_path / ".env").write_text("POSTGRES_PASSWORD=pw\n")
    result = subprocess.run(
        [docker, "compose", "config", "--quiet"], capture_output=True, text=True, cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr


def test_the_compose_engine_renders_a_study_with_literal_dollars_and_its_scale() -> None:
    from orchestrator.deploy.compose import ComposeEngine, repository_file
    from orchestrator.deploy.engine import StudyWorkers
    from orchestrator.planning.workloads import workload_class

    assert (REPO / "docker-compose.yml").read_text() == repository_file()
    workers = StudyWorkers(
        study="cost $5", workers=4, workload=workload_class("rl"), adapter="dqn", trials=12
    )
    (text,) = ComposeEngine().render(workers).values()
    assert "--scale worker=4" in text
    rendered = yaml.safe_load(text)
    worker = rendered["services"]["worker"]
    assert worker["entrypoint"] == compose_services_entrypoint()
    # `$$` is compose's `$`: the container is given the study's own name.
    command = [part.replace("$$", "$") for part in worker["command"]]
    args = build_parser().parse_args([*command, "--gpus", "0"])
    assert (args.adapter, args.study, args.trials) == ("dqn", "cost $5", 12)
    assert set(rendered["services"]) == {"postgres", "migrate", "dashboard", "worker"}


def compose_services_entrypoint() -> list[str]:
    """The repository file's worker entrypoint: every rendered file claims a GPU the same way."""
    return yaml.safe_load((REPO / "docker-compose.yml").read_text())["services"]["worker"][
        "entrypoint"
    ]

"""A user's own `adapters/`, `samplers/` or `migrations/` folder changes nothing that runs, and a
same-named package from another distribution is named in one line."""

from __future__ import annotations

from pathlib import Path

from tests.cli_helpers import cli_env, run_cli

ROOT = Path(__file__).resolve().parents[1]


def _folders_like_ours(where: Path) -> None:
    for name in ("adapters", "samplers", "migrations"):
        (where / name).mkdir()
        (where / name / "__init__.py").write_text(f"raise RuntimeError('the user\\'s {name}')\n")
    (where / "my_model.py").write_text(
        "from adapters.synthetic import SyntheticAdapter\n\n"
        "class Mine(SyntheticAdapter):\n    name = 'mine'\n\nadapter = Mine()\n"
    )


def test_a_project_with_adapters_samplers_and_migrations_folders(tmp_path):
    _folders_like_ours(tmp_path)
    listed = run_cli("adapters", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert "dqn" in listed.stdout and "synthetic" in listed.stdout
    upgraded = run_cli("db", "upgrade", "--storage", "sqlite:///study.db", cwd=tmp_path)
    assert upgraded.returncode == 0, upgraded.stderr
    # A module of the user's own in that directory is still found (--adapter-path).
    done = run_cli(
        "run", "--adapter-path", "my_model:adapter", "--trials", "2", "--epochs", "1",
        "--gpus", "none", "--option", "trial_seconds=0", "--storage", "sqlite:///study.db",
        "--json", cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert '"counted": 2' in done.stdout


def test_another_distribution_s_adapters_package_is_one_line(tmp_path):
    # As in a site-packages where PyPI's `adapters` was installed over ours, beside the rest.
    site = tmp_path / "site"
    site.mkdir()
    for name in ("orchestrator", "samplers", "migrations"):
        (site / name).symlink_to(ROOT / name)
    (site / "adapters").mkdir()
    (site / "adapters" / "__init__.py").write_text("VERSION = '0.1'  # PyPI's adapters\n")
    env = cli_env(PYTHONPATH=str(site))
    done = run_cli("adapters", env=env, cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1
    assert "the package 'adapters' at" in done.stderr and "pip uninstall" in done.stderr

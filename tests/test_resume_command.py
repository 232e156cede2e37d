"""The resume command of the exit-75 line: pasteable as shown, no password and no `***` in it."""

from __future__ import annotations

import shlex

import pytest

from orchestrator.record.outages.state import resume_command

URL = "postgresql://alice:s3cret-pw@db.example:5432/studies"


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "synthetic", "--storage", URL, "--trials", "12"],
        ["run", "synthetic", f"--storage={URL}", "--trials", "12"],
    ],
)
def test_a_storage_url_with_a_password_is_read_from_the_environment(argv):
    command = resume_command(argv)
    assert "s3cret" not in command and "***" not in command
    assert command == (
        'python -m orchestrator run synthetic --storage "$ORCHESTRATOR_STORAGE" --trials 12'
    )


def test_other_words_are_quoted_for_a_shell_and_a_url_without_password_kept():
    argv = ["worker", "--study", "two words", "--storage", "sqlite:///a b.db"]
    command = resume_command(argv)
    assert shlex.split(command) == ["python", "-m", "orchestrator", *argv]

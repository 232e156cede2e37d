"""`python -m orchestrator adapters`: rows, table and JSON, in process."""

from __future__ import annotations

import json

import pytest

import adapters
from adapters import AdapterEntry
from orchestrator.cli import main
from orchestrator.commands.adapters import describe, format_table


class RaisingMemoryModel:
    name = "odd"
    workload_class = "rl"
    model_overhead_mb = 1.0
    per_sample_mb = 0.0
    direction = "maximize"

    def memory_model(self, options):
        raise RuntimeError("cannot size myself\nsecond line")

    def suggest(self, trial, options):
        return {}

    def train(self, params, *, epochs, device, options, report):
        return 0.0


def test_usable_adapter_row_has_its_memory_model_at_default_options():
    tft = adapters.get("tft")
    row = describe(AdapterEntry("tft", "built-in", "adapters.tft:adapter", adapter=tft))
    assert row["error"] is None
    assert row["workload_class"] == "supervised" and row["metric"] == "val_loss"
    assert row["per_sample_mb"] == pytest.approx(tft.memory_model(dict(tft.options)).per_sample_mb)


def test_a_failing_memory_model_is_an_error_of_one_line():
    row = describe(AdapterEntry("odd", "path x:y", "x:y", adapter=RaisingMemoryModel()))
    assert row["error"] == "memory model: RuntimeError: cannot size myself"


def test_table_aligns_usable_ones_and_gives_each_broken_one_a_line():
    rows = [
        describe(
            AdapterEntry(
                "synthetic",
                "built-in",
                "adapters.synthetic:adapter",
                adapter=adapters.get("synthetic"),
            )
        ),
        describe(
            AdapterEntry(
                "gone",
                "entry point (pkg)",
                "gone:adapter",
                error="ModuleNotFoundError: No module named 'gone'",
            )
        ),
    ]
    lines = format_table(rows).splitlines()
    assert lines[0].split() == ["NAME", "CLASS", "MEMORY", "MODEL", "FROM"]
    assert lines[1].index("supervised") == lines[0].index("CLASS")
    assert "500 MB + 0.02 MB/sample" in lines[1]
    assert lines[2] == (
        "gone: broken (entry point (pkg), gone:adapter): "
        "ModuleNotFoundError: No module named 'gone'"
    )


def test_json_lists_every_installed_adapter(capsys):
    assert main(["adapters", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [row["name"] for row in rows] == sorted(adapters.available())
    by_name = {row["name"]: row for row in rows}
    assert by_name["tft"]["origin"] == "built-in"
    assert by_name["tft"]["per_sample_mb"] > by_name["synthetic"]["per_sample_mb"]


def test_table_output(capsys):
    assert main(["adapters"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("NAME")
    assert any(line.startswith("tft ") and "built-in" in line for line in out.splitlines())

"""The reproductions catalogue points at files that hold its numbers and at commands that exist."""

import re
import shlex
from pathlib import Path

import pytest

from cbo_jax.experiments import registry
from cbo_jax.experiments.catalog import RECORDED

ROOT = Path(__file__).resolve().parents[2]


def _numbers(text: str) -> list[str]:
    return re.findall(r"(?<![\w.])-?\d+\.\d+(?:e-?\d+)?", text)


def _in(number: str, values: list[float]) -> bool:
    """``number`` is one of ``values`` rounded to the digits it shows."""
    from decimal import Decimal

    d = Decimal(number)
    tol = float(Decimal(1).scaleb(d.as_tuple().exponent)) / 2 * (1 + 1e-9)
    return any(abs(v - float(d)) <= tol or abs(abs(v) - abs(float(d))) <= tol for v in values)


@pytest.mark.parametrize("name", sorted(RECORDED))
def test_recorded_entry_cites_a_file_with_its_numbers_and_a_real_command(name):
    rec = RECORDED[name]
    path = ROOT / rec.source.split(" (")[0]
    assert path.is_file(), f"{name}: {rec.source} does not exist"
    text = path.read_text().replace("−", "-")
    values = [float(v) for v in _numbers(text)]
    missing = [n for n in _numbers(rec.measured) if not _in(n, values)]
    assert not missing, f"{name}: {missing} are not in {rec.source}"
    words = shlex.split(rec.command.split("cbo-jax ", 1)[1]) if "cbo-jax " in rec.command else []
    assert words[:1] == ["reproduce"] and words[1] == name and name in registry(), rec.command
    parser_flags = {a for a in words[2:] if a.startswith("--")}
    import argparse

    p = argparse.ArgumentParser()
    registry()[name].add_arguments(p)
    known = {s for a in p._actions for s in a.option_strings}
    assert parser_flags <= known, f"{name}: unknown flags {parser_flags - known}"


def test_every_reproduction_has_a_recorded_entry_or_says_why():
    assert set(registry()) <= set(RECORDED)


def test_last_run_names_the_options_that_differ_from_the_defaults(tmp_path):
    """A shortened run (--runs 3 --steps 200) is shown as such beside its headline, not as
    the default run the recorded number comes from."""
    import json

    from cbo_jax.experiments.catalog import last_run

    run_dir = tmp_path / "rastrigin-success"
    run_dir.mkdir()
    (run_dir / "summary.json").write_text(json.dumps({"successes": 0, "runs": 3}))
    assert "(with" not in last_run("rastrigin-success", tmp_path)[0]  # no options.json: nothing added
    parser = __import__("argparse").ArgumentParser()
    registry()["rastrigin-success"].add_arguments(parser)
    options = {a.dest: a.default for a in parser._actions if a.option_strings and a.dest != "help"}
    options.update(name="rastrigin-success", runs=3, steps=200)
    (run_dir / "options.json").write_text(json.dumps(options))
    text = last_run("rastrigin-success", tmp_path)[0]
    assert text.endswith("(with --runs 3 --steps 200)"), text

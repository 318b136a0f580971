"""Every reproduction's flags are generated from its options dataclass (``Experiment.options``):
one flag per leaf field, with the field's default and a description, the shared groups once."""

import argparse
import dataclasses
import importlib

import pytest

from cbo_jax.experiments import registry
from cbo_jax.experiments.base import ScaleOptions


def _leaves(cls) -> dict:
    """``{name: default}`` of an options class, its shared groups (nested dataclasses) flattened."""
    out = {}
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(f.default):
            out.update(_leaves(type(f.default)))
        else:
            out[f.name] = f.default
    return out


@pytest.mark.parametrize("name", sorted(registry()))
def test_flags_are_the_options_fields_with_their_defaults_and_a_description(name):
    exp = registry()[name]
    assert dataclasses.is_dataclass(exp.options) and exp.options.__dataclass_params__.frozen
    p = argparse.ArgumentParser()
    dests = exp.add_arguments(p)
    actions = {a.dest: a for a in p._actions if a.dest != "help"}
    leaves = _leaves(exp.options)
    assert set(actions) == set(dests) == set(leaves)
    for dest, action in actions.items():
        assert action.option_strings[0] == "--" + dest.replace("_", "-")
        assert action.help, f"{name}: --{dest} has no description"
    # the parsed defaults are the dataclass's, except where a composing field's specs set another
    parsed = vars(p.parse_args([]))
    differ = {k for k in leaves if parsed[k] != leaves[k]}
    assert differ <= {"seed"} and all(parsed[k] == 0 for k in differ), differ


@pytest.mark.parametrize("module", ["fedcbo_table1", "fedcb2o_attack"])
def test_the_shared_scale_choices_are_each_modules_scales(module):
    scales = importlib.import_module(f"cbo_jax.experiments.{module}").SCALES
    choices = dataclasses.fields(ScaleOptions)[0].metadata["choices"]
    assert tuple(sorted(scales)) == choices and ScaleOptions().scale in scales


def test_a_shared_groups_help_is_adjusted_per_reproduction():
    def helps(name):
        p = argparse.ArgumentParser()
        registry()[name].add_arguments(p)
        return {a.dest: a.help for a in p._actions}

    table1, attack = helps("fedcbo-table1"), helps("fedcb2o-attack")
    assert "EMNIST" not in table1["source"] and "EMNIST: tfds only" in attack["source"]
    assert table1["seeds"] == attack["seeds"] == "number of seeds (default: 3 small, 1 paper)"

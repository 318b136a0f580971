"""The cbo-jax command: optimize, reproduce --list, reproduce NAME, errors."""

import dataclasses
import json
import re
from pathlib import Path

import numpy as np
import pytest

from cbo_jax.cli import main
from cbo_jax.config import option

ROOT = Path(__file__).resolve().parents[1]


def _last_json(out: str) -> dict:
    return json.loads(out.strip().splitlines()[-1])


def test_optimize_prints_summary_and_saves(tmp_path, capsys):
    rc = main(["optimize", "--objective", "sphere", "--dim", "5", "--particles", "50", "--runs", "3",
               "--steps", "300", "--sigma1", "2", "--no-progress", "--output", str(tmp_path)])
    assert rc == 0
    summary = _last_json(capsys.readouterr().out)
    assert summary["runs"] == 3 and summary["steps"] == 300
    assert summary["best_energy"] < 1e-2
    saved = json.loads((tmp_path / "summary.json").read_text())
    assert saved["objective"] == "sphere"
    assert saved["environment"]["command"].startswith("cbo-jax optimize --objective sphere --dim 5")
    assert "environment" not in summary  # the printed line is the result alone
    assert (tmp_path / "history.npz").exists()
    # config.json: every option (defaults included) and every number of the resolved dynamics;
    # summary.json alone did not say dt, lambda1, sigma1, the alpha schedule, the seed or the bounds
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["options"]["sigma1"] == 2.0 and config["options"]["seed"] == 0
    assert config["options"]["init_low"] == -3.0 and config["options"]["output"] == str(tmp_path)
    dyn = config["dynamics"]
    assert dyn["name"] == "cbo" and dyn["type"] == "CBOConfig" and dyn["sigma1"] == 2.0 and dyn["dt"] == 0.01
    assert dyn["alpha"] == {"type": "Multiplicative", "alpha0": 30.0, "factor": 1.05, "alpha_max": 1e5}
    assert dyn["noise"] == "anisotropic"


def test_optimize_bad_input_is_a_clear_error(capsys):
    assert main(["optimize", "--dt", "0", "--no-progress"]) == 2
    assert "--dt must be > 0" in capsys.readouterr().err
    assert main(["optimize", "--sigma1", "-1", "--no-progress"]) == 2
    assert "--sigma1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["optimize", "--particles", "0"])
    # errors name the flags (the config's alpha0 and num_steps were named before)
    assert main(["optimize", "--alpha", "-5", "--no-progress"]) == 2
    assert "--alpha must be >= 0" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["optimize", "--steps", "-1"])
    assert "--steps" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # and the help shows the defaults
        main(["optimize", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for shown in ("--steps STEPS steps of the Euler–Maruyama scheme (at most 2**31 - 1) (default: 2000)",
                  "(default: rastrigin)",
                  "--seed SEED seed of the initial particles and the noise (0 to 2**64 - 1, each its own key) "
                  "(default: 0)"):
        assert shown in text, shown
    assert "(default: None)" not in text


def test_reproduce_list_names_every_entry(capsys, tmp_path):
    from cbo_jax.experiments import registry
    from cbo_jax.experiments.catalog import RECORDED

    run_dir = tmp_path / "rastrigin-success"
    run_dir.mkdir()
    (run_dir / "summary.json").write_text(json.dumps({"successes": 37, "runs": 40}))
    assert main(["reproduce", "--list", "--results-root", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    for name, exp in registry().items():
        assert name in out
        if name in RECORDED:
            assert RECORDED[name].measured.split(";")[0][:20] in out  # the repository's measurement
    assert "37" in out  # your last run's headline, read from RESULTS_ROOT


def test_reproduce_unknown_name(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["reproduce", "no-such-thing"])
    assert exit_.value.code == 2
    assert "invalid choice: 'no-such-thing'" in capsys.readouterr().err


def test_reproduce_rastrigin_success_small(tmp_path, capsys, optimized_xla):
    rc = main(["reproduce", "rastrigin-success", "--runs", "10", "--no-progress", "--output", str(tmp_path)])
    assert rc == 0
    result = _last_json(capsys.readouterr().out)
    assert result["experiment"] == "rastrigin-success"
    assert result["successes"] >= 9
    saved = json.loads((tmp_path / "summary.json").read_text())
    assert saved["successes"] == result["successes"]
    assert saved["environment"]["command"] == f"cbo-jax reproduce rastrigin-success --runs 10 --no-progress --output {tmp_path}"


def test_readme_has_exactly_two_setup_commands():
    text = (ROOT / "README.md").read_text()
    block = re.search(r"<!-- setup-commands -->(.*?)<!-- /setup-commands -->", text, re.S).group(1)
    cmds = [ln for ln in block.splitlines() if re.match(r"^(pip|python|cbo-jax)", ln)]
    assert len(cmds) == 2
    assert "pytest" in cmds[1]


def test_readme_python_example_runs(capsys, optimized_xla):
    text = (ROOT / "README.md").read_text()
    code = re.search(r"## Python API in 20 lines\s+```python\n(.*?)```", text, re.S).group(1)
    assert len(code.strip().splitlines()) <= 22
    namespace: dict = {}
    exec(compile(code, "README.md", "exec"), namespace)  # noqa: S102 - our own README
    out = capsys.readouterr().out
    assert int(re.search(r"successes: (\d+)", out).group(1)) >= 95


def test_optimize_writes_metrics_jsonl_and_guards_its_output(tmp_path, capsys):
    out = tmp_path / "opt"
    args = ["optimize", "--objective", "sphere", "--dim", "3", "--particles", "20", "--runs", "2", "--steps", "30",
            "--no-progress", "--output", str(out), "--log-every", "10"]
    assert main(args) == 0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 10, 20, 30]
    hist = np.load(out / "history.npz")
    np.testing.assert_allclose([r["best_energy"] for r in rows], hist["best_energy"][[0, 9, 19, 29]], rtol=1e-6)
    assert hist["step"].tolist() == list(range(1, 31)) and hist["best_energy"].shape == (30, 2)  # rows by step
    capsys.readouterr()
    err = capsys.readouterr().err if main(args) == 2 else ""
    assert "already holds results" in err and "--resume" not in err  # no silent overwrite; optimize cannot resume
    assert main(args + ["--overwrite"]) == 0
    (tmp_path / "file").write_text("x")
    assert main(["optimize", "--steps", "1000000", "--no-progress", "--output", str(tmp_path / "file" / "sub")]) == 2
    assert "cannot write results" in capsys.readouterr().err  # at once, not after the simulation


@pytest.mark.parametrize("extra,match", [
    (["--alpha", "1e39", "--alpha-schedule", "constant"], "overflows float32"),
    (["--alpha", "10", "--alpha-max", "1e39"], "--alpha-max = 1e\\+39 overflows float32"),
    (["--alpha", "100", "--alpha-max", "1"], "--alpha = 100.0 is above --alpha-max = 1.0: .* give --alpha-max >= --alpha"),
    (["--shift", "nan"], "--shift must be finite"),
    (["--particles", "2000000000", "--dim", "10"], "needs about .* GiB"),
])
def test_optimize_values_that_would_be_silent_garbage_are_refused(capsys, extra, match):
    assert main(["optimize", "--steps", "3", "--no-progress", *extra]) == 2
    assert re.search(match, capsys.readouterr().err)


def _parsers(parser):
    """Every parser reachable from `parser`, itself included (sub-commands, nested)."""
    import argparse

    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _parsers(sub)


def test_every_help_text_prints_as_written():
    """argparse %-formats help strings: a bare '%' in a summary ("20% attackers") printed the
    argparse action's whole dict in `cbo-jax reproduce --help`. Every help line of every
    (sub)command must print as written: no "%(...)s" left, no action repr."""
    from cbo_jax.cli import build_parser

    for parser in _parsers(build_parser()):
        text = parser.format_help()
        assert "option_strings" not in text, parser.prog
        assert "%(" not in text, parser.prog
        # docstring markup read into help (a config field's :func:`...` role, ``code``)
        assert not re.search(r":\w+:`|``", text), parser.prog
    reproduce = next(p for p in _parsers(build_parser()) if p.prog.endswith(" reproduce"))
    assert "20% attackers" in " ".join(reproduce.format_help().split())


def test_a_description_shared_by_several_options_is_printed_once():
    """A docstring line for several fields (``lambda1, gamma: ...``) was printed in full under
    each of their flags; the later flags now point to the first, and keep their own default."""
    from cbo_jax.cli import build_parser

    for parser in _parsers(build_parser()):
        helps = [a.help for a in parser._actions if a.help and len(a.help) > 60]
        bodies = [re.sub(r"\s*\(default: .*\)$", "", h) for h in helps]
        assert len(bodies) == len(set(bodies)), (parser.prog, [b for b in bodies if bodies.count(b) > 1][:1])
    fedcbo = next(p for p in _parsers(build_parser()) if p.prog.endswith("run fedcbo"))
    text = " ".join(fedcbo.format_help().split())
    assert "--gamma FLOAT see --lambda1. (default: 0.1)" in text
    assert "--eps-min FLOAT, --eps_min FLOAT see --eps0. (default: 0.1)" in text


@pytest.mark.slow  # three CLI runs; CI runs it in the slow step
def test_optimize_mirror_cbo_is_the_library_run(capsys):
    """`--dynamic mirror_cbo --mirror-map ProjectionBall` runs the same program as mirror_cbo with that map:
    equal best energy, and every particle in the unit ball although the minimiser lies outside it."""
    import jax

    from cbo_jax import schedules
    from cbo_jax.dynamics.family import MirrorCBOConfig, mirror_cbo
    from cbo_jax.objectives import get_objective
    from cbo_jax.simulate import simulate

    argv = ["optimize", "--dynamic", "mirror_cbo", "--mirror-map", "ProjectionBall", "--objective", "sphere",
            "--shift", "2", "--dim", "3", "--particles", "40", "--steps", "50", "--no-progress"]
    assert main(argv) == 0
    summary = _last_json(capsys.readouterr().out)
    assert summary["mirror_map"] == "ProjectionBall"
    cfg = MirrorCBOConfig(mirror_map="ProjectionBall", alpha=schedules.Multiplicative(30.0, 1.05, 1e5))
    objective = get_objective("sphere", shift=2.0)
    k_init, k_run = jax.random.split(jax.random.key(0))
    x0 = jax.random.uniform(k_init, (1, 40, 3), minval=-3.0, maxval=3.0)
    res = simulate(mirror_cbo(objective, cfg), x0, k_run, 50, num_runs=1, progress=False)
    assert summary["best_energy"] == float(res.state.best_energy.min())
    assert float(jax.numpy.linalg.norm(res.state.x, axis=-1).max()) <= 1 + 1e-6
    # Started inside the ball, the best particle is feasible: at least the constrained minimum 3 (2 - 1/sqrt 3)^2
    # = 6.07, and well below the start's energies (about 9 and more). After 1000 steps it is 6.07-7.40 over
    # 6 seeds in each of the three noise layouts (measured): the upper bound is not tighter than that.
    inside = ["--particles", "100", "--steps", "1000", "--init-low", "-0.5", "--init-high", "0.5", "--no-progress"]
    assert main(argv[:-5] + inside) == 0
    best = _last_json(capsys.readouterr().out)["best_energy"]
    assert 3 * (2 - 3 ** -0.5) ** 2 - 1e-4 <= best <= 3 * (2 - 3 ** -0.5) ** 2 + 1.5
    assert main(["optimize", "--mirror-map", "L2", "--no-progress"]) == 2
    assert "--mirror-map needs --dynamic mirror_cbo" in capsys.readouterr().err


@pytest.mark.parametrize("argv, flag, match", [
    (["rastrigin-success", "--runs", "-2"], "--runs", "must be >="),
    (["rastrigin-success", "--steps", "0"], "--steps", "must be >="),
    (["fedcbo-table1", "--seeds", "-1"], "--seeds", "must be >="),
    (["fedcbo-table1", "--rounds", "0"], "--rounds", "must be >="),
    (["fedcbo-noise", "--seeds", "0"], "--seeds", "must be >="),
    (["fedcb2o-attack", "--seeds", "-1"], "--seeds", "must be >="),
    (["fedcb2o-attack", "--rounds", "0"], "--rounds", "must be >="),
    (["fedcb2o-tg", "--T-G", "-1"], "--T-G", "must be >="),
    (["cb2o-malicious", "--dim", "0"], "--dim", "must be >="),
    # seeds: a negative one reached np.random.default_rng (naming no option), one beyond 64 bits
    # jax.random.key (an OverflowError traceback); now integers in [0, 2**32)
    (["rastrigin-success", "--seed", "-1"], "--seed", "must be >="),
    (["clustered-consensus", "--seed", "-1"], "--seed", "must be >="),
    (["meanfield-scaling", "--seed", str(2**70)], "--seed", "must be at most"),
    (["cb2o-malicious", "--seed", "1.5"], "--seed", "must be an integer"),
    (["fedsgld-synthetic", "--data-seed", "-1"], "--data-seed", "must be >="),
    (["fedsgld-synthetic", "--seed", str(2**64)], "--seed", "must be at most"),
])
def test_reproduce_counts_and_seeds_are_checked_by_the_parser(argv, flag, match, capsys, tmp_path, monkeypatch):
    """A count below 1 or a seed off [0, 2**32) is a one-line usage error before any work (was:
    a raw MLIRError, a KeyError after the sweep, or --rounds 0 silently running the default rounds)."""
    import dataclasses

    import cbo_jax.experiments as experiments

    def ran(args):
        raise AssertionError(f"the experiment ran with {argv}")

    real = experiments.registry
    monkeypatch.setattr(experiments, "registry",
                        lambda: {k: dataclasses.replace(e, run=ran) for k, e in real().items()})
    with pytest.raises(SystemExit) as exit_:
        main(["reproduce", *argv, "--output", str(tmp_path), "--no-progress"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {flag}" in err and match in err and "Traceback" not in err


def test_reproduce_explicit_counts_are_not_replaced_by_defaults():
    """``--rounds``/``--seeds`` given (even a falsy value) are used, never the scale's default."""
    import argparse

    from cbo_jax.experiments import fedcb2o_attack, fedcbo_table1

    args = argparse.Namespace(scale="small", rounds=0, seeds=None, source="auto", data_dir=None, preset="paper")
    with pytest.raises(ValueError, match="rounds must be >= 1, got 0"):
        fedcbo_table1._configs(args)
    args.rounds, args.seeds = 2, 0
    assert fedcbo_table1._configs(args)[1] == 0
    seen = {}
    args = argparse.Namespace(scale="small", seeds=0, rounds=None, epochs=None, lr=None, alpha=None, alpha_fedcbo=None,
                              T_G=None, model=None)

    def stop(experiment, variants, scale, seeds, args):
        seen["seeds"] = seeds
        raise RuntimeError("stop")

    mp = pytest.MonkeyPatch()
    mp.setattr(fedcb2o_attack, "_run_variants", stop)
    mp.setattr(fedcb2o_attack, "_cb2o_builder", lambda *a, **k: None)
    mp.setattr(fedcb2o_attack, "_cb2o_cfg", lambda *a, **k: None)
    mp.setattr(fedcb2o_attack, "_oracle_builder", lambda *a, **k: None)
    try:
        for run in (fedcb2o_attack.run_tg_sweep,):
            with pytest.raises(RuntimeError, match="stop"):
                run(args)
            assert seen.pop("seeds") == 0
    finally:
        mp.undo()


def test_optimize_cbs_keeps_its_covariance_noise(capsys):
    """`--dynamic cbs` without `--noise` is CBS (covariance noise, its own default): the CLI's
    noise default used to be anisotropic for every dynamic, which made CBS take the CBO step."""
    import jax

    from cbo_jax import schedules
    from cbo_jax.dynamics.family import CBSConfig, cbs
    from cbo_jax.objectives import get_objective
    from cbo_jax.simulate import simulate

    argv = ["optimize", "--dynamic", "cbs", "--objective", "sphere", "--dim", "2", "--particles", "20",
            "--steps", "30", "--no-progress"]
    assert main(argv) == 0
    best = _last_json(capsys.readouterr().out)["best_energy"]
    cfg = CBSConfig(alpha=schedules.Multiplicative(30.0, 1.05, 1e5))
    assert cfg.noise == "covariance"
    k_init, k_run = jax.random.split(jax.random.key(0))
    x0 = jax.random.uniform(k_init, (1, 20, 2), minval=-3.0, maxval=3.0)
    res = simulate(cbs(get_objective("sphere"), cfg), x0, k_run, 30, num_runs=1, progress=False)
    assert best == float(res.state.best_energy.min())


def test_ctrl_c_is_one_line_and_exit_status_130(monkeypatch, capsys):
    """KeyboardInterrupt during a command ends it with one line on stderr, not a traceback."""
    from cbo_jax import cli

    def interrupted(args):
        raise KeyboardInterrupt

    parser = cli.build_parser()
    monkeypatch.setattr(cli, "build_parser", lambda: parser)
    for action in parser._subparsers._group_actions[0].choices.values():  # every command's function
        action.set_defaults(func=interrupted)
    assert cli.main(["optimize", "--no-progress"]) == 130
    err = capsys.readouterr().err
    # optimize cannot resume: no hint about --resume (that is `cbo-jax run`'s: tests/runtime/test_faults.py)
    assert err.strip().splitlines() == ["cbo-jax: interrupted"]


@pytest.mark.parametrize("extra,match", [
    (["--tensorboard"], "--tensorboard needs --output"),
    (["--log-every", "5"], "--log-every needs --output"),
    (["--overwrite"], "--overwrite needs --output"),  # was accepted without a word
    (["--alpha-schedule", "constant", "--alpha-factor", "1.1"], "--alpha-factor .* --alpha-schedule multiplicative"),
    (["--alpha-schedule", "constant", "--alpha-max", "10"], "--alpha-max .* multiplicative or ess"),
    (["--alpha-schedule", "ess", "--alpha-factor", "1.1"], "--alpha-factor .* --alpha-schedule multiplicative"),
    (["--ess-eta", "0.3"], "--ess-eta .* --alpha-schedule ess"),
])
def test_optimize_flags_that_would_be_ignored_are_refused(capsys, extra, match):
    # each was accepted and had no effect (no metrics written without --output; the factor of a
    # constant or adaptive α, the ESS target of a multiplicative one)
    assert main(["optimize", "--steps", "3", "--no-progress", *extra]) == 2
    assert re.search(match, capsys.readouterr().err)


@pytest.mark.parametrize("extra,match", [
    (["--seed", str(2**64)], "argument --seed: must be at most 2\\*\\*64 - 1"),
    (["--seed", str(-(2**63) - 1)], "argument --seed: must be >= "),
    (["--init-low=-inf"], "--init-low must be finite"),
    (["--init-high=1e39"], "--init-high = 1e\\+39 overflows float32"),
])
def test_optimize_seed_and_init_bounds_are_named(capsys, extra, match):
    # an out-of-range seed was an OverflowError traceback; non-finite bounds were "x0 has N non-finite entries"
    try:
        rc = main(["optimize", "--steps", "3", "--no-progress", *extra])
    except SystemExit as exit_:  # argparse's refusal
        rc = exit_.code
    assert rc == 2 and re.search(match, capsys.readouterr().err)


def test_optimize_an_objective_without_known_minimiser_in_that_dimension(tmp_path, capsys):
    # Michalewicz's minimiser is known in d = 2 only: the run went through, then failed computing the
    # distances to it ("cbo-jax: error: ..."), and its summary was never written
    assert main(["optimize", "--objective", "michalewicz", "--dim", "3", "--particles", "8", "--steps", "2",
                 "--no-progress", "--output", str(tmp_path / "m")]) == 0
    summary = _last_json(capsys.readouterr().out)
    assert summary["steps"] == 2 and np.isfinite(summary["best_energy"])
    assert summary["known_minimum"] is None and summary["consensus_distance_inf_median"] is None
    assert json.loads((tmp_path / "m" / "summary.json").read_text())["best_distance_inf_median"] is None


def test_optimize_seeds_beyond_32_bits_give_other_runs(tmp_path):
    # JAX without x64 keeps a seed's low 32 bits: --seed 4294967296 (2**32) was the run of --seed 0
    summaries = []
    for seed in ("0", str(2**32)):
        out = tmp_path / seed
        assert main(["optimize", "--objective", "sphere", "--dim", "2", "--particles", "8", "--runs", "1", "--steps",
                     "2", "--no-progress", "--seed", seed, "--output", str(out)]) == 0
        summaries.append(json.loads((out / "summary.json").read_text())["best_energy"])
    assert summaries[0] != summaries[1]


def test_optimize_rng_flag_is_the_library_layout(capsys):
    """``--rng per-particle`` runs ``CBOConfig(rng="per-particle")`` (the layout a sharded run
    with padding needs to equal the unsharded one); the summary names the layout."""
    import jax

    from cbo_jax import CBOConfig, cbo, schedules
    from cbo_jax.objectives import get_objective
    from cbo_jax.simulate import simulate

    argv = ["optimize", "--objective", "sphere", "--dim", "3", "--particles", "10", "--steps", "20", "--no-progress"]
    got = {}
    for rng in ("fast", "per-particle"):
        assert main(argv + ["--rng", rng]) == 0
        got[rng] = _last_json(capsys.readouterr().out)
        assert got[rng]["rng"] == rng
    cfg = CBOConfig(alpha=schedules.Multiplicative(30.0, 1.05, 1e5), rng="per-particle")
    k_init, k_run = jax.random.split(jax.random.key(0))
    x0 = jax.random.uniform(k_init, (1, 10, 3), minval=-3.0, maxval=3.0)
    res = simulate(cbo(get_objective("sphere"), cfg), x0, k_run, 20, num_runs=1, progress=False)
    assert got["per-particle"]["best_energy"] == float(res.state.best_energy.min())
    assert got["fast"]["best_energy"] != got["per-particle"]["best_energy"]


@pytest.mark.slow
def test_optimize_sharded_with_padding_equals_the_unsharded_run_per_particle(tmp_path):
    """N = 10 on 4 devices is padded to 12: with ``--rng per-particle`` the sharded run is the
    unsharded one; with the default layout it differs, and the command says so."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4", JAX_PLATFORMS="cpu")
    base = [sys.executable, "-m", "cbo_jax.cli", "optimize", "--objective", "sphere", "--dim", "3", "--particles", "10",
            "--steps", "30", "--no-progress"]

    def run(*extra):
        p = subprocess.run(base + list(extra), capture_output=True, text=True, env=env, check=True)
        return _last_json(p.stdout), p.stderr

    (plain, _), (sharded, _) = run("--rng", "per-particle"), run("--rng", "per-particle", "--shard")
    assert sharded["best_energy"] == pytest.approx(plain["best_energy"], rel=1e-5, abs=1e-9)
    _, err = run("--shard")
    assert "padded to a multiple of 4 devices" in err and "--rng per-particle" in err


def test_optimize_seeds_are_non_negative_and_each_its_own_key(capsys):
    """``--seed -1`` and ``--seed 4294967295`` were one key (JAX keeps a 32-bit seed's low word), as
    were ``-2**63`` and ``2**63``: 64 bits of key data cannot tell the 1.5 * 2**64 seeds of
    -2**63 .. 2**64 - 1 apart. ``--seed`` is 0 .. 2**64 - 1, each its own key (those below 2**32
    the keys they always were); a negative seed is refused."""
    import jax

    from cbo_jax import _checks
    from cbo_jax.cli import build_parser

    with pytest.raises(SystemExit) as exit_:
        main(["optimize", "--seed", "-1", "--no-progress"])
    assert exit_.value.code == 2 and "argument --seed: must be >= 0, got -1" in capsys.readouterr().err
    seeds = [0, 1, 2**31, 2**32 - 1, 2**32, 2**63, 2**64 - 1]
    keys = [tuple(jax.random.key_data(_checks.as_key("--seed", build_parser().parse_args(
        ["optimize", "--seed", str(s)]).seed)).tolist()) for s in seeds]
    assert len(set(keys)) == len(seeds)
    assert keys[:4] == [tuple(jax.random.key_data(jax.random.key(s)).tolist()) for s in seeds[:4]]


@pytest.mark.parametrize("argv", [
    ["optimize", "--steps", "99999999999999999999"],  # was accepted, and ran until killed
    ["optimize", "--steps", str(2**31)],
    ["reproduce", "fedcb2o-tg", "--T-G", str(2**31)],
])
def test_counts_beyond_int32_are_refused_naming_the_flag(argv, capsys):
    from cbo_jax.cli import build_parser

    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(argv)
    assert exit_.value.code == 2
    assert f"argument {argv[-2]}: must be at most 2**31 - 1 (JAX counts in int32)" in capsys.readouterr().err
    assert build_parser().parse_args(["optimize", "--steps", str(2**31 - 1)]).steps == 2**31 - 1


@pytest.mark.parametrize("extra,match", [
    # the configs' and schedules' field names: "factor must be > 0" named no flag
    (["--alpha-factor", "0"], "--alpha-factor must be > 0, got 0.0"),
    (["--alpha-max", "-1"], "--alpha-max must be >= 0"),
    (["--alpha-schedule", "ess", "--ess-eta", "2"], "--ess-eta must lie in"),
    (["--dt", "0"], "--dt must be > 0"),
    (["--dynamic", "cbs", "--sigma1", "-1"], "--sigma1 must be >= 0"),
    (["--diff-tol", "-1"], "--diff-tol must be >= 0"),
    (["--lambda1", "1e40"], r"--lambda1 = 1e\+40 overflows float32 .*--dtype float64"),
    (["--alpha-max", "1e40"], r"--alpha-max = 1e\+40 overflows float32 .*--dtype float64"),
    # blamed the objective ("NaN or infinite at every particle of x0")
    (["--shift", "1e40"], r"--shift = 1e\+40 overflows float32 .*--dtype float64"),
])
def test_optimize_errors_name_the_flag(capsys, extra, match):
    assert main(["optimize", "--steps", "2", "--dim", "2", "--particles", "4", "--no-progress", *extra]) == 2
    err = capsys.readouterr().err
    assert re.search(match, err) and err.count("\n") == 1, err
    assert "----" not in err  # "--sigma1" was written "----sigma1"


def test_optimize_flags_are_generated_from_the_configs():
    """optimize's flags are CBOConfig's fields (with its defaults; the noise's is each dynamic's own)
    and OptimizeOptions' fields, and nothing else."""
    import dataclasses

    from cbo_jax import CBOConfig
    from cbo_jax.cli import build_parser
    from cbo_jax.cli.optimize import DYNAMICS_FLAGS, OptimizeOptions

    parser = next(p for p in _parsers(build_parser()) if p.prog.endswith(" optimize"))
    dests = {a.dest for a in parser._actions if a.option_strings} - {"help"}
    options = {f.name for f in dataclasses.fields(OptimizeOptions)}
    assert dests == options | set(DYNAMICS_FLAGS) and not options & set(DYNAMICS_FLAGS)
    args = build_parser().parse_args(["optimize"])
    assert {k: getattr(args, k) for k in DYNAMICS_FLAGS if k != "noise"} == {
        k: getattr(CBOConfig(), k) for k in DYNAMICS_FLAGS if k != "noise"}
    assert args.noise is None
    assert OptimizeOptions(**{k: getattr(args, k) for k in options}) == OptimizeOptions()


@dataclasses.dataclass(frozen=True)
class _Shared:
    """Options two commands share.

    Attributes:
      count: how many (a 50 % share)
      where: the directory
    """

    count: int | None = option(None, metavar="N")
    where: str = "here"


@dataclasses.dataclass(frozen=True)
class _Command:
    """A command's options: a positional argument, the shared ones, a switch.

    Attributes:
      target: what to read
      shared: the shared options
      loud: say more
    """

    target: Path = option(positional=True)
    shared: _Shared = option(_Shared(), specs={"where": {"default": "there", "flags": ("-w",)}})
    loud: bool = False


def test_add_options_composes_shared_options_and_takes_positionals_and_metavars():
    """A field whose type is an options dataclass adds that class's flags unprefixed (its
    ``specs`` adjusting them); ``positional`` and ``metavar`` reach argparse; a description's
    ``%`` is text."""
    import argparse

    from cbo_jax.config import add_options

    p = argparse.ArgumentParser()
    dests = add_options(p, _Command)
    assert list(dests) == ["target", "count", "where", "loud"] and dests["where"].default == "there"
    assert vars(p.parse_args(["x"])) == {"target": Path("x"), "count": None, "where": "there", "loud": False}
    assert vars(p.parse_args(["x", "--count", "3", "-w", "y", "--loud"]))["count"] == 3
    text = p.format_help()
    assert "--count N" in text and "a 50 % share" in text and "--where WHERE, -w WHERE" in text
    assert "what to read" in text and "say more" in text


@pytest.mark.parametrize("argv", [
    ["optimize", "--step", "5"],  # an abbreviation of --steps, taken for it without a word
    ["run", "fedcbo", "--agent", "8"],  # of --agents
    ["reproduce", "cb2o-malicious", "--malicious", "0.1", "--part", "10"],
    ["--coord", "h:1", "optimize"],
])
def test_flags_are_not_abbreviated(argv, capsys):
    from cbo_jax.cli import build_parser

    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(argv)
    assert exit_.value.code == 2


@pytest.mark.parametrize("argv,wrong,nearest", [
    (["optimize", "--partcles", "10"], "--partcles", "--particles"),
    (["optimize", "--alpha-fator=1.1"], "--alpha-fator", "--alpha-factor"),
    (["run", "fedcbo", "--agent", "8"], "--agent", "--agents"),
    (["reproduce", "clustered-consensus", "--sed", "1"], "--sed", "--seed"),
])
def test_a_misspelt_flag_is_one_line_naming_the_nearest(argv, wrong, nearest, capsys):
    """argparse's answer was its usage and a bare "unrecognized arguments: --partcles 10"."""
    with pytest.raises(SystemExit) as exit_:
        main([*argv, "--no-progress"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "usage:" not in err, err
    assert f"unrecognized arguments: {wrong}" in err and f"did you mean {nearest}" in err, err


def test_the_progress_bar_says_compiling_until_the_first_steps_return(capsys):
    """The bar sat at 0 % without a word while XLA compiled the first chunk (~30 s for a large run)."""
    assert main(["optimize", "--objective", "sphere", "--dim", "2", "--particles", "4", "--steps", "3"]) == 0
    draws = [d for d in re.split(r"[\r\n]", capsys.readouterr().err) if "cbo sphere" in d]
    assert "compiling…" in draws[0] and "0/3" in draws[0], draws
    assert "compiling" not in draws[-1] and "3/3" in draws[-1], draws

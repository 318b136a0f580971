"""The defaults table of docs/getting_started.md against the code it describes: every number
and word of every cell, so the page cannot drift from the classes, the CLI and the presets."""

import argparse
import inspect
import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "getting_started.md"
NUMBER = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?(?:e-?\d+)?")  # not the 0 of x0


def _tables() -> dict[str, dict[str, list[str]]]:
    """The section's tables by their first header cell: row label -> the row's other cells."""
    if not DOC.is_file():
        pytest.skip("docs/ is not beside the tests (an installed package)")
    text = DOC.read_text().split("### Defaults: Python and the command line", 1)[1].split("\n## ", 1)[0]
    tables: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] | None = None
    for line in text.splitlines():
        if not line.startswith("|"):
            current = None
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if set(cells[0]) <= {"-", " "}:
            continue
        if current is None:
            current = tables.setdefault(cells[0], {})
        else:
            current[cells[0]] = cells[1:]
    return tables


def _numbers(cell: str) -> list[float]:
    return [float(x) for x in NUMBER.findall(cell.replace("^d", ""))]


def _optimize_defaults() -> argparse.Namespace:
    from cbo_jax.cli import build_parser

    return build_parser().parse_args(["optimize"])


def test_the_particle_table_is_the_code():
    import cbo_jax as cj
    from cbo_jax.minimize import minimize

    rows = _tables()["particle run"]
    cfg = cj.CBOConfig()
    opt = _optimize_defaults()
    sig = inspect.signature(minimize).parameters
    assert cfg.alpha == cj.schedules.Constant(1.0) and opt.alpha_schedule == "multiplicative"
    from cbo_jax.dynamics.cbo import CBOConfig

    want = {
        "λ1, σ1, dt": [[cfg.lambda1, cfg.sigma1, cfg.dt]] * 2 + [[opt.lambda1, opt.sigma1, opt.dt]],
        "α": [[cfg.alpha.alpha]] * 2 + [[opt.alpha, 1.05, 1e5]],  # the CLI's factor and cap when not given
        "particles N, dimension d": [[], [sig["num_particles"].default], [opt.particles, opt.dim]],
        "initial particles": [[], list(sig["init_bounds"].default), [opt.init_low, opt.init_high]],
        "steps, runs, seed": [[], [sig["num_steps"].default, 1, sig["key"].default], [opt.steps, opt.runs, opt.seed]],
    }
    for row, columns in want.items():
        assert [_numbers(c) for c in rows[row]] == columns, row
    assert opt.alpha_factor is None and opt.alpha_max is None  # so the 1.05 and 1e5 above apply
    noise = rows["noise, random numbers"]
    assert noise == [f"{cfg.noise}, {cfg.rng}"] * 2 + [f"{CBOConfig().noise}, {opt.rng}"]
    assert opt.noise is None  # the dynamic's own: CBO's
    assert "constant" in rows["α"][0] and "constant" in rows["α"][1]


def test_the_fedcbo_table_is_the_code():
    from cbo_jax.experiments import demo
    from cbo_jax.experiments.fedcbo_table1 import SCALES
    from cbo_jax.experiments.federated import RotatedMNISTConfig, RunOptions
    from cbo_jax.federated.algorithms.fedcbo import FedCBOConfig
    from cbo_jax.federated.local import LocalSGDConfig

    rows = _tables()["FedCBO run"]
    base, data, local, run = FedCBOConfig(), RotatedMNISTConfig(), LocalSGDConfig(), RunOptions()

    def column(data, fed, local, run):
        return {
            "agents N, rotations K, images per agent": [data.agents, data.clusters, data.samples_per_agent],
            "downloads M": [fed.M],
            "local epochs τ, batch, learning rate": [local.epochs, local.batch_size, local.lr],
            "λ1 γ, α": [round(fed.lambda1 * fed.gamma, 6), fed.alpha],
            "ε-greedy ε0, decay, floor": [fed.eps0, fed.eps_decay, fed.eps_min],
            "rounds, evaluated every": [run.rounds, run.eval_every],
        }

    def table1(name):
        s = SCALES[name]  # the preset builds the package's defaults with the scale's numbers (fedcbo_table1._configs)
        return column(RotatedMNISTConfig(agents=s.agents, samples_per_agent=s.samples_per_agent),
                      FedCBOConfig(M=s.M), LocalSGDConfig(epochs=s.epochs),
                      RunOptions(rounds=s.rounds, eval_every=min(s.eval_every, s.rounds)))

    columns = [column(data, base, local, run),
               column(data, base, local, run),  # `cbo-jax run fedcbo`: the classes' defaults (checked below)
               column(demo.DATA, demo.FEDCBO, demo.LOCAL, demo.RUN),
               table1("small"), table1("paper")]
    for row in columns[0]:
        assert [_numbers(c) for c in rows[row]] == [[float(v) for v in col[row]] for col in columns], row
    from cbo_jax.cli.flags import config_from_args
    from cbo_jax.cli import build_parser

    args = build_parser().parse_args(["run", "fedcbo"])
    cfg = config_from_args("fedcbo", args, args.run_flags)
    assert (cfg.config, cfg.data, cfg.run) == (base, data, run) and cfg.config.local == local

"""The ``cbo-jax`` command.

    cbo-jax optimize --objective rastrigin --dim 20 [options]
    cbo-jax run fedcbo|fedavg|ifca|local [options | --config FILE]   (--help: the algorithm's options)
    cbo-jax demo [--rounds R]
    cbo-jax --version
    cbo-jax reproduce --list
    cbo-jax reproduce NAME [options]                                  (--help: its options)
    cbo-jax report RESULTS_DIR [--format html|md] [-o FILE]

``reproduce`` prints, as its very last line, one JSON object with the measured
numbers, and saves it under ``--output`` (default ``results/NAME/summary.json``).
Progress bars go to standard error.
"""

from __future__ import annotations

import argparse
import json
import math
import contextlib
import os
import signal
import sys
import threading
import time
from pathlib import Path

from cbo_jax.experiments import jax_seed as _seed  # one argparse type for JAX-only seeds
from cbo_jax.experiments import nonnegative_int as _nonnegative_int
from cbo_jax.experiments import positive_int as _positive_int  # one argparse type for counts


class _Defaults(argparse.HelpFormatter):
    """Help that shows an option's default where it has one to show (not ``None`` or a switch's
    ``False``) and its help does not state it already."""

    def _get_help_string(self, action):
        text = action.help or ""
        default = action.default
        shown = not (default is None or default is False or default is argparse.SUPPRESS)  # 0 and 0.0 are shown
        if action.option_strings and shown and "default" not in text:
            text += " (default: %(default)s)"
        return text
from cbo_jax.experiments import seed as _run_seed  # a run's seed (NumPy and JAX): 0 .. 2**32 - 1


class _Parser(argparse.ArgumentParser):
    """The command's parsers; argparse makes every sub-command's parser of its parent's class.

    Flags are written in full: argparse took a prefix (``--agent``) for the flag it begins
    (``--agents``) without a word. An unknown flag is one line naming the nearest flags of the
    sub-command (argparse printed its usage and a bare "unrecognized arguments"); exit status 2."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def parse_known_args(self, args=None, namespace=None):
        namespace, extras = super().parse_known_args(args, namespace)
        flags = [a for a in extras if a.startswith("-") and len(a) > 1 and not _is_number(a)]
        if flags:
            self._unrecognized(flags, namespace)
        return namespace, extras

    def _unrecognized(self, flags: list[str], namespace) -> None:
        import difflib

        parser: argparse.ArgumentParser = self  # the innermost parser the command line chose
        while True:
            subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
            name = getattr(namespace, subs[0].dest, None) if subs else None
            if not subs or name not in subs[0].choices:
                break
            parser = subs[0].choices[name]
        known = sorted({o for a in parser._actions for o in a.option_strings})
        named = []
        for flag in flags:
            close = difflib.get_close_matches(flag.split("=", 1)[0], known, n=3)
            named.append(flag.split("=", 1)[0] + (f" (did you mean {' or '.join(close)}?)" if close else ""))
        self.exit(2, f"{parser.prog}: error: unrecognized arguments: {', '.join(named)}; `{parser.prog} --help` "
                     f"lists the options\n")


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _add_optimize(sub) -> None:
    from cbo_jax.mirror_maps import MIRROR_MAPS
    from cbo_jax.objectives import OBJECTIVES

    p = sub.add_parser("optimize", help="minimise a test objective with CBO", formatter_class=_Defaults,
                       description="Minimise a batched test objective with CBO (FedCBO eq. (4)/(15) with one objective).")
    p.add_argument("--objective", default="rastrigin", choices=sorted(OBJECTIVES), help="the test function")
    p.add_argument("--dim", type=_positive_int, default=20, help="dimension d")
    p.add_argument("--shift", type=float, default=0.0, help="move the minimiser by this amount in every coordinate")
    p.add_argument("--particles", "-N", type=_positive_int, default=100, help="particles per run N")
    p.add_argument("--runs", "-M", type=_positive_int, default=1, help="independent runs, vmapped")
    p.add_argument("--steps", type=_nonnegative_int, default=2000,
                   help="steps of the Euler–Maruyama scheme (at most 2**31 - 1)")
    p.add_argument("--dt", type=float, default=0.01, help="time step dt")
    p.add_argument("--lambda1", type=float, default=1.0, help="consensus drift λ1")
    p.add_argument("--sigma1", type=float, default=1.0, help="consensus noise σ1")
    p.add_argument("--dynamic", default="cbo",
                   choices=["cbo", "cbo_memory", "pso", "cbs", "polar_cbo", "adam_cbo", "mirror_cbo"],
                   help="the CBX-family dynamic (docs/guides/cbx_family.md; the constrained ones take constraint "
                        "functions: Python API); default cbo")
    p.add_argument("--mirror-map", default=None, choices=sorted(set(MIRROR_MAPS) - {"None"}),
                   help="with --dynamic mirror_cbo: the mirror map, with its default parameters (default L2); "
                        "initial particles outside its admissible set (--init-low/--init-high) move into it at "
                        "the first step, as in CBXpy, and are not counted as best points")
    p.add_argument("--noise", default=None,
                   choices=["anisotropic", "isotropic", "constant", "covariance", "none"],
                   help="the noise model (default: the dynamic's own; anisotropic for cbo, covariance for cbs)")
    p.add_argument("--lambda2", type=float, default=0.0, help="gradient drift λ2")
    p.add_argument("--sigma2", type=float, default=0.0, help="gradient noise σ2")
    p.add_argument("--alpha", type=float, default=30.0, help="α (initial α for schedules)")
    p.add_argument("--alpha-schedule", default="multiplicative", choices=["constant", "multiplicative", "ess"],
                   help="how α changes over the steps")
    p.add_argument("--alpha-factor", type=float, default=None,
                   help="α's factor per step for --alpha-schedule multiplicative (default 1.05)")
    p.add_argument("--alpha-max", type=float, default=None,
                   help="α's cap for --alpha-schedule multiplicative or ess (default 1e5)")
    p.add_argument("--ess-eta", type=float, default=None,
                   help="target effective sample size share for --alpha-schedule ess (default 0.5)")
    p.add_argument("--init-low", type=float, default=-3.0, help="lower bound of the uniform initial particles")
    p.add_argument("--init-high", type=float, default=3.0, help="upper bound of the uniform initial particles")
    p.add_argument("--energy-tol", type=float, default=None, help="stop a run once its best energy is below this")
    p.add_argument("--diff-tol", type=float, default=None,
                   help="stop a run once its consensus point moves less than this in a step")
    p.add_argument("--dtype", default="float32", choices=["float32", "float64"], help="floating-point precision")
    p.add_argument("--seed", type=_seed, default=0,
                   help="seed of the initial particles and the noise (0 to 2**64 - 1, each its own key)")
    p.add_argument("--output", type=Path, default=None,
                   help="directory for summary.json, config.json (every setting), history.npz and metrics.jsonl "
                        "(one row per logged step)")
    p.add_argument("--overwrite", action="store_true", help="replace the results already in OUTPUT")
    p.add_argument("--tensorboard", action="store_true", help="also write TensorBoard event files to OUTPUT "
                   "(needs --output)")
    p.add_argument("--log-every", type=_positive_int, default=None,
                   help="steps between rows of OUTPUT/metrics.jsonl (needs --output; default: about 1000 rows)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar (the results are the same)")
    p.add_argument("--shard", action="store_true",
                   help="split the particles over all devices (of all processes in a multi-process run); when "
                        "N is not a multiple of the device count the population is padded, and only --rng "
                        "per-particle then gives the unsharded run's numbers")
    p.add_argument("--rng", default="fast", choices=["fast", "partitionable", "per-particle"],
                   help="the noise's random-number layout (CBOConfig.rng): fast (default), partitionable, or "
                        "per-particle (a particle's noise does not depend on N or on padding)")
    p.set_defaults(func=_cmd_optimize)


def _median_distance(points, mins) -> float | None:
    """Median over points of the ∞-norm distance to the nearest known global minimiser (``None``: unknown)."""
    import numpy as np

    if mins is None:
        return None
    dim = np.shape(mins)[-1]
    pts = np.asarray(points, np.float64).reshape(-1, dim)
    return float(np.median(np.min(np.max(np.abs(pts[:, None, :] - mins[None]), axis=-1), axis=1)))


def _cmd_optimize(args) -> int:
    if args.dtype == "float64":
        import jax

        jax.config.update("jax_enable_x64", True)
    import jax
    import numpy as np

    from cbo_jax.objectives import get_objective
    from cbo_jax.simulate import simulate

    from cbo_jax import _checks

    # non-finite or float32-overflowing bounds were reported as "x0 has N non-finite entries", a shift
    # as "the objective is NaN or infinite at every particle"
    try:
        for flag, value in (("--init-low", args.init_low), ("--init-high", args.init_high), ("--shift", args.shift)):
            _checks.finite_number(flag, value, f32=args.dtype == "float32")
        _checks.non_negative("--alpha", args.alpha, f32=args.dtype == "float32")  # was named alpha0, the config's field
    except ValueError as err:
        raise _named_by_flag(err) from None
    if not args.init_low < args.init_high:
        raise ValueError(f"--init-low ({args.init_low}) must be below --init-high ({args.init_high})")
    # Flags of a schedule other than the one chosen were accepted and had no effect; so were
    # --tensorboard and --log-every without --output (nothing is written).
    uses = {"--alpha-factor": ("multiplicative",), "--alpha-max": ("multiplicative", "ess"), "--ess-eta": ("ess",)}
    for flag, schedules_using in uses.items():
        if getattr(args, flag[2:].replace("-", "_")) is not None and args.alpha_schedule not in schedules_using:
            raise ValueError(f"{flag} applies to --alpha-schedule {' or '.join(schedules_using)} only "
                             f"(got --alpha-schedule {args.alpha_schedule})")
    for flag, given in (("--tensorboard", args.tensorboard), ("--log-every", args.log_every is not None),
                        ("--overwrite", args.overwrite)):
        if given and args.output is None:
            raise ValueError(f"{flag} needs --output DIR (the metrics are written there)")
    try:
        cfg = _optimize_config(args)
    except ValueError as err:  # named the configs' fields: "factor must be > 0" for --alpha-factor 0
        raise _named_by_flag(err) from None
    objective = get_objective(args.objective, shift=args.shift)
    # Asked before the run: an objective whose minimiser is not known in this dimension (Michalewicz in
    # d = 3) failed after the whole run, without a summary; its distances and minimum are null instead.
    known: tuple[np.ndarray | None, float | None]
    try:
        known = np.asarray(objective.minimisers(args.dim), np.float64), objective.minimum(args.dim)
    except ValueError:
        known = None, None
    k_init, k_run = jax.random.split(_checks.as_key("--seed", args.seed))
    shape = (args.runs, args.particles, args.dim)
    # the particles, their copy in the state, the noise and the step's temporaries: about six arrays
    _checks.memory_fits(f"{args.runs} x {args.particles} particles in d={args.dim}",
                        6 * math.prod(shape) * np.dtype(args.dtype).itemsize / (jax.device_count() if args.shard else 1))
    x0 = jax.random.uniform(k_init, shape, jax.numpy.dtype(args.dtype), args.init_low, args.init_high)
    from cbo_jax import sharding
    from cbo_jax.runtime import distributed

    mesh = sharding.agent_mesh() if args.shard else None
    main_process = distributed.is_main()
    if mesh is not None and args.particles % mesh.size and args.rng != "per-particle" and main_process:
        print(f"note: N={args.particles} is padded to a multiple of {mesh.size} devices, so the noise differs from "
              f"an unsharded run's; --rng per-particle gives the same numbers", file=sys.stderr)
    if args.output is not None and main_process:
        from cbo_jax.runtime.results import ResultsDir

        # Before the simulation: an unusable or occupied output directory is an error now.
        with ResultsDir(args.output, overwrite=args.overwrite, resumable=False,
                        owned=("summary.json", "config.json", "history.npz", "metrics.jsonl",
                               "events.out.tfevents.*")):
            pass
    from cbo_jax.dynamics.family import DYNAMICS

    res = simulate(DYNAMICS[args.dynamic](objective, cfg), x0, k_run, args.steps, num_runs=args.runs,
                   progress=not args.no_progress and main_process, desc=f"{args.dynamic} {args.objective}", mesh=mesh,
                   out=args.output, log_every=args.log_every, tensorboard=args.tensorboard)
    best_x = distributed.to_host(res.state.best_x).astype(np.float64)
    cons = distributed.to_host(res.state.consensus).astype(np.float64)
    best_e = distributed.to_host(res.state.best_energy).astype(np.float64)
    summary = {
        "dynamic": args.dynamic,
        "objective": args.objective,
        "dim": args.dim,
        "particles": args.particles,
        "runs": args.runs,
        "steps": res.steps,
        "rng": args.rng,
        "best_energy": float(best_e.min()),
        "best_energy_per_run_median": float(np.median(best_e)),
        "consensus_distance_inf_median": _median_distance(cons, known[0]),
        "best_distance_inf_median": _median_distance(best_x, known[0]),
        "known_minimum": known[1],
        "seconds": round(res.seconds, 3),
        "particle_steps_per_s": args.runs * args.particles * res.steps / max(res.seconds, 1e-9),
    }
    if args.dynamic == "mirror_cbo":
        from cbo_jax.mirror_maps import get_mirror_map

        summary["mirror_map"] = get_mirror_map(args.mirror_map).name
    if not main_process:
        return 0
    best_run = int(np.argmin(best_e))
    coords = ", ".join(f"{v:.4g}" for v in best_x[best_run][:6]) + (", ..." if args.dim > 6 else "")
    minimum = "not known" if known[1] is None else f"{known[1]:.6g}"
    print(f"objective      {args.objective} (d={args.dim}, known minimum {minimum})")
    print(f"particles      N={args.particles} x M={args.runs} runs, {res.steps} steps, dt={args.dt}")
    print(f"best energy    {summary['best_energy']:.6g} (run {best_run}); median over runs {summary['best_energy_per_run_median']:.6g}")
    print(f"best particle  [{coords}]")
    if known[0] is not None:
        print(f"|m - x*|_inf   median over runs {summary['consensus_distance_inf_median']:.3g}")
    print(f"time           {res.seconds:.2f} s incl. compilation ({summary['particle_steps_per_s']:.3g} particle-steps/s)")
    if args.output is not None:
        args.output.mkdir(parents=True, exist_ok=True)
        import io

        from cbo_jax.runtime.writer import replace_bytes, replace_text, write_summary

        write_summary(args.output / "summary.json", summary)
        replace_text(args.output / "config.json", json.dumps(_optimize_record(args, cfg), indent=2) + "\n")
        # "step": the step of each row (1..steps), the time axis metrics.jsonl's rows carry
        buf = io.BytesIO()  # written as the other files are: whole, never through a link in its place
        np.savez(buf, step=np.arange(1, res.steps + 1), **res.history, best_x=best_x, consensus=cons)
        replace_bytes(args.output / "history.npz", buf.getvalue())
        print(f"saved          {args.output}/summary.json, config.json, history.npz, metrics.jsonl")
    print(json.dumps(_json_safe(summary)))
    return 0


# The configs' and schedules' fields that optimize's flags set, as their errors name them
_OPTIMIZE_FLAGS = {"alpha0": "--alpha", "factor": "--alpha-factor", "alpha_max": "--alpha-max", "eta": "--ess-eta",
                   "dt": "--dt", "lambda1": "--lambda1", "sigma1": "--sigma1", "lambda2": "--lambda2",
                   "sigma2": "--sigma2", "energy_tol": "--energy-tol", "diff_tol": "--diff-tol"}


def _named_by_flag(err: ValueError) -> ValueError:
    """``err`` with the field it names (``factor``, ``alpha.alpha_max``) written as optimize's flag,
    and float32's overflow answered with ``--dtype float64``."""
    import re

    text = str(err)
    field = re.match(r"(?:alpha\.)?(\w+)(?= )", text)
    if field is not None and field.group(1) in _OPTIMIZE_FLAGS:
        text = _OPTIMIZE_FLAGS[field.group(1)] + text[field.end():]
        # the other fields it names (an identifier, not a word of the sentence: alpha0, not factor)
        text = re.sub(r"\b(?:alpha\.)?(\w+_\w+|\w+\d)\b",
                      lambda m: _OPTIMIZE_FLAGS.get(m.group(1), m.group(0)), text)
    if "overflows float32" in text:
        text = text.replace("dtype='float64'", "--dtype float64")
        if "--dtype float64" not in text:
            text += "; --dtype float64 computes in float64"
    return ValueError(text) if text != str(err) else err


def _optimize_config(args):
    """The dynamics' config of ``cbo-jax optimize``'s flags."""
    from cbo_jax import schedules
    from cbo_jax.dynamics.cbo import CBOConfig

    alpha_factor = 1.05 if args.alpha_factor is None else args.alpha_factor
    alpha_max = 1e5 if args.alpha_max is None else args.alpha_max
    alpha: schedules.Constant | schedules.Multiplicative | schedules.EffectiveSampleSize
    if args.alpha_schedule == "constant":
        alpha = schedules.Constant(args.alpha)
    elif args.alpha_schedule == "multiplicative":
        alpha = schedules.Multiplicative(args.alpha, alpha_factor, alpha_max)
    else:
        alpha = schedules.EffectiveSampleSize(eta=0.5 if args.ess_eta is None else args.ess_eta, alpha0=args.alpha,
                                              alpha_max=alpha_max)
    common = dict(lambda1=args.lambda1, sigma1=args.sigma1, dt=args.dt, alpha=alpha,
                  energy_tol=args.energy_tol, diff_tol=args.diff_tol, dtype=args.dtype, rng=args.rng)
    if args.noise is not None:  # else the dynamic's own default (CBS's covariance noise is what makes it CBS)
        common["noise"] = args.noise
    if args.mirror_map is not None and args.dynamic != "mirror_cbo":
        raise ValueError(f"--mirror-map needs --dynamic mirror_cbo (got --dynamic {args.dynamic})")
    if args.dynamic == "mirror_cbo":
        common["mirror_map"] = args.mirror_map
    if args.dynamic == "cbo":
        cfg = CBOConfig(lambda2=args.lambda2, sigma2=args.sigma2, **common)
    else:
        from cbo_jax.dynamics.family import CONFIGS

        if args.lambda2 or args.sigma2:
            raise ValueError("--lambda2/--sigma2 (gradient terms) are only available with --dynamic cbo")
        cfg = CONFIGS[args.dynamic](**common)
    return cfg


def _optimize_record(args, cfg) -> dict:
    """``config.json`` of an ``optimize`` run: every option as given or defaulted (rerunning them
    repeats the run) and the dynamics' resolved configuration, every number of it, with the α
    schedule and the mirror map named."""
    from cbo_jax.runtime.writer import describe

    options = {k: describe(v) for k, v in vars(args).items() if k not in ("func", "command") and not callable(v)}
    return _json_safe({"command": "optimize", "options": options, "dynamics": {"name": args.dynamic, **describe(cfg)}})


def _add_run(sub) -> None:
    from cbo_jax.experiments.federated import ALGORITHMS, add_run_arguments

    p = sub.add_parser("run", help="run one federated algorithm on rotated MNIST",
                       description="Run FedCBO or a baseline on rotated MNIST and write a results directory "
                                   "(config.json, metrics.jsonl, summary.json, metrics.png). `cbo-jax run ALGORITHM "
                                   "--help` lists the algorithm's options; they override --config.")
    algs = p.add_subparsers(dest="algorithm", required=True, metavar="ALGORITHM")
    for name in ALGORITHMS:
        q = algs.add_parser(name, help=f"run {name}", description=f"Run {name} on rotated MNIST. Options override "
                            "--config; nested options are written section.field (--local.lr).")
        q.add_argument("--config", type=Path, default=None,
                       help="JSON file of options: nested as config.json records them, or flat names")
        q.add_argument("--output", type=Path, default=None, help="results directory (default results/run-ALGORITHM)")
        q.add_argument("--no-progress", action="store_true", help="no progress bar (the results are the same)")
        q.add_argument("--resume", action="store_true",
                       help="continue from OUTPUT/checkpoint (written with --checkpoint-every N) when it exists; "
                            "refused when the checkpoint belongs to another configuration, seed or data")
        q.add_argument("--extend", action="store_true",
                       help="with --resume: allow another --rounds (more; or fewer, down to the checkpoint's round)")
        q.add_argument("--overwrite", action="store_true", help="replace the results already in OUTPUT")
        q.add_argument("--shard", action="store_true",
                       help="split the agents over all devices (any N: padded with inactive agents, dropped from the "
                            "results)")
        q.set_defaults(func=_cmd_run, run_flags=add_run_arguments(q, name))


def _cmd_run(args) -> int:
    from cbo_jax.experiments.federated import config_from_args, run_experiment

    if args.extend and not args.resume:  # was ignored: a new run of the extended length over the old one
        raise ValueError("--extend continues a run: it needs --resume")
    if args.resume and args.overwrite:  # --overwrite was ignored: the run resumed
        raise ValueError("--resume continues the results in OUTPUT and --overwrite replaces them: give one of them")
    cfg = config_from_args(args.algorithm, args, args.run_flags)
    out = args.output or Path("results") / f"run-{args.algorithm}"
    from cbo_jax import sharding

    res = run_experiment(cfg, out, progress=not args.no_progress, resume=args.resume, extend=args.extend,
                         overwrite=args.overwrite, mesh=sharding.agent_mesh() if args.shard else None)
    s = res.summary
    print(f"{s['algorithm']}: mean test accuracy {s['final_test_acc']:.2f}% after {s['rounds']} rounds "
          f"({s['num_agents']} agents, {s['num_clusters']} clusters, {s['seconds']:.0f} s)")
    if "final_sr" in s:
        print(f"successful selection rate {s['final_sr']:.3f} (oracle {s['final_sr_oracle']:.3f})")
    print(f"results in {out}/")
    print(json.dumps(_json_safe(s)))
    return 0


def _add_demo(sub) -> None:
    p = sub.add_parser("demo", help="FedCBO vs FedAvg, IFCA and local training on the bundled MNIST subset",
                       description="A small rotated-MNIST comparison on the real-MNIST subset shipped with the package "
                                   "(offline, about 2 minutes on 2 CPU cores).")
    p.add_argument("--output", type=Path, default=Path("results") / "demo",
                   help="directory of the four runs, OUTPUT/fedcbo, ... (default results/demo); a later demo replaces "
                        "them, never another command's run")
    p.add_argument("--seed", type=_run_seed, default=0, help="seed of the algorithms' randomness (0 to 2**32 - 1)")
    p.add_argument("--rounds", type=_positive_int, default=None,
                   help="communication rounds (default 15); e.g. --rounds 2 for a quick check that everything runs")
    p.add_argument("--no-progress", action="store_true", help="no progress bar (the results are the same)")
    p.set_defaults(func=_cmd_demo)


def _cmd_demo(args) -> int:
    from cbo_jax.experiments.demo import run_demo

    result = run_demo(args.output, seed=args.seed, progress=not args.no_progress, rounds=args.rounds)
    print(json.dumps(_json_safe(result)))
    return 0


def _add_reproduce(sub) -> None:
    from cbo_jax.experiments import registry

    p = sub.add_parser("reproduce", help="run a named reproduction of a published result",
                       description="Run a named, configured reproduction; the last line printed is one JSON object. "
                                   "`cbo-jax reproduce NAME --help` lists that reproduction's options.")
    p.add_argument("--list", action="store_true",
                   help="list the reproductions: published number, the repository's measurement, your last run")
    p.add_argument("--results-root", type=Path, default=Path("results"),
                   help="where --list looks for your last runs (RESULTS_ROOT/NAME/summary.json; default results)")
    names = p.add_subparsers(dest="name", metavar="NAME")
    for exp in registry().values():
        # argparse %-formats help strings (not descriptions): a summary's "20%" must be escaped.
        q = names.add_parser(exp.name, help=exp.summary.replace("%", "%%"),
                             description=f"{exp.summary}. Published: {exp.published}")
        q.add_argument("--output", type=Path, default=None, help="results directory (default results/NAME)")
        q.add_argument("--overwrite", action="store_true", help="replace the results already in OUTPUT")
        if exp.resumable:
            q.add_argument("--resume", action="store_true",
                           help="continue a reproduction stopped part-way in OUTPUT, with the same options: its "
                                "finished runs are read back, an unfinished one continues from its last checkpoint "
                                "(--checkpoint-every) or starts again")
            q.add_argument("--checkpoint-every", type=_positive_int, default=None, metavar="ROUNDS",
                           help="checkpoint each run every ROUNDS rounds (OUTPUT/RUN/seedS/checkpoint), so that "
                                "--resume continues it from there")
        q.add_argument("--no-progress", action="store_true", help="no progress bar (the results are the same)")
        exp.add_arguments(q)
    p.set_defaults(func=_cmd_reproduce)


# Options of a reproduction that change how it runs, not what it computes: a resume may change them.
# --seeds may grow (or shrink): each seed's runs have their own directories, read back when they exist.
# Where the data is read from may change (another machine): each run's fingerprint holds the data's hash.
_HOW = {"coordinator", "num_processes", "process_id", "startup_timeout", "command", "list", "results_root",
        "func", "output", "overwrite", "resume", "checkpoint_every", "no_progress", "shard", "seeds", "source",
        "data_dir"}


def _check_options(out_dir: Path, args, resume: bool):
    """The reproduction's options recorded in ``OUTPUT/options.json``; on ``--resume``, other
    options than those recorded are refused, by flag, before any run (the runs' own checks
    name ``cbo-jax run``'s flags and derived fields such as ``--eval-every``). Returns the
    writer of the record when it is written after the runs (a resume of a directory
    without one), else ``None``."""
    from cbo_jax.runtime.writer import replace_text, stable_text

    now = json.loads(json.dumps(_json_safe({k: v for k, v in vars(args).items() if k not in _HOW}), default=stable_text))
    path = out_dir / "options.json"

    def write() -> None:
        replace_text(path, json.dumps(now, indent=1) + "\n")

    if resume:
        try:
            saved = json.loads(path.read_text())
        except (OSError, ValueError):  # none (or cut short): the runs' checks decide, the record follows them
            return write
        if isinstance(saved, dict):
            if saved.get("name") != now.get("name"):  # fedcbo-table1 and fedcbo-noise take the same options
                raise ValueError(f"cannot resume {out_dir}: it holds the reproduction {saved.get('name')!r} "
                                 f"({path}), not {now.get('name')!r}")
            diffs = [f"--{k.replace('_', '-')}: {saved[k]!r} in {path}, {now.get(k)!r} now"
                     for k in sorted(set(saved) | set(now)) if saved.get(k) != now.get(k)]
            if diffs:
                raise ValueError(f"cannot resume {out_dir}: it was started with other options (a reproduction "
                                 f"resumes with the options it was started with; --seeds may change):\n  "
                                 + "\n  ".join(diffs))
    write()
    return None


def _cmd_reproduce(args) -> int:
    from cbo_jax.experiments import registry

    if args.list or args.name is None:
        from cbo_jax.experiments.catalog import format_list

        print(format_list(args.results_root))
        return 0 if args.list else 2
    from cbo_jax.runtime.results import ResultsDir

    exp = registry()[args.name]
    resume = getattr(args, "resume", False)
    if resume and args.overwrite:
        raise ValueError("--resume continues the results in OUTPUT and --overwrite replaces them: give one of them")
    out_dir = args.output or Path("results") / exp.name
    args.output = out_dir
    t0 = time.perf_counter()
    # the whole directory is this reproduction's
    with ResultsDir(out_dir, resume=resume, overwrite=args.overwrite, owned=None, resumable=exp.resumable):
        options = _check_options(out_dir, args, resume) if exp.resumable else None
        try:
            result = exp.run(args)
        except BaseException:
            # Stopped before any run wrote a thing (bad data, a typo in --data-dir): the record
            # alone would make the corrected command a "resume" of nothing, refused.
            rest = [p for p in out_dir.iterdir() if p.name not in ("options.json", ".lock")]
            if exp.resumable and not resume and not rest:
                (out_dir / "options.json").unlink(missing_ok=True)
            raise
        if options is not None:  # after the runs: a resume of a directory without the record wrote none before
            options()
        elif not exp.resumable:  # the record of what ran (reproduce --list names the options that differ)
            _check_options(out_dir, args, False)
        result.setdefault("wall_seconds", round(time.perf_counter() - t0, 2))
        if resume:  # wall_seconds is this command's: the runs read back cost nothing here
            result["resumed"] = True
        from cbo_jax.runtime.writer import write_summary

        write_summary(out_dir / "summary.json", result)
    print(f"saved {out_dir / 'summary.json'}", file=sys.stderr)
    print(json.dumps(_json_safe(result)))
    return 0


def _add_report(sub) -> None:
    p = sub.add_parser("report", help="render a results directory to one HTML or Markdown file",
                       description="Render every summary.json, metrics.jsonl and plot under RESULTS_DIR into one "
                                   "report: tables, comparison tables across runs, curves. HTML is self-contained; "
                                   "Markdown writes its images to <report>_files/.")
    p.add_argument("results_dir", type=Path, help="a directory written by demo, run or reproduce")
    p.add_argument("--format", choices=("html", "md"), default=None,
                   help="report format (default: from --output's suffix, else html)")
    p.add_argument("-o", "--output", type=Path, default=None,
                   help="report file, or an existing directory to write report.html/.md in "
                        "(default RESULTS_DIR/report.html or .md)")
    p.set_defaults(func=_cmd_report)


def _cmd_report(args) -> int:
    from cbo_jax.runtime.report import render

    try:
        path = render(args.results_dir, args.output, args.format)
    except (FileNotFoundError, ValueError) as err:
        print(f"cbo-jax report: {err}", file=sys.stderr)
        return 2
    print(path)
    return 0


def _json_safe(obj):
    """Valid JSON: non-finite floats become null (never a bare NaN)."""
    from cbo_jax.runtime.writer import json_safe, to_python

    return json_safe(to_python(obj))


def _maybe_initialize_distributed(args) -> None:
    from cbo_jax.runtime import distributed

    env = distributed.from_env()
    if args.coordinator is None and env is None:
        if args.num_processes or args.process_id is not None:
            raise ValueError("--num-processes/--process-id need --coordinator HOST:PORT")
        return
    addr, nproc, pid = env if env is not None else ("", 1, 0)
    addr = args.coordinator or addr  # set: without it and without the variables we returned above
    nproc = args.num_processes or nproc
    pid = args.process_id if args.process_id is not None else pid
    distributed.initialize(addr, nproc, pid, timeout=args.startup_timeout)


def build_parser() -> argparse.ArgumentParser:
    from cbo_jax import __version__

    parser = _Parser(prog="cbo-jax", description="JAX-vectorised consensus-based optimization.")
    parser.add_argument("--version", action="version", version=f"cbo-jax {__version__}")
    multi = parser.add_argument_group("multi-process (see cbo_jax.runtime.distributed)")
    multi.add_argument("--coordinator", default=None, metavar="HOST:PORT",
                       help="coordinator of a multi-process run (also $CBO_JAX_COORDINATOR)")
    multi.add_argument("--num-processes", type=_positive_int, default=None, help="processes in the run")
    multi.add_argument("--process-id", type=int, default=None, help="this process's id, 0..P-1")
    multi.add_argument("--startup-timeout", type=_positive_int, default=120, metavar="SECONDS",
                       help="wait at most this long for all processes to join (default 120)")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_optimize(sub)
    _add_run(sub)
    _add_demo(sub)
    _add_reproduce(sub)
    _add_report(sub)
    return parser


class _Terminated(KeyboardInterrupt):
    """SIGTERM (a batch scheduler's or a notebook host's stop), raised like Ctrl-C: the
    run's ``finally`` blocks close its files, and the command exits with one line."""


def _raise_terminated(signum, frame):
    raise _Terminated


@contextlib.contextmanager
def _sigterm_as_interrupt():
    """SIGTERM handled like Ctrl-C while the command runs (the default killed the process
    mid-write with no message); the handler before is restored after. Only the main thread
    can set handlers: elsewhere (``main`` called from a worker thread) nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:  # None: the handler before was set from C, not restorable; the default then
        signal.signal(signal.SIGTERM, before if before is not None else signal.SIG_DFL)


def main(argv: list[str] | None = None) -> int:
    with _sigterm_as_interrupt():
        return _main(argv)


def _main(argv: list[str] | None) -> int:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    args = None
    try:
        # Ctrl-C while the parser imports JAX and the experiments was a traceback through the imports
        args = build_parser().parse_args(argv)
        from cbo_jax.runtime import provenance

        _maybe_initialize_distributed(args)
        from cbo_jax.runtime import compilation_cache

        compilation_cache.enable()  # compiled programs reused by the next run (CBO_JAX_COMPILATION_CACHE=0: off)
        # summary.json records this command line (also when main() is called from Python)
        with provenance.command(["cbo-jax", *(sys.argv[1:] if argv is None else argv)]):
            return args.func(args)
    except ValueError as err:  # bad input, including DataError from the loaders
        print(f"cbo-jax: error: {err}", file=sys.stderr)
        return 2
    except OSError as err:  # a full disk or quota: one line naming the path and the space, not a traceback
        from cbo_jax.runtime.results import FULL, full_message

        if err.errno not in FULL:
            raise
        command = getattr(args, "command", None)
        resumable = command == "run" or (command == "reproduce" and hasattr(args, "resume"))
        hint = "; free some space (or choose another --output), then --resume continues the run" if resumable else ""
        print(f"cbo-jax: error: {full_message(err, getattr(args, 'output', None))}{hint}", file=sys.stderr)
        return 2
    except RuntimeError as err:  # --on-diverged stop: the run stopped at a NaN; one line, status 1
        from cbo_jax.federated.runner import DivergedError

        if not isinstance(err, DivergedError):
            raise
        print(f"cbo-jax: error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as err:  # Ctrl-C or SIGTERM: one line, not a traceback through JAX's internals
        # `cbo-jax run` and the reproductions made of federated runs resume; the hint was printed after any command
        command = getattr(args, "command", None)
        resumable = command == "run" or (command == "reproduce" and hasattr(args, "resume"))
        hint = " (a run with --checkpoint-every resumes with --resume)" if resumable else ""
        terminated = isinstance(err, _Terminated)
        print(f"cbo-jax: {'terminated (SIGTERM)' if terminated else 'interrupted'}{hint}", file=sys.stderr)
        return 128 + (signal.SIGTERM if terminated else signal.SIGINT)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

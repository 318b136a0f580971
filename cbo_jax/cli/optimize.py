"""``cbo-jax optimize``: minimise a batched test objective with a CBX-family dynamic.

Its flags are generated from two dataclasses (:func:`cbo_jax.config.add_options`): the
dynamics' numbers from :class:`~cbo_jax.CBOConfig`'s fields, those every dynamic of the
family shares (:data:`DYNAMICS_FLAGS`: ``--dt``, ``--lambda1``, ... with the config's
defaults and descriptions), and the rest from :class:`OptimizeOptions`. The options are checked once,
when :class:`OptimizeOptions` and the dynamics' config are built, and every error names the
flag (``--alpha-factor must be > 0``, not the schedule's ``factor``).
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import sys
from pathlib import Path

from cbo_jax import _checks
from cbo_jax.cli.flags import Defaults
from cbo_jax.config import add_options, flag_name, option
from cbo_jax.dynamics.cbo import CBOConfig
from cbo_jax.dynamics.core import FAMILY_NOISE, RNG_MODES
from cbo_jax.experiments.base import jax_seed, nonnegative_int, positive_int
from cbo_jax.mirror_maps import MIRROR_MAPS
from cbo_jax.objectives import OBJECTIVES

__all__ = ["OptimizeOptions", "DYNAMICS_FLAGS", "add_parser", "optimize_config", "run"]

# The dynamics the command runs by name: the constrained ones take constraint functions (Python API).
_DYNAMICS = ("cbo", "cbo_memory", "pso", "cbs", "polar_cbo", "adam_cbo", "mirror_cbo")

# CBOConfig's fields that are flags, with what the command says of them beyond the config
# (choices; noise defaults to each dynamic's own). lambda2 and sigma2: --dynamic cbo only.
DYNAMICS_FLAGS: dict[str, dict] = {
    "dt": {}, "lambda1": {}, "sigma1": {},
    "noise": {"default": None, "choices": tuple(n for n in FAMILY_NOISE if n != "sampling"),  # sampling: an alias
              "help": "the noise model (default: the dynamic's own; anisotropic for cbo, covariance for cbs)"},
    "lambda2": {}, "sigma2": {}, "energy_tol": {}, "diff_tol": {},
    "dtype": {"choices": ("float32", "float64"), "help": "floating-point precision"},
    "rng": {"choices": RNG_MODES},
}


@dataclasses.dataclass(frozen=True)
class OptimizeOptions:
    """The options of ``cbo-jax optimize`` besides the dynamics' numbers (:data:`DYNAMICS_FLAGS`).
    Built, they are checked together, each error naming the flags; ``dtype`` (the run's, an
    init-only argument) decides whether the numbers must fit float32.

    Attributes:
      objective: the test function
      dim: dimension d
      shift: move the minimiser by this amount in every coordinate
      particles: particles per run N
      runs: independent runs, vmapped
      steps: steps of the Euler–Maruyama scheme (at most 2**31 - 1)
      init_low: lower bound of the uniform initial particles
      init_high: upper bound of the uniform initial particles
      seed: seed of the initial particles and the noise (0 to 2**64 - 1, each its own key)
      dynamic: the CBX-family dynamic (docs/guides/cbx_family.md; the constrained ones take
        constraint functions, through the Python API); default cbo
      mirror_map: with --dynamic mirror_cbo, the mirror map with its default parameters
        (default L2); initial particles outside its admissible set (--init-low/--init-high)
        move into it at the first step, as in CBXpy, and are not counted as best points
      alpha: α (initial α for schedules)
      alpha_schedule: how α changes over the steps
      alpha_factor: α's factor per step for --alpha-schedule multiplicative (default 1.05)
      alpha_max: α's cap for --alpha-schedule multiplicative or ess (default 1e5)
      ess_eta: target effective sample size share for --alpha-schedule ess (default 0.5)
      output: directory for summary.json, config.json (every setting), history.npz and
        metrics.jsonl (one row per logged step)
      overwrite: replace the results already in OUTPUT
      tensorboard: also write TensorBoard event files to OUTPUT (needs --output)
      log_every: steps between rows of OUTPUT/metrics.jsonl (needs --output; default about
        1000 rows)
      no_progress: no progress bar (the results are the same)
      shard: split the particles over all devices (of all processes in a multi-process run);
        when N is not a multiple of the device count the population is padded, and only --rng
        per-particle then gives the unsharded run's numbers
    """

    # fields made with cbo_jax.config.option, their flags' details in metadata; "sets": the schedule's
    # field the option is, named by its errors
    objective: str = option("rastrigin", choices=tuple(sorted(OBJECTIVES)))
    dim: int = option(20, type=positive_int)
    shift: float = 0.0
    particles: int = option(100, flags=("-N",), type=positive_int)
    runs: int = option(1, flags=("-M",), type=positive_int)
    steps: int = option(2000, type=nonnegative_int)
    init_low: float = -3.0
    init_high: float = 3.0
    seed: int = option(0, type=jax_seed)
    dynamic: str = option("cbo", choices=_DYNAMICS)
    mirror_map: str | None = option(None, choices=tuple(sorted(set(MIRROR_MAPS) - {"None"})))
    alpha: float = option(30.0, sets="alpha0")
    alpha_schedule: str = option("multiplicative", choices=("constant", "multiplicative", "ess"))
    alpha_factor: float | None = option(None, sets="factor")
    alpha_max: float | None = option(None, sets="alpha_max")
    ess_eta: float | None = option(None, sets="eta")
    output: Path | None = None
    overwrite: bool = False
    tensorboard: bool = False
    log_every: int | None = option(None, type=positive_int)
    no_progress: bool = False
    shard: bool = False
    dtype: dataclasses.InitVar[str] = "float32"

    def __post_init__(self, dtype: str) -> None:
        # non-finite or float32-overflowing bounds would be reported as "x0 has N non-finite entries", a shift
        # as "the objective is NaN or infinite at every particle"
        f32 = dtype == "float32"
        for flag, value in (("--init-low", self.init_low), ("--init-high", self.init_high), ("--shift", self.shift)):
            _checks.finite_number(flag, value, f32=f32)
        _checks.non_negative("--alpha", self.alpha, f32=f32)  # names the flag, not the schedule's field alpha0
        if not self.init_low < self.init_high:
            raise ValueError(f"--init-low ({self.init_low}) must be below --init-high ({self.init_high})")
        # Flags of a schedule other than the one chosen would have no effect; so would
        # --tensorboard, --log-every and --overwrite without --output (nothing is written).
        uses = {"alpha_factor": ("multiplicative",), "alpha_max": ("multiplicative", "ess"), "ess_eta": ("ess",)}
        for name, schedules_using in uses.items():
            if getattr(self, name) is not None and self.alpha_schedule not in schedules_using:
                raise ValueError(f"{_FLAGS[name]} applies to --alpha-schedule {' or '.join(schedules_using)} only "
                                 f"(got --alpha-schedule {self.alpha_schedule})")
        for name, given in (("tensorboard", self.tensorboard), ("log_every", self.log_every is not None),
                            ("overwrite", self.overwrite)):
            if given and self.output is None:
                raise ValueError(f"{_FLAGS[name]} needs --output DIR (the metrics are written there)")
        if self.mirror_map is not None and self.dynamic != "mirror_cbo":
            raise ValueError(f"--mirror-map needs --dynamic mirror_cbo (got --dynamic {self.dynamic})")


_FLAGS = {f.name: flag_name((f.name,)) for f in dataclasses.fields(OptimizeOptions)}
# The configs' and schedules' fields that the flags set, as their errors name them
_FIELD_FLAGS = {**{name: flag_name((name,)) for name in DYNAMICS_FLAGS},
                **{f.metadata["sets"]: _FLAGS[f.name] for f in dataclasses.fields(OptimizeOptions)
                   if "sets" in f.metadata}}


def add_parser(sub) -> None:
    """``optimize``'s parser, its flags generated from :class:`OptimizeOptions` and :class:`~cbo_jax.CBOConfig`."""
    p = sub.add_parser("optimize", help="minimise a test objective with CBO", formatter_class=Defaults,
                       description="Minimise a batched test objective with CBO (FedCBO eq. (4)/(15) with one "
                                   "objective).")
    add_options(p, OptimizeOptions, names=("objective", "dim", "shift", "particles", "runs", "steps", "init_low",
                                           "init_high", "seed"))
    add_options(p, OptimizeOptions, names=("dynamic", "mirror_map"), group="dynamics")
    add_options(p, CBOConfig, names=tuple(DYNAMICS_FLAGS), specs=DYNAMICS_FLAGS, group="dynamics (CBOConfig)")
    add_options(p, OptimizeOptions, names=("alpha", "alpha_schedule", "alpha_factor", "alpha_max", "ess_eta"),
                group="α schedule")
    add_options(p, OptimizeOptions, names=("output", "overwrite", "tensorboard", "log_every", "no_progress", "shard"),
                group="output and devices")
    p.set_defaults(func=run)


def _named_by_flag(err: ValueError) -> ValueError:
    """``err`` with the field it names (``factor``, ``alpha.alpha_max``) written as optimize's flag,
    and float32's overflow answered with ``--dtype float64``."""
    text = str(err)
    field = re.match(r"(?:alpha\.)?(\w+)(?= )", text)
    if field is not None and field.group(1) in _FIELD_FLAGS:
        # the other fields it names (an identifier, not a word of the sentence: alpha0, not factor)
        rest = re.sub(r"\b(?:alpha\.)?(\w+_\w+|\w+\d)\b", lambda m: _FIELD_FLAGS.get(m.group(1), m.group(0)),
                      text[field.end():])
        text = _FIELD_FLAGS[field.group(1)] + rest  # "--sigma1 must be ...", not "----sigma1"
    if "overflows float32" in text:
        text = text.replace("dtype='float64'", "--dtype float64")
        if "--dtype float64" not in text:
            text += "; --dtype float64 computes in float64"
    return ValueError(text) if text != str(err) else err


def _options(args) -> OptimizeOptions:
    """The checked :class:`OptimizeOptions` of parsed arguments."""
    try:
        return OptimizeOptions(**{name: getattr(args, name) for name in _FLAGS}, dtype=args.dtype)
    except ValueError as err:
        raise _named_by_flag(err) from None


def optimize_config(opts: OptimizeOptions, args):
    """The dynamics' config of ``cbo-jax optimize``'s flags (``args``: those of :data:`DYNAMICS_FLAGS`)."""
    from cbo_jax import schedules
    from cbo_jax.dynamics.family import CONFIGS

    alpha_max = 1e5 if opts.alpha_max is None else opts.alpha_max
    alpha: schedules.Constant | schedules.Multiplicative | schedules.EffectiveSampleSize
    if opts.alpha_schedule == "constant":
        alpha = schedules.Constant(opts.alpha)
    elif opts.alpha_schedule == "multiplicative":
        alpha = schedules.Multiplicative(opts.alpha, 1.05 if opts.alpha_factor is None else opts.alpha_factor,
                                         alpha_max)
    else:
        alpha = schedules.EffectiveSampleSize(eta=0.5 if opts.ess_eta is None else opts.ess_eta, alpha0=opts.alpha,
                                              alpha_max=alpha_max)
    numbers = {name: getattr(args, name) for name in DYNAMICS_FLAGS}
    if numbers["noise"] is None:  # the dynamic's own default (CBS's covariance noise is what makes it CBS)
        del numbers["noise"]
    if opts.dynamic != "cbo" and any([numbers.pop("lambda2"), numbers.pop("sigma2")]):
        raise ValueError("--lambda2/--sigma2 (gradient terms) are only available with --dynamic cbo")
    if opts.dynamic == "mirror_cbo":
        numbers["mirror_map"] = opts.mirror_map
    return CONFIGS[opts.dynamic](alpha=alpha, **numbers)


def _median_distance(points, mins) -> float | None:
    """Median over points of the ∞-norm distance to the nearest known global minimiser (``None``: unknown)."""
    import numpy as np

    if mins is None:
        return None
    dim = np.shape(mins)[-1]
    pts = np.asarray(points, np.float64).reshape(-1, dim)
    return float(np.median(np.min(np.max(np.abs(pts[:, None, :] - mins[None]), axis=-1), axis=1)))


def _known(objective, dim: int):
    """The objective's minimisers and minimum in ``dim``, ``(None, None)`` where they are not known.

    Asked before the run: an objective whose minimiser is not known in this dimension (Michalewicz in
    d = 3) failed after the whole run, without a summary; its distances and minimum are null instead."""
    import numpy as np

    try:
        return np.asarray(objective.minimisers(dim), np.float64), objective.minimum(dim)
    except ValueError:
        return None, None


def _claim_output(out: Path, overwrite: bool) -> None:
    """Before the simulation: an unusable or occupied output directory is an error now."""
    from cbo_jax.runtime.results import ResultsDir

    with ResultsDir(out, overwrite=overwrite, resumable=False,
                    owned=("summary.json", "config.json", "history.npz", "metrics.jsonl", "events.out.tfevents.*")):
        pass


def run(args) -> int:
    """``cbo-jax optimize``: the run, its summary printed (last line: JSON) and, with ``--output``, saved."""
    if args.dtype == "float64":
        import jax

        jax.config.update("jax_enable_x64", True)
    import jax
    import numpy as np

    from cbo_jax import sharding
    from cbo_jax.dynamics.family import DYNAMICS
    from cbo_jax.objectives import get_objective
    from cbo_jax.runtime import distributed
    from cbo_jax.simulate import simulate

    opts = _options(args)
    try:
        cfg = optimize_config(opts, args)
    except ValueError as err:  # named the configs' fields: "factor must be > 0" for --alpha-factor 0
        raise _named_by_flag(err) from None
    objective = get_objective(opts.objective, shift=opts.shift)
    known = _known(objective, opts.dim)
    k_init, k_run = jax.random.split(_checks.as_key("--seed", opts.seed))
    shape = (opts.runs, opts.particles, opts.dim)
    # the particles, their copy in the state, the noise and the step's temporaries: about six arrays
    _checks.memory_fits(f"{opts.runs} x {opts.particles} particles in d={opts.dim}",
                        6 * math.prod(shape) * np.dtype(cfg.dtype).itemsize / (jax.device_count() if opts.shard else 1))
    x0 = jax.random.uniform(k_init, shape, jax.numpy.dtype(cfg.dtype), opts.init_low, opts.init_high)
    mesh = sharding.agent_mesh() if opts.shard else None
    main_process = distributed.is_main()
    if mesh is not None and opts.particles % mesh.size and cfg.rng != "per-particle" and main_process:
        print(f"note: N={opts.particles} is padded to a multiple of {mesh.size} devices, so the noise differs from "
              f"an unsharded run's; --rng per-particle gives the same numbers", file=sys.stderr)
    if opts.output is not None and main_process:
        _claim_output(opts.output, opts.overwrite)
    res = simulate(DYNAMICS[opts.dynamic](objective, cfg), x0, k_run, opts.steps, num_runs=opts.runs,
                   progress=not opts.no_progress and main_process, desc=f"{opts.dynamic} {opts.objective}", mesh=mesh,
                   out=opts.output, log_every=opts.log_every, tensorboard=opts.tensorboard)
    final = {name: distributed.to_host(getattr(res.state, name)).astype(np.float64)
             for name in ("best_x", "consensus", "best_energy")}
    summary = _summary(opts, cfg, res, final, known)
    if not main_process:
        return 0
    _print(opts, cfg, res, final, known, summary)
    if opts.output is not None:
        _save(opts.output, args, cfg, res, final, summary)
    print(json.dumps(_json_safe(summary)))
    return 0


def _json_safe(obj):
    """Valid JSON: non-finite floats become null (never a bare NaN)."""
    from cbo_jax.runtime.writer import json_safe, to_python

    return json_safe(to_python(obj))


def _summary(opts: OptimizeOptions, cfg, res, final: dict, known) -> dict:
    import numpy as np

    best_e = final["best_energy"]
    summary = {
        "dynamic": opts.dynamic,
        "objective": opts.objective,
        "dim": opts.dim,
        "particles": opts.particles,
        "runs": opts.runs,
        "steps": res.steps,
        "rng": cfg.rng,
        "best_energy": float(best_e.min()),
        "best_energy_per_run_median": float(np.median(best_e)),
        "consensus_distance_inf_median": _median_distance(final["consensus"], known[0]),
        "best_distance_inf_median": _median_distance(final["best_x"], known[0]),
        "known_minimum": known[1],
        "seconds": round(res.seconds, 3),
        "particle_steps_per_s": opts.runs * opts.particles * res.steps / max(res.seconds, 1e-9),
    }
    if opts.dynamic == "mirror_cbo":
        from cbo_jax.mirror_maps import get_mirror_map

        summary["mirror_map"] = get_mirror_map(opts.mirror_map).name
    return summary


def _print(opts: OptimizeOptions, cfg, res, final: dict, known, summary: dict) -> None:
    import numpy as np

    best_run = int(np.argmin(final["best_energy"]))
    coords = ", ".join(f"{v:.4g}" for v in final["best_x"][best_run][:6]) + (", ..." if opts.dim > 6 else "")
    minimum = "not known" if known[1] is None else f"{known[1]:.6g}"
    print(f"objective      {opts.objective} (d={opts.dim}, known minimum {minimum})")
    print(f"particles      N={opts.particles} x M={opts.runs} runs, {res.steps} steps, dt={cfg.dt}")
    print(f"best energy    {summary['best_energy']:.6g} (run {best_run}); median over runs "
          f"{summary['best_energy_per_run_median']:.6g}")
    print(f"best particle  [{coords}]")
    if known[0] is not None:
        print(f"|m - x*|_inf   median over runs {summary['consensus_distance_inf_median']:.3g}")
    print(f"time           {res.seconds:.2f} s incl. compilation "
          f"({summary['particle_steps_per_s']:.3g} particle-steps/s)")


def _save(out: Path, args, cfg, res, final: dict, summary: dict) -> None:
    import io

    import numpy as np

    from cbo_jax.runtime.writer import replace_bytes, replace_text, write_summary

    out.mkdir(parents=True, exist_ok=True)
    write_summary(out / "summary.json", summary)
    replace_text(out / "config.json", json.dumps(_record(args, cfg), indent=2) + "\n")
    # "step": the step of each row (1..steps), the time axis metrics.jsonl's rows carry
    buf = io.BytesIO()  # written as the other files are: whole, never through a link in its place
    np.savez(buf, step=np.arange(1, res.steps + 1), **res.history, best_x=final["best_x"],
             consensus=final["consensus"])
    replace_bytes(out / "history.npz", buf.getvalue())
    print(f"saved          {out}/summary.json, config.json, history.npz, metrics.jsonl")


def _record(args, cfg) -> dict:
    """``config.json`` of an ``optimize`` run: every option as given or defaulted (rerunning them
    repeats the run) and the dynamics' resolved configuration, every number of it, with the α
    schedule and the mirror map named."""
    from cbo_jax.runtime.writer import describe

    options = {k: describe(v) for k, v in vars(args).items() if k not in ("func", "command") and not callable(v)}
    return _json_safe({"command": "optimize", "options": options, "dynamics": {"name": args.dynamic, **describe(cfg)}})

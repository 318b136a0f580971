"""The ``cbo-jax`` command (``python -m cbo_jax.cli``).

    cbo-jax optimize --objective rastrigin --dim 20 [options]
    cbo-jax run ALGORITHM [options | --config FILE]   (fedcbo, fedavg, ifca, local, fedprox, fedopt, ditto,
                                                      scaffold, cfl; --help: the algorithm's options)
    cbo-jax sweep ALGORITHM --alpha 1,10,100 [options]  (a grid of its numbers as one program)
    cbo-jax demo [--rounds R]
    cbo-jax --version
    cbo-jax reproduce --list
    cbo-jax reproduce NAME [options]                                  (--help: its options)
    cbo-jax report RESULTS_DIR [--format html|md] [-o FILE]

``reproduce`` prints, as its very last line, one JSON object with the measured
numbers, and saves it under ``--output`` (default ``results/NAME/summary.json``).
Progress bars go to standard error. ``optimize`` is :mod:`cbo_jax.cli.optimize`; the flags of
``optimize`` and ``run`` are generated from their configs (:mod:`cbo_jax.cli.flags`), those of
``demo`` and ``report`` from :class:`DemoOptions` and :class:`ReportOptions`, and each
reproduction's from its ``Experiment.options`` with the shared :class:`~cbo_jax.experiments.base.ReproduceOptions`
and :class:`~cbo_jax.experiments.base.ResumeOptions` (:func:`cbo_jax.config.add_options`).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

from cbo_jax.config import add_options, option
from cbo_jax.experiments.base import positive_int as _positive_int  # one argparse type for counts
from cbo_jax.experiments.base import seed as _run_seed  # a run's seed (NumPy and JAX): 0 .. 2**32 - 1


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


def _add_file_arguments(q, command: str) -> None:
    """The options ``cbo-jax run ALGORITHM`` and ``cbo-jax sweep ALGORITHM`` share first: --config,
    --output (default results/COMMAND-ALGORITHM) and --no-progress."""
    q.add_argument("--config", type=Path, default=None,
                   help="JSON file of options: nested as config.json records them, or flat names")
    q.add_argument("--output", type=Path, default=None, help=f"results directory (default results/{command}-ALGORITHM)")
    q.add_argument("--no-progress", action="store_true", help="no progress bar (the results are the same)")


def _add_run(sub) -> None:
    from cbo_jax.cli.flags import add_run_arguments
    from cbo_jax.experiments.federated import ALGORITHMS

    p = sub.add_parser("run", help="run one federated algorithm on rotated MNIST (or --dataset: another image set)",
                       description="Run FedCBO or a baseline on rotated MNIST (or another image set, --dataset) and "
                                   "write a results directory "
                                   "(config.json, metrics.jsonl, summary.json, metrics.png). `cbo-jax run ALGORITHM "
                                   "--help` lists the algorithm's options; they override --config.")
    algs = p.add_subparsers(dest="algorithm", required=True, metavar="ALGORITHM")
    for name in ALGORITHMS:
        q = algs.add_parser(name, help=f"run {name}", description=f"Run {name} on rotated MNIST. Options override "
                            "--config; nested options are written section.field (--local.lr).")
        _add_file_arguments(q, "run")
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
    from cbo_jax.cli.flags import config_from_args
    from cbo_jax.experiments.federated import run_experiment

    if args.extend and not args.resume:  # --extend alone would start a new run of the extended length over the old one
        raise ValueError("--extend continues a run: it needs --resume")
    if args.resume and args.overwrite:  # the run would resume and silently ignore --overwrite
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


def _add_sweep(sub) -> None:
    from cbo_jax.cli.flags import add_run_arguments
    from cbo_jax.experiments.federated import ALGORITHMS

    p = sub.add_parser("sweep", help="run a grid of one algorithm's numbers as one program",
                       description="Run a grid of an algorithm's numbers (cbo_jax.federated.sweep) as one vmapped "
                                   "program and write one results directory (metrics.jsonl, summary.json, "
                                   "sweep.png). Every option of `cbo-jax run ALGORITHM` is taken; a comma-separated "
                                   "list for a number of the algorithm (--alpha 1,10,100 --local.lr 0.01,0.1) makes "
                                   "it an axis of the grid.")
    algs = p.add_subparsers(dest="algorithm", required=True, metavar="ALGORITHM")
    for name in ALGORITHMS:
        q = algs.add_parser(name, help=f"sweep {name}", description=f"Sweep {name}'s numbers on rotated MNIST (or "
                            "--dataset). A comma-separated list makes an option an axis of the grid.")
        _add_file_arguments(q, "sweep")
        q.add_argument("--overwrite", action="store_true", help="replace the results already in OUTPUT")
        q.set_defaults(func=_cmd_sweep, run_flags=add_run_arguments(q, name))


def _cmd_sweep(args) -> int:
    from cbo_jax.cli.flags import config_from_args
    from cbo_jax.experiments.federated_sweep import best_point, parse_values, sweep_experiment, table

    grid = {}
    for dest, field in args.run_flags.items():
        text = getattr(args, dest, None)
        if not isinstance(text, str) or "," not in text:
            continue
        if field.path[0] != "config":
            raise ValueError(f"{field.cli} {text}: a sweep's axes are numbers of {args.algorithm}'s config "
                             f"(--alpha, --local.lr, ...), not of the data or of the run")
        grid[".".join(field.path[1:])] = parse_values(field.cli, text)
        setattr(args, dest, text.split(",")[0])  # the config holds the first value; the grid all of them
    if not grid:
        raise ValueError(f"cbo-jax sweep {args.algorithm}: no axis given; give an option of {args.algorithm}'s "
                         f"config a comma-separated list of values, e.g. --local.lr 0.01,0.1")
    cfg = config_from_args(args.algorithm, args, args.run_flags)
    out = args.output or Path("results") / f"sweep-{args.algorithm}"
    res = sweep_experiment(cfg, grid, out, progress=not args.no_progress, overwrite=args.overwrite)
    s = res.summary
    print(f"{s['algorithm']}: a grid of {s['points']} points ({' x '.join(s['sweep']['names'])}), {s['rounds']} "
          f"rounds, {s['num_agents']} agents, {s['seconds']:.0f} s")
    print(table(s))
    best = best_point(s)
    if best is not None:
        print("best: " + ", ".join(f"{k}={v:g}" for k, v in best["point"].items())
              + f" (mean test accuracy {best['final_test_acc']:.2f}%)")
        s = {**s, "best": best}
    print(f"results in {out}/")
    print(json.dumps(_json_safe(s)))
    return 0


@dataclasses.dataclass(frozen=True)
class DemoOptions:
    """The options of ``cbo-jax demo`` (its flags: :func:`cbo_jax.config.add_options`).

    Attributes:
      output: directory of the four runs, OUTPUT/fedcbo, ... (default results/demo); a later
        demo replaces them, never another command's run
      seed: seed of the algorithms' randomness (0 to 2**32 - 1)
      rounds: communication rounds (default 15); e.g. --rounds 2 for a quick check that
        everything runs
      no_progress: no progress bar (the results are the same)
    """

    output: Path = Path("results") / "demo"
    seed: int = option(0, type=_run_seed)
    rounds: int | None = option(None, type=_positive_int)
    no_progress: bool = False


def _add_demo(sub) -> None:
    p = sub.add_parser("demo", help="FedCBO vs FedAvg, IFCA and local training on the bundled MNIST subset",
                       description="A small rotated-MNIST comparison on the real-MNIST subset shipped with the package "
                                   "(offline, about 2 minutes on 2 CPU cores).")
    add_options(p, DemoOptions)
    p.set_defaults(func=_cmd_demo)


def _cmd_demo(args) -> int:
    from cbo_jax.experiments.demo import run_demo

    result = run_demo(args.output, seed=args.seed, progress=not args.no_progress, rounds=args.rounds)
    print(json.dumps(_json_safe(result)))
    return 0


def _add_reproduce(sub) -> None:
    from cbo_jax.experiments import registry
    from cbo_jax.experiments.base import ReproduceOptions, ResumeOptions

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
        add_options(q, ReproduceOptions, names=("output", "overwrite"))
        if exp.resumable:
            add_options(q, ResumeOptions)
        add_options(q, ReproduceOptions, names=("no_progress",))
        exp.add_arguments(q)  # its own options (Experiment.options)
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
        if options is not None:  # after the runs: the record of a resumed directory that had none
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


@dataclasses.dataclass(frozen=True)
class ReportOptions:
    """The arguments of ``cbo-jax report`` (generated: :func:`cbo_jax.config.add_options`).

    Attributes:
      results_dir: a directory written by demo, run or reproduce
      format: report format (default: from --output's suffix, else html)
      output: report file, or an existing directory to write report.html/.md in (default
        RESULTS_DIR/report.html or .md)
    """

    results_dir: Path = option(positional=True)
    format: str | None = option(None, choices=("html", "md"))
    output: Path | None = option(None, flags=("-o",))


def _add_report(sub) -> None:
    p = sub.add_parser("report", help="render a results directory to one HTML or Markdown file",
                       description="Render every summary.json, metrics.jsonl and plot under RESULTS_DIR into one "
                                   "report: tables, comparison tables across runs, curves. HTML is self-contained; "
                                   "Markdown writes its images to <report>_files/.")
    add_options(p, ReportOptions)
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
    from cbo_jax.cli import optimize

    optimize.add_parser(sub)
    _add_run(sub)
    _add_sweep(sub)
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
        # inside the try: Ctrl-C while the parser imports JAX and the experiments is one line, not a traceback
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
        # `cbo-jax run` and the reproductions made of federated runs resume: only they get the hint
        command = getattr(args, "command", None)
        resumable = command == "run" or (command == "reproduce" and hasattr(args, "resume"))
        hint = " (a run with --checkpoint-every resumes with --resume)" if resumable else ""
        terminated = isinstance(err, _Terminated)
        print(f"cbo-jax: {'terminated (SIGTERM)' if terminated else 'interrupted'}{hint}", file=sys.stderr)
        return 128 + (signal.SIGTERM if terminated else signal.SIGINT)

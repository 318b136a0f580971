"""Peak host memory (RSS) and time of one FedCBO round at the paper's scale, per eval_chunk.

Setting (FedCBO paper, rotated MNIST): N = 1200 agents, M = 200 downloads per agent,
n = 200 samples per agent, MLP 784-200-10 (P = 159,010), local SGD with batch 128,
lr 0.1, momentum 0.9, and tau = 1 local epoch (the paper uses more; memory does not
depend on tau: the epochs are a ``lax.scan`` whose carry and per-step buffers have the
same shapes for any tau, only the time grows). Data: synthetic ``uint8`` images
(1200, 200, 28, 28) with random labels (shapes are what matter for memory and time).

Each configuration runs in a fresh subprocess (so ``ru_maxrss`` is that of this
configuration alone): build the data and ``fedcbo(...).init``, compile
``jax.jit(alg.round)`` ahead of time, then run ONE round and time it (compile time is
reported separately). The peak RSS is ``resource.getrusage(RUSAGE_SELF).ru_maxrss``
at the end of the child (it includes the Python / JAX baseline, the data, compilation
and the round). XLA's own buffer plan (``compiled.memory_analysis()``: arguments +
outputs + temporaries) is reported too.

Safety on a shared machine: before executing the round the child compares XLA's plan
plus its current RSS with ``MemAvailable``; if that does not fit with ``--margin-gb``
to spare, the round is NOT run (so that the kernel's OOM killer never has to pick a
victim among other jobs) and the configuration is reported as ``skipped`` with the
predicted peak. The child also runs under an address-space limit (``--rlimit-gb``,
default MemAvailable at start) as a backstop.

``--variant proposed`` runs the same round with its consensus step replaced (in the
child only, by monkeypatching the module attribute) by ``aggregate_proposed`` from
``benchmarks/fedcbo_round.py``. ``--variant by_model`` runs the package's round with
``FedCBOConfig(eval_by="model")`` (``eval_chunk`` is then the group size).

    python benchmarks/fedcbo_memory.py                              # eval_chunk 4, 16, 64
    python benchmarks/fedcbo_memory.py --chunks 16 --variant proposed

The last line of stdout is one JSON object: "peak_rss_gb" (per eval_chunk; null when
skipped), "fits_24gb" (per eval_chunk: peak RSS, or the predicted peak when skipped,
below 24e9 bytes), "round_seconds", "predicted_peak_gb", and the settings.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import resource
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
GB = 1e9


def mem_available_bytes() -> int:
    with open("/proc/meminfo") as fh:
        for line in fh:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no MemAvailable in /proc/meminfo")


def rss_now_bytes() -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def child(args) -> dict:
    if args.rlimit_gb > 0:
        lim = int(args.rlimit_gb * GB)
        resource.setrlimit(resource.RLIMIT_AS, (lim, lim))
    import jax
    import numpy as np

    import importlib

    # The module (its package re-exports the function ``fedcbo`` under the same name).
    fedcbo_mod = importlib.import_module("cbo_jax.federated.algorithms.fedcbo")
    from cbo_jax.federated.aggregation import Downloads
    from cbo_jax.federated.data import AgentData
    from cbo_jax.federated.local import LocalSGDConfig
    from cbo_jax.models import mlp_mnist

    if args.variant == "proposed":
        sys.path.insert(0, HERE)
        from fedcbo_round import aggregate_proposed

        def proposed(energy_fn, params, idx, own, data, *, alpha, include_self=False, chunk=4, downloads=None):
            loss, own_loss, m = aggregate_proposed(mlp_mnist(), cfg, params, idx, AgentData(*data))
            zeros = jax.numpy.zeros(idx.shape[:1])
            return Downloads(loss, own_loss, jax.numpy.zeros(idx.shape), zeros, zeros.astype(bool), m)

        fedcbo_mod.consensus_downloads = proposed  # round_fn looks the name up at trace time

    out = {"eval_chunk": args.eval_chunk, "variant": args.variant}
    rng = np.random.default_rng(args.seed)
    n, n_s = args.agents, args.samples
    data = AgentData(
        jax.numpy.asarray(rng.integers(0, 256, (n, n_s, 28, 28), dtype=np.uint8)),
        jax.numpy.asarray(rng.integers(0, 10, (n, n_s)).astype(np.int32)),
        jax.numpy.full((n,), n_s, jax.numpy.int32),
    )
    cfg = fedcbo_mod.FedCBOConfig(
        M=args.downloads, eval_chunk=args.eval_chunk, eval_by="model" if args.variant == "by_model" else "agent",
        local=LocalSGDConfig(epochs=args.epochs, batch_size=128, lr=0.1, momentum=0.9),
    )
    alg = fedcbo_mod.fedcbo(mlp_mnist(), cfg, n)
    state = alg.init(jax.random.key(args.seed))
    jax.block_until_ready(state)
    out["rss_after_init_gb"] = rss_now_bytes() / GB

    t0 = time.perf_counter()
    compiled = jax.jit(alg.round).lower(state, data).compile()
    out["compile_seconds"] = time.perf_counter() - t0
    ma = compiled.memory_analysis()
    plan = ma.argument_size_in_bytes + ma.output_size_in_bytes + ma.temp_size_in_bytes - ma.alias_size_in_bytes
    out["xla_argument_gb"] = ma.argument_size_in_bytes / GB
    out["xla_output_gb"] = ma.output_size_in_bytes / GB
    out["xla_temp_gb"] = ma.temp_size_in_bytes / GB
    rss = rss_now_bytes()
    out["rss_after_compile_gb"] = rss / GB
    # Arguments are already resident; outputs and temporaries come on top.
    predicted = rss + ma.output_size_in_bytes + ma.temp_size_in_bytes
    out["predicted_peak_gb"] = max(predicted, peak_rss_bytes()) / GB
    avail = mem_available_bytes()
    out["mem_available_gb_before_round"] = avail / GB
    if args.plan_only or ma.output_size_in_bytes + ma.temp_size_in_bytes > avail - args.margin_gb * GB:
        out["status"] = "skipped"
        out["reason"] = "--plan-only" if args.plan_only else (f"XLA plan needs {(ma.output_size_in_bytes + ma.temp_size_in_bytes) / GB:.1f} GB more, "
                         f"MemAvailable {avail / GB:.1f} GB (margin {args.margin_gb} GB)")
        out["peak_rss_gb"] = None
        out["round_seconds"] = None
        out["xla_plan_gb"] = plan / GB
        return out
    c0, t0 = time.process_time(), time.perf_counter()
    new_state, info = compiled(state, data)
    jax.block_until_ready((new_state, info))
    out["round_seconds"] = time.perf_counter() - t0
    out["round_cpu_seconds"] = time.process_time() - c0
    out["finite"] = bool(np.isfinite(np.asarray(info.train_loss)).all())
    out["peak_rss_gb"] = peak_rss_bytes() / GB
    out["xla_plan_gb"] = plan / GB
    out["status"] = "ok"
    return out


def load_avg() -> str:
    return " ".join(f"{v:.2f}" for v in os.getloadavg())


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--chunks", default="4,16,64", help="comma-separated eval_chunk values")
    ap.add_argument("--agents", "-N", type=int, default=1200)
    ap.add_argument("--downloads", "-M", type=int, default=200)
    ap.add_argument("--samples", type=int, default=200)
    ap.add_argument("--epochs", "--tau", type=int, default=1)
    ap.add_argument("--variant", choices=("current", "by_model", "proposed"), default="current")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--margin-gb", type=float, default=1.5, help="MemAvailable to leave free (skip the round otherwise)")
    ap.add_argument("--rlimit-gb", type=float, default=None, help="address-space limit of the child (default: MemAvailable; 0 = none)")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per configuration")
    ap.add_argument("--plan-only", action="store_true", help="compile and report XLA's buffer plan, do not run the round")
    ap.add_argument("--json", default=None)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--eval-chunk", type=int, default=16, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.child:
        print("CHILD " + json.dumps(child(args)), flush=True)
        return {}

    chunks = [int(c) for c in args.chunks.split(",") if c]
    print(f"# FedCBO one-round peak RSS  {datetime.datetime.now().isoformat(timespec='seconds')}  load avg {load_avg()}")
    print(f"# N={args.agents} M={args.downloads} n={args.samples} tau={args.epochs} B=128 MLP 784-200-10 "
          f"variant={args.variant}; MemTotal {os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / GB:.1f} GB")
    results = {}
    for c in chunks:
        avail = mem_available_bytes()
        rlimit = args.rlimit_gb if args.rlimit_gb is not None else avail / GB + 1.0  # +1 GB for JAX's address-space reservations
        cmd = [sys.executable, os.path.abspath(__file__), "--child", "--eval-chunk", str(c),
               "--agents", str(args.agents), "--downloads", str(args.downloads), "--samples", str(args.samples),
               "--epochs", str(args.epochs), "--variant", args.variant, "--seed", str(args.seed),
               "--margin-gb", str(args.margin_gb), "--rlimit-gb", str(rlimit)] + (["--plan-only"] if args.plan_only else [])
        t0 = time.perf_counter()
        load0 = load_avg()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
            lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("CHILD ")]
            if proc.returncode == 0 and lines:
                r = json.loads(lines[-1][len("CHILD "):])
            else:
                tail = (proc.stderr or proc.stdout)[-600:]
                r = {"eval_chunk": c, "status": f"failed (exit {proc.returncode})", "stderr_tail": tail, "peak_rss_gb": None}
        except subprocess.TimeoutExpired:
            r = {"eval_chunk": c, "status": f"timeout after {args.timeout:.0f} s", "peak_rss_gb": None}
        r["wall_seconds_total"] = time.perf_counter() - t0
        r["load_avg_start"] = load0
        r["load_avg_end"] = load_avg()
        results[c] = r
        print(f"  eval_chunk={c}: {r.get('status')}  peak RSS {r.get('peak_rss_gb')}  round {r.get('round_seconds')} s  "
              f"({r['wall_seconds_total']:.0f} s total)", flush=True)

    def fmt(v, f="{:.2f}"):
        return "-" if v is None else f.format(v)

    print()
    hdr = (f"{'eval_chunk':>10} {'status':<8} {'peak_RSS_GB':>11} {'pred_GB':>8} {'XLA_temp_GB':>11} {'XLA_args_GB':>11} "
           f"{'round_s':>8} {'cores':>5} {'compile_s':>9} {'fits_24GB':>9}")
    print(hdr)
    print("-" * len(hdr))
    fits = {}
    for c, r in results.items():
        peak = r.get("peak_rss_gb")
        ref = peak if peak is not None else r.get("predicted_peak_gb")
        fits[str(c)] = None if ref is None else bool(ref < 24.0)
        cores = r["round_cpu_seconds"] / r["round_seconds"] if r.get("round_seconds") else None
        print(f"{c:>10} {str(r.get('status'))[:8]:<8} {fmt(peak):>11} {fmt(r.get('predicted_peak_gb')):>8} {fmt(r.get('xla_temp_gb')):>11} "
              f"{fmt(r.get('xla_argument_gb')):>11} {fmt(r.get('round_seconds'), '{:.1f}'):>8} {fmt(cores):>5} "
              f"{fmt(r.get('compile_seconds'), '{:.1f}'):>9} {str(fits[str(c)]):>9}")
        if r.get("reason") or r.get("stderr_tail"):
            print(f"{'':>10} {r.get('reason') or r.get('stderr_tail')}")
    from cbo_jax.runtime.provenance import environment  # here: the parent process measures nothing itself

    result = {
        "benchmark": "fedcbo_memory",
        "peak_rss_gb": {str(c): r.get("peak_rss_gb") for c, r in results.items()},
        "fits_24gb": fits,
        "round_seconds": {str(c): r.get("round_seconds") for c, r in results.items()},
        "predicted_peak_gb": {str(c): r.get("predicted_peak_gb") for c, r in results.items()},
        "settings": {"N": args.agents, "M": args.downloads, "n": args.samples, "tau": args.epochs, "batch_size": 128,
                     "model": "mlp-784-200-10", "data": "synthetic", "variant": args.variant},
        "details": {str(c): r for c, r in results.items()},
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "environment": environment(),
    }
    line = json.dumps(result)
    if args.json:
        with open(args.json, "w") as fh:
            fh.write(line + "\n")
    print(line)
    return result


if __name__ == "__main__":
    main()

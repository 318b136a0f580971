"""Scripted faults against `cbo-jax run`: kills, corrupt checkpoints, concurrent runs, wrong resumes.

Every fault is a real process: ``cbo-jax run fedcbo`` on a tiny rotated-MNIST setting (the
bundled subset, 8 agents) with a checkpoint every round.

1. **kill -9 at random rounds**: the run is started with ``--resume``, killed with SIGKILL
   when its metrics reach a randomly drawn round, restarted, and so on until it finishes
   (at least ``--kills`` kills). Its metrics and final checkpoint must equal, bit for bit,
   those of an uninterrupted run.
2. **flipped bytes**: copies of a finished run's checkpoint get bytes flipped in one file
   (each data file in turn, at a random offset); ``--resume`` must refuse every copy.
3. **two runs into one directory**: the second must be refused while the first runs.
4. **resume with another seed**: must be refused, listing the differing fields.

    python benchmarks/fault_injection.py            # about 5 minutes on 2 CPU cores

The last line is JSON: ``kills_survived``, ``bitwise_equal_after_resume``,
``corruptions_detected``, ``corruptions_tried``, ``concurrent_runs_refused``,
``config_mismatch_refused``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TINY = ["--agents", "8", "--clusters", "2", "--M", "3", "--local.epochs", "1", "--samples-per-agent", "20",
        "--batch-size", "10", "--test-size", "50", "--eval-every", "1", "--source", "bundled", "--no-progress",
        "--checkpoint-every", "1"]


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "cbo_jax.cli", "run", "fedcbo", *TINY, *args]


def rows(out: Path) -> list[dict]:
    path = out / "metrics.jsonl"
    if not path.is_file():
        return []
    out_rows = []
    for line in path.read_text().splitlines():
        try:
            out_rows.append({k: v for k, v in json.loads(line).items() if k != "elapsed_s"})
        except json.JSONDecodeError:  # a line being written when the process was killed
            pass
    return out_rows


def final_arrays(out: Path) -> dict:
    """The latest checkpoint's arrays, read back through cbo_jax (verified)."""
    import jax

    from cbo_jax.runtime import checkpoint

    meta = checkpoint.read_meta(out / "checkpoint")
    step = meta["step"]
    path = out / "checkpoint" / str(step) / "state"
    import orbax.checkpoint as ocp

    with ocp.StandardCheckpointer() as ck:
        raw = ck.restore(path)
    return {jax.tree_util.keystr(p): leaf for p, leaf in jax.tree_util.tree_leaves_with_path(raw)}


def killed_run(out: Path, rounds: int, kills: int, rng: random.Random, log) -> int:
    """Restart with --resume until the run finishes, killing it with SIGKILL ``kills`` times,
    each time once its metrics reach a randomly drawn round (before the last one)."""
    survived = 0
    while True:
        done = len(rows(out))
        proc = subprocess.Popen(cli("--rounds", str(rounds), "--seed", "3", "--output", str(out), "--resume"),
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        target = None
        if survived < kills and done < rounds - 1:
            stride = max(1, (rounds - 1 - done) // (kills - survived))
            target = min(rounds - 1, done + rng.randint(1, stride))
        while proc.poll() is None:
            if target is not None and len(rows(out)) >= target:
                time.sleep(rng.uniform(0.0, 0.3))  # anywhere in the round that follows
                proc.send_signal(signal.SIGKILL)
                proc.wait()
                survived += 1
                log(f"  killed after round {len(rows(out))} (kill {survived})")
                break
            time.sleep(0.05)
        else:
            if proc.returncode != 0:
                raise RuntimeError(f"a resumed run failed: {proc.stderr.read()[-2000:]}")
            return survived


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=16)
    p.add_argument("--kills", type=int, default=6)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    rng = random.Random(args.seed)
    root = Path(tempfile.mkdtemp(prefix="cbo_jax_faults_"))
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    env_ok = dict(os.environ)
    result = {}

    log("uninterrupted run")
    ref = root / "reference"
    subprocess.run(cli("--rounds", str(args.rounds), "--seed", "3", "--output", str(ref)), check=True,
                   stdout=subprocess.DEVNULL, env=env_ok)

    log(f"kill -9 at random rounds ({args.kills} kills)")
    out = root / "killed"
    result["kills_survived"] = killed_run(out, args.rounds, args.kills, rng, log)
    a, b = final_arrays(ref), final_arrays(out)
    same_state = a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a)
    result["bitwise_equal_after_resume"] = bool(same_state and rows(ref) == rows(out))

    log("flipped bytes in checkpoint files")
    latest = ref / "checkpoint" / str(json.loads((ref / "summary.json").read_text())["rounds"])
    # Every file that holds the state or describes it (orbax's commit markers carry nothing).
    files = sorted(p for p in latest.rglob("*") if p.is_file() and p.name != "commit_success.txt"
                   and p.parent.name in ("state", "d", "ocdbt.process_0", "meta"))
    detected = 0
    for i, target in enumerate(files):
        copy = root / f"corrupt{i}"
        shutil.copytree(ref, copy)
        victim = copy / target.relative_to(ref)
        raw = bytearray(victim.read_bytes())
        at = rng.randrange(len(raw) // 2, len(raw))
        for j in range(at, min(len(raw), at + 8)):
            raw[j] ^= 0xFF
        victim.write_bytes(bytes(raw))
        proc = subprocess.run(cli("--rounds", str(args.rounds + 2), "--extend", "--seed", "3", "--output", str(copy),
                                  "--resume"), capture_output=True, text=True)
        ok = proc.returncode == 2 and "is corrupt" in proc.stderr
        detected += ok
        last = (proc.stderr.strip().splitlines() or ["(no message)"])[-1][:140]
        log(f"  {victim.relative_to(copy)}: {'refused' if ok else f'NOT DETECTED (exit {proc.returncode})'}: {last}")
    result["corruptions_detected"], result["corruptions_tried"] = detected, len(files)

    log("two runs into one directory")
    shared = root / "shared"
    first = subprocess.Popen(cli("--rounds", "200", "--output", str(shared)), stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    while not (shared / ".lock").exists() or not (shared / ".lock").read_text().strip():
        time.sleep(0.05)
    second = subprocess.run(cli("--rounds", "2", "--output", str(shared), "--overwrite"), capture_output=True, text=True)
    first.send_signal(signal.SIGKILL)
    first.wait()
    result["concurrent_runs_refused"] = second.returncode == 2 and "another run" in second.stderr

    log("resume with another seed")
    proc = subprocess.run(cli("--rounds", str(args.rounds), "--seed", "99", "--output", str(ref), "--resume"),
                          capture_output=True, text=True)
    result["config_mismatch_refused"] = proc.returncode == 2 and "--seed:" in proc.stderr
    log(proc.stderr.strip())
    shutil.rmtree(root, ignore_errors=True)
    print(json.dumps(result))


if __name__ == "__main__":
    main()

"""Two runs' results directories written and read back (docs/results.md)."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

from cbo_jax.writer import read_jsonl

cbo_jax = [sys.executable, "-m", "cbo_jax.cli"]  # the same as the `cbo-jax` command
subprocess.run([*cbo_jax, "run", "fedavg", "--agents", "8", "--samples-per-agent", "20", "--local.epochs", "1",
                "--rounds", "2", "--eval-every", "1", "--test-size", "100", "--output", "results/tiny",
                "--no-progress", "--overwrite"], check=True)
subprocess.run([*cbo_jax, "optimize", "--objective", "ackley", "--dim", "4", "--runs", "3", "--steps", "300",
                "--output", "results/ackley", "--no-progress", "--overwrite"], check=True)

run = Path("results/tiny")
summary = json.loads((run / "summary.json").read_text())
config = json.loads((run / "config.json").read_text())
rows = read_jsonl(run / "metrics.jsonl")  # one dict per round
print(f"{config['algorithm']}: {summary['final_test_acc']:.1f} % after {summary['rounds']} rounds, "
      f"model {config['model']['name']}, seed {config['run']['seed']}, JAX {summary['environment']['jax']}")
print("test accuracy by round:", [(r["round"], round(r["test_acc"], 1)) for r in rows if "test_acc" in r])

history = np.load("results/ackley/history.npz")
print("steps", history["step"][0], "to", history["step"][-1], "| best energy per run:", history["best_energy"][-1])

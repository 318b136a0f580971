"""Re-pin the federated runs after FedCBO's downloads were restricted to the participants.

    python tests/pinned/make_federated_pinned_v4.py

Writes ``federated_v4.npz`` in the layout of ``federated_v3.npz``: the same 15 runs
(tests/_federated_variants.py), one device and 8 simulated devices with padding agents.
The change: with ``participation < 1``, FedCBO draws each agent's ``M`` downloads from the
participating agents ``G_n`` only (Algorithm 2, ``ε-greedySampling(P^j, G_n, M)``); slots
left over when fewer than ``M`` others participate are empty; a non-participant downloads
nothing (its info rows are empty, so ``sr`` averages over the participants). Of the pinned
runs only ``fedcbo_egreedy_iso`` (participation 0.8) draws with partial participation
(FedAvg and Local use participation but download nothing); it moves by more than rounding.

Every other run keeps its v3 arrays bitwise (they were recorded on the pins' host kind, an
AMD CPU without AVX-512; the script checks that this host reproduces them within 1e-5, the
tolerance of tests/_stack.py's other hosts). The moved runs are recorded on this host, and
the file stores, per run, the host kind (``_stack.host_kind()``) it was recorded on as
``meta/<run>/recorded_on``: the pinned-run tests are exact on that kind with the pinned JAX
(``pinned_atol(recorded_on(name))``), within 1e-5 elsewhere.
"""

import os
import sys

os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pathlib import Path  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402

import _federated_variants as fv  # noqa: E402
import _stack  # noqa: E402
from cbo_jax import sharding  # noqa: E402

# The runs this change moves (checked below: exactly these differ from v3 by more than 1e-5).
MOVED = {"fedcbo_egreedy_iso"}
ROUNDING = 1e-5  # another host kind's float rounding (tests/_stack.py)


def main():
    if jax.__version__ != _stack.PINNED_JAX:
        raise SystemExit(f"record with jax {_stack.PINNED_JAX} (the pins' JAX), not {jax.__version__}")
    host = _stack.host_kind()
    mesh = sharding.agent_mesh()
    record = fv.record(mesh)
    v3 = np.load(Path(__file__).with_name("federated_v3.npz"))
    assert set(record) == set(v3.files), sorted(set(record) ^ set(v3.files))
    worst: dict[str, tuple[float, str]] = {}
    for k in v3.files:
        run, _, rest = k.split("/", 2)
        if (run, rest[len("metric/"):]) in fv.REDEFINED:  # v3 holds the old definition (see fv.REDEFINED)
            continue
        a, b = v3[k].astype(float), record[k].astype(float)
        same_nonfinite = np.array_equal(np.isfinite(a), np.isfinite(b)) and np.array_equal(
            a[~np.isfinite(a)], b[~np.isfinite(b)], equal_nan=True)
        fin = np.isfinite(a)
        d = float(np.max(np.abs(a[fin] - b[fin]), initial=0.0)) if same_nonfinite else float("inf")
        if d >= worst.get(run, (-1.0, ""))[0]:
            worst[run] = (d, k)
    print(f"host kind {host}; largest difference from v3 per run (where):")
    for run, (d, k) in sorted(worst.items()):
        print(f"  {run:<22} {d:.3g}  {k}{'  MOVED' if run in MOVED else ''}")
    moved = {run for run, (d, _) in worst.items() if d > ROUNDING}
    assert moved == MOVED, f"runs beyond float rounding: {sorted(moved)}, expected {sorted(MOVED)}"
    out = {k: (record[k] if k.split("/")[0] in MOVED else v3[k]) for k in v3.files}
    for run in sorted({k.split("/")[0] for k in v3.files}):
        out[f"meta/{run}/recorded_on"] = np.array(host if run in MOVED else _stack.PINNED_HOST_KIND)
    path = Path(__file__).with_name("federated_v4.npz")
    np.savez_compressed(path, **out)
    print(f"wrote {len(out)} arrays to {path}")


if __name__ == "__main__":
    main()

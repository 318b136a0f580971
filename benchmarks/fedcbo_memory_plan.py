"""Which eval_chunk fits a memory budget for one FedCBO round at the paper's scale.  Issue 7.

Compiles one round per candidate chunk on abstract shapes (nothing allocated) with
``eval_chunk_for_budget`` and prints XLA's planned bytes (arguments + outputs +
temporaries - aliased). Paper scale: N=1200 agents, M=200 downloads, 200 images each,
MLP 784-200-10, tau=1.

    python benchmarks/fedcbo_memory_plan.py [--budgets 16,8,5]
"""

import argparse
import time

import jax
import jax.numpy as jnp

from cbo_jax.federated.algorithms.fedcbo import FedCBOConfig
from cbo_jax.federated.data import AgentData
from cbo_jax.federated.memory import eval_chunk_for_budget
from cbo_jax.federated.local import LocalSGDConfig
from cbo_jax.models import mlp_mnist


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--budgets", default="16,8,5", help="comma-separated budgets in GiB")
    ap.add_argument("--agents", "-N", type=int, default=1200)
    ap.add_argument("--downloads", "-M", type=int, default=200)
    ap.add_argument("--samples", type=int, default=200)
    args = ap.parse_args(argv)
    n, ns = args.agents, args.samples
    data = AgentData(jax.ShapeDtypeStruct((n, ns, 28, 28), jnp.uint8), jax.ShapeDtypeStruct((n, ns), jnp.int32),
                     jax.ShapeDtypeStruct((n,), jnp.int32))
    cfg = FedCBOConfig(M=args.downloads, local=LocalSGDConfig(epochs=1, batch_size=128, lr=0.1, momentum=0.9))
    for budget in (float(b) for b in args.budgets.split(",")):
        t0 = time.perf_counter()
        try:
            chunk, plan = eval_chunk_for_budget(mlp_mnist(), cfg, data, budget * 2**30, candidates=(64, 16, 4, 1))
        except ValueError as err:
            print(f"budget {budget:g} GiB: {err}")
            continue
        planned = ", ".join(f"{c}: {b / 2**30:.2f}" for c, b in plan.items())
        print(f"budget {budget:g} GiB -> eval_chunk {chunk} (planned GiB {planned}; {time.perf_counter() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Named, configured reproductions of published results (``cbo-jax reproduce NAME``).

Each entry is an :class:`Experiment` (:mod:`cbo_jax.experiments.base`): a name, what it
reproduces, the published number, command-line options, and a ``run`` function returning a
JSON-serialisable dict of measured numbers. The CLI prints that dict as the last line of its
output.
"""

from __future__ import annotations

from cbo_jax.experiments.base import Experiment, jax_seed, nonnegative_int, positive_int, seed

__all__ = ["Experiment", "registry", "positive_int", "nonnegative_int", "seed", "jax_seed"]


def registry() -> dict[str, Experiment]:
    """The reproductions by name (``cbo-jax reproduce NAME``), imported here on first use."""
    from cbo_jax.experiments import fedcbo_table1, particles, rastrigin_success

    entries = [rastrigin_success.EXPERIMENT, fedcbo_table1.TABLE1, fedcbo_table1.NOISE, particles.CLUSTERED,
               particles.DECAY, particles.SCALING, particles.COUPLING, particles.CB2O]
    from cbo_jax.experiments import fedsgld_synthetic
    entries.append(fedsgld_synthetic.EXPERIMENT)
    from cbo_jax.experiments import fedcb2o_attack
    entries += [fedcb2o_attack.ATTACK, fedcb2o_attack.TG]
    return {e.name: e for e in entries}

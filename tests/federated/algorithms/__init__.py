"""Tests of cbo_jax.federated.algorithms: one file per algorithm."""

"""Tests of cbo_jax.federated: data, local training, aggregation, selection, metrics, the runner."""

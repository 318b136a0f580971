"""Tests of cbo_jax.runtime: results directories, checkpoints, reports, provenance, processes."""

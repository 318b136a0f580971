"""Tests of cbo_jax.experiments: the catalogue and the reproductions behind cbo-jax run and reproduce."""

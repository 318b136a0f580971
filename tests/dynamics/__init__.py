"""Tests of cbo_jax.dynamics: the particle systems."""

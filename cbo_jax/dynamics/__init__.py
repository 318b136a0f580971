"""Particle systems as pure ``(init, step)`` pairs."""

from cbo_jax.dynamics.cbo import CBOConfig, CBOState, Dynamics, cbo

__all__ = ["CBOConfig", "CBOState", "Dynamics", "cbo"]

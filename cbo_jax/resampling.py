"""Resampling: particles re-drawn around where they are when a run stagnates.

CBXpy's ``cbx.utils.resampling``: after a step, a *trigger* decides per run whether the
run has stagnated; if so every particle of that run gets an independent kick

    x_i ← x_i + σ_r √dt ξ_i,   ξ_i ~ N(0, I)

(CBXpy's ``apply_resampling_default`` with ``sigma_indep = σ_r``). Three triggers, as
CBXpy's:

* :class:`ConsensusStagnation` (``consensus_stagnation``): the consensus point moved by
  less than ``update_thresh`` (Euclidean norm) in each of the last ``patience`` steps
  (fewer while fewer are known);
* :class:`LossStagnation` (``loss_update_resampling``): the best energy has not improved
  for ``wait_thresh`` consecutive checks;
* :class:`UpdateStagnation` (``ensemble_update_resampling``): the particles moved by less
  than ``update_thresh`` (``|x_k - x_{k-1}|_F / N``) in the last step.

A :class:`Resampling` goes in the ``resampling`` field of any CBX-family config
(:mod:`cbo_jax.dynamics.family`); the step core applies it after the particles moved
(and were clipped), before they are evaluated, and counts the resamplings of each run
(``history["resamplings"]``).

Timing (as CBXpy's, so that both libraries resample at the same steps): CBXpy runs the
resampling in its post-processing, *before* the step's best-particle and update-norm
bookkeeping. :class:`LossStagnation` therefore sees the best energy as it stood one
step earlier, and :class:`UpdateStagnation` the previous step's update norm; both keep
that one-step lag here too (``tests/test_cbx_family.py`` checks the trigger steps
against CBXpy).
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from cbo_jax import _checks

__all__ = ["Resampling", "ConsensusStagnation", "LossStagnation", "UpdateStagnation", "RESAMPLE_STREAM"]

RESAMPLE_STREAM = 0x72736D70  # "rsmp": fold_in constant of the resampling noise key


class _ConsensusState(NamedTuple):
    old: Any          # the consensus point of the previous check (a pytree)
    has_old: jax.Array
    updates: jax.Array  # (patience,) ring buffer of consensus moves, -inf where unused
    pos: jax.Array


@dataclasses.dataclass(frozen=True)
class ConsensusStagnation:
    """Resample when ``max`` of the last ``patience`` consensus moves is ``< update_thresh``."""

    patience: int = 5
    update_thresh: float = 1e-4

    def __post_init__(self):
        _checks.positive_int("patience", self.patience)
        _checks.non_negative("update_thresh", self.update_thresh)

    def init(self, consensus, dtype):
        return _ConsensusState(jax.tree_util.tree_map(jnp.zeros_like, consensus), jnp.zeros((), bool),
                               jnp.full((self.patience,), -jnp.inf, dtype), jnp.zeros((), jnp.int32))

    def check(self, s: _ConsensusState, *, consensus, **_):
        sq = sum(jnp.sum((a - b) ** 2) for a, b in zip(jax.tree_util.tree_leaves(consensus),
                                                        jax.tree_util.tree_leaves(s.old)))
        move = jnp.sqrt(sq).astype(s.updates.dtype)
        updates = jnp.where(s.has_old, s.updates.at[s.pos % self.patience].set(move), s.updates)
        pos = jnp.where(s.has_old, s.pos + 1, s.pos)
        worst = jnp.where(s.has_old, jnp.max(updates), jnp.inf)
        return worst < self.update_thresh, _ConsensusState(consensus, jnp.ones((), bool), updates, pos)


class _LossState(NamedTuple):
    best: jax.Array  # the trigger's own record of the best energy
    wait: jax.Array
    lag: jax.Array   # the run's best energy one step back (CBXpy's timing)


@dataclasses.dataclass(frozen=True)
class LossStagnation:
    """Resample when the best energy has not improved for ``wait_thresh`` checks."""

    wait_thresh: int = 5

    def __post_init__(self):
        _checks.positive_int("wait_thresh", self.wait_thresh)

    def init(self, consensus, dtype):
        inf = jnp.asarray(jnp.inf, dtype)
        return _LossState(inf, jnp.zeros((), jnp.int32), inf)

    def check(self, s: _LossState, *, best_energy, **_):
        seen = s.lag
        improved = s.best > seen
        wait = jnp.where(improved, 0, s.wait + 1)
        best = jnp.where(improved, seen, s.best)
        fire = wait >= self.wait_thresh
        return fire, _LossState(best, wait % self.wait_thresh, jnp.asarray(best_energy, s.lag.dtype))


class _UpdateState(NamedTuple):
    lag: jax.Array  # the previous step's update norm (inf before the first)


@dataclasses.dataclass(frozen=True)
class UpdateStagnation:
    """Resample when the previous step moved the particles by less than ``update_thresh`` (``|Δx|_F / N``)."""

    update_thresh: float = 1e-4

    def __post_init__(self):
        _checks.non_negative("update_thresh", self.update_thresh)

    def init(self, consensus, dtype):
        return _UpdateState(jnp.asarray(jnp.inf, dtype))

    def check(self, s: _UpdateState, **_):
        return s.lag < self.update_thresh, s

    @staticmethod
    def after_move(s: _UpdateState, update_norm):
        return _UpdateState(jnp.asarray(update_norm, s.lag.dtype))


_TRIGGERS = (ConsensusStagnation, LossStagnation, UpdateStagnation)


@dataclasses.dataclass(frozen=True)
class Resampling:
    """Triggers (any one fires) and the kick ``σ_r √dt ξ`` (CBXpy's ``resampling``).

    Attributes:
      triggers: a trigger or a tuple of them (:class:`ConsensusStagnation`,
        :class:`LossStagnation`, :class:`UpdateStagnation`).
      sigma: ``σ_r >= 0``, CBXpy's ``sigma_indep`` (default ``0.1``).
    """

    triggers: Any = (ConsensusStagnation(),)
    sigma: float = 0.1

    def __post_init__(self):
        trig = self.triggers if isinstance(self.triggers, (tuple, list)) else (self.triggers,)
        if not trig:
            raise ValueError("Resampling needs at least one trigger")
        for t in trig:
            if not isinstance(t, _TRIGGERS):
                raise ValueError(f"resampling trigger must be one of {[c.__name__ for c in _TRIGGERS]}, got {t!r}")
        object.__setattr__(self, "triggers", tuple(trig))
        object.__setattr__(self, "sigma", _checks.non_negative("resampling sigma", self.sigma))

    def init(self, consensus, dtype):
        return tuple(t.init(consensus, dtype) for t in self.triggers)

    def check(self, states, **info):
        fire = jnp.zeros((), bool)
        new = []
        for t, s in zip(self.triggers, states):
            f, s = t.check(s, **info)
            fire = fire | f
            new.append(s)
        return fire, tuple(new)

    def after_move(self, states, update_norm):
        return tuple(t.after_move(s, update_norm) if isinstance(t, UpdateStagnation) else s
                     for t, s in zip(self.triggers, states))

    @property
    def tracks_update_norm(self) -> bool:
        return any(isinstance(t, UpdateStagnation) for t in self.triggers)

"""Ask/tell: any dynamics driven by energies computed outside it (issue 60).

:func:`ask_tell` builds a dynamics (``cj.cbo``, ``cj.pso``, ... with their config) whose
objective is the energies a caller tells it. Its pure functions are the step that
:func:`cbo_jax.simulate` runs, cut at the evaluation::

    at = cj.ask_tell(cj.cbo, sigma1=0.8)
    state = at.start(x0, key)          # nothing computed yet: the first ask is x0
    for _ in range(100):
        x, state = at.ask(state)       # the positions to evaluate, (N, d)
        state = at.tell(state, f(x))   # their energies, (N,): one step of the dynamics

``ask(state)`` returns the positions the next step evaluates (the first time: ``x0``, whose
energies :meth:`init` needs), and ``tell(state, energies)`` runs that step (or ``init``) with
those energies in place of the objective's. The step is a pure function of the state (its
key included), so ``tell`` recomputes the positions ``ask`` returned and a loop of ask,
evaluate, tell computes what ``simulate`` computes with that objective, up to float rounding
of the objective itself (``tests/test_asktell.py``: 1e-12 in float64 for every dynamics).

A dynamics that evaluates the objective more than once per step (``E(m)`` for a drift
correction or the stagnation rule, DriftConstrainedCBO's independent-noise pre-step) cannot
be cut at one evaluation; :func:`ask_tell` names the setting. :class:`Optimizer` keeps the
state for a script; its state saves and resumes bit for bit.
"""

from __future__ import annotations

import contextvars
from pathlib import Path
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from cbo_jax import _checks
from cbo_jax.dynamics.base import Particles

__all__ = ["AskTell", "Start", "ask_tell", "Optimizer"]

_mode: contextvars.ContextVar = contextvars.ContextVar("cbo_jax_ask_tell", default=None)


class _Asked(Exception):
    """Raised inside a traced step at its evaluation: ``ask`` catches it with the positions."""

    def __init__(self, x):
        super().__init__("ask")
        self.x = x


class _Told:
    """The objective of an ask/tell dynamics: the energies ``tell`` was given."""

    host = True  # one block per step at any N: the whole population is evaluated at once

    def __init__(self, name: str, slot: int = 0):
        self.__qualname__ = f"ask_tell({name})" if slot == 0 else f"ask_tell({name})[{slot}]"
        self.slot = slot

    def __call__(self, x):
        mode = _mode.get()
        if mode is None:
            raise RuntimeError("this dynamics takes its energies from tell(): drive it with ask/tell "
                               "(cbo_jax.ask_tell), not simulate")
        rows = jax.tree_util.tree_leaves(x)[0].shape[0]
        if rows != mode["n"]:
            raise ValueError(f"{mode['name']}: this setting evaluates the objective on {rows} point(s) besides the "
                             f"{mode['n']} particles in a step (E(m) for a drift correction or the stagnation "
                             "rule); ask/tell needs one evaluation per step: use correction='none' and no "
                             "stagnation_patience")
        if mode["kind"] == "ask":
            raise _Asked(x)
        calls = mode["calls"]
        calls[self.slot] = calls.get(self.slot, 0) + 1
        if calls[self.slot] > 1:
            raise ValueError(f"{mode['name']}: this setting evaluates the particles twice in a step (a pre-step, "
                             "as DriftConstrainedCBO's independent noise); ask/tell needs one evaluation per step")
        e = mode["energies"]
        return e[self.slot] if e.ndim == 2 else e


class Start(NamedTuple):
    """The state before the first tell: the initial particles, the key and the numbers."""

    x0: Any
    key: jax.Array
    params: Any = None


class AskTell(NamedTuple):
    """``start(x0, key, params=None) -> state``, ``ask(state) -> (x, state)``,
    ``tell(state, energies) -> state`` (pure, jittable; see the module docstring) and the
    underlying ``dynamics`` (its ``init`` and ``step`` read the energies from ``tell``)."""

    start: Callable[..., Start]
    ask: Callable[[Any], tuple[Any, Any]]
    tell: Callable[[Any, Any], Any]
    dynamics: Any
    slots: int = 1  # the objectives told at once: energies (N,) for 1, (slots, N) beyond


def ask_tell(make: Callable, *args: Any, **kwargs: Any) -> AskTell:
    """The ask/tell functions of ``make(objective, *args, **kwargs)`` (``cj.cbo``, ``cj.pso``,
    ``cj.polar_cbo``, ...; config and overrides as for the objective's dynamics).

    The clustered system takes the number of classes ``K`` in place of its objectives
    (``ask_tell(cj.clustered, K, config)``, with ``upper=U`` for ``U`` upper-level objectives)
    and CB²O none (``ask_tell(cj.cb2o, config)``); their ``start`` takes a
    :func:`~cbo_jax.dynamics.clustered.particles` bundle, and ``tell`` takes the energies of
    every objective, ``(K + U, N)``: the ``K`` lower-level losses, then the upper level
    (CB²O: ``(2, N)``, ``L`` then ``G``).
    """
    from cbo_jax.dynamics.clustered import cb2o, clustered

    name = getattr(make, "__name__", "dynamics")
    slots = 1
    if make is clustered:
        if not args or isinstance(args[0], bool) or not isinstance(args[0], int) or args[0] < 1:
            raise ValueError("ask_tell(cj.clustered, K, ...): give the number of classes K in place of the objectives")
        k = args[0]
        upper = kwargs.pop("upper", None)
        if upper is not None and (isinstance(upper, bool) or not isinstance(upper, int) or upper < 1):
            raise ValueError("ask_tell(cj.clustered, K, upper=U): give the number of upper-level objectives U (1 or K)")
        uppers = None if upper is None else [_Told(name, k + u) for u in range(upper)]
        dyn = clustered([_Told(name, j) for j in range(k)], *args[1:], upper=uppers, **kwargs)
        slots = k + (upper or 0)
    elif make is cb2o:
        dyn = cb2o(_Told(name, 0), _Told(name, 1), *args, **kwargs)
        slots = 2
    else:
        dyn = make(_Told(name), *args, **kwargs)
    config = dyn.config
    if getattr(config, "uses_gradient", False):
        raise ValueError(f"{name}: gradient terms (lambda2={config.lambda2}, sigma2={config.sigma2}) need the "
                         "objective's derivative, which ask/tell does not have; set them to 0")
    for attr, what in (("correction", "a drift correction evaluates E(m) each step"),):
        if getattr(config, attr, "none") not in ("none", None):
            raise ValueError(f"{name}: {attr}={getattr(config, attr)!r}: {what}; ask/tell needs one evaluation "
                             "per step")
    if getattr(config, "stagnation_patience", None) is not None:
        raise ValueError(f"{name}: stagnation_patience evaluates E(m) each step; ask/tell needs one evaluation per "
                         "step")
    sigma_indep = getattr(config, "sigma_indep", 0)
    if not isinstance(sigma_indep, (int, float)) or sigma_indep != 0:
        raise ValueError(f"{name}: sigma_indep={sigma_indep!r}: the independent-noise pre-step evaluates the particles "
                         "before the step does; ask/tell needs one evaluation per step (sigma_indep=0)")
    dtype = jnp.dtype(getattr(config, "dtype", "float32"))

    def start(x0, key, params=None) -> Start:
        key = _checks.as_key("key", key)
        if isinstance(x0, Particles):  # the positions in the dtype, the labels, mask and ids as they are
            return Start(x0._replace(x=jax.tree_util.tree_map(lambda v: jnp.asarray(v, dtype), x0.x)), key, params)
        if slots > 1:
            raise ValueError(f"{name}: start takes a cbo_jax.dynamics.clustered.particles(x, label, ...) bundle")
        return Start(jax.tree_util.tree_map(lambda v: jnp.asarray(v, dtype), x0), key, params)

    def _positions(x0):
        return x0.x if isinstance(x0, Particles) else x0

    def _n(state) -> int:
        x = _positions(state.x0) if isinstance(state, Start) else state.x
        return jax.tree_util.tree_leaves(x)[0].shape[0]

    def ask(state):
        if isinstance(state, Start):
            return _positions(state.x0), state
        token = _mode.set({"kind": "ask", "n": _n(state), "name": name})
        try:
            dyn.step(state)
        except _Asked as asked:
            return asked.x, state
        finally:
            _mode.reset(token)
        raise RuntimeError(f"{name}: the step did not evaluate its particles")  # pragma: no cover

    def tell(state, energies):
        n = _n(state)
        e = jnp.asarray(energies)
        want = (n,) if slots == 1 else (slots, n)
        if e.shape != want:
            raise ValueError(f"tell needs one energy per particle{'' if slots == 1 else ' and objective'}, shape "
                             f"{want}; got {e.shape}")
        if not (jnp.issubdtype(e.dtype, jnp.floating) or jnp.issubdtype(e.dtype, jnp.integer)):
            raise ValueError(f"tell needs real energies, got dtype {e.dtype}")
        token = _mode.set({"kind": "tell", "n": n, "name": name, "energies": e, "calls": {}})
        try:
            if isinstance(state, Start):
                return dyn.init(state.x0, state.key) if state.params is None else dyn.init(state.x0, state.key,
                                                                                          state.params)
            return dyn.step(state)
        finally:
            _mode.reset(token)

    return AskTell(start=start, ask=ask, tell=tell, dynamics=dyn, slots=slots)


class Optimizer:
    """A stateful ask/tell loop for scripts::

        opt = cj.Optimizer(cj.ask_tell(cj.cbo, sigma1=0.8), x0, key=0)
        for _ in range(100):
            x = opt.ask()          # a NumPy array (N, d)
            opt.tell(f(x))         # NumPy energies (N,)
        opt.best_x, opt.best_energy

    ``ask`` and ``tell`` are compiled once. ``opt.state`` is the dynamics' state (after the
    first tell, the state ``simulate`` keeps); :meth:`save` writes it and :meth:`restore`
    continues from it bit for bit.
    """

    def __init__(self, at: AskTell, x0: Any, key: Any = 0, params: Any = None):
        if not isinstance(at, AskTell):
            raise TypeError(f"Optimizer needs cbo_jax.ask_tell(make, ...), got {type(at).__name__}")
        self.at = at
        self.state = at.start(x0, key, params)
        self._ask = jax.jit(at.ask)
        self._tell = jax.jit(at.tell)
        self.tells = 0
        self._asked = False

    def ask(self) -> np.ndarray:
        """The positions to evaluate next (the initial particles the first time)."""
        x, self.state = self._ask(self.state)
        self._asked = True
        return jax.tree_util.tree_map(np.asarray, x)

    def tell(self, energies) -> None:
        """The energies of the positions :meth:`ask` returned: runs the step (or the start)."""
        if not self._asked:
            raise RuntimeError("tell() before ask(): ask for the positions first")
        self.state = self._tell(self.state, jnp.asarray(energies))
        self.tells += 1
        self._asked = False

    @property
    def best_x(self):
        return None if isinstance(self.state, Start) else np.asarray(self.state.best_x)

    @property
    def best_energy(self):
        return None if isinstance(self.state, Start) else float(self.state.best_energy)

    def save(self, path: str | Path) -> Path:
        """Write the state after the last tell (``.npz``; key data as raw bits)."""
        if isinstance(self.state, Start):
            raise RuntimeError("nothing to save before the first tell")
        leaves, _ = jax.tree_util.tree_flatten(self.state)
        arrays = {f"leaf{i}": np.asarray(jax.random.key_data(v) if _is_key(v) else v) for i, v in enumerate(leaves)}
        path = Path(path)
        np.savez(path, tells=self.tells, **arrays)
        return path if path.suffix == ".npz" else path.with_name(path.name + ".npz")

    def restore(self, path: str | Path) -> None:
        """Continue from a state :meth:`save` wrote (made by the same dynamics and population shape)."""
        if isinstance(self.state, Start):  # the state's structure: the start told zeros (one init)
            x0 = jax.tree_util.tree_leaves(self.state.x0)[0]
            shape = (x0.shape[0],) if self.at.slots == 1 else (self.at.slots, x0.shape[0])
            like = self._tell(self.state, jnp.zeros(shape, x0.dtype))
        else:
            like = self.state
        leaves, treedef = jax.tree_util.tree_flatten(like)
        with np.load(Path(path)) as f:
            if len([k for k in f.files if k.startswith("leaf")]) != len(leaves):
                raise ValueError(f"{path} holds another dynamics' state ({len(f.files) - 1} arrays, this one has "
                                 f"{len(leaves)})")
            new = []
            for i, v in enumerate(leaves):
                a = f[f"leaf{i}"]
                if _is_key(v):
                    new.append(jax.random.wrap_key_data(jnp.asarray(a), impl=jax.random.key_impl(v)))
                else:
                    if tuple(a.shape) != tuple(v.shape):
                        raise ValueError(f"{path}: array {i} has shape {a.shape}, this optimizer's {v.shape}")
                    new.append(jnp.asarray(a, v.dtype))
            self.tells = int(f["tells"])
        self.state = jax.tree_util.tree_unflatten(treedef, new)
        self._asked = False


def _is_key(v) -> bool:
    return hasattr(v, "dtype") and jax.dtypes.issubdtype(v.dtype, jax.dtypes.prng_key)

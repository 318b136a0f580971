"""Step-by-step comparison with CBXpy: the same initial particles and the same normals.

A test helper, not in the wheel: used by ``tests/dynamics/test_family.py``
and ``benchmarks/cbx_family.py`` (needs ``cbx``, the
test extra). A cbo_jax dynamic draws every standard normal through
:func:`cbo_jax.sde.draw_normal`; :func:`record` runs it once un-jitted with
that function wrapped, so the draws come out in the order the step makes them. CBXpy
1.0.4 draws through its ``sampler`` (the noise models and the resampling), through
NumPy's global generator (DriftConstrainedCBO's independent noise) and through its own
``batch_rng`` (random batches); :func:`cbx_run` replaces all three with feeds that hand
out the recorded arrays (and permutations) in order, checking each requested shape, and
its ``check_f_dims`` probe at construction gets a dummy draw. Then the jitted
:func:`cbo_jax.simulate` runs from the same particles and key, and the particles of both
libraries are compared after each step.

:data:`CASES` holds one entry per dynamic, noise model and option compared; each
builds the pair for given ``(N, d)``.
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

import cbo_jax as cj
from cbo_jax import constraints as cons
from cbo_jax import objectives, schedules
from cbo_jax import sde
from cbo_jax.dynamics import core

__all__ = ["Case", "CASES", "record", "cbx_run", "compare", "Recorded"]


class Recorded(NamedTuple):
    draws: list        # every normal array drawn, in order
    xs: list           # particles after each step (NumPy)
    batches: list      # per step: the batch's particle indices in permutation order, or None
    perms: list        # the random-batch permutations in the order they were drawn
    state: object      # the last state
    history: dict      # simulate's history


@contextlib.contextmanager
def _recording(draws: list):
    """Wrap the family's draw function so that every draw is also handed to the host, in
    program order (``jax.debug.callback(ordered=True)``): a jitted run records itself."""
    real = sde.draw_normal

    def wrapped(key, tree, ids, rng):
        out = real(key, tree, ids, rng)
        dtype = np.dtype(out.dtype)
        # Sent as raw bits: a callback may run on a thread where a jax.enable_x64 context
        # does not apply, and float64 would come back canonicalised to float32.
        bits = jax.lax.bitcast_convert_type(out, jnp.uint32)
        jax.debug.callback(lambda b: draws.append(np.ascontiguousarray(np.asarray(b)).view(dtype).reshape(
            np.shape(b)[:out.ndim])), bits, ordered=True)
        return out

    sde.draw_normal = wrapped
    try:
        yield
    finally:
        sde.draw_normal = real


def _observe(state):
    out = {"x": state.x}
    if state.batch is not None:
        out["perm"], out["pos"] = state.batch.perm, state.batch.pos
    return out


def record(dyn, x0, key, steps: int) -> Recorded:
    """Run ``steps`` steps of ``dyn`` with :func:`cbo_jax.simulate` (jitted), recording every
    normal draw, the particles after each step and the random batches."""
    draws = []
    with _recording(draws):
        res = cj.simulate(dyn, x0, key, steps, observe=_observe)
    jax.effects_barrier()
    xs = [np.asarray(v) for v in res.history["x"]]
    batches, perms = [], []
    if "perm" in res.history:
        bs = dyn.config.batch_size
        prev = None
        for perm, pos in zip(res.history["perm"], res.history["pos"]):
            perm, pos = np.asarray(perm), int(pos)
            if prev is None or pos == bs or not np.array_equal(perm, prev):
                perms.append(perm.copy())
            prev = perm
            batches.append(perm[pos - bs:pos].copy())
    else:
        batches = [None] * steps
    return Recorded(draws, xs, batches, perms, res.state, res.history)


class _Feed:
    """Hands out recorded arrays in order (CBXpy's ``sampler`` and NumPy's ``normal``)."""

    def __init__(self, draws, batches):
        self.draws = list(draws)
        self.batches = batches
        self.step = 0

    def take(self, size):
        size = tuple(int(s) for s in size)
        if not self.draws:
            raise AssertionError(f"CBXpy asked for a normal draw of shape {size} that cbo_jax never made")
        z = self.draws.pop(0)
        idx = self.batches[self.step] if self.batches and self.step < len(self.batches) else None
        if idx is not None and size[1] == len(idx) and z.shape[0] != len(idx):
            z = z[idx]  # a partial batch: CBXpy draws for the batch's particles only
        if size[1:] != z.shape:
            raise AssertionError(f"draw order differs: CBXpy asked for shape {size}, cbo_jax drew {z.shape}")
        return np.broadcast_to(z, size).copy()

    def sampler(self, size=None):
        return self.take(size)

    def normal(self, loc=0.0, scale=1.0, size=None):
        return loc + scale * self.take(size)


class _BatchRNG:
    """CBXpy's ``batch_rng`` replaced: ``permuted`` returns cbo_jax's permutations in order."""

    def __init__(self, perms):
        self.perms = list(perms)

    def permuted(self, ind, axis=1):
        return np.broadcast_to(self.perms.pop(0), ind.shape).copy()


def cbx_run(make_cbx: Callable, rec: Recorded, steps: int, sched=None, x0=None) -> list:
    """Build CBXpy's dynamic with the feeds and run ``steps`` steps; particles after each."""
    import cbx.dynamics.pdyn as pdyn
    from cbx.scheduler import scheduler

    dummy = np.zeros((1,) + np.shape(x0))  # check_f_dims' probe (default check_f_dims=True)
    feed = _Feed([dummy[0]] + list(rec.draws), rec.batches)
    real_gen = pdyn.Generator
    real_normal = np.random.normal
    try:
        pdyn.Generator = lambda *a, **k: _BatchRNG(rec.perms)  # noqa: E731 - the batch_rng at construction
        np.random.normal = feed.normal
        dyn = make_cbx(feed.sampler)
        sched = sched() if callable(sched) else (sched or scheduler([]))
        xs, best, evals, best_x = [], [], [], []
        for k in range(steps):
            feed.step = k
            dyn.step()
            sched.update(dyn)
            xs.append(np.array(dyn.x[0]))
            best.append(float(dyn.best_energy[0]))
            evals.append(int(dyn.num_f_eval[0]))
            best_x.append(np.array(dyn.best_particle[0]))
    finally:
        pdyn.Generator = real_gen
        np.random.normal = real_normal
    if feed.draws:
        raise AssertionError(f"cbo_jax drew {len(feed.draws)} normal arrays that CBXpy never asked for")
    return {"xs": xs, "best_energy": best, "evals": evals, "best_particle": best_x, "dyn": dyn}


class Case(NamedTuple):
    """One compared configuration: ``build(n, d) -> (dynamics, make_cbx(sampler), scheduler factory, x0)``."""

    name: str
    dynamic: str
    build: Callable
    d: int = 3


def _x0(n, d, seed=0, low=-3.0, high=3.0):
    return np.random.default_rng(seed).uniform(low, high, (n, d))


def _mult(a0=1.0):
    return schedules.Multiplicative(a0, 1.05, 1e5)


def _cbx_mult():
    from cbx.scheduler import multiply, scheduler

    return scheduler([multiply(name="alpha", factor=1.05)])


def _common(sampler, x0, dt, sigma, lam, alpha, noise):
    return dict(f_dim="3D", x=x0[None].copy(), dt=dt, sigma=sigma, lamda=lam, alpha=alpha, noise=noise,
                sampler=sampler, verbosity=0, track_args={"names": []}, max_it=10**9)


def _cbo_case(noise, *, correction="none", extra=None, cbx_extra=None, sched=None, cbx_sched=None, obj="ackley",
              batch=None, const_alpha=False):
    def build(n, d, dtype="float64"):
        from cbx.dynamics import CBO
        from cbx import objectives as co

        f, fc = (objectives.Ackley(), co.Ackley()) if obj == "ackley" else (objectives.Rastrigin(), co.Rastrigin())
        x0 = _x0(n, d)
        kw = dict(lambda1=1.0, sigma1=1.2, dt=0.02, alpha=1.0 if const_alpha else _mult(2.0), noise=noise,
                  correction=correction, dtype=dtype, **(extra or {}))
        if batch is not None:
            kw.update(batch_size=batch[0], batch_partial=batch[1])
        dyn = cj.cbo(f, **kw)

        def make(sampler):
            ckw = _common(sampler, x0, 0.02, 1.2, 1.0, 1.0 if const_alpha else 2.0, noise)
            if batch is not None:
                ckw["batch_args"] = {"size": batch[0], "partial": batch[1]}
            return CBO(fc, correction={"none": "no_correction", "heaviside": "heavi_side",
                                       "heaviside_reg": "heavi_side_reg"}[correction], **ckw, **(cbx_extra or {}))

        return dyn, make, None if const_alpha else (cbx_sched or _cbx_mult), x0

    return build


def _alpha(noise):
    """Covariance noise: a constant α = 1, so that the weighted covariance stays well conditioned
    (its square root is only Hölder-1/2 at a singular matrix: rounding of size ε in an eigenvalue
    near 0 becomes √ε in the noise, whatever the library)."""
    return (1.0, 1.0, None) if noise == "covariance" else (_mult(2.0), 2.0, _cbx_mult)


def _memory_case(noise):
    def build(n, d, dtype="float64"):
        from cbx.dynamics import CBOMemory
        from cbx import objectives as co

        x0 = _x0(n, d)
        a, a0, sched = _alpha(noise)
        dyn = cj.cbo_memory(objectives.Ackley(), lambda1=1.0, sigma1=1.1, dt=0.02, alpha=a, noise=noise,
                            lambda_memory=0.5, dtype=dtype)
        return dyn, lambda s: CBOMemory(co.Ackley(), lamda_memory=0.5, **_common(s, x0, 0.02, 1.1, 1.0, a0, noise)), \
            sched, x0

    return build


def _pso_case(noise):
    def build(n, d, dtype="float64"):
        from cbx.dynamics import PSO
        from cbx import objectives as co

        x0 = _x0(n, d)
        a, a0, sched = _alpha(noise)
        dyn = cj.pso(objectives.Ackley(), lambda1=1.0, sigma1=0.8, dt=0.02, alpha=a, noise=noise, m=0.2,
                     lambda_memory=0.4, formulation="cbxpy", dtype=dtype)
        return dyn, lambda s: PSO(co.Ackley(), m=0.2, lamda_memory=0.4, **_common(s, x0, 0.02, 0.8, 1.0, a0, noise)), \
            sched, x0

    return build


def _cbs_case(mode):
    def build(n, d, dtype="float64"):
        from cbx.dynamics import CBS
        from cbx import objectives as co

        x0 = _x0(n, d)
        dyn = cj.cbs(objectives.Ackley(), lambda1=1.0, dt=0.02, alpha=3.0, mode=mode, dtype=dtype)

        def make(s):
            kw = _common(s, x0, 0.02, 1.0, 1.0, 3.0, "covariance")
            return CBS(co.Ackley(), mode=mode, **kw)

        return dyn, make, None, x0

    return build


def _polar_case(kernel, noise, kappa=1.5, covariance="cbxpy"):
    def build(n, d, dtype="float64"):
        from cbx.dynamics import PolarCBO
        from cbx import objectives as co

        x0 = _x0(n, d)
        a, _, sched = _alpha(noise)
        a = _mult(1.0) if noise != "covariance" else a
        dyn = cj.polar_cbo(objectives.Ackley(), lambda1=1.0, sigma1=0.7, dt=0.02, alpha=a, noise=noise,
                           kernel=kernel, kappa=kappa, covariance=covariance, dtype=dtype, chunk=max(1, n // 3))
        names = {"gaussian": "Gaussian", "laplace": "Laplace", "constant": "Constant",
                 "inverse_quadratic": "InverseQuadratic", "taz": "Taz"}
        return dyn, lambda s: PolarCBO(co.Ackley(), kernel=names[kernel], kappa=kappa,
                                       **_common(s, x0, 0.02, 0.7, 1.0, 1.0, noise)), sched, x0

    return build


def _adam_case(noise):
    def build(n, d, dtype="float64"):
        from cbx.dynamics import AdamCBO
        from cbx import objectives as co

        x0 = _x0(n, d)
        dyn = cj.adam_cbo(objectives.Ackley(), lambda1=0.05, sigma1=0.5, dt=0.02, alpha=_mult(2.0), noise=noise,
                          dtype=dtype)
        return dyn, lambda s: AdamCBO(co.Ackley(), **_common(s, x0, 0.02, 0.5, 0.05, 2.0, noise)), _cbx_mult, x0

    return build


def _mirror_case(name, kwargs=None, x_range=(-3.0, 3.0), noise="anisotropic", lam=1.0, sigma=0.6):
    def build(n, d, dtype="float64"):
        from cbx.dynamics import MirrorCBO
        from cbx.dynamics import mirrorcbo
        from cbx import objectives as co

        x0 = _x0(n, d, low=x_range[0], high=x_range[1])
        spec = dict(name=name, **(kwargs or {}))
        dyn = cj.mirror_cbo(objectives.Ackley(shift=0.2), lambda1=lam, sigma1=sigma, dt=0.02, alpha=_mult(2.0),
                            noise=noise, mirror_map=spec, dtype=dtype)

        def theirs():  # CBXpy 1.0.4 ships ProjectionStiefel but leaves it out of its name table
            if name == "ProjectionStiefel":
                return mirrorcbo.ProjectionStiefel(**(kwargs or {}))
            return dict(spec)

        def peer(s):
            with warnings.catch_warnings():  # a map object, not a name: CBXpy says it takes it as one
                warnings.filterwarnings("ignore", message="MirrorMap did not fit the signature", category=UserWarning)
                return MirrorCBO(co.Ackley(minimum=0.2), mirrormap=theirs(),
                                 **_common(s, x0, 0.02, sigma, lam, 2.0, noise))

        return dyn, peer, _cbx_mult, x0

    return build


def _plain_sphere(x):
    """``|x|² - 1`` as a plain function: the general (automatic differentiation, dense solve) path."""
    return jnp.sum(x * x) - 1.0


def _drift_constrained_case(noise, sigma_indep=0.0, plain=False):
    def build(n, d, dtype="float64"):
        from cbx.dynamics import DriftConstrainedCBO
        from cbx import objectives as co

        x0 = _x0(n, d, low=-1.5, high=1.5)
        c = [{"name": "sphere", "r": 1.0}]
        dyn = cj.drift_constrained_cbo(objectives.Ackley(shift=0.3), lambda1=1.0, sigma1=0.5, dt=0.05,
                                       alpha=_mult(2.0), noise=noise, constraints=[_plain_sphere] if plain else c,
                                       eps=0.5, eps_indep=0.3,
                                       sigma_indep=sigma_indep, dtype=dtype)
        return dyn, lambda s: DriftConstrainedCBO(co.Ackley(minimum=0.3), constraints=c, eps=0.5, eps_indep=0.3,
                                                  sigma_indep=sigma_indep,
                                                  **_common(s, x0, 0.05, 0.5, 1.0, 2.0, noise)), _cbx_mult, x0

    return build


def _hypersurface_case(noise, sdf=None, plain=False):
    def build(n, d, dtype="float64"):
        from cbx.dynamics import HyperSurfaceCBO
        from cbx import objectives as co

        x0 = _x0(n, d)
        if sdf is None:
            x0 = x0 / np.linalg.norm(x0, axis=1, keepdims=True)
        elif sdf["name"] == "Stiefel":
            u, _, vh = np.linalg.svd(x0.reshape((n,) + tuple(sdf["nk"])), full_matrices=False)
            x0 = (u @ vh).reshape(n, d)
        else:
            a = np.asarray(sdf["a"], float)
            x0 = x0 - ((x0 @ a - sdf["b"]) / (a @ a))[:, None] * a
        surface = (lambda v: jnp.linalg.norm(v) - 1.0) if plain else sdf
        dyn = cj.hypersurface_cbo(objectives.Ackley(shift=0.4), lambda1=1.0, sigma1=0.4, dt=0.02, alpha=_mult(2.0),
                                  noise=noise, surface=surface, dtype=dtype)
        return dyn, lambda s: HyperSurfaceCBO(co.Ackley(minimum=0.4), sdf=sdf,
                                              **_common(s, x0, 0.02, 0.4, 1.0, 2.0, noise)), _cbx_mult, x0

    return build


def _reg_combination_case(constraint, noise="anisotropic", plain=False):
    def build(n, d, dtype="float64"):
        from cbx.dynamics import RegCombinationCBO
        from cbx import objectives as co

        x0 = _x0(n, d, low=-1.5, high=1.5)
        c = dict(constraint)
        if c["name"] == "quadric":
            A = np.diag(np.linspace(0.5, 1.5, d))
            c.update(A=A, b=np.linspace(-0.2, 0.2, d), c=-1.0)
        elif c["name"] == "plane":
            c.update(a=np.linspace(1.0, 2.0, d), b=0.5)
        dyn = cj.reg_combination_cbo(objectives.Ackley(shift=0.3), lambda1=1.0, sigma1=0.5, dt=0.02,
                                     alpha=_mult(2.0), noise=noise, constraints=[_plain_sphere] if plain else [c],
                                     eps=0.2, nu=0.5, dtype=dtype)
        return dyn, lambda s: RegCombinationCBO(co.Ackley(minimum=0.3), constraints=[dict(c)], eps=0.2, nu=0.5,
                                                **_common(s, x0, 0.02, 0.5, 1.0, 2.0, noise)), _cbx_mult, x0

    return build


def _resampling_case(trigger):
    """CBO with resampling (CBXpy: ``post_process`` = default clipping, then ``resampling``)."""
    def build(n, d, dtype="float64"):
        from cbx.dynamics import CBO
        from cbx.dynamics.pdyn import post_process_default
        from cbx.utils import resampling as rs
        from cbx import objectives as co

        x0 = _x0(n, d)
        if trigger == "consensus":
            ours, theirs = cj.resampling.ConsensusStagnation(patience=3, update_thresh=0.05), \
                lambda: rs.consensus_stagnation(patience=3, update_thresh=0.05)
        elif trigger == "loss":
            ours, theirs = cj.resampling.LossStagnation(wait_thresh=4), lambda: rs.loss_update_resampling(wait_thresh=4)
        else:
            ours, theirs = cj.resampling.UpdateStagnation(update_thresh=0.01), \
                lambda: rs.ensemble_update_resampling(update_thresh=0.01)
        dyn = cj.cbo(objectives.Sphere(), lambda1=1.0, sigma1=0.3, dt=0.05, alpha=_mult(5.0), noise="anisotropic",
                     resampling=cj.resampling.Resampling(ours, sigma=0.5), dtype=dtype)

        def make(s):
            r = rs.resampling([theirs()], sigma_indep=0.5)
            clip = post_process_default()

            def post(dyn):
                clip(dyn)
                r(dyn)

            from cbx.objectives import Quadratic
            return CBO(Quadratic(), post_process=post, **_common(s, x0, 0.05, 0.3, 1.0, 5.0, "anisotropic"))

        return dyn, make, _cbx_mult, x0

    return build


def _sigma_schedule_case():
    def build(n, d, dtype="float64"):
        from cbx.scheduler import multiply, scheduler

        dyn, make, _, x0 = _cbo_case("anisotropic")(n, d, dtype)
        dyn = cj.cbo(dyn.objective, dyn.config, schedule={"sigma1": schedules.Multiply(0.97, maximum=1e5)})
        return dyn, make, lambda: scheduler([multiply(name="alpha", factor=1.05),
                                             multiply(name="sigma", factor=0.97)]), x0

    return build


def _noise_callable(key, u, dt):
    """A user noise: Laplace-tailed ``√dt · |u| ∘ sign(ξ) ξ²`` (reads one normal draw)."""
    z = core.draw_normal(key, u, None, "fast")
    return jnp.sqrt(dt) * jnp.abs(u) * jnp.sign(z) * z * z


def _cbx_noise_callable(sampler):
    def noise(dyn):
        z = sampler(size=dyn.drift.shape)
        return np.sqrt(dyn.dt) * np.abs(dyn.drift) * np.sign(z) * z * z

    return noise


def _callable_case():
    def build(n, d, dtype="float64"):
        from cbx.dynamics import CBO
        from cbx import objectives as co

        x0 = _x0(n, d)
        dyn = cj.cbo(objectives.Ackley(), lambda1=1.0, sigma1=0.8, dt=0.02, alpha=_mult(2.0), noise=_noise_callable,
                     dtype=dtype)

        def make(s):
            kw = _common(s, x0, 0.02, 0.8, 1.0, 2.0, "anisotropic")
            kw["noise"] = _cbx_noise_callable(s)
            return CBO(co.Ackley(), **kw)

        return dyn, make, _cbx_mult, x0

    return build


CASES = [
    Case("cbo-anisotropic", "cbo", _cbo_case("anisotropic")),
    Case("cbo-isotropic", "cbo", _cbo_case("isotropic", obj="rastrigin")),
    Case("cbo-constant", "cbo", _cbo_case("constant")),
    Case("cbo-covariance", "cbo", _cbo_case("covariance", const_alpha=True)),
    Case("cbo-callable-noise", "cbo", _callable_case()),
    Case("cbo-heaviside", "cbo", _cbo_case("anisotropic", correction="heaviside")),
    Case("cbo-heaviside-reg", "cbo", _cbo_case("isotropic", correction="heaviside_reg")),
    Case("cbo-batch-partial", "cbo", _cbo_case("anisotropic", batch=(7, True))),
    Case("cbo-batch-full", "cbo", _cbo_case("anisotropic", batch=(7, False))),
    Case("cbo-sigma-schedule", "cbo", _sigma_schedule_case()),
    Case("cbo-resample-consensus", "cbo", _resampling_case("consensus")),
    Case("cbo-resample-loss", "cbo", _resampling_case("loss")),
    Case("cbo-resample-update", "cbo", _resampling_case("update")),
    Case("cbo_memory-anisotropic", "cbo_memory", _memory_case("anisotropic")),
    Case("cbo_memory-isotropic", "cbo_memory", _memory_case("isotropic")),
    Case("cbo_memory-constant", "cbo_memory", _memory_case("constant")),
    Case("cbo_memory-covariance", "cbo_memory", _memory_case("covariance")),
    Case("pso-anisotropic", "pso", _pso_case("anisotropic")),
    Case("pso-isotropic", "pso", _pso_case("isotropic")),
    Case("pso-covariance", "pso", _pso_case("covariance")),
    Case("cbs-sampling", "cbs", _cbs_case("sampling")),
    Case("cbs-optimization", "cbs", _cbs_case("optimization")),
    Case("polar_cbo-gaussian", "polar_cbo", _polar_case("gaussian", "anisotropic")),
    Case("polar_cbo-laplace", "polar_cbo", _polar_case("laplace", "isotropic")),
    Case("polar_cbo-constant", "polar_cbo", _polar_case("constant", "anisotropic", kappa=3.0)),
    Case("polar_cbo-inverse-quadratic", "polar_cbo", _polar_case("inverse_quadratic", "anisotropic")),
    Case("polar_cbo-taz", "polar_cbo", _polar_case("taz", "anisotropic")),
    Case("polar_cbo-covariance", "polar_cbo", _polar_case("gaussian", "covariance")),
    Case("adam_cbo-anisotropic", "adam_cbo", _adam_case("anisotropic")),
    Case("adam_cbo-isotropic", "adam_cbo", _adam_case("isotropic")),
    Case("mirror_cbo-L2", "mirror_cbo", _mirror_case("L2", {"lamda": 2.0})),
    Case("mirror_cbo-ElasticNet", "mirror_cbo", _mirror_case("ElasticNet", {"delta": 1.0, "lamda": 0.3})),
    Case("mirror_cbo-ProjectionBall", "mirror_cbo", _mirror_case("ProjectionBall", {"radius": 1.5})),
    Case("mirror_cbo-ProjectionSphere", "mirror_cbo", _mirror_case("ProjectionSphere", {"r": 2.0})),
    Case("mirror_cbo-ProjectionHyperplane", "mirror_cbo",
         _mirror_case("ProjectionHyperplane", {"a": np.array([1.0, 2.0, -1.0]), "b": 0.5})),
    Case("mirror_cbo-ProjectionSquare", "mirror_cbo", _mirror_case("ProjectionSquare", {"r": 1.0}, noise="isotropic")),
    Case("mirror_cbo-ProjectionStiefel", "mirror_cbo", _mirror_case("ProjectionStiefel", {"nk": (3, 1)})),
    Case("mirror_cbo-LogBarrierBox", "mirror_cbo", _mirror_case("LogBarrierBox", x_range=(-0.9, 0.9))),
    Case("mirror_cbo-NonsmoothBarrier", "mirror_cbo", _mirror_case("NonsmoothBarrier", x_range=(-0.9, 0.9))),
    Case("mirror_cbo-Entropy", "mirror_cbo", _mirror_case("Entropy", x_range=(0.1, 0.5), lam=0.3, sigma=0.1)),
    Case("mirror_cbo-EntropySimplex", "mirror_cbo", _mirror_case("EntropySimplex", x_range=(0.05, 1.0))),
    Case("drift_constrained_cbo-isotropic", "drift_constrained_cbo", _drift_constrained_case("isotropic")),
    Case("drift_constrained_cbo-indep-noise", "drift_constrained_cbo",
         _drift_constrained_case("anisotropic", sigma_indep=0.4)),
    Case("drift_constrained_cbo-function", "drift_constrained_cbo", _drift_constrained_case("isotropic", plain=True)),
    Case("hypersurface_cbo-sphere-isotropic", "hypersurface_cbo", _hypersurface_case("isotropic")),
    Case("hypersurface_cbo-sphere-anisotropic", "hypersurface_cbo", _hypersurface_case("anisotropic")),
    Case("hypersurface_cbo-sphere-function", "hypersurface_cbo", _hypersurface_case("isotropic", plain=True)),
    Case("hypersurface_cbo-stiefel", "hypersurface_cbo", _hypersurface_case("isotropic", {"name": "Stiefel",
                                                                                         "nk": (3, 2)}), d=6),
    Case("reg_combination_cbo-sphere", "reg_combination_cbo", _reg_combination_case({"name": "sphere", "r": 1.0})),
    Case("reg_combination_cbo-plane", "reg_combination_cbo", _reg_combination_case({"name": "plane"})),
    Case("reg_combination_cbo-quadric", "reg_combination_cbo", _reg_combination_case({"name": "quadric"})),
    Case("reg_combination_cbo-function", "reg_combination_cbo",
         _reg_combination_case({"name": "sphere", "r": 1.0}, plain=True)),
]


def get_case(name: str) -> Case:
    for c in CASES:
        if c.name == name:
            return c
    raise KeyError(name)


def compare(case: Case, n: int = 20, d: int | None = None, steps: int = 100, seed: int = 1) -> dict:
    """Run ``case`` in both libraries (float64; needs ``jax_enable_x64``); return the differences.

    ``{"max_diff": max over the steps of max_i |x_jax - x_cbx|, "diff_step1", "diff_last",
    "draws": number of normal arrays, "jax": the recording, "cbx": CBXpy's per-step record}``.
    """
    dyn, make_cbx, sched, x0 = case.build(n, d or case.d)
    rec = record(dyn, x0, jax.random.key(seed), steps)
    theirs = cbx_run(make_cbx, rec, steps, sched, x0=x0)
    diffs = [float(np.max(np.abs(a - b))) for a, b in zip(rec.xs, theirs["xs"])]
    return {"max_diff": max(diffs), "diff_step1": diffs[0], "diff_last": diffs[-1], "draws": len(rec.draws),
            "jax": rec, "cbx": theirs, "x0": x0, "dyn": dyn, "n": n}

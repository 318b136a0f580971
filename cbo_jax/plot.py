"""Plots for particle runs, as :class:`matplotlib.figure.Figure` objects (no pyplot state).

* :func:`record_history`: particle positions and consensus points every ``every`` steps
  (a bounded number of frames, optionally of a subset of the particles), by running
  :func:`cbo_jax.simulate` segment by segment from the previous state (a run split at
  any step equals the whole run, so the recorded run is the ordinary one).
* :func:`contour`, :func:`particles`, :func:`snapshots`: a 2-D objective's contour with
  the particles and their consensus point, at one time or at several.
* :func:`animate`: the same as an animation, saved as GIF (Pillow) or MP4 (ffmpeg) with
  matplotlib's writers.
* :func:`variance`: ``V_t`` on a log scale with a predicted exponential rate (FedCBO
  Theorem 2.3, :func:`cbo_jax.meanfield.predicted_decay_rate`).
* :func:`loglog_error`: an error against ``N`` on log-log axes with its fitted slope
  and a reference slope (``-1/2`` Monte-Carlo, ``-1`` for eq. (50)'s coupling).

Every function returns the figure it drew on; pass ``ax=`` to draw into an existing
axes instead. Nothing here calls ``matplotlib.use`` or touches pyplot's figure
registry, so notebooks keep their own backend; show a figure in Jupyter by making it
the cell's value, or save it with ``fig.savefig(path)``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from cbo_jax import _checks

__all__ = ["History", "record_history", "contour", "particles", "snapshots", "animate", "variance",
           "loglog_error"]

PyTree = Any
Bounds = tuple[tuple[float, float], tuple[float, float]]


def _figure(ax=None, figsize=(5.0, 4.0)):
    if ax is not None:
        return ax.figure, ax
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize)
    return fig, fig.subplots()


class History(NamedTuple):
    """Particle positions recorded with a stride (see :func:`record_history`).

    Attributes:
      step: ``(F,)`` step index of each frame (``0`` is the initial population). A run that
        stopped early (``energy_tol``, ``max_evals``, ...) is frozen in the frames after
        its stop; recording ends when every run has stopped, with a frame at that step.
      t: ``(F,)`` times of the frames: ``step · dt``, or the sum of the steps' ``dt`` when
        ``dt`` follows a rule of the config's ``schedule``. NaN where the runs still going
        use different time steps (a sweep of ``dt``) or the dynamics carry no ``dt``.
      x: ``(F, ..., n, d)`` positions of the first ``n`` particles (``n = min(N, max_particles)``).
      consensus: ``(F, ..., d)`` (or ``(F, ..., K, d)`` for the clustered system) consensus points.
      state: the final state (to continue the run).
    """

    step: np.ndarray
    t: np.ndarray
    x: np.ndarray
    consensus: np.ndarray
    state: Any


def record_history(dynamics, x0, key, num_steps: int, *, every: int = 10, max_particles: int | None = 1000,
                   num_runs: int | None = None, params=None, progress: bool = False) -> History:
    """Run ``dynamics`` for ``num_steps`` steps and keep a frame every ``every`` steps.

    Memory is ``(num_steps / every + 1) · min(N, max_particles) · d`` numbers, whatever
    ``N`` and ``num_steps`` are. The population must be an array (``(N, d)``, or a
    :class:`~cbo_jax.Particles` bundle whose ``x`` is one). ``key`` may be an integer seed.
    """
    from cbo_jax import _checks
    from cbo_jax.simulate import simulate

    _checks.positive_int("every", every)
    if isinstance(num_steps, bool) or not isinstance(num_steps, (int, np.integer)) or num_steps < 0:
        raise ValueError(f"num_steps must be an integer >= 0, got {num_steps!r}")
    if max_particles is not None:
        _checks.positive_int("max_particles", max_particles, int32=False)
    state = simulate(dynamics, x0, key, 0, num_runs=num_runs, params=params).state
    if not isinstance(state.x, jax.Array):
        raise ValueError("record_history needs an array population (N, d); got a pytree")
    keep = slice(None) if max_particles is None else slice(0, max_particles)

    def frame(st):
        return np.asarray(st.x[..., keep, :]), np.asarray(st.consensus)

    xs, ms, steps = [], [], [0]
    x, m = frame(state)
    xs.append(x)
    ms.append(m)
    done = 0
    bar = None
    schedule = getattr(getattr(dynamics, "config", None), "schedule", None) or {}
    scheduled_dt = "dt" in schedule and getattr(state, "params", None) is not None
    elapsed, times = 0.0, [0.0]  # with a scheduled dt: the sum of the steps' dt
    if progress:
        from cbo_jax.runtime.progress import progress_bar

        bar = progress_bar(num_steps, desc="record", unit="step")
    try:
        while done < num_steps:
            length = min(every, num_steps - done)
            before = (np.asarray(state.params.dt, np.float64), np.asarray(state.active)) if scheduled_dt else None
            res = simulate(dynamics, None, None, length, num_runs=num_runs, initial_state=state, chunk_size=every,
                           observe=_step_dt if scheduled_dt else None)
            state = res.state
            if res.steps == 0:  # every run had stopped (or could take no step): nothing more to record
                break
            done += res.steps  # fewer than `length` once every run has stopped
            if before is not None:
                elapsed += float(np.sum(_dts_taken(before, res.history)))
                times.append(elapsed)
            x, m = frame(state)
            xs.append(x)
            ms.append(m)
            steps.append(done)
            if bar is not None:
                bar.update(res.steps)
            if res.steps < length:
                break
    finally:
        if bar is not None:
            bar.close()
    step = np.asarray(steps)
    if scheduled_dt:
        t = np.asarray(times, np.float64)
    else:
        dt = np.nan
        if getattr(state, "params", None) is not None:
            dts = np.unique(np.asarray(state.params.dt, np.float64))  # one per run (and sweep point)
            dt = dts[0] if dts.size == 1 else np.nan  # a sweep of dt: no common time axis
        t = step * dt
    return History(step=step, t=t, x=np.stack(xs), consensus=np.stack(ms), state=state)


def _step_dt(state) -> dict:
    """``observe`` of :func:`record_history`: the ``dt`` after each step (a module-level function,
    so that every segment reuses one compiled chunk)."""
    return {"dt": state.params.dt}


def _dts_taken(before, history) -> np.ndarray:
    """The ``dt`` of each step of a segment, common to the runs that took it (NaN where they differ).

    ``before``: the ``dt`` and active flags at the segment's start; ``history``: the segment's
    history with ``dt`` (after each step) and ``active``. Step ``j`` used the ``dt`` left by
    step ``j - 1`` and was taken by the runs active after it.
    """
    dt0, active0 = before
    after = np.asarray(history["dt"], np.float64)
    active = np.asarray(history["active"], bool)
    used = np.concatenate([dt0[None], after[:-1]]).reshape(len(after), -1)
    took = np.concatenate([active0[None], active[:-1]]).reshape(len(after), -1)
    out = np.full(len(after), np.nan)
    for j in range(len(after)):
        vals = np.unique(used[j][took[j]])
        if vals.size == 1:
            out[j] = vals[0]
    return out


def _grid_values(objective: Callable, bounds: Bounds, resolution: int):
    if not (_checks.is_integer(resolution) and resolution >= 2):
        raise ValueError(f"resolution must be an integer >= 2 (grid points per axis), got {resolution!r}")
    (x0, x1), (y0, y1) = bounds
    gx, gy = np.meshgrid(np.linspace(x0, x1, resolution), np.linspace(y0, y1, resolution))
    pts = jnp.asarray(np.stack([gx.ravel(), gy.ravel()], axis=1), jnp.float32)
    z = np.asarray(objective(pts), np.float64)
    if z.size != gx.size:  # checked before the reshape, which would raise NumPy's "cannot reshape"
        raise ValueError(f"objective must map an (n, 2) array of points to (n,) values; it mapped {pts.shape} "
                         f"points to shape {z.shape}")
    return gx, gy, z.reshape(gx.shape)


def _bounds_of(x, bounds):
    if bounds is not None:
        return tuple(tuple(map(float, b)) for b in bounds)
    pts = np.asarray(x).reshape(-1, np.shape(x)[-1])
    lo, hi = np.nanmin(pts, axis=0), np.nanmax(pts, axis=0)
    pad = 0.1 * np.maximum(hi - lo, 1e-6)
    return ((lo[0] - pad[0], hi[0] + pad[0]), (lo[1] - pad[1], hi[1] + pad[1]))


def contour(objective: Callable, bounds: Bounds = ((-3.0, 3.0), (-3.0, 3.0)), *, resolution: int = 200,
            levels: int = 30, ax=None, log: bool = False, cmap: str = "viridis"):
    """Filled contour of a 2-D objective (``(n, 2) -> (n,)``) over ``bounds``; returns the figure."""
    fig, ax = _figure(ax)
    gx, gy, z = _grid_values(objective, bounds, resolution)
    if log:
        z = np.log10(z - z.min() + 1e-12)
    ax.contourf(gx, gy, z, levels=levels, cmap=cmap)
    ax.set_xlim(*bounds[0])
    ax.set_ylim(*bounds[1])
    ax.set_aspect("equal")
    ax.set_xlabel("θ₁")
    ax.set_ylabel("θ₂")
    return fig


def _check_2d(x):
    x = np.asarray(x)
    if x.ndim < 2 or x.shape[-1] != 2:
        raise ValueError(f"particle plots need 2-D particles (..., N, 2), got shape {x.shape}")
    return x


def particles(objective: Callable, x, consensus=None, *, bounds: Bounds | None = None, ax=None, title=None,
              resolution: int = 150, log: bool = False, size: float = 6.0):
    """The objective's contour with particles ``x`` (``(N, 2)``) and the consensus point(s)."""
    x = _check_2d(x).reshape(-1, 2)
    box: Bounds = _bounds_of(x, bounds)
    fig = contour(objective, box, resolution=resolution, ax=ax, log=log)
    ax = ax or fig.axes[0]
    ax.scatter(x[:, 0], x[:, 1], s=size, c="white", edgecolors="black", linewidths=0.3, label="particles")
    if consensus is not None:
        m = np.asarray(consensus).reshape(-1, 2)
        ax.scatter(m[:, 0], m[:, 1], marker="*", s=180, c="red", edgecolors="black", label="consensus")
    if title:
        ax.set_title(title)
    return fig


def snapshots(objective: Callable, history: History, frames: Sequence[int] | None = None, *, ncols: int = 4,
              bounds: Bounds | None = None, run: int = 0, log: bool = False):
    """A grid of :func:`particles` panels at ``frames`` (default: 4 evenly spaced) of a :class:`History`."""
    from matplotlib.figure import Figure

    x = _frames_x(history, run)
    m = _frames_m(history, run)
    if frames is None:
        frames = sorted(set(np.linspace(0, len(x) - 1, min(4, len(x))).round().astype(int).tolist()))
    frames = list(frames)
    # no frames (or ncols=0) would be a ZeroDivisionError, a frame past the end NumPy's IndexError
    if not frames:
        raise ValueError("frames must name at least one frame of the history")
    for f in frames:
        if not _checks.is_integer(f) or not -len(x) <= f < len(x):
            raise ValueError(f"frame {f!r} is out of range: the history has {len(x)} frames (0..{len(x) - 1})")
    _checks.positive_int("ncols", ncols)
    ncols = min(ncols, len(frames))
    nrows = -(-len(frames) // ncols)
    fig = Figure(figsize=(3.2 * ncols, 3.0 * nrows))
    axes = np.atleast_1d(fig.subplots(nrows, ncols)).ravel()
    bounds = _bounds_of(x[frames[0]], bounds)
    for ax, f in zip(axes, frames):
        particles(objective, x[f], m[f], bounds=bounds, ax=ax, title=f"step {history.step[f]}", log=log,
                  resolution=100)
    for ax in axes[len(frames):]:
        ax.set_visible(False)
    fig.tight_layout()
    return fig


def _frames_x(history: History, run: int):
    x = _check_2d(history.x)
    if not _checks.is_integer(run):
        raise ValueError(f"run must be an integer, got {run!r}")
    if x.ndim == 3 and run not in (0, -1):  # one run: another index would be ignored
        raise ValueError(f"run {run} is out of range: the history has one run (no run axis)")
    while x.ndim > 3:  # runs (and sweep points): pick one
        if not -x.shape[1] <= run < x.shape[1]:
            raise ValueError(f"run {run} is out of range: the history has {x.shape[1]} runs")
        x = x[:, run]
    return x


def _frames_m(history: History, run: int):
    m = np.asarray(history.consensus)
    lead = np.asarray(history.x).ndim - 3
    for _ in range(lead):
        m = m[:, run]
    return m


def animate(objective: Callable, history: History, path: str | Path, *, fps: int = 10, bounds: Bounds | None = None,
            run: int = 0, log: bool = False, dpi: int = 80) -> Path:
    """Save the particles of a :class:`History` over the objective's contour as an animation.

    ``path`` ending in ``.gif`` uses matplotlib's ``PillowWriter``; ``.mp4`` its
    ``FFMpegWriter`` (needs ``ffmpeg`` on the ``PATH``). Returns the path.
    """
    from matplotlib import animation
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    _checks.positive("fps", fps)  # 0 would be a ZeroDivisionError inside matplotlib's writer
    path = Path(path)
    suffix = path.suffix.lower()
    writer: animation.AbstractMovieWriter
    if suffix == ".gif":
        writer = animation.PillowWriter(fps=fps)
    elif suffix == ".mp4":
        if not animation.FFMpegWriter.isAvailable():
            raise ValueError("an .mp4 animation needs ffmpeg on the PATH; save a .gif instead")
        writer = animation.FFMpegWriter(fps=fps)
    else:
        raise ValueError(f"animation path must end in .gif or .mp4, got {path.name!r}")
    x = _frames_x(history, run)
    m = _frames_m(history, run)
    box: Bounds = _bounds_of(x, bounds)
    fig = Figure(figsize=(4.5, 4.2))
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    contour(objective, box, ax=ax, log=log, resolution=150)
    dots = ax.scatter(x[0, :, 0], x[0, :, 1], s=6, c="white", edgecolors="black", linewidths=0.3)
    mx, my = np.asarray(m[0]).reshape(-1, 2).T
    star = ax.scatter(mx, my, marker="*", s=180, c="red", edgecolors="black")
    title = ax.set_title(f"step {history.step[0]}")

    def update(f):
        dots.set_offsets(x[f])
        star.set_offsets(np.asarray(m[f]).reshape(-1, 2))
        title.set_text(f"step {history.step[f]}")
        return dots, star, title

    path.parent.mkdir(parents=True, exist_ok=True)
    anim = animation.FuncAnimation(fig, update, frames=len(x), blit=False)
    anim.save(str(path), writer=writer, dpi=dpi)
    return path


def variance(t, v, *, predicted_rate: float | None = None, ax=None, label: str = "V_t", title: str | None = None):
    """``V_t`` on a log scale; with ``predicted_rate`` r, the line ``V_0 e^{-r t}`` (Theorem 2.3)."""
    fig, ax = _figure(ax)
    t = np.asarray(t, np.float64)
    v = np.asarray(v, np.float64)
    if t.shape != v.shape or t.ndim != 1:
        raise ValueError(f"t and v must be 1-D of the same length, got {t.shape} and {v.shape}")
    line, = ax.semilogy(t, v, label=label)
    if predicted_rate is not None:
        ax.semilogy(t, v[0] * np.exp(-float(predicted_rate) * (t - t[0])), "--", color=line.get_color(), lw=1,
                    label=f"predicted rate {float(predicted_rate):.3g}")
    ax.set_xlabel("t")
    ax.set_ylabel("V(ρ_t)")
    if title:
        ax.set_title(title)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, which="both")
    return fig


def loglog_error(sizes, errors, *, stderr=None, reference_slope: float | None = None, ax=None, xlabel: str = "N",
                 ylabel: str = "error", title: str | None = None):
    """``errors`` against ``sizes`` on log-log axes, the least-squares slope in the legend,
    and a reference line of slope ``reference_slope`` through the first point."""
    from cbo_jax.meanfield import fit_loglog_slope

    fig, ax = _figure(ax)
    n = np.asarray(sizes, np.float64)
    e = np.asarray(errors, np.float64)
    slope = fit_loglog_slope(n, e)
    if stderr is not None:
        ax.errorbar(n, e, yerr=np.asarray(stderr, np.float64), fmt="o-", capsize=3, label=f"measured, slope {slope:.3f}")
    else:
        ax.plot(n, e, "o-", label=f"measured, slope {slope:.3f}")
    if reference_slope is not None:
        ax.plot(n, e[0] * (n / n[0]) ** float(reference_slope), "k--", lw=1, label=f"slope {reference_slope:g}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, which="both")
    return fig

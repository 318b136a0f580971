"""Plots for particle runs (cbo_jax.plot): Figure objects, strided histories, GIF animation."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import cbo_jax as cj
from cbo_jax import objectives, plot


def test_history_frames_are_the_ordinary_run_and_plots_are_figures(tmp_path):
    from matplotlib.figure import Figure

    obj = objectives.Rastrigin()
    dyn = cj.cbo(obj, sigma1=0.8, alpha=20.0, noise="isotropic")
    x0 = np.random.default_rng(0).uniform(-3, 3, (40, 2)).astype(np.float32)
    hist = plot.record_history(dyn, x0, 3, 25, every=10, max_particles=30)
    np.testing.assert_array_equal(hist.step, [0, 10, 20, 25])
    np.testing.assert_allclose(hist.t, [0.0, 0.1, 0.2, 0.25], rtol=1e-6)
    assert hist.x.shape == (4, 30, 2) and hist.consensus.shape == (4, 2)
    # Recording in segments does not change the run: the frames are simulate's states.
    for k, steps in ((1, 10), (3, 25)):
        ref = cj.simulate(dyn, x0, jax.random.key(3), steps, chunk_size=10)
        np.testing.assert_array_equal(hist.x[k], np.asarray(ref.state.x)[:30])
        np.testing.assert_array_equal(hist.consensus[k], np.asarray(ref.state.consensus))
    np.testing.assert_array_equal(hist.x[0], x0[:30])

    figs = [plot.particles(obj, hist.x[-1], hist.consensus[-1]), plot.snapshots(obj, hist),
            plot.variance(np.arange(5.0), np.exp(-np.arange(5.0)), predicted_rate=1.0),
            plot.loglog_error([1e2, 1e3, 1e4], [1e-2, 1e-3, 1e-4], stderr=[1e-3, 1e-4, 1e-5], reference_slope=-1)]
    assert all(isinstance(f, Figure) for f in figs)
    legend = [t.get_text() for t in figs[3].axes[0].get_legend().get_texts()]
    assert "measured, slope -1.000" in legend and "slope -1" in legend
    assert len(figs[1].axes) == 4
    figs[1].savefig(tmp_path / "snap.png")
    gif = plot.animate(obj, hist, tmp_path / "run.gif", fps=5)
    from PIL import Image

    with Image.open(gif) as im:
        assert im.n_frames == 4
    with pytest.raises(ValueError, match=r"\.gif or \.mp4"):
        plot.animate(obj, hist, tmp_path / "run.avi")
    with pytest.raises(ValueError, match="2-D particles"):
        plot.particles(obj, np.zeros((5, 3)))


def _history(runs=None):
    lead = () if runs is None else (runs,)
    x = np.random.default_rng(0).uniform(-1, 1, (3, *lead, 4, 2))
    return plot.History(step=np.arange(3), t=np.arange(3.0), x=x, consensus=np.zeros((3, *lead, 2)), state=None)


@pytest.mark.parametrize("call,match", [
    (lambda h, p: plot.snapshots(objectives.Sphere(), h, frames=[]), "frames must name at least one frame"),
    (lambda h, p: plot.snapshots(objectives.Sphere(), h, frames=[0, 3]), r"frame 3 is out of range: the history has 3"),
    (lambda h, p: plot.snapshots(objectives.Sphere(), h, ncols=0), "ncols must be >= 1"),
    (lambda h, p: plot.snapshots(objectives.Sphere(), _history(runs=2), run=2), r"run 2 is out of range: the history "
                                                                               r"has 2 runs"),
    (lambda h, p: plot.snapshots(objectives.Sphere(), h, run=5), r"run 5 is out of range: the history has one run"),
    (lambda h, p: plot.animate(objectives.Sphere(), h, p / "a.gif", run=1), r"run 1 is out of range: the history has "
                                                                         r"one run"),
    (lambda h, p: plot.snapshots(objectives.Sphere(), _history(runs=2), run=0.5), "run must be an integer"),
    (lambda h, p: plot.animate(objectives.Sphere(), h, p / "a.gif", fps=0), "fps must be > 0"),
    (lambda h, p: plot.contour(objectives.Sphere(), resolution=0), r"resolution must be an integer >= 2"),  # matplotlib
])
def test_bad_frames_runs_and_rates_are_named(tmp_path, call, match):
    # were ZeroDivisionError (no frames, ncols=0, fps=0) and NumPy's IndexError
    with pytest.raises(ValueError, match=match):
        call(_history(), tmp_path)
    assert not (tmp_path / "a.gif").exists()


def test_plot_history_draws_a_metric_named_oracle_without_its_base(tmp_path):
    """``*_oracle`` keys were only ever drawn dashed beside their base metric: a user's
    ``acc_oracle`` alone was not plotted (and no file written when it was the only metric)."""
    from cbo_jax.federated.runner import plot_history

    rows = [{"round": r, "acc_oracle": 0.5 + 0.1 * r} for r in range(1, 4)]
    assert plot_history(rows, tmp_path / "a.png") == tmp_path / "a.png" and (tmp_path / "a.png").is_file()
    rows = [{"round": r, "sr": 0.5, "sr_oracle": 0.9, "loss": 1.0 / r} for r in range(1, 4)]
    assert plot_history(rows, tmp_path / "b.png") == tmp_path / "b.png"


def test_contour_names_an_objective_of_the_wrong_output_shape():
    """The shape check ran after the reshape, so NumPy's "cannot reshape" came first."""
    # the grid evaluation behind contour() (no matplotlib needed to reach the check)
    with pytest.raises(ValueError, match=r"must map an \(n, 2\) array of points to \(n,\) values"):
        plot._grid_values(lambda x: jnp.sum(x), ((-1.0, 1.0), (-1.0, 1.0)), 8)
    gx, gy, z = plot._grid_values(lambda x: jnp.sum(x * x, axis=-1, keepdims=True), ((-1.0, 1.0), (-1.0, 1.0)), 8)
    np.testing.assert_allclose(z, gx ** 2 + gy ** 2, rtol=1e-6)  # an (n, 1) output still reshapes

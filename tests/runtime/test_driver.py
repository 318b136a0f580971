"""The one driver loop (cbo_jax.runtime.driver): its stops and scan lengths, early halts, the
output options checked once, and a run's files closed in order however it ends."""

from __future__ import annotations

from pathlib import Path

import pytest

from cbo_jax.runtime.driver import Output, RunFiles, drive


def _trace(total, *, every, step, halt_at=None, take_back=0, done=0):
    scans, stops = [], []

    def scan(state, done, n):
        scans.append((done, n))
        return state + n, f"rec{done}"

    def at_stop(state, start, done, records):
        stops.append((start, done, [n for n, _ in records]))
        if halt_at is not None and done >= halt_at:
            return state, done - take_back, True
        return state, done, False

    state, end = drive(0, done, total, next_stop=lambda d: min(total, (d // every + 1) * every),
                       length=lambda d, stop: min(step - d % step, stop - d), scan=scan, at_stop=at_stop)
    return state, end, scans, stops


def test_drive_stops_at_every_multiple_and_scans_in_steps():
    state, end, scans, stops = _trace(10, every=4, step=3)
    assert end == 10 and state == 10
    assert scans == [(0, 3), (3, 1), (4, 2), (6, 2), (8, 1), (9, 1)]
    assert stops == [(0, 4, [3, 1]), (4, 8, [2, 2]), (8, 10, [1, 1])]


def test_drive_resumes_mid_way_and_halts_early_taking_back_steps():
    _, end, scans, stops = _trace(10, every=4, step=4, done=6)
    assert scans == [(6, 2), (8, 2)] and end == 10  # from round 6, as after a resume
    state, end, _, stops = _trace(12, every=4, step=4, halt_at=8, take_back=3)
    assert end == 5 and state == 8 and len(stops) == 2  # the host took back the steps after every run stopped


def test_drive_with_nothing_to_do_runs_nothing():
    state, end, scans, stops = _trace(5, every=2, step=2, done=5)
    assert (state, end, scans, stops) == (0, 5, [], [])


@pytest.mark.parametrize("kwargs,match", [
    (dict(tensorboard=True, log_every=2), r"tensorboard=True, log_every=2 concern the files of out=DIRECTORY"),
    (dict(checkpoint_every=3), r"checkpoint_every=3 concern the files"),
    (dict(resume=True), r"resume=True concern the files"),
    (dict(directory="d", extend=True), "extend continues a run: it needs resume=True"),
    (dict(directory="d", resume=True, overwrite=True), "resume continues the results in out and overwrite"),
    (dict(directory="d", log_every=0), "log_every"),
    (dict(directory="d", progress="yes"), "progress"),
])
def test_output_options_are_checked_once_with_one_message_per_rule(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Output(**kwargs)


def test_output_takes_a_string_directory_and_says_when_there_is_none():
    assert Output("results/x").files == Path("results/x")
    assert Output(progress=True, plots=False).directory is None  # shown, not written: no file option
    with pytest.raises(ValueError, match="writes no files"):
        Output().files


def test_run_files_close_the_writer_and_bar_before_the_directory(tmp_path):
    closed = []

    class Bar:
        def close(self):
            closed.append("bar")

    with RunFiles() as files:
        files.hold(tmp_path / "run", overwrite=False)
        writer = files.open_writer(tmp_path / "run")
        files._streams.callback(lambda: closed.append("writer"))
        files.bar = Bar()
        files._streams.callback(files.bar.close)
        writer.write({"step": 1, "x": 1.0})
        files.finish()  # the rows on disk; the directory still held
        assert closed == ["bar", "writer"]
        assert (tmp_path / "run" / "metrics.jsonl").read_text().strip()
        with pytest.raises(ValueError, match="another run"):
            with RunFiles() as other:
                other.hold(tmp_path / "run", overwrite=False)
    with RunFiles() as again:  # released at exit
        again.hold(tmp_path / "run", overwrite=True)

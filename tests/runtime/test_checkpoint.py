"""Checkpoints: atomic steps, the last K kept, corruption and mismatches detected on restore."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cbo_jax import checkpoint

from _stack import enable_x64


def _state(shift=0.0):
    return {"w": jnp.arange(600.0).reshape(6, 100) + shift, "i": jnp.arange(3), "k": jax.random.key(3)}


def _flip(path, nbytes=400):
    files = [p for p in path.rglob("*") if p.is_file()]
    big = max(files, key=lambda p: p.stat().st_size)
    raw = bytearray(big.read_bytes())
    mid = len(raw) // 2
    for i in range(mid, min(len(raw), mid + nbytes)):
        raw[i] ^= 0xFF
    big.write_bytes(bytes(raw))


def test_round_trip_keeps_the_last_steps_and_accepts_eval_shape_templates(tmp_path):
    for s in range(1, 5):
        checkpoint.save(tmp_path / "c", _state(s), step=s, meta={"note": s}, keep=2)
    assert checkpoint.steps(tmp_path / "c") == [3, 4]
    state, meta = checkpoint.restore(tmp_path / "c", jax.eval_shape(_state))
    assert meta["step"] == 4 and meta["note"] == 4
    np.testing.assert_array_equal(state["w"], _state(4)["w"])
    assert jnp.issubdtype(state["k"].dtype, jax.dtypes.prng_key)
    np.testing.assert_array_equal(jax.random.key_data(state["k"]), jax.random.key_data(jax.random.key(3)))
    older, meta = checkpoint.restore(tmp_path / "c", _state(), step=3)
    assert meta["step"] == 3 and float(older["w"][0, 0]) == 3.0
    assert checkpoint.read_meta(tmp_path / "c")["note"] == 4


def test_a_flipped_byte_is_detected_and_the_previous_step_survives(tmp_path):
    checkpoint.save(tmp_path / "c", _state(1), step=1)
    checkpoint.save(tmp_path / "c", _state(2), step=2)
    _flip(tmp_path / "c" / "2" / "state")
    with pytest.raises(checkpoint.CheckpointError, match=r"step 2 is corrupt.*earlier steps: \[1\]"):
        checkpoint.restore(tmp_path / "c", _state())
    state, _ = checkpoint.restore(tmp_path / "c", _state(), step=1)
    np.testing.assert_array_equal(state["w"], _state(1)["w"])


@pytest.mark.parametrize("like,match", [
    (lambda s: {**s, "w": jnp.zeros((6, 101))}, r"w is float32\[6, 100\] in the checkpoint but float32\[6, 101\]"),
    (lambda s: {**s, "w": jnp.zeros((6, 100), jnp.int32)}, "float32.* in the checkpoint but int32"),
    (lambda s: {"w": s["w"]}, "another state structure"),
    (lambda s: {**s, "k": jax.random.key(0, impl="rbg")}, "k is uint32\\[2\\] in the checkpoint but uint32\\[4\\]"),
])
def test_the_template_must_match_exactly(tmp_path, like, match):
    checkpoint.save(tmp_path / "c", _state(), step=1)
    with pytest.raises(checkpoint.CheckpointError, match=match):
        checkpoint.restore(tmp_path / "c", like(_state()))


def test_no_checkpoint_and_a_half_written_step(tmp_path):
    with pytest.raises(checkpoint.CheckpointError, match="no checkpoint there"):
        checkpoint.restore(tmp_path / "none", _state())
    checkpoint.save(tmp_path / "c", _state(1), step=1)
    # a step whose writer was killed before orbax finished it is not a step
    (tmp_path / "c" / "2.orbax-checkpoint-tmp-1").mkdir()
    assert checkpoint.steps(tmp_path / "c") == [1]
    assert checkpoint.restore(tmp_path / "c", _state())[1]["step"] == 1


@pytest.mark.parametrize("kw,match", [({"step": -1}, "step must be an integer >= 0"),
                                      ({"step": 2.7}, "step must be an integer >= 0"),
                                      ({"step": 1, "keep": 0}, "keep must be")])
def test_a_step_that_would_be_lost_or_renamed_is_refused(tmp_path, kw, match):
    # a negative step was written but never listed (restore: "no checkpoint there"), 2.7 became step 2,
    # keep=0 deleted the step it had just written (a FileNotFoundError from inside save)
    with pytest.raises(ValueError, match=match):
        checkpoint.save(tmp_path / "c", {"x": jnp.ones(3)}, **kw)
    assert not checkpoint.steps(tmp_path / "c")


def test_a_missing_or_fractional_step_is_named_not_called_corrupt(tmp_path):
    # read_meta(step=7) of a directory holding step 1 said "step 7 is corrupt: unreadable metadata";
    # restore(step=1.5) silently restored step 1
    checkpoint.save(tmp_path / "c", {"x": jnp.ones(3)}, step=1)
    with pytest.raises(checkpoint.CheckpointError, match=r"no step 7 \(steps: \[1\]\)"):
        checkpoint.read_meta(tmp_path / "c", step=7)
    for bad in (1.5, -1, True, "1", np.array(True), np.array([1]), jnp.asarray(1.0)):
        with pytest.raises(ValueError, match="step must be an integer >= 0"):
            checkpoint.restore(tmp_path / "c", {"x": jnp.ones(3)}, step=bad)
        with pytest.raises(ValueError, match="step must be an integer >= 0"):
            checkpoint.read_meta(tmp_path / "c", step=bad)
    for one in (np.int64(1), np.array(1), jnp.asarray(1)):  # integer scalars and 0-d integer arrays
        assert checkpoint.read_meta(tmp_path / "c", step=one)["step"] == 1


def test_an_unwritable_path_or_meta_that_is_not_json_is_a_clear_error(tmp_path):
    # were orbax's NotADirectoryError naming its temporary directory, and json's TypeError
    (tmp_path / "file").write_text("x")
    for path in (tmp_path / "file", tmp_path / "file" / "c"):
        with pytest.raises(ValueError, match=f"cannot write a checkpoint to {path}"):
            checkpoint.save(path, {"x": jnp.ones(3)}, step=0)
    with pytest.raises(ValueError, match="meta must be JSON-serialisable.*PosixPath"):
        checkpoint.save(tmp_path / "c", {"x": jnp.ones(3)}, step=0, meta={"data": tmp_path})
    assert not (tmp_path / "c").exists()


def test_python_scalar_leaves_come_back_as_python_scalars(tmp_path):
    """A state's Python ``int`` / ``float`` / ``bool`` leaves (a round counter, a flag) come
    back as the same Python type and value, not as 0-d JAX arrays."""
    state = {"w": jnp.ones(3), "round": 7, "lr": 0.25, "done": True}
    checkpoint.save(tmp_path / "c", state, step=1)
    back, _ = checkpoint.restore(tmp_path / "c", {"w": jnp.zeros(3), "round": 0, "lr": 0.0, "done": False})
    for name in ("round", "lr", "done"):
        assert type(back[name]) is type(state[name]) and back[name] == state[name], name
    np.testing.assert_array_equal(back["w"], state["w"])


def test_saving_a_step_again_is_refused_by_name_or_replaces_it(tmp_path):
    """The same step saved twice (a script run again) raised orbax's StepAlreadyExistsError;
    it is a CheckpointError naming the step, and overwrite=True replaces the step."""
    checkpoint.save(tmp_path / "c", _state(1), step=5)
    with pytest.raises(checkpoint.CheckpointError, match=r"already holds step 5: pass overwrite=True"):
        checkpoint.save(tmp_path / "c", _state(2), step=5)
    checkpoint.save(tmp_path / "c", _state(2), step=5, overwrite=True)
    state, meta = checkpoint.restore(tmp_path / "c", _state())
    assert meta["step"] == 5 and checkpoint.steps(tmp_path / "c") == [5]
    np.testing.assert_array_equal(state["w"], _state(2)["w"])


def test_a_step_directory_without_metadata_is_left_out_with_a_warning(tmp_path):
    """An empty ``7/`` (an interrupted copy, a stray mkdir) was listed as the latest step, and
    every restore failed on it ("unreadable metadata"): it is left out, named in a warning, and
    saving that step writes over it."""
    checkpoint.save(tmp_path / "c", _state(1), step=1)
    checkpoint.save(tmp_path / "c", _state(5), step=5)
    (tmp_path / "c" / "7").mkdir()
    with pytest.warns(UserWarning, match=r"left out .*c/7, a step directory without the checkpoint's metadata.*"
                                         r"latest whole step is 5"):
        assert checkpoint.steps(tmp_path / "c") == [1, 5]
    state, meta = checkpoint.restore(tmp_path / "c", _state())
    assert meta["step"] == 5
    np.testing.assert_array_equal(state["w"], _state(5)["w"])
    checkpoint.save(tmp_path / "c", _state(7), step=7)
    assert checkpoint.steps(tmp_path / "c") == [5, 7]
    assert checkpoint.restore(tmp_path / "c", _state())[1]["step"] == 7


@pytest.mark.parametrize("keep", [1, 2])
def test_a_step_below_the_latest_is_refused_or_continues_the_run_from_there(tmp_path, keep):
    """Saving step 3 where step 5 was (keep=1) deleted step 5, the newer one, by orbax's policy;
    with keep=2 both stayed and a restore took step 5, not the step just written."""
    checkpoint.save(tmp_path / "c", _state(1), step=1, keep=keep)
    checkpoint.save(tmp_path / "c", _state(5), step=5, keep=keep)
    held = checkpoint.steps(tmp_path / "c")
    with pytest.raises(checkpoint.CheckpointError, match=r"holds later steps \[5\] than step 3.*overwrite=True"):
        checkpoint.save(tmp_path / "c", _state(3), step=3, keep=keep)
    assert checkpoint.steps(tmp_path / "c") == held
    checkpoint.save(tmp_path / "c", _state(3), step=3, keep=keep, overwrite=True)
    assert checkpoint.steps(tmp_path / "c") == [1, 3][-keep:]
    state, meta = checkpoint.restore(tmp_path / "c", _state())
    assert meta["step"] == 3
    np.testing.assert_array_equal(state["w"], _state(3)["w"])


def test_checkpoint_of_a_bare_array(tmp_path):
    """A state that is one array was saved, but restoring it said "holds another state
    structure (in the checkpoint only: ['tree'] ...)"."""
    x = jnp.arange(6.0).reshape(2, 3)
    checkpoint.save(tmp_path / "c", x, step=0)
    got, meta = checkpoint.restore(tmp_path / "c", jax.eval_shape(lambda: x))
    np.testing.assert_array_equal(np.asarray(got), np.asarray(x))
    assert "one_array" not in meta
    # one array against a list of one (and back) is another structure, not a corrupt checkpoint
    with pytest.raises(checkpoint.CheckpointError, match="another state structure .in the checkpoint: one array"):
        checkpoint.restore(tmp_path / "c", [x])
    checkpoint.save(tmp_path / "l", [x], step=0)
    with pytest.raises(checkpoint.CheckpointError, match="another state structure .in the checkpoint: a tree"):
        checkpoint.restore(tmp_path / "l", x)
    got, _ = checkpoint.restore(tmp_path / "l", [x])
    np.testing.assert_array_equal(np.asarray(got[0]), np.asarray(x))
    checkpoint.save(tmp_path / "e", jnp.zeros((0, 3)), step=0)  # one array of zero size: nothing written
    got, _ = checkpoint.restore(tmp_path / "e", jnp.zeros((0, 3)))
    assert got.shape == (0, 3)


def test_checkpoint_keeps_64_bit_numpy_leaves():
    """Without 64-bit JAX, int64 and float64 NumPy leaves came back cast to 32 bits
    (2**40 came back as 0), past the checksum, which was taken before the cast."""
    import tempfile

    state = {"count": np.array([2**40 + 1, 3], np.int64), "t": np.float64(0.1), "x": jnp.ones(2)}
    with tempfile.TemporaryDirectory() as d, enable_x64(False):
        checkpoint.save(f"{d}/c", state, step=0)
        got, _ = checkpoint.restore(f"{d}/c", state)
    assert got["count"].dtype == np.int64 and got["t"].dtype == np.float64
    np.testing.assert_array_equal(got["count"], state["count"])
    assert float(got["t"]) == 0.1
    assert isinstance(got["x"], jax.Array)  # leaves JAX holds as they are stay JAX arrays


def test_checkpoint_template_may_hold_python_scalars(tmp_path):
    """``restore(path, like)`` with a Python number in ``like`` failed with
    "AttributeError: 'float' object has no attribute 'dtype'" (saving it worked)."""
    state = {"lr": 0.5, "round": 7, "x": jnp.ones(2)}
    checkpoint.save(tmp_path / "c", state, step=0)
    got, _ = checkpoint.restore(tmp_path / "c", state)
    assert float(got["lr"]) == 0.5 and int(got["round"]) == 7


def test_checkpoint_of_zero_size_leaves_and_empty_states(tmp_path):
    """orbax refuses zero-size arrays ("Cannot save arrays with zero size") and empty trees
    ("Found empty item"): a state with an empty field, or none at all, could not be saved."""
    state = {"x": jnp.arange(3.0), "none": jnp.zeros((0, 4), jnp.bfloat16),
             "keys": jax.random.split(jax.random.key(0), 0)}
    checkpoint.save(tmp_path / "c", state, step=1, meta={"run": "a"})
    got, meta = checkpoint.restore(tmp_path / "c", jax.eval_shape(lambda: state))
    assert meta == {"run": "a", "format": 2, "step": 1}
    assert got["none"].shape == (0, 4) and got["none"].dtype == jnp.bfloat16
    assert got["keys"].shape == (0,) and jnp.issubdtype(got["keys"].dtype, jax.dtypes.prng_key)
    np.testing.assert_array_equal(np.asarray(got["x"]), np.arange(3.0))
    for i, empty in enumerate([{}, (), {"a": np.zeros((0,), np.int32)}]):
        checkpoint.save(tmp_path / f"e{i}", empty, step=0)
        back, _ = checkpoint.restore(tmp_path / f"e{i}", empty)
        assert jax.tree_util.tree_structure(back) == jax.tree_util.tree_structure(empty)
    # a zero-size leaf is still checked against the template
    with pytest.raises(checkpoint.CheckpointError, match="another state structure"):
        checkpoint.restore(tmp_path / "c", {**state, "none": jnp.zeros((2, 4), jnp.bfloat16)})
    with pytest.raises(checkpoint.CheckpointError, match="another state structure"):
        checkpoint.restore(tmp_path / "e2", {"a": np.zeros((0,), np.float32)})
    with pytest.raises(checkpoint.CheckpointError, match="another state structure"):
        checkpoint.restore(tmp_path / "e0", {"a": jnp.ones(2)})


def test_checkpoint_refuses_string_and_object_leaves_before_writing(tmp_path):
    """A string leaf failed inside orbax's writer threads ("Unsupported data type: str128",
    with absl errors) and left a temporary step directory behind."""
    checkpoint.save(tmp_path / "c", {"a": jnp.ones(2)}, step=0)
    for bad in ("run1", object()):
        with pytest.raises(ValueError, match=r"numeric and boolean arrays .* \['name'\]"):
            checkpoint.save(tmp_path / "c", {"a": jnp.ones(2), "name": bad}, step=1)
    assert sorted(p.name for p in (tmp_path / "c").iterdir()) == ["0"]

"""Edge cases of the scale-out modules: sharding's padding, checkpoints, the memory planner."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from _stack import enable_x64

from cbo_jax import checkpoint, sharding


def test_pad_rows_makes_bfloat16_padding_agents_inactive():
    """NumPy does not count bfloat16 as floating, so its padding rows were 0, not NaN: on a
    mesh the padding agents of a bfloat16 population were real agents at the origin (the
    consensus of a run on 8 devices went to 0 where the unsharded run's was about 2)."""
    out = sharding.pad_rows({"x": np.ones((5, 2), jnp.bfloat16), "f16": np.ones((5,), np.float16)}, 8)
    assert out["x"].dtype == jnp.bfloat16
    assert np.all(np.isnan(np.asarray(out["x"][5:], np.float32)))
    assert np.all(np.isnan(out["f16"][5:]))
    ints = sharding.pad_rows(np.ones((5,), np.int32), 8)
    np.testing.assert_array_equal(ints[5:], 0)  # integer leaves keep their 0 padding


def test_prepare_population_refuses_a_population_without_an_agent_axis():
    """A 0-d population failed with "IndexError: tuple index out of range"; leaves with
    different agent counts were padded one by one, out of step with each other."""
    mesh = sharding.agent_mesh(jax.devices()[:1])
    with pytest.raises(ValueError, match="agent axis 0"):
        sharding.prepare_population(np.float32(1.0), mesh)
    with pytest.raises(ValueError, match="agent axis 0"):
        sharding.prepare_population({}, mesh)
    with pytest.raises(ValueError, match="same number of agents"):
        sharding.prepare_population({"a": np.ones((5, 2), np.float32), "b": np.ones(6, np.float32)}, mesh)


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


@pytest.mark.parametrize("size", [4, 0, 8.0])
def test_planned_round_bytes_refuses_a_size_below_n(size):
    """``size`` below N cut the planned state and data to that many agents (a plan for half
    the run at size=N/2), and ``size=0`` was silently taken as N."""
    from cbo_jax import models
    from cbo_jax.federated.algorithms import FedCBOConfig, fedcbo
    from cbo_jax.federated.algorithms.base import AgentData
    from cbo_jax.federated.memory import planned_round_bytes

    data = AgentData(jnp.zeros((8, 3, 2)), jnp.zeros((8, 3), jnp.int32), jnp.full((8,), 3, jnp.int32))
    alg = fedcbo(models.mlp_mnist(hidden=(4,), num_classes=2, input_shape=(2,)), FedCBOConfig(M=2), 8)
    with pytest.raises(ValueError, match="size must be an integer >= N=8"):
        planned_round_bytes(alg, data, size=size)


@pytest.mark.parametrize("address, num_processes, process_id", [
    ("127.0.0.1:abc", 1, 0), ("127.0.0.1:", 1, 0), (":1234", 1, 0), ("127.0.0.1:70000", 1, 0),
    ("127.0.0.1:1234", 2.0, 0), ("127.0.0.1:1234", 2, True)])
def test_distributed_initialize_refuses_a_malformed_address_or_count(address, num_processes, process_id):
    """A port that is not a number failed in gRPC ("Failed to start RPC server"), a missing
    host waited out the whole start-up timeout for a coordinator that could not exist, and
    2.0 processes reached JAX's runtime. All are refused before JAX is touched."""
    from cbo_jax import distributed

    with pytest.raises(ValueError, match="HOST:PORT|num_processes"):
        distributed.initialize(address, num_processes, process_id, timeout=1)


def test_checkpoint_refuses_string_and_object_leaves_before_writing(tmp_path):
    """A string leaf failed inside orbax's writer threads ("Unsupported data type: str128",
    with absl errors) and left a temporary step directory behind."""
    checkpoint.save(tmp_path / "c", {"a": jnp.ones(2)}, step=0)
    for bad in ("run1", object()):
        with pytest.raises(ValueError, match=r"numeric and boolean arrays .* \['name'\]"):
            checkpoint.save(tmp_path / "c", {"a": jnp.ones(2), "name": bad}, step=1)
    assert sorted(p.name for p in (tmp_path / "c").iterdir()) == ["0"]

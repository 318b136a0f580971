"""Input validation shared by configs and entry points.

Every check runs on the host, before anything is traced or compiled, and names the
offending parameter in its message.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from typing import Any, Iterator

import jax
import numpy as np


FLOAT32_MAX = float(np.finfo(np.float32).max)

# Set while a federated sweep traces its configs (cbo_jax.federated.sweep): the swept numbers are
# tracers there, each of them checked on the host before (one concrete config per grid point).
_SWEPT: contextvars.ContextVar[bool] = contextvars.ContextVar("cbo_jax_swept", default=False)


@contextlib.contextmanager
def swept_numbers() -> Iterator[None]:
    """While active, the number checks pass a traced value through unchecked: a sweep builds
    its configs with tracers, after checking every grid point's concrete config."""
    token = _SWEPT.set(True)
    try:
        yield
    finally:
        _SWEPT.reset(token)


def swept(value: Any) -> bool:
    """``value`` is a traced number of a sweep (:func:`swept_numbers`): checked already, on the host."""
    return isinstance(value, jax.core.Tracer) and _SWEPT.get()


def float_or_swept(value: Any) -> Any:
    """``float(value)``, or a sweep's traced number as it is (:func:`swept`)."""
    return value if swept(value) else float(value)


def finite_number(name: str, value: Any, *, f32: bool = False) -> float:
    """A finite real number (not a string, not a bool); with ``f32``, also within float32's range."""
    if swept(value):
        return value
    if isinstance(value, jax.core.Tracer):  # float() would fail with a bare ConcretizationTypeError
        raise ValueError(
            f"{name} is a traced value (a config built inside jax.vmap, jax.jit or jax.grad): configs hold Python "
            f"numbers, fixed when the dynamics are built. To sweep or differentiate {name} in one program, build the "
            f"dynamics once and pass the numbers as data: simulate(..., params=cj.params.grid(dynamics, "
            f"{name.split('.')[-1]}=[...])) or dynamics.init(x0, key, params) under your own transform; a "
            f"federated algorithm's numbers: fl.run(..., params={{{name.split('.')[-1]!r}: [...]}}) "
            "(docs/guides/sweeps.md)")
    if isinstance(value, (bool, np.bool_, str, bytes)) or not isinstance(value, (int, float, np.integer, np.floating)):
        if not (hasattr(value, "ndim") and getattr(value, "ndim", 1) == 0 and hasattr(value, "dtype")
                and np.issubdtype(value.dtype, np.number)):
            raise ValueError(f"{name} must be a real number, got {value!r} ({type(value).__name__})")
    v = float(value)
    if not math.isfinite(v):
        raise ValueError(f"{name} must be finite, got {value!r}")
    if f32 and abs(v) > FLOAT32_MAX:
        raise ValueError(f"{name} = {value!r} overflows float32 (largest {FLOAT32_MAX:.4g}), in which the run "
                         f"computes")
    return v


def non_negative(name: str, value: Any, *, f32: bool = False) -> float:
    v = finite_number(name, value, f32=f32)
    if swept(v):
        return v
    if v < 0:
        raise ValueError(f"{name} must be >= 0, got {value!r}")
    return v


def positive(name: str, value: Any, *, f32: bool = False) -> float:
    v = finite_number(name, value, f32=f32)
    if swept(v):
        return v
    if v <= 0:
        raise ValueError(f"{name} must be > 0, got {value!r}")
    return v


def fraction(name: str, value: Any) -> float:
    """A number in ``(0, 1]`` (a share of agents, for example)."""
    v = finite_number(name, value)
    if swept(v):
        return v
    if not 0 < v <= 1:
        raise ValueError(f"{name} must lie in (0, 1], got {value!r}")
    return v


def fits_dtype(cfg) -> None:
    """With ``cfg.dtype == "float32"``, every number of ``cfg`` (and of its α schedule) must be
    representable in float32: a value such as α = 1e39 would be infinite in the run."""
    if getattr(cfg, "dtype", "float32") != "float32":
        return
    values = {f.name: getattr(cfg, f.name) for f in __import__("dataclasses").fields(cfg)}
    alpha = values.pop("alpha", None)
    if hasattr(alpha, "params"):
        values.update({f"alpha.{k}": v for k, v in alpha.params()._asdict().items()})
    for name, v in values.items():
        if isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool) and abs(v) > FLOAT32_MAX:
            raise ValueError(f"{name} = {v!r} overflows float32 (largest {FLOAT32_MAX:.4g}), the run's dtype; "
                             f"use a smaller value or dtype='float64'")


def available_bytes() -> int | None:
    """Memory the run can use: the default device's limit when it reports one, else the host's
    ``MemAvailable`` (Linux); ``None`` when neither is known."""
    try:
        stats = jax.devices()[0].memory_stats() or {}
        if stats.get("bytes_limit"):
            return int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0))
    except Exception:  # noqa: BLE001 - backends without memory stats
        pass
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def memory_fits(what: str, nbytes: float) -> None:
    """Raise ``ValueError`` with the bytes needed when ``nbytes`` exceeds the available memory."""
    avail = available_bytes()
    if avail is not None and nbytes > avail:
        raise ValueError(f"{what} needs about {nbytes / 2**30:.1f} GiB, but only {avail / 2**30:.1f} GiB are "
                         f"available; use fewer particles or runs, particle_chunk, or more devices (--shard)")


def unit_interval(name: str, value: Any) -> float:
    """A number in ``[0, 1]`` (a probability such as ε)."""
    v = finite_number(name, value)
    if swept(v):
        return v
    if not 0 <= v <= 1:
        raise ValueError(f"{name} must lie in [0, 1], got {value!r}")
    return v


def epsilon_floor(eps0: float, eps_min: float) -> None:
    """``eps_min <= eps0``: with the floor above the start, ``ε(n) = max(eps0 - decay·n, eps_min)``
    is ``eps_min`` in every round and ``eps0`` is never used (two arguments swapped, most likely)."""
    if swept(eps0) or swept(eps_min):
        return
    if eps_min > eps0:
        raise ValueError(f"eps_min={eps_min!r} is above eps0={eps0!r}: ε(n) = max(eps0 - eps_decay·n, eps_min) would "
                         f"be eps_min in every round; give eps_min <= eps0 (eps_min = eps0 for a constant ε)")


def aggregation_step(lambda1: float, gamma: float) -> float:
    """The consensus step ``λ1 γ`` of FedCBO eq. (20) / FedCB²O: a fraction in ``[0, 1]``."""
    if swept(lambda1) or swept(gamma):
        return lambda1 * gamma
    step = float(lambda1) * float(gamma)
    if not 0 <= step <= 1:
        raise ValueError(f"the aggregation step lambda1 * gamma = {lambda1!r} * {gamma!r} = {step:.4g} must lie in "
                         f"[0, 1]: each agent moves that fraction of the way to its consensus point")
    return step


INT32_MAX = 2**31 - 1


def normal_vector(where: str, a: Any) -> tuple[np.ndarray, float]:
    """``(a, |a|)`` for a hyperplane's normal, refused unless finite and non-zero (``|a| = 0``
    divides by zero)."""
    a = np.asarray(a, np.float64)
    norm = float(np.linalg.norm(a))
    if not (np.all(np.isfinite(a)) and norm > 0):
        raise ValueError(f"{where}: a must be a finite, non-zero normal vector, got {a.tolist()}")
    return a, norm


def flags(**values: Any) -> None:
    """Refuse a switch that is not a bool (``progress="no"`` would be true)."""
    for name, value in values.items():
        if not isinstance(value, (bool, np.bool_)) and not (is_integer(value) and value in (0, 1)):
            raise ValueError(f"{name} must be True or False, got {value!r}")


def is_integer(value: Any) -> bool:
    """A Python or NumPy integer, not a bool (``True`` is an ``int`` to Python, never a count here)."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def positive_int(name: str, value: Any, *, int32: bool = True) -> int:
    """``value`` as an ``int >= 1``. With ``int32`` (the default) it must also be at most ``2**31 - 1``:
    counts, steps and sizes meet JAX's ``int32`` counters and indices, where a larger value would
    overflow inside a compiled program (or size a buffer no machine holds) instead of being refused
    here. ``int32=False`` for a count that is only ever a Python-side shape."""
    if not is_integer(value):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value!r}")
    if int32 and value > INT32_MAX:
        raise ValueError(f"{name} must be at most 2**31 - 1 (JAX counts in int32), got {value!r}")
    return int(value)


def seed(name: str, value: Any) -> int:
    """A seed of NumPy's generators or of a partition: an integer ``>= 0`` (NumPy refuses negative
    seeds; ``None`` would draw what no seed reproduces)."""
    if not is_integer(value) or value < 0:
        raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
    return int(value)


def downloads(m: Any, n: int, *, what: str = "downloads per agent", among: str = "N") -> int:
    """``M``, the models an agent takes from the others each round (FedCBO's and FedCB²O's
    downloads, DFedAvgM's neighbours), as an integer with ``1 <= M <= n - 1``: ``n`` counts the
    agents it chooses among (``among``), itself included. The one statement of the rule, for the
    configs, the algorithms' builders and the selection functions."""
    if not is_integer(m) or not 1 <= m <= n - 1:
        raise ValueError(f"M ({what}) must be an integer with 1 <= M <= {among} - 1 = {n - 1}, got M={m!r}")
    return int(m)


def cluster_ids(name: str, value: Any) -> np.ndarray:
    """``value`` as a 1-D ``int32`` array of ids ``>= 0`` (one per agent: clusters, groups).

    Integral floats (``1.0``) are accepted; a fractional, non-finite or negative id is a
    ``ValueError`` naming the first offending agent (``np.asarray(value, np.int32)`` would
    truncate ``0.5`` to cluster 0 silently).
    """
    arr = np.asarray(value)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be a 1-D array of ids, one per agent, got shape {arr.shape}")
    if arr.dtype == bool or not (np.issubdtype(arr.dtype, np.integer) or np.issubdtype(arr.dtype, np.floating)):
        raise ValueError(f"{name} ids must be integers, got dtype {arr.dtype}")
    if np.issubdtype(arr.dtype, np.floating):
        bad = np.flatnonzero(~np.isfinite(arr) | (arr != np.round(arr)))
        if bad.size:
            j = int(bad[0])
            raise ValueError(f"{name} ids must be integers; agent {j} has {arr[j].item()!r} ({bad.size} non-integral)")
    bad = np.flatnonzero(arr < 0)
    if bad.size:
        j = int(bad[0])
        raise ValueError(f"{name} ids must be >= 0; agent {j} has {arr[j].item()!r}")
    if arr.size and arr.max() > INT32_MAX:
        raise ValueError(f"{name} ids must be at most 2**31 - 1, got {arr.max().item()!r}")
    return arr.astype(np.int32)


def one_of(name: str, value: Any, choices) -> Any:
    if value not in choices:
        raise ValueError(f"{name} must be one of {sorted(choices)}, got {value!r}")
    return value


def x64_for(config: Any) -> None:
    """Refuse a ``float64`` config while JAX runs in 32 bits: every array would be cut to
    float32, with nothing but JAX's truncation warnings to say so."""
    # jax's Config stub does not declare the flag attributes, hence the narrow ignore
    if getattr(config, "dtype", "float32") == "float64" and not jax.config.jax_enable_x64:  # type: ignore[attr-defined]
        raise ValueError(
            "dtype='float64' needs 64-bit JAX: call jax.config.update('jax_enable_x64', True) "
            "at start-up (the CLI's --dtype float64 does this)"
        )


def all_finite(name: str, tree: Any) -> None:
    """Raise if any leaf of ``tree`` holds a NaN or an infinity (host-side check)."""
    for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
        arr = np.asarray(leaf)
        if not np.all(np.isfinite(arr)):
            where = jax.tree_util.keystr(path) or ""
            bad = int(np.size(arr) - np.count_nonzero(np.isfinite(arr)))
            raise ValueError(f"{name}{where} has {bad} non-finite entries (NaN or inf)")


def as_key(name: str, key: Any) -> jax.Array:
    """A PRNG key from ``key``: typed keys and raw ``uint32`` key data pass unchanged, an
    integer seed (also a scalar integer array, traced under ``jit``/``vmap``: its dtype's bits)
    becomes ``jax.random.key(seed)``; anything else is a ``ValueError``.

    Seeds use all 64 bits: JAX without ``jax_enable_x64`` keeps only a seed's low 32 bits
    (``jax.random.key(2**32)`` is ``jax.random.key(0)``), so a seed outside
    ``[-2**31, 2**32)`` becomes the key JAX's 64-bit mode makes of it (key data
    ``[high word, low word]`` of the seed modulo ``2**64``). Seeds inside that range give
    exactly ``jax.random.key(seed)``."""
    if isinstance(key, (int, np.integer)) and not isinstance(key, (bool, np.bool_)):
        seed = int(key)
        if not -(2**63) <= seed < 2**64:
            raise ValueError(f"{name}: an integer seed must fit in 64 bits, got {key}")
        if -(2**31) <= seed < 2**32 or jax.config.jax_default_prng_impl != "threefry2x32":
            return jax.random.key(seed)
        s = seed % 2**64
        return jax.random.wrap_key_data(np.array([s >> 32, s & 0xFFFFFFFF], np.uint32), impl="threefry2x32")
    dtype = getattr(key, "dtype", None)
    if dtype is not None:
        if jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
            return key
        # raw key data (jax.random.PRNGKey), accepted by jax.random as it is: threefry's 2 words, rbg's 4
        words = {"threefry2x32": (2,), "rbg": (4,), "unsafe_rbg": (4,)}.get(jax.config.jax_default_prng_impl, (2, 4))
        if np.dtype(dtype) == np.uint32 and np.ndim(key) >= 1 and np.shape(key)[-1] in words:
            return key
        # a seed as a scalar integer array: under jit or vmap (an integer argument is traced), or a
        # NumPy/JAX scalar array; without this, "a PRNG key or an integer seed, got a tracer of int32"
        if np.ndim(key) == 0 and jax.dtypes.issubdtype(dtype, np.integer) and not jax.dtypes.issubdtype(dtype, np.bool_):
            return jax.random.key(key)
    raise ValueError(f"{name} must be a PRNG key (jax.random.key(seed)) or an integer seed, got {key!r}"
                     + (f" of dtype {dtype}" if dtype is not None else ""))


def single_key(key: Any, why: str) -> None:
    """Refuse a batch of keys where one key is split by the callee (``why`` says how); a batch
    would fail inside ``jax.random.split`` ("split accepts a single key")."""
    typed = jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key)
    if np.ndim(key) != (0 if typed else 1):
        raise ValueError(f"key must be a single PRNG key, got a key array of shape {tuple(np.shape(key))}"
                         f"{'' if typed else ' (raw key data)'}: {why}")


def config_with(where: str, cls, config, overrides: dict):
    """A builder's config: ``config`` (default ``cls()``) with the keyword ``overrides``
    replaced, the keywords checked against ``cls``'s fields. A dict (a config read from JSON)
    is refused with the call that takes it."""
    import dataclasses

    known_keywords(where, overrides, [f.name for f in dataclasses.fields(cls)])
    if config is None:
        return cls(**overrides)
    if not dataclasses.is_dataclass(config) or isinstance(config, type):
        hint = f": pass {cls.__name__}(**config), or the fields as keywords ({where}(f, **config))" if isinstance(
            config, dict) else ""
        raise TypeError(f"{where}: config must be a {cls.__name__}, got {type(config).__name__}{hint}")
    return dataclasses.replace(config, **overrides)


def known_keywords(where: str, given, valid) -> None:
    """Raise for keywords of ``given`` not in ``valid``, listing the valid ones (and close matches)."""
    import difflib

    valid = sorted(valid)
    unknown = [k for k in given if k not in valid]
    if not unknown:
        return
    hints = []
    for k in unknown:
        close = difflib.get_close_matches(k, valid, n=3)
        hints.append(f"{k!r}" + (f" (did you mean {', '.join(close)}?)" if close else ""))
    raise ValueError(f"{where}: unknown keyword{'s' if len(unknown) > 1 else ''} {', '.join(hints)}; "
                     f"valid keywords: {', '.join(valid)}")


def returns_dict(what: str, value: Any, example: str) -> dict:
    """``value`` (what a user's ``observe``/metric function returned) as a dict, or a
    ``TypeError`` naming ``what`` and what it returned instead (an array's shape)."""
    if not isinstance(value, dict):
        got = f"an array of shape {tuple(value.shape)}" if hasattr(value, "shape") else type(value).__name__
        raise TypeError(f"{what} must return a dict ({example}), got {got}")
    return value

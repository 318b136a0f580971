"""Short text forms of results: what a run returned, not every number in it.

Without them, a result printed at a notebook's prompt would show each array of its state and
history in full (NumPy's summary still prints about 2,000 numbers per array). These forms give
the shapes, the scalars and the names instead; the arrays stay where they are (``result.state.x``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

_MAX_FIELDS = 4  # of a state, the first fields shown (x and the best energy first)
_FIRST = ("x", "best_energy", "consensus", "step", "params")


def leaf(value: Any) -> str:
    """``float32[50, 2]`` for an array, the number for a scalar, ``key<fry>[]`` for a key."""
    if value is None:
        return "None"
    shape = getattr(value, "shape", None)
    dtype = getattr(value, "dtype", None)
    if shape is None or dtype is None:
        return _scalar(value) if isinstance(value, (int, float, bool, np.generic)) else type(value).__name__
    if shape == () and _is_number(dtype):
        try:
            return _scalar(np.asarray(value).item())
        except Exception:  # a traced value (inside jit): its type and shape
            pass
    return f"{_dtype_name(dtype)}[{', '.join(str(s) for s in shape)}]"


def tree(value: Any) -> str:
    """A pytree as its type and its fields' leaves: ``CBOState(x=float32[50, 2], ...)``; a
    dict or list of up to four arrays by their paths (``{b: float32[2], w: float32[3, 2]}``),
    a larger one (a model's parameters) by its count of arrays and numbers."""
    import jax

    named = _fields(value)
    if named is None:
        paths = jax.tree_util.tree_flatten_with_path(value)[0]
        if not paths:
            return leaf(value)
        if len(paths) == 1 and not paths[0][0]:  # an array
            return leaf(paths[0][1])
        if len(paths) <= _MAX_FIELDS:
            return "{" + ", ".join(f"{_path(p)}: {leaf(v)}" for p, v in paths) + "}"
        numbers = sum(int(np.prod(getattr(v, "shape", ()))) for _, v in paths)
        return f"<{type(value).__name__} of {len(paths)} arrays: {numbers:,} numbers>"
    present = sorted((k for k in named if named[k] is not None),
                     key=lambda k: _FIRST.index(k) if k in _FIRST else len(_FIRST))
    parts = [f"{k}={tree(named[k])}" for k in present[:_MAX_FIELDS]]
    if len(present) > _MAX_FIELDS:
        parts.append(f"+{len(present) - _MAX_FIELDS} more")
    return f"{type(value).__name__}({', '.join(parts)})"


def fields(values: dict, sep: str = "=") -> str:
    """``x=uint8[8, 20, 28, 28], y=int32[8, 20]``: each entry's name and :func:`leaf`."""
    return ", ".join(f"{k}{sep}{leaf(v)}" for k, v in values.items())


def columns(names: list[str], limit: int = 8) -> str:
    """``a, b, c`` for the first ``limit`` names, then ``+k more``."""
    shown = ", ".join(names[:limit])
    return shown + (f", +{len(names) - limit} more" if len(names) > limit else "")


def _path(path: tuple) -> str:
    """``params/bias`` for a pytree path (dict keys, attribute names and sequence indices)."""
    parts = []
    for entry in path:
        name = next((getattr(entry, a) for a in ("key", "name", "idx") if hasattr(entry, a)), entry)
        parts.append(str(name))
    return "/".join(parts) or "."


def _fields(value: Any) -> dict | None:
    import dataclasses

    if hasattr(value, "_asdict"):
        return dict(value._asdict())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    return None


def _is_number(dtype: Any) -> bool:
    try:
        return np.issubdtype(np.dtype(dtype), np.number) or np.dtype(dtype) == np.bool_
    except TypeError:  # a PRNG key's dtype
        return False


def _dtype_name(dtype: Any) -> str:
    try:
        return np.dtype(dtype).name
    except TypeError:
        return str(dtype)


def _scalar(v: Any) -> str:
    if isinstance(v, (bool, np.bool_)):
        return str(bool(v))
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    return f"{float(v):.6g}"

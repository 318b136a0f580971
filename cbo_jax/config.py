"""Configs stated once: command-line flags and config files generated from dataclasses.

A config is a frozen dataclass whose fields are numbers, strings, booleans, ``None``-able
values or nested config dataclasses (``FedCBOConfig.local`` is a ``LocalSGDConfig``).
From the class alone this module derives

* the command-line flags (:func:`add_flags`): ``--M``, ``--local.lr``, ``--local.batch-size``
  (nested fields joined by ``.``, ``_`` written ``-``: :func:`flag_name`), each with its type,
  default and the field's description from the class docstring, plus aliases; or, for a
  command whose options are plain values (:func:`add_options`, the fields' details given
  with :func:`option`), flags that argparse parses at once, each with the field's default,
  type, choices and description, options that several commands share composed in as a
  field of their own dataclass;
* strict parsing: booleans are ``true/false/yes/no/on/off/1/0`` and nothing else, numbers
  must parse (without Python's ``_`` digit separators: ``1_0`` is refused, not 10), ``none``
  is accepted only where the field may be ``None``;
* config files (:func:`values_from_dict`): nested JSON objects, every value type-checked
  against its field (``"lr": "0.1"`` and ``"reset_optimizer": "no"`` are errors naming
  the field), unknown keys rejected with the list of valid ones.

The values end up in :func:`build`, which replaces them into a base instance, so the
dataclass's own validation (``__post_init__``) runs on the result.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import re
import typing
from typing import Any

import numpy as np

from cbo_jax import _checks

__all__ = ["Field", "fields", "check_types", "flag_name", "add_flags", "add_options", "option", "values_from_args",
           "values_from_dict", "build", "parse_text", "check_value", "to_dict"]

_TRUE = ("true", "yes", "1", "on")
_FALSE = ("false", "no", "0", "off")


class Field(typing.NamedTuple):
    """One leaf field of a (nested) config: its dotted path, type, default and description."""

    path: tuple[str, ...]
    type: Any
    default: Any
    help: str
    cli: str = ""  # the command-line flag, when the field has one
    default_text: str = ""  # the help's default where the value is not it (field metadata "cli_default")

    @property
    def name(self) -> str:
        return ".".join(self.path)

    @property
    def flag(self) -> str:
        return self.cli or flag_name(self.path)


def flag_name(path: tuple[str, ...], *, flat: tuple[str, ...] = ()) -> str:
    """The command-line flag of the field at ``path``: ``--`` and the path joined by ``.``, each
    ``_`` written ``-`` (``--data.seed``, ``--local.batch-size``); a first section named in ``flat``
    is not shown (``--M`` for ``config.M`` with ``flat=("config",)``)."""
    shown = path[1:] if path[:1] and path[0] in flat else path
    return "--" + ".".join(p.replace("_", "-") for p in shown)


def _descriptions(cls) -> dict[str, str]:
    """Field descriptions from Google-style ``Attributes:`` sections of the class's docstrings."""
    out: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        out.update(_attributes(klass.__doc__ or ""))
    return out


def _attributes(doc: str) -> dict[str, str]:
    out: dict[str, str] = {}
    section = doc.split("Attributes:", 1)[1] if "Attributes:" in doc else ""
    current: list[str] = []
    for line in section.splitlines():
        m = re.match(r"^\s{2,8}([\w, ]+):\s*(.*)$", line)
        if m and not line.startswith(" " * 9):
            current = [n.strip() for n in m.group(1).split(",")]
            for n in current:
                out[n] = m.group(2).strip()
        elif current and line.strip():
            for n in current:
                out[n] += " " + line.strip()
    return {k: _plain(v) for k, v in out.items()}


def _plain(text: str) -> str:
    """A docstring's reStructuredText as command-line help: ``x`` as x, and a role such as
    :func:`~pkg.mod.f` as its target (``~``: the last name only)."""
    def role(m: re.Match) -> str:
        target = m.group(2)
        return target.rsplit(".", 1)[-1] if m.group(1) else target

    return re.sub(r":[\w:]+:`(~?)([^`<]+?)`", role, text.replace("``", ""))


def _hints(cls) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _is_config(tp) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def fields(cls, prefix: tuple[str, ...] = (), instance=None) -> list[Field]:
    """The leaf fields of config class ``cls`` (nested configs flattened, in order)."""
    hints, docs = _hints(cls), _descriptions(cls)
    out: list[Field] = []
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        tp = hints[f.name]
        default = getattr(instance, f.name) if instance is not None else (
            f.default if f.default is not dataclasses.MISSING else dataclasses.MISSING)
        if _is_config(tp):
            out += fields(tp, prefix + (f.name,), default if default is not dataclasses.MISSING else None)
        else:
            out.append(Field(prefix + (f.name,), tp, default, docs.get(f.name, ""),
                             default_text=f.metadata.get("cli_default", "")))
    return out


def _base_type(tp) -> tuple[Any, bool]:
    """``(T, optional)`` for ``T``, ``T | None`` or ``Optional[T]``."""
    args = typing.get_args(tp)
    if args and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        return (rest[0] if len(rest) == 1 else typing.Union[tuple(rest)]), True
    return tp, False


def _type_name(tp) -> str:
    base, optional = _base_type(tp)
    name = getattr(base, "__name__", str(base))
    return f"{name} or none" if optional else name


def parse_text(text: str, tp, name: str) -> Any:
    """A command-line string as a value of type ``tp`` (strict; errors name the field)."""
    base, optional = _base_type(tp)
    low = text.strip().lower()
    if optional and low in ("none", "null"):
        return None
    try:
        if base is bool:
            if low in _TRUE:
                return True
            if low in _FALSE:
                return False
            raise ValueError
        if base in (int, float) and "_" in text:  # int("1_0") is 10: a typo, not a number
            raise ValueError
        if base is int:
            return int(text)
        if base is float:
            return float(text)
        if base is str:
            return text
        if typing.get_origin(base) is tuple:
            (inner, *_) = typing.get_args(base)
            return tuple(parse_text(t, inner, name) for t in text.split(",") if t.strip())
    except ValueError:
        raise ValueError(f"{name}: expected {_type_name(tp)}, got {text!r}") from None
    return text  # Any / unions: as given


def check_value(value: Any, tp, name: str) -> Any:
    """A config-file (JSON) value checked against type ``tp``; errors name the field."""
    base, optional = _base_type(tp)
    if value is None:
        if optional:
            return None
        raise ValueError(f"{name}: expected {_type_name(tp)}, got null")
    ok = True
    if base is bool:
        ok = isinstance(value, bool)
    elif base is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif base is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        value = float(value) if ok else value
    elif base is str:
        ok = isinstance(value, str)
    elif typing.get_origin(base) is tuple:
        ok = isinstance(value, (list, tuple))
        if ok:
            (inner, *_) = typing.get_args(base)
            value = tuple(check_value(v, inner, name) for v in value)
    if not ok:
        raise ValueError(f"{name}: expected {_type_name(tp)}, got {value!r} ({type(value).__name__})")
    return value


def _matches(value, tp) -> bool:
    if tp is Any:
        return True
    if _is_config(tp):
        return isinstance(value, tp)
    args = typing.get_args(tp)
    origin = typing.get_origin(tp)
    if origin is typing.Union or (args and type(None) in args) or type(tp).__name__ == "UnionType":
        return any(_matches(value, a) for a in args)
    if tp is type(None):
        return value is None
    if tp is bool:
        return isinstance(value, (bool, np.bool_))
    if tp is int:
        return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))
    if tp is float:
        if _checks.swept(value):  # a sweep's traced number (cbo_jax.federated.sweep), checked on the host
            return True
        return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))
    if tp is str:
        return isinstance(value, str)
    if origin is tuple:
        inner = [a for a in args if a is not Ellipsis]
        return isinstance(value, tuple) and all(_matches(v, inner[0]) for v in value) if inner else isinstance(value,
                                                                                                               tuple)
    return True  # other annotations: the class's own checks


def check_types(obj) -> None:
    """Raise ``ValueError`` naming the first field of config ``obj`` whose value is not of its
    annotated type (``bool`` is not an ``int``, ``"0.1"`` is not a ``float``, ``1.0`` not an ``int``)."""
    hints = _hints(type(obj))
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if not _matches(value, hints[f.name]):
            raise ValueError(f"{f.name} must be {_type_name(hints[f.name])}, got {value!r} ({type(value).__name__})")


def add_flags(parser: argparse.ArgumentParser, cls, *, prefix: tuple[str, ...] = (), strip: tuple[str, ...] = (),
              aliases: dict[str, str] | None = None, group: str | None = None, instance=None) -> dict[str, Field]:
    """Add one flag per leaf field of ``cls`` to ``parser``; returns ``dest -> Field``.

    ``prefix``: the fields' path in the whole config (``("data",)``); ``strip``: the part
    of the prefix the flags do not show (a section whose flags are top-level).
    ``aliases``: extra flag names (``{"--epochs": "local.epochs"}``, by field name).
    Flags default to "not given", so only explicit options override a config file.
    """
    target = parser.add_argument_group(group) if group else parser
    alias_for: dict[str, list[str]] = {}
    for flag, field_name in (aliases or {}).items():
        alias_for.setdefault(field_name, []).append(flag)
    dests: dict[str, Field] = {}
    described: dict[str, str] = {}  # a description shared by several fields (lambda1, gamma: ...) is shown once
    for f in fields(cls, prefix, instance):
        shown = f.path[len(strip):] if f.path[:len(strip)] == strip else f.path
        flag = flag_name(shown)
        underscored = "--" + ".".join(shown)
        names = [flag] + ([underscored] if underscored != flag else [])
        names += [a for a in alias_for.get(".".join(shown), []) if a not in names]
        dest = "cfg:" + f.name
        default = "" if f.default is dataclasses.MISSING else f" (default: {f.default_text or f.default})"
        extra = {"nargs": "?", "const": "true"} if _base_type(f.type)[0] is bool else {}
        text = f.help if not f.help or f.help not in described else f"see {described[f.help]}."
        described.setdefault(f.help, flag)
        target.add_argument(*names, dest=dest, default=argparse.SUPPRESS, metavar=_type_name(f.type).upper(),
                            help=(text + default).strip(), **extra)
        dests[dest] = f._replace(cli=flag)
    return dests


def option(default: Any = dataclasses.MISSING, **cli) -> Any:
    """A field of an options dataclass with its flag's details in ``metadata`` (what
    :func:`add_options` reads: ``flags``, ``type``, ``choices``, ``metavar``, ...); no
    ``default``: a required positional argument (with ``positional=True``)."""
    return dataclasses.field(default=default, metadata=cli)


# What a dataclass field's ``metadata`` (or :func:`add_options`'s ``specs``) may say of its flag.
_OPTION_KEYS = ("flags", "type", "choices", "default", "help", "metavar", "positional")


def add_options(parser, cls, *, names: tuple[str, ...] | None = None, specs: dict[str, dict] | None = None,
                group: str | None = None) -> dict[str, Field]:
    """Add one flag per field of ``cls`` (or of those in ``names``, in that order) whose value
    argparse parses at once: ``args.<field>`` holds it, or the default (``cbo-jax optimize``,
    ``cbo-jax reproduce NAME``).

    The flag is :func:`flag_name` of the field; its help the field's description in the class
    docstring; its type the annotation's (``int``, ``float``, ``str``, ``Path``; ``T | None``
    as ``T``, default ``None``), a ``bool`` field that defaults to ``False`` a switch. The
    field's ``metadata`` (:func:`option`), and over it ``specs[name]``, may give ``flags``
    (more names: ``("-N",)``), ``type`` (argparse's: a checker such as
    :func:`cbo_jax.experiments.base.positive_int`), ``choices``, ``default`` (the command's
    own), ``help``, ``metavar`` and ``positional`` (``True``: an argument named by the field,
    not a flag). A field whose type is itself an options dataclass (options several commands
    share: composition) adds that class's flags, under their own names (not prefixed) and with
    its defaults; its ``metadata["specs"]`` adjusts them per command as ``specs`` does
    (``{"source": {"help": ...}}``). Returns ``dest -> Field``.
    """
    target = parser.add_argument_group(group) if group else parser
    hints, docs = _hints(cls), _descriptions(cls)
    by_name = {f.name: f for f in dataclasses.fields(cls) if f.init}
    specs = specs or {}
    dests: dict[str, Field] = {}
    for name in names if names is not None else tuple(by_name):
        f = by_name[name]
        if _is_config(hints[name]):  # shared options: the class's flags, adjusted by this field's and the caller's specs
            inner = f.metadata.get("specs", {})
            inner = {k: {**inner.get(k, {}), **specs.get(k, {})} for k in {*inner, *specs}}
            dests.update(add_options(target, hints[name], specs=inner))
            continue
        spec = {k: v for k, v in {**f.metadata, **specs.get(name, {})}.items() if k in _OPTION_KEYS}
        default = spec.get("default", None if f.default is dataclasses.MISSING else f.default)
        # argparse %-formats help: a description's "20 %" is text (a spec's help may use %(default)s)
        kwargs: dict[str, Any] = {"help": spec["help"] if "help" in spec else docs.get(name, "").replace("%", "%%")}
        base = _base_type(hints[name])[0]
        if base is bool and default is False:
            kwargs["action"] = "store_true"
        else:
            kwargs["type"] = spec.get("type", base if isinstance(base, type) and base not in (str, bool, Any) else None)
            kwargs["choices"] = spec.get("choices")
            if "metavar" in spec:
                kwargs["metavar"] = spec["metavar"]
        if spec.get("positional"):
            flag = name
            target.add_argument(name, **kwargs)
        else:
            flag = flag_name((name,))
            target.add_argument(flag, *spec.get("flags", ()), dest=name, default=default, **kwargs)
        dests[name] = Field((name,), hints[name], default, docs.get(name, ""), cli=flag,
                            default_text=f.metadata.get("cli_default", ""))
    return dests


def values_from_args(args: argparse.Namespace, dests: dict[str, Field]) -> dict[tuple[str, ...], Any]:
    """The explicitly given flags as ``{path: value}``, strictly parsed."""
    out = {}
    for dest, f in dests.items():
        if hasattr(args, dest):
            out[f.path] = parse_text(getattr(args, dest), f.type, f.flag)
    return out


def values_from_dict(data: dict, cls, *, prefix: tuple[str, ...] = (), flat: dict[str, tuple[str, ...]] | None = None,
                     source: str = "config") -> dict[tuple[str, ...], Any]:
    """``{path: value}`` from a (nested) dict such as a JSON config file.

    Nested objects follow the dataclass nesting; ``flat`` maps further accepted
    top-level keys to field paths (old flat config files). Unknown keys and values of
    the wrong type raise ``ValueError`` naming them.
    """
    if not isinstance(data, dict):
        raise ValueError(f"{source}: expected a JSON object of options, got {type(data).__name__}")
    leaves = {f.path: f for f in fields(cls)}
    groups = {p[:i] for p in leaves for i in range(1, len(p))}
    out: dict[tuple[str, ...], Any] = {}
    named: dict[tuple[str, ...], str] = {}

    def once(p: tuple[str, ...], key: str) -> None:
        """An option given twice (a short name and its section's) would be resolved by key order."""
        if p in named:
            raise ValueError(f"{source}: {'.'.join(p)} is given twice, as {named[p]!r} and as {key!r}; keep one")
        named[p] = key

    def walk(d: dict, path: tuple[str, ...]):
        for k, v in d.items():
            p = path + (k,)
            if p in groups and isinstance(v, dict):
                walk(v, p)
            elif p in groups:  # a section given as something other than an object
                raise ValueError(f"{source}: {'.'.join(p)} is a section of options: it needs a JSON object "
                                 f"({{...}}), got {type(v).__name__} {v!r}")
            elif p in leaves:
                once(p, ".".join(p))
                out[p] = check_value(v, leaves[p].type, f"{source}: {'.'.join(p)}")
            elif not path and flat and k in flat:
                fp = flat[k]
                once(fp, k)
                out[fp] = check_value(v, leaves[fp].type, f"{source}: {k}")
            else:
                valid = sorted({".".join(q[:len(path) + 1]) for q in leaves if q[:len(path)] == path}
                               | (set(flat) if flat and not path else set()))
                raise ValueError(f"{source}: unknown option {'.'.join(p)!r}; valid: {', '.join(valid)}")

    walk(data, prefix)
    return out


def build(base, values: dict[tuple[str, ...], Any]):
    """``base`` with ``values`` (``{path: value}``) replaced in, nested configs included."""
    nested: dict[str, dict] = {}
    direct = {}
    for path, v in values.items():
        if len(path) == 1:
            direct[path[0]] = v
        else:
            nested.setdefault(path[0], {})[path[1:]] = v
    for name, sub in nested.items():
        direct[name] = build(getattr(base, name), sub)
    return dataclasses.replace(base, **direct) if direct else base


def to_dict(cfg) -> dict:
    """A config as nested dicts (non-finite floats as strings, so it is valid JSON)."""
    def clean(v):
        if isinstance(v, float) and not math.isfinite(v):
            return str(v)
        if isinstance(v, dict):
            return {k: clean(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [clean(x) for x in v]
        return v

    return clean(dataclasses.asdict(cfg))

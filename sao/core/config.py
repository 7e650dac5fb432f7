"""The one config loader: YAML files, dotted ``key=value`` overrides, key aliases, typed dataclasses.

Every config of the product (the training tree, the benches' specs, the sandbox section) goes through here:
``load_yaml`` reads a mapping, ``apply_overrides`` / ``merge`` change it, ``build`` turns it into dataclasses,
checking each value against its annotation and refusing an unknown key with the nearest valid one named. Ours, not
pydantic's: over stdlib dataclasses pydantic ignores unknown keys unless every class is decorated, names no
nearest key, reads ``run.plot: 1`` or ``batch_size: 2.0`` as valid, and its messages (type codes, a docs URL)
would need a translation about as long as this checker to name the field and the fix.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml

T = TypeVar("T")


class ConfigError(ValueError):
    """A config value is wrong; the message names the field (dotted) and how to fix it."""


class ConfigFileNotFound(ConfigError, FileNotFoundError):
    """A config file is missing (both a ``ConfigError`` and a ``FileNotFoundError``)."""


def load_yaml(path: str | Path, hint: str = "pass a YAML file such as configs/toy.yaml") -> dict[str, Any]:
    """The mapping a YAML file holds (``{}`` for an empty file); errors name the file and, when missing, ``hint``."""
    p = Path(path)
    if not p.is_file():
        raise ConfigFileNotFound(f"config file {str(p)!r} not found; {hint}")
    try:
        data = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{p}: not valid YAML ({e})") from e
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: the top level must be a mapping of sections")
    return data


def merge(base: Mapping[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``base`` with ``extra`` merged in recursively (mappings merge, other values replace)."""
    out = copy.deepcopy(dict(base))
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def parse_overrides(overrides: list[str]) -> list[tuple[str, Any]]:
    """``["trainer.lr=1e-5", ...]`` -> ``[("trainer.lr", "1e-5"), ...]`` (values parsed as YAML scalars)."""
    out = []
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r}: expected key=value, e.g. trainer.critic_updates_per_step=2")
        key, raw = item.split("=", 1)
        out.append((key.strip(), yaml.safe_load(raw) if raw.strip() else None))
    return out


def apply_overrides(tree: Mapping[str, Any], overrides: list[str]) -> dict[str, Any]:
    """A copy of ``tree`` with each dotted ``key=value`` set (sections made as needed)."""
    out = copy.deepcopy(dict(tree))
    for dotted, value in parse_overrides(overrides):
        node = out
        parts = dotted.split(".")
        for p in parts[:-1]:
            child = node.setdefault(p, {})
            if not isinstance(child, dict):
                raise ConfigError(f"override {dotted!r}: {p!r} is not a section")
            node = child
        node[parts[-1]] = value
    return out


def build(cls: type[T], data: Mapping[str, Any], prefix: str = "", aliases: Mapping[str, str] | None = None) -> T:
    """``cls(**data)`` with every value checked against its annotation (nested dataclasses built from mappings);
    ``aliases`` maps dotted keys to the field's (``{"trainer.lambda": "trainer.lam"}``). An unknown key is a
    ``ConfigError`` naming the nearest valid key and listing the valid ones."""
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        full = f"{prefix}.{key}" if prefix else str(key)
        dotted = (aliases or {}).get(full, full)
        name = dotted.rsplit(".", 1)[-1]
        if name not in names:
            close = difflib.get_close_matches(str(key), names, n=1)
            hint = f"; did you mean {prefix + '.' if prefix else ''}{close[0]}?" if close else ""
            raise ConfigError(f"unknown config key {dotted!r}{hint} (valid keys here: {sorted(names)})")
        kwargs[name] = _coerce(value, hints[name], dotted, aliases)
    return cls(**kwargs)


_KINDS = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}


def _coerce(value: Any, tp: Any, where: str, aliases: Mapping[str, str] | None) -> Any:
    """``value`` as the annotated type ``tp`` (YAML gives ``1e-5`` as a string: it becomes a float), or a
    ``ConfigError`` naming ``where`` and what was expected."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        arms = [a for a in args if a is not type(None)]
        errors = []
        for arm in arms:
            try:
                return _coerce(value, arm, where, aliases)
            except ConfigError as e:
                errors.append(e)
        if len(arms) == 1:
            raise errors[0]
        kinds = " or ".join(_KINDS.get(a, getattr(a, "__name__", str(a))) for a in arms)
        raise ConfigError(f"{where}: expected {kinds}, got {value!r}")
    if origin is typing.Literal:
        if value in args:
            return value
        raise ConfigError(f"{where}: expected one of {list(args)}, got {value!r}")
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where}: expected a mapping of fields, got {value!r}")
        return build(tp, value, where, aliases)  # type: ignore[arg-type]
    if origin in (list, tuple):
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        item = args[0] if args else Any
        return origin(_coerce(v, item, f"{where}[{i}]", aliases) for i, v in enumerate(value))
    if origin is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where}: expected a mapping, got {value!r}")
        item = args[1] if args else Any
        return {k: _coerce(v, item, f"{where}.{k}", aliases) for k, v in value.items()}
    if tp in _KINDS:
        return _scalar(value, tp, where)
    return value


def _scalar(value: Any, tp: type, where: str) -> Any:
    if isinstance(value, bool):
        ok = tp is bool
    elif tp is bool:
        ok = False
    elif tp is int:
        ok = isinstance(value, int)
    elif tp is float:
        ok = isinstance(value, int | float)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
    else:
        ok = isinstance(value, str | int | float)
    if not ok:
        raise ConfigError(f"{where}: expected {_KINDS[tp]}, got {value!r}")
    return tp(value)

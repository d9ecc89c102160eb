"""Builds frozen dataclasses from parsed YAML, naming the exact key that is wrong, and writes them back."""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, get_args, get_origin

from esr_settings.errors import ConfigError, SettingError

__all__ = ["build", "dump", "replace_at"]


def build(cls: type, data: Any, path: str) -> Any:
    """Instantiate dataclass `cls` from a mapping; `path` prefixes every error message."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path or 'config'}: expected a mapping, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ConfigError(f"{_join(path, unknown[0])}: unknown key (allowed: {', '.join(sorted(fields))})")
    kwargs = {}
    for name, f in fields.items():
        key = _join(path, name)
        if name in data:
            kwargs[name] = _convert(hints[name], data[name], key)
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ConfigError(f"{key}: required key is missing")
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except SettingError as exc:
        raise ConfigError(f"{_join(path, exc.field)}: {exc}") from None
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{path or 'config'}: {exc}") from None


def _join(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


def _convert(tp: Any, value: Any, key: str) -> Any:
    origin = get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in (a for a in args if a is not type(None)):
            try:
                return _convert(arg, value, key)
            except ConfigError as exc:
                errors.append(str(exc))
        raise ConfigError(errors[0] if len(errors) == 1 else f"{key}: {value!r} fits none of {tp}")
    if origin is typing.Literal:
        if value not in get_args(tp):
            raise ConfigError(f"{key}: must be one of {', '.join(map(str, get_args(tp)))}, got {value!r}")
        return value
    if origin is tuple:
        (item_tp, _ellipsis) = get_args(tp)
        if not isinstance(value, list):
            raise ConfigError(f"{key}: expected a list, got {type(value).__name__}")
        return tuple(_convert(item_tp, v, _join(key, i)) for i, v in enumerate(value))
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return build(tp, value, key)
    if origin is dict or tp is dict:
        # Free-form section (e.g. a plugin's settings): the owner validates it later.
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping, got {type(value).__name__}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key}: expected a number, got {value!r}")
        return float(value)
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key}: expected an integer, got {value!r}")
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key}: expected true or false, got {value!r}")
        return value
    if tp is str:
        if not isinstance(value, str) or not value:
            raise ConfigError(f"{key}: expected a non-empty string, got {value!r}")
        return value
    raise TypeError(f"unsupported config type {tp} at {key}")  # a bug in the schema, not the file


def dump(obj: Any) -> Any:
    """The plain data (mappings, lists, scalars) that `build` turns back into `obj`: keys left at
    their defaults are left out, so a written config says only what differs."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        out = {}
        for f in dataclasses.fields(obj):
            if not f.init:
                continue
            value = getattr(obj, f.name)
            if f.default is not dataclasses.MISSING and _same(value, f.default):
                continue
            if f.default_factory is not dataclasses.MISSING and _same(value, f.default_factory()):
                continue
            out[f.name] = dump(value)
        return out
    if isinstance(obj, (tuple, list)):
        return [dump(v) for v in obj]
    if isinstance(obj, dict):
        return {k: dump(v) for k, v in obj.items()}
    return obj


def _same(a: Any, b: Any) -> bool:
    # 1 == True in Python: a bool default must not swallow an int value (and the reverse).
    return type(a) is type(b) and a == b


def replace_at(obj: Any, key: str, value: Any = dataclasses.MISSING, /, **fields: Any) -> Any:
    """`obj` with the field at dotted `key` (e.g. "classifier.head_path") set to `value`, or the
    dataclass there with `fields` replaced; every dataclass on the way is copied: the nested
    `dataclasses.replace` written once."""
    name, _, rest = key.partition(".")
    if rest:
        inner = replace_at(getattr(obj, name), rest, value, **fields)
    elif value is dataclasses.MISSING:
        inner = dataclasses.replace(getattr(obj, name), **fields)
    else:
        inner = value
    return dataclasses.replace(obj, **{name: inner})

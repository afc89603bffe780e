"""Strict JSON -> frozen dataclass loading for the run configs (jaxgpt/config.py).

Every key must be a field, every value must fit the field's type exactly (JSON has one number
type: 1e6 is accepted as an integer, 2.5 and true are not), and each failure is one ConfigError
line naming the file, the key and the value.
"""

from __future__ import annotations

import dataclasses
import json
import math
import types
import typing
from pathlib import Path
from typing import Any, Literal

MODEL_FILE = "model.json"
TRAIN_FILE = "train.json"


class ConfigError(ValueError):
    """A bad run configuration; the message is one line naming the file, key and value."""


def from_json(cls: type, path: Path) -> Any:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: file not found") from None
    except IsADirectoryError:
        raise ConfigError(f"{path}: is a directory, not a JSON file") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text (byte {e.object[e.start]:#04x} at offset {e.start})") from None
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path}: malformed JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
    return from_dict(cls, raw, str(path))


def from_dict(cls: type, raw: Any, where: str) -> Any:
    """Build a config dataclass from parsed JSON, checking keys and types strictly."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected a JSON object, got {type(raw).__name__} {json.dumps(raw)[:80]}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        raise ConfigError(f"{where}: unknown key {unknown[0]!r} (known keys: {', '.join(sorted(fields))})")
    missing = [
        name
        for name, f in fields.items()
        if name not in raw and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        raise ConfigError(f"{where}: missing required key {missing[0]!r}")
    values = {name: _convert(hints[name], value, f"{where}: {name}") for name, value in raw.items()}
    try:
        return cls(**values)
    except ConfigError as e:
        # __post_init__ starts its message with the bare file name ("train.json: key=value ...");
        # put the full location (path, and the section for nested configs) in its place.
        msg = str(e)
        for base in (MODEL_FILE, TRAIN_FILE):
            if msg.startswith(base + ": "):
                msg = msg[len(base) + 2 :]
        raise ConfigError(f"{where}: {msg}") from None


def _convert(tp: Any, value: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(tp)
        if value is None and type(None) in options:
            return None
        inner = [t for t in options if t is not type(None)]
        if len(inner) == 1:
            return _convert(inner[0], value, where)
        for tp in inner:  # e.g. int | Literal["all"]: the first type the value fits
            try:
                return _convert(tp, value, where)
            except ConfigError:
                pass
        raise ConfigError(f"{where}={value!r} must be {' or '.join(_describe(tp) for tp in inner)}")
    if origin is Literal:
        allowed = typing.get_args(tp)
        if value not in allowed:
            raise ConfigError(f"{where}={value!r} must be one of {', '.join(map(repr, allowed))}")
        return value
    if dataclasses.is_dataclass(tp):
        return from_dict(tp, value, where)
    if origin is tuple:  # tuple[str, ...]: a JSON array
        if not isinstance(value, list):
            raise ConfigError(f"{where}={value!r} must be a JSON array")
        return tuple(_convert(typing.get_args(tp)[0], v, f"{where}[{i}]") for i, v in enumerate(value))
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where}={value!r} must be a JSON object")
        return dict(value)
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}={value!r} must be true or false")
        return value
    if tp is int:
        # JSON has one number type: accept 1e6-style integral floats, reject 2.5 and true.
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}={value!r} must be an integer")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ConfigError(f"{where}={value!r} must be a finite number")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}={value!r} must be a string")
        return value
    raise AssertionError(f"unhandled config type {tp} at {where}")


def _describe(tp: Any) -> str:
    if typing.get_origin(tp) is Literal:
        return " or ".join(map(repr, typing.get_args(tp)))
    return {int: "an integer", float: "a finite number", bool: "true or false", str: "a string"}.get(tp, str(tp))


def to_dict(cfg: Any) -> dict[str, Any]:
    """The resolved config, every default filled in, as written beside the checkpoints."""
    return dataclasses.asdict(cfg)

"""Typed records from plain YAML mappings (conf/model, conf/hardware): one loader, errors that name file and field."""

from __future__ import annotations

import dataclasses
import types
import typing
from pathlib import Path

import yaml


def read_mapping(path: Path) -> dict:
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise ValueError(f"{path}: cannot read: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not a YAML text file ({e.reason} at byte {e.start})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ValueError(f"{path}: not valid YAML ({yaml_error_line(e)})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: must be a YAML mapping of fields, got {type(data).__name__}")
    return data


def yaml_error_line(e: yaml.YAMLError) -> str:
    """PyYAML's several-line message as one line: where, and what it found."""
    mark = getattr(e, "problem_mark", None)
    problem = getattr(e, "problem", None) or str(e).splitlines()[0]
    return f"line {mark.line + 1}, column {mark.column + 1}: {problem}" if mark is not None else problem


def _coerce(value, kind, where: str, name: str):
    origin = typing.get_origin(kind)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(kind) if a is not type(None)]
        if value is None:
            return None
        kind = args[0]
        origin = typing.get_origin(kind)
    if kind is bool:
        if not isinstance(value, bool):
            raise ValueError(f"{where}: field '{name}' must be true or false, got {value!r}")
        return value
    if kind is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{where}: field '{name}' must be an integer, got {value!r}")
        return value
    if kind is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{where}: field '{name}' must be a number, got {value!r}")
        return float(value)
    if kind is str:
        if not isinstance(value, str):
            raise ValueError(f"{where}: field '{name}' must be a string, got {value!r}")
        return value
    if origin is dict or kind is dict:
        if not isinstance(value, dict):
            raise ValueError(f"{where}: field '{name}' must be a mapping, got {value!r}")
        return {str(k): str(v) for k, v in value.items()}
    return value


def build(cls, data: dict, where: str):
    """cls(**data) with every field checked for presence and type; unknown keys are errors (typos lose data)."""
    hints = typing.get_type_hints(cls)
    known = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise ValueError(f"{where}: unknown field(s) {', '.join(unknown)}; valid: {', '.join(known)}")
    kwargs = {}
    for name, f in known.items():
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        if name not in data:
            if required:
                raise ValueError(f"{where}: missing field '{name}'")
            continue
        kwargs[name] = _coerce(data[name], hints[name], where, name)
    try:
        return cls(**kwargs)
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None


def resolve(name_or_path: str, folder: Path, what: str) -> Path:
    """A name of a file in folder (without .yaml) or a path to a YAML file."""
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml") and p.is_file():
        return p
    cand = folder / f"{name_or_path}.yaml"
    if cand.is_file():
        return cand
    valid = ", ".join(sorted(f.stem for f in folder.glob("*.yaml")))
    raise ValueError(f"unknown {what} {name_or_path!r}; valid: {valid} (or a path to a .yaml file)")


def require_positive(obj, names, allow_zero: bool = False) -> None:
    for n in names:
        v = getattr(obj, n)
        if v < 0 or (v == 0 and not allow_zero):
            raise ValueError(f"field '{n}' must be {'>= 0' if allow_zero else '> 0'}, got {v}")

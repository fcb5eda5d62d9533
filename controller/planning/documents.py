"""Reading configuration documents: a path, YAML text, bytes, a dict or an OmegaConf
config into plain data, and plain data into strict msgspec Structs whose errors name the
key path (``cluster.node_groups[1].node_ranks``) and the keys allowed there."""

from __future__ import annotations

import os
import re
from typing import Any

import msgspec
import yaml

from controller.errors import SpecError

MAX_SPEC_BYTES = 1 << 20


def read_document(source: Any) -> Any:
    """Parse a path, YAML text, bytes or OmegaConf config into plain Python data."""
    if isinstance(source, os.PathLike):
        source = os.fspath(source)
    if isinstance(source, bytes):
        source = source.decode()
    if isinstance(source, str):
        if len(source) > MAX_SPEC_BYTES:
            raise SpecError(
                f"configuration of {len(source)} characters: more than the limit of "
                f"{MAX_SPEC_BYTES}"
            )
        looks_like_path = "\n" not in source and (
            source.endswith((".yaml", ".yml")) or os.path.isfile(source)
        )
        if looks_like_path:
            try:
                with open(source, encoding="utf-8") as f:
                    source = f.read(MAX_SPEC_BYTES + 1)
                if len(source) > MAX_SPEC_BYTES:
                    raise SpecError(f"configuration file is larger than {MAX_SPEC_BYTES} bytes")
            except OSError as e:
                raise SpecError(f"cannot read configuration {source!r}: {e.strerror}") from None
        try:
            return yaml.safe_load(source)
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
            problem = getattr(e, "problem", None) or "invalid YAML"
            raise SpecError(f"configuration is not valid YAML{where}: {problem}") from None
    if type(source).__module__.startswith("omegaconf"):
        from omegaconf import OmegaConf

        return OmegaConf.to_container(source, resolve=True)
    return source


def _allowed_keys(root: Any, path: str) -> list[str]:
    """The keys allowed at a msgspec error path such as ``$.node_groups[0]``."""
    import typing

    typ: Any = root
    for name, index in re.findall(r"\.(\w+)|\[(\d+|\.\.\.)\]", path):
        while True:
            if isinstance(typ, type) and issubclass(typ, msgspec.Struct):
                if not name:
                    return []
                typ = typing.get_type_hints(typ).get(name)
                break
            args = [a for a in typing.get_args(typ) if a is not type(None)]
            origin = typing.get_origin(typ)
            if origin in (list, dict) and index:
                typ = args[-1]
                break
            structs = [a for a in args if isinstance(a, type) and issubclass(a, msgspec.Struct)]
            containers = [a for a in args if typing.get_origin(a) in (list, dict)]
            if structs and name:
                typ = structs[0]
            elif containers and index:
                typ = containers[0]
            else:
                return []
    while not (isinstance(typ, type) and issubclass(typ, msgspec.Struct)):
        structs = [a for a in typing.get_args(typ) if isinstance(a, type)]
        structs = [a for a in structs if issubclass(a, msgspec.Struct)]
        if not structs:
            return []
        typ = structs[0]
    return list(typ.__struct_fields__)


def convert(value: Any, typ: Any, base: str) -> Any:
    """msgspec.convert whose errors name the key path below ``base``."""
    try:
        return msgspec.convert(value, typ, strict=True)
    except msgspec.ValidationError as e:
        raise _spec_error(e, typ, base) from None


def _spec_error(e: msgspec.ValidationError, root: Any, base: str) -> SpecError:
    text = str(e)
    m = re.match(r"^(.*?)(?: - at `(\$[^`]*)`)?$", text)
    message, path = (m.group(1), m.group(2) or "$") if m else (text, "$")
    where = base + path[1:].replace("[...]", "")
    unknown = re.match(r"Object contains unknown field `(.*)`", message)
    if unknown:
        allowed = ", ".join(_allowed_keys(root, path))
        return SpecError(f"{where}: unknown key {unknown.group(1)!r}; allowed keys: {allowed}")
    missing = re.match(r"Object missing required field `(.*)`", message)
    if missing:
        return SpecError(f"{where}.{missing.group(1)}: required key is missing")
    if message.startswith("Expected"):
        message = "e" + message[1:]
    return SpecError(f"{where}: {message}")

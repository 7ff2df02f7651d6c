"""Config files: read (TOML or YAML), validate (pydantic models), describe (JSON Schema).

Every study config is a tree of :class:`ConfigModel` classes: strict types (``true`` is not
a number, ``"3"`` not an integer), no unknown keys, frozen once built. :func:`validate`
turns pydantic's errors into one :class:`~prefixlab.errors.ConfigError` line that names the
key path, the rule and the value given::

    cache.capacities[1]: 'half' is not a capacity; give blocks (4000), ...
    runner.max_num_seqs: expected a number >= 1, got 0
    config key 'cache.blocktokens' unknown; known here: block_tokens, cache_partial, ...

Rules that join several keys (``runner.kind = 'engine'`` needs a timing model) are checked
after the keys, by each model, and say which keys they join.
"""

from __future__ import annotations

import difflib
import json
import re
import sys
import typing
from pathlib import Path
from typing import Annotated, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic_core import ErrorDetails

from prefixlab.errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

M = TypeVar("M", bound="ConfigModel")
#: the seeds of a study: each cell runs once per seed
Seeds = Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)]


class ConfigModel(BaseModel):
    """A table of a config file: strict, closed, immutable."""

    model_config = ConfigDict(
        strict=True, extra="forbid", frozen=True, allow_inf_nan=False, use_attribute_docstrings=True
    )

    def to_json(self) -> str:
        """The resolved config (defaults filled in), keys sorted."""
        return json.dumps(self.model_dump(mode="json"), indent=2, sort_keys=True)


def validate(cls: type[M], data: object) -> M:
    """``data`` (as TOML or YAML parse it) as a ``cls``; a bad value raises ConfigError."""
    if not isinstance(data, dict):
        raise ConfigError(f"config: expected a table of keys, got {data!r}")
    try:
        return cls.model_validate(data)
    except ValidationError as exc:
        # an unknown key first: a misspelt key is also reported missing under its name
        errors = sorted(exc.errors(), key=lambda e: e["type"] != "extra_forbidden")
        first = describe(cls, errors[0])
        if len(errors) > 1:
            rest = ", ".join(_path(e["loc"]) or "config" for e in errors[1:4])
            more = "" if len(errors) <= 4 else ", ..."
            first += f" (and {len(errors) - 1} more: {rest}{more})"
        raise ConfigError(first) from None


def _path(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


#: pydantic's error types, in the words of the rule
_RULES = {
    "int_type": "expected an integer",
    "float_type": "expected a number",
    "finite_number": "expected a finite number",
    "bool_type": "expected true or false",
    "string_type": "expected a string",
    "list_type": "expected a list",
    "dict_type": "expected a table of keys",
    "model_type": "expected a table of keys",
    "greater_than": "expected a value > {gt}",
    "greater_than_equal": "expected a value >= {ge}",
    "less_than": "expected a value < {lt}",
    "less_than_equal": "expected a value <= {le}",
    "string_too_short": "expected a non-empty string",
    "too_short": "expected a non-empty list",
}


def describe(cls: type[BaseModel], error: ErrorDetails) -> str:
    """One pydantic error as ``key.path: rule, got value``."""
    loc, kind, given = error["loc"], error["type"], error.get("input")
    path = _path(loc)
    if kind == "missing":
        return f"config key '{path}' missing{_about(cls, loc)}"
    if kind == "extra_forbidden":
        fields = sorted(_model_at(cls, loc[:-1]).model_fields)
        close = difflib.get_close_matches(str(loc[-1]), fields, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        return f"config key '{path}' unknown{hint}; known here: {', '.join(fields)}"
    if kind == "value_error":
        text = str(error["ctx"]["error"]) if "ctx" in error else error["msg"]
        return f"{path}: {text}" if path else text
    if kind == "literal_error":
        expected = error.get("ctx", {}).get("expected", "")
        return f"{path}: {given!r} unknown; known: {expected.replace(' or ', ', ')}"
    rule = _RULES.get(kind)
    ctx = {k: f"{v:g}" if isinstance(v, float) else v for k, v in error.get("ctx", {}).items()}
    text = rule.format(**ctx) if rule else error["msg"]
    return f"{path}: {text}, got {given!r}"


def _model_at(cls: type[BaseModel], loc: tuple[int | str, ...]) -> type[BaseModel]:
    """The model class of the table at ``loc`` (lists and dicts of tables stepped through)."""
    for part in loc:
        if isinstance(part, int) or part not in cls.model_fields:
            continue
        nested = _models_in(cls.model_fields[part].annotation)
        if nested:
            cls = nested[0]
    return cls


def _models_in(annotation: object) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models_in(arg)]


def _about(cls: type[BaseModel], loc: tuple[int | str, ...]) -> str:
    field = _model_at(cls, loc[:-1]).model_fields.get(str(loc[-1])) if loc else None
    doc = field.description if field is not None else None
    return f" ({doc})" if doc else ""


def schema(cls: type[BaseModel]) -> dict[str, object]:
    """The JSON Schema of a config file of this kind (``prefixlab schema KIND``)."""
    out: dict[str, object] = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        **cls.model_json_schema(),
    }
    return out


# ------------------------------------------------------------------ files
def read_config_file(path: str | Path) -> tuple[object, Path]:
    """The parsed contents of a TOML (``.toml``) or YAML (``.yaml``/``.yml``) file."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file not found: {p}")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"{p}: not UTF-8 text") from None
    return parse_config_text(text, yaml=p.suffix in (".yaml", ".yml"), where=str(p)), p


def parse_config_text(text: str, *, yaml: bool = False, where: str = "config") -> object:
    """TOML (or YAML) text as Python data; syntax errors name ``where``."""
    if yaml:
        try:
            import yaml as pyyaml
        except ImportError:
            raise ConfigError("YAML configs need PyYAML (pip install pyyaml)") from None
        try:
            data = pyyaml.safe_load(text)
        except pyyaml.YAMLError as exc:
            raise ConfigError(f"{where}: bad YAML: {exc}") from None
    else:
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{where}: bad TOML: {exc}") from None
    return data


_BYTES = re.compile(r"^(?P<n>\d*\.?\d+)\s*(?P<unit>B|KB|MB|GB|TB|KiB|MiB|GiB|TiB)$")
_UNITS = {
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "KiB": 2**10,
    "MiB": 2**20,
    "GiB": 2**30,
    "TiB": 2**40,
}


def parse_bytes(text: str) -> int | None:
    """``"40GB"`` -> 40_000_000_000 (``GiB`` for powers of two); None if not a size."""
    m = _BYTES.match(text.strip())
    if m is None:
        return None
    return round(float(m.group("n")) * _UNITS[m.group("unit")])

"""``field_map`` values: ``jpg,png`` alternatives and ``json[a][0]`` nested access."""

from __future__ import annotations

import re
from typing import Any, List

_ACCESS_RE = re.compile(r"^(?P<part>[^\[\]]+)(?P<access>(?:\[[^\[\]]+\])*)$")


class FieldAccessError(KeyError):
    """The requested part or nested key is not in the sample."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def parse_field_access(spec: str) -> List[List[str]]:
    """Split a field-map value into alternatives, each a part name followed by nested keys.

    Example:
        >>> parse_field_access("json[a][0],txt")
        [['json', 'a', '0'], ['txt']]
    """
    options = []
    for option in spec.split(","):
        option = option.strip()
        match = _ACCESS_RE.match(option)
        if not match:
            raise ValueError(f"invalid field access {option!r} in {spec!r}")
        keys = [k for k in re.findall(r"\[([^\[\]]+)\]", match.group("access"))]
        options.append([match.group("part"), *keys])
    return options


def _access(value: Any, keys: List[str], path: str) -> Any:
    for key in keys:
        if isinstance(value, dict):
            if key not in value:
                raise FieldAccessError(f"key {key!r} not found at {path}")
            value = value[key]
        elif isinstance(value, (list, tuple)):
            try:
                value = value[int(key)]
            except (ValueError, IndexError):
                raise FieldAccessError(f"index {key!r} not valid at {path} (length {len(value)})") from None
        else:
            raise FieldAccessError(f"cannot index {type(value).__name__} at {path} with {key!r}")
        path = f"{path}[{key}]"
    return value


def field_access(sample: dict, options: List[List[str]]) -> Any:
    """Return the first alternative that exists in ``sample``.

    Raises:
        FieldAccessError: naming every alternative that was tried.
    """
    errors = []
    for part, *keys in options:
        if part not in sample:
            errors.append(f"part {part!r} missing")
            continue
        try:
            return _access(sample[part], keys, part)
        except FieldAccessError as exc:
            errors.append(str(exc))
    raise FieldAccessError("; ".join(errors))

"""YAML read with Energon's scalar rules, so a config file means the same values here as there.

Energon parses its YAML files (metadatasets, ``dataset.yaml``, split files) with rapidyaml and types
the unquoted scalars itself, not by YAML 1.1's rules that PyYAML's ``safe_load`` follows. The two
disagree on values a user writes: ``2024-01-01`` (a date in PyYAML, text in Energon), ``1e-3``
(text / a float), ``on`` (True / text), ``010`` (8 / 10), ``1:20`` (80 / text), and mapping keys
(``1:`` is the int 1 in PyYAML, the text ``'1'`` in Energon). Those values become weights,
subset bounds and the ``__subflavors__`` every sample carries, so they must be Energon's.

The rules for an unquoted scalar: ``null``/``~`` is None, ``true``/``yes`` and ``false``/``no``
(any case) are booleans, text holding ``.`` or ``e`` is a float if Python's ``float`` reads it,
other text an int if ``int`` reads it, anything else stays text. Quoted and block scalars stay text;
keys stay as written. An empty value is None (Energon cannot read one at all).

Tags are ignored, as Energon's reader ignores them: ``!!int "7"`` is the text ``'7'`` (quoted),
``!!str 7`` the int 7 (plain), ``!!binary``/``!!timestamp``/``!custom`` values are read as if untagged,
so a tag can neither change a value's type nor name a constructor (PyYAML's ``!!python/...``).

Aliases are not resolved, as Energon's reader leaves them: ``*name`` is the text ``'*name'`` (a merge
``<<: *base`` is the key ``'<<'`` with that text), and an anchor only labels its value. So a file
cannot refer to itself (``s: &s {self: *s}``, a value no JSON or checkpoint can hold) nor expand an
alias bomb; each alias read is logged as a warning naming its line.
"""

from __future__ import annotations

import logging
from typing import Any

import yaml

from energon_ray.errors import first_time

logger = logging.getLogger("energon_ray")

_NULL = frozenset({"null", "~", ""})
_TRUE = frozenset({"true", "yes"})
_FALSE = frozenset({"false", "no"})


def plain_scalar(text: str) -> Any:
    """The value Energon gives an unquoted YAML scalar.

    Example:
        >>> [plain_scalar(t) for t in ("1e-3", "010", "Yes", "on", "2024-01-01", "~")]
        [0.001, 10, True, 'on', '2024-01-01', None]
    """
    lower = text.lower()
    if lower in _NULL:
        return None
    if lower in _TRUE:
        return True
    if lower in _FALSE:
        return False
    try:
        return float(text) if ("." in text or "e" in lower) else int(text)
    except ValueError:
        return text


class _EnergonLoader(yaml.SafeLoader):
    """A safe loader whose plain scalars all resolve to text first, then get :func:`plain_scalar`."""

    yaml_implicit_resolvers: dict = {}

    def compose_node(self, parent: Any, index: Any) -> yaml.Node:
        if self.check_event(yaml.AliasEvent):
            event = self.get_event()
            _warn_alias("*" + event.anchor, event.start_mark.line + 1)
            return yaml.ScalarNode("tag:yaml.org,2002:str", "*" + event.anchor, event.start_mark, event.end_mark)
        self.anchors = {}  # anchors only label values here: a repeated one is no error (as in Energon)
        node = super().compose_node(parent, index)
        node.tag = _UNTAGGED[type(node)]  # a tag written in the file is ignored, as Energon's reader does
        return node

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        out = {}
        for key_node, value_node in node.value:
            # Energon keeps every key as the text written (``1:`` is ``'1'``); a key that is a
            # list or mapping is unhashable and refused by the caller's parse error
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else self.construct_object(key_node, deep=deep)
            out[key] = self.construct_object(value_node, deep=deep)
        return out


_UNTAGGED = {
    yaml.ScalarNode: "tag:yaml.org,2002:str",
    yaml.SequenceNode: "tag:yaml.org,2002:seq",
    yaml.MappingNode: "tag:yaml.org,2002:map",
}


def _warn_alias(text: str, line: int) -> None:
    if first_time("yaml alias", (text, line)):  # (a config is read again in each Ray worker)
        logger.warning("YAML alias %r on line %d is read as the text %r, as megatron-energon reads it (aliases "
                       "are not resolved): write the value out", text, line, text)


def _construct_text(loader: _EnergonLoader, node: yaml.ScalarNode) -> Any:
    text = loader.construct_scalar(node)
    return plain_scalar(text) if node.style is None else text


_EnergonLoader.add_constructor("tag:yaml.org,2002:str", _construct_text)


def load(text: str) -> Any:
    """Parse YAML ``text`` as Energon does (see the module's rules); raises ``yaml.YAMLError``.

    Example:
        >>> load("subflavors: {ver: 2024-01-01, lr: 1e-3, 1: x, q: '5'}")
        {'subflavors': {'ver': '2024-01-01', 'lr': 0.001, '1': 'x', 'q': '5'}}
    """
    return yaml.load(text, Loader=_EnergonLoader)

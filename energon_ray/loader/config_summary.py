"""What a state was saved for, readably: ``describe()``'s output as a flat mapping of short values.

A state fits a loader when their fingerprints match (``savable.check_fits``); a fingerprint is a
digest, so by itself it cannot say *what* differs. ``summarize`` keeps the same description as
``{path: value}`` (``parts[1].options.batch_size: 8``, ``weights: [1, 2]``), a large value (a
dataset's shard names) as a short digest, and at most ``MAX_CHARS`` characters in all (a state stays
small for any dataset). ``differences`` names what changed between two summaries and ``explain``
puts the first few into a sentence. A summary only explains a refusal; the fingerprints decide it.

Example:
    >>> saved = summarize({"weights": [1, 2], "parts": [{"options": {"batch_size": 8}}]})
    >>> saved
    {'weights': [1, 2], 'parts[0].options.batch_size': 8}
    >>> now = summarize({"weights": [1, 3], "parts": [{"options": {"batch_size": 4}}]})
    >>> explain(differences(saved, now))
    'weights was [1, 2], is now [1, 3]; parts[0].options.batch_size was 8, is now 4'
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any, Dict, Iterable, Iterator, List, Optional, Tuple

#: a value whose JSON is longer is kept as a digest (``<6 items, sha1 0123456789>``)
MAX_VALUE_CHARS = 64
#: a summary's size in JSON characters; the entries past it are left out and counted under ``CUT``
MAX_CHARS = 8 * 1024
#: the key counting the entries left out (never a path: a path starts with a description's name)
CUT = "..."
#: differences a message names; the rest are counted
MAX_NAMED = 5
#: names for the items of a list of the description (a leaf's ``dataset``), so its paths read
_LABELS = {"dataset": ("split_part", "total", "shards")}
_DIGEST = re.compile(r"<\d+ (?:items|chars), sha1 [0-9a-f]{10}>")
_ABSENT = object()


def summarize(description: Any, max_chars: Optional[int] = MAX_CHARS) -> Dict[str, Any]:
    """``description`` as ``{path: short value}``: each dict's own values first, then what it nests.

    Args:
        description: what ``savable.describe`` returns (seen as its fingerprint sees it: tuples as
            lists, other objects as their ``str``).
        max_chars: entries stop before the JSON would grow past it (``CUT``: how many were left
            out); ``None``: every entry (a summary that is compared, never saved).
    """
    plain = json.loads(json.dumps(description, sort_keys=True, default=str))
    out: Dict[str, Any] = {}
    size = 2
    entries = list(_flatten(plain, ""))
    for i, (path, value) in enumerate(entries):
        size += len(json.dumps(path)) + len(json.dumps(value)) + 4  # json.dumps' ": " and ", "
        if max_chars is not None and size > max_chars:
            out[CUT] = len(entries) - i
            break
        out[path] = value
    return out


def differences(saved: Dict[str, Any], current: Dict[str, Any], ignore: Iterable[str] = ()) -> List[str]:
    """``"<path> was <saved value>, is now <current value>"`` per difference: a composition's
    ``type`` first (a wrapper added, removed or replaced: every path below it differs too), then
    changed values, then paths that one side lacks (``absent`` on the other).

    Args:
        saved: a state's summary; empty (a state saved before summaries): no differences.
        current: the loader's summary, every entry (``max_chars=None``).
        ignore: last names of paths left out (what may differ, e.g. ``batch_size``).

    A path only ``current`` has is not named when ``saved`` was cut: it may be past the cut.
    """
    if not saved:
        return []
    skip = set(ignore)

    def compared(path: str) -> bool:
        return path != CUT and _last_name(path) not in skip

    changed, added = [], []
    for path, value in current.items():
        if not compared(path):
            continue
        if path not in saved:
            if CUT not in saved:
                added.append((path, _ABSENT, value))
        elif json.dumps(saved[path]) != json.dumps(value):  # 1 and 1.0 are other fingerprints
            changed.append((path, saved[path], value))
    removed = [(path, value, _ABSENT) for path, value in saved.items() if compared(path) and path not in current]
    found = changed + removed + added
    found.sort(key=lambda diff: _last_name(diff[0]) != "type")  # stable: the rest stay in that order
    return [_line(*diff) for diff in found]


def explain(lines: List[str]) -> str:
    """The first ``MAX_NAMED`` of ``differences``' lines and how many more, as one clause."""
    more = len(lines) - MAX_NAMED
    return "; ".join(lines[:MAX_NAMED]) + (f"; and {more} more" if more > 0 else "")


def _flatten(value: Any, path: str) -> Iterator[Tuple[str, Any]]:
    if isinstance(value, dict) and value:
        items = [(key, _labelled(key, item)) for key, item in value.items()]
        # own values before nested ones: a summary cut short keeps a blend's weights
        for key, item in sorted(items, key=lambda kv: _nests(kv[1])):
            yield from _flatten(item, f"{path}.{key}" if path else key)
    elif _nests(value):
        for i, item in enumerate(value):
            yield from _flatten(item, f"{path}[{i}]")
    else:
        text = json.dumps(value)
        yield path, value if len(text) <= MAX_VALUE_CHARS else _digest(value, text)


def _labelled(key: str, value: Any) -> Any:
    labels = _LABELS.get(key)
    if labels is not None and isinstance(value, list) and len(value) == len(labels):
        return dict(zip(labels, value))
    return value


def _nests(value: Any) -> bool:
    """Whether ``value`` is summarized by its parts (a dict, a list of dicts), not as one value."""
    if isinstance(value, dict):
        return bool(value)
    return isinstance(value, list) and any(isinstance(item, dict) for item in value)


def _digest(value: Any, text: str) -> str:
    unit = "chars" if isinstance(value, str) else "items"
    return f"<{len(value)} {unit}, sha1 {hashlib.sha1(text.encode()).hexdigest()[:10]}>"


def _last_name(path: str) -> str:
    return re.split(r"[.\[]", path)[-1]


def _line(path: str, before: Any, after: Any) -> str:
    return f"{path} was {_show(before)}, is now {_show(after)}"


def _show(value: Any) -> str:
    if value is _ABSENT:
        return "absent"
    if isinstance(value, str) and _DIGEST.fullmatch(value):
        return value
    return repr(value)

"""``.nv-meta/split.yaml``: which shards form each split part, and what is excluded; how prepare
assigns shards to parts (by ratio or by patterns) and writes their names compactly."""

from __future__ import annotations

import dataclasses
import json
import math
import random
import re
from pathlib import Path
from typing import Dict, FrozenSet, Iterator, List, Mapping, Optional, Sequence, Tuple

import braceexpand
import yaml

from energon_ray.errors import DatasetConfigError, parse_problem
from energon_ray.format import energon_yaml
from energon_ray.format.info import check_write_target, meta_dir, write_file
from energon_ray.storage import as_path


@dataclasses.dataclass(frozen=True)
class SplitPart:
    """The shards of one split part (in split-file order) and the sample-level excludes."""

    name: str
    shards: Tuple[str, ...]
    #: ``"shard name/sample key"`` entries whose samples are dropped when read.
    sample_excludes: FrozenSet[str]


#: the most names one list of a split file's patterns (a part's shards, the excludes) may expand to;
#: ``braceexpand`` builds every range it parses, so ``{0..999999999}`` would take minutes and gigabytes
MAX_EXPANDED_NAMES = 1_000_000
_INT_RANGE_RE = re.compile(r"^(-?\d+)\.\.(-?\d+)(?:\.\.(-?\d+))?$")
_CHAR_RANGE_RE = re.compile(r"^[A-Za-z]\.\.[A-Za-z](?:\.\.-?\d+)?$")


def expansion_bound(pattern: str) -> int:
    """At least as many names as ``braceexpand`` makes of ``pattern``, counted without making them:
    the product over its brace groups of each one's size (an integer range's length, 52 for a letter
    range, a list's entries)."""
    bound, starts, pos = 1, [], 0
    while pos < len(pattern):
        char = pattern[pos]
        if char == "\\":
            pos += 2
            continue
        if char == "{":
            starts.append(pos)
        elif char == "}" and starts:
            bound *= _group_size(pattern[starts.pop() + 1 : pos])
        pos += 1
    return bound


def _group_size(expr: str) -> int:
    """How many alternatives one brace group ``{expr}`` has at most."""
    found = _INT_RANGE_RE.match(expr)
    if found:
        first, last, step = (int(v) if v else 1 for v in found.groups())
        return abs(last - first) // max(abs(step), 1) + 1
    if _CHAR_RANGE_RE.match(expr):
        return 52
    depth, commas, pos = 0, 0, 0
    while pos < len(expr):
        char = expr[pos]
        pos += 2 if char == "\\" else 1
        depth += (char == "{") - (char == "}")
        commas += char == "," and depth == 0
    return commas + 1


def _expand(file: str, what: str, patterns: List[str], known: Optional[Mapping[str, int]] = None) -> Iterator[str]:
    """The brace-expanded names of ``patterns`` (checked by ``read_split_file``; ``what``: where in
    ``file``, for errors; ``known``: the shards ``.nv-meta/.info.json`` lists, each name checked as
    it comes).

    Raises:
        DatasetConfigError: a name ``known`` lacks (at the first one).
    """
    for pattern in patterns:
        for name in braceexpand.braceexpand(str(pattern)):
            if known is not None and name not in known:
                raise DatasetConfigError(f"{file}: {what} names shard {name!r}, which .nv-meta/.info.json does not list")
            yield name


def read_split_file(path: Path | str, split_config: str = "split.yaml") -> Dict:
    """Parse the split file (``split.json`` is accepted when ``split.yaml`` is absent). ``split_config``:
    a name in ``.nv-meta``, an absolute path, or a URL (``s3://``, ``msc://``), as Energon's ``EPath``
    joins it."""
    meta = meta_dir(path)
    file = as_path(split_config) if "://" in split_config else meta / split_config
    if not file.is_file() and split_config == "split.yaml" and (meta / "split.json").is_file():
        file = meta / "split.json"
    if not file.is_file():
        raise DatasetConfigError(f"{file}: split file not found")
    try:
        text = file.read_text()
        data = json.loads(text) if file.suffix == ".json" else energon_yaml.load(text)
    except Exception as exc:
        raise DatasetConfigError(f"{file}: cannot parse: {parse_problem(exc)}") from None
    if not isinstance(data, dict) or not isinstance(data.get("split_parts"), dict):
        raise DatasetConfigError(f"{file}: has no 'split_parts' mapping")
    for name, patterns in data["split_parts"].items():
        _check_patterns(file, f"split_parts[{name!r}]", patterns)
    _check_patterns(file, "exclude", data.get("exclude"))
    data.setdefault("exclude", [])
    data["__file__"] = str(file)
    return data


def _check_patterns(file: Path, where: str, patterns: object) -> None:
    """``patterns`` must be a list of shard names or brace patterns (or empty): a plain string would
    be read letter by letter, an exclude silently not applied; unbalanced braces fail when expanded."""
    if patterns is None:
        return
    if not isinstance(patterns, list):
        hint = f"; write it as a YAML list: [{patterns}]" if isinstance(patterns, str) else ""
        raise DatasetConfigError(
            f"{file}: {where} must be a list of shard names or patterns, got {type(patterns).__name__} {patterns!r}{hint}"
        )
    names = 0
    for pattern in patterns:
        if not isinstance(pattern, str):
            raise DatasetConfigError(f"{file}: {where} holds {pattern!r} ({type(pattern).__name__}); every entry must be a string")
        names += expansion_bound(pattern)
        if names > MAX_EXPANDED_NAMES:
            raise DatasetConfigError(
                f"{file}: {where} expands to more than {MAX_EXPANDED_NAMES:,} names (at {pattern!r}); list shards "
                "in ranges of at most that many"
            )
        try:
            braceexpand.braceexpand(pattern)  # parses: raises on braces that do not balance
        except braceexpand.UnbalancedBracesError:
            raise DatasetConfigError(
                f"{file}: {where} holds {pattern!r}, whose braces do not balance; write a range as "
                "{0000..0009} and a literal brace or backslash in a shard name as \\{, \\} or \\\\"
            ) from None


def resolve_split_part(
    path: Path | str, split_part: str, shard_counts: Dict[str, int], split_config: str = "split.yaml"
) -> SplitPart:
    """Expand the shard patterns of ``split_part`` and apply ``exclude``.

    Raises:
        DatasetConfigError: unknown split part, empty split part, or a shard the info file lacks.
    """
    data = read_split_file(path, split_config)
    file = data["__file__"]
    parts = data["split_parts"]
    if split_part not in parts:
        raise DatasetConfigError(
            f"{file}: unknown split part {split_part!r}; the file defines {sorted(parts)}"
        )
    excludes = set(_expand(file, "exclude", data.get("exclude") or []))
    part_names = _expand(file, f"split part {split_part!r}", parts[split_part] or [], known=shard_counts)
    shards = [name for name in part_names if name not in excludes]
    if not shards:
        raise DatasetConfigError(f"{file}: split part {split_part!r} has no shards (after excludes)")
    return SplitPart(
        name=split_part,
        shards=tuple(shards),
        sample_excludes=frozenset(e for e in excludes if e not in shard_counts and "/" in e),
    )


def write_split_file(
    path: Path | str, split_parts: Dict[str, List[str]], exclude: List[str] | None = None,
    split_config: str = "split.yaml",
) -> Path:
    """Write ``split.yaml`` with the given shard lists (names relative to the dataset root), never
    through a symlink out of the dataset folder."""
    meta = check_write_target(path, meta_dir(path))
    meta.mkdir(parents=True, exist_ok=True)
    text = yaml.safe_dump({"split_parts": split_parts, "exclude": list(exclude or [])}, sort_keys=False)
    return write_file(path, meta / split_config, text.encode())


#: the parts a ratio split assigns shards to, in order
RATIO_PARTS = ("train", "val", "test")
_DIGITS_RE = re.compile(r"\d+")
_BRACE_SPECIAL_RE = re.compile(r"([{}\\])")


def split_by_ratio(
    names: Sequence[str], ratio: Sequence[float], shuffle: bool = False, parts: Sequence[str] = RATIO_PARTS, seed: int = 42
) -> Dict[str, List[str]]:
    """Whole shards to train/val/test (or ``parts``): cut points ``int(n * cumulative normalised ratio)``;
    ``shuffle`` shuffles the shards first with ``random.Random(seed)``.

    As in Energon, except that the last part always ends at ``n``: Energon's float sum can end
    just below 1 (e.g. ratio ``0.1,0.2,0.3``) and then silently drops the last shard.

    Example:
        >>> split_by_ratio(["a.tar", "b.tar", "c.tar"], [8, 1, 1])
        {'train': ['a.tar', 'b.tar'], 'val': [], 'test': ['c.tar']}
    """
    order = list(names)
    if shuffle:
        random.Random(seed).shuffle(order)
    total = float(sum(ratio))
    out, start, cumulative = {}, 0, 0.0
    for i, (part, value) in enumerate(zip(parts, ratio)):
        cumulative += value / total
        end = len(order) if i == len(parts) - 1 else int(len(order) * cumulative)
        out[part] = order[start:end]
        start = end
    return out


def split_by_patterns(names: Sequence[str], patterns: Mapping[str, Sequence[str]]) -> Dict[str, List[str]]:
    """Each part gets the shards (in ``names`` order) that a brace-expanded regex ``re.match``-es.

    Example:
        >>> split_by_patterns(["tr_0.tar", "tr_1.tar", "va_0.tar"], {"train": ["tr_.*"], "val": ["va_{0,9}"]})
        {'train': ['tr_0.tar', 'tr_1.tar'], 'val': ['va_0.tar']}
    """
    out = {}
    for part, part_patterns in patterns.items():
        regexes = [re.compile(e) for p in part_patterns for e in braceexpand.braceexpand(p)]
        out[part] = [n for n in names if any(r.match(n) for r in regexes)]
    return out


def escape_name(name: str) -> str:
    """``name`` as a brace pattern that expands to itself: ``{``, ``}`` and ``\\`` backslash-escaped."""
    return _BRACE_SPECIAL_RE.sub(r"\\\1", name)


def _numbers(name: str) -> Tuple[Tuple[str, ...], Tuple[str, ...]]:
    """``name`` as its text between digit runs (one more than the runs) and its digit runs."""
    return tuple(_DIGITS_RE.split(name)), tuple(_DIGITS_RE.findall(name))


def _next_in_run(prev: Tuple[str, ...], cur: Tuple[str, ...], slot: Optional[int]) -> Optional[int]:
    """The digit run (index) in which ``cur`` counts one up from ``prev`` when every other run is equal
    (and it is ``slot``, when one is set), keeping its width; None if there is none."""
    differ = [i for i, (a, b) in enumerate(zip(prev, cur)) if a != b]
    if len(differ) != 1 or (slot is not None and differ[0] != slot):
        return None
    i = differ[0]
    return i if len(cur[i]) == len(prev[i]) and int(cur[i]) == int(prev[i]) + 1 else None


def collapse_names(names: Sequence[str]) -> List[str]:
    """Brace-collapse runs of consecutively numbered names, keeping order, as Energon's prepare does:
    one number (any of a name's numbers, of equal width) counts up while the rest stays the same.
    ``{``, ``}`` and ``\\`` in names are escaped, so every pattern expands (as :func:`read_split_file`'s
    reader does) to the names.

    Example:
        >>> collapse_names(["s/a_00.tar", "s/a_01.tar", "s/a_02.tar", "s/b.tar", "p0/s5.tar", "p1/s5.tar"])
        ['s/a_{00..02}.tar', 's/b.tar', 'p{0..1}/s5.tar']
    """
    out: List[str] = []
    i = 0
    while i < len(names):
        texts, first = _numbers(names[i])
        last, slot, j = first, None, i + 1
        while j < len(names):
            other_texts, cur = _numbers(names[j])
            step = _next_in_run(last, cur, slot) if other_texts == texts else None
            if step is None:
                break
            last, slot, j = cur, step, j + 1
        if slot is None:
            out.append(escape_name(names[i]))
            i += 1
            continue
        pieces = [escape_name(texts[0])]
        for k, number in enumerate(first):
            pieces.append(f"{{{number}..{last[k]}}}" if k == slot else number)
            pieces.append(escape_name(texts[k + 1]))
        out.append("".join(pieces))
        i = j
    return out


def check_ratio(split_ratio: Sequence[float]) -> Tuple[float, ...]:
    """``split_ratio`` as 3 finite numbers >= 0 with a positive sum (ValueError otherwise)."""
    try:
        values = tuple(float(v) for v in split_ratio)
    except (TypeError, ValueError):
        raise ValueError(f"split_ratio must be 3 numbers (train, val, test), got {split_ratio!r}") from None
    if len(values) != len(RATIO_PARTS):
        raise ValueError(f"split_ratio must have 3 entries (train, val, test), got {list(values)}")
    if any(not math.isfinite(v) or v < 0 for v in values) or sum(values) <= 0:
        raise ValueError(f"split_ratio entries must be >= 0 with a positive sum, got {list(values)}")
    return values


def check_split_parts(split_parts: Mapping[str, Sequence[str]]) -> Dict[str, List[str]]:
    """``{part: [regex, ...]}`` checked (names, at least one valid brace-expanded regex each)."""
    if not isinstance(split_parts, Mapping) or not split_parts:
        raise ValueError(f"split_parts must map part names to regex lists, got {split_parts!r}")
    out = {}
    for part, patterns in split_parts.items():
        patterns = [patterns] if isinstance(patterns, str) else list(patterns or [])
        if not isinstance(part, str) or not part or not patterns:
            raise ValueError(f"split_parts[{part!r}]: needs a non-empty name and at least one pattern")
        for pattern in patterns:
            for expanded in braceexpand.braceexpand(str(pattern)):
                try:
                    re.compile(expanded)
                except re.error as exc:
                    raise ValueError(f"split_parts[{part!r}]: {pattern!r} is not a valid regex: {exc}") from None
        out[part] = [str(p) for p in patterns]
    return out

"""docs/compatibility.md stays true: every public Energon name has a row, and each row matches our exports.

megatron-energon is a dev dependency, so it is imported unconditionally: this test never skips.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import re
from pathlib import Path
from types import ModuleType
from typing import Dict, List

import megatron.energon
import megatron.energon.av
import megatron.energon.media
import pytest

import energon_ray
import energon_ray.av
import energon_ray.decode.av
import energon_ray.media
import energon_ray.errors
import energon_ray.transforms

DOC = Path(__file__).resolve().parents[2] / "docs" / "compatibility.md"
DOCUMENTS = "Names Energon's documents use that 7.4.1 does not export"
OURS_ONLY = "Names only energon_ray has"
STATUSES = ("same", "differs", "missing")

#: Energon module (a section of the doc) -> the energon_ray module its names would be exported from.
HOMES: Dict[str, ModuleType] = {
    "megatron.energon": energon_ray,
    "megatron.energon.av": energon_ray.av,
    "megatron.energon.media": energon_ray.media,
    "megatron.energon.transforms": energon_ray.transforms,
    "megatron.energon.errors": energon_ray.errors,
}


def _sections() -> Dict[str, List[List[str]]]:
    """Heading (a module name where the heading is one) -> the table rows below it, as stripped cells."""
    sections: Dict[str, List[List[str]]] = {}
    current = None
    for line in DOC.read_text().splitlines():
        if line.startswith("## "):
            named = re.match(r"## `([\w.]+)`", line)
            current = named.group(1) if named else line[3:].strip()
            sections[current] = []
        elif line.startswith("| `") and current is not None:
            sections[current].append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return sections


SECTIONS = _sections()


def _name(cell: str) -> str:
    assert cell.startswith("`") and cell.endswith("`"), f"not a `name` cell: {cell!r}"
    return cell.strip("`")


def _resolve(dotted: str):
    """The object a dotted path such as ``energon_ray.av.AVDecoder`` names."""
    module, _, attr = dotted.rpartition(".")
    return getattr(importlib.import_module(module), attr)


def _all_from_source(module: str) -> List[str]:
    """A module's ``__all__`` read from its source (megatron.energon.transforms needs torchvision to import)."""
    tree = ast.parse(Path(importlib.util.find_spec(module).origin).read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            return list(ast.literal_eval(node.value))
    raise AssertionError(f"{module} has no __all__")


ENERGON_ALL = {
    "megatron.energon": list(megatron.energon.__all__),
    "megatron.energon.av": list(megatron.energon.av.__all__),
    "megatron.energon.media": list(megatron.energon.media.__all__),
    "megatron.energon.transforms": _all_from_source("megatron.energon.transforms"),
}


def test_energon_is_the_documented_version():
    """The tables describe megatron-energon 7.4.1, the version the dev extra pins."""
    assert megatron.energon.__version__ == "7.4.1"


@pytest.mark.parametrize("module", sorted(ENERGON_ALL))
def test_every_energon_name_has_exactly_one_row(module):
    """Each module's table lists exactly the names of its __all__, each once."""
    names = [_name(row[0]) for row in SECTIONS[module]]
    assert len(names) == len(set(names)), f"{module}: duplicate rows {sorted({n for n in names if names.count(n) > 1})}"
    missing_rows = sorted(set(ENERGON_ALL[module]) - set(names))
    extra_rows = sorted(set(names) - set(ENERGON_ALL[module]))
    assert not missing_rows, f"docs/compatibility.md: add rows to the `{module}` table for {missing_rows}"
    assert not extra_rows, f"docs/compatibility.md: the `{module}` table lists names Energon lacks: {extra_rows}"


@pytest.mark.parametrize("module", sorted(HOMES))
def test_each_row_matches_what_energon_ray_exports(module):
    """same/differs rows name an importable energon_ray path; missing rows name nothing we export."""
    home = HOMES[module]
    for row in SECTIONS[module]:
        name, ours, status = _name(row[0]), row[1], row[2]
        word = status.split(":")[0]
        assert word in STATUSES, f"`{module}.{name}`: status must start with one of {STATUSES}, got {status!r}"
        if word == "missing":
            assert ours == "—", f"`{module}.{name}` is marked missing but names {ours}"
            assert not hasattr(home, name), (
                f"energon_ray exports `{name}` ({home.__name__}); update its row in docs/compatibility.md"
            )
            continue
        _resolve(_name(ours))  # raises if the path is stale
        if home is not energon_ray.errors:
            assert _name(ours) == f"{home.__name__}.{name}", f"`{module}.{name}` should be `{home.__name__}.{name}`"
            if not name.startswith("__"):
                assert name in home.__all__, f"`{name}` works but is not in {home.__name__}.__all__"


def test_names_from_the_documents_resolve():
    """The documents' names 7.4.1 lacks (get_dataset, IgnoreSample) are ours, and still absent from Energon."""
    rows = SECTIONS[DOCUMENTS]
    assert {_name(r[0]) for r in rows} == {"get_dataset", "IgnoreSample"}
    for row in rows:
        assert row[2].startswith("same") or row[2].startswith("differs"), row
        assert _name(row[0]) in energon_ray.__all__ and _resolve(_name(row[1])) is getattr(energon_ray, _name(row[0]))
        assert not hasattr(megatron.energon, _name(row[0]))


def test_ours_only_table_lists_exactly_our_extra_names():
    """Every name energon_ray exports beyond Energon's top level is explained once, and only those."""
    listed = [_name(row[0]) for row in SECTIONS[OURS_ONLY]]
    extra = set(energon_ray.__all__) - set(megatron.energon.__all__)
    assert len(listed) == len(set(listed))
    assert sorted(set(listed)) == sorted(extra), "update the 'Names only energon_ray has' table"


@pytest.mark.parametrize("module", [energon_ray, energon_ray.av, energon_ray.media, energon_ray.decode.av, energon_ray.transforms])
def test_every_name_in_our_all_exists(module):
    """Each name an __all__ lists can be imported, once."""
    names = list(module.__all__)
    assert len(names) == len(set(names)), sorted({n for n in names if names.count(n) > 1})
    for name in names:
        assert getattr(module, name) is not None, f"{module.__name__}.{name}"

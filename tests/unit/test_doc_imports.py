"""Energon's documented imports work with ``megatron.energon`` replaced by ``energon_ray``.

The lines below were taken once from megatron-energon's README.md and docs/source (7.4.1): every
``from megatron.energon… import …`` line of their code blocks, plus one import per object the prose
links in a submodule (``{py:class}`AVMetadata <megatron.energon.media.AVMetadata>``` and the like).
The lines that do not work here are listed on purpose in docs/compatibility.md, section
"Energon's documented import paths"; this test keeps both lists in step.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

import energon_ray
import energon_ray.decode.av
from energon_ray._reexport import lazy_names

DOC = Path(__file__).resolve().parents[2] / "docs" / "compatibility.md"
SECTION = "## Energon's documented import paths"

#: (document, import line) from the code blocks of Energon's README.md and docs/source/, one per distinct line.
CODE_BLOCK_IMPORTS = [
    ("README.md", "from megatron.energon import get_train_dataset, get_loader, WorkerConfig"),
    ("advanced/crude_datasets.md", "from megatron.energon import Cooker, basic_sample_keys"),
    ("advanced/crude_datasets.md", "from megatron.energon import FileStore"),
    ("advanced/crude_datasets.md", "from megatron.energon import cooker, FileStore"),
    ("advanced/crude_datasets.md", "from megatron.energon import FileStoreCachePool"),
    ("advanced/crude_datasets.md", "from megatron.energon import cooker, FileStore, CachePool"),
    ("advanced/crude_datasets.md", "from megatron.energon.av import AVDecoder"),
    ("advanced/data_prep_api.md", "from megatron.energon.flavors import BaseWebdatasetFactory"),
    ("advanced/error_handling.md", "from megatron.energon import WorkerConfig, log_exception, reraise_exception"),
    ("advanced/error_handling.md", "from megatron.energon import log_exception"),
    ("advanced/error_handling.md", "from megatron.energon import reraise_exception"),
    ("advanced/error_handling.md", "from megatron.energon import DefaultTaskEncoder, stateless"),
    ("advanced/error_handling.md", "from megatron.energon import SkipSample"),
    ("advanced/error_handling.md", "from megatron.energon import FatalSampleError"),
    ("advanced/joining_datasets.md", "from megatron.energon import Sample, TextSample"),
    ("advanced/parallelism.md", "from megatron.energon import get_train_dataset, get_savable_loader, WorkerConfig"),
    ("basic/data_decoding.md", "from megatron.energon.av import get_clips_uniform"),
    ("basic/metadataset.md", "from megatron.energon import get_train_dataset"),
    ("basic/task_encoder.md", "from megatron.energon import Batch, CaptioningSample, DefaultTaskEncoder, batch_list, batch_stack"),
    ("basic/task_encoder.md", "from megatron.energon import get_loader, get_train_dataset"),
]

#: (document, import line) for the submodule objects the documents' prose and API pages link to.
LINKED_IMPORTS = [
    ("advanced/crude_datasets.md", "from megatron.energon.task_encoder.cooking import basic_sample_keys"),
    ("advanced/crude_datasets.md", "from megatron.energon.media import AVMetadata"),
    ("advanced/crude_datasets.md", "from megatron.energon.media import ImageMetadata"),
    ("advanced/error_handling.md", "from megatron.energon.task_encoder.base import TaskEncoder"),
    ("basic/data_decoding.md", "from megatron.energon.av import AVData, AVDecoder, get_single_frames_uniform"),
    ("api/cli.md", "from megatron.energon.cli.main import main"),
]

ALL_IMPORTS = CODE_BLOCK_IMPORTS + LINKED_IMPORTS


def _ours(line: str) -> str:
    return line.replace("megatron.energon", "energon_ray")


def _documented_exceptions() -> set:
    """The import lines docs/compatibility.md lists as not working here (first cell of its table)."""
    text = DOC.read_text()
    assert SECTION in text, f"docs/compatibility.md lacks the section {SECTION!r}"
    body = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\| `(from megatron\.energon[^`]*)` \|", body, flags=re.M))


EXCEPTIONS = _documented_exceptions()


def _imports(line: str) -> bool:
    try:
        exec(compile(_ours(line), "<documented import>", "exec"), {})
    except ImportError:
        return False
    return True


@pytest.mark.parametrize("doc, line", ALL_IMPORTS, ids=[f"{d}:{l.split(' import ')[0][5:]}:{i}" for i, (d, l) in enumerate(ALL_IMPORTS)])
def test_documented_import_works_under_energon_ray(doc, line):
    """Each documented import works with energon_ray in place of megatron.energon, unless listed as an exception."""
    if line in EXCEPTIONS:
        assert not _imports(line), f"`{_ours(line)}` ({doc}) works now: remove it from the exceptions in docs/compatibility.md"
    else:
        assert _imports(line), f"`{_ours(line)}` ({doc}) fails; make it work or list it in docs/compatibility.md"


def test_exceptions_are_documented_lines():
    """Every exception docs/compatibility.md lists is one of the documents' import lines."""
    assert EXCEPTIONS <= {line for _, line in ALL_IMPORTS}, sorted(EXCEPTIONS - {line for _, line in ALL_IMPORTS})


@pytest.mark.parametrize(
    "module, names",
    [
        ("energon_ray.av", ["AVData", "AVDecoder", "get_clips_uniform", "get_single_frames_uniform"]),
        ("energon_ray.media", ["AVMetadata"]),
        ("energon_ray.flavors", ["AVData", "AVDecoder", "BaseWebdatasetFactory", "TextSample", "SampleDecoder", "CrudeSample"]),
        ("energon_ray.task_encoder.cooking", ["Cooker", "basic_sample_keys", "cooker"]),
    ],
)
def test_submodules_are_thin_re_exports(module, names):
    """The submodule paths hand out the very objects of energon_ray's top level (or energon_ray.decode.av)."""
    mod = importlib.import_module(module)
    for name in names:
        real = getattr(energon_ray.decode.av, name) if hasattr(energon_ray.decode.av, name) else getattr(energon_ray, name)
        assert getattr(mod, name) is real, f"{module}.{name}"


def test_unknown_names_raise_import_error_naming_the_module():
    """A name outside Energon's module is an ordinary ImportError; an Energon name we lack points at the doc."""
    with pytest.raises(ImportError, match="energon_ray.flavors"):
        exec("from energon_ray.flavors import NoSuchThing", {})
    lookup = lazy_names("energon_ray.example", "megatron.energon.example", ["NotInEnergonRay", "WorkerConfig"])
    assert lookup("WorkerConfig") is energon_ray.WorkerConfig
    with pytest.raises(AttributeError, match=r"energon_ray\.example\.NotInEnergonRay .*docs/compatibility\.md"):
        lookup("NotInEnergonRay")


def test_media_metadata_module_path_matches_energons():
    """``megatron.energon.media.metadata`` (where Energon defines what ``megatron.energon.media`` exports,
    and where its tests import ImageMetadata from) exists here with the same public names, the same objects."""
    import megatron.energon.media.metadata as theirs

    import energon_ray.media
    import energon_ray.media.metadata as ours

    wanted = sorted(name for name in vars(theirs) if name in set(energon_ray.media.__all__))
    assert wanted == sorted(energon_ray.media.__all__) and ours.__all__ == energon_ray.media.__all__
    for name in wanted:
        assert getattr(ours, name) is getattr(energon_ray.media, name), name
    assert isinstance(ours.ImageMetadata(width=2, height=3, format="PNG", mode="RGB"), energon_ray.media.ImageMetadata)

"""``JsonlFileStore``: the lines of a prepared ``.jsonl`` file by name ``"<line index>.json"``.

It is the ``primary`` store of a JSONL dataset (``@cooker(need_primary=True)``), as Energon's
``JsonlFileStore``: ``primary.get(".json")`` reads the current sample's line again.
"""

from __future__ import annotations

import os
from typing import Any, Optional, Tuple

import numpy as np

from energon_ray.cache.base import PathStore
from energon_ray.samples.base import SourceInfo
from energon_ray.storage import RemotePath, as_path

_SUFFIX = ".json"


class JsonlFileStore(PathStore):
    """The lines of a ``.jsonl`` file (indexed by ``energon-ray prepare``) by ``"<index>.json"``.

    Args:
        path: the ``.jsonl`` file, local or an ``s3://``/``msc://`` URL.

    Raises (on read):
        KeyError: a name not of the form ``"<index>.json"``, or an index past the last line.

    Example:
        >>> import tempfile, pathlib
        >>> from energon_ray.format.jsonl import prepare_jsonl
        >>> f = pathlib.Path(tempfile.mkdtemp()) / "c.jsonl"; _ = f.write_bytes(b'{"a": 1}\\n{"a": 2}\\n')
        >>> _ = prepare_jsonl(f, progress=False)
        >>> JsonlFileStore(f)["1.json"][0]
        b'{"a": 2}\\n'
    """

    def __init__(self, path: Any):
        path = as_path(path)
        self.path = path.absolute() if not isinstance(path, RemotePath) else path
        self._offsets: Optional[np.ndarray] = None

    def _offsets_of_lines(self) -> np.ndarray:
        if self._offsets is None:
            from energon_ray.format.tar_index import read_tar_index

            self._offsets = read_tar_index(self.path)
        return self._offsets

    def _index(self, key: Any) -> int:
        stem = key[: -len(_SUFFIX)] if isinstance(key, str) and key.endswith(_SUFFIX) else ""
        if not (stem.isascii() and stem.isdigit()):
            raise KeyError(f"{self.path}: no file {key!r} (names are '<line index>.json', e.g. '0.json')")
        index, count = int(stem), len(self._offsets_of_lines()) - 1
        if index >= count:
            raise KeyError(f"{self.path}: no file {key!r} (the file holds {count} samples)")
        return index

    def __getitem__(self, key: str) -> Tuple[bytes, SourceInfo]:
        index = self._index(key)
        offsets = self._offsets_of_lines()
        start, size = int(offsets[index]), int(offsets[index + 1] - offsets[index])
        if isinstance(self.path, RemotePath):
            data = self.path.read_range(start, size)
        else:
            with open(self.path, "rb") as f:
                data = os.pread(f.fileno(), size, start)
        name = f"{index}{_SUFFIX}"
        return data, SourceInfo(dataset_path=self.get_path(), index=index, shard_name=self.path.name, file_names=(name,))

    def __repr__(self) -> str:
        return f"JsonlFileStore({self.get_path()!r})"

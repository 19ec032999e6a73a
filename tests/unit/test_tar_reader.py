"""A sample's tar members read without tarfile when they are plain ustar records, with exactly
tarfile's results and errors otherwise (``tar_reader._plain_members``)."""

from __future__ import annotations

import io
import random
import tarfile
from typing import Any, List, Tuple

import pytest

from energon_ray.format import tar_reader

NAMES = [
    "a.jpg", "a.txt", "a.json", "a.cls", "dir/a.jpg", "x" * 120 + ".jpg", "ä.jpg", "__meta__", "a.b.c", "a", "a/",
    "p" * 90 + "/q" * 20 + ".jpg",
]  # fmt: skip


def _tar(members: List[Tuple[str, Any, bytes]], fmt: int) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tar:
        for name, kind, payload in members:
            info = tarfile.TarInfo(name)
            info.type = kind
            if kind == tarfile.SYMTYPE:
                info.linkname = "a.jpg"
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))
    return buf.getvalue()


def _outcome(data: Any, part_filter: Any, monkeypatch: pytest.MonkeyPatch, fast: bool) -> Any:
    with monkeypatch.context() as patch:
        if not fast:
            patch.setattr(tar_reader, "_plain_members", lambda data: None)
        try:
            return "ok", tar_reader.parse_sample(data, "s.tar", 3, part_filter, offset=1024, root="/d")
        except Exception as exc:
            return "error", type(exc).__name__, str(exc)


def _cases(seed: int, count: int):
    rng = random.Random(seed)
    for _ in range(count):
        fmt = rng.choice([tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])
        members = []
        for _ in range(rng.randint(1, 4)):
            roll = rng.random()
            kind = tarfile.DIRTYPE if roll < 0.1 else tarfile.SYMTYPE if roll < 0.15 else tarfile.REGTYPE
            size = rng.choice([0, 1, 511, 512, 513, 2000]) if kind == tarfile.REGTYPE else 0
            members.append((rng.choice(NAMES), kind, rng.randbytes(size)))
        try:
            data = _tar(members, fmt)
        except ValueError:  # a long name in the ustar format
            continue
        cut = rng.random()
        if cut < 0.25:  # the records only, without the end-of-archive blocks (as a sample's bytes are)
            data = data[: -(-len(data.rstrip(b"\0")) // 512) * 512]
        elif cut < 0.4:  # the last member's padding cut off too
            data = data.rstrip(b"\0")
        elif cut < 0.5:
            data = data[: rng.randrange(len(data))]  # cut anywhere
        if data and rng.random() < 0.2:
            corrupt = bytearray(data)
            corrupt[rng.randrange(len(corrupt))] = rng.randrange(256)
            data = bytes(corrupt)
        yield data, (lambda part: part != "txt") if rng.random() < 0.3 else None


def test_members_and_errors_are_tarfiles_for_every_kind_of_record(monkeypatch):
    """Ustar, GNU and pax records, long names, directories, links, cut and corrupted bytes, as bytes
    and as a memoryview: the same parts, names and errors (type and message) as tarfile's."""
    fast_taken = 0
    compared = 0
    for data, part_filter in _cases(seed=0, count=800):
        for value in (data, memoryview(data)):
            ours = _outcome(value, part_filter, monkeypatch, fast=True)
            assert ours == _outcome(value, part_filter, monkeypatch, fast=False), data[:64]
            compared += 1
            fast_taken += tar_reader._plain_members(value) is not None
    for empty in (b"", memoryview(b"")):
        assert _outcome(empty, None, monkeypatch, fast=True) == _outcome(empty, None, monkeypatch, fast=False)
    assert compared > 1200
    assert compared * 0.2 < fast_taken < compared * 0.9  # both paths ran on many records


def test_plain_records_are_read_without_tarfile_and_others_with_it():
    """Records written by webdataset-style writers (ustar) take the fast path; a pax long name, a
    GNU long name and a symlink go to tarfile."""
    plain = _tar([("s0.jpg", tarfile.REGTYPE, b"x" * 600), ("s0.txt", tarfile.REGTYPE, b"hi")], tarfile.USTAR_FORMAT)
    assert tar_reader._plain_members(plain) == [("s0.jpg", 512, 600, True), ("s0.txt", 2048, 2, True)]
    assert tar_reader.parse_sample(plain, "s.tar", 0) == ("s0", {"jpg": b"x" * 600, "txt": b"hi"}, ["s0.jpg", "s0.txt"])
    long_name = "k" * 120 + ".jpg"
    for fmt in (tarfile.PAX_FORMAT, tarfile.GNU_FORMAT):
        data = _tar([(long_name, tarfile.REGTYPE, b"x")], fmt)
        assert tar_reader._plain_members(data) is None
        assert tar_reader.parse_sample(data, "s.tar", 0)[0] == "k" * 120
    link = _tar([("s0.jpg", tarfile.REGTYPE, b"x"), ("s0.png", tarfile.SYMTYPE, b"")], tarfile.USTAR_FORMAT)
    assert tar_reader._plain_members(link) is None
    assert tar_reader.parse_sample(link, "s.tar", 0) == ("s0", {"jpg": b"x"}, ["s0.jpg"])


def test_a_bad_checksum_in_a_later_header_is_left_to_tarfile():
    """tarfile ends a run quietly at an invalid header after the first: so does the reader."""
    data = bytearray(_tar([("s0.jpg", tarfile.REGTYPE, b"x"), ("s0.txt", tarfile.REGTYPE, b"t")], tarfile.USTAR_FORMAT))
    data[1024 + 148] ^= 1  # the second header's checksum
    assert tar_reader._plain_members(bytes(data)) is None
    assert tar_reader.parse_sample(bytes(data), "s.tar", 0) == ("s0", {"jpg": b"x"}, ["s0.jpg"])

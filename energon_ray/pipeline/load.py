"""Raw tar parts → typed sample: decode each part, then apply ``field_map`` or ``sample_loader``."""

from __future__ import annotations

import json
from typing import Any, Dict, Optional

from energon_ray.decode.part_limits import DEFAULT_MAX_PART_BYTES
from energon_ray.decode.sample_decoder import SampleDecoder, decodes_by_part
from energon_ray.errors import MediaTooLargeError, SampleException, UntrustedCodeError
from energon_ray.format.dataset_yaml import DatasetSpec
from energon_ray.format.field_access import FieldAccessError, field_access
from energon_ray.format.jsonl import JSONL_CONFIG
from energon_ray.samples import CrudeSample

META_KEYS = ("__key__", "__shard__", "__restore_key__", "__sources__")


def _dunder_part(data: Any) -> Any:
    """A part named ``__…`` (``key.__meta``) as webdataset's decoder leaves it: not decoded by
    extension, its bytes as text where they are UTF-8."""
    if not isinstance(data, (bytes, bytearray)):
        return data
    try:
        return bytes(data).decode("utf-8")
    except UnicodeDecodeError:
        return data


class SampleLoader:
    """Builds the dataset's sample type from a raw sample dict.

    Args:
        spec: the parsed ``dataset.yaml``.
        decoder: the task encoder's decoder (``None`` keeps bytes).
        subflavors: merged subflavors to set on every sample.
        parse_json: a JSONL sample's ``json`` is parsed with ``json.loads`` whatever the decoder (as
            Energon's loader reads a ``.jsonl``: ``DefaultCrudeJsonlDatasetFactory``); ``False``
            keeps its bytes (``CrudeJsonlDatasetFactory``). A line over the decoder's
            ``max_part_bytes`` (default 512 MiB, also without a decoder) is refused before parsing.

    Raises (from ``__call__``):
        SampleException: naming shard, key and the part or field that failed.
    """

    def __init__(
        self,
        spec: DatasetSpec,
        decoder: Optional[SampleDecoder],
        subflavors: Optional[Dict[str, Any]],
        parse_json: bool = True,
    ):
        self.spec = spec
        self.decoder = decoder
        self.subflavors = dict(subflavors or {})
        self.parse_json = parse_json

    def _where(self, raw: Dict[str, Any]) -> str:
        return f"{raw['__shard__']}: sample {raw['__key__']!r}"

    def decode(self, raw: Dict[str, Any]) -> Dict[str, Any]:
        """Decode every part; an undecodable part raises naming it."""
        if self.spec.dataset_config == JSONL_CONFIG:
            return self._decode_jsonl(raw)
        if self.decoder is not None and not decodes_by_part(self.decoder):
            return self._decode_whole(raw)
        out = {k: raw[k] for k in META_KEYS if k in raw}
        for part, data in raw.items():
            if part in META_KEYS:
                continue
            if self.decoder is None:
                out[part] = data
                continue
            if part.startswith("__"):
                out[part] = _dunder_part(data)
                continue
            try:
                out[part] = self.decoder.decode_part(part, data)
            except UntrustedCodeError as exc:
                raise UntrustedCodeError(f"dataset {self.spec.root}: {self._where(raw)}: part {part!r}: {exc}") from None
            except Exception as exc:
                raise SampleException(
                    f"{self._where(raw)}: cannot decode part {part!r} ({len(data)} bytes): {type(exc).__name__}: {exc}"
                ) from exc
        return out

    def _decode_jsonl(self, raw: Dict[str, Any]) -> Dict[str, Any]:
        """A JSONL line: its ``json`` parsed (or its bytes), the decoder not used, in the order of
        Energon's keys."""
        out = {k: raw[k] for k in ("__key__", "__restore_key__", "__shard__", "__sources__") if k in raw}
        out["__subflavors__"] = dict(self.subflavors)
        out["json"] = raw["json"]
        if not self.parse_json:
            return out
        # our decoder's bound on a parsed part; the default one with another decoder or none
        limit = self.decoder.max_part_bytes if isinstance(self.decoder, SampleDecoder) else DEFAULT_MAX_PART_BYTES
        if limit is not None and len(raw["json"]) > limit:
            raise MediaTooLargeError(
                f"{self._where(raw)}: cannot decode part 'json' ({len(raw['json'])} bytes): over the limit of {limit:,} "
                "bytes per part (max_part_bytes); raise it with SampleDecoder(max_part_bytes=...) (None: no limit)"
            )
        try:
            out["json"] = json.loads(raw["json"])
        except (ValueError, RecursionError) as exc:  # (too deeply nested: RecursionError, a skip as a tar's .json part)
            raise SampleException(
                f"{self._where(raw)}: cannot decode part 'json' ({len(raw['json'])} bytes): {type(exc).__name__}: {exc}"
            ) from exc
        return out

    def _decode_whole(self, raw: Dict[str, Any]) -> Dict[str, Any]:
        """Energon's contract for other decoders: ``decoder(raw sample) -> decoded sample``; the meta
        keys stay the reader's."""
        name = type(self.decoder).__name__
        try:
            decoded = self.decoder(dict(raw))
        except UntrustedCodeError as exc:
            raise UntrustedCodeError(f"dataset {self.spec.root}: {self._where(raw)}: {exc}") from None
        except Exception as exc:
            raise SampleException(f"{self._where(raw)}: decoder {name} failed: {type(exc).__name__}: {exc}") from exc
        if not isinstance(decoded, dict):
            raise SampleException(
                f"{self._where(raw)}: decoder {name} must return the sample's dict of parts, got {type(decoded).__name__}"
            )
        return {**decoded, **{k: raw[k] for k in META_KEYS if k in raw}}

    def fields(self, decoded: Dict[str, Any]) -> Dict[str, Any]:
        """The sample type's fields from decoded parts."""
        spec = self.spec
        if spec.field_map is not None:
            fields = {}
            for name, options in spec.field_map.items():
                try:
                    fields[name] = field_access(decoded, options)
                except FieldAccessError as exc:
                    alternatives = ",".join("".join([o[0]] + [f"[{k}]" for k in o[1:]]) for o in options)
                    raise SampleException(
                        f"{self._where(decoded)}: field {name!r} (field_map {alternatives!r}): {exc}; "
                        f"parts present: {sorted(k for k in decoded if not k.startswith('__'))}"
                    ) from None
            return fields
        assert spec.sample_loader is not None
        try:
            fields = spec.sample_loader(decoded)
        except Exception as exc:
            raise SampleException(f"{self._where(decoded)}: sample_loader failed: {type(exc).__name__}: {exc}") from exc
        if not isinstance(fields, dict):
            raise SampleException(
                f"{self._where(decoded)}: sample_loader must return a dict of fields, got {type(fields).__name__}"
            )
        return {k: v for k, v in fields.items() if k not in ("__key__", "__restore_key__", "__sources__", "__subflavors__")}

    def _crude(self, decoded: Dict[str, Any]) -> CrudeSample:
        """Energon's crude sample: the reader's meta keys (``__shard__`` too) and the parts in the
        reader's order, then ``__subflavors__``."""
        crude = CrudeSample(decoded)
        crude["__subflavors__"] = dict(self.subflavors)
        return crude

    def __call__(self, raw: Dict[str, Any]) -> Any:
        decoded = self.decode(raw)
        meta = {
            "__key__": decoded["__key__"],
            "__restore_key__": decoded["__restore_key__"],
            "__subflavors__": dict(self.subflavors),
            "__sources__": decoded["__sources__"],
        }
        if self.spec.is_crude:
            return self._crude(decoded)
        fields = self.fields(decoded)
        try:
            return self.spec.sample_type(**fields, **meta)
        except TypeError as exc:
            raise SampleException(
                f"{self._where(decoded)}: cannot build {self.spec.sample_type.__name__}: {exc}"
            ) from None

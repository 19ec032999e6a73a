"""Typed media metadata (image size and format, audio/video stream facts) and its stored JSON form.

``energon-ray prepare --media-metadata-by-…`` stores one row per media file in the dataset's
``.nv-meta/index.sqlite`` as ``(metadata_type, metadata_json)``; these are the types of those rows
and the two functions that turn one into the other, in Energon's format (``megatron.energon.media``):
the type is ``"image"`` or ``"av"``, the JSON is compact (no spaces) and leaves out ``None`` fields.

Example:
    >>> kind, text = serialize_media_metadata(ImageMetadata(width=4, height=3, format="PNG", mode="RGB"))
    >>> kind.value, text
    ('image', '{"width":4,"height":3,"format":"PNG","mode":"RGB"}')
    >>> deserialize_media_metadata("image", text)
    ImageMetadata(width=4, height=3, format='PNG', mode='RGB')
"""

from __future__ import annotations

import dataclasses
import enum
import importlib
import json
from typing import Any, ClassVar, Dict, Mapping, Tuple, Type, TypeVar, Union

TMetadata = TypeVar("TMetadata", bound="MediaMetadataBase")


class MediaMetadataType(str, enum.Enum):
    """The kinds of stored media metadata; the value is what ``index.sqlite`` holds."""

    AV = "av"
    IMAGE = "image"

    @classmethod
    def from_string(cls, value: str) -> "MediaMetadataType":
        """The member whose value is ``value``.

        Raises:
            ValueError: for a value that is not ``"av"`` or ``"image"``.
        """
        try:
            return cls(value)
        except ValueError:
            raise ValueError(
                f"unknown media metadata type {value!r}; expected one of {[m.value for m in cls]}"
            ) from None


_REGISTRY: Dict[MediaMetadataType, Type["MediaMetadataBase"]] = {}


@dataclasses.dataclass
class MediaMetadataBase:
    """Base of the metadata classes: a dataclass with a ``metadata_type`` and a JSON-ready dict form.

    A subclass that sets ``metadata_type`` is the class :func:`deserialize_media_metadata` builds
    for that type.
    """

    metadata_type: ClassVar[MediaMetadataType]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        kind = cls.__dict__.get("metadata_type")
        if isinstance(kind, MediaMetadataType):
            _REGISTRY[kind] = cls

    def to_dict(self) -> Dict[str, Any]:
        """The fields that are set (not ``None``), in field order."""
        values = ((f.name, getattr(self, f.name)) for f in dataclasses.fields(self))
        return {name: value for name, value in values if value is not None}

    @classmethod
    def from_dict(cls: Type[TMetadata], payload: Mapping[str, Any]) -> TMetadata:
        """The inverse of :meth:`to_dict`.

        Raises:
            ValueError: for a key that is not a field, or a required field that is missing.
        """
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(payload) - known)
        if unknown:
            raise ValueError(f"{cls.__name__} has no fields {unknown}; its fields are {sorted(known)}")
        required = [
            f.name for f in dataclasses.fields(cls)
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        ]  # fmt: skip
        missing = [name for name in required if name not in payload]
        if missing:
            raise ValueError(f"{cls.__name__} needs the fields {missing}, got {dict(payload)!r}")
        return cls(**payload)


@dataclasses.dataclass
class ImageMetadata(MediaMetadataBase):
    """Size, format and mode of an encoded image, as PIL reads them.

    Attributes:
        width: pixels per row.
        height: rows.
        format: PIL's format name, e.g. ``"JPEG"``, ``"PNG"``.
        mode: PIL's pixel mode, e.g. ``"RGB"``, ``"L"``, ``"RGBA"``.
    """

    metadata_type: ClassVar[MediaMetadataType] = MediaMetadataType.IMAGE

    width: int
    height: int
    format: str
    mode: str


def _class_for(kind: MediaMetadataType) -> Type[MediaMetadataBase]:
    if kind not in _REGISTRY:
        # AVMetadata lives with the AV decoder (which imports this module); load it on first need.
        importlib.import_module("energon_ray.decode.av.data")
    return _REGISTRY[kind]


def serialize_media_metadata(metadata: MediaMetadataBase) -> Tuple[MediaMetadataType, str]:
    """``(metadata_type, compact JSON of the set fields)``, the two values ``index.sqlite`` stores.

    Raises:
        TypeError: for an object that is not a :class:`MediaMetadataBase` with a ``metadata_type``.
    """
    kind = getattr(metadata, "metadata_type", None)
    if not isinstance(metadata, MediaMetadataBase) or not isinstance(kind, MediaMetadataType):
        raise TypeError(f"serialize_media_metadata: expected ImageMetadata or AVMetadata, got {type(metadata).__name__}")
    return kind, json.dumps(metadata.to_dict(), separators=(",", ":"))


def deserialize_media_metadata(
    metadata_type: Union[str, MediaMetadataType], metadata_json: str
) -> MediaMetadataBase:
    """The metadata object for a stored ``(metadata_type, metadata_json)`` pair.

    Args:
        metadata_type: ``"image"``/``"av"`` or the enum member.
        metadata_json: the JSON object; empty text is an empty object.

    Raises:
        ValueError: an unknown type, JSON that is not an object, or fields the class does not take.
    """
    kind = metadata_type if isinstance(metadata_type, MediaMetadataType) else MediaMetadataType.from_string(metadata_type)
    try:
        payload = json.loads(metadata_json) if metadata_json else {}
    except json.JSONDecodeError as exc:
        raise ValueError(f"{kind.value} media metadata is not valid JSON ({exc}): {metadata_json!r}") from None
    if not isinstance(payload, dict):
        raise ValueError(f"{kind.value} media metadata must be a JSON object, got {metadata_json!r}")
    return _class_for(kind).from_dict(payload)

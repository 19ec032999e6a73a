"""``TaskEncoder`` and ``DefaultTaskEncoder``: the hooks a user overrides, in pipeline order."""

from __future__ import annotations

import dataclasses
import inspect
import types
from typing import Any, Dict, Generic, Hashable, List, Optional, Sequence, Tuple, Type, TypeVar, Union

from energon_ray.decode.sample_decoder import SampleDecoder
from energon_ray.samples import CrudeSample, Sample
from energon_ray.task_encoder import context
from energon_ray.task_encoder.batching import FeatureBatcher, generic_batch
from energon_ray.task_encoder.decorators import Cooker, stateless

T_sample = TypeVar("T_sample")
T_encoded_sample = TypeVar("T_encoded_sample")
T_raw_batch = TypeVar("T_raw_batch")
T_batch = TypeVar("T_batch")


def _as_fields(value: Any) -> Dict[str, Any]:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return {name: getattr(value, name) for name in value._fields}
    if isinstance(value, dict):
        return dict(value)
    raise TypeError(f"cannot read fields of a {type(value).__name__}; expected a dataclass, NamedTuple or dict")


def _declared_fields(result_type: type) -> Optional[List[str]]:
    if dataclasses.is_dataclass(result_type):
        return [f.name for f in dataclasses.fields(result_type) if f.init]
    if issubclass(result_type, tuple) and hasattr(result_type, "_fields"):
        return list(result_type._fields)
    return None


def _convert(value: Any, target: type) -> Any:
    """Map a dataclass/NamedTuple/dict onto ``target`` by field name (only the fields it declares)."""
    fields = _as_fields(value)
    if issubclass(target, dict):
        return fields
    declared = _declared_fields(target)
    if declared is None:
        raise TypeError(f"cannot convert to {target.__name__}: not a dataclass, NamedTuple or dict")
    return target(**{k: v for k, v in fields.items() if k in declared})


class TaskEncoder(Generic[T_sample, T_encoded_sample, T_raw_batch, T_batch]):
    """Base class of task encoders. Override the hooks you need; the others pass samples through.

    Hooks in pipeline order: ``cook_crude_sample`` (crude datasets), ``encode_sample`` (may be a
    generator), ``select_samples_to_pack`` / ``pack_selected_samples``, ``batch``, ``encode_batch``
    (may be a generator). Raise ``SkipSample`` (``IgnoreSample``) in any hook to drop the item.

    On Ray the hooks run in Ray tasks: the encoder is pickled (with cloudpickle) and sent to them,
    so keep its attributes picklable. Each call is reseeded from its stream position.
    """

    #: Cookers for crude datasets: the first whose subflavors match the sample cooks it.
    cookers: Sequence[Cooker] = ()
    #: How tar parts are decoded; ``None`` leaves raw bytes.
    decoder: Optional[SampleDecoder] = SampleDecoder()
    #: Consecutive failures of one hook before ``FatalSampleError`` (0 disables the limit).
    __default_failure_tolerance__: int = 100

    def cook_crude_sample(
        self, sample: Union[T_sample, CrudeSample], cooker: Optional[Cooker] = None, aux: Optional[Dict[str, Any]] = None
    ) -> T_sample:
        """Turn a crude sample into a typed one with ``cooker`` (default: the first whose subflavors
        match the sample's).

        Args:
            sample: the crude sample (anything else is returned as it is).
            cooker: the cooker the loader chose for the sample's dataset (Energon's signature: an
                override ``cook_crude_sample(self, sample, cooker, aux)`` gets both).
            aux: the dataset's aux stores by name (decoded), with ``primary`` (unwrapped) where the
                cooker needs it; ``None``: the loader's own.
        """
        if isinstance(sample, CrudeSample):
            if cooker is None:
                cooker = matching_cooker(self.cookers, sample.get("__subflavors__"))
                if cooker is None:
                    raise ValueError(
                        f"no cooker matches crude sample {sample.get('__key__')!r} "
                        f"with subflavors {sample.get('__subflavors__')!r}"
                    )
            from energon_ray.cache.cooking import cook_kwargs  # aux stores, cache=, primary=

            return cooker.cook(sample, **cook_kwargs(cooker.cook, sample, aux))
        return sample

    @stateless
    def encode_sample(self, sample: T_sample) -> T_encoded_sample:  # type: ignore[misc]
        """Transform one sample (augment an image, tokenize a text…). Identity by default."""
        return sample  # type: ignore[return-value]

    def preencode_sample(self, sample: T_sample) -> T_sample:
        """With packing: what runs before the packing buffer instead of ``encode_sample`` (cheap work)."""
        return sample

    def postencode_sample(self, sample: T_sample) -> T_encoded_sample:  # type: ignore[misc]
        """With packing: runs on the members of a selected pack, before ``pack_selected_samples``
        (expensive work only for samples that are used); without packing, right after encoding."""
        return sample  # type: ignore[return-value]

    def select_samples_to_pack(self, samples: List[T_encoded_sample]) -> List[List[T_encoded_sample]]:
        """Group a buffer of samples into packs (only used with ``packing_buffer_size``)."""
        raise NotImplementedError("override select_samples_to_pack to use packing")

    def pack_selected_samples(self, samples: List[T_encoded_sample]) -> T_encoded_sample:
        """Merge one group of samples into a single sample (required with packing)."""
        raise NotImplementedError("override pack_selected_samples to use packing")

    def batch_group_criterion(self, sample: T_encoded_sample) -> Tuple[Hashable, Optional[int]]:
        """Bucket key (and bucket batch size) of a sample for grouped batching."""
        raise NotImplementedError

    @stateless
    def batch(self, samples: List[T_encoded_sample]) -> T_raw_batch:
        """Collate samples into one batch: tensors pad-stacked, everything else listed."""
        return generic_batch(samples)

    @stateless
    def encode_batch(self, batch: T_raw_batch) -> T_batch:  # type: ignore[misc]
        """Transform a whole batch (e.g. tokenize all captions at once). Identity by default."""
        return batch  # type: ignore[return-value]

    def _batch(
        self,
        samples: List[T_encoded_sample],
        result_type: Type[T_raw_batch],
        actions: Optional[Dict[str, FeatureBatcher]] = None,
        default_action: FeatureBatcher = generic_batch,
    ) -> T_raw_batch:
        """Batch ``samples`` field by field into ``result_type`` (dataclass, NamedTuple or dict).

        Only the fields ``result_type`` declares are filled, so a result type without Energon's
        meta fields (``__restore_key__``…) works. A dataclass with ``from_samples`` builds itself.

        Args:
            samples: the samples of the batch.
            result_type: the type to build.
            actions: per-field batcher (``batch_stack``, ``batch_list``, ``batch_pad_stack``…).
            default_action: batcher for the other fields.

        Raises:
            TypeError: if samples or ``result_type`` are not dataclasses, NamedTuples or dicts, or a
                sample lacks a field of the first sample.
        """
        if not samples:
            raise ValueError("_batch needs at least one sample")
        if dataclasses.is_dataclass(result_type) and hasattr(result_type, "from_samples"):
            return result_type.from_samples(samples)  # type: ignore[attr-defined]
        # the first sample's fields make the columns (as Energon's): each column has one value per sample
        columns: Dict[str, List[Any]] = {key: [] for key in _as_fields(samples[0])}
        for sample in samples:
            fields = _as_fields(sample)
            missing = [key for key in columns if key not in fields]
            if missing:
                raise TypeError(
                    f"_batch: sample {fields.get('__key__')!r} ({type(sample).__name__}) has no field "
                    f"{missing[0]!r}, which the batch's first sample ({type(samples[0]).__name__}) has; "
                    "the samples of a batch need the same fields"
                )
            for key, values in columns.items():
                values.append(fields[key])
        declared = None if issubclass(result_type, dict) else _declared_fields(result_type)
        if declared is None and not issubclass(result_type, dict):
            raise TypeError(f"_batch: result_type {result_type!r} is not a dataclass, NamedTuple or dict")
        actions = actions or {}
        out = {
            key: actions[key](values) if key in actions else default_action(values)
            for key, values in columns.items()
            if declared is None or key in declared
        }
        return out if declared is None else result_type(**out)  # type: ignore[return-value]

    @property
    def current_sample_index(self) -> int:
        """Index of the sample being encoded (inside ``encode_sample``), as Energon counts it: its
        position in its worker stream, interleaved with the rank's other workers
        (``position × num_workers + worker``)."""
        return context.current_sample_index()

    @property
    def current_batch_index(self) -> int:
        """Index of the batch being built (inside ``batch`` / ``encode_batch``) or that the sample will
        go into (inside ``cook_crude_sample``, ``encode_sample``, ``postencode_sample``: the batches
        its worker stream gave before it, skipped samples not counted, where ``cook_crude_sample``,
        ``encode_sample`` or ``postencode_sample`` reads it (their stream's segments are then chained:
        ``chained.reads_shifted_indices``), else its position // batch size; a validation
        metadataset's stream runs through its datasets), as Energon counts it: the rank's workers
        take turns (``index × num_workers + worker``: the loader's batch number). A generator ``encode_sample`` (its segments chained)
        sees the batch of each output it yields next, as Energon's. Inside a train metadataset
        blend's sample hooks it is the sample's position in its own dataset's stream // batch size
        (Energon's: the batch being filled when the blend draws it)."""
        return context.current_batch_index()

    @property
    def cache(self) -> Any:
        """The loader's cache pool (``get_loader(cache_pool=…)``), inside the hooks of a segment task."""
        from energon_ray.cache.cooking import active_cache_pool

        return active_cache_pool()


class DefaultTaskEncoder(TaskEncoder[T_sample, T_encoded_sample, T_raw_batch, T_batch]):
    """A task encoder that converts between types by field name.

    Args:
        encoded_sample_type: type ``encode_sample`` returns (dataclass, NamedTuple or ``dict``).
        raw_batch_type: type ``batch`` returns (default: the type of the samples).
        batch_type: type ``encode_batch`` returns.

    Example:
        >>> DefaultTaskEncoder(batch_type=dict).encode_batch(Sample(__key__="k"))["__key__"]
        'k'
    """

    def __init__(
        self,
        *,
        encoded_sample_type: Optional[type] = None,
        raw_batch_type: Optional[type] = None,
        batch_type: Optional[type] = None,
    ):
        self._encoded_sample_type = encoded_sample_type
        self._raw_batch_type = raw_batch_type
        self._batch_type = batch_type

    @stateless
    def encode_sample(self, sample: T_sample) -> T_encoded_sample:  # type: ignore[misc]
        """Identity, or conversion to ``encoded_sample_type``."""
        target = self._encoded_sample_type
        if target is None or (isinstance(target, type) and isinstance(sample, target) and target is not dict):
            return sample  # type: ignore[return-value]
        return _convert(sample, target)

    @stateless
    def batch(self, samples: List[T_encoded_sample]) -> T_raw_batch:
        """Batch into ``raw_batch_type`` (default: the samples' own type); subflavors stay a list."""
        actions = {"__subflavors__": lambda values: values} if isinstance(samples[0], Sample) else None
        target = self._raw_batch_type if self._raw_batch_type is not None else type(samples[0])
        return self._batch(samples, target, actions=actions)

    @stateless
    def encode_batch(self, batch: T_raw_batch) -> T_batch:  # type: ignore[misc]
        """Identity, or conversion to ``batch_type``."""
        target = self._batch_type
        if target is None or target is self._raw_batch_type:
            return batch  # type: ignore[return-value]
        if isinstance(target, type) and target is not dict and isinstance(batch, target):
            return batch  # type: ignore[return-value]
        return _convert(batch, target)


def matching_cooker(cookers: Sequence[Cooker], subflavors: Optional[Dict[str, Any]]) -> Optional[Cooker]:
    """The first of ``cookers`` whose ``has_subflavors`` match ``subflavors`` (``None`` if none does)."""
    return next((c for c in cookers if c.is_match(subflavors)), None)


def own_hook(task_encoder: TaskEncoder, name: str) -> Any:
    """The class function that runs as hook ``name`` of ``task_encoder``: through an
    ``AugmentTaskEncoder`` that only forwards it, the wrapped encoder's (``None`` if there is none)."""
    own = getattr(type(task_encoder), name, None)
    while getattr(own, "__augment_delegate__", False):
        task_encoder = task_encoder._task_encoder  # type: ignore[attr-defined]
        own = getattr(type(task_encoder), name, None)
    return own


def is_overridden(task_encoder: TaskEncoder, name: str) -> bool:
    """Whether ``task_encoder``'s class overrides hook ``name`` of ``TaskEncoder``."""
    own = own_hook(task_encoder, name)
    return own is not None and own is not getattr(TaskEncoder, name, None)


def sample_encode_hook(task_encoder: TaskEncoder) -> str:
    """The hook that encodes each sample: ``preencode_sample`` where the encoder overrides it (with
    or without packing, as Energon picks it), else ``encode_sample``."""
    return "preencode_sample" if is_overridden(task_encoder, "preencode_sample") else "encode_sample"


def hook_reads(task_encoder: TaskEncoder, name: str, attributes: frozenset) -> bool:
    """Whether hook ``name`` of ``task_encoder`` reads any of ``attributes`` (by name: ``self.x``),
    in its own code, the functions defined in it, the encoder's methods and the functions of its own
    module it names (followed likewise). A read through ``getattr`` or a library is not seen."""
    own = own_hook(task_encoder, name)
    owner = type(task_encoder)
    while getattr(getattr(owner, name, None), "__augment_delegate__", False):
        task_encoder = task_encoder._task_encoder  # type: ignore[attr-defined]
        owner = type(task_encoder)
    todo: List[Any] = [own]  # functions, or (code, the globals it runs with) of those defined in them
    seen = set()
    while todo:
        item = todo.pop()
        if isinstance(item, tuple):
            code, names = item
        else:
            function = inspect.unwrap(getattr(item, "__func__", item))  # a static or class method's function
            if not inspect.isfunction(function):
                continue
            code, names = function.__code__, function.__globals__
        if code in seen:
            continue
        seen.add(code)
        if attributes.intersection(code.co_names):
            return True
        todo.extend((const, names) for const in code.co_consts if isinstance(const, types.CodeType))
        for attribute in code.co_names:
            member = inspect.getattr_static(owner, attribute, None)
            if member is not None:
                todo.append(member)
            helper = names.get(attribute)
            if inspect.isfunction(helper) and helper.__module__ == getattr(own, "__module__", None):  # the hook module's
                todo.append(helper)
    return False

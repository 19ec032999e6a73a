"""``energon-ray prepare PATH``: index tar shards and write ``.nv-meta`` (Energon's ``energon prepare``)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import click
from click.core import ParameterSource

from energon_ray.cli.params import (
    WORKERS_SHOWN,
    DatasetLocation,
    parse_field_map,
    parse_ratio,
    parse_sample_type,
    parse_split_parts,
    ratio_value,
    user_errors,
)
from energon_ray.format.field_access import parse_field_access
from energon_ray.format.media_index import MediaFilter
from energon_ray.format.prepare import (
    CRUDE,
    PrepareResult,
    already_prepared,
    check_sample_config,
    prepare_dataset,
    write_dataset_config,
)
from energon_ray.format.pool import default_workers
from energon_ray.samples import SAMPLE_TYPES


def _prompt_field_map(cls: type, part_types: Sequence[str]) -> Dict[str, str]:
    """Ask for the tar part of every field; ``json[a][0]`` and ``jpg,png`` are accepted."""
    click.echo(f"Parts in the shards: {', '.join(part_types)}.")
    click.echo("Use json[key] for nested values and jpg,png for alternatives.")
    field_map: Dict[str, str] = {}
    for field in dataclasses.fields(cls):
        if field.name.startswith("__"):
            continue
        required = field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING
        while True:
            label = f"Part for field {field.name!r}" + ("" if required else " (optional, empty to skip)")
            value = click.prompt(label, default="" if not required else None, show_default=False).strip()
            if not value and not required:
                break
            try:
                options = parse_field_access(value)
            except ValueError as exc:
                click.echo(str(exc))
                continue
            if any(opt[0] in part_types for opt in options):
                field_map[field.name] = value
                break
            click.echo(f"No such part in the shards; choose from {', '.join(part_types)}.")
    return field_map


def _interactive_dataset_yaml(
    path: Path, result: PrepareResult, sample_type: Optional[str], dataset_config: str
) -> None:
    if sample_type is None:
        if not click.confirm("Create .nv-meta/dataset.yaml now?", default=True):
            click.echo("No dataset.yaml written; add one before loading the dataset.")
            return
        names = sorted(SAMPLE_TYPES) + [CRUDE]
        sample_type = click.prompt("Sample type", type=click.Choice(names), show_choices=True)
    field_map = None
    if sample_type != CRUDE and click.confirm(
        "Map fields to tar parts with a field_map (no: write a sample_loader.py to edit)?", default=True
    ):
        field_map = _prompt_field_map(SAMPLE_TYPES[sample_type], result.part_types)
    with user_errors():
        yaml_path, loader = write_dataset_config(path, sample_type, field_map, result.part_types, dataset_config)
    click.echo(f"Wrote {yaml_path}")
    if loader is not None:
        click.echo(f"Edit {loader} so it returns the fields of {sample_type}.")


def _check_overwrite(path: Path, force_overwrite: bool, interactive: bool) -> Optional[bool]:
    """The ``force_overwrite`` to use, or None when the user declines to redo a prepared dataset."""
    existing = already_prepared(path)
    if existing is None or force_overwrite:
        return force_overwrite
    if not interactive:
        raise click.ClickException(f"{existing} exists: the dataset is already prepared; use --force-overwrite")
    return True if click.confirm(f"{existing} exists. Prepare the dataset again?", default=False) else None


def option_conflict(
    tar_index_only: bool, split_ratio: Optional[Sequence[float]], split_parts: Any,
    exclude: Sequence[str], shuffle_tars: bool, sample_type: Optional[str], field_map: Optional[dict],
) -> Optional[str]:  # fmt: skip
    """What is wrong with options that do not go together, naming the flags (None: nothing); shared
    with ``jobs/prepare_job.py``. ``split_parts`` is None or empty when not given."""
    if tar_index_only:
        flags = {"--split-ratio": split_ratio, "--split-parts": split_parts or None, "--exclude": exclude or None,
                 "--shuffle-tars": shuffle_tars or None, "--sample-type": sample_type, "--field-map": field_map}  # fmt: skip
        given = [flag for flag, value in flags.items() if value is not None]
        if given:
            return f"--tar-index-only only rebuilds the indexes of the shards in .nv-meta/.info.json; drop {', '.join(given)}"
    if shuffle_tars and split_parts:
        return "--shuffle-tars only applies to --split-ratio, not to --split-parts"
    return None


def ratio_ignored(split_ratio: Optional[Sequence[float]], split_parts: Any) -> Optional[str]:
    """The warning for ``--split-ratio`` given with ``--split-parts`` (None when not both): the
    patterns decide the split parts and the ratio is ignored, as Energon's ``prepare`` ignores it;
    shared with ``jobs/prepare_job.py``."""
    if split_ratio is None or not split_parts:
        return None
    ratio = ",".join(f"{value:g}" for value in split_ratio)
    return f"--split-ratio {ratio} is ignored: --split-parts decides the split parts (as in Energon's prepare)"


def _check_combinations(
    tar_index_only: bool, split_ratio: Optional[List[float]], split_parts: Optional[Dict[str, List[str]]],
    exclude: Tuple[str, ...], shuffle_tars: bool, sample_type: Optional[str], field_map: Optional[dict],
) -> None:  # fmt: skip
    """Options that do not go together are usage errors (exit code 2) naming the flags."""
    problem = option_conflict(tar_index_only, split_ratio, split_parts, exclude, shuffle_tars, sample_type, field_map)
    if problem is not None:
        raise click.UsageError(problem)


#: How ``--help`` shows the ``--num-workers`` default (:func:`default_workers`).

#: The options that apply to a .jsonl file, which prepare only indexes.
_JSONL_OPTIONS = ("path", "progress", "non_interactive", "force_overwrite")


def _check_file_options(path: Path, what: str) -> None:
    """Options for tar datasets given with a file (a .jsonl, a metadataset) are a usage error (exit
    code 2) naming them; ``what`` says what is done with the file instead."""
    ctx = click.get_current_context()
    given = [
        param.opts[0] for param in ctx.command.params
        if param.name not in _JSONL_OPTIONS and ctx.get_parameter_source(param.name)
        in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT)
    ]  # fmt: skip
    if given:
        raise click.UsageError(f"{path}: {what}; drop {', '.join(given)}")


def _check_metadataset(path: Path) -> None:
    """A metadataset YAML, as Energon's ``prepare`` takes one (it writes the join index of each
    ``join``): every split and dataset path is loaded and checked; energon_ray joins by key without
    an index, so nothing is written."""
    from energon_ray.blend.metadataset_api import prepare_metadataset

    _check_file_options(path, "a metadataset .yaml is only checked (energon_ray writes no join index)")
    with user_errors():
        prepare_metadataset(path)
    click.echo(f"Checked metadataset {path}: every split loads; nothing to write (energon_ray joins by key, without a join index)")


def _report(result: PrepareResult) -> None:
    names = list(result.shard_counts)
    click.echo(f"Indexed {result.total_samples:,} samples in {len(names)} shards ({names[0]} … {names[-1]}).")
    click.echo(f"Parts found: {', '.join(result.part_types)}")
    for part, shards in result.split_parts.items():
        samples = sum(result.shard_counts[s] for s in shards)
        click.echo(f"  {part}: {len(shards)} shards, {samples:,} samples")
    if result.media_metadata is not None:
        click.echo(f"Stored media metadata of {result.media_metadata:,} files.")
    if result.dataset_config is not None:
        click.echo(f"Wrote {result.dataset_config}")
    for warning in result.warnings:
        click.echo(f"Warning: {warning}", err=True)


def _refuse_fix_duplicates(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    """Energon's ``--fix-duplicates`` rewrites shards; energon_ray never writes into a user's tars."""
    if value:
        raise click.UsageError(
            "--fix-duplicates: energon_ray does not rewrite tar shards; prepare names each duplicate sample key "
            "with both places it is in: fix those shards and run prepare again", ctx,
        )  # fmt: skip


@click.command(name="prepare")
@click.argument("path", type=DatasetLocation())
@click.option("--split-ratio", callback=parse_ratio, help="train,val,test shard ratio, e.g. '8,1,1'.")
@click.option("--split-parts", multiple=True, callback=parse_split_parts,
              help="'name:regex' (brace-expanded, matched on shard paths); repeatable. Wins over --split-ratio.")
@click.option("--exclude", multiple=True, help="Regex of shard paths to leave out (searched anywhere); repeatable.")
@click.option("--shuffle-tars", is_flag=True, help="Shuffle shards (seed 42) before the ratio split.")
@click.option("--sample-type", callback=parse_sample_type, help=f"Sample class name, e.g. CaptioningSample, or {CRUDE}.")
@click.option("--field-map", callback=parse_field_map, help='JSON, e.g. \'{"image": "jpg", "caption": "txt"}\'.')
@click.option("--dataset-yaml-name", default="dataset.yaml", show_default=True, help="Dataset config file name.")
@click.option("--skip-dataset-yaml", is_flag=True, help="Write no dataset.yaml.")
@click.option("--tar-index-only", is_flag=True, help="Only rebuild .tar.idx and index.sqlite of the listed shards.")
@click.option("--non-interactive", is_flag=True, help="Never prompt; missing required options are errors.")
@click.option("--force-overwrite", is_flag=True, help="Re-prepare a dataset that already has .nv-meta.")
@click.option("--progress/--no-progress", default=True, show_default=True)
@click.option("--num-workers", type=click.IntRange(min=1), default=default_workers, show_default=WORKERS_SHOWN,
              help="Processes indexing shards (and reading their media metadata) in parallel.")  # fmt: skip
@click.option("--media-metadata-by-glob", help="Store media metadata of entries matching glob patterns "
              "such as '*.jpg' (comma-separated).")  # fmt: skip
@click.option("--media-metadata-by-header", is_flag=True, help="Store media metadata of entries whose file header is media.")
@click.option("--media-metadata-by-extension", is_flag=True,
              help="Store media metadata of entries with an image/audio/video extension.")  # fmt: skip
@click.option("--tmp-path", type=click.Path(file_okay=False, path_type=Path),
              help="For an s3:// or msc:// PATH: local folder where index.sqlite is built before it is uploaded "
              "(default: a new folder under the system's temporary folder, removed after).")  # fmt: skip
@click.option("--fix-duplicates", is_flag=True, hidden=True, callback=_refuse_fix_duplicates, expose_value=False)
def prepare_command(
    path: Path, split_ratio: Optional[List[float]], split_parts: Optional[Dict[str, List[str]]],
    exclude: Tuple[str, ...], shuffle_tars: bool, sample_type: Optional[str], field_map: Optional[dict],
    dataset_yaml_name: str, skip_dataset_yaml: bool, tar_index_only: bool, non_interactive: bool,
    force_overwrite: bool, progress: bool, num_workers: int, media_metadata_by_glob: Optional[str],
    media_metadata_by_header: bool, media_metadata_by_extension: bool, tmp_path: Optional[Path],
) -> None:  # fmt: skip
    """Index the tar shards under PATH and write PATH/.nv-meta (Energon's format); for a .jsonl
    file, write its .jsonl.idx; a metadataset .yaml is checked (energon_ray needs no join index). PATH may be an s3:// or msc:// URL: the files are written there.

    \b
    energon-ray prepare ./ds --non-interactive --split-ratio 8,1,1 \\
        --sample-type CaptioningSample --field-map '{"image": "jpg", "caption": "txt"}'
    """
    if path.is_file() and path.suffix == ".yaml":  # Energon's rule for a metadataset
        _check_metadataset(path)
        return
    if path.is_file():
        if path.suffix != ".jsonl":
            raise click.UsageError(f"{path}: PATH must be a dataset folder, a .jsonl file or a metadataset .yaml file")
        from energon_ray.format.jsonl import prepare_jsonl

        _check_file_options(path, "a .jsonl file is only indexed (no splits, dataset.yaml or media metadata)")
        with user_errors():
            count = prepare_jsonl(path, progress=progress)
        click.echo(f"Indexed {count} samples into {path}.idx")
        return
    _check_combinations(tar_index_only, split_ratio, split_parts, exclude, shuffle_tars, sample_type, field_map)
    ignored = ratio_ignored(split_ratio, split_parts)
    if ignored is not None:
        click.echo(f"Warning: {ignored}", err=True)
        split_ratio = None
    media_filter = None
    if media_metadata_by_glob is not None or media_metadata_by_header or media_metadata_by_extension:
        if tar_index_only:
            raise click.UsageError("--media-metadata-by-... cannot be combined with --tar-index-only")
        try:
            media_filter = MediaFilter.parse(media_metadata_by_glob, media_metadata_by_header, media_metadata_by_extension)
        except ValueError as exc:
            raise click.UsageError(str(exc)) from None
    interactive = not non_interactive
    defer_yaml = False
    if not tar_index_only:
        force = _check_overwrite(path, force_overwrite, interactive)
        if force is None:
            click.echo("Nothing changed.")
            return
        force_overwrite = force
        if split_ratio is None and split_parts is None:
            if not interactive:
                raise click.UsageError("--split-ratio or --split-parts is required with --non-interactive")
            split_ratio = click.prompt("Train/val/test split ratio", default="8,1,1", value_proc=ratio_value)
        with user_errors():
            check_sample_config(sample_type, field_map)
        needs_prompt = sample_type is None or (sample_type != CRUDE and field_map is None)
        defer_yaml = interactive and not skip_dataset_yaml and needs_prompt
    write_yaml = not (defer_yaml or skip_dataset_yaml)
    with user_errors():
        result = prepare_dataset(
            path, split_ratio=split_ratio, split_parts=split_parts, exclude=exclude, shuffle_tars=shuffle_tars,
            sample_type=sample_type if write_yaml else None, field_map=field_map if write_yaml else None,
            tar_index_only=tar_index_only, force_overwrite=force_overwrite, progress=progress,
            num_workers=num_workers, dataset_config=dataset_yaml_name, media_filter=media_filter,
            scratch_dir=tmp_path,
        )  # fmt: skip
    _report(result)
    if defer_yaml:
        _interactive_dataset_yaml(path, result, sample_type, dataset_yaml_name)
    elif sample_type is None and not tar_index_only and not skip_dataset_yaml:
        click.echo("No dataset.yaml written (pass --sample-type to create it).")
    click.echo("Done.")

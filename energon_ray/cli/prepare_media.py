"""``energon-ray prepare-media PATH``: store media metadata of a prepared dataset or of a plain
folder (Energon's ``energon prepare-media``)."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import click

from energon_ray.cli.params import WORKERS_SHOWN, DatasetLocation, user_errors
from energon_ray.format.media_index import MediaFilter, write_folder_media_metadata, write_media_metadata
from energon_ray.format.pool import default_workers
from energon_ray.format.prepare import already_prepared, unreadable_media


@click.command(name="prepare-media")
@click.argument("path", type=DatasetLocation(file_okay=False))
@click.option("--progress/--no-progress", default=True, show_default=True)
@click.option("--num-workers", type=click.IntRange(min=1), default=default_workers, show_default=WORKERS_SHOWN,
              help="Processes reading shards (or files) in parallel; the same table is written.")
@click.option("--media-metadata-by-glob", help="Entries matching glob patterns such as '*.jpg' (comma-separated).")
@click.option("--media-metadata-by-header", is_flag=True, help="Entries whose file header is media.")
@click.option("--media-metadata-by-extension", is_flag=True, help="Entries with an image/audio/video extension.")
@click.option("--tmp-path", type=click.Path(file_okay=False, path_type=Path),
              help="For an s3:// or msc:// PATH: local folder where index.sqlite is updated before it is uploaded "
              "(default: a new folder under the system's temporary folder, removed after).")  # fmt: skip
def prepare_media_command(
    path: Path, progress: bool, num_workers: int, media_metadata_by_glob: Optional[str], media_metadata_by_header: bool,
    media_metadata_by_extension: bool, tmp_path: Optional[Path],
) -> None:  # fmt: skip
    """Store the media metadata (image size/format, audio/video stream facts) of PATH in
    PATH/.nv-meta/index.sqlite: of its tar members if PATH is a prepared dataset, else of the files
    of the folder (for ``filesystem://`` auxiliary data).

    \b
    energon-ray prepare-media ./ds --media-metadata-by-extension
    """
    try:
        media_filter = MediaFilter.parse(media_metadata_by_glob, media_metadata_by_header, media_metadata_by_extension)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    unreadable: List[str] = []
    with user_errors():
        if already_prepared(path) is not None:
            count = write_media_metadata(path, media_filter, progress=progress, skipped=unreadable,
                                         scratch_dir=tmp_path, num_workers=num_workers)  # fmt: skip
        else:  # a plain folder is local: written in place, as with a local dataset (--tmp-path is for remote ones)
            count = write_folder_media_metadata(path, media_filter, skipped=unreadable, num_workers=num_workers)
    for warning in unreadable_media(unreadable):
        click.echo(f"Warning: {warning}", err=True)
    click.echo(f"Done. Stored media metadata of {count:,} files" + (f"; {len(unreadable):,} unreadable, left out." if unreadable else "."))

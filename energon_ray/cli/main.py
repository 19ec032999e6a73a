"""``energon-ray``: the command group (``prepare``, ``prepare-media``, ``info``, ``preview``, ``lint``, ``checkpoint``)."""

from __future__ import annotations

import click

from energon_ray.cli.checkpoint import checkpoint_command
from energon_ray.cli.info import info_command
from energon_ray.cli.lint import lint_command
from energon_ray.cli.prepare import prepare_command
from energon_ray.cli.prepare_media import prepare_media_command
from energon_ray.cli.preview import preview_command
from energon_ray.format.prepare import ENERGON_FORMAT_VERSION, package_version


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(
    package_version(), "-V", "--version", prog_name="energon-ray",
    message=f"%(prog)s %(version)s (megatron-energon {ENERGON_FORMAT_VERSION} dataset format)",
)  # fmt: skip
def main() -> None:
    """Tools for Energon-format datasets: prepare tar shards, describe, preview and check a dataset,
    describe saved loader states (each runs in this process, without Ray)."""


main.add_command(prepare_command)
main.add_command(prepare_media_command)
main.add_command(info_command)
main.add_command(preview_command)
main.add_command(lint_command)
main.add_command(checkpoint_command)

if __name__ == "__main__":
    main()

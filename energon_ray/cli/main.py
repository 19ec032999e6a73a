"""``energon-ray``: the command group (``prepare``, ``prepare-media``, ``info``, ``preview``, ``lint``, ``checkpoint``;
Energon's ``mount`` and ``analyze-debug`` refused, saying why)."""

from __future__ import annotations

import click

from energon_ray.cli.checkpoint import checkpoint_command
from energon_ray.cli.info import info_command
from energon_ray.cli.lint import lint_command
from energon_ray.cli.prepare import prepare_command
from energon_ray.cli.prepare_media import prepare_media_command
from energon_ray.cli.preview import preview_command
from energon_ray.format.prepare import ENERGON_FORMAT_VERSION, package_version


@click.group(context_settings={"help_option_names": ["-h", "--help"]}, invoke_without_command=True)
@click.version_option(
    package_version(), "-V", "--version", prog_name="energon-ray",
    message=f"%(prog)s %(version)s (megatron-energon {ENERGON_FORMAT_VERSION} dataset format)",
)  # fmt: skip
@click.pass_context
def main(ctx: click.Context) -> None:
    """Tools for Energon-format datasets: prepare tar shards, describe, preview and check a dataset,
    describe saved loader states (each runs in this process, without Ray)."""
    if ctx.invoked_subcommand is None:  # as `energon` alone: the help, exit code 0
        click.echo(ctx.get_help())


def not_built(name: str, why: str) -> click.Command:
    """A hidden command for one of Energon's that energon_ray does not have: whatever its arguments
    (``--help`` too), a usage error (exit code 2) saying why and what to use instead."""

    def refuse() -> None:
        raise click.UsageError(f"energon-ray has no {name!r} command (Energon's): {why}")

    settings = {"ignore_unknown_options": True, "allow_extra_args": True}
    return click.Command(name, callback=refuse, hidden=True, add_help_option=False, context_settings=settings)


main.add_command(prepare_command)
main.add_command(prepare_media_command)
main.add_command(info_command)
main.add_command(preview_command)
main.add_command(lint_command)
main.add_command(checkpoint_command)
main.add_command(not_built(
    "mount", "a FUSE file system over the shards (mfusepy) is not built; the shards are plain tar files, "
    "and `energon-ray preview PATH` prints (and --out draws) their samples",
))  # fmt: skip
main.add_command(not_built(
    "analyze-debug", "it reads the debug log Energon's worker processes write (WorkerConfig.worker_debug_path), "
    "which energon_ray does not write; `loader.ray_stats()` describes a loader's Ray tasks",
))  # fmt: skip

if __name__ == "__main__":
    main()

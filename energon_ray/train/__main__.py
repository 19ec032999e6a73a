"""``python -m energon_ray.train +task=<modality>/<task> +dataset=<modality>/<task>/<dataset> [overrides]``.

Hydra's command line: ``--cfg job`` prints the composed config, ``--help`` lists the groups,
``trainer.ray.num_workers=2`` runs under ``ray.train``; see ``energon_ray/conf/config.yaml``.
"""

from __future__ import annotations

import sys

from energon_ray.train.config import quiet_foreign_config_sources

quiet_foreign_config_sources()

import hydra  # noqa: E402
from omegaconf import DictConfig  # noqa: E402


def main() -> None:
    """The command line: the groups it chooses checked (Hydra's own message for a misspelt nested
    option lists only the group's top level), then Hydra's app."""
    from energon_ray.train.config import ConfigError, check_group_args

    try:
        check_group_args(sys.argv[1:])
    except ConfigError as exc:
        sys.exit(f"error: {exc}")
    _app()


@hydra.main(version_base="1.3", config_path="pkg://energon_ray.conf", config_name="config")
def _app(cfg: DictConfig) -> None:
    from energon_ray.errors import DatasetConfigError
    from energon_ray.loader.state import StateError
    from energon_ray.ray_env import UnschedulableError
    from energon_ray.train.config import ConfigError
    from energon_ray.train.fit import fit

    try:
        result = fit(cfg)
    except (ConfigError, DatasetConfigError, StateError, UnschedulableError) as exc:  # the user's config, data, checkpoint or Ray's size: the message says what to change
        sys.exit(f"error: {exc}")
    except ConnectionError as exc:  # RAY_ADDRESS names a cluster nothing answers at
        sys.exit(f"error: {exc}")
    losses = result.losses
    print(f"trained {result.global_step} steps on {result.world_size} rank(s)")
    if losses:
        head, tail = losses[:3], losses[-3:]
        print(f"loss: first {len(head)} steps {sum(head) / len(head):.4f}, last {len(tail)} steps {sum(tail) / len(tail):.4f}")
    for name in sorted(result.metrics):
        print(f"{name}: {result.metrics[name]:.4f}")
    print(f"checkpoint: {result.checkpoint}")


if __name__ == "__main__":
    main()

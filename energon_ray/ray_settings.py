"""What energon_ray asks of Ray, decided before Ray is imported: whether Ray may speak (``verbose``),
the settings of a private local Ray, a cluster address checked before ``ray.init`` waits on it, and
the error for work no node could hold. Nothing here imports Ray (``ray_env`` does, and uses these).
"""

from __future__ import annotations

import os


def verbose() -> bool:
    """Whether the user asked for Ray's own output (``ENERGON_RAY_VERBOSE=1``); quiet by default."""
    return os.environ.get("ENERGON_RAY_VERBOSE", "0").strip().lower() not in ("", "0", "false", "no")


#: How often (ms) the raylet of a private Ray returns released objects' memory to the object store.
#: Ray's default (1000 ms) keeps every block released in the last second in shared memory: blocks
#: are tens of MB and a pass releases several per second, so that added ~250 MiB (one in ten) to the
#: peak PSS of the 2-CPU captioning benchmark (``benchmarks/README.md``), with no throughput gained.
FREE_OBJECTS_PERIOD_MS = 20


#: seconds to wait for a TCP connection to a cluster's GCS before calling it unreachable
CONNECT_TIMEOUT_S = 10.0


def check_reachable(address: str, timeout: float = CONNECT_TIMEOUT_S) -> None:
    """For a ``host:port`` cluster address: raise unless something accepts connections there
    (``ray.init`` retries an unreachable GCS without end; ``auto`` and ``ray://`` are Ray's to check).

    Raises:
        ConnectionError: naming the address, why, and what to do.
    """
    import socket

    host, sep, port = address.rpartition(":")
    if not sep or "://" in address or not host or not port.isdigit():
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as exc:
        why = "timed out" if isinstance(exc, socket.timeout) else (exc.strerror or type(exc).__name__)
        raise ConnectionError(
            f"energon_ray: no Ray cluster at {address} ({why}): start one there (`ray start --head`), "
            "or give another address (--address / RAY_ADDRESS); without one a private local Ray is started"
        ) from None


class UnschedulableError(ValueError):
    """Tasks or ``ray.train`` workers that no node of a private local Ray could hold (Ray would wait
    for them forever); the message names what asked, for what, and what the nodes hold."""


#: Ray's logger of the notebook extras it misses: without ``ipywidgets`` each Ray module with a rich
#: display logs "Missing packages: ['ipywidgets']" at INFO as it is imported in a Jupyter kernel
NOTEBOOK_EXTRAS_LOGGER = "ray.widgets.util"


#: Ray Train's (v2) callback whose detached actor removes a run's placement group should the train
#: controller die. It asks the State API, the dashboard's, whether the controller lives: a private
#: Ray has no dashboard, so it logged "Failed to query Ray Train Controller actor state" every second
#: (or, with other Ray instances on the machine, a traceback of its monitor thread), and could never
#: clean up; the placement group goes with the private Ray anyway.
STATE_API_CALLBACKS = ("PlacementGroupCleanerCallback",)

"""Media metadata at Energon's module path ``megatron.energon.media.metadata`` (where Energon defines
the classes that ``megatron.energon.media`` exports; its own tests import them from here).

Only re-exports: the same objects, the same names as :mod:`energon_ray.media`.
"""

from energon_ray.media import *  # noqa: F401,F403
from energon_ray.media import __all__  # noqa: F401

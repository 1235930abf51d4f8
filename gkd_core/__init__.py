"""gkd_core: a GKD (on-policy distillation) trainer on Ray and the telemetry that watches it.

The supervisor side of this package (``gkd_core.supervisor``, ``gkd_core.telemetry``,
``gkd_core.state``, ``gkd_core.config``) imports neither torch nor ray, so it outlives a
crashed or hung driver and can report what happened to it.
"""

__version__ = "0.1.0"

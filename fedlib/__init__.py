"""fedlib: federated learning with differential privacy, for a reproducible study.

Quick use::

    from fedlib import Config, PROFILES, run
    result = run(PROFILES["quick"].apply(Config(algorithm="fedavg")))
    result.frame()           # per-round history
"""

from fedlib.config import PROFILES, Config, ConfigError, get_profile
from fedlib.results import Result
from fedlib.run import run

__all__ = ["PROFILES", "Config", "ConfigError", "Result", "get_profile", "run"]
__version__ = "0.1.0"

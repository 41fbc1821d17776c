"""fedlib: federated learning with differential privacy, for a reproducible study.

Quick use::

    from fedlib import Config, run
    result = run(Config(algorithm="fedavg", train_samples=4000, rounds=20))
    result.frame()           # per-round history

The three papers' settings, profiles and claims live in the ``studies`` package.
"""

from fedlib.config import Config, ConfigError
from fedlib.results import Result
from fedlib.run import run, run_many

__all__ = ["Config", "ConfigError", "Result", "run", "run_many"]
__version__ = "0.2.0"

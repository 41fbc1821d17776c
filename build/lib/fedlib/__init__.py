"""fedlib: federated learning with differential privacy, for a reproducible study.

Quick use::

    from fedlib import Config, run
    result = run(Config(algorithm="fedavg", train_samples=4000, rounds=20))
    result.frame()           # per-round history

The three papers' settings, profiles and claims live in the ``studies`` package.
"""

import time as _time

#: When this process began importing fedlib, and when PyTorch was in (a Flower ClientApp reports both:
#: fedlib.flower.client, the per-message breakdown of a deployment round).
IMPORT_STARTED = _time.time()
import torch as _torch  # noqa: E402,F401 - timed here

TORCH_IMPORTED = _time.time()

from fedlib.config import Config, ConfigError  # noqa: E402
from fedlib.results import Result  # noqa: E402
from fedlib.run import run, run_many  # noqa: E402

__all__ = ["Config", "ConfigError", "Result", "run", "run_many"]
__version__ = "0.2.0"

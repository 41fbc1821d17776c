"""Registry of federated algorithms: one module each, see :mod:`fedlib.algorithms.base`."""

from fedlib.algorithms.base import Algorithm, RoundContext
from fedlib.algorithms.fedavg import FedAvg

ALGORITHMS: dict[str, type[Algorithm]] = {cls.name: cls for cls in (FedAvg,)}

__all__ = ["ALGORITHMS", "Algorithm", "FedAvg", "RoundContext"]

"""Registry of federated algorithms: one module each, see :mod:`fedlib.algorithms.base`.
Importing it registers each algorithm's config check with :mod:`fedlib.config`; :func:`register`
adds an algorithm written outside fedlib (the book's page "fedlib in your own code" writes one)."""

from fedlib.algorithms.base import Algorithm, RoundContext
from fedlib.algorithms.ditto import Ditto
from fedlib.algorithms.dp_fedavg import DpFedAvg
from fedlib.algorithms.fdl import Fdl
from fedlib.algorithms.fedavg import FedAvg
from fedlib.algorithms.feddyn import FedDyn
from fedlib.algorithms.fedprox import FedProx
from fedlib.algorithms.ldp_fl import LdpFl
from fedlib.algorithms.moon import Moon
from fedlib.algorithms.moon_dpap import MoonDpap
from fedlib.algorithms.scaffold import Scaffold
from fedlib.algorithms.signds_fl import SignDsFl
from fedlib.config import register_algorithm

#: Every algorithm a :class:`~fedlib.config.Config` can name, by name.
ALGORITHMS: dict[str, type[Algorithm]] = {}


def register(cls: type[Algorithm]) -> type[Algorithm]:
    """Make ``cls`` an algorithm that configs name by ``cls.name``: its check validates them and the
    fields it declares (``cls.fields``, a subclass's inherited ones included) may be set; returns
    ``cls``, so it serves as a class decorator. A name taken by another class is refused."""
    if not (isinstance(cls, type) and issubclass(cls, Algorithm)) or cls.name in ("", "base"):
        raise ValueError(f"register takes a subclass of fedlib.algorithms.Algorithm with a name, got {cls!r}")
    if ALGORITHMS.get(cls.name, cls) is not cls:
        raise ValueError(f"the algorithm name {cls.name!r} is taken by {ALGORITHMS[cls.name].__qualname__}")
    ALGORITHMS[cls.name] = cls
    register_algorithm(cls.name, cls.check, tuple(cls.fields))
    return cls


for _cls in (FedAvg, FedProx, Scaffold, FedDyn, Moon, Ditto, MoonDpap, DpFedAvg, LdpFl, SignDsFl, Fdl):
    register(_cls)

__all__ = ["ALGORITHMS", "Algorithm", "Ditto", "DpFedAvg", "Fdl", "FedAvg", "FedDyn", "FedProx", "LdpFl",
           "Moon", "MoonDpap", "RoundContext", "Scaffold", "SignDsFl", "register"]

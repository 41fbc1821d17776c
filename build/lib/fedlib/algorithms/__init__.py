"""Registry of federated algorithms: one module each, see :mod:`fedlib.algorithms.base`.
Importing it registers each algorithm's config check with :mod:`fedlib.config`."""

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

ALGORITHMS: dict[str, type[Algorithm]] = {
    cls.name: cls
    for cls in (FedAvg, FedProx, Scaffold, FedDyn, Moon, Ditto, MoonDpap, DpFedAvg, LdpFl, SignDsFl, Fdl)
}
for _name, _cls in ALGORITHMS.items():
    register_algorithm(_name, _cls.check)

__all__ = ["ALGORITHMS", "Algorithm", "Ditto", "DpFedAvg", "Fdl", "FedAvg", "FedDyn", "FedProx", "LdpFl",
           "Moon", "MoonDpap", "RoundContext", "Scaffold", "SignDsFl"]

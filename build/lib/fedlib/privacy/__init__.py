"""Privacy as composable pieces: a clipper, a noise mechanism, an accountant.

Each piece takes and returns parameter trees (dicts of tensors), so the same pieces serve
DP-FedAvg, MOON-DPAP and the local-DP algorithms; accounting goes through the maintained
``dp-accounting`` library (Opacus is used as a cross-check in the tests).
"""

from fedlib.privacy.accounting import (
    calibrate_constant_noise,
    epsilon_of_gaussian_rounds,
    gaussian_sigma,
    gdp_epsilon,
)
from fedlib.privacy.clipping import clip_by_l2, flat_norm
from fedlib.privacy.noise import gaussian_noise_like

__all__ = ["calibrate_constant_noise", "clip_by_l2", "epsilon_of_gaussian_rounds", "flat_norm",
           "gaussian_noise_like", "gaussian_sigma", "gdp_epsilon"]

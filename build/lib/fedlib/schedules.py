"""Per-round schedules of MOON-DPAP (Su, ICDSE 2025), as functions of the round t.

Rounds are numbered t = 0, ..., T-1 (the paper's t/T then never reaches 1, which is what
keeps eq. 5 finite; an explicit floor is available as well).
"""

from __future__ import annotations

import math


def cosine_lr(t: int, total: int, lr_max: float, lr_min: float = 0.0) -> float:
    """Eq. 1: ``eta_t = eta_min + (eta_max - eta_min) (1 + cos(pi t / T_max)) / 2``."""
    return lr_min + 0.5 * (lr_max - lr_min) * (1 + math.cos(math.pi * t / total))


def linear_down(t: int, start: float, end: float, slope: float) -> float:
    """Eq. 2 (temperature): ``tau_t = max(tau_min, tau_max - alpha t)``."""
    return max(end, start - slope * t)


def linear_up(t: int, start: float, end: float, slope: float) -> float:
    """Eq. 3 (contrastive weight): ``mu_t = min(mu_max, mu_min + beta t)``."""
    return min(end, start + slope * t)


def ramp_slope(start: float, end: float, total: int, ramp: float) -> float:
    """The per-round slope (eq. 2's alpha, eq. 3's beta) that moves from ``start`` to ``end``
    in the first ``ramp`` fraction of ``total`` rounds (the paper gives no value)."""
    return abs(end - start) / max(1.0, ramp * total)


def epsilon_schedule(t: int, total: int, eps0: float, floor: float = 0.0) -> float:
    """Eq. 5: ``epsilon(t) = epsilon_0 (1 - t/T)``, bounded below by ``floor * epsilon_0``.

    As published it reaches 0 (infinite noise) at t = T; with t = 0..T-1 its last value is
    ``epsilon_0 / T``. ``floor`` (a fraction of epsilon_0) is our stated lower bound.
    """
    return eps0 * max(1.0 - t / total, floor, 1.0 / total)


def pruning_threshold(t: int, total: int, t_min: float, t_max: float) -> float:
    """Eq. 7: ``T_t = T_min + (T_max - T_min) t / T_total``."""
    return t_min + (t_max - t_min) * t / total

"""Privacy accounting: a thin layer over Google's ``dp-accounting`` (0.6).

* :func:`gaussian_sigma` - the analytic Gaussian mechanism (Balle & Wang, ICML 2018): the
  smallest noise multiplier giving (epsilon, delta)-DP for one release, exact for every
  epsilon (the classic ``sqrt(2 ln(1.25/delta))/epsilon`` is valid only for epsilon < 1
  and over-noises there).
* :func:`epsilon_of_gaussian_rounds` - the total epsilon of a sequence of Gaussian
  releases (one per round, noise multiplier ``z_t``, optionally Poisson-sampled with rate
  ``q``), composed by the PLD accountant (tight) or the RDP accountant.
* :func:`gdp_epsilon` - the exact total for Gaussian releases *without* sampling: T of them
  compose to one Gaussian with ``mu = sqrt(sum_t z_t^-2)`` (Dong, Roth, Su, JRSS-B 2022).
  Use it for full participation; it needs no discretisation (the PLD accountant's grid
  grows without bound for very large multipliers, e.g. the last rounds of MOON-DPAP eq. 5).
* :func:`calibrate_constant_noise` - the constant ``z`` that spends a target total epsilon.
* :func:`rdp_epsilon`, :func:`calibrate_rdp` - RDP at *integer* orders only
  (:data:`INTEGER_ORDERS`): the accounting of the floating-point-safe (discrete Gaussian) noise
  that fedlib's mechanisms add, see :mod:`fedlib.privacy.discrete`. At an integer order ``a`` the
  Renyi divergence of a (Poisson-subsampled) Gaussian is a finite sum of the moments
  ``E_P[(Q/P)^k] = exp(k (k-1) Delta^2 / (2 sigma^2))``, k = 0..a (Mironov, Talwar, Zhang 2019);
  for the discrete Gaussian on a lattice, shifted by a lattice vector, those moments are *the
  same* (sum over the lattice of ``exp(-|y - k Delta|^2 / (2 sigma^2))`` does not depend on the
  lattice shift ``k Delta``), so the continuous Gaussian's integer-order RDP holds for it exactly.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import dp_accounting as dpa


@functools.cache
def _dp_accounting():
    """dp-accounting and its PLD and RDP modules, imported on first use: with scipy they take most of
    a second to import, which a Flower ClientApp (a fresh process per message, which never accounts)
    should not pay."""
    import dp_accounting
    from absl import logging as absl_logging
    from dp_accounting import pld, rdp

    absl_logging.set_verbosity(absl_logging.ERROR)  # silence harmless fractional-order warnings
    return dp_accounting, pld, rdp


def classic_gaussian_sigma(epsilon: float, delta: float) -> float:
    """Dwork & Roth (2014, Thm A.1): ``sqrt(2 ln(1.25/delta)) / epsilon`` (valid for epsilon < 1).
    Kept for comparison with papers that use it (MOON-DPAP eq. 4)."""
    return math.sqrt(2 * math.log(1.25 / delta)) / epsilon


def gaussian_sigma(epsilon: float, delta: float) -> float:
    """Noise multiplier (std / L2 sensitivity) of the analytic Gaussian mechanism."""
    dpa, pld, rdp = _dp_accounting()
    if not epsilon > 0 or not 0 < delta < 1:
        raise ValueError(f"need epsilon > 0 and 0 < delta < 1, got {epsilon}, {delta}")
    return float(dpa.get_sigma_gaussian(epsilon, delta))


def gdp_epsilon(noise_multipliers: Sequence[float], delta: float) -> float:
    """Exact epsilon at ``delta`` of unsampled Gaussian releases with multipliers ``z_t``."""
    dpa, pld, rdp = _dp_accounting()
    zs = list(noise_multipliers)
    if not zs:
        return 0.0
    mu = math.sqrt(sum(z ** -2 for z in zs))
    return float(dpa.get_epsilon_gaussian(1.0 / mu, delta))


def _event(z: float, q: float) -> dpa.DpEvent:
    dpa, pld, rdp = _dp_accounting()
    g = dpa.GaussianDpEvent(z)
    return g if q >= 1 else dpa.PoissonSampledDpEvent(q, g)


def _accountant(kind: str, replace_one: bool = False):
    """A fresh dp-accounting accountant. ``replace_one``: neighbouring data sets differ by replacing one
    unit (each unit's contribution has norm at most the sensitivity, so the sum moves by up to twice it),
    not by adding or removing one; only the PLD accountant supports it for Poisson sampling, with the
    dominating pair ``(1-q) N(0) + q N(-1)`` against ``(1-q) N(0) + q N(1)`` (dp-accounting's
    ``NeighboringRelation.REPLACE_ONE``; Zhu, Dong, Wang, ICML 2022)."""
    dpa, pld, rdp = _dp_accounting()
    if kind == "pld":
        return pld.PLDAccountant(dpa.NeighboringRelation.REPLACE_ONE if replace_one
                                 else dpa.NeighboringRelation.ADD_OR_REMOVE_ONE)
    if kind == "rdp":
        if replace_one:
            raise ValueError("replace-one accounting of Poisson-sampled Gaussians needs the PLD accountant")
        return rdp.RdpAccountant()
    raise ValueError(f"unknown accountant {kind!r}; choose pld or rdp")


def epsilon_of_gaussian_rounds(noise_multipliers: Sequence[float], delta: float, q: float = 1.0,
                               accountant: str = "pld", replace_one: bool = False) -> float:
    """Total epsilon at ``delta`` of one Gaussian release per round (multipliers ``z_t``), for
    neighbours that add or remove one unit, or (``replace_one``, PLD only) replace one."""
    dpa, pld, rdp = _dp_accounting()
    acc = _accountant(accountant, replace_one)
    zs = list(noise_multipliers)
    if not zs:
        return 0.0
    if accountant == "rdp" and len(set(zs)) == 1:
        orders, per_round = _rdp_of_one_round(float(zs[0]), float(q))
        return float(rdp.rdp_privacy_accountant.compute_epsilon(orders, len(zs) * per_round, delta)[0])
    if len(set(zs)) == 1:
        acc.compose(_event(zs[0], q), len(zs))
    else:
        for z in zs:
            acc.compose(_event(z, q))
    return float(acc.get_epsilon(delta))


@functools.lru_cache(maxsize=256)
def _rdp_of_one_round(z: float, q: float) -> tuple[np.ndarray, np.ndarray]:
    """dp-accounting's RDP curve (orders, values) of one round, computed once per ``(z, q)``.

    Computing the curve is the costly part of RDP accounting (~0.1 s for a Poisson-sampled
    Gaussian); T equal rounds compose to T times it, exactly what ``RdpAccountant.compose(event,
    T)`` does. Caching it lets a run report its epsilon every round at no cost. The accountant
    keeps the curve in ``_orders``/``_rdp`` (no public getter); a test checks this path against
    ``get_epsilon``.
    """
    dpa, pld, rdp = _dp_accounting()
    acc = rdp.RdpAccountant()
    acc.compose(_event(z, q))
    orders, values = np.array(acc._orders, dtype=np.float64), np.array(acc._rdp, dtype=np.float64)
    orders.flags.writeable = values.flags.writeable = False
    return orders, values


def calibrate_constant_noise(target_epsilon: float, delta: float, rounds: int, q: float = 1.0,
                             accountant: str = "pld") -> float:
    """The constant noise multiplier ``z`` that spends ``target_epsilon`` in ``rounds`` rounds.

    Without sampling (``q = 1``, tight accounting) the answer is exact and closed-form: T equal Gaussian
    releases are one Gaussian of multiplier ``z / sqrt(T)``, so ``z = sqrt(T) sigma(eps, delta)``.
    With sampling, dp-accounting bisects on the chosen accountant (from its default bracket, which
    doubles from 1 until the target is met; PLD there takes seconds per composition, RDP is fast).
    """
    dpa, pld, rdp = _dp_accounting()
    if not 0 < q <= 1:
        raise ValueError(f"sampling rate q must be in (0, 1], got {q}")
    _accountant(accountant)  # a clear error for an unknown name before any work
    if q == 1 and accountant == "pld":  # exact, like PLD (which would need a huge grid here)
        return math.sqrt(rounds) * gaussian_sigma(target_epsilon, delta)
    return float(dpa.calibrate_dp_mechanism(
        lambda: _accountant(accountant), lambda z: dpa.SelfComposedDpEvent(_event(z, q), rounds),
        target_epsilon=target_epsilon, target_delta=delta))


#: The PLD grid of :func:`calibrate_replace_one`: ten times dp-accounting's default, ten times faster;
#: the estimate stays pessimistic (an upper bound on epsilon), so the multiplier found errs on the
#: private side (by under 0.2 % against the default grid in the chapter's settings).
COARSE_PLD_INTERVAL = 1e-3


def calibrate_replace_one(target_epsilon: float, delta: float, rounds: int, q: float = 1.0) -> float:
    """The constant multiplier that spends ``target_epsilon`` over ``rounds`` Poisson-sampled Gaussian
    rounds when neighbours *replace* one unit (PLD; see :func:`_accountant`). Without sampling it is
    exact: the sum moves by twice the sensitivity, so twice the add/remove multiplier ``z_1``. With
    sampling dp-accounting bisects (to 1e-3) between ``q z_1 / 2`` (sampling amplifies by about ``q``
    at most) and ``z_1`` (sampling never hurts), returning a multiplier whose epsilon is at most the
    target."""
    dpa, pld, rdp = _dp_accounting()
    if not 0 < q <= 1 or not target_epsilon > 0 or rounds < 1:
        raise ValueError(f"need 0 < q <= 1, epsilon > 0, rounds >= 1; got q={q}, epsilon={target_epsilon}, "
                         f"rounds={rounds}")
    unsampled = 2 * math.sqrt(rounds) * gaussian_sigma(target_epsilon, delta)
    if q == 1:
        return unsampled
    return float(dpa.calibrate_dp_mechanism(
        lambda: pld.PLDAccountant(dpa.NeighboringRelation.REPLACE_ONE,
                                  value_discretization_interval=COARSE_PLD_INTERVAL),
        lambda z: dpa.SelfComposedDpEvent(_event(z, q), rounds), target_epsilon=target_epsilon,
        target_delta=delta, bracket_interval=dpa.ExplicitBracketInterval(q * unsampled / 2, unsampled),
        tol=1e-3))


# ---- integer-order RDP: the guarantee of the discrete Gaussian ---------------------------------
#: Integer Renyi orders (see the module docstring); the large ones matter for small epsilon.
INTEGER_ORDERS: tuple[int, ...] = (*range(2, 129), 160, 192, 256, 384, 512, 768, 1024)


@functools.lru_cache(maxsize=1024)
def rdp_curve(z: float, q: float = 1.0) -> np.ndarray:
    """RDP of one (Poisson-sampled, rate ``q``) Gaussian release with multiplier ``z`` at
    :data:`INTEGER_ORDERS` (dp-accounting's computation; ``q = 1``: ``a / (2 z^2)``)."""
    dpa, pld, rdp = _dp_accounting()
    if z <= 0:
        return np.full(len(INTEGER_ORDERS), np.inf)
    if q >= 1:
        out = np.array(INTEGER_ORDERS, dtype=np.float64) / (2 * z * z)
    else:
        acc = rdp.RdpAccountant(orders=list(INTEGER_ORDERS))
        acc.compose(_event(z, q))
        out = np.array(acc._rdp, dtype=np.float64)
    out.flags.writeable = False
    return out


def epsilon_from_rdp(curve: np.ndarray, delta: float) -> float:
    """The (epsilon, delta) conversion of dp-accounting (Balle et al. 2020) at the integer orders."""
    dpa, pld, rdp = _dp_accounting()
    return float(rdp.rdp_privacy_accountant.compute_epsilon(list(INTEGER_ORDERS), curve, delta)[0])


def rdp_epsilon(noise_multipliers: Sequence[float], delta: float, q: float = 1.0) -> float:
    """Total epsilon at ``delta`` of one Gaussian release per round (multipliers ``z_t``, Poisson
    rate ``q``), RDP at integer orders: a guarantee for continuous and discrete Gaussian noise."""
    zs = list(noise_multipliers)
    if not zs:
        return 0.0
    total = np.zeros(len(INTEGER_ORDERS))
    for z, n in _runs(zs):
        total = total + n * rdp_curve(float(z), float(q))
    return epsilon_from_rdp(total, delta)


def _runs(zs: list[float]) -> list[tuple[float, int]]:
    """Equal values grouped: [(z, count), ...] (the curve of each distinct z is computed once)."""
    counts: dict[float, int] = {}
    for z in zs:
        counts[z] = counts.get(z, 0) + 1
    return list(counts.items())


@functools.lru_cache(maxsize=512)
def calibrate_rdp(target_epsilon: float, delta: float, rounds: int, q: float = 1.0) -> float:
    """The constant multiplier ``z`` whose ``rounds`` releases spend ``target_epsilon`` by
    :func:`rdp_epsilon` (bisection in log z; the result errs on the side of more noise)."""
    if not target_epsilon > 0:
        raise ValueError(f"target epsilon must be > 0, got {target_epsilon}")
    lo, hi = 1e-3, 1e5
    if rdp_epsilon([hi] * rounds, delta, q) > target_epsilon:
        raise ValueError(f"epsilon {target_epsilon} is out of reach (z > {hi:g})")
    for _ in range(80):
        mid = math.sqrt(lo * hi)
        if rdp_epsilon([mid] * rounds, delta, q) > target_epsilon:
            lo = mid
        else:
            hi = mid
        if hi / lo < 1 + 1e-7:
            break
    return hi


# ---- textbook composition theorems, for comparison with the accountants --------------------
def basic_composition(epsilon: float, delta: float, rounds: int) -> tuple[float, float]:
    """Basic composition (Dwork & Roth 2014, Thm 3.16): ``(T eps, T delta)``."""
    return rounds * epsilon, rounds * delta


def advanced_composition(epsilon: float, delta: float, rounds: int,
                         delta_prime: float) -> tuple[float, float]:
    """Advanced composition (Dwork & Roth 2014, Thm 3.20) for T (eps, delta)-DP mechanisms:
    ``eps' = sqrt(2 T ln(1/delta')) eps + T eps (e^eps - 1)`` at total ``delta = T delta + delta'``
    (the DP-FL article quotes the epsilon and omits the total delta). It can be *worse*
    than basic composition for large eps."""
    eps = math.sqrt(2 * rounds * math.log(1 / delta_prime)) * epsilon + rounds * epsilon * math.expm1(epsilon)
    return eps, rounds * delta + delta_prime


def optimal_composition(epsilon: float, delta: float, rounds: int, total_delta: float) -> float | None:
    """The optimal composition of T (eps, delta)-DP mechanisms (Kairouz, Oh, Viswanath 2015,
    Thm 3.3), via dp-accounting; ``None`` when ``total_delta`` is unreachable."""
    from dp_accounting.pld import accountant as pld_accountant
    from dp_accounting.pld import common as pld_common

    params = pld_common.DifferentialPrivacyParameters(epsilon, delta)
    return pld_accountant.advanced_composition(params, rounds, total_delta)

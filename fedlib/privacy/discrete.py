"""Floating-point-safe noise: exact discrete Laplace and discrete Gaussian samplers, and the
fixed grid the released values live on.

Why. Adding float noise to a float value leaks through the low-order bits: the set of floats
``x + noise`` can produce depends on ``x`` (Mironov, CCS 2012), so an output can have probability
0 under one input and positive probability under its neighbour, and the privacy loss is
unbounded whatever the noise scale. The remedy used here (Canonne, Kamath, Steinke, NeurIPS 2020):
round the value to a fixed grid of step ``gamma`` (a power of two, so that encoding and decoding
are exact), work in integers, and add integer noise drawn *exactly* from the discrete Laplace
or discrete Gaussian distribution. Every output is a grid point; every grid point has positive
probability under every input.

The samplers follow Canonne, Kamath and Steinke (2020), Algorithms 1-3, on vectors (numpy, one
random stream per call): only uniform integers are drawn, so the distributions are exact given an
ideal source of random bits. One step, the acceptance test of the discrete Gaussian
(``Bernoulli(exp(-gamma))`` with ``gamma`` a ratio of integers that may exceed 64 bits), is decided
by comparing a 53-bit uniform with ``exp(-gamma)`` in float64 when the two are far apart (all but
about 1e-12 of the cases) and otherwise by exact rational arithmetic with more random bits
(``mpmath`` at 256 bits, extended until decided): the result is exact either way.

What this does not give: the generators are seeded and not cryptographic (numpy's PCG64). That
is right for a reproducible simulation and wrong for a deployment, which draws from the
operating system's entropy source.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from fedlib.privacy.record import note_key

#: How finely values are represented: the grid step is 2^-GRID_BITS times the largest value
#: (the clip norm), so rounding moves a coordinate by at most 2^-(GRID_BITS+1) of it.
GRID_BITS = 30

_U53 = 2.0**-53


def rng_for(*parts: int) -> np.random.Generator:
    """A numpy generator seeded from a tuple of integers (e.g. config key, stream, round)."""
    note_key("numpy", parts)
    return np.random.default_rng(np.random.SeedSequence(list(parts)))


@dataclass(frozen=True)
class Grid:
    """A grid of step ``step`` (a power of two): ``encode`` rounds to the nearest grid point (ties
    to even) and returns integers; ``decode`` is exact."""

    step: float

    def encode(self, x: np.ndarray) -> np.ndarray:
        """``x`` rounded to the nearest grid point (ties to even), as integer multiples of the step."""
        return np.rint(np.asarray(x, dtype=np.float64) / self.step).astype(np.int64)

    def decode(self, n: np.ndarray) -> np.ndarray:
        """Integer multiples of the step back to values: exact (the step is a power of two)."""
        return np.asarray(n, dtype=np.float64) * self.step


def grid_for(bound: float, bits: int = GRID_BITS) -> Grid:
    """The grid for values of magnitude up to ``bound``: step ``2^(floor(log2 bound) - bits)``, so
    ``bound / step`` lies in ``[2^bits, 2^(bits+1))``."""
    if not bound > 0:
        raise ValueError(f"bound must be > 0, got {bound}")
    return Grid(2.0 ** (math.floor(math.log2(bound)) - bits))


# ---- exact Bernoulli trials --------------------------------------------------------------------
def bernoulli_rational(num: np.ndarray, den: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Exact ``Bernoulli(num / den)`` for integer arrays ``0 <= num <= den`` (den < 2^63)."""
    return rng.integers(0, den) < num


def bernoulli_exp_neg_rational(num: np.ndarray, den: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Exact ``Bernoulli(exp(-num/den))`` for integers ``num >= 0``, ``den >= 1`` (CKS Alg. 1).

    For ``gamma = num/den <= 1``: draw ``A_k ~ Bernoulli(gamma / k)`` for k = 1, 2, ... until one
    fails; the result is 1 iff the first failure is at an odd k. Larger ``gamma``: that many
    ``Bernoulli(exp(-1))`` trials and one for the fractional part, all of which must succeed.
    """
    num = np.asarray(num, dtype=np.int64)
    den = np.broadcast_to(np.asarray(den, dtype=np.int64), num.shape)
    out = np.ones(num.shape, dtype=bool)
    whole, frac = np.divmod(num, den)
    # the integer part: Bernoulli(exp(-1)) once per unit, stop a row at its first failure
    left = whole.copy()
    todo = np.flatnonzero(left > 0)
    while todo.size:
        ok = _bernoulli_exp_small(np.ones(todo.size, dtype=np.int64), np.ones(todo.size, dtype=np.int64), rng)
        out[todo[~ok]] = False
        left[todo] -= 1
        todo = todo[ok & (left[todo] > 0)]
    todo = np.flatnonzero(out & (frac > 0))
    if todo.size:
        out[todo] = _bernoulli_exp_small(frac[todo], den[todo], rng)
    return out


def _bernoulli_exp_small(num: np.ndarray, den: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """``Bernoulli(exp(-num/den))`` for ``0 <= num <= den`` (the K loop of CKS Alg. 1)."""
    n = num.size
    k = np.ones(n, dtype=np.int64)
    alive = np.arange(n)
    while alive.size:
        a = bernoulli_rational(num[alive], den[alive] * k[alive], rng)
        k[alive[a]] += 1
        alive = alive[a]
    return (k % 2) == 1


def _exact_below_exp(u53: int, num: int, den: int, rng: np.random.Generator) -> bool:
    """Is the uniform whose first 53 bits are ``u53`` below ``exp(-num/den)``? Draw 64 more bits
    at a time and compare at growing precision until the answer is certain."""
    import mpmath

    bits, value = 53, u53
    prec = 256
    while True:
        with mpmath.workprec(prec + 16):
            target = mpmath.exp(-mpmath.mpf(num) / den)
            lo = mpmath.mpf(value) / (mpmath.mpf(2) ** bits)
            hi = mpmath.mpf(value + 1) / (mpmath.mpf(2) ** bits)
            err = mpmath.mpf(2) ** (-prec)
            if hi < target - err:
                return True
            if lo > target + err:
                return False
        value = (value << 64) | int(rng.integers(0, 2**63)) << 1 | int(rng.integers(0, 2))
        bits += 64
        prec += 64


# ---- discrete Laplace and discrete Gaussian ----------------------------------------------------
def discrete_laplace(n: int, scale: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` exact draws of the discrete Laplace distribution with integer ``scale >= 1``:
    ``P(x) ∝ exp(-|x| / scale)`` on the integers (CKS Alg. 2 with s = 1)."""
    t = int(scale)
    if t < 1:
        raise ValueError(f"scale must be an integer >= 1, got {scale}")
    out = np.zeros(n, dtype=np.int64)
    todo = np.arange(n)
    while todo.size:
        m = todo.size
        u = rng.integers(0, t, size=m)
        keep = bernoulli_exp_neg_rational(u, np.full(m, t), rng)
        v = _geometric_exp_neg_one(m, rng)
        x = u + t * v
        neg = rng.integers(0, 2, size=m).astype(bool)
        keep &= ~(neg & (x == 0))
        out[todo[keep]] = np.where(neg[keep], -x[keep], x[keep])
        todo = todo[~keep]
    return out


def _geometric_exp_neg_one(n: int, rng: np.random.Generator) -> np.ndarray:
    """Number of successes before the first failure of ``Bernoulli(exp(-1))`` trials."""
    v = np.zeros(n, dtype=np.int64)
    alive = np.arange(n)
    while alive.size:
        ok = _bernoulli_exp_small(
            np.ones(alive.size, dtype=np.int64), np.ones(alive.size, dtype=np.int64), rng
        )
        v[alive[ok]] += 1
        alive = alive[ok]
    return v


def discrete_gaussian(
    n: int, sigma: float, rng: np.random.Generator, float_decides: bool = True
) -> np.ndarray:
    """``n`` exact draws of the discrete Gaussian ``N_Z(0, sigma^2)``: ``P(x) ∝ exp(-x^2 / (2 sigma^2))``
    on the integers (CKS Alg. 3). ``sigma^2`` is taken as the rational nearest ``sigma^2`` with
    denominator 2^20 (relative change below 1e-6 / sigma^2; what is accounted is this value).

    Proposals are discrete Laplace with scale ``t = floor(sigma) + 1``; a proposal ``y`` is
    accepted with probability ``exp(-(|y| - sigma^2/t)^2 / (2 sigma^2))``. ``float_decides=False``
    forces the exact rational test for every proposal (slow; for the tests of that path).
    """
    if not sigma > 0:
        raise ValueError(f"sigma must be > 0, got {sigma}")
    s2_num, s2_den = effective_sigma2(sigma)
    t = int(math.isqrt(s2_num // s2_den)) + 1  # floor(sigma) + 1
    out = np.zeros(n, dtype=np.int64)
    todo = np.arange(n)
    while todo.size:
        y = discrete_laplace(todo.size, t, rng)
        keep = _accept(y, t, s2_num, s2_den, rng, float_decides)
        out[todo[keep]] = y[keep]
        todo = todo[~keep]
    return out


def _accept(
    y: np.ndarray, t: int, s2_num: int, s2_den: int, rng: np.random.Generator, float_decides: bool
) -> np.ndarray:
    """``Bernoulli(exp(-gamma))`` per proposal, ``gamma = (|y| t s2_den - s2_num)^2 / (2 s2_num s2_den
    t^2)``. A 53-bit uniform ``u`` places the uniform in ``[u 2^-53, (u+1) 2^-53)``; where that
    interval is clear of ``exp(-gamma)`` by more than float64's error on it (``gamma`` and ``exp``
    are computed with relative error below ~1e-15 (1 + gamma); 1e-13 (1 + gamma) is used) the
    float comparison decides, else :func:`_exact_below_exp`."""
    s2 = s2_num / s2_den
    gamma = (np.abs(y).astype(np.float64) - s2 / t) ** 2 / (2 * s2)
    p = np.exp(-gamma)
    u = rng.integers(0, 2**53, size=p.shape, dtype=np.int64)
    lo = u.astype(np.float64) * _U53
    slack = 1e-13 * (1.0 + gamma) * p + 4 * _U53
    keep = (lo + _U53 <= p - slack) if float_decides else np.zeros(p.shape, dtype=bool)
    unsure = np.flatnonzero(~keep & (lo < p + slack)) if float_decides else np.arange(p.size)
    den = 2 * s2_num * s2_den * t * t
    for i in unsure:
        num = (abs(int(y[i])) * t * s2_den - s2_num) ** 2
        keep[i] = _exact_below_exp(int(u[i]), num, den, rng)
    return keep


def effective_sigma2(sigma: float) -> tuple[int, int]:
    """``sigma^2`` as the ratio ``(num, 2^20)`` the sampler uses (rounded up: never less noise)."""
    den = 2**20
    return math.ceil(sigma * sigma * den), den


def effective_sigma(sigma: float) -> float:
    """The standard deviation the sampler draws with for ``sigma`` (:func:`effective_sigma2`: never less)."""
    num, den = effective_sigma2(sigma)
    return math.sqrt(num / den)

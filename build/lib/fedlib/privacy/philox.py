"""A counter-based generator in tensor operations: Gaussian noise for many (key, counter) pairs in one
fixed set of operators, on any device.

Philox4x32-10 (Salmon, Moraes, Dror and Shaw, "Parallel random numbers: as easy as 1, 2, 3", SC 2011,
Sec. 3.3 and Fig. 2): a 128-bit counter and a 64-bit key are mixed by ten rounds of two 32x32-bit
multiplies (high and low halves), xors with the key and a Weyl key schedule; every (key, counter)
pair gives four independent 32-bit words. It passes TestU01's BigCrush with a safety margin (the
paper: 7 rounds suffice; 10 is the recommended count, and what cuRAND and PyTorch's CUDA generator
use). The test suite checks this implementation against the Random123 known-answer vectors and
against a plain-integer transcription.

Why here: record-level DP-SGD needs fresh noise for every (client, local step). With one
``torch.Generator`` per pair, a vectorized step with ``L`` lanes creates ``L`` generators and
launches ``L`` draws per parameter tensor, so its operator count grows with the lanes (issue 37,
items 1 and 3). A counter-based generator is a pure function of (key, counter): all lanes' noise
is one batch of elementwise integer operations with per-lane keys and counters, the same whatever
the lanes, and the same integers on a CPU and a GPU (only the final float64 ``log``/``cos``/``sin``
may round differently in the last bit between devices).

The words are exact in int64: each 32x32-bit product is split into 16-bit limbs, so no
intermediate exceeds 2^49 and nothing relies on signed overflow.
"""

from __future__ import annotations

import math

import torch

_MASK = 0xFFFFFFFF
#: Philox4x32's multipliers and Weyl key increments (the paper's Table 2 and Sec. 3.3).
M0, M1 = 0xD2511F53, 0xCD9E8D57
W0, W1 = 0x9E3779B9, 0xBB67AE85
ROUNDS = 10


def _mulhilo(a: torch.Tensor, m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """High and low 32-bit halves of ``a * m`` for 32-bit ``a`` (int64 tensor) and constant ``m``.

    ``a * m = a m_lo + (a m_hi) 2^16`` with 16-bit limbs ``m_lo, m_hi``; write ``a m_hi = P_h 2^16 +
    P_l``. Then ``a * m = q + P_h 2^32`` with ``q = a m_lo + P_l 2^16 < 2^49``: low = ``q mod 2^32``,
    high = ``P_h + floor(q / 2^32)``."""
    p = a * (m >> 16)
    q = a * (m & 0xFFFF) + ((p & 0xFFFF) << 16)
    return (p >> 16) + (q >> 32), q & _MASK


def philox4x32(counter: tuple[torch.Tensor, ...], key: tuple[torch.Tensor, torch.Tensor],
               rounds: int = ROUNDS) -> tuple[torch.Tensor, ...]:
    """Philox4x32-``rounds`` of four 32-bit counter words and two key words (int64 tensors holding
    values in ``[0, 2^32)``, broadcast together); returns the four output words."""
    c0, c1, c2, c3 = counter
    k0, k1 = key
    for r in range(rounds):
        if r:
            k0, k1 = (k0 + W0) & _MASK, (k1 + W1) & _MASK
        hi0, lo0 = _mulhilo(c0, M0)
        hi1, lo1 = _mulhilo(c2, M1)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
    return c0, c1, c2, c3


def split_key(key: int) -> tuple[int, int]:
    """A 64-bit integer as Philox's two key words."""
    return key & _MASK, (key >> 32) & _MASK


def gaussians(key: torch.Tensor, stream: torch.Tensor, n: int, dtype: torch.dtype = torch.float32
              ) -> torch.Tensor:
    """``n`` standard normal values for each row: (R, n), row ``r`` a function of ``key[r]`` (two
    32-bit words, (R, 2) int64) and ``stream[r]`` (two 32-bit words, (R, 2) int64) only.

    Block ``b`` of a row is Philox at counter ``(b, 0, stream_0, stream_1)``; its four words give the
    Box-Muller pair ``sqrt(-2 ln u1) (cos 2 pi u2, sin 2 pi u2)``, computed in float64 and rounded
    once to ``dtype``, with ``u1 = (w0 2^32 + w1 + 1) 2^-64`` on ``(0, 1]`` (all 64 bits: rounded
    to float64 near 1, exact near 0, where the tail is decided) and ``u2 = (w2 2^21 + w3 div 2^11)
    2^-53`` on ``[0, 1)``. ``u1 >= 2^-64`` keeps every value finite: the pair's radius is at most
    ``sqrt(128 ln 2) = 9.42``, so the normal is cut where the ideal one has mass ``2^-64`` (5e-20) per
    pair. (PyTorch's float32 ``randn`` on a CPU, the ``generator`` option, takes 24-bit uniforms:
    its radius stops at 5.77, mass ``2^-24`` = 6e-8 per pair, and is coarse in the tail.) One call
    is the same operators whatever ``R``: the lanes of a vectorized step draw their noise together."""
    if key.dim() != 2 or key.shape[1] != 2 or stream.shape != key.shape:
        raise ValueError(f"key and stream must both be (rows, 2), got {tuple(key.shape)} and "
                         f"{tuple(stream.shape)}")
    blocks = (n + 1) // 2
    b = torch.arange(blocks, device=key.device, dtype=torch.int64)[None, :]
    zero = torch.zeros((), device=key.device, dtype=torch.int64)
    w0, w1, w2, w3 = philox4x32((b, zero, stream[:, :1], stream[:, 1:]), (key[:, :1], key[:, 1:]))
    u1 = (w0.to(torch.float64) * 2.0**32 + (w1 + 1).to(torch.float64)) * 2.0**-64
    m2 = (w2 << 21) | (w3 >> 11)  # 32 + 21 = 53 random bits, exact in int64 and float64
    theta = m2.to(torch.float64) * (2.0 ** -53 * 2 * math.pi)
    radius = torch.sqrt(-2.0 * torch.log(u1))
    z = torch.stack((radius * torch.cos(theta), radius * torch.sin(theta)), dim=-1)
    return z.reshape(key.shape[0], 2 * blocks)[:, :n].to(dtype)

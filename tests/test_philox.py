"""The counter-based generator of record-level DP-SGD's ``counter`` step noise (fedlib.privacy.philox):
Philox4x32-10 bit for bit, and the normals it gives."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats

from fedlib.privacy.philox import gaussians, philox4x32

#: Random123's known-answer vectors for philox4x32 with 10 rounds (its ``tests/kat_vectors``):
#: counter (4 words), key (2 words), output (4 words).
KAT = [((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
       ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
       ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
        (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1))]


def _philox_ints(ctr, key, rounds=10):
    """Philox4x32 on Python integers, transcribed from Salmon et al. (SC 2011), Sec. 3.3: the
    reference the tensor version (16-bit limbs, int64) must equal."""
    c, (k0, k1), m = list(ctr), key, 0xFFFFFFFF
    for r in range(rounds):
        if r:
            k0, k1 = (k0 + 0x9E3779B9) & m, (k1 + 0xBB67AE85) & m
        p0, p1 = 0xD2511F53 * c[0], 0xCD9E8D57 * c[2]
        c = [(p1 >> 32) ^ c[1] ^ k0, p1 & m, (p0 >> 32) ^ c[3] ^ k1, p0 & m]
    return tuple(c)


def _words(values):
    return tuple(torch.tensor(v, dtype=torch.int64) for v in values)


@pytest.mark.parametrize(("ctr", "key", "expected"), KAT)
def test_the_known_answers_of_random123(ctr, key, expected):
    out = philox4x32(_words([[w] for w in ctr]), _words([[w] for w in key]))
    assert tuple(int(w[0]) for w in out) == expected
    assert _philox_ints(ctr, key) == expected


def test_the_tensor_version_equals_plain_integers_on_random_and_extreme_words():
    """2,000 random (counter, key) pairs, half of them near 0 or 2^32 - 1 (where a carry or a sign
    would show), every word equal."""
    rng = np.random.default_rng(7)
    n = 2_000
    words = rng.integers(0, 2**32, size=(n, 6), dtype=np.int64)
    words[: n // 2] = np.where(rng.random((n // 2, 6)) < 0.5, rng.integers(0, 16, (n // 2, 6)),
                               2**32 - 1 - rng.integers(0, 16, (n // 2, 6)))
    out = philox4x32(_words(words[:, :4].T.tolist()), _words(words[:, 4:].T.tolist()))
    got = np.stack([w.numpy() for w in out], axis=1)
    want = np.array([_philox_ints(row[:4].tolist(), row[4:].tolist()) for row in words])
    assert np.array_equal(got, want)
    assert got.min() >= 0 and got.max() < 2**32


def test_the_normals_are_standard_normal_and_finite():
    """KS test of 400k values against N(0, 1) (false-failure rate 1e-4 for a correct sampler); the
    std within 0.6 % (5.4 standard errors of a sample std at this size); the Box-Muller radius is
    bounded by sqrt(128 ln 2) (u1 >= 2^-64: never infinite)."""
    key = torch.tensor([[12345, 678]], dtype=torch.int64)
    z = gaussians(key, torch.tensor([[3, 9]], dtype=torch.int64), 400_000, torch.float64)[0]
    assert torch.isfinite(z).all() and float(z.abs().max()) <= math.sqrt(128 * math.log(2))
    x = z.numpy()
    assert stats.kstest(x, "norm").pvalue > 1e-4
    assert x.std() == pytest.approx(1.0, rel=0.006)


def test_each_pair_of_normals_is_box_muller_of_a_64_and_a_53_bit_uniform():
    """Block b of a row: Philox at counter (b, 0, stream) gives words w0..w3; u1 = (w0 2^32 + w1 + 1)
    2^-64 (the radius' uniform: 64 bits, so the tail is cut at 9.42, not at 5.77 as with 24 bits) and
    u2 = (w2 2^21 + w3 div 2^11) 2^-53, and the pair is sqrt(-2 ln u1) (cos, sin) of 2 pi u2:
    recomputed from plain integers and math's float64 functions, equal to 1e-13 (a few ulps of libm
    against PyTorch's vectorized functions, times the radius)."""
    key, stream, n = (0xDEADBEEF, 42), (7, 11), 301
    z = gaussians(torch.tensor([key]), torch.tensor([stream]), n, torch.float64)[0].tolist()
    want = []
    for b in range((n + 1) // 2):
        w0, w1, w2, w3 = _philox_ints((b, 0, *stream), key)
        u1 = float((w0 << 32) + w1 + 1) * 2.0**-64
        u2 = ((w2 << 21) | (w3 >> 11)) * 2.0**-53
        radius = math.sqrt(-2 * math.log(u1))
        want += [radius * math.cos(2 * math.pi * u2), radius * math.sin(2 * math.pi * u2)]
    assert z == pytest.approx(want[:n], abs=1e-13, rel=0)


def test_each_row_depends_on_its_own_key_and_stream_only():
    """The lanes of a step draw together: a row of a 3-row call equals the same (key, stream) drawn
    alone, whatever sits in the other rows; another stream or key is uncorrelated (5 standard errors
    of a correlation over 50k values)."""
    key = torch.tensor([[1, 2], [1, 2], [9, 9]], dtype=torch.int64)
    stream = torch.tensor([[0, 0], [0, 1], [0, 0]], dtype=torch.int64)
    rows = gaussians(key, stream, 50_001, torch.float32)
    assert rows.shape == (3, 50_001)
    for r in range(3):
        assert torch.equal(rows[r], gaussians(key[r:r + 1], stream[r:r + 1], 50_001, torch.float32)[0])
    for a, b in ((0, 1), (0, 2)):
        assert abs(np.corrcoef(rows[a].numpy(), rows[b].numpy())[0, 1]) < 5 / math.sqrt(50_001)
    with pytest.raises(ValueError, match="rows, 2"):
        gaussians(key[:, :1], stream[:, :1], 10)

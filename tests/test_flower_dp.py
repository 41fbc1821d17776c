"""fedlib's DP-FedAvg with fixed clipping against Flower's own DP wrappers, on the same updates.

Flower's ``DifferentialPrivacyServerSideFixedClipping`` (and the client-side variant, whose clients
clip with Flower's ``fixedclipping_mod``) wraps FedAvg: each client's update is clipped to L2 norm C,
the strategy averages the clipped models, and Gaussian noise of std ``z C / m`` is added to the
average, ``m`` the number of sampled clients (fixed at construction). fedlib adds ``N(0, (z C)^2)`` to
the *sum* of clipped updates and divides by the expected number of clients ``qN``. The two agree when
like is compared with like: every client sampled (``q = 1``, so ``qN = m``) and uniform weights
(Flower's FedAvg weights by the clients' ``num-examples``; with unequal weights its average's
sensitivity would exceed C / m, which its noise does not cover). Then the deterministic part (the
mean clipped update) is the same to float32 rounding, and both noises have std ``z C / m``: tested on
200,000 coordinates, where the sample std's relative standard error is 1/sqrt(2n) = 0.16 %, so a 1 %
margin is six standard errors (a false failure about once in 10^9 runs). fedlib's noise is the
floating-point-safe discrete Gaussian (std ``z`` times the grid-rounded sensitivity, 1e-6 above zC);
Flower's is float Gaussian noise from numpy.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("flwr", reason="the Flower extra is not installed (make test installs it)")

from fedlib.flower.dp_check import C, D, M, cross_check, fedlib_release, flower_release  # noqa: E402


@pytest.mark.parametrize("side", ["server", "client"])
def test_without_noise_both_release_the_mean_clipped_update(side):
    ours, theirs = fedlib_release(0.0), flower_release(0.0, side)
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-8)  # float32 rounding of ~1e-4 values


@pytest.mark.parametrize("side", ["server", "client"])
def test_both_noises_have_std_z_c_over_m(side):
    z = 1.0
    mean = fedlib_release(0.0)
    for release in (fedlib_release(z), flower_release(z, side)):
        noise = release - mean
        assert noise.std() == pytest.approx(z * C / M, rel=0.01)
        assert abs(noise.mean()) < 6 * z * C / M / np.sqrt(D)


def test_the_pages_cross_check_table_holds_the_same_tolerances():
    rows = cross_check(1.0)
    assert [r["implementation"] for r in rows][0] == "fedlib DP-FedAvg" and len(rows) == 3
    for r in rows:
        assert r["max_mean_diff"] <= 1e-8
        assert r["noise_std"] == pytest.approx(r["target_std"], rel=0.01)

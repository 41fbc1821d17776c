"""The "Whose privacy?" page's numbers (studies.units, issue 77): every noise level is the accountant's,
every ratio the stated formula, and the explorer shows exactly those."""

from __future__ import annotations

import math

import pytest

from fedlib.privacy.accounting import calibrate_rdp, rdp_epsilon
from studies import units
from studies.units import DELTA, Federation


def test_each_units_noise_is_the_accountants_and_its_ratio_the_formula():
    f = Federation(clients=20, dims=449_034, epsilon=10.0, rounds=50, q=1.0, batch=32, samples=60_000)
    m, k = 3_000, math.ceil(3_000 / 32)
    sigma = calibrate_rdp(10.0, DELTA, 50 * k, q=32 / m)
    z = calibrate_rdp(10.0, DELTA, 50, q=1.0)
    assert units.noise_multiplier("record", f) == pytest.approx(sigma, rel=1e-12)
    record = sigma * math.sqrt(f.dims) / (32 * math.sqrt(k * 20))
    assert units.noise_to_signal("record", f) == pytest.approx(record)
    assert units.noise_to_signal("central", f) == pytest.approx(z * math.sqrt(f.dims) / 20)
    assert units.noise_to_signal("local", f) == pytest.approx(z * math.sqrt(f.dims) / math.sqrt(20))
    assert units.noise_to_signal("report", f) == pytest.approx(math.sqrt(f.dims / (20 * (10.0 / 50) ** 2)))
    # the multiplier spends the budget: the accountant gives back epsilon (to its bisection's margin)
    assert rdp_epsilon([z] * 50, DELTA) == pytest.approx(10.0, rel=1e-3)


def test_the_ratios_move_the_way_the_page_says():
    base = Federation(clients=100, dims=79_510, epsilon=10.0, rounds=20)
    for unit in units.UNITS:
        more = units.noise_to_signal(unit, Federation(**{**base.__dict__, "clients": 1_000}))
        bigger = units.noise_to_signal(unit, Federation(**{**base.__dict__, "dims": 4 * 79_510}))
        richer = units.noise_to_signal(unit, Federation(**{**base.__dict__, "epsilon": 100.0}))
        r = units.noise_to_signal(unit, base)
        assert bigger == pytest.approx(2 * r)  # sqrt(d)
        assert richer < r, unit
        if unit != "record":  # record-level: more clients also means fewer records each
            assert more < r, unit
    central = units.noise_to_signal("central", base)
    tenfold = Federation(**{**base.__dict__, "clients": 1_000})
    assert units.noise_to_signal("central", tenfold) == pytest.approx(central / 10)  # 1/n


def test_the_explorer_shows_the_accountants_values_for_a_sample_of_settings(monkeypatch):
    monkeypatch.setattr(units, "EXPLORER_CLIENTS", (20, 1_000))
    monkeypatch.setattr(units, "EXPLORER_EPSILONS", (1.0, 10.0))
    monkeypatch.setattr(units, "EXPLORER_ROUNDS", 20)
    frame = units.explorer_frame({("central", 20, 449_034, 10.0): "committed: a run"})
    assert len(frame) == 2 * 3 * 2 * len(units.UNITS)
    for _, row in frame.sample(8, random_state=0).iterrows():
        f = Federation(clients=int(row["n"]), dims=int(row["d"]), epsilon=float(row["epsilon"]), rounds=20)
        assert row["ratio"] == pytest.approx(units.noise_to_signal(row["unit"], f), rel=1e-12)
        if row["unit"] == "central":
            assert row["z"] == pytest.approx(calibrate_rdp(row["epsilon"], DELTA, 20, q=1.0), rel=1e-12)
            assert f"{row['z']:.3g}" in row["line3"]
    hit = frame[(frame["unit"] == "central") & (frame["n"] == 20) & (frame["d"] == 449_034)
                & (frame["epsilon"] == 10.0)]
    assert hit["line6"].iloc[0] == "committed: a run"
    assert (frame["line6"] == "no committed run at this setting").sum() == len(frame) - 1


def test_the_crossing_sentence_reads_stretches_not_a_first_point():
    """A ratio need not fall monotonically (record-level DP-SGD with more clients has fewer records
    each): the page names every stretch of the grid where a unit's noise is below the signal."""
    import pandas as pd

    ratios = {"record": (0.5, 0.8, 2.0, 0.9), "central": (9, 5, 2, 0.5), "local": (9, 9, 9, 9),
              "report": (0.1, 0.1, 0.1, 0.1)}
    table = pd.DataFrame([{"unit": u, "n": n, "noise / signal": r} for u in units.UNITS
                          for n, r in zip((10, 100, 1000, 10000), ratios[u], strict=True)])
    assert units.below_signal(table, "n", "record") == [(10, 100), (10000, 10000)]
    sentence = units.crossings_sentence(table, "n", "n")
    assert "record-level DP-SGD: at n = 10 to 100 and 10,000" in sentence
    assert "client-level, central: at n = 10,000" in sentence and "client-level, local: nowhere" in sentence
    assert "local DP on the reports: everywhere" in sentence

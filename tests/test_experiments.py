"""The MOON-DPAP study helpers: configs, verdict rules, comparison tables."""

import pandas as pd
import pytest

from fedlib.experiments import moon_dpap as study


def test_config_for_applies_paper_setting_choices_and_profile():
    full = study.config_for("moon_dpap", "paper", seed=2)
    got = (full.algorithm, full.lr, full.batch_size, full.clients, full.rounds)
    assert got == ("moon_dpap", 0.005, 32, 20, 200)
    assert full.cosine_lr and full.prune and full.dropout > 0 and full.seed == 2
    quick = study.config_for("fedavg", "quick", clients=10)
    assert quick.algorithm == "fedavg" and not quick.prune and quick.clients == 10
    assert quick.rounds == 20 and quick.profile == "quick"
    quick.validate()
    for v in study.ABLATIONS.values():
        study.config_for("moon_dpap", "smoke", **v).validate()
    assert study.seeds_for("paper") == [0, 1, 2] and study.seeds_for("quick", 2) == [0, 1]


def test_numeric_verdict_rules():
    assert study.numeric_verdict(80.0, 79.0, 0.2, 3, "paper") == "reproduced"
    assert study.numeric_verdict(80.0, 75.0, 0.5, 3, "paper") == "not reproduced"
    assert study.numeric_verdict(80.0, 76.0, 2.5, 3, "paper") == "reproduced"  # within 2 std
    assert study.numeric_verdict(80.0, 80.0, 0.0, 1, "quick").startswith("not comparable")


def test_compare_table_and_claims():
    summary = pd.DataFrame({"acc_mean": [83.0, 70.0], "acc_std": [0.5, 0.5], "loss_mean": [0.45, 0.9],
                            "loss_std": [0.01, 0.02], "seeds": [3, 3]}, index=["full", "no_all_three"])
    t = study.compare_table(summary, study.PAPER["table2"], "paper")
    assert list(t["verdict"]) == ["reproduced", "not reproduced"]
    assert t.loc[0, "diff (pts)"] == pytest.approx(83.0 - 83.71)
    assert study.ordering_holds(summary, "full", "no_all_three")
    assert not study.close_to(summary, "full", "no_all_three")
    assert study.claim("x", True, "e")["verdict"] == "reproduced"
    assert study.claim("x", False, "e")["verdict"] == "not reproduced"


def test_choices_cover_the_unspecified_settings():
    named = " ".join(str(c[0]) for c in study.CHOICES)
    for setting in ("alpha", "clip", "delta", "epsilon_0", "tau", "mu", "T_min"):
        assert setting in named

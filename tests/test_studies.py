"""The DP-FL and FDL study modules: configs, calibration, fits and verdict logic."""

import math

import numpy as np
import pandas as pd
import pytest

from fedlib.config import ConfigError
from fedlib.experiments import dpfl, fdl


def test_dpfl_config_spends_the_target_epsilon():
    c = dpfl.config_for("quick", 1.0)
    assert c.algorithm == "dp_fedavg" and c.clients == 1000 and c.client_fraction == 0.1
    rdp = dpfl.true_epsilon(c, "rdp")
    assert rdp == pytest.approx(1.0, rel=2e-3)
    assert dpfl.true_epsilon(c, "pld") <= rdp  # PLD is tighter
    assert dpfl.true_epsilon(dpfl.config_for("quick", None)) == math.inf
    with pytest.raises(ConfigError):
        dpfl.scale("nonsense")


def test_compare_fits_prefers_the_true_model():
    eps = np.repeat(np.array(dpfl.EPSILONS), 3)
    rng = np.random.default_rng(0)
    acc = dpfl.sigmoid_model(eps, 10, 80, 0.0, 0.5) + rng.normal(0, 0.3, len(eps))
    fits = dpfl.compare_fits(pd.DataFrame({"epsilon": eps, "acc": acc}))
    logistic = fits.loc["logistic in log eps"]
    assert logistic["rmse"] < 0.6
    assert logistic["held_out_rmse"] < fits.iloc[0]["held_out_rmse"]
    assert np.allclose(logistic["params"][:2], [10, 80], atol=2)


def test_clipping_verdict():
    s = pd.Series({"fixed C = 0.1": 50.0, "fixed C = 1": 60.0, "fixed C = 10": 40.0, "adaptive": 62.0})
    v = dpfl.clipping_verdict(s)
    assert v["median"] == pytest.approx(100 * (62 - 50) / 50)
    assert v["best"] == pytest.approx(100 * 2 / 60) and v["verdict"] == "reproduced"
    assert dpfl.clipping_verdict(s.replace(62.0, 45.0))["verdict"] == "not reproduced"


def test_fdl_configs_and_published_privacy():
    c = fdl.config_for("fdl_corrected", "paper", partition="noniid", epsilon=0.25)
    got = (c.algorithm, c.fdl_mode, c.partition, c.ldp_epsilon, c.model)
    assert got == ("fdl", "corrected", "shards", 0.25, "mcmahan_cnn")
    assert fdl.config_for("noldp", "quick").algorithm == "fedavg"
    t = fdl.published_privacy(1000, 0.5).set_index("method")
    assert t.loc["LDP-FL"].iloc[1] == 500.0 and t.loc["FDL as published"].iloc[1] == math.inf
    assert t.loc["SignDS-FL"].iloc[1] == 0.5 and t.loc["FDL corrected"].iloc[1] == 0.5


def test_ledger_classes():
    from fedlib.ledger import classify

    assert classify("reproduced") == "reproduced"
    assert classify("reproduced (valid but loose): below the bound") == "reproduced"
    assert classify("reproduced in trend; peak not reproduced") == "partly"
    assert classify("partly: by less than 15 %") == "partly"
    assert classify("valid but loose") == "partly"
    assert classify("not reproduced: the overhead is much smaller") == "not reproduced"
    assert classify("not comparable at this profile") == "not testable as specified"
    assert classify("not reproducible as specified: no epsilon_0") == "not testable as specified"

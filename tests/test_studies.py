"""The study packages: configs per profile, calibration, fits, and the configs every page needs."""

import math

import numpy as np
import pandas as pd
import pytest

import studies
from fedlib.config import ConfigError
from studies.common import Scale, seeds_for
from studies.dpfl import pages as dpfl_pages
from studies.dpfl import settings as dpfl
from studies.fdl import pages as fdl_pages
from studies.fdl import settings as fdl
from studies.moon_dpap import settings as moon_dpap


def test_moon_dpap_config_applies_paper_setting_choices_and_profile():
    full = moon_dpap.config_for("moon_dpap", "paper", seed=2)
    assert (full.algorithm, full.lr, full.batch_size, full.clients, full.rounds) == (
        "moon_dpap",
        0.005,
        32,
        20,
        200,
    )
    assert full.cosine_lr and full.prune and full.dropout > 0 and full.seed == 2 and full.profile == "paper"
    quick = moon_dpap.config_for("fedavg", "quick", clients=10)
    assert quick.algorithm == "fedavg" and not quick.prune and quick.clients == 10
    assert (quick.rounds, quick.train_samples, quick.profile) == (20, 4_000, "quick")
    smoke = moon_dpap.config_for("moon_dpap", "smoke", clients=20).validate()
    assert smoke.clients == 4 and smoke.rounds == 2  # caps
    for v in moon_dpap.ABLATIONS.values():
        moon_dpap.config_for("moon_dpap", "smoke", **v).validate()
    assert seeds_for(moon_dpap.SCALES, "paper") == [0, 1, 2] and seeds_for(moon_dpap.SCALES, "quick", 2) == [
        0,
        1,
    ]
    with pytest.raises(ConfigError, match="unknown profile"):
        moon_dpap.config_for("fedavg", "huge")


def test_scale_sets_and_caps():
    s = Scale("x", seeds=2, overrides={"train_samples": 100}, caps={"rounds": 5})
    c = s.apply(moon_dpap.PAPER_SETTING, "quick")
    assert (c.train_samples, c.rounds, c.profile) == (100, 5, "quick")
    assert s.apply(moon_dpap.PAPER_SETTING.replace(rounds=3), "quick").rounds == 3  # below the cap: kept


def test_dpfl_config_spends_the_target_epsilon():
    from fedlib.privacy.accounting import rdp_epsilon

    c = dpfl.config_for("quick", 1.0)
    assert c.algorithm == "dp_fedavg" and c.clients == 1000 and c.client_fraction == 0.1
    spent = rdp_epsilon([c.dp_noise_multiplier] * c.rounds, c.dp_delta, q=c.client_fraction)
    assert 0.999 < spent <= 1.0  # z rounded up: never more than the target
    assert dpfl_pages.true_epsilon(c, "pld") <= spent  # PLD (continuous noise) is tighter
    assert dpfl_pages.true_epsilon(dpfl.config_for("quick", None)) == math.inf


def test_mia_config_is_calibrated_for_replacing_one_client():
    c = dpfl.mia_config("quick", 2.0)
    assert c.client_fraction == 1.0
    assert dpfl_pages.replace_one_epsilon(c) == pytest.approx(2.0, rel=1e-3)
    assert dpfl_pages.true_epsilon(c, "rdp") < 2.0  # add/remove spends less for the same noise


def test_compare_fits_prefers_the_true_model():
    eps = np.repeat(np.array(dpfl.EPSILONS), 3)
    rng = np.random.default_rng(0)
    acc = dpfl_pages.sigmoid_model(eps, 10, 80, 0.0, 0.5) + rng.normal(0, 0.3, len(eps))
    fits = dpfl_pages.compare_fits(pd.DataFrame({"epsilon": eps, "acc": acc}))
    logistic = fits.loc["logistic in log eps"]
    assert logistic["rmse"] < 0.6
    assert logistic["held_out_rmse"] < fits.iloc[0]["held_out_rmse"]
    assert np.allclose(logistic["params"][:2], [10, 80], atol=2)


def test_fdl_configs_and_published_privacy():
    c = fdl.config_for("fdl_corrected", "paper", partition="noniid", epsilon=0.25)
    got = (c.algorithm, c.fdl_mode, c.partition, c.fdl_epsilon_per_round, c.model)
    assert got == ("fdl", "corrected", "shards", 0.25, "mcmahan_cnn")
    assert fdl.config_for("ldp_fl", "quick", epsilon=0.1).ldp_fl_epsilon_per_coordinate == 0.1
    assert fdl.config_for("noldp", "quick").algorithm == "fedavg"
    t = fdl_pages.published_privacy(1000, 0.5).set_index("method")
    assert t.loc["LDP-FL"].iloc[1] == 500.0 and t.loc["FDL as published"].iloc[1] == math.inf
    assert t.loc["SignDS-FL"].iloc[1] == 0.5 and t.loc["FDL corrected"].iloc[1] == 0.5


def test_choices_cover_the_unspecified_settings():
    named = " ".join(str(c[0]) for c in moon_dpap.CHOICES)
    for setting in ("alpha", "clip", "delta", "epsilon_0", "tau", "mu", "T_min", "neighbouring"):
        assert setting in named


def test_every_page_lists_valid_configs_at_every_profile():
    for profile in ("smoke", "quick", "paper"):
        per_page = studies.configs(profile)
        assert set(per_page) == set(studies.pages())
        for page, cs in per_page.items():
            assert cs, page
            for c in cs:
                c.validate()
                assert c.profile == profile, page


def test_federation_sizes_hold_data_fixed_and_give_every_point_a_baseline():
    fs = dpfl_pages.federation_sizes("quick", 1)
    fixed = {n: cs[0].n_train for (v, n, e), cs in fs.items() if v == "same total data"}
    assert len(set(fixed.values())) == 1
    per_client = {n: cs[0].n_train / n for (v, n, e), cs in fs.items() if v == "60 images per client"}
    assert set(per_client.values()) == {60.0}
    for v, n, _ in fs:
        assert (v, n, None) in fs  # a non-private twin


def test_paired_round_times_align_the_variants_round_by_round():
    """The DP-cost page times its variants in turns; every variant gets one time per kept round."""
    from studies.dpfl import pages, settings

    cfg = settings.config_for("smoke", 1.0, 0).replace(rounds=3)
    times = pages.paired_round_times({"fedavg": cfg.replace(algorithm="fedavg"), "dp": cfg}, rounds=3)
    assert set(times) == {"fedavg", "dp"}
    assert len(times["fedavg"]) == len(times["dp"]) >= 1
    assert all(np.all(v > 0) for v in times.values())


def test_paper_profile_has_three_seeds_for_the_gpu_studies_and_keeps_dp_fl_s():
    assert seeds_for(fdl.SCALES, "paper") == [0, 1, 2] and "10 runs" in fdl.SCALES["paper"].description
    assert seeds_for(moon_dpap.SCALES, "paper") == [0, 1, 2] and len(seeds_for(dpfl.SCALES, "paper")) == 5
    per_page = studies.configs("paper", n_seeds=4)  # --seeds N
    # (the paper grid tunes on one chosen partition: a validation hold-out, not a seed of the study)
    assert {c.seed for cs in per_page.values() for c in cs if not c.validation_samples} == {0, 1, 2, 3}


def test_pages_use_every_further_seed_present_for_all_labels(tmp_path):
    from fedlib import Config
    from fedlib.results import result_path
    from studies.common import with_present_seeds

    a, b = Config(seed=0), Config(seed=0, lr=0.02)
    cs = {"a": [a], "b": [b]}
    for c in (a.replace(seed=1), b.replace(seed=1), a.replace(seed=2)):  # seed 2 only for "a"
        result_path(c, tmp_path).parent.mkdir(parents=True, exist_ok=True)
        result_path(c, tmp_path).write_text("{}")
    out = with_present_seeds(cs, [tmp_path])
    assert [c.seed for c in out["a"]] == [0, 1] and [c.seed for c in out["b"]] == [0, 1]  # still paired


def test_a_page_built_from_committed_results_only_never_trains(tmp_path, monkeypatch):
    from fedlib import Config
    from studies.common import MissingResults, run_all

    monkeypatch.setenv("FEDLIB_FORBID_TRAINING", "1")
    with pytest.raises(MissingResults, match="committed results only"):
        run_all({"x": [Config(profile="paper", rounds=1, clients=2, train_samples=100, test_samples=50)]})
    assert not list(tmp_path.rglob("*.json"))


def test_auto_profile_renders_each_page_at_the_largest_complete_profile(tmp_path, monkeypatch):
    from lab import notebooks as nbtool

    assert nbtool.paper_complete_pages(tmp_path) == set()  # nothing trained at paper there
    dpfl_done = {p for p in studies.pages() if p.startswith("dpfl_")}
    monkeypatch.setattr(nbtool, "paper_complete_pages", lambda root=None: dpfl_done | {"fdl_fig3"})
    got = nbtool.auto_profiles(["dpfl_claim1", "dpfl_claim4", "fdl_fig3", "fdl_privacy", "moon_dpap_fig1",
                                "ledger"])
    assert got == {"dpfl_claim1": "paper", "dpfl_claim4": "paper", "fdl_fig3": "paper",
                   "fdl_privacy": "quick", "moon_dpap_fig1": "quick", "ledger": "quick"}


def test_ledger_puts_paper_scale_rows_first_and_counts_by_profile():
    from studies import ledger

    df = pd.DataFrame({"paper": ["MOON-DPAP", "DP-FL analysis", "FDL", "DP-FL analysis"],
                       "profile": ["quick", "paper", "quick", "paper"], "claim": ["a", "b", "c", "d"]})
    out = ledger.paper_scale_first(df, ["MOON-DPAP", "FDL", "DP-FL analysis"])
    assert list(out["claim"]) == ["b", "d", "a", "c"]
    counts = ledger.counts_by_profile(df)
    assert list(counts.columns) == ["paper", "quick"] and counts.loc["DP-FL analysis", "paper"] == 2


def test_the_front_page_states_each_papers_reduction_from_the_configs():
    from studies import ledger

    moon = ledger.reduction("MOON-DPAP", "quick")
    assert moon.startswith("20 of 200 rounds, 4,000 of 60,000 training images"), moon
    assert "an MLP (784-100-10) instead of the CNN of McMahan et al." in ledger.reduction("FDL", "quick")
    dpfl = ledger.reduction("DP-FL analysis", "paper")
    assert dpfl.startswith("all 100 rounds, all 60,000 training images"), dpfl
    with pytest.raises(KeyError):
        ledger.reduction("another paper", "quick")


def test_tables_for_readers_have_no_raw_values():
    import math

    import pandas as pd

    from lab.browser_check import RAW_OUTPUT
    from studies.common import readable, table_for_reader

    df = pd.DataFrame({"epsilon": [1.0, math.inf], "acc_mean": [50.123, float("nan")],
                       "loss_mean": [0.5, math.inf], "true_eps_run": [math.inf, 2e6], "seeds": [3, 1],
                       "agree": [True, None]})
    out = readable(df)
    assert list(out.columns) == ["epsilon", "accuracy (%)", "final test loss", "true epsilon / run", "seeds",
                                 "agree"]
    assert out.iloc[1].tolist() == ["∞ (no guarantee)", "n/a", "diverged", "2 × 10⁶", "1", "n/a"]
    assert out.iloc[0].tolist() == ["1", "50.1", "0.5", "∞ (no guarantee)", "3", "yes"]
    html = table_for_reader(df).to_html()
    assert not RAW_OUTPUT.search(html.replace("<", " <")), RAW_OUTPUT.search(html)


def _clip_run(clip: float, accs: list[float], clips: list[float], norms: list[float], seed: int = 0,
              **changes):
    from fedlib.results import Result

    config = dpfl.config_for("smoke", 1.0, seed, dp_clip=clip, **changes)
    history = [{"round": t + 1, "test_acc": a, "test_loss": 1.0, "clip": c, "update_norm_median": n,
                "noise_norm": 10 * c}
               for t, (a, c, n) in enumerate(zip(accs, clips, norms, strict=True))]
    return Result(config, history)


def test_the_adaptive_clipping_paragraph_follows_the_runs():
    from studies.common import Runs

    fixed = {f"fixed C = {c:g}": [_clip_run(c, [0.5, a], [c, c], [1.0, 1.0])]
             for c, a in ((0.1, 0.7), (1.0, 0.5))}
    no_dp = {"no DP": [_clip_run(1e9, [0.5, 0.75], [1e9, 1e9], [1.0, 1.0])]}
    best = _clip_run(0.1, [0.3, 0.72], [0.1, 0.2], [0.5, 0.5], adaptive_clip=True, clip_quantile=0.1,
                     server_lr=0.4)
    tuned = {"adaptive γ = 0.1, server lr 0.4": [best]}
    default = _clip_run(0.1, [0.3, 0.8, 0.4], [0.1, 1.0, 9.0], [0.5, 2.0, 8.0], adaptive_clip=True)
    falling = Runs({**fixed, **no_dp, "adaptive": [default], **tuned})
    text = dpfl_pages.adaptive_clip_story(falling)
    # headroom: 15 % above the best fixed clip (70 %) is 80.5 %, above the 75 % without DP
    assert ("ends at 70.0 %; 15 % more is 80.5 %, above the accuracy of the same federation without DP "
            "(75.0 %)") in text
    assert "end at 40.0 % accuracy, below every fixed clip of the sweep (2 of 2)" in text
    assert "$C = 9$" in text and "above the largest fixed clip" in text
    assert "peaked at 80.0 % in round 2" in text and "from 0.5" in text and "to 8" in text
    assert "noise in the server's step from 1 to 90" in text
    assert "(γ = 0.1, server learning rate 0.4) ends at 72.0 %, above every fixed clip: +2.0 points" in text
    steady = Runs({**fixed, **no_dp, "adaptive": [_clip_run(0.1, [0.3, 0.6], [0.1, 0.5], [0.5, 0.5],
                                                            adaptive_clip=True)]})
    text = dpfl_pages.adaptive_clip_story(steady)
    assert "below 1 of the 2 fixed clips" in text and "within the swept range" in text
    assert "peaked" not in text and "of the 1 (γ = 0.5, server learning rate 1)" in text


def test_one_number_formatter_keeps_each_value():
    """The values issue 43 found changed by formatting: FDL's four r's, the settings' small
    values, claim 4's small sigmas, no-DP's epsilon, a mixed settings column."""
    from studies.numbers import column, number

    assert column([0.015, 0.012, 0.010, 0.008]) == ["0.015", "0.012", "0.010", "0.008"]
    assert [number(v) for v in (0.0005, 0.001, 1e-5, 3.2e-6)] == ["0.0005", "0.001", "1 × 10⁻⁵", "3.2 × 10⁻⁶"]
    assert column([0.0, 1e-5, 0.003, 0.01]) == ["0", "1 × 10⁻⁵", "0.003", "0.010"]
    assert number(float("inf"), privacy=True) == "∞ (no guarantee)" and number(0.0, privacy=True) == "0"
    assert column(["FashionMNIST", 0.0005, 20, 0.2]) == ["FashionMNIST", "0.0005", "20", "0.2"]
    big = [number(v) for v in (12345.678, 1.6e6, 83.64, 9.996, -0.25)]
    assert big == ["12,346", "1.6 × 10⁶", "83.6", "10", "-0.25"]
    assert column([55.08, 83.64, 7.2]) == ["55.1", "83.6", "7.2"]
    assert column([10.0, 0.5]) == ["10.0", "0.5"]  # decimals shared within a spread of 2,
    assert column([100.0, 0.0012]) == ["100", "0.0012"]  # not beyond it,
    assert column([0.1, 0.25, 7951.0, 79510.0]) == ["0.1", "0.25", "7,951", "79,510"]  # nor across decades
    assert number(True) == "yes" and number(None) == "n/a" and number(float("nan")) == "n/a"


def test_maths_names_read_as_symbols_and_code_names_as_code():
    """Issue 43: ``epsilon_0``, ``eta_min`` in a table or a verdict's reason read as ε₀, ηₘᵢₙ; a
    config key stays itself, set as code; maths for MathJax is left alone."""
    import pandas as pd

    from studies.common import table_for_reader
    from studies.ledger import show
    from studies.numbers import symbols

    assert symbols("DP at epsilon_0 = 1, tau_max -> tau_min") == "DP at ε₀ = 1, τₘₐₓ -> τₘᵢₙ"
    assert symbols("eta_g and sigma_b, n_i and z_t") == "η_g and σ_b, nᵢ and zₜ"
    untouched = "x_train, batch_size, $2 z_t C$, \\epsilon_0"
    assert symbols(untouched) == untouched
    table = pd.DataFrame({"setting": ["batch_size", "eta_min of eq. 1"], "value": [32, 0.0005]})
    html = table_for_reader(table).to_html()
    assert "<code>batch_size</code>" in html and "ηₘᵢₙ of eq. 1" in html and "0.0005" in html
    from studies import claims as c

    assert "ε₀ = 1" in show([c.Finding("DP at epsilon_0 = 1", "x", c.Verdict.REPRODUCED)]).data


def test_rows_about_our_code_or_reading_are_shown_and_counted_apart():
    """Issue 41: a row that measures this implementation, or holds only under the study's reading of
    an unspecified mechanism, keeps its verdict but is not evidence for or against the paper."""
    import pandas as pd

    from studies import claims as c
    from studies import ledger

    rows = [c.Finding("a", "x", c.Verdict.REPRODUCED), c.Finding("b", "y", c.Verdict.NOT_REPRODUCED),
            c.about(c.Finding("cost", "z", c.Verdict.PARTLY), c.IMPLEMENTATION),
            c.about(c.Finding("dp", "w", c.Verdict.NOT_REPRODUCED), c.our_reading("client-level, eps0 = 1"))]
    df = pd.DataFrame([{"paper": "P", "page": "p", **f.row(), "profile": "paper", "seeds": 3, "commit": "0"}
                       for f in rows])
    df["verdict"] = [c.Verdict(v) for v in df["verdict"]]
    counts = ledger.verdict_counts(df, ["P"]).iloc[0]
    assert counts["reproduced"] == 1 and counts["not reproduced"] == 1 and counts["partly"] == 0
    assert counts["total"] == 2 and counts["about our code or reading (apart)"] == 2
    line = ledger.bottom_line(df, "P")
    assert "Judged** 2 of 2 claims" in line and "2 more about our code or reading" in line
    assert "**Not reproduced**: b." in line  # the reading-dependent row is not listed against the paper
    table = ledger.claims_table(df, {})
    assert table.count("not counted as evidence about the paper") == 2 and "eps0 = 1" in table
    assert c.Finding("a", "x", c.Verdict.REPRODUCED).row()["scope"] == ""


def test_the_flower_pages_words_follow_its_table():
    """The DP row's agreement decides the sentence (the page once said the runs drift apart beside a
    table showing 0.0)."""
    import pandas as pd

    from studies import flower

    def table(dp_diff):
        return pd.DataFrame({"method": ["FedAvg", flower.DP_LABEL], "engine acc (%)": [65.3, 10.6],
                             "Flower acc (%)": [65.3, 10.6 + dp_diff],
                             "max |diff| same seed (pp)": [0.0, dp_diff]})

    same = flower.agreement_text(table(0.0))
    assert "at most 0.00 percentage points" in same and "agree here too" in same and "near the 10 %" in same
    apart = flower.agreement_text(table(2.5))
    assert "up to 2.5 points apart" in apart and "agree here too" not in apart


def test_the_frontier_pages_comparison_of_the_readings_follows_the_table():
    import pandas as pd

    from studies.moon_dpap import pages as mp

    def table(record):
        client = [8.0, 17.0, 29.0]
        return pd.DataFrame({"reading": ["client"] * 3 + ["record"] * 3, "epsilon": [1.0, 10.0, 30.0] * 2,
                             "acc_mean": client + record})

    mixed = mp.readings_compared(table([14.6, 14.9, 15.5]))
    assert "ahead at epsilon = 1 and behind at epsilon = 10, 30" in mixed
    assert "ahead at every budget" in mp.readings_compared(table([50.0, 60.0, 70.0]))
    assert "not ahead at any budget" in mp.readings_compared(table([5.0, 6.0, 7.0]))
    assert mp.run_label(("client", 3.0)) == "client-level, epsilon 3"
    assert mp.run_label(("client", 100.0, 0.5)) == "client-level, epsilon 100, C 0.5"


def test_names_from_the_code_are_set_as_code_and_maths_names_as_symbols():
    from studies.common import table_for_reader
    from studies.numbers import code_names

    assert code_names("cnn, mcmahan_cnn or mlp") == "cnn, <code>mcmahan_cnn</code> or mlp"
    assert code_names("FDL: as_published", markdown=True) == "FDL: `as_published`"
    assert code_names("DP at epsilon_0 = 1, tau_max -> tau_min") == "DP at ε₀ = 1, τₘₐₓ -> τₘᵢₙ"
    untouched = "$w_{local}$, `a_b`, data/x_y.json, f_g(x)"  # maths, code, a path, a call
    assert code_names(untouched) == untouched
    html = table_for_reader(pd.DataFrame({"name": ["delta_round"], "note": ["lr_min of the run"]}),
                            code=("name",)).to_html()
    assert "<code>delta_round</code>" in html and "<code>lr_min</code> of the run" in html


def test_a_claim_complete_at_paper_is_graded_there_while_its_page_renders_smaller(tmp_path, monkeypatch):
    """Issue 39: the campaign trains claims first, so a claim's runs can be complete at paper long before
    its page's; the page then grades that claim on them (marked with the profile and seeds) and the
    ledger counts it at paper, never at quick."""
    from fedlib.results import Result, result_path
    from studies import ledger
    from studies.claims import Finding, Verdict
    from studies.common import Runs
    from studies.fdl import claims as fdl_claims
    from studies.fdl import pages as fdl_pages
    from studies.settled import larger_profile_rows, settled_beyond

    monkeypatch.setenv("FEDLIB_RESULTS_DIR", str(tmp_path / "results"))
    assert settled_beyond("fdl_table1", "quick")[1] == []  # nothing committed here yet
    for c in fdl_pages.table1("paper")[0.010]:  # the three paper seeds of r = 0.010, as if trained
        history = [{"round": t + 1, "test_acc": 0.93 + 0.001 * c.seed, "test_loss": 0.2, "kept_frac": 0.3,
                    "sent_frac": 0.24, "bytes_up": 1000} for t in range(c.rounds)]
        result = Result(c, history, meta={"device": "cpu", "config_key": c.key(), "git_commit": "x",
                                          "torch": "x", "seed": c.seed, "duration_s": 1.0})
        result.save(result_path(c, tmp_path / "results"))
    runs, settled = settled_beyond("fdl_table1", "quick")
    assert list(runs.results) == [0.010] and settled == [fdl_claims.ACCURACY, fdl_pages.kept_claim(0.010),
                                                         fdl_pages.saving_claim(0.010)]
    assert settled_beyond("fdl_table1", "paper")[1] == []  # at paper the page's own findings stand
    rows = larger_profile_rows(runs, "r")
    assert rows.iloc[0]["profile"] == "paper" and rows.iloc[0]["seeds"] == 3
    assert abs(rows.iloc[0]["final accuracy (%)"] - 93.1) < 1e-9
    # a run without noise (epsilon infinity) is labelled as a reader reads it, not as Python prints it
    no_noise = Runs({("noldp", "iid", float("inf")): runs.results[0.010]})
    assert larger_profile_rows(no_noise, "runs").iloc[0]["runs"] == "FedAvg without LDP, iid, ∞"
    graded = fdl_claims.table1_settled(runs, settled)
    assert [f.profile for f in graded] == ["paper"] * 3 and graded[0].seeds == 3
    quick = [Finding(fdl_claims.ACCURACY, "60 %", Verdict.INCONCLUSIVE),
             Finding("other", "x", Verdict.PARTLY)]
    merged = ledger.upgrade(quick, graded[:1])
    assert merged[0] is graded[0] and merged[1] is quick[1]
    with pytest.raises(ValueError, match="not a claim of this page"):
        ledger.upgrade(quick[1:], graded[:1])
    # Fig. 4's IID run is Table 1's at r = 0.010: its convergence claim is settled by the same runs
    fig4_runs, fig4_settled = settled_beyond("fdl_fig4", "quick", epsilon=0.5)
    assert fig4_settled == [fdl_claims.CONVERGES]
    [converged] = fdl_claims.fig4_settled(fig4_runs, fig4_settled, 0.5)
    assert converged.verdict is Verdict.REPRODUCED and converged.profile == "paper"  # flat last rounds
    assert fdl_claims.fig4_settled(fig4_runs, [], 0.5) == []
    ledger.record("fdl_table1", merged, "quick", "FDL", seeds=3, root=tmp_path / "verdicts")
    table = ledger.collect(tmp_path / "verdicts")
    assert list(table["profile"]) == ["paper", "quick"] and list(table["seeds"]) == [3, 3]


def test_the_record_level_tuning_grid_never_reads_the_test_set(monkeypatch, tmp_path):
    """Issue 63: every grid run holds out a validation split of the training images and evaluates on
    it; the test split is never indexed (here it raises on any access) and the grid's runs train."""
    from fedlib import data as data_mod
    from fedlib.run import run
    from studies.moon_dpap import pages as mp

    class Untouchable:
        def __getattr__(self, name):
            raise AssertionError(f"the tuning grid read the test set ({name})")

        def __getitem__(self, i):
            raise AssertionError("the tuning grid read the test set")

    real = data_mod._raw_tensors

    def no_test(name, root):
        train, _ = real(name, root)
        return train, (Untouchable(), Untouchable())

    monkeypatch.setattr(data_mod, "_raw_tensors", no_test)
    grid = mp.record_grid("smoke")
    assert len(grid) == len(mp.RECORD_GRID["lr"]) * len(mp.RECORD_GRID["dp_clip"])
    for label, (cfg,) in grid.items():
        assert cfg.validation_samples > 0 and cfg.test_samples == 0 and label[0] == "grid"
    cfg = next(iter(grid.values()))[0].replace(rounds=1)
    result = run(cfg, root=tmp_path, progress=False, device="cpu")
    assert 0.0 <= result.final["test_acc"] <= 1.0
    with pytest.raises(AssertionError, match="read the test set"):
        data_mod.load(cfg.dataset, train_samples=cfg.train_samples, seed=0)  # a plain run would


@pytest.mark.heavy  # partitions the paper profile for several seeds (~20 s): make test-full
def test_the_paper_grid_runs_the_paper_horizon_on_a_validation_split_and_its_partition_is_the_noisiest():
    """Issue 74: the paper grid runs the paper profile's own 200-round schedule (its first rounds), never
    reads the test set (a hold-out of the training images instead), and trains on the first partition
    whose sigma is at least any paper seed's (sigma from the partition's smallest client)."""
    import torch

    from fedlib.algorithms.moon_dpap import record_noise_multiplier
    from fedlib.experiment import Experiment
    from studies.moon_dpap import pages as mp

    grid = mp.paper_grid("paper")
    assert len(grid) == len(moon_dpap.PAPER_GRID["lr"]) * len(moon_dpap.PAPER_GRID["dp_clip"])
    for label, (cfg,) in grid.items():
        assert label[0] == "paper grid" and cfg.profile == "paper" and cfg.rounds == 200
        assert cfg.train_rounds == moon_dpap.PAPER_GRID_ROUNDS and cfg.test_samples == 0
        assert cfg.validation_samples == moon_dpap.PAPER_VALIDATION and cfg.n_test == cfg.validation_samples
        assert cfg.noise_key() == cfg.replace(train_rounds=0).noise_key()  # the whole run's draws

    def sigma(cfg):
        exp = Experiment(cfg, torch.device("cpu"))
        return record_noise_multiplier(cfg, [len(p) for p in exp.parts])[0]

    cfg = next(iter(grid.values()))[0]
    paper_largest = max(sigma(mp.record_tuned("paper", s)) for s in range(3))
    seeds = [s for s in range(moon_dpap.PAPER_GRID_SEED + 1) if sigma(cfg.replace(seed=s)) >= paper_largest]
    assert seeds and seeds[0] == moon_dpap.PAPER_GRID_SEED


def test_the_stated_record_level_choice_is_the_committed_grids_best():
    """The tuned (lr, C) that the record-level runs use is the committed grid's highest validation
    accuracy: a stale choice (the grid rerun, the choice not updated) fails here."""
    from fedlib.results import REPO_ROOT, load_cached
    from studies.common import Runs
    from studies.moon_dpap import pages as mp
    from studies.moon_dpap import settings as ms

    root = REPO_ROOT / "data" / "results"
    found = {label: [load_cached(c, [root]) for c in cs] for label, cs in mp.record_grid("quick").items()}
    assert all(r is not None for rs in found.values() for r in rs), "the tuning grid must be committed"
    table = mp.grid_table(Runs(found))
    assert len(table) == len(ms.RECORD_GRID["lr"]) * len(ms.RECORD_GRID["dp_clip"])
    assert mp.grid_choice(table) == (ms.RECORD_TUNED["lr"], ms.RECORD_TUNED["dp_clip"])


def test_the_stated_paper_record_level_choice_is_the_committed_paper_grids_choice(monkeypatch):
    """Issue 74: the (lr, C) the record-level reading trains at ``paper`` is what the committed paper
    grid's rule picks (never collapsed, highest validation accuracy at its last round), and the quick
    grid's choice stays beside it at paper only."""
    from fedlib.results import REPO_ROOT
    from studies.moon_dpap import pages as mp
    from studies.moon_dpap import settings as ms

    monkeypatch.setenv("FEDLIB_RESULTS_DIR", str(REPO_ROOT / "data" / "results"))  # read, never written
    runs = mp.paper_grid_runs()
    assert len(runs.results) == len(ms.PAPER_GRID["lr"]) * len(ms.PAPER_GRID["dp_clip"]), (
        "the paper grid must be committed")
    choice = mp.paper_grid_choice(mp.paper_grid_table(runs))
    assert choice == (ms.RECORD_TUNED_PAPER["lr"], ms.RECORD_TUNED_PAPER["dp_clip"])
    for s in range(3):
        cfg = mp.record_tuned("paper", s)
        assert (cfg.lr, cfg.dp_clip) == choice and cfg.lr_min == cfg.lr / 10
    assert (mp.record_tuned("quick", 0).lr, mp.record_tuned("quick", 0).dp_clip) == (
        ms.RECORD_TUNED["lr"], ms.RECORD_TUNED["dp_clip"])
    assert mp.RECORD_QUICK_CHOICE_LABEL in mp.fig2("paper")
    assert mp.RECORD_QUICK_CHOICE_LABEL not in mp.fig2("quick")
    assert mp.record_dp("paper")["lr"] == choice[0]
    assert mp.quick_choice_at_paper().startswith("at the quick grid's choice (learning rate 0.2, C = 5)")


def test_the_per_client_sigma_variant_differs_from_one_sigma_only_in_its_sigma(monkeypatch):
    """Issue 74: the variant trains at the quick page's tuned setting and seeds, its runs and one sigma's
    differ in ``dp_sigma`` alone; the paper page reads them (it trains none); the table from the committed
    runs shows each client's epsilon at the budget under the variant and below it under one sigma."""
    from fedlib.results import REPO_ROOT
    from studies.common import committed_runs
    from studies.moon_dpap import pages as mp

    pc = mp.per_client_sigma("quick")
    assert pc == mp.per_client_sigma("paper")
    one, each = pc[mp.RECORD_TUNED_LABEL], pc[mp.RECORD_PER_CLIENT_LABEL]
    assert [c.replace(dp_sigma="one") for c in each] == one == mp.fig2("quick")[mp.RECORD_TUNED_LABEL]
    assert mp.RECORD_PER_CLIENT_LABEL in mp.fig2("quick")
    assert mp.RECORD_PER_CLIENT_LABEL not in mp.fig2("paper")
    monkeypatch.setenv("FEDLIB_RESULTS_DIR", str(REPO_ROOT / "data" / "results"))  # read, never written
    runs = committed_runs(pc)
    assert set(runs.results) == set(pc), "the per-client variant and its one-sigma runs must be committed"
    table = mp.per_client_sigma_table(runs).set_index("sigma")
    eps_one = table.loc["one sigma (the least protected client's)", "epsilon per client"]
    assert eps_one.endswith("-10") and not eps_one.startswith("10")
    assert table.loc["a sigma per client", "epsilon per client"] == "10"

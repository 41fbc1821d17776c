"""Algorithm-level checks: reductions to FedAvg, state updates, schedules, pruning."""

import math
import sys

import pytest
import torch

from fedlib import Config, run, schedules
from fedlib.algorithms import ALGORITHMS, RoundContext
from fedlib.engine import Executor
from fedlib.experiment import Experiment
from fedlib.pruning import apply_masks, sparse_bytes, sparsity, update_masks
from fedlib.run import load_model

SMALL = Config(clients=4, train_samples=600, test_samples=300, rounds=1, min_client_samples=20,
               lr=0.01, momentum=0.0)


def _one_round(cfg):
    exp = Experiment(cfg, torch.device("cpu"))
    with Executor("sequential", exp.algo, exp.data.x_train, exp.data.y_train) as ex:
        exp.round(0, ex)
    return exp


@pytest.mark.parametrize(("algorithm", "changes"), [("fedprox", {"prox_mu": 0.0}),
                                                    ("moon", {"moon_mu": 0.0}),
                                                    ("scaffold", {})])
def test_reduces_to_fedavg_on_round_one(algorithm, changes):
    ref = _one_round(SMALL)
    other = _one_round(SMALL.replace(algorithm=algorithm, **changes))
    for k, v in ref.gparams.items():  # MOON's projection head is extra; the rest must match
        torch.testing.assert_close(other.gparams[k], v, atol=1e-6, rtol=1e-5)


def test_scaffold_differs_from_fedavg_after_control_variates_form():
    cfg = SMALL.replace(rounds=2)
    cpu = torch.device("cpu")
    a, b = Experiment(cfg, cpu), Experiment(cfg.replace(algorithm="scaffold"), cpu)
    with Executor("sequential", a.algo, a.data.x_train, a.data.y_train) as ea, \
         Executor("sequential", b.algo, b.data.x_train, b.data.y_train) as eb:
        for t in range(2):
            a.round(t, ea)
            b.round(t, eb)
    assert any((b.server_state["c"][k] != 0).any() for k in b.server_state["c"])
    assert max((a.gparams[k] - b.gparams[k]).abs().max().item() for k in a.gparams) > 1e-6


def test_scaffold_control_variate_formula_uses_own_step_count():
    algo = ALGORITHMS["scaffold"](SMALL.replace(algorithm="scaffold"), torch.nn.Linear(1, 1))
    g = {"w": torch.tensor([1.0, 2.0])}
    ctx = RoundContext(0, g, {"lr": 0.1, "momentum": 0.0, "weight_decay": 0.0},
                       {"c": {"w": torch.tensor([0.5, -0.5])}})
    cstate = {"c_i": {"w": torch.tensor([0.25, 0.0])}}
    sstate = {"params": {"w": torch.tensor([0.0, 1.0])}, "steps": torch.tensor(4.0),
              "loss_sum": torch.tensor(0.0)}
    upload, new, _ = algo.client_final(sstate, cstate, ctx)
    expected = cstate["c_i"]["w"] - ctx.shared["c"]["w"] + (g["w"] - sstate["params"]["w"]) / (4 * 0.1)
    torch.testing.assert_close(new["c_i"]["w"], expected)
    torch.testing.assert_close(upload["delta_c"]["w"], expected - cstate["c_i"]["w"])


def test_feddyn_state_updates_match_formulas():
    cfg = SMALL.replace(algorithm="feddyn", clients=4, feddyn_alpha=0.1)
    algo = ALGORITHMS["feddyn"](cfg, torch.nn.Linear(1, 1))
    g = {"w": torch.tensor([1.0, -1.0])}
    ctx = RoundContext(0, g, {"lr": 0.1, "momentum": 0.0, "weight_decay": 0.0}, {})
    w_i = torch.tensor([[1.5, -1.0], [0.5, 0.0]])  # two participating clients
    g_old = {"g": {"w": torch.tensor([0.2, 0.3])}}
    up, new_state, _ = algo.client_final({"params": {"w": w_i[0]}, "steps": torch.tensor(3.0),
                                          "loss_sum": torch.tensor(0.0)}, g_old, ctx)
    torch.testing.assert_close(new_state["g"]["w"], g_old["g"]["w"] - 0.1 * (w_i[0] - g["w"]))
    h0 = {"h": {"w": torch.tensor([0.1, 0.1])}}
    deltas = {"delta": {"w": w_i - g["w"]}}
    new_w, new_s = algo.server_update(g, h0, deltas, torch.ones(2), ctx)
    h = h0["h"]["w"] - 0.1 / 4 * (w_i - g["w"]).sum(0)
    torch.testing.assert_close(new_s["h"]["w"], h)
    torch.testing.assert_close(new_w["w"], w_i.mean(0) - h / 0.1)


def test_schedules_at_start_middle_end():
    T = 100
    assert schedules.cosine_lr(0, T, 0.1, 0.01) == pytest.approx(0.1)
    assert schedules.cosine_lr(T // 2, T, 0.1, 0.01) == pytest.approx(0.055)
    assert schedules.cosine_lr(T, T, 0.1, 0.01) == pytest.approx(0.01)
    s = schedules.ramp_slope(0.5, 0.1, T, 0.5)
    assert [schedules.linear_down(t, 0.5, 0.1, s) for t in (0, T // 4, T // 2, T)] == pytest.approx(
        [0.5, 0.3, 0.1, 0.1])
    s = schedules.ramp_slope(0.01, 0.05, T, 0.5)
    assert [schedules.linear_up(t, 0.01, 0.05, s) for t in (0, T // 4, T // 2, T)] == pytest.approx(
        [0.01, 0.03, 0.05, 0.05])
    assert schedules.epsilon_schedule(0, T, 2.0) == pytest.approx(2.0)
    assert schedules.epsilon_schedule(T // 2, T, 2.0) == pytest.approx(1.0)
    assert schedules.epsilon_schedule(T - 1, T, 2.0) == pytest.approx(2.0 / T)  # eq. 5 stays > 0
    assert schedules.epsilon_schedule(T, T, 2.0) == pytest.approx(2.0 / T)  # never 0 (our floor)
    assert schedules.epsilon_schedule(T - 1, T, 2.0, floor=0.2) == pytest.approx(0.4)
    assert schedules.pruning_threshold(0, T, 0.001, 0.01) == pytest.approx(0.001)
    assert schedules.pruning_threshold(T // 2, T, 0.001, 0.01) == pytest.approx(0.0055)
    assert schedules.pruning_threshold(T, T, 0.001, 0.01) == pytest.approx(0.01)


def test_pruning_masks_keep_the_fraction_they_claim():
    g = torch.Generator().manual_seed(0)
    params = {"fc.weight": torch.randn(100, 100, generator=g), "fc.bias": torch.randn(100, generator=g)}
    masks = {k: torch.ones_like(v) for k, v in params.items()}
    thr = 0.6744897501960817  # the median of |N(0, 1)|
    new = update_masks(params, masks, thr)
    kept = new["fc.weight"].mean().item()
    assert kept == pytest.approx(0.5, abs=0.02)
    assert new["fc.bias"].all()  # biases are never pruned
    assert sparsity(new, params) == pytest.approx((1 - kept) * 10_000 / 10_100)
    pruned = apply_masks(params, new)
    assert (pruned["fc.weight"][new["fc.weight"] == 0] == 0).all()
    again = update_masks({k: v * 0 + 10 for k, v in params.items()}, new, thr)
    assert torch.equal(again["fc.weight"], new["fc.weight"])  # cumulative: no regrowth
    assert sparse_bytes(new) == (10_100 + 7) // 8 + 4 * int(sum(m.sum() for m in new.values()))


def test_pruned_weights_stay_zero_after_aggregation(tmp_path):
    cfg = SMALL.replace(algorithm="moon_dpap", rounds=3, prune=True, prune_t_min=0.005,
                        prune_t_max=0.03)
    r = run(cfg, root=tmp_path, progress=False, engine="sequential")
    spars = [h["sparsity"] for h in r.history]
    assert spars == sorted(spars) and spars[-1] > 0.05
    _, params = load_model(r, tmp_path)
    n_zero = sum((v == 0).sum().item() for k, v in params.items() if k.endswith("weight") and v.dim() > 1)
    total = sum(v.numel() for v in params.values())
    assert n_zero / total == pytest.approx(spars[-1], abs=1e-6)
    assert r.history[-1]["bytes_up"] < r.history[0]["bytes_down"]  # sparse uploads are smaller


def test_ditto_reports_personal_accuracy(tmp_path):
    r = run(SMALL.replace(algorithm="ditto", rounds=2), root=tmp_path, progress=False)
    assert 0 <= r.final["personal_acc"] <= 1


def test_moon_dpap_schedules_recorded(tmp_path):
    cfg = SMALL.replace(algorithm="moon_dpap", rounds=4, cosine_lr=True, lr_min=0.001)
    r = run(cfg, root=tmp_path, progress=False)
    lrs = [h["lr"] for h in r.history]
    assert lrs[0] == pytest.approx(0.01) and lrs == sorted(lrs, reverse=True)
    taus = [h["tau"] for h in r.history]
    mus = [h["mu"] for h in r.history]
    assert taus == sorted(taus, reverse=True) and mus == sorted(mus)
    assert math.isclose(taus[-1], cfg.tau_min) and math.isclose(mus[-1], cfg.mu_max)


def test_all_algorithms_registered():
    assert set(ALGORITHMS) >= {"fedavg", "fedprox", "scaffold", "feddyn", "moon", "ditto", "moon_dpap"}
    for name, cls in ALGORITHMS.items():
        doc = sys.modules[cls.__module__].__doc__ or ""
        assert cls.name == name and ("(" in doc and "20" in doc), f"{name}: cite the paper"


@pytest.mark.parametrize("momentum,weight_decay", [(0.0, 0.0), (0.9, 0.0), (0.9, 0.01), (0.0, 0.01)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_in_place_sgd_update_is_the_pure_one_bit_for_bit(momentum, weight_decay, dtype):
    """Issue 75: the CPU paths update a client's model in place (no allocation per step); the same
    operations in the same order, so the same bits as the pure update the vectorized path uses."""
    from fedlib.algorithms.base import sgd_update

    g = torch.Generator().manual_seed(0)
    shapes = {"w": (128, 3200), "b": (128,), "c": (16, 1, 3, 3)}

    def fresh():
        return {k: torch.randn(s, generator=g, dtype=dtype) for k, s in shapes.items()}

    params, mom, grads = fresh(), fresh(), fresh()
    pure_p, pure_m = sgd_update(params, mom, grads, 0.005, momentum, weight_decay)
    copies = [{k: v.clone() for k, v in t.items()} for t in (params, mom, grads)]
    in_p, in_m = sgd_update(*copies, 0.005, momentum, weight_decay, in_place=True)
    for k in shapes:
        assert torch.equal(in_p[k], pure_p[k]) and torch.equal(in_m[k], pure_m[k]), k
        assert in_p[k] is copies[0][k]  # written where it was


def test_a_smoke_batch_trains_the_same_model_files_with_the_in_place_update(tmp_path, monkeypatch):
    """Issue 75: the in-place update changes no result: a smoke batch (momentum and weight decay,
    SCAFFOLD's correction, MOON-DPAP with record-level DP-SGD) gives byte-identical model files on the
    sequential and parallel paths with it and with the pure update."""
    from fedlib import Config, run
    from fedlib.algorithms import base
    from fedlib.results import model_path
    from studies.moon_dpap.pages import tuned_dp
    from studies.moon_dpap.settings import config_for

    configs = [Config(clients=4, train_samples=400, test_samples=100, rounds=2, profile="smoke",
                      weight_decay=0.01),
               Config(clients=4, train_samples=400, test_samples=100, rounds=2, profile="smoke",
                      algorithm="scaffold"),
               config_for("moon_dpap", "smoke", 0, **tuned_dp(0.05, 1.0)).replace(rounds=1)]
    pure = base.sgd_update
    for engine in ("sequential", "parallel"):
        for c in configs:
            run(c, root=tmp_path / "in_place" / engine, engine=engine, progress=False)
        with monkeypatch.context() as m:
            m.setattr(base, "sgd_update", lambda *a, in_place=False, **k: pure(*a, **k))
            for c in configs:
                run(c, root=tmp_path / "pure" / engine, engine=engine, progress=False)
        for c in configs:
            a = model_path(c, tmp_path / "in_place" / engine).read_bytes()
            assert a == model_path(c, tmp_path / "pure" / engine).read_bytes(), (engine, c.algorithm)

"""The two engine paths compute the same thing; FedAvg with one client is plain SGD."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fedlib import Config, run
from fedlib.engine import Executor, balance, make_plan
from fedlib.run import Experiment, evaluate, load_model

SMALL = Config(clients=4, train_samples=600, test_samples=300, rounds=3, batch_size=32,
               lr=0.05, momentum=0.9, weight_decay=1e-4, alpha=0.5, min_client_samples=20)


def test_fedavg_one_client_equals_plain_sgd():
    cfg = SMALL.replace(clients=1, partition="iid", local_epochs=2, rounds=1)
    exp = Experiment(cfg, torch.device("cpu"))
    model = exp.model
    model.load_state_dict(exp.gparams, strict=False)
    opt = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum,
                          weight_decay=cfg.weight_decay)
    plan = make_plan(exp.parts, [0], batch_size=cfg.batch_size, epochs=cfg.local_epochs,
                     seed=cfg.seed, round_=0, device=torch.device("cpu"))
    x, y = exp.data.x_train, exp.data.y_train
    for s in range(plan.steps[0]):
        ids = plan.idx[0, s][plan.weight[0, s] > 0]  # the real (unpadded) samples
        opt.zero_grad()
        F.cross_entropy(model(x[ids]), y[ids]).backward()
        opt.step()
    assert plan.steps[0] == 2 * int(np.ceil(len(exp.parts[0]) / cfg.batch_size))
    with Executor("sequential", exp.algo, x, y) as ex:
        exp.round(0, ex)
    for name, p in model.named_parameters():
        torch.testing.assert_close(exp.gparams[name], p.detach(), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize(("other", "dropout"), [("vectorized", 0.0), ("vectorized", 0.3),
                                                ("parallel", 0.3)])
def test_sequential_equals_other_paths_after_several_rounds(tmp_path, other, dropout):
    # lr 0.01: at large effective step sizes (lr 0.05, momentum 0.9) rounding differences
    # between the paths (8e-7 after one round) are amplified chaotically round after round.
    cfg = SMALL.replace(dropout=dropout, client_fraction=0.75, lr=0.01)
    r_seq = run(cfg, engine="sequential", root=tmp_path / "seq", progress=False)
    r_vec = run(cfg, engine=other, root=tmp_path / "vec", progress=False)
    _, p_seq = load_model(r_seq, tmp_path / "seq")
    _, p_vec = load_model(r_vec, tmp_path / "vec")
    for k in p_seq:
        torch.testing.assert_close(p_seq[k], p_vec[k], atol=5e-5, rtol=1e-3)
    assert r_seq.meta["engine"] == "sequential" and r_vec.meta["engine"] == other
    assert abs(r_seq.final["test_acc"] - r_vec.final["test_acc"]) < 0.01


def test_unequal_clients_each_see_their_samples_once():
    parts = [np.arange(0, 70), np.arange(70, 75), np.arange(75, 200)]
    plan = make_plan(parts, [0, 1, 2], batch_size=32, epochs=1, seed=0, round_=0,
                     device=torch.device("cpu"))
    assert plan.steps == [3, 1, 4]
    for i, p in enumerate(parts):
        seen = plan.idx[i][plan.weight[i] > 0].numpy()
        assert np.array_equal(np.sort(seen), p)
    assert plan.active.sum().item() == sum(plan.steps)


def test_evaluate_matches_module():
    exp = Experiment(SMALL, torch.device("cpu"))
    exp.model.load_state_dict(exp.gparams, strict=False)
    acc, loss = evaluate(exp.model, exp.gparams, exp.data.x_test, exp.data.y_test, batch_size=128)
    with torch.no_grad():
        logits = exp.model(exp.data.x_test)
    assert acc == pytest.approx((logits.argmax(1) == exp.data.y_test).float().mean().item())
    assert loss == pytest.approx(F.cross_entropy(logits, exp.data.y_test).item(), rel=1e-5)


def test_balance_assigns_every_client_once():
    steps = [5, 1, 9, 3, 3, 7]
    groups = balance(steps, 2)
    assert sorted(i for g in groups for i in g) == list(range(6))
    loads = [sum(steps[i] for i in g) for g in groups]
    assert max(loads) - min(loads) <= max(steps)
    assert balance([4], 3) == [[0]]


def test_bfloat16_forward_trains_in_float32_and_changes_the_numbers():
    cfg = SMALL.replace(rounds=1, lr=0.01)
    exp32 = Experiment(cfg, torch.device("cpu"))
    exp16 = Experiment(cfg.replace(precision="bfloat16"), torch.device("cpu"))
    batch = {"x": exp16.data.x_train[:8]}
    logits16 = exp16.algo.forward(exp16.gparams, batch)
    logits32 = exp32.algo.forward(exp32.gparams, batch)
    assert logits16.dtype == torch.float32  # autocast's bf16 output cast back
    torch.testing.assert_close(logits16, logits32, atol=0.05, rtol=0.05)
    assert not torch.equal(logits16, logits32)  # the option really changes the arithmetic
    for exp in (exp32, exp16):
        with Executor("sequential", exp.algo, exp.data.x_train, exp.data.y_train) as ex:
            exp.round(0, ex)
    for k, p in exp16.gparams.items():
        assert p.dtype == torch.float32
        torch.testing.assert_close(p, exp32.gparams[k], atol=2e-3, rtol=0.05)


@pytest.mark.parametrize("other", ["vectorized", "parallel"])
def test_bfloat16_paths_agree_to_bfloat16_tolerance(tmp_path, other):
    cfg = SMALL.replace(precision="bfloat16", lr=0.01, rounds=2)
    r_seq = run(cfg, engine="sequential", root=tmp_path / "seq", progress=False)
    r_oth = run(cfg, engine=other, root=tmp_path / "oth", progress=False)
    _, p_seq = load_model(r_seq, tmp_path / "seq")
    _, p_oth = load_model(r_oth, tmp_path / "oth")
    for k in p_seq:
        torch.testing.assert_close(p_seq[k], p_oth[k], atol=2e-3, rtol=0.05)

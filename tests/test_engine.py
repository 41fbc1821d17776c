"""The engine paths compute the same function; lanes and run batches change nothing but speed.

Tolerances. Logic is checked in float64 (``precision="float64"``): there the paths differ only by
the order of floating-point sums (batched vs single convolutions, vmap), about 1e-16 relative
per operation. A few rounds of SGD amplify such differences: in float32 similar settings have
been seen to differ by up to 1.2e-4 between two CPU machines, an amplification of ~2e3 over
float32's 6e-8 rounding, so in float64 up to ~2e-13 is to be expected (measured here: 5e-17).
``ATOL64 = 1e-11`` leaves a 50x margin over that bound and is far below what a logic difference
produces (a learning rate rounded to float32 in the run batch showed as 1.6e-9; a wrong step or
mask shows as 1e-3 or more). The float32 checks derive their tolerance from the
measured float32 error of the reference path itself (against float64), so they hold wherever
float32 rounds differently (other CPUs, TF32 convolutions on CUDA).
"""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fedlib import Config, run
from fedlib import engine as engine_mod
from fedlib.engine import Executor, balance, lane_count, make_plan, pack_lanes
from fedlib.experiment import Experiment, evaluate
from fedlib.run import batch_key, load_model, run_many

SMALL = Config(clients=4, train_samples=600, test_samples=300, rounds=3, batch_size=32,
               lr=0.05, momentum=0.9, weight_decay=1e-4, alpha=0.5, min_client_samples=20)
F64 = SMALL.replace(precision="float64")
ATOL64 = 1e-11


def _params(result, root):
    return load_model(result, root)[1]


def _max_diff(a: dict, b: dict) -> float:
    return max((a[k].double() - b[k].double()).abs().max().item() for k in a)


def test_fedavg_one_client_equals_plain_sgd():
    """In float64, one FedAvg client is exactly ``torch.optim.SGD`` on the same minibatches."""
    cfg = F64.replace(clients=1, partition="iid", local_epochs=2, rounds=1)
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
        assert p.dtype == torch.float64
        torch.testing.assert_close(exp.gparams[name], p.detach(), atol=ATOL64, rtol=0)


# fedavg and moon_dpap (the plainest and the fullest) in make test; the other four (~40 s) in test-full
_HEAVY = pytest.mark.heavy


@pytest.mark.parametrize(("algorithm", "changes"), [
    ("fedavg", {"dropout": 0.3}), pytest.param("scaffold", {}, marks=_HEAVY),
    pytest.param("moon", {"dropout": 0.3}, marks=_HEAVY), pytest.param("ditto", {}, marks=_HEAVY),
    pytest.param("feddyn", {}, marks=_HEAVY),
    ("moon_dpap", {"cosine_lr": True, "prune": True, "dropout": 0.2, "dp": "central",
                   "dp_epsilon_per_round": 50.0, "dp_clip": 1.0, "client_fraction": 1.0})])
def test_paths_and_lanes_agree_in_float64(tmp_path, restore_kernels, algorithm, changes):
    """Every path and lane layout, and the vectorized path with its convolutions as batched matrix
    multiplies (``lane_conv="im2col"``, issue 37 item 4), trains the sequential reference's model."""
    from fedlib.kernels import set_kernel_options

    cfg = F64.replace(algorithm=algorithm, client_fraction=0.75, lr=0.02, rounds=2, train_samples=320,
                      test_samples=100, min_client_samples=10).replace(**changes)
    ref = run(cfg, engine="sequential", root=tmp_path / "seq", progress=False, device="cpu")
    p_ref = _params(ref, tmp_path / "seq")
    cases = [("vectorized", "auto", "grouped"), ("vectorized", "clients", "grouped"),
             ("parallel", "auto", "grouped"), ("vectorized", "auto", "im2col")]
    for path, lanes, conv in cases:
        set_kernel_options(lane_conv=conv)
        root = tmp_path / f"{path}-{lanes}"
        exp = Experiment(cfg, torch.device("cpu"))
        with Executor(path, exp.algo, exp.data.x_train, exp.data.y_train, workers=2, lanes=lanes) as ex:
            for t in range(cfg.rounds):
                exp.round(t, ex)
        assert _max_diff(p_ref, exp.gparams) < ATOL64, (path, lanes, conv)
        del root


LOCAL_DP = {
    "ldp_fl": {"model": "mlp"},
    "signds_fl": {"model": "mlp", "signds_h": 50},
    "fdl": {"model": "mlp", "fdl_r": 0.2},
    "fdl_corrected": {"algorithm": "fdl", "model": "mlp", "fdl_mode": "corrected", "fdl_k": 200},
    "moon_dpap_local": {"algorithm": "moon_dpap", "dp": "local", "prune": True, "dp_epsilon_per_round": 8.0,
                        "client_fraction": 1.0},
}


# MOON-DPAP's local reading (~15 s; its noise draws are also checked in test_noise_independence) in
# test-full, the four local-DP algorithms in make test
@pytest.mark.parametrize("case", [pytest.param(k, marks=pytest.mark.heavy) if k == "moon_dpap_local" else k
                                  for k in sorted(LOCAL_DP)])
def test_local_randomisers_draw_the_same_noise_on_every_path(tmp_path, case):
    """Each client randomises its own upload with generators keyed on (config, round, client): the
    sequential loop, the parallel workers and the vectorized path (after its vmapped steps) release
    the same messages, so the global models agree as for the noise-free algorithms. The noise is
    large against float64 rounding, so a client drawing another client's (or another round's)
    noise would show as a difference of order 1e-3 or more."""
    changes = {"client_fraction": 0.75, **LOCAL_DP[case]}
    cfg = F64.replace(algorithm=changes.pop("algorithm", case), lr=0.02, rounds=2,
                      train_samples=320, test_samples=100, min_client_samples=10, **changes)
    ref = run(cfg, engine="sequential", root=tmp_path / "seq", progress=False, device="cpu")
    p_ref = _params(ref, tmp_path / "seq")
    for path in ("vectorized", "parallel"):
        r = run(cfg, engine=path, root=tmp_path / path, progress=False, device="cpu")
        assert _max_diff(p_ref, _params(r, tmp_path / path)) < ATOL64, path
        assert [h.get("sent_frac") for h in r.history] == [h.get("sent_frac") for h in ref.history]


@pytest.mark.parametrize("case", [pytest.param("moon_dpap_central", marks=pytest.mark.e2e), "ldp_fl"])
def test_spawned_workers_release_what_forked_ones_do(tmp_path, monkeypatch, case):
    """Where a GPU is visible the parallel path spawns its workers instead of forking them (a fork
    after any backward pass breaks autograd there: :func:`fedlib.engine.worker_start_method`).
    Spawned workers receive the algorithm and the data pickled and must release the same bits,
    noise included (central and local DP)."""
    changes = {"moon_dpap_central": {"algorithm": "moon_dpap", "dp": "central", "dp_epsilon_per_round": 50.0,
                                     "dp_clip": 1.0, "client_fraction": 1.0},
               "ldp_fl": {"algorithm": "ldp_fl", "model": "mlp", "client_fraction": 0.75}}[case]
    cfg = SMALL.replace(rounds=2, train_samples=320, test_samples=100, min_client_samples=10, **changes)
    forked = run(cfg, engine="parallel", root=tmp_path / "fork", progress=False, device="cpu")
    monkeypatch.setattr(engine_mod, "worker_start_method", lambda: "spawn")
    spawned = run(cfg, engine="parallel", root=tmp_path / "spawn", progress=False, device="cpu")
    a, b = _params(forked, tmp_path / "fork"), _params(spawned, tmp_path / "spawn")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_workers_are_spawned_where_a_gpu_is_visible(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert engine_mod.worker_start_method() == "spawn"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert engine_mod.worker_start_method() == "fork"


@pytest.mark.parametrize("engine", ["vectorized", "parallel"])
def test_run_batch_of_local_dp_runs_releases_with_each_runs_own_budget(tmp_path, engine):
    """Runs of one run batch differ in their budgets and noise keys: each client releases with its
    own run's mechanism (in the parallel workers too), as when the run is trained alone."""
    base = F64.replace(algorithm="ldp_fl", model="mlp", rounds=2, lr=0.02, train_samples=320,
                       test_samples=100, min_client_samples=10)
    cfgs = [base, base.replace(ldp_fl_epsilon_per_coordinate=2.0), base.replace(seed=1, ldp_clip=0.05)]
    batch = run_many(cfgs, engine=engine, root=tmp_path / "batch", progress=False, device="cpu")
    for c, r in zip(cfgs, batch, strict=True):
        alone = run(c, engine="sequential", root=tmp_path / "alone", progress=False, device="cpu")
        assert _max_diff(_params(alone, tmp_path / "alone"), _params(r, tmp_path / "batch")) < ATOL64


# the counter noise (every lane at its own std in one draw) in make test; the generator noise in test-full
@pytest.mark.parametrize("step_noise", [pytest.param("generator", marks=pytest.mark.heavy), "counter"])
def test_run_batch_of_dp_sgd_runs_adds_each_runs_own_step_noise(tmp_path, restore_kernels, step_noise):
    """Record-level DP-SGD runs with other seeds and budgets in one vectorized run batch: every
    lane adds its own run's and client's noise at its own std (``counter``: all lanes of a step in
    one draw, each with its run's key), as when the run is trained alone."""
    from fedlib.kernels import set_kernel_options

    set_kernel_options(step_noise=step_noise)
    base = F64.replace(algorithm="moon_dpap", model="mlp", rounds=2, lr=0.02, train_samples=320,
                       test_samples=100, min_client_samples=10, dp="record", dp_schedule="constant",
                       dp_epsilon_total=8.0, dp_clip=1.0, client_fraction=1.0)
    cfgs = [base, base.replace(seed=1, dp_epsilon_total=4.0)]
    batch = run_many(cfgs, engine="vectorized", root=tmp_path / "batch", progress=False, device="cpu")
    for c, r in zip(cfgs, batch, strict=True):
        alone = run(c, engine="sequential", root=tmp_path / "alone", progress=False, device="cpu")
        assert _max_diff(_params(alone, tmp_path / "alone"), _params(r, tmp_path / "batch")) < ATOL64


def test_float32_paths_agree_within_float32_error_of_the_reference(tmp_path):
    """The vectorized and parallel paths in float32 are no further from the float64 result than
    a few times the reference (sequential) path's own float32 error."""
    cfg = SMALL.replace(dropout=0.3, client_fraction=0.75, lr=0.01)
    p64 = _params(run(cfg.replace(precision="float64"), engine="sequential", root=tmp_path / "64",
                      progress=False, device="cpu"), tmp_path / "64")
    p_seq = _params(run(cfg, engine="sequential", root=tmp_path / "seq", progress=False, device="cpu"),
                    tmp_path / "seq")
    own_error = _max_diff(p64, p_seq)
    assert 0 < own_error < 1e-3  # float32 rounding: present, and small
    for other in ("vectorized", "parallel"):
        r = run(cfg, engine=other, root=tmp_path / other, progress=False, device="cpu")
        assert r.meta["engine"] == other
        assert _max_diff(p64, _params(r, tmp_path / other)) <= 4 * own_error + 1e-7, other


def test_unequal_clients_each_see_their_samples_once():
    parts = [np.arange(0, 70), np.arange(70, 75), np.arange(75, 200)]
    plan = make_plan(parts, [0, 1, 2], batch_size=32, epochs=1, seed=0, round_=0,
                     device=torch.device("cpu"))
    assert plan.steps == [3, 1, 4]
    for i, p in enumerate(parts):
        seen = plan.idx[i][plan.weight[i] > 0].numpy()
        assert np.array_equal(np.sort(seen), p)
    assert plan.active.sum().item() == sum(plan.steps)


def test_lanes_hold_every_client_step_once_and_cut_the_padding():
    parts = [np.arange(n) for n in (320, 32, 64, 96, 288, 32, 32, 160)]  # steps 10 1 2 3 9 1 1 5
    plan = make_plan(parts, list(range(8)), batch_size=32, epochs=1, seed=0, round_=0,
                     device=torch.device("cpu"))
    assert lane_count(plan.steps, "clients") == 8
    lanes = lane_count(plan.steps, "auto")
    assert lanes == 4  # ceil(32 / 10)
    lp = pack_lanes([plan], "auto")
    assert lp.lanes == lanes and lp.length == max(plan.steps)  # no longer than the longest client
    for r, k in enumerate(plan.steps):
        where = np.argwhere(lp.row == r)
        assert len(where) == k and len(set(where[:, 0])) == 1  # one lane, k consecutive steps
        lane, first = where[0]
        assert np.array_equal(lp.idx[lane, first:first + k].numpy(), plan.idx[r, :k].numpy())
    padded = (lp.row < 0).sum() / lp.row.size
    full = 1 - sum(plan.steps) / (len(plan.steps) * max(plan.steps))
    assert padded < 0.25 < full  # 20 % padding instead of 60 %
    with pytest.raises(ValueError, match="lanes"):
        lane_count([1, 2], "many")


def test_balance_assigns_every_client_once():
    steps = [5, 1, 9, 3, 3, 7]
    groups = balance(steps, 2)
    assert sorted(i for g in groups for i in g) == list(range(6))
    loads = [sum(steps[i] for i in g) for g in groups]
    assert max(loads) - min(loads) <= max(steps)
    assert balance([4], 3) == [[0]]


# the vectorized batch in make test; the sequential one (~9 s) in test-full
@pytest.mark.parametrize("engine", ["vectorized", pytest.param("sequential", marks=pytest.mark.heavy)])
def test_run_batch_equals_each_run_alone(tmp_path, engine):
    """Three runs (two seeds, and a third with another learning rate and Dirichlet alpha)
    trained as one run batch write the same results as each trained alone."""
    base = F64.replace(algorithm="scaffold", rounds=2, lr=0.02, train_samples=320, test_samples=100,
                       min_client_samples=10)
    cfgs = [base, base.replace(seed=1), base.replace(lr=0.03, alpha=1.0, seed=2)]
    assert len({batch_key(c) for c in cfgs}) == 1
    batch = run_many(cfgs, engine=engine, root=tmp_path / "batch", progress=False, device="cpu")
    for c, r in zip(cfgs, batch, strict=True):
        assert r.config == c and r.meta["run_batch"] == [x.key() for x in cfgs]
        alone = run(c, engine="sequential", root=tmp_path / "alone", progress=False, device="cpu")
        assert _max_diff(_params(alone, tmp_path / "alone"), _params(r, tmp_path / "batch")) < ATOL64
        assert [h["train_loss"] for h in r.history] == pytest.approx([h["train_loss"] for h in alone.history])
    # all cached now
    again = run_many(cfgs, engine=engine, root=tmp_path / "batch", progress=False, device="cpu")
    assert [a.history for a in again] == [b.history for b in batch]


def test_run_batch_refuses_configs_of_another_shape(tmp_path):
    a = SMALL.replace(rounds=1)
    with pytest.raises(ValueError, match="batch_size"):
        run_many([a, a.replace(batch_size=16)], root=tmp_path, progress=False, device="cpu")
    assert not list(tmp_path.rglob("*.json"))  # refused before any work


def test_parallel_path_on_a_gpu_is_refused_before_any_work(tmp_path):
    from fedlib.engine import check_path

    with pytest.raises(ValueError, match="parallel path runs on the CPU"):
        check_path("parallel", torch.device("cuda"))
    with pytest.raises(ValueError, match="unknown engine"):
        run(SMALL, engine="warp", root=tmp_path, progress=False, device="cpu")


def test_evaluate_matches_module():
    exp = Experiment(SMALL, torch.device("cpu"))
    exp.model.load_state_dict(exp.gparams, strict=False)
    acc, loss = evaluate(exp.model, exp.gparams, exp.data.x_test, exp.data.y_test, batch_size=128)
    with torch.no_grad():
        logits = exp.model(exp.data.x_test)
    assert acc == pytest.approx((logits.argmax(1) == exp.data.y_test).float().mean().item())
    assert loss == pytest.approx(F.cross_entropy(logits, exp.data.y_test).item(), rel=1e-5)


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
    # bfloat16 keeps 8 significant bits (relative rounding 2^-9 = 2e-3): the paths' different
    # summation orders show at that scale, well below any logic difference.
    cfg = SMALL.replace(precision="bfloat16", lr=0.01, rounds=2)
    r_seq = run(cfg, engine="sequential", root=tmp_path / "seq", progress=False, device="cpu")
    r_oth = run(cfg, engine=other, root=tmp_path / "oth", progress=False, device="cpu")
    _, p_seq = load_model(r_seq, tmp_path / "seq")
    _, p_oth = load_model(r_oth, tmp_path / "oth")
    for k in p_seq:
        torch.testing.assert_close(p_seq[k], p_oth[k], atol=2e-3, rtol=0.05)


@pytest.mark.parametrize(("algorithm", "changes"), [
    ("fedavg", {"dropout": 0.3}),
    ("moon_dpap", {"dp": "central", "dp_epsilon_per_round": 50.0, "dp_clip": 1.0, "prune": True,
                   "dropout": 0.2}),
    ("moon_dpap", {"dp": "record", "dp_epsilon_total": 50.0, "dp_schedule": "constant"}),
    ("moon_dpap", {"dp": "record", "dp_epsilon_total": 50.0, "dp_schedule": "constant", "dp_grad": "ghost"}),
    ("ldp_fl", {}), ("fdl", {})],
    ids=["fedavg", "moon_dpap_central", "moon_dpap_record", "moon_dpap_ghost", "ldp_fl", "fdl"])
def test_no_tensor_is_read_back_between_a_rounds_first_and_last_step(tmp_path, monkeypatch, algorithm,
                                                                       changes):
    """Issue 37 item 2: the vectorized path's steps (lane switches included: the clients are unequal)
    never read a tensor's value into Python, for one run and for a run batch; a step that does is
    refused."""
    cfg = SMALL.replace(algorithm=algorithm, model="mlp", client_fraction=1.0, rounds=2, train_samples=320,
                        test_samples=100, min_client_samples=10, **changes)
    with engine_mod.no_host_sync():
        run_many([cfg, cfg.replace(seed=1)], engine="vectorized", root=tmp_path, progress=False)
        run(cfg.replace(seed=2), engine="vectorized", root=tmp_path, progress=False)
    # (inside the vmapped client functions vmap itself refuses a read; the engine's own code between
    # them is what the guard watches)
    exp = Experiment(cfg.replace(seed=3), torch.device("cpu"))
    real = engine_mod._batch
    monkeypatch.setattr(engine_mod, "_batch",
                        lambda x, y, idx, *a: (float(idx.sum()), real(x, y, idx, *a))[1])  # reads back
    with engine_mod.no_host_sync(), pytest.raises(engine_mod.HostSync, match="__float__"):
        exp.round(0, Executor("vectorized", exp.algo, exp.data.x_train, exp.data.y_train))
    exp.round(0, Executor("vectorized", exp.algo, exp.data.x_train, exp.data.y_train))  # no guard: runs

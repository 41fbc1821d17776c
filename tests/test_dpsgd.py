"""Record-level DP-SGD (MOON-DPAP's ``dp="record"``): sampling, clipping, noise and accounting.

Statistical tests use fixed seeds; each states its margin. Exact comparisons run in float64,
where per-sample gradients from ``torch.func`` and a loop of single-sample gradients differ only
by summation order (about 1e-16 relative; ``1e-10`` leaves a wide margin, and a wrong clip or
scale shows as 1e-2 or more).
"""

import dataclasses
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from scipy import stats
from torch.func import functional_call, grad

from fedlib import Config, run
from fedlib.algorithms.moon_dpap import record_noise_multiplier, record_noise_multipliers, record_schedule
from fedlib.config import ConfigError
from fedlib.engine import Executor, make_poisson_plan
from fedlib.experiment import Experiment
from fedlib.kernels import set_kernel_options
from fedlib.models import build_model
from fedlib.privacy.accounting import epsilon_of_gaussian_rounds, rdp_epsilon
from fedlib.privacy.dpsgd import clip_per_sample, per_sample_grads, private_grad
from fedlib.privacy.guarantee import Accountant, GaussianEvent, Relation
from fedlib.privacy.noise import StepNoise
from fedlib.privacy.record import PrivacyMismatch
from fedlib.run import load_model

RECORD = Config(algorithm="moon_dpap", clients=4, train_samples=320, test_samples=100, rounds=2,
                min_client_samples=10, dp="record", dp_schedule="constant", dp_epsilon_total=8.0,
                dp_clip=1.0, precision="float64", client_fraction=1.0)


def _model_and_batch(n=6, seed=0, name="mlp"):
    torch.manual_seed(seed)
    model = build_model(name).double()
    params = {k: v.detach() for k, v in model.named_parameters()}
    batch = {"x": torch.randn(n, 1, 28, 28, dtype=torch.float64), "y": torch.randint(0, 10, (n,)),
             "w": torch.ones(n, dtype=torch.float64)}
    return model, params, batch


def _ce(model):
    def loss_one(p, b):
        logits = functional_call(model, p, (b["x"],))
        return (F.cross_entropy(logits, b["y"], reduction="none") * b["w"]).sum()
    return loss_one


@pytest.mark.parametrize("name", ["mlp", "cnn"])
def test_per_sample_gradients_equal_a_loop_of_single_gradients(name):
    model, params, batch = _model_and_batch(name=name)
    grads, losses = per_sample_grads(_ce(model), params, batch)
    for i in range(len(batch["y"])):
        one = {k: v[i:i + 1] for k, v in batch.items()}
        g = grad(_ce(model))(params, one)
        for k in params:
            torch.testing.assert_close(grads[k][i], g[k], atol=1e-10, rtol=0)
    assert losses.shape == (len(batch["y"]),)


@pytest.mark.parametrize("clip", [1e-3, 0.1, 1.0, 1e3])
def test_clipping_bounds_every_sample_and_keeps_small_ones(clip):
    """Property: each clipped per-sample gradient has norm <= C (up to rounding), one below C is
    unchanged, padding (weight 0) contributes nothing, and the sum is the weighted sum."""
    model, params, batch = _model_and_batch(n=8, seed=1)
    grads, _ = per_sample_grads(_ce(model), params, batch)
    weight = torch.tensor([1, 1, 1, 1, 1, 1, 0, 0], dtype=torch.float64)
    summed, norms = clip_per_sample(grads, clip, weight)
    flat = torch.cat([g.flatten(1) for g in grads.values()], dim=1)
    torch.testing.assert_close(norms, flat.norm(dim=1), atol=1e-12, rtol=1e-12)
    scale = torch.clamp(clip / flat.norm(dim=1), max=1.0)
    clipped = flat * scale[:, None]
    assert torch.all(clipped.norm(dim=1) <= clip * (1 + 1e-12))
    expected = (clipped * weight[:, None]).sum(0)
    got = torch.cat([summed[k].flatten() for k in grads])
    torch.testing.assert_close(got, expected, atol=1e-12, rtol=1e-10)
    small = flat.norm(dim=1) < clip
    torch.testing.assert_close(clipped[small], flat[small])
    # removing one record moves the sum by at most C: the add/remove sensitivity
    without = clip_per_sample(grads, clip, torch.tensor([1, 1, 1, 1, 1, 0, 0, 0], dtype=torch.float64))[0]
    change = math.sqrt(sum(float(((summed[k] - without[k]) ** 2).sum()) for k in grads))
    assert change <= clip * (1 + 1e-12)


def test_private_grad_without_noise_and_clipping_is_the_sum_over_the_expected_batch():
    model, params, batch = _model_and_batch(n=5, seed=2)
    zero = {k: torch.zeros_like(v) for k, v in params.items()}
    g, loss = private_grad(_ce(model), params, batch, clip=1e9, expected_batch=8.0, noise=zero)
    full = grad(lambda p: _ce(model)(p, batch))(params)
    for k in params:
        torch.testing.assert_close(g[k], full[k] / 8.0, atol=1e-12, rtol=1e-10)
    with pytest.raises(ValueError):
        private_grad(_ce(model), params, batch, clip=0.0, expected_batch=8.0, noise=zero)


@pytest.mark.parametrize("counter", [False, True], ids=["generator", "counter"])
def test_step_noise_is_gaussian_reproducible_and_independent_across_steps(counter):
    """KS test of 200k draws against N(0, std^2) at a fixed key (false-failure rate 1e-4 for a
    correct sampler) and their std within 1 % (6 standard errors of a sample std at this size;
    KS alone misses a 1 % scale error); the same (client, step) repeats exactly, other steps and
    clients are uncorrelated. Both ways of drawing (fedlib.kernels ``step_noise``)."""
    sn = StepNoise((1, 2, 3), 0.7, (("a", (100_000,)), ("b", (100_000,))), torch.float64, torch.device("cpu"),
                   counter=counter)
    d = sn.draw(client=5, step=3)
    x = torch.cat([d["a"], d["b"]]).numpy()
    assert stats.kstest(x / 0.7, "norm").pvalue > 1e-4
    assert x.std() == pytest.approx(0.7, rel=0.01)
    assert torch.equal(sn.draw(5, 3)["a"], d["a"])
    for other in (sn.draw(5, 4)["a"], sn.draw(6, 3)["a"]):
        r = np.corrcoef(other.numpy(), d["a"].numpy())[0, 1]
        assert abs(r) < 5 / math.sqrt(100_000)  # 5 standard errors of a correlation
    assert float(sn.zeros()["a"].abs().sum()) == 0.0


def test_poisson_plan_takes_each_record_at_rate_q():
    """K = 400 steps (E = 40 epochs of a 50-record client at B = 5 in expectation): the number
    of records taken is Binomial(K n, q); its z-score stays within 5 (false-failure rate < 1e-6),
    and the plan's steps, padding and reproducibility follow the definition."""
    idx = np.arange(100, 150)
    plan = make_poisson_plan([idx], [0], [(9, 71, 0, 0)], batch_size=5, epochs=40, seed=0, round_=0,
                             device=torch.device("cpu"))
    q, k = record_schedule(50, 5, 40)
    assert (q, k) == (0.1, 400) and plan.steps == [400]
    real = plan.weight[0] > 0
    taken = plan.idx[0][real].numpy()
    assert set(taken) <= set(idx)
    n_total = len(taken)
    assert abs(n_total - k * 50 * q) / math.sqrt(k * 50 * q * (1 - q)) < 5
    assert plan.idx.shape[2] == int(real.sum(1).max())  # padded to the largest batch
    assert np.array_equal(plan.sizes[0], real.sum(1).numpy())  # each step's real samples, on the host
    again = make_poisson_plan([idx], [0], [(9, 71, 0, 0)], batch_size=5, epochs=40, seed=0, round_=0,
                              device=torch.device("cpu"))
    assert torch.equal(again.idx, plan.idx)


def test_a_poisson_step_on_the_sequential_path_computes_on_its_real_samples_only():
    """The sequential and parallel paths drop a Poisson step's padding (exact zeros in every sum, ~40 %
    of the work at the papers' scale); an empty draw keeps one padded sample of weight 0, so the step
    still has a batch. (That this is the same function as the padded step: the paths' agreement in
    float64 below, whose vectorized path pads.)"""
    from fedlib.engine import _client_batch

    idx = np.arange(40)
    plan = make_poisson_plan([idx, idx[:3]], [0, 1], [(9, 71, 0, 0), (9, 71, 0, 1)], batch_size=4,
                             epochs=30, seed=0, round_=0, device=torch.device("cpu"))
    x, y = torch.arange(40.0)[:, None], torch.arange(40)
    empty = 0
    for i, k in enumerate(plan.steps):
        for s in range(k):
            b = _client_batch(x, y, plan, i, s)
            n = int(plan.sizes[i, s])
            assert len(b["w"]) == max(1, n) and float(b["w"].sum()) == n
            assert torch.equal(b["x"][:n, 0].long(), plan.idx[i, s, :n])
            empty += n == 0
    assert empty > 0  # the 40-record client (q = 0.1) draws a step empty with probability 0.9^40 (fixed key)


def test_calibration_protects_every_client_at_the_target():
    sizes = [40, 75, 120, 300]
    cfg = RECORD.replace(rounds=10)
    sigma, q, k, per_client = record_noise_multiplier(cfg, sizes)
    assert max(per_client) == pytest.approx(8.0, rel=1e-5) and all(e <= 8.0 * (1 + 1e-6) for e in per_client)
    assert (q, k) == record_schedule(min(sizes), cfg.batch_size, cfg.local_epochs)  # the smallest client
    assert rdp_epsilon([sigma] * (10 * k), 1e-5, q) == pytest.approx(8.0, rel=1e-5)


def test_per_client_calibration_spends_the_budget_at_every_client():
    """``dp_sigma = per_client``: each client's sigma spends the budget over its own (q_i, K_i) (RDP at
    integer orders, at most the target, within the bisection's 1e-7), cross-checked against
    dp-accounting's RDP accountant (its own orders: a little tighter, never looser by more than 5 %);
    larger clients get less noise, and the smallest client's sigma is the one-sigma calibration's."""
    sizes = [40, 75, 120, 300, 75]
    cfg = RECORD.replace(rounds=10, dp_sigma="per_client")
    sigmas, per_client = record_noise_multipliers(cfg, sizes)
    assert all(e == pytest.approx(8.0, rel=1e-5) and e <= 8.0 * (1 + 1e-9) for e in per_client)
    assert sigmas[1] == sigmas[4]  # one schedule, one calibration
    order = np.argsort(sizes, kind="stable")
    assert all(sigmas[a] >= sigmas[b] for a, b in zip(order[:-1], order[1:], strict=True))
    assert sigmas[3] < 0.8 * sigmas[0]  # the point of the variant: much less noise for the large client
    assert sigmas[0] == pytest.approx(record_noise_multiplier(cfg, sizes)[0], rel=1e-9)
    for n, z in zip(sizes, sigmas, strict=True):
        q, k = record_schedule(n, cfg.batch_size, cfg.local_epochs)
        theirs = epsilon_of_gaussian_rounds([z] * (cfg.rounds * k), cfg.dp_delta, q, accountant="rdp")
        assert theirs <= 8.0 * (1 + 1e-6) and theirs >= 8.0 / 1.05


@pytest.mark.parametrize("counter", [False, True], ids=["generator", "counter"])
def test_per_client_step_noise_draws_each_client_at_its_own_std(counter):
    """Each client's draw has its own std (within 1 %: 6 standard errors of a sample std of 2e5
    normals), and the draw of a client is the one-std draw scaled (the same stream: only the
    scale differs)."""
    shapes = (("a", (200_000,)),)
    one = StepNoise((4, 5), 1.0, shapes, torch.float64, torch.device("cpu"), counter=counter)
    apart = dataclasses.replace(one, client_std=(0.5, 2.0, 3.0))
    for client, std in enumerate((0.5, 2.0, 3.0)):
        x = apart.draw(client, 7)["a"]
        assert float(x.std()) == pytest.approx(std, rel=0.01)
        torch.testing.assert_close(x, one.draw(client, 7)["a"] * std, rtol=1e-12, atol=0)


def test_per_client_sigma_trains_on_every_path_and_records_each_clients_calibration(tmp_path):
    """A per-client run: the vectorized path (every lane at its own std in one draw) agrees with the
    sequential one (float64, counter noise); the result records each client's sigma and epsilon, and
    the run's accountant spends the budget."""
    cfg = RECORD.replace(model="mlp", dp_sigma="per_client")
    ref = run(cfg, engine="sequential", root=tmp_path / "seq", progress=False, device="cpu")
    exp = Experiment(cfg, torch.device("cpu"))
    with Executor("vectorized", exp.algo, exp.data.x_train, exp.data.y_train, lanes="clients") as ex:
        for t in range(cfg.rounds):
            exp.round(t, ex)
    p_ref = load_model(ref, tmp_path / "seq")[1]
    assert max(float((p_ref[k] - exp.gparams[k]).abs().max()) for k in p_ref) < 1e-11
    privacy = ref.meta["privacy"]
    sigmas, eps = privacy["per_client_noise_multiplier"], privacy["per_client_epsilon"]
    assert len(sigmas) == cfg.clients and len(set(sigmas)) > 1
    assert all(e == pytest.approx(8.0, rel=1e-5) for e in eps)
    assert ref.history[-1]["epsilon_spent"] == pytest.approx(8.0, rel=1e-5)
    one_sigma = record_noise_multiplier(cfg.replace(dp_sigma="one"), ref.meta["client_sizes"])[0]
    assert max(sigmas) == pytest.approx(one_sigma, rel=1e-6)  # the smallest client's, as with one sigma


def test_a_client_released_below_its_own_sigma_stops_the_run(monkeypatch):
    """The check is per client: one client drawing another client's (smaller) sigma stops the run
    with PrivacyMismatch naming it, though every recorded multiplier is one some client is promised
    (a round-wide minimum against the least protected client's event could not tell)."""
    cfg = RECORD.replace(model="mlp", dp_sigma="per_client")
    exp = Experiment(cfg, torch.device("cpu"))
    sigmas = exp.algo.record["client_sigma"]
    small, large = int(np.argmax(sigmas)), int(np.argmin(sigmas))
    assert sigmas[small] > sigmas[large]
    honest = exp.algo.step_noise

    def swapped(t, like):
        noise = honest(t, like)
        std = list(noise.client_std)
        std[small] = std[large]
        return dataclasses.replace(noise, client_std=tuple(std))

    monkeypatch.setattr(exp.algo, "step_noise", swapped)
    with Executor("sequential", exp.algo, exp.data.x_train, exp.data.y_train) as ex:
        with pytest.raises(PrivacyMismatch, match=f"client {small} released"):
            exp.round(0, ex)


def test_per_client_sigma_needs_record_level_dp():
    with pytest.raises(ConfigError, match="dp_sigma = per_client calibrates record-level"):
        Config(algorithm="moon_dpap", dp="central", dp_sigma="per_client").validate()
    with pytest.raises(ConfigError, match="dp_sigma"):
        Config(algorithm="moon_dpap", dp="record", dp_schedule="constant", dp_sigma="each").validate()


def test_run_accountant_matches_dp_accounting_and_pld_is_tighter():
    """The run's accountant (RDP at integer orders, K steps per round) against dp-accounting's
    own RDP accountant at its default orders (integer orders can only be a little looser) and
    against the PLD accountant (tight: lower)."""
    sigma, q, k, rounds = 1.1, 0.05, 30, 20
    acc = Accountant(1e-5)
    for _ in range(rounds):
        acc.step(GaussianEvent(sigma, q, k))
    ours = acc.epsilon()
    rdp_default = epsilon_of_gaussian_rounds([sigma] * (rounds * k), 1e-5, q, accountant="rdp")
    pld = epsilon_of_gaussian_rounds([sigma] * (rounds * k), 1e-5, q, accountant="pld")
    assert rdp_default <= ours <= 1.05 * rdp_default
    assert pld < ours


# the counter noise (the default) in make test; the generator noise in test-full
@pytest.mark.parametrize("step_noise", [pytest.param("generator", marks=pytest.mark.heavy), "counter"])
def test_engine_paths_agree_and_the_result_records_the_calibration(tmp_path, restore_kernels, step_noise):
    """Per-sample clipping, Poisson batches and noise draws agree on every engine path (float64),
    with either way of drawing the step noise (``counter``: the vectorized path draws every lane's
    in one call, the sequential one client by client). The MLP: the paths' agreement does not
    depend on the layers and the CNN took six times longer (the CNN's per-sample gradients are
    checked against single-sample ones above)."""
    set_kernel_options(step_noise=step_noise)
    cfg = RECORD.replace(model="mlp")
    ref = run(cfg, engine="sequential", root=tmp_path / "seq", progress=False, device="cpu")
    assert ref.meta.get("kernels", {}) == ({} if step_noise == "generator" else {"step_noise": "counter"})
    p_ref = load_model(ref, tmp_path / "seq")[1]
    for path, lanes in [("vectorized", "auto"), ("vectorized", "clients"), ("parallel", "auto")]:
        exp = Experiment(cfg, torch.device("cpu"))
        with Executor(path, exp.algo, exp.data.x_train, exp.data.y_train, workers=2, lanes=lanes) as ex:
            for t in range(cfg.rounds):
                exp.round(t, ex)
        diff = max(float((p_ref[k] - exp.gparams[k]).abs().max()) for k in p_ref)
        assert diff < 1e-11, (path, lanes)
    privacy = ref.meta["privacy"]
    assert privacy["unit"] == "record" and privacy["relation"] == Relation.ADD_REMOVE.value
    assert max(privacy["per_client_epsilon"]) == pytest.approx(8.0, rel=1e-5)
    assert ref.history[-1]["epsilon_spent"] == pytest.approx(8.0, rel=1e-5)
    assert "train_loss" in privacy["diagnostic_metrics"]


def test_noise_reaches_the_update_at_the_stated_scale():
    """Call-site audit: a step on a batch with no real record moves the model by exactly
    ``-lr * noise / B``; its std over ~100k coordinates must be ``lr sigma C / B`` within 2 %
    (the sample std of 1e5 normals is within 1 % with probability 1 - 1e-12). Mutating sigma,
    C or B at the call site fails this."""
    cfg = RECORD.replace(model="mlp", momentum=0.0, weight_decay=0.0, moon_mu=0.0, dp_clip=0.3, batch_size=16)
    exp = Experiment(cfg, torch.device("cpu"))
    algo = exp.algo
    t = 0
    ctx = exp.prepare(t)[1].ctx
    cstate = {"prev": {k: v[0] for k, v in exp.client_states["prev"].items()}}
    sstate = algo.client_init(cstate, ctx)
    noise = algo.step_noise(t, exp.gparams).draw(client=0, step=0)
    batch = {"x": exp.data.x_train[:4], "y": exp.data.y_train[:4],
             "w": torch.zeros(4, dtype=torch.float64), "noise": noise}
    new = algo.client_step(sstate, batch, cstate, ctx)
    moved = torch.cat([(new["params"][k] - sstate["params"][k]).flatten() for k in sstate["params"]])
    expected_std = cfg.lr * algo.record["sigma"] * cfg.dp_clip / cfg.batch_size
    assert float(moved.std()) == pytest.approx(expected_std, rel=0.02)
    assert moved.numel() > 50_000

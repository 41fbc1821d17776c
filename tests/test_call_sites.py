"""Privacy at the call sites, on full rounds of real runs (issue 27).

The audits of tests/test_privacy_audit.py test each mechanism's noise at its call site with many
trials. These tests run whole rounds through :class:`fedlib.experiment.Experiment` and check what a
mechanism cannot check alone:

* every round's releases are recorded by the mechanisms themselves and back the event the
  accountant is fed (a mismatch stops the run: :class:`fedlib.privacy.record.PrivacyMismatch`);
* the sensitivity a round actually realises: with the same noise (keyed on the config), replacing
  one client's data by an adversarial one moves the released sum by at most the sensitivity the
  noise is calibrated for;
* the edits that once went unnoticed (clipping skipped at DP-FedAvg's call site, half the noise on
  adaptive clipping's count, the noise calibrated on the initial clip C0 instead of C_t) now fail.
"""

from __future__ import annotations

import math

import pytest
import torch
from test_privacy_audit import mutated

from fedlib import Config
from fedlib.algorithms import ALGORITHMS, dp_fedavg
from fedlib.engine import Executor
from fedlib.experiment import Experiment
from fedlib.privacy import central, record
from fedlib.privacy.record import PrivacyMismatch, SensitivityError

# The small MLP: what these tests check (releases, records, sensitivity) does not depend on the
# model, and the CNN made each MOON-DPAP run several times slower (this file is also the test
# command of every mutant in make test-privacy-mutants).
SMOKE = dict(clients=6, train_samples=600, test_samples=100, rounds=3, min_client_samples=20, lr=0.05,
             momentum=0.0, profile="smoke", model="mlp")
PRIVATE = {
    "dp_fedavg fixed": Config(algorithm="dp_fedavg", client_fraction=0.5, dp_clip=0.05,
                              dp_noise_multiplier=1.0, **SMOKE),
    "dp_fedavg adaptive": Config(algorithm="dp_fedavg", client_fraction=0.5, dp_clip=0.01,
                                 adaptive_clip=True, dp_noise_multiplier=1.0, clip_count_std=1.0, **SMOKE),
    "moon_dpap central": Config(algorithm="moon_dpap", dp="central", dp_clip=0.05, **SMOKE),
    "moon_dpap local": Config(algorithm="moon_dpap", dp="local", dp_clip=0.05, **SMOKE),
    "moon_dpap record": Config(algorithm="moon_dpap", dp="record", dp_schedule="constant", dp_clip=1.0,
                               dp_epsilon_total=8.0, **SMOKE),
    "ldp_fl": Config(algorithm="ldp_fl", **SMOKE),
    "signds_fl": Config(algorithm="signds_fl", **SMOKE),
    "fdl corrected": Config(algorithm="fdl", fdl_mode="corrected", **SMOKE),
}


def _rounds(config: Config, rounds: int | None = None) -> Experiment:
    exp = Experiment(config, torch.device("cpu"))
    with Executor("sequential", exp.algo, exp.data.x_train, exp.data.y_train) as ex:
        for t in range(rounds or config.rounds):
            exp.round(t, ex)
    return exp


@pytest.mark.parametrize("name", sorted(PRIVATE))
def test_every_round_is_accounted_from_what_the_mechanisms_recorded(name, monkeypatch):
    """Each round, the mechanisms' own records back the accountant's event (checked, not assumed):
    never less noise (Gaussian) and never more epsilon (pure) than the configuration promises."""
    seen = []
    real = record.check

    def spy(declared, z, eps, where):
        seen.append((declared, z, eps))
        real(declared, z, eps, where)

    import importlib

    monkeypatch.setattr(importlib.import_module("fedlib.experiment"), "check", spy)
    exp = _rounds(PRIVATE[name])
    assert len(seen) == PRIVATE[name].rounds
    for declared, z, eps in seen:
        if hasattr(declared, "noise_multiplier"):
            assert z is not None and z == pytest.approx(declared.noise_multiplier, rel=1e-9)
        else:
            assert eps is not None and eps <= declared.epsilon * (1 + 1e-9) and eps > 0.5 * declared.epsilon
    assert math.isfinite(exp.accountant.epsilon())


def _neighbour_release(config: Config, scale: float) -> tuple[dict, float]:
    """One round from the same start, with client 0's images multiplied by ``scale`` (an adversarial
    replacement of its data); the released sum (global model change times the public denominator)."""
    exp = Experiment(config, torch.device("cpu"))
    if scale != 1.0:
        idx = torch.as_tensor(exp.parts[0])
        exp.data.x_train[idx] = exp.data.x_train[idx] * scale
    before = {k: v.clone() for k, v in exp.gparams.items()}
    with Executor("sequential", exp.algo, exp.data.x_train, exp.data.y_train) as ex:
        exp.round(0, ex)
    algo = exp.algo
    denominator = algo.expected if config.algorithm == "dp_fedavg" else config.clients
    return {k: (exp.gparams[k] - before[k]).double() * denominator / config.server_lr for k in before}, \
        float(getattr(algo, "z_delta", 1.0))


@pytest.mark.parametrize("name", ["dp_fedavg fixed", "dp_fedavg adaptive", "moon_dpap central"])
def test_a_full_round_realises_at_most_the_calibrated_sensitivity(name):
    """Same config, same noise (keyed on the config), one client's data replaced by an adversarial
    one: the released sums differ by at most 2C plus the grid rounding the secure sum accounts for
    (MOON-DPAP's replace-one sensitivity; for DP-FedAvg, whose relation is add/remove with sensitivity
    C, a replacement is a removal and an addition). An unclipped update or a mis-scaled sum would
    move it by far more (the adversarial client's raw update is ~1e3 times larger)."""
    factor = 2
    from fedlib.privacy.central import grid_sensitivity
    from fedlib.privacy.discrete import grid_for
    from fedlib.privacy.guarantee import Relation

    cfg = PRIVATE[name].replace(client_fraction=1.0)
    a, _ = _neighbour_release(cfg, 1.0)
    b, _ = _neighbour_release(cfg, 1e3)
    moved = math.sqrt(sum(float(((a[k] - b[k]) ** 2).sum()) for k in a))
    # the calibrated bound: factor C, plus the rounding of each update to the noise's grid (the
    # secure sum accounts for it: half a grid step per coordinate of the one update that differs)
    grid = grid_for(cfg.dp_clip)
    dims = sum(v.numel() for v in a.values())
    bound = grid_sensitivity(cfg.dp_clip, Relation.REPLACE_ONE, dims, grid) * grid.step
    assert factor * cfg.dp_clip < bound < 1.5 * factor * cfg.dp_clip
    assert 0.5 * factor * cfg.dp_clip < moved <= bound * (1 + 1e-4), (moved, bound)


def _run_with(monkeypatch, algorithm_class, config: Config, rounds: int = 3):
    monkeypatch.setitem(ALGORITHMS, config.algorithm, algorithm_class)
    return _rounds(config, rounds)


@pytest.mark.source_mutation
def test_clipping_skipped_at_dp_fedavgs_call_site_stops_the_run(monkeypatch):
    mutant = mutated(dp_fedavg, 'clipped, norm = clip_by_l2(upload["delta"], ctx.shared["clip"])',
                     'clipped, norm = upload["delta"], flat_norm(upload["delta"])')
    mutant.flat_norm = __import__("fedlib.privacy.clipping", fromlist=["flat_norm"]).flat_norm
    with pytest.raises(SensitivityError, match="not clipped"):
        _run_with(monkeypatch, mutant.DpFedAvg, PRIVATE["dp_fedavg fixed"])


@pytest.mark.source_mutation
def test_half_the_noise_on_adaptive_clippings_count_stops_the_run(monkeypatch):
    mutant = mutated(central, "noisy_count(unclipped - 0.5, self.count_std,",
                     "noisy_count(unclipped - 0.5, 0.5 * self.count_std,")
    monkeypatch.setattr(dp_fedavg, "AdaptiveClipping", mutant.AdaptiveClipping)
    with pytest.raises(PrivacyMismatch, match="multiplier"):
        _rounds(PRIVATE["dp_fedavg adaptive"])


@pytest.mark.source_mutation
def test_noise_calibrated_on_the_initial_clip_stops_the_run(monkeypatch):
    """Adaptive clipping grows C from C0 = 0.01 (every update is clipped at first): from the second
    round on, updates clipped to C_t > C0 enter a sum whose noise is sized for C0."""
    mutant = mutated(dp_fedavg, 'total = noisy_sum(uploads["delta"], clip,',
                     'total = noisy_sum(uploads["delta"], c.dp_clip,')
    with pytest.raises(SensitivityError, match="not clipped to the norm"):
        _run_with(monkeypatch, mutant.DpFedAvg, PRIVATE["dp_fedavg adaptive"], rounds=4)


def test_the_unmutated_runs_complete():
    for name in ("dp_fedavg fixed", "dp_fedavg adaptive"):
        exp = _rounds(PRIVATE[name], 4)
        assert exp.accountant.epsilon() > 0


def test_secret_randomness_draws_noise_and_samples_nobody_can_regenerate(tmp_path):
    """A deployment's mode: OS entropy at every draw. The same config then gives other noise and
    another Poisson sample each time (a seeded simulation gives the same), and the result says it
    does not reproduce."""
    from fedlib import run
    from fedlib.run import load_model

    seeded = PRIVATE["dp_fedavg fixed"].replace(rounds=1)
    secret = seeded.replace(randomness="secret")
    algo = ALGORITHMS["dp_fedavg"](secret, torch.nn.Linear(1, 1))
    # ten Poisson samples (q = 0.5, 6 clients) of the same round all equal: probability below 1e-16
    assert len({tuple(algo.sample_clients(0)) for _ in range(10)}) > 1
    models = []
    for i, cfg in enumerate((seeded, seeded, secret, secret)):
        r = run(cfg, root=tmp_path / str(i), progress=False, device="cpu")
        models.append(load_model(r, tmp_path / str(i))[1])
        assert r.meta["reproducible"] is (cfg.randomness == "seeded")
    same = lambda a, b: all(torch.equal(a[k], b[k]) for k in a)  # noqa: E731
    assert same(models[0], models[1]) and not same(models[2], models[3])


@pytest.mark.parametrize("name", ["dp_fedavg adaptive", "moon_dpap record", "fdl corrected"])
def test_every_result_field_is_classified_released_or_diagnostic(name, tmp_path):
    """History metrics are released (covered by the guarantee) or diagnostic; metadata fields are
    public (provenance, what the config determines) or diagnostic (computed from private data, such
    as the clients' sizes): a new field cannot slip in unclassified."""
    from fedlib import run

    r = run(PRIVATE[name].replace(rounds=1), root=tmp_path, progress=False, device="cpu")
    p = r.meta["privacy"]
    metrics = {k for h in r.history for k in h}
    assert set(p["released_metrics"]) | set(p["diagnostic_metrics"]) == metrics
    assert set(p["public_meta"]) | set(p["diagnostic_meta"]) == set(r.meta)
    assert "client_sizes" in p["diagnostic_meta"] and "train_loss" in p["diagnostic_metrics"]


def test_cuda_provenance_is_classified_public():
    """A CUDA result's metadata also holds ``kernels`` (the kernel settings the code chose, see
    fedlib/kernels.py): public like the rest of the provenance, or a private CUDA run could not save."""
    from fedlib.kernels import kernel_settings
    from fedlib.privacy.guarantee import classify_meta
    from fedlib.results import provenance

    meta = {**provenance(torch.device("cpu"), "vectorized"), "kernels": kernel_settings()}
    assert classify_meta(meta) == {"public_meta": sorted(meta), "diagnostic_meta": []}


def test_moon_dpap_local_noise_is_keyed_on_round_and_client_and_secure():
    """MOON-DPAP's local release is the secure (discrete) mechanism keyed on (local-noise stream,
    round, client): the same key repeats exactly, another round or client draws other noise (noise
    repeated across rounds would cancel in the difference of two releases), the float mechanism
    would be another release, and pruned coordinates (the public mask) get neither value nor noise."""
    from fedlib.algorithms.base import RoundContext
    from fedlib.models import build_model
    from fedlib.streams import Stream

    cfg = Config(algorithm="moon_dpap", dp="local", dp_clip=0.05, **SMOKE).validate()
    algo = ALGORITHMS["moon_dpap"](cfg, build_model(cfg.model))
    params = {k: v.detach() for k, v in build_model(cfg.model).named_parameters()}
    upload = {"delta": {k: torch.zeros_like(v) for k, v in params.items()}}

    def release(t, client, shared=None):
        ctx = RoundContext(t, params, algo.hyper(t), shared or {})
        return algo.release(upload, client, ctx)[0]["delta"]

    first = release(1, 2)
    assert all(torch.equal(first[k], v) for k, v in release(1, 2).items())
    for other in (release(2, 2), release(1, 3)):
        assert all(not torch.equal(first[k], v) for k, v in other.items())
    one = {k: v[None] for k, v in upload["delta"].items()}
    seed = algo.noise_seed(Stream.LOCAL_NOISE, 1, 2)
    z = algo.hyper(1)["noise_multiplier"]
    secure = central.noisy_one(one, cfg.dp_clip, z, seed, True)
    assert cfg.secure_noise and all(torch.equal(first[k], secure[k]) for k in first)
    floating = central.noisy_one(one, cfg.dp_clip, z, seed, False)
    assert any(not torch.equal(first[k], floating[k]) for k in first)
    masks = {k: torch.arange(v.numel()).reshape(v.shape) % 2 == 0 for k, v in params.items()}
    pruned = release(1, 2, {"masks": masks})
    assert all((pruned[k][~masks[k]] == 0).all() and (pruned[k][masks[k]] != 0).any() for k in pruned)


def test_noisy_one_is_the_secure_sum_of_one_by_default_and_keeps_the_mask():
    """One client's local release is :func:`central.noisy_sum` over a batch of one, at replace-one
    sensitivity, through the secure (discrete) mechanism unless asked otherwise; the public pruning
    mask passes through (no noise on pruned coordinates)."""
    one = {"w": torch.zeros(1, 64), "b": torch.zeros(1, 8)}
    seed = (5, 41, 1, 2)
    default = central.noisy_one(one, 0.05, 1.0, seed)
    summed = central.noisy_sum(one, 0.05, 1.0, central.Relation.REPLACE_ONE, seed, True, None)
    assert all(torch.equal(default[k], summed[k]) for k in one)
    floating = central.noisy_one(one, 0.05, 1.0, seed, secure=False)
    assert all(torch.equal(floating[k], central.noisy_sum(one, 0.05, 1.0, central.Relation.REPLACE_ONE, seed,
                                                          False, None)[k]) for k in one)
    assert any(not torch.equal(default[k], floating[k]) for k in one)
    mask = {"w": torch.arange(64) % 2 == 0, "b": torch.ones(8, dtype=torch.bool)}
    masked = central.noisy_one(one, 0.05, 1.0, seed, True, mask)
    assert (masked["w"][~mask["w"]] == 0).all() and (masked["w"][mask["w"]] != 0).any()


def test_the_formula_in_circulation_adds_eq4_noise_with_its_delta_f_and_claims_no_guarantee():
    """MOON-DPAP's ``dp="formula"`` (issue 63): each client adds N(0, sigma_t^2) to every coordinate of
    its update with eq. 4's sigma_t = Delta_f sqrt(2 ln(1.25/delta)) / epsilon_t, Delta_f = 2 lr_t C /
    n_i and eq. 5's epsilon_t; keyed on round and client; and the run records no guarantee and no
    epsilon (the formula bounds one full-batch step, not a round). The noise's sample standard
    deviation over the MLP's 79,510 coordinates lies within 2 % of sigma_t (its relative standard
    error is 1/sqrt(2 x 79,510) = 0.25 %: 2 % is 8 of them) and its mean within 5 standard errors of 0."""
    from fedlib.algorithms.base import RoundContext
    from fedlib.algorithms.moon_dpap import formula_sigma
    from fedlib.models import build_model
    from fedlib.schedules import epsilon_schedule

    cfg = Config(algorithm="moon_dpap", dp="formula", dp_clip=1.0, dp_schedule="paper",
                 dp_epsilon_per_round=1.0, **SMOKE).validate()
    algo = ALGORITHMS["moon_dpap"](cfg, build_model(cfg.model))
    params = {k: v.detach() for k, v in build_model(cfg.model).named_parameters()}
    upload = {"delta": {k: torch.zeros_like(v) for k, v in params.items()}, "samples": torch.tensor(200.0)}
    t, client = 1, 2
    ctx = RoundContext(t, params, algo.hyper(t), {})
    out, stats = algo.release(upload, client, ctx)
    noise = torch.cat([v.reshape(-1) for v in out["delta"].values()]).double()
    eps_t = epsilon_schedule(t, cfg.rounds, 1.0, cfg.dp_eps_floor)
    want = 2 * ctx.hyper["lr"] * 1.0 / 200 * math.sqrt(2 * math.log(1.25 / cfg.dp_delta)) / eps_t
    assert stats["formula_sigma"] == pytest.approx(want, rel=1e-12)
    assert formula_sigma(ctx.hyper["lr"], 1.0, 200, eps_t, cfg.dp_delta) == pytest.approx(want, rel=1e-12)
    assert float(noise.std()) == pytest.approx(want, rel=0.02)
    assert abs(float(noise.mean())) < 5 * want / math.sqrt(noise.numel())
    again, _ = algo.release(upload, client, ctx)
    assert all(torch.equal(out["delta"][k], again["delta"][k]) for k in params)
    other, _ = algo.release(upload, 3, ctx)
    assert all(not torch.equal(out["delta"][k], other["delta"][k]) for k in params)
    assert set(out) == {"delta"}  # the sample count stays in the client
    assert algo.guarantee() is None and algo.privacy_event(ctx) is None
    exp = _rounds(cfg, 1)  # the engine hands the release the client's own sample count
    assert exp.accountant is None or not math.isfinite(exp.accountant.epsilon())


def test_the_formula_clips_per_sample_gradients_and_averages_them_over_the_batch():
    """Inside the client the formula clips every per-sample gradient to C and averages over the real
    samples: with C huge it is the plain mean gradient (float64: rounding only); with C tiny every
    sample's gradient has norm C exactly, so their mean has norm at most C (and padding is ignored)."""
    base = Config(algorithm="moon_dpap", dp="formula", dp_schedule="paper", precision="float64", **SMOKE)
    grads = {}
    for name, cfg in (("huge", base.replace(dp_clip=1e9)), ("plain", base.replace(dp="none")),
                      ("tiny", base.replace(dp_clip=1e-6))):
        exp = Experiment(cfg.validate(), torch.device("cpu"))
        ctx = exp.prepare(0)[1].ctx
        cstate = {"prev": {k: v[0] for k, v in exp.client_states["prev"].items()}}
        sstate = exp.algo.client_init(cstate, ctx)
        w = torch.tensor([1.0] * 6 + [0.0] * 2, dtype=torch.float64)  # two padding rows
        batch = {"x": exp.data.x_train[:8], "y": exp.data.y_train[:8], "w": w}
        grads[name] = exp.algo.loss_and_grad(sstate["params"], batch, sstate, cstate, ctx)[0]
    for k in grads["plain"]:
        torch.testing.assert_close(grads["huge"][k], grads["plain"][k], rtol=1e-9, atol=1e-12)
    norm = torch.sqrt(sum((v ** 2).sum() for v in grads["tiny"].values()))
    assert 0 < float(norm) <= 1e-6 * (1 + 1e-9)


@pytest.mark.parametrize("name", sorted(PRIVATE))
def test_every_runs_total_is_the_composition_of_its_rounds(name, monkeypatch):
    """Issue 65: the epsilon a whole run reports equals the composition of its rounds, computed here
    independently: the sum of the per-round epsilons for pure (local) mechanisms, each the value the
    configuration promises; the peer accountant (dp-accounting's RDP at the same orders) for Gaussian
    ones. An accountant that kept only the last round's epsilon would report a third of it."""
    import dp_accounting as dpa

    from fedlib.privacy import guarantee
    from fedlib.privacy.accounting import INTEGER_ORDERS

    events = []
    real = guarantee.Accountant.step

    def spy(self, event):
        events.append(event)
        real(self, event)

    monkeypatch.setattr(guarantee.Accountant, "step", spy)
    cfg = PRIVATE[name]
    exp = _rounds(cfg)
    reported = exp.accountant.epsilon()
    assert len(events) == cfg.rounds and all(e is not None for e in events)
    if isinstance(events[0], guarantee.PureEvent):
        promised = {"ldp_fl": lambda: cfg.ldp_fl_epsilon_per_coordinate * exp.algo.dims,
                    "signds_fl": lambda: cfg.signds_epsilon_per_round,
                    "fdl": lambda: cfg.fdl_epsilon_per_round}[cfg.algorithm]()
        assert all(e.epsilon == pytest.approx(promised, rel=1e-9) for e in events)
        assert reported == pytest.approx(cfg.rounds * promised, rel=1e-9)
        return
    peer = dpa.rdp.RdpAccountant(orders=[float(a) for a in INTEGER_ORDERS])
    for e in events:
        one = dpa.GaussianDpEvent(e.noise_multiplier)
        if e.sampling_rate < 1:
            one = dpa.PoissonSampledDpEvent(e.sampling_rate, one)
        peer.compose(one, e.count)
    assert reported == pytest.approx(peer.get_epsilon(cfg.dp_delta), rel=1e-6)
    last = events[-1]
    one = dpa.GaussianDpEvent(last.noise_multiplier)
    if last.sampling_rate < 1:
        one = dpa.PoissonSampledDpEvent(last.sampling_rate, one)
    single = dpa.rdp.RdpAccountant(orders=[float(a) for a in INTEGER_ORDERS])
    single.compose(one, last.count)
    assert reported > single.get_epsilon(cfg.dp_delta) * (1 + 1e-6)  # more rounds spend more


def test_adaptive_clippings_noisy_count_is_drawn_on_its_grid_when_noise_is_secure(monkeypatch):
    """Issue 65: under secure noise the count that adaptive clipping releases (through the call site a
    run uses) is the exact discrete mechanism's: a multiple of the count grid's step, asked for with
    secure=True; a float Gaussian draw would fall off the grid (probability 1 - 2^-30 or so)."""
    from fedlib.privacy import central as central_mod

    seen = []
    real = central_mod.noisy_count

    def spy(values, std, seed, secure=True, sensitivity=0.5):
        out = real(values, std, seed, secure, sensitivity)
        seen.append((secure, out))
        return out

    monkeypatch.setattr(central_mod, "noisy_count", spy)
    cfg = PRIVATE["dp_fedavg adaptive"]
    assert cfg.secure_noise and cfg.clip_count_std > 0
    _rounds(cfg)
    assert len(seen) == cfg.rounds
    step = central_mod.COUNT_GRID.step
    for secure, value in seen:
        assert secure is True
        assert (value / step) == round(value / step), value


def test_corrected_fdls_released_values_come_from_the_discrete_mechanism_at_the_call_site(monkeypatch):
    """Issue 65: under secure noise a corrected-FDL client's release (the algorithm's own release, the
    call site a run uses) draws its values from the exact discrete Laplace mechanism at L1 sensitivity
    2k and the values' share of epsilon, never from the float one. (Its float32 output cannot show the
    grid: every float32 of magnitude above 2^-7 is a multiple of 2^-30 whatever its origin.)"""
    from fedlib.algorithms import fdl as fdl_mod
    from fedlib.algorithms.base import RoundContext
    from fedlib.models import build_model

    calls = []
    real = fdl_mod.discrete_laplace_values

    def spy(values, mask, l1, eps, rng):
        calls.append((l1, eps))
        return real(values, mask, l1, eps, rng)

    monkeypatch.setattr(fdl_mod, "discrete_laplace_values", spy)
    monkeypatch.setattr(fdl_mod, "laplace_values", lambda *a, **k: pytest.fail("float Laplace noise"))
    cfg = PRIVATE["fdl corrected"].validate()
    assert cfg.secure_noise
    algo = ALGORITHMS["fdl"](cfg, build_model(cfg.model))
    params = {k: v.detach() for k, v in build_model(cfg.model).named_parameters()}
    g = torch.Generator().manual_seed(3)
    delta = {k: torch.randn(v.shape, generator=g) * 1e-3 for k, v in params.items()}
    for client in (0, 2):
        algo.release({"delta": delta}, client, RoundContext(1, params, algo.hyper(1), {}))
    k = algo.k(algo.dims)
    assert calls == [(2.0 * k, algo.split()[1])] * 2

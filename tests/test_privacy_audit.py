"""Black-box audits of every privacy mechanism *at its call site*, and mutation checks.

Each audit runs an algorithm's own code (``server_update``, ``privatize``, ``encode``) on
worst-case neighbouring inputs of its stated relation, many times at once (independent
coordinates or clients), and asserts that the empirical epsilon lower bound
(:func:`fedlib.privacy.audit.epsilon_lower_bound`, Clopper-Pearson) stays below the claimed
epsilon of one release. A correct mechanism fails with probability at most ``ALPHA`` = 1e-6.

The mutation checks apply a small edit to the algorithm's source (halving the noise, or
spending a per-draw budget k times), load the mutated module, and assert that the same audit
now finds a bound *above* the claim: the audits can fail. The edits name the exact source text,
so a refactor that moves it makes these tests fail loudly rather than pass vacuously.

Per-coordinate trials: a Gaussian mechanism on a vector adds iid noise to every coordinate, so
giving every coordinate the full sensitivity (a worst case for each coordinate's marginal)
turns one call into many independent trials of the one-dimensional mechanism, whose privacy
is that of the whole release (the statistic along the difference direction is sufficient).
"""

from __future__ import annotations

import importlib
import inspect
import sys
import types

import dp_accounting as dpa
import numpy as np
import pytest
import torch

from fedlib import Config
from fedlib.algorithms import dp_fedavg, fdl, ldp_fl, moon_dpap, signds_fl
from fedlib.algorithms.base import RoundContext
from fedlib.privacy import central, dpsgd, local
from fedlib.privacy.audit import clopper_pearson, epsilon_lower_bound
from fedlib.privacy.record import SensitivityError

ALPHA = 1e-6
DELTA = 1e-5
N = 400_000  # trials per input (coordinates or clients)


def mutated(module: types.ModuleType, old: str, new: str) -> types.ModuleType:
    """A fresh copy of ``module`` with ``old`` replaced by ``new`` in its source (exactly once)."""
    source = inspect.getsource(module)
    assert source.count(old) == 1, f"mutation target not found once in {module.__name__}: {old!r}"
    copy = types.ModuleType(module.__name__ + "_mutant")
    copy.__file__ = module.__file__
    sys.modules[copy.__name__] = copy  # dataclasses resolve annotations through sys.modules
    try:
        exec(compile(source.replace(old, new), module.__file__, "exec"), copy.__dict__)
    finally:
        del sys.modules[copy.__name__]
    return copy


def gaussian_claim(z: float) -> float:
    """Epsilon at DELTA of one Gaussian release with multiplier z (tight, analytic)."""
    return float(dpa.get_epsilon_gaussian(z, DELTA))


# ---- harnesses: (statistic under D, statistic under D', claimed epsilon, delta) ------------------------
def moon_dpap_central(mod=moon_dpap, central_mod=None, z=2.0):
    cfg = Config(algorithm="moon_dpap", dp="central", clients=3, dp_clip=1.0, rounds=4)
    algo = mod.MoonDpap(cfg, torch.nn.Linear(1, 1))
    g = {"w": torch.zeros(N, dtype=torch.float64)}
    outs = []
    for t, sign in ((0, 1.0), (1, -1.0)):  # replace one client: +C on every coordinate vs -C
        up = torch.zeros(3, N, dtype=torch.float64)
        up[0] = sign * cfg.dp_clip
        ctx = RoundContext(t, g, {**algo.hyper(t), "noise_multiplier": z}, {})
        new, _ = algo.server_update(g, {}, {"delta": {"w": up}}, torch.ones(3), ctx)
        outs.append((new["w"] * cfg.clients).numpy())
    return outs[0], outs[1], gaussian_claim(z), DELTA


def moon_dpap_local(mod=moon_dpap, z=2.0):
    cfg = Config(algorithm="moon_dpap", dp="local", clients=3, dp_clip=1.0, rounds=4)
    algo = mod.MoonDpap(cfg, torch.nn.Linear(1, 1))
    outs = []
    for t, sign in ((0, 1.0), (1, -1.0)):
        ctx = RoundContext(t, {"w": torch.zeros(N)}, {**algo.hyper(t), "noise_multiplier": z}, {})
        sent, _ = algo.release({"delta": {"w": torch.full((N,), sign, dtype=torch.float64)}}, 0, ctx)
        outs.append(sent["delta"]["w"].numpy())
    return outs[0], outs[1], gaussian_claim(z), DELTA


def moon_dpap_record(mod=moon_dpap, z=2.0):
    """One DP-SGD step through ``MoonDpap.loss_and_grad`` with the algorithm's own step noise,
    N independent trials at once (``vmap``): under D the batch holds one record whose gradient
    (+5, one parameter) is clipped to C, under D' it holds none (add/remove one record). The loss
    is a stub whose per-sample gradient is the record's ``x``; everything else is the call site."""
    cfg = Config(algorithm="moon_dpap", dp="record", dp_schedule="constant", clients=2, dp_clip=1.0,
                 batch_size=4, rounds=4)
    algo = mod.MoonDpap(cfg, torch.nn.Linear(1, 1))
    algo.record = {"sigma": z, "q": 1.0, "steps": 1, "per_client_epsilon": []}
    algo.loss = lambda p, b, *_: (p["w"] * b["x"][:, 0]).sum()
    algo.frozen_reprs = lambda *_: {}
    params = {"w": torch.zeros(1, dtype=torch.float64)}
    ctx = RoundContext(0, params, algo.hyper(0), {})
    noise = algo.step_noise(0, {"w": torch.zeros(N, dtype=torch.float64)})
    outs = []
    for step, w in ((0, 1.0), (1, 0.0)):
        n = noise.draw(0, step)["w"][:, None]
        batch = {"x": torch.full((N, 1, 1), 5.0, dtype=torch.float64),
                 "y": torch.zeros(N, 1, dtype=torch.long),
                 "w": torch.full((N, 1), w, dtype=torch.float64), "noise": {"w": n}}
        g = torch.func.vmap(lambda b: algo.loss_and_grad(params, b, {}, {}, ctx)[0]["w"])(batch)
        outs.append((g[:, 0] * cfg.batch_size).numpy())
    return outs[0], outs[1], gaussian_claim(z), DELTA


def dp_fedavg_sum(mod=dp_fedavg, z=2.0):
    cfg = Config(
        algorithm="dp_fedavg", clients=2, client_fraction=1.0, dp_clip=1.0, dp_noise_multiplier=z, rounds=4
    )
    algo = mod.DpFedAvg(cfg, torch.nn.Linear(1, 1))
    g = {"w": torch.zeros(N, dtype=torch.float64)}
    state = algo.init_server_state(g)
    outs = []
    for t, rows in ((0, [1.0, 0.0]), (1, [0.0])):  # add/remove one client (+C on every coordinate)
        up = torch.tensor(rows, dtype=torch.float64)[:, None].expand(-1, N).contiguous()
        ctx = RoundContext(t, g, algo.hyper(t), algo.broadcast(state))
        new, _ = algo.server_update(
            g, state, {"delta": {"w": up}, "unclipped": torch.ones(len(rows))}, torch.ones(len(rows)), ctx
        )
        outs.append((new["w"] * algo.expected).numpy())
    return outs[0], outs[1], gaussian_claim(z), DELTA


def _encode(cls, cfg: Config, rows: torch.Tensor, t: int):
    algo = cls(cfg, torch.nn.Linear(rows.shape[1], 1, bias=False))
    return algo.encode(rows, algo.noise_seed(algo.stream, t))[0]


def ldp_fl_coordinate(mod=ldp_fl, eps=1.0):
    cfg = Config(algorithm="ldp_fl", clients=2, ldp_fl_epsilon_per_coordinate=eps, ldp_clip=0.01)
    a = _encode(mod.LdpFl, cfg, torch.full((N, 1), 0.01), 0)["values"][:, 0].numpy()
    b = _encode(mod.LdpFl, cfg, torch.full((N, 1), -0.01), 1)["values"][:, 0].numpy()
    return a, b, eps, 0.0


def signds_selection(mod=signds_fl, eps=2.0, n=50_000):
    cfg = Config(
        algorithm="signds_fl", clients=2, signds_epsilon_per_round=eps, signds_k=0.1, signds_h=3,
        signds_threshold=0.6,
    )
    d = 20
    base = torch.zeros(d)
    base[[0, 1]], base[[18, 19]] = 1.0, -1.0
    stats = []
    for t, upd in ((0, base), (1, -base)):
        out = _encode(mod.SignDsFl, cfg, upd.expand(n, -1).contiguous(), t)
        plus = out["values"].sum(1) > 0  # the client's random sign s
        top_d = torch.where(plus[:, None], torch.tensor([0, 1]), torch.tensor([18, 19]))  # D's top set for s
        stats.append(out["mask"].gather(1, top_d).sum(1).numpy())
    return stats[0], stats[1], eps, 0.0


def fdl_selection(mod=fdl, eps=6.0, n=200_000):
    """Two draws from four dimensions; D favours {0, 1}, D' favours {2, 3} (utility 1 vs 0)."""
    cfg = Config(
        algorithm="fdl",
        fdl_mode="corrected",
        clients=2,
        fdl_epsilon_per_round=eps,
        ldp_clip=1.0,
        fdl_r=1.0,
        fdl_k=2,
        model="mlp",
    )
    d = 4
    a_in, b_in = torch.zeros(n, d), torch.zeros(n, d)
    a_in[:, :2], b_in[:, 2:4] = 1.0, 1.0
    a = _encode(mod.Fdl, cfg, a_in, 0)["mask"][:, :2].sum(1).numpy()
    b = _encode(mod.Fdl, cfg, b_in, 1)["mask"][:, :2].sum(1).numpy()
    eps_sel = cfg.fdl_selection_share * eps
    return a, b, eps_sel, 0.0


def fdl_values(mod=fdl, eps=4.0):
    cfg = Config(
        algorithm="fdl", fdl_mode="corrected", clients=2, fdl_epsilon_per_round=eps, ldp_clip=1.0, fdl_k=1,
        model="mlp",
    )
    a = _encode(mod.Fdl, cfg, torch.ones(N, 1), 0)["values"][:, 0].numpy()
    b = _encode(mod.Fdl, cfg, -torch.ones(N, 1), 1)["values"][:, 0].numpy()
    eps_val = (1 - cfg.fdl_selection_share) * eps
    return a, b, eps_val, 0.0


HARNESSES = {
    "moon_dpap_central": moon_dpap_central,
    "moon_dpap_local": moon_dpap_local,
    "moon_dpap_record": moon_dpap_record,
    "dp_fedavg_sum": dp_fedavg_sum,
    "ldp_fl_coordinate": ldp_fl_coordinate,
    "signds_selection": signds_selection,
    "fdl_selection": fdl_selection,
    "fdl_values": fdl_values,
}

#: (harness, module, exact source text, its mutation): each halves the noise or doubles a budget.
MUTATIONS = {
    "moon_dpap central: add/remove sensitivity": (
        "moon_dpap_central",
        moon_dpap,
        "Relation.REPLACE_ONE, self.central_noise_seed(ctx)",
        "Relation.ADD_REMOVE, self.central_noise_seed(ctx)",
    ),
    "moon_dpap local: half the noise": (
        "moon_dpap_local",
        moon_dpap,
        'ctx.hyper["noise_multiplier"], seed,',
        '0.5 * ctx.hyper["noise_multiplier"], seed,',
    ),
    "moon_dpap record: half the step noise": (
        "moon_dpap_record",
        moon_dpap,
        'self.record["sigma"] * self.config.dp_clip',
        '0.5 * self.record["sigma"] * self.config.dp_clip',
    ),
    "dp_fedavg: half the noise": (
        "dp_fedavg_sum",
        dp_fedavg,
        "clip, self.z_delta, Relation.ADD_REMOVE",
        "clip, 0.5 * self.z_delta, Relation.ADD_REMOVE",
    ),
    "ldp_fl: twice the budget": (
        "ldp_fl_coordinate",
        ldp_fl,
        "c.ldp_fl_epsilon_per_coordinate, g)",
        "2 * c.ldp_fl_epsilon_per_coordinate, g)",
    ),
    "signds_fl: twice the budget": (
        "signds_selection",
        signds_fl,
        "c.signds_epsilon_per_round, rng_for(*seed)",
        "2 * c.signds_epsilon_per_round, rng_for(*seed)",
    ),
    "fdl: the selection budget spent k times": (
        "fdl_selection",
        fdl,
        "return self.split()[0] / k",
        "return self.split()[0]",
    ),
    "fdl: Laplace at half the scale": ("fdl_values", fdl, "return 2.0 * k", "return 1.0 * k"),
}


@pytest.fixture(autouse=True)
def per_coordinate_trials(monkeypatch):
    """The Gaussian audits put the full sensitivity on every coordinate (one trial each), which no
    real update may: the noisy sum's row-norm check (tested on its own, and at the call sites by
    tests/test_call_sites.py) is lifted for them."""
    monkeypatch.setattr(central, "check_rows", lambda *a, **k: None)


@pytest.mark.parametrize("name", sorted(HARNESSES))
def test_audit_stays_below_the_claim(name):
    a, b, claim, delta = HARNESSES[name]()
    res = epsilon_lower_bound(a, b, delta=delta, alpha=ALPHA)
    assert res.epsilon_lower_bound <= claim, (name, res)
    assert res.epsilon_lower_bound > 0.3 * claim, (name, res)  # the audit has power here


@pytest.mark.source_mutation
@pytest.mark.parametrize("name", sorted(MUTATIONS))
def test_audit_catches_a_mutated_call_site(name):
    """Each mutation is caught: the mechanism refuses its input at once (it verifies the
    sensitivity it is told), or the audit finds more epsilon than claimed."""
    harness, module, old, new = MUTATIONS[name]
    try:
        a, b, claim, delta = HARNESSES[harness](mutated(module, old, new))
    except SensitivityError:
        return
    res = epsilon_lower_bound(a, b, delta=delta, alpha=ALPHA)
    assert res.epsilon_lower_bound > claim, (name, res)


@pytest.mark.parametrize(
    "old,new",
    [
        ("sigma = noise_multiplier * grid_sensitivity", "sigma = 0.5 * noise_multiplier * grid_sensitivity"),
    ],
)
@pytest.mark.source_mutation
def test_audit_catches_a_mutated_central_mechanism(monkeypatch, old, new):
    """The shared central mechanism, mutated: every central call site notices."""
    mutant = mutated(central, old, new)
    monkeypatch.setattr(mutant, "check_rows", lambda *a, **k: None)
    monkeypatch.setattr(moon_dpap, "noisy_sum", mutant.noisy_sum)
    monkeypatch.setattr(dp_fedavg, "noisy_sum", mutant.noisy_sum)
    for harness in (moon_dpap_central, dp_fedavg_sum):
        a, b, claim, delta = harness()
        assert epsilon_lower_bound(a, b, delta=delta, alpha=ALPHA).epsilon_lower_bound > claim


@pytest.mark.parametrize(
    "old,new",
    [
        ("clip / norms.clamp_min(clip)", "2 * clip / norms.clamp_min(clip)"),  # clipped to 2C
        ("(summed[k] + noise[k])", "(summed[k] + 0.5 * noise[k])"),  # half the noise
    ],
)
@pytest.mark.source_mutation
def test_audit_catches_a_mutated_dpsgd_step(monkeypatch, old, new):
    """DP-SGD's clip and noise, mutated in :mod:`fedlib.privacy.dpsgd`: the record-level audit
    (through MOON-DPAP's call site) notices. (The divisor B is not a privacy parameter: scaling
    the released gradient changes no likelihood ratio, so no mutation of it is listed.)"""
    mutant = mutated(dpsgd, old, new)
    monkeypatch.setattr(moon_dpap, "private_grad", mutant.private_grad)
    a, b, claim, delta = moon_dpap_record()
    assert epsilon_lower_bound(a, b, delta=delta, alpha=ALPHA).epsilon_lower_bound > claim


@pytest.mark.source_mutation
def test_audit_catches_a_mutated_laplace_scale(monkeypatch):
    mutant = mutated(
        local,
        "math.ceil(l1_sensitivity / epsilon / grid.step)",
        "math.ceil(0.5 * l1_sensitivity / epsilon / grid.step)",
    )
    monkeypatch.setattr(fdl, "discrete_laplace_values", mutant.discrete_laplace_values)
    a, b, claim, delta = fdl_values()
    assert epsilon_lower_bound(a, b, delta=delta, alpha=ALPHA).epsilon_lower_bound > claim


@pytest.mark.heavy
def test_audit_of_the_adaptive_clipping_count():
    """The count query of adaptive clipping (sensitivity 1/2, noise sigma_b), at its call site:
    one scalar per call, so 60,000 calls."""
    clip = central.AdaptiveClipping(0.5, 0.2, count_std=0.5)
    n = 60_000
    # add/remove one client whose update was unclipped (b_i - 1/2 = +1/2)
    a = np.array([clip.next_clip(1.0, torch.tensor([1.0, 0.0]), 1.0, (1, t)) for t in range(n)])
    b = np.array([clip.next_clip(1.0, torch.tensor([0.0]), 1.0, (2, t)) for t in range(n)])
    claim = gaussian_claim(clip.count_std / 0.5)
    res = epsilon_lower_bound(np.log(a), np.log(b), delta=DELTA, alpha=ALPHA)
    assert 0.3 * claim < res.epsilon_lower_bound <= claim


def test_clopper_pearson_covers_and_audit_is_zero_without_signal():
    lo, hi = clopper_pearson(10, 100, 0.05)
    assert lo < 0.1 < hi and clopper_pearson(0, 10, 0.05)[0] == 0.0
    rng = np.random.default_rng(0)
    same = epsilon_lower_bound(rng.normal(size=100_000), rng.normal(size=100_000), alpha=ALPHA)
    assert same.epsilon_lower_bound < 0.1


@pytest.mark.source_mutation
def test_mutation_helper_refuses_a_missing_target():
    with pytest.raises(AssertionError, match="not found"):
        mutated(importlib.import_module("fedlib.algorithms.fdl"), "no such text", "x")

"""No privacy noise drawn twice (issue 44): every mechanism that releases noise draws independently
across rounds, clients, steps and configurations.

Each case runs two rounds through the sequential engine inside :func:`fedlib.privacy.record.drawing`,
which collects what each mechanism call drew, from the mechanism itself (its first values and a
digest of all of them), not from a re-derivation of its keys. Then:

* no two draws are equal (digests): a key that repeats (a round, client or step index replaced by a
  constant, an element dropped, two streams swapped) draws the same values twice;
* no two draws of one size are correlated (|Pearson r| of their first 64 values below 0.75): the
  same stream read with another scale (another noise level, another budget) is caught too. For
  independent draws r is about N(0, 1/64) (sd 0.125), so 0.75 is 6 sd: a chance failure has
  probability about 2e-9 per pair (a few thousand pairs here), and the draws are seeded, so a
  passing case passes on every machine;
* no generator of one kind (torch or numpy) is seeded twice from the same key
  (:class:`fedlib.privacy.record.DrawLog`): two mechanisms that share a stream (a stream id dropped
  from the key, or swapped for another's) draw correlated noise even where one of them draws too
  few values for a digest or a correlation to show it (adaptive clipping's count draws one);
* a second configuration differing only in a privacy setting draws anew (its draws and keys join
  the comparison).

The cases are the algorithms of the registry that state a privacy guarantee: an algorithm added
later with one and no case here fails :func:`test_every_private_algorithm_has_a_case`.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from fedlib import Config
from fedlib.algorithms import ALGORITHMS, Algorithm
from fedlib.engine import Executor
from fedlib.experiment import Experiment
from fedlib.privacy.record import Draw, DrawLog, drawing
from fedlib.streams import Stream

SMOKE = dict(clients=4, train_samples=400, test_samples=100, rounds=2, min_client_samples=20, lr=0.05,
             momentum=0.0, profile="smoke", model="mlp")
#: name -> (the config, the privacy setting changed for the second config)
CASES: dict[str, tuple[Config, dict]] = {
    "dp_fedavg fixed": (Config(algorithm="dp_fedavg", client_fraction=0.5, dp_clip=0.05, **SMOKE),
                        {"dp_noise_multiplier": 1.5}),
    "dp_fedavg adaptive": (Config(algorithm="dp_fedavg", client_fraction=0.5, dp_clip=0.01,
                                  adaptive_clip=True,
                                  clip_count_std=1.0, **SMOKE), {"clip_count_std": 1.5}),
    # the float64 (not secure_noise) paths of the sum and of the adaptive count
    "dp_fedavg adaptive float": (Config(algorithm="dp_fedavg", client_fraction=0.5, dp_clip=0.01,
                                        adaptive_clip=True, clip_count_std=1.0, secure_noise=False, **SMOKE),
                                 {"clip_count_std": 1.5}),
    "moon_dpap central": (Config(algorithm="moon_dpap", dp="central", dp_clip=0.05, **SMOKE),
                          {"dp_epsilon_per_round": 2.0}),
    "moon_dpap central float": (Config(algorithm="moon_dpap", dp="central", dp_clip=0.05, secure_noise=False,
                                       **SMOKE), {"dp_epsilon_per_round": 2.0}),
    "moon_dpap local": (Config(algorithm="moon_dpap", dp="local", dp_clip=0.05, **SMOKE),
                        {"dp_epsilon_per_round": 2.0}),
    "moon_dpap record": (Config(algorithm="moon_dpap", dp="record", dp_schedule="constant", dp_clip=1.0,
                                dp_epsilon_total=8.0, **SMOKE), {"dp_epsilon_total": 9.0}),
    "ldp_fl": (Config(algorithm="ldp_fl", **SMOKE), {"ldp_fl_epsilon_per_coordinate": 0.6}),
    "signds_fl": (Config(algorithm="signds_fl", **SMOKE), {"signds_epsilon_per_round": 0.6}),
    "fdl corrected": (Config(algorithm="fdl", fdl_mode="corrected", **SMOKE), {"fdl_epsilon_per_round": 0.6}),
    "fdl as published": (Config(algorithm="fdl", **SMOKE), {"fdl_epsilon_per_draw": 0.6}),
}
#: The mechanisms each case must show at least two draws of (two rounds, or two clients, or two steps).
EXPECTED = {
    "dp_fedavg fixed": {"gaussian_sum"}, "dp_fedavg adaptive": {"gaussian_sum", "gaussian_count"},
    "dp_fedavg adaptive float": {"gaussian_sum", "gaussian_count"},
    "moon_dpap central": {"gaussian_sum"}, "moon_dpap central float": {"gaussian_sum"},
    "moon_dpap local": {"gaussian_sum"}, "moon_dpap record": {"dpsgd_step"}, "ldp_fl": {"two_point"},
    "signds_fl": {"signds_selection"}, "fdl corrected": {"gumbel", "discrete_laplace"},
    "fdl as published": {"gumbel", "laplace"},
}
MAX_ABS_R = 0.75


def draws_of(config: Config, rounds: int) -> DrawLog:
    exp = Experiment(config, torch.device("cpu"))
    with drawing() as log, Executor("sequential", exp.algo, exp.data.x_train, exp.data.y_train) as ex:
        for t in range(rounds):
            exp.round(t, ex)
    return log


def repeated_keys(keys: list[tuple[str, tuple[int, ...]]]) -> list[tuple[str, tuple[int, ...]]]:
    """The (kind, key) pairs that seeded more than one generator."""
    seen: set = set()
    return [k for k in keys if k in seen or seen.add(k)]


def malformed_keys(keys: list[tuple[str, tuple[int, ...]]], config: Config, rounds: int) -> list[tuple]:
    """Keys that do not start (the config's noise key, a stream id, a round of the run): the stream id
    keeps two mechanisms' keys apart even where their other integers coincide (a key without it,
    (noise key, round, client), would meet (noise key, stream, round) of another mechanism in round
    ``stream``)."""
    ids = {int(s) for s in Stream}
    head = int(config.noise_key(), 16)
    return [k for _, k in keys if len(k) < 3 or k[0] != head or k[1] not in ids or k[2] not in range(rounds)]


def dependent_pairs(draws: list[Draw]) -> list[tuple[int, int, str]]:
    """Pairs of draws that are equal or correlated (see the module's docstring)."""
    bad = []
    for (i, a), (j, b) in itertools.combinations(enumerate(draws), 2):
        if a.digest == b.digest and a.size > 0:
            bad.append((i, j, f"{a.mechanism} drew the same {a.size} values twice"))
        elif a.size == b.size and len(a.head) >= 32:
            x, y = np.asarray(a.head), np.asarray(b.head)
            if x.std() > 0 and y.std() > 0:
                r = float(np.corrcoef(x, y)[0, 1])
                if abs(r) >= MAX_ABS_R:
                    bad.append((i, j, f"{a.mechanism} draws correlated: r = {r:.3f}"))
    return bad


def test_the_check_finds_a_repeated_and_a_rescaled_draw():
    rng = np.random.default_rng(0)
    x = rng.normal(size=100)
    head = lambda v: tuple(v[:64].tolist())  # noqa: E731
    fresh = [Draw("m", 100, head(rng.normal(size=100)), str(i)) for i in range(20)]
    assert dependent_pairs(fresh) == []
    assert dependent_pairs([*fresh, Draw("m", 100, head(x), "a"), Draw("m", 100, head(x), "a")])
    assert dependent_pairs([*fresh, Draw("m", 100, head(x), "a"), Draw("m", 100, head(3 * x), "b")])


def test_every_private_algorithm_has_a_case():
    """From the registry: an algorithm that states a guarantee (overrides ``Algorithm.guarantee``)
    has a case here, and every case's config is private."""
    private = {name for name, cls in ALGORITHMS.items() if cls.guarantee is not Algorithm.guarantee}
    covered = {cfg.algorithm for cfg, _ in CASES.values()}
    assert private <= covered, f"no noise-independence case for {sorted(private - covered)}"
    for cfg, change in CASES.values():
        cfg.validate()
        cfg.replace(**change).validate()


@pytest.mark.parametrize("name", sorted(CASES))
def test_noise_is_never_drawn_twice(name):
    config, change = CASES[name]
    first = draws_of(config, rounds=2)
    second = draws_of(config.replace(**change), rounds=1)
    counts = {m: sum(d.mechanism == m and d.size > 0 for d in first) for m in EXPECTED[name]}
    assert all(n >= 2 for n in counts.values()), counts  # every mechanism records what it drew
    assert {d.mechanism for d in second} >= EXPECTED[name]
    draws = first + second
    bad = dependent_pairs(draws)
    assert not bad, bad[:5]
    assert first.keys and second.keys
    again = repeated_keys(first.keys + second.keys)
    assert not again, f"{len(again)} generator key(s) used twice, e.g. {again[0]}"
    odd = malformed_keys(first.keys, config, 2) + malformed_keys(second.keys, config.replace(**change), 1)
    assert not odd, f"{len(odd)} key(s) without the noise key, a stream id and the round, e.g. {odd[0]}"


def test_the_key_shape_check_finds_a_key_without_its_stream():
    config = CASES["moon_dpap record"][0]
    head = int(config.noise_key(), 16)
    good = [("numpy", (head, int(Stream.RECORD_SAMPLING), 1, 3)), ("torch", (head, 73, 0, 3, 5))]
    assert malformed_keys(good, config, 2) == []
    dropped = ("numpy", (head, 1, 3))  # Stream.RECORD_SAMPLING left out: (noise key, round, client)
    assert malformed_keys([*good, dropped], config, 2) == [dropped[1]]
    assert malformed_keys([("numpy", (0, 71, 1))], config, 2)  # the run's seed instead of its noise key
    assert malformed_keys([("numpy", (head, 71, 7))], config, 2)  # a round the run never had


def test_the_key_check_finds_a_shared_stream():
    assert repeated_keys([("torch", (1, 2, 3)), ("numpy", (1, 2, 3)), ("torch", (1, 2, 4))]) == []
    assert repeated_keys([("torch", (1, 2, 3)), ("torch", (1, 2, 3))]) == [("torch", (1, 2, 3))]


@pytest.mark.parametrize("executor", ["sequential", "vectorized"])
def test_counter_step_noise_is_never_drawn_twice_and_the_lanes_draw_what_clients_draw(executor,
                                                                                    restore_kernels):
    """Record-level DP-SGD with ``step_noise="counter"`` (Philox keyed per run and round, countered
    per client and step): on the sequential path and on the vectorized one (every lane's noise in
    one draw) no draw repeats or correlates, no (key, counter) is used twice, and the vectorized path
    notes exactly the sequential path's keys and draws."""
    from fedlib.kernels import set_kernel_options

    set_kernel_options(step_noise="counter")
    config, change = CASES["moon_dpap record"]

    def log_of(cfg: Config, rounds: int, path: str) -> DrawLog:
        exp = Experiment(cfg, torch.device("cpu"))
        with drawing() as log, Executor(path, exp.algo, exp.data.x_train, exp.data.y_train) as ex:
            for t in range(rounds):
                exp.round(t, ex)
        return log

    first, second = log_of(config, 2, executor), log_of(config.replace(**change), 1, executor)
    kinds = {k for k, _ in first.keys}
    assert "philox" in kinds and "torch" not in kinds  # (numpy: the Poisson batches)
    assert sum(d.mechanism == "dpsgd_step" for d in first) >= 2
    assert not dependent_pairs(first + second)
    assert not repeated_keys(first.keys + second.keys)
    assert not malformed_keys(first.keys, config, 2)
    if executor == "vectorized":
        reference = log_of(config, 2, "sequential")
        assert sorted(first.keys) == sorted(reference.keys)
        assert sorted(d.digest for d in first) == sorted(d.digest for d in reference)

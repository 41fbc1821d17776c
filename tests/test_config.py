import pytest

from fedlib import run
from fedlib.config import Config, ConfigError
from fedlib.results import results_dir

INVALID = [
    ({"alpha": 0.0}, "alpha"),
    ({"alpha": -1.0}, "alpha"),
    ({"clients": 0}, "clients"),
    ({"clients": 70_000}, "more clients"),
    ({"client_fraction": 0.0}, "client_fraction"),
    ({"client_fraction": 1.5}, "client_fraction"),
    ({"dataset": "cifar10"}, "unknown dataset"),
    ({"algorithm": "nope"}, "unknown algorithm"),
    ({"model": "resnet"}, "unknown model"),
    ({"partition": "zipf"}, "unknown partition"),
    ({"lr": -0.1}, "lr"),
    ({"lr": 0.0}, "lr"),
    ({"rounds": 0}, "rounds"),
    ({"batch_size": 0}, "batch_size"),
    ({"local_epochs": 0}, "local_epochs"),
    ({"momentum": 1.0}, "momentum"),
    ({"weight_decay": -1.0}, "weight_decay"),
    ({"dropout": 1.0}, "dropout"),
    ({"precision": "float16"}, "precision"),
    ({"seed": -1}, "seed"),
    ({"train_samples": 10**6}, "train_samples"),
    ({"eval_every": 0}, "eval_every"),
    ({"rounds": 2.5}, "rounds must be int"),
    ({"profile": "huge"}, "unknown profile"),
    ({"train_samples": 100, "clients": 20, "min_client_samples": 10}, "exceeds"),
]


@pytest.mark.parametrize(("changes", "message"), INVALID)
def test_invalid_config_rejected_before_any_work(changes, message):
    cfg = Config(**changes)
    with pytest.raises(ConfigError, match=message):
        run(cfg, progress=False)
    assert not results_dir().exists() or not any(results_dir().rglob("*")), "nothing written"


def test_unknown_field_in_replace():
    with pytest.raises(ConfigError, match="unknown config field"):
        Config().replace(learning_rate=0.1)


def test_key_is_stable_and_sensitive():
    a = Config()
    assert a.key() == Config().key()
    assert a.key() != a.replace(seed=1).key()
    assert a.key() == Config.from_dict(a.to_dict()).key()


def test_every_algorithm_field_has_an_owner_that_reads_it():
    import dataclasses

    from fedlib.algorithms import ALGORITHMS

    owned = {f.name: f.metadata["owner"] for f in dataclasses.fields(Config) if f.metadata.get("owner")}
    for name, cls in ALGORITHMS.items():
        for f in cls.fields:
            assert name in owned[f].split(","), (name, f)
    for f, owners in owned.items():
        for a in owners.split(","):
            assert f in ALGORITHMS[a].fields, (f, a)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"algorithm": "fedprox", "prox_mu": -1.0}, "prox_mu"),
        ({"algorithm": "feddyn", "feddyn_alpha": 0.0}, "feddyn_alpha"),
        ({"algorithm": "moon", "moon_tau": 0.0}, "moon_tau"),
        ({"algorithm": "moon_dpap", "dp": "central", "client_fraction": 0.5}, "client_fraction = 1"),
        (
            {"algorithm": "moon_dpap", "dp": "central", "dp_schedule": "constant", "dp_epsilon_total": 0.0},
            "dp_epsilon_total",
        ),
        ({"algorithm": "dp_fedavg", "adaptive_clip": True, "dp_noise_multiplier": 3.0}, "clip_count_std"),
        (
            {"algorithm": "fdl", "fdl_mode": "corrected", "fdl_epsilon_per_round": 0.0},
            "fdl_epsilon_per_round",
        ),
        ({"algorithm": "signds_fl", "signds_k": 0.5}, "signds_k"),
    ],
)
def test_each_algorithm_checks_its_own_fields(changes, message):
    with pytest.raises(ConfigError, match=message):
        Config(**changes).validate()



def _other_value(default):
    """A value of the same type as ``default`` that differs from it."""
    if isinstance(default, bool):
        return not default
    if isinstance(default, int):
        return default + 1
    if isinstance(default, float):
        return default * 2 + 1
    return default + "_other"


def test_every_algorithm_refuses_every_setting_it_does_not_read():
    """Issue 65: a field another algorithm owns, set away from its default, is refused before any work
    with one line naming the field and the algorithms that read it (``--algorithm fedavg --dp record``
    once trained without privacy); a field the algorithm owns is never refused for that reason."""
    import dataclasses

    from fedlib.algorithms import ALGORITHMS
    from fedlib.config import owners_of, ownership_problems

    owned = [f for f in dataclasses.fields(Config) if owners_of(f.name)]
    names = {f.name for f in owned}
    assert {"dp", "dp_epsilon_total", "dp_noise_multiplier", "fdl_mode", "signds_h"} <= names
    for algorithm in ALGORITHMS:
        for f in owned:
            cfg = Config(algorithm=algorithm).replace(**{f.name: _other_value(f.default)})
            problems = ownership_problems(cfg)
            if algorithm in owners_of(f.name):
                assert problems == [], (algorithm, f.name)
                continue
            assert len(problems) == 1 and problems[0].startswith(f"{f.name} = "), (algorithm, f.name)
            assert all(o in problems[0] for o in owners_of(f.name))
            with pytest.raises(ConfigError, match=f.name):
                cfg.validate()


def test_a_run_that_asks_for_dp_on_an_algorithm_without_it_is_refused_by_the_command_line(capsys):
    from fedlib.__main__ import main

    for args in (["--dp", "record"], ["--dp", "central"], ["--dp-epsilon-total", "0"], ["--dp-delta", "1"]):
        assert main(["run", "--algorithm", "fedavg", "--rounds", "1", *args]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "moon_dpap" in err[0] and "fedavg does not read it" in err[0]

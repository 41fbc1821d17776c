import pytest

from fedlib import run
from fedlib.config import PROFILES, Config, ConfigError
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


def test_profiles_shrink():
    paper = Config(rounds=200, clients=20)
    quick = PROFILES["quick"].apply(paper)
    assert quick.rounds <= 20 and quick.train_samples == 4_000 and quick.profile == "quick"
    assert PROFILES["paper"].apply(paper).replace(profile="custom") == paper
    smoke = PROFILES["smoke"].apply(paper).validate()
    assert smoke.rounds == 2 and smoke.clients == 4

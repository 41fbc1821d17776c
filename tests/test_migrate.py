"""Results carried over RESULTS_VERSION bumps: kept where the change left them valid (renamed to their
new key and found by their pages without retraining), removed (to be recomputed) where it did not."""

import json

import pytest

from fedlib import Config, run
from fedlib.config import RESULTS_VERSION
from fedlib.experiment import Experiment
from fedlib.results import Result, result_path
from lab.migrate import key_under, migrate, written_under


def _old_result(root, config_dict: dict, version: int) -> str:
    """A result file as an earlier version wrote it: its config dict then, its key then."""
    key = key_under(config_dict, version)
    d = {
        "config": config_dict,
        "history": [{"round": 1, "test_acc": 0.5, "test_loss": 1.0}],
        # the provenance every result records (fedlib.results.PROVENANCE)
        "meta": {"config_key": key, "device": "cpu", "git_commit": "old", "torch": "x",
                 "seed": config_dict.get("seed", 0), "duration_s": 1.0},
    }
    (root / f"{config_dict['algorithm']}-{key}.json").write_text(json.dumps(d))
    (root / "models").mkdir(exist_ok=True)
    (root / "models" / f"{key}.pt").write_bytes(b"weights")
    return key


def _v2_dict(config: Config, **old_fields) -> dict:
    """``config`` as a version-2 dict: the renamed fields back under their old names."""
    d = config.to_dict()
    for new in (
        "dp_epsilon_per_round",
        "dp_epsilon_total",
        "ldp_fl_epsilon_per_coordinate",
        "signds_epsilon_per_round",
        "fdl_epsilon_per_draw",
        "fdl_epsilon_per_round",
    ):
        d.pop(new)
    return {**d, "dp_epsilon": 1.0, "ldp_epsilon": 0.5, **old_fields}


def test_migration_keeps_unaffected_results_and_renames_old_fields(tmp_path, monkeypatch):
    plain = Config(clients=4, train_samples=600, test_samples=300, rounds=1, min_client_samples=20)
    private = plain.replace(algorithm="dp_fedavg", dp_noise_multiplier=1.0)
    no_noise = plain.replace(algorithm="dp_fedavg", dp_noise_multiplier=0.0, dp_clip=1e9)
    constant = plain.replace(
        algorithm="moon_dpap", dp="central", dp_schedule="constant", dp_epsilon_total=8.0
    )
    signds = plain.replace(algorithm="signds_fl", signds_epsilon_per_round=0.25, model="mlp")
    _old_result(tmp_path, _v2_dict(plain), 1)  # v1, no noise: kept
    _old_result(tmp_path, _v2_dict(private), 1)  # v1 with noise: removed (v2)
    _old_result(tmp_path, _v2_dict(no_noise), 2)  # v2: renamed only
    _old_result(tmp_path, _v2_dict(constant, dp_epsilon=8.0), 2)  # v2 noise: not reproducible (v4)
    _old_result(tmp_path, _v2_dict(signds, ldp_epsilon=0.25, model="mlp"), 2)  # v4: drawn in the client
    assert written_under(_v2_dict(plain), key_under(_v2_dict(plain), 1)) == 1
    report = migrate(tmp_path)
    assert len(report["kept"]) == 2 and len(report["removed"]) == 3 and not report["unknown"]
    for c in (plain, no_noise):
        r = Result.load(result_path(c, tmp_path))
        assert r.config == c and r.meta["config_key"] == c.key()
        assert (tmp_path / "models" / f"{c.key()}.pt").read_bytes() == b"weights"
    for c in (private, constant, signds):
        assert not result_path(c, tmp_path).exists()

    def boom(*a, **k):
        raise AssertionError("a migrated result must be found without training")

    monkeypatch.setattr(Experiment, "prepare", boom)
    assert run(plain, root=tmp_path, progress=False).history[0]["test_acc"] == 0.5
    with pytest.raises(AssertionError, match="without training"):
        run(private, root=tmp_path, progress=False)
    assert len(migrate(tmp_path)["current"]) == 2  # a second pass changes nothing
    assert RESULTS_VERSION == 5


def _v3_result(root, config: Config, **meta) -> None:
    _old_result(root, config.to_dict(), 3)
    if meta:
        path = root / f"{config.algorithm}-{key_under(config.to_dict(), 3)}.json"
        d = json.loads(path.read_text())
        d["meta"].update(meta)
        path.write_text(json.dumps(d))


def test_version_4_keeps_reproducible_draws_only(tmp_path):
    """v4 moved local randomisers into the clients, keyed DP-FedAvg's Poisson sample on the config
    and froze the noise key at version 3: a noisy result trained under version 3 keeps its draws;
    one carried over to 3 from an earlier key, a sampled DP-FedAvg run and the sparse local-DP
    algorithms are recomputed."""
    base = Config(clients=4, train_samples=600, test_samples=300, rounds=1, min_client_samples=20)
    central = base.replace(algorithm="moon_dpap", dp="central")
    local = base.replace(algorithm="moon_dpap", dp="local", seed=1)
    carried = central.replace(seed=2)
    sampled = base.replace(algorithm="dp_fedavg", client_fraction=0.5, dp_noise_multiplier=0.0, dp_clip=1e9)
    full = base.replace(algorithm="dp_fedavg", dp_noise_multiplier=1.0)
    fdl = base.replace(algorithm="fdl", model="mlp")
    for c in (base, central, local, sampled, full, fdl):
        _v3_result(tmp_path, c)
    _v3_result(tmp_path, carried, migrated_from="0123456789abcdef")
    report = migrate(tmp_path)
    kept = {Result.load(tmp_path / n).config for n in [f"{c.algorithm}-{c.key()}.json" for c in
                                                         (base, central, local, full)]}
    assert kept == {base, central, local, full} and len(report["kept"]) == 4
    assert len(report["removed"]) == 3
    for c in (carried, sampled, fdl):
        assert not result_path(c, tmp_path).exists()
    assert central.noise_key() == key_under(central.to_dict(), 3)  # its noise is the one it drew


def test_noise_key_does_not_follow_results_version(monkeypatch):
    import fedlib.config as config_mod

    c = Config(algorithm="dp_fedavg", dp_noise_multiplier=1.0)
    key, noise = c.key(), c.noise_key()
    monkeypatch.setattr(config_mod, "RESULTS_VERSION", 99)
    assert Config.key.__defaults__ is not None
    assert c.key(version=99) != key and c.noise_key() == noise
    assert c.noise_key() != c.replace(seed=1).noise_key()


def test_version_5_recomputes_private_runs_that_diverged(tmp_path):
    base = Config(clients=4, train_samples=600, test_samples=300, rounds=1, min_client_samples=20)
    private = base.replace(algorithm="moon_dpap", dp="central")
    for c in (base, private, private.replace(seed=1)):
        _old_result(tmp_path, c.to_dict(), 4)
    for c in (base, private):  # both diverge; only the private one may have changed
        path = tmp_path / f"{c.algorithm}-{key_under(c.to_dict(), 4)}.json"
        d = json.loads(path.read_text())
        d["history"][0]["test_loss"] = float("nan")
        path.write_text(json.dumps(d))
    report = migrate(tmp_path)
    assert len(report["kept"]) == 2 and len(report["removed"]) == 1
    assert not result_path(private, tmp_path).exists()
    assert result_path(base, tmp_path).exists() and result_path(private.replace(seed=1), tmp_path).exists()

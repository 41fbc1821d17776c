"""Results carried over a RESULTS_VERSION bump: kept where the change left them valid, found by
their notebooks without retraining; removed (to be recomputed) where it did not."""

import json

import pytest

from fedlib import Config, run
from fedlib.config import RESULTS_VERSION
from fedlib.results import Result, result_path
from fedlib.run import Experiment
from fedlib.tools.migrate import migrate, written_under


def _old_result(root, config: Config, version: int) -> None:
    """A result file as an earlier version wrote it (its key under that version)."""
    key = config.key(version)
    d = {"config": config.to_dict(), "history": [{"round": 1, "test_acc": 0.5, "test_loss": 1.0}],
         "meta": {"config_key": key}}
    (root / f"{config.algorithm}-{key}.json").write_text(json.dumps(d))
    (root / "models").mkdir(exist_ok=True)
    (root / "models" / f"{key}.pt").write_bytes(b"weights")


def test_migration_keeps_unaffected_and_removes_affected_results(tmp_path, monkeypatch):
    plain = Config(clients=4, train_samples=600, test_samples=300, rounds=1, min_client_samples=20)
    private = plain.replace(algorithm="dp_fedavg", dp_noise_multiplier=1.0)
    no_noise = plain.replace(algorithm="dp_fedavg", dp_noise_multiplier=0.0, dp_clip=1e9)
    for c in (plain, private, no_noise):
        _old_result(tmp_path, c, RESULTS_VERSION - 1)
    assert written_under(plain, plain.key(RESULTS_VERSION - 1)) == RESULTS_VERSION - 1
    report = migrate(tmp_path)
    assert len(report["kept"]) == 2 and len(report["removed"]) == 1
    for c in (plain, no_noise):
        r = Result.load(result_path(c, tmp_path))
        assert r.meta["config_key"] == c.key() and r.meta["migrated_from"] == c.key(RESULTS_VERSION - 1)
        assert (tmp_path / "models" / f"{c.key()}.pt").read_bytes() == b"weights"
    assert not result_path(private, tmp_path).exists()
    assert not (tmp_path / "models" / f"{private.key(RESULTS_VERSION - 1)}.pt").exists()

    def boom(*a, **k):
        raise AssertionError("a migrated result must be found without training")

    monkeypatch.setattr(Experiment, "prepare", boom)
    assert run(plain, root=tmp_path, progress=False).history[0]["test_acc"] == 0.5
    with pytest.raises(AssertionError, match="without training"):
        run(private, root=tmp_path, progress=False)
    assert migrate(tmp_path)["current"]  # a second pass changes nothing

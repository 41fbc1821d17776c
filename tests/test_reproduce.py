"""lab.reproduce: a committed result re-run with today's code is identical, rounding-level or drifted,
and only a drifted one is replaced, with the replacement on record."""

import math

import pytest

from fedlib import run
from fedlib.config import Config
from fedlib.results import Result
from lab import reproduce

CFG = Config(model="mlp", clients=3, train_samples=300, test_samples=200, rounds=2, min_client_samples=20)


def _committed(root):
    """A result trained into ``root`` on the reference path, as a committed one is loaded."""
    r = run(CFG, root=root, engine="sequential", device="cpu", progress=False)
    return Result.load(r.path)


def test_an_untouched_result_reproduces_bit_for_bit(tmp_path):
    r = _committed(tmp_path)
    [c] = reproduce.reproduce([r], tmp_path, retrain=True, progress=False)
    assert (c.verdict, c.first_difference, c.acc_gap, c.loss_gap) == ("identical", None, 0.0, 0.0)
    assert Result.load(r.path).meta == r.meta  # not rewritten


def test_a_last_digits_difference_is_rounding_and_stays(tmp_path):
    r = _committed(tmp_path)
    r.history[1]["test_loss"] *= 1 + 1e-6
    r.save(r.path)
    [c] = reproduce.reproduce([Result.load(r.path)], tmp_path, retrain=True, progress=False)
    assert c.verdict == "rounding" and c.first_difference == r.history[1]["round"]
    assert c.loss_gap == pytest.approx(1e-6, rel=1e-3)
    assert Result.load(r.path).history[1]["test_loss"] == r.history[1]["test_loss"]  # kept


def test_a_drifted_result_is_replaced_only_with_retrain(tmp_path):
    r = _committed(tmp_path)
    old_acc = r.history[-1]["test_acc"]
    r.history[-1]["test_acc"] = old_acc + 0.05  # 10 test samples of 200: beyond rounding
    r.save(r.path)
    [c] = reproduce.reproduce([Result.load(r.path)], tmp_path, progress=False)
    assert c.verdict == "drifted" and c.acc_gap == pytest.approx(5.0) and "replaced" not in c.note
    assert Result.load(r.path).history[-1]["test_acc"] == old_acc + 0.05
    [c] = reproduce.reproduce([Result.load(r.path)], tmp_path, retrain=True, progress=False)
    now = Result.load(r.path)
    assert c.note == "replaced by its rerun" and now.history[-1]["test_acc"] == old_acc
    assert now.meta["replaces"]["final_test_acc"] == old_acc + 0.05


def test_compare_reads_nan_as_reproduced_and_length_as_drift():
    h = [{"round": 1, "test_acc": 0.1, "test_loss": math.nan, "train_loss": math.nan}]
    assert reproduce.compare(h, [dict(h[0])], 100).verdict == "identical"
    assert reproduce.compare(h, h + h, 100).verdict == "drifted"


def test_cli_selects_by_glob_and_field_and_refuses_bad_filters(tmp_path, capsys):
    _committed(tmp_path)
    assert reproduce.main([f"{CFG.algorithm}-*.json", "--root", str(tmp_path), "--where", "rounds=2",
                           "--report", str(tmp_path / "r.json")]) == 0
    assert "1 identical" in capsys.readouterr().out and (tmp_path / "r.json").exists()
    assert reproduce.main(["*.json", "--root", str(tmp_path), "--where", "rounds=3"]) == 2
    with pytest.raises(SystemExit, match="FIELD=VALUE"):
        reproduce.main(["*.json", "--root", str(tmp_path), "--where", "nonsense=1"])


def test_a_result_trained_on_a_gpu_is_not_compared(tmp_path):
    r = _committed(tmp_path)
    r.meta["device"] = "cuda (NVIDIA H200)"
    r.save(r.path)
    [c] = reproduce.reproduce([Result.load(r.path)], tmp_path, retrain=True, progress=False)
    assert c.verdict == "skipped" and "cuda" in c.note

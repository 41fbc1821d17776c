"""Audits stored like results (issue 66): computed once per configuration, read back afterwards,
damaged files set aside and recomputed, valid JSON even for non-finite values."""

from __future__ import annotations

import json
import math

import pytest

from studies import audits


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDLIB_RESULTS_DIR", str(tmp_path / "results"))
    monkeypatch.setenv("FEDLIB_RUN_LOG", str(tmp_path / "log.jsonl"))
    return tmp_path


def test_an_audit_is_computed_once_and_read_back(store):
    calls = []

    def compute():
        calls.append(1)
        return [{"image": 0, "psnr": math.inf, "mse": 0.0}, {"image": 1, "psnr": 12.5, "mse": math.nan}]

    config = {"steps": 3, "levels": [0.1, 1.0]}
    first = audits.cached("demo", 1, config, compute)
    again = audits.cached("demo", 1, config, compute)
    assert len(calls) == 1 and again[0]["psnr"] == math.inf and math.isnan(again[1]["mse"])
    assert first[1]["psnr"] == again[1]["psnr"] == 12.5
    path = audits.audit_path("demo", 1, config, store / "results")
    json.loads(path.read_text(), parse_constant=lambda c: pytest.fail(f"{c} is not JSON"))
    log = [json.loads(line) for line in (store / "log.jsonl").read_text().splitlines()]
    assert [x["cached"] for x in log] == [False, True]
    audits.cached("demo", 1, {**config, "steps": 4}, compute)  # another configuration: computed
    audits.cached("demo", 2, config, compute)  # another version of the code: computed
    assert len(calls) == 3


def test_a_damaged_audit_is_set_aside_and_recomputed(store):
    config = {"steps": 3}
    audits.cached("demo", 1, config, lambda: [{"psnr": 20.0}])
    path = audits.audit_path("demo", 1, config, store / "results")
    d = json.loads(path.read_text())
    d["rows"][0]["psnr"] = 40.0  # edited without the hash
    path.write_text(json.dumps(d))
    assert audits.cached("demo", 1, config, lambda: [{"psnr": 21.0}]) == [{"psnr": 21.0}]
    assert list((store / "results" / "audits" / "demo" / "rejected").iterdir())


def test_the_inversion_page_reads_its_committed_audit_and_attacks_nothing(monkeypatch):
    """The DP-FL claim-4 page's sweep at its committed configuration (paper: 8 images, 50 steps, 9
    noise levels) is in the store: reading it calls no attack."""
    import numpy as np

    from studies.dpfl import pages

    monkeypatch.delenv("FEDLIB_RESULTS_DIR", raising=False)
    monkeypatch.setattr(pages, "inversion_sweep", lambda *a, **k: pytest.fail("the attack ran"))
    df = pages.inversion_audit(list(np.geomspace(1e-5, 1e-1, 9)), images=8, steps=50)
    assert len(df) == 8 * 11 and set(df["defence"]) == {"none", "clip only", "clip + noise"}

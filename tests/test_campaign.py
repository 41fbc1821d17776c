"""The campaign: plan, train in slices within a budget, and move results between machines safely."""

import json
import math
import os
import subprocess
import sys
import tarfile

import pytest

from fedlib import Config
from fedlib.results import result_path
from fedlib.tools import campaign

TINY = Config(
    clients=4, train_samples=320, test_samples=100, rounds=2, min_client_samples=10, profile="smoke"
)
PAGES = {"page_a": [TINY, TINY.replace(seed=1)], "page_b": [TINY.replace(algorithm="scaffold"), TINY]}


@pytest.fixture
def pages(monkeypatch):
    monkeypatch.setattr(campaign, "needed", lambda profile: PAGES)
    return PAGES


def test_plan_counts_what_is_missing(pages, tmp_path):
    rows = {r["page"]: r for r in campaign.plan("smoke", root=tmp_path, kind="cpu")}
    assert rows["page_a"]["needed"] == 2 and rows["page_a"]["missing"] == 2
    assert len(campaign.missing(pages, tmp_path)) == 3  # distinct configs across pages


def test_run_trains_the_missing_and_then_nothing(pages, tmp_path, monkeypatch):
    monkeypatch.setenv("FEDLIB_RESULTS_DIR", str(tmp_path))
    out = campaign.run("smoke", budget_min=30, root=tmp_path, progress=False)
    assert out["trained"] == 3 and out["still missing"] == 0
    again = campaign.run("smoke", budget_min=30, root=tmp_path, progress=False)
    assert again["trained"] == 0 and again["still missing"] == 0


def test_a_spent_budget_starts_nothing_and_leaves_no_partial_result(pages, tmp_path, monkeypatch):
    monkeypatch.setattr(campaign, "bench_seconds_per_sample", lambda kind: (10.0, "stub"))  # huge estimates
    out = campaign.run("smoke", budget_min=0.01, root=tmp_path, progress=False)
    assert out["trained"] == 0 and out["still missing"] == 3
    assert not list(tmp_path.glob("*.json"))


def test_a_deadline_mid_run_checkpoints_and_resumes(tmp_path):
    from fedlib.results import checkpoint_path
    from fedlib.run import run_many

    cfg = TINY.replace(rounds=3)
    stopped = run_many([cfg], root=tmp_path, progress=False, deadline=0.0)  # past the deadline at once
    assert stopped == [None] and not result_path(cfg, tmp_path).exists()
    assert checkpoint_path(cfg, tmp_path).exists()
    done = run_many([cfg], root=tmp_path, progress=False)[0]
    assert done.meta["resumed_from_round"] == 1 and len(done.history) == 3


def test_groups_put_one_shape_together(pages):
    gs = campaign.groups(campaign.missing(pages), per_sample=1e-6)
    assert sorted(len(g) for g in gs) == [1, 2]  # scaffold alone; the two fedavg seeds together


def test_pack_and_unpack_check_every_file(tmp_path):
    from fedlib.run import run

    src, dst = tmp_path / "src", tmp_path / "dst"
    results = [run(c, root=src, progress=False) for c in (TINY, TINY.replace(seed=1))]
    archives = campaign.pack([r.path for r in results], tmp_path / "out", limit=1)  # one file per archive
    assert len(archives) == 2
    report = campaign.unpack(archives, root=dst)
    assert len(report["added"]) == 2 and all((dst / r.path.name).exists() for r in results)
    assert len(campaign.unpack(archives, root=dst)["already present"]) == 2

    bad = json.loads(results[0].path.read_text())
    bad["history"][-1]["test_acc"] = math.nan
    wrong_name = tmp_path / "bad.tgz"
    for name, payload in (
        (results[0].path.name, bad),
        ("fedavg-0000000000000000.json", json.loads(results[1].path.read_text())),
    ):
        f = tmp_path / name
        f.write_text(json.dumps(payload))
        with tarfile.open(wrong_name, "w:gz") as tar:
            tar.add(f, arcname=name)
        with pytest.raises(campaign.InvalidResult):
            campaign.unpack([wrong_name], root=tmp_path / "none")
        assert not (tmp_path / "none").exists() or not list((tmp_path / "none").glob("*.json"))
    no_meta = json.loads(results[1].path.read_text())
    del no_meta["meta"]["git_commit"]
    with pytest.raises(campaign.InvalidResult, match="provenance"):
        campaign.check_result(results[1].path.name, json.dumps(no_meta).encode())


def test_plan_of_the_real_pages_covers_every_profile():
    for profile in ("smoke", "paper"):
        rows = campaign.plan(profile, kind="cpu")
        assert sum(r["needed"] for r in rows) > 100


def test_the_short_command_plans_and_reports_the_distinct_missing(tmp_path):
    env = {**os.environ, "FEDLIB_RESULTS_DIR": str(tmp_path)}
    out = subprocess.run([sys.executable, "-m", "fedlib.campaign", "plan", "--profile", "smoke"],
                         capture_output=True, text=True, env=env, check=True).stdout
    total = int(out.strip().splitlines()[-1].rsplit(":", 1)[1])
    assert total == len(campaign.missing(campaign.needed("smoke"), tmp_path)) > 0

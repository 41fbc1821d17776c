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
from lab import campaign

TINY = Config(
    clients=4, train_samples=320, test_samples=100, rounds=2, min_client_samples=10, profile="smoke"
)
PAGES = {"page_a": [TINY, TINY.replace(seed=1)], "page_b": [TINY.replace(algorithm="scaffold"), TINY]}


@pytest.fixture
def pages(monkeypatch):
    monkeypatch.setattr(campaign, "needed", lambda profile, pages=None, n_seeds=None: PAGES)
    monkeypatch.setattr(campaign, "claims_for", lambda profile, n_seeds=None: [
        ("P", "page_b", "SCAFFOLD vs FedAvg", PAGES["page_b"])])
    return PAGES


def test_plan_counts_what_is_missing(pages, tmp_path):
    rows = {r["page"]: r for r in campaign.plan("smoke", root=tmp_path, kind="cpu")}
    assert rows["page_a"]["needed"] == 2 and rows["page_a"]["missing"] == 2
    assert len(campaign.missing(pages, tmp_path)) == 3  # distinct configs across pages


def test_total_minutes_counts_each_distinct_configuration_once(pages, tmp_path, monkeypatch):
    monkeypatch.setattr(campaign, "bench_seconds_per_sample", lambda kind: (1e-3, "stub"))
    whole, n = campaign.total_minutes(pages, "cpu", root=tmp_path)
    assert n == 3  # TINY is needed by both pages: once
    assert whole == pytest.approx(sum(campaign.estimate_s(c, 1e-3) for c in
                                      [TINY, TINY.replace(seed=1), TINY.replace(algorithm="scaffold")]) / 60)
    assert campaign.total_minutes(pages, "cpu", root=tmp_path, only_missing=True) == (whole, 3)
    from fedlib.run import run

    run(TINY, root=tmp_path, progress=False, device="cpu")
    left, n_left = campaign.total_minutes(pages, "cpu", root=tmp_path, only_missing=True)
    assert n_left == 2 and left == pytest.approx(whole - campaign.estimate_s(TINY, 1e-3) / 60)


# ~13 s (two campaigns): make test-full; campaign.run trains in make test through the tests below
@pytest.mark.heavy
def test_run_trains_the_missing_and_then_nothing(pages, tmp_path, monkeypatch):
    monkeypatch.setenv("FEDLIB_RESULTS_DIR", str(tmp_path))
    out = campaign.run("smoke", budget_min=30, root=tmp_path, progress=False)
    assert out["trained"] == 3 and out["still missing"] == 0
    again = campaign.run("smoke", budget_min=30, root=tmp_path, progress=False)
    assert again["trained"] == 0 and again["still missing"] == 0


def test_a_campaign_on_a_gpu_trains_results_in_tf32_again_in_float32_first(pages, tmp_path, monkeypatch):
    """Issue 64: no comparison mixes TF32 and float32. A GPU result trained in TF32 (before float32
    became fedlib's GPU default) is trained again, with force, on a GPU only (a CPU would take hours);
    after the steps that decide an open issue's verdicts, before the others."""
    monkeypatch.setenv("FEDLIB_RESULTS_DIR", str(tmp_path))
    campaign.run("smoke", budget_min=30, root=tmp_path, progress=False)
    assert campaign.tf32_results(pages, tmp_path) == []
    real = campaign.arithmetic
    monkeypatch.setattr(campaign, "arithmetic", lambda meta, precision="float32":
                        "TF32" if meta.get("config_key") == TINY.key() else real(meta, precision))
    assert [c.key() for c in campaign.tf32_results(pages, tmp_path)] == [TINY.key()]
    calls = []
    real_run_many = campaign.run_many
    monkeypatch.setattr(campaign, "run_many", lambda cs, **k: calls.append(
        ([c.key() for c in cs], k.get("force"))) or real_run_many(cs, **k))
    assert campaign.run("smoke", budget_min=30, root=tmp_path, progress=False)["retrained in float32"] == 0
    assert calls == []  # on a CPU: left alone
    monkeypatch.setattr(campaign, "device_kind", lambda: "cuda")
    out = campaign.run("smoke", budget_min=30, root=tmp_path, progress=False)
    assert out["retrained in float32"] == 1 and calls == [([TINY.key()], True)]
    # with a missing deciding step and a missing other one: the deciding one, the TF32 one, the other
    calls.clear()
    for c in (TINY.replace(seed=1), TINY.replace(algorithm="scaffold")):
        result_path(c, tmp_path).unlink()
    monkeypatch.setattr(campaign, "deciding_claims",
                        lambda profile, n_seeds=None: {"page_b: SCAFFOLD vs FedAvg"})
    out = campaign.run("smoke", budget_min=30, root=tmp_path, progress=False)
    assert calls == [([TINY.replace(algorithm="scaffold").key()], None), ([TINY.key()], True),
                     ([TINY.replace(seed=1).key()], None)]


def test_steps_trains_only_the_first_claims_first_steps(pages, tmp_path, monkeypatch):
    """Step 1 settles the one claim (page_b's two configs); the rest (page_a's other seed) is left."""
    monkeypatch.setenv("FEDLIB_RESULTS_DIR", str(tmp_path))
    with pytest.raises(campaign.ConfigError, match="--steps"):
        campaign.run("smoke", budget_min=30, root=tmp_path, progress=False, steps=0)
    out = campaign.run("smoke", budget_min=30, root=tmp_path, progress=False, steps=1)
    assert out["trained"] == 2 and out["still missing"] == 1 and out["claims settled"] == 1
    assert not result_path(TINY.replace(seed=1), tmp_path).exists()


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


def test_a_checkpointed_run_is_estimated_by_the_rounds_it_has_left(tmp_path):
    """A run cut off at round 1 of 3 has two thirds of its rounds left; without a readable checkpoint
    of its own config, all of them."""
    from fedlib.results import checkpoint_path
    from fedlib.run import run_many

    cfg = TINY.replace(rounds=3)
    assert campaign.rounds_left(cfg, tmp_path) == 1.0
    run_many([cfg], root=tmp_path, progress=False, deadline=0.0)  # checkpoints after round 1
    assert campaign.rounds_left(cfg, tmp_path) == pytest.approx(2 / 3)
    assert campaign.rounds_left(cfg.replace(seed=5), tmp_path) == 1.0  # another config: no checkpoint
    checkpoint_path(cfg.replace(seed=5), tmp_path).write_bytes(b"not a checkpoint")
    assert campaign.rounds_left(cfg.replace(seed=5), tmp_path) == 1.0


def test_a_short_budget_finishes_a_checkpointed_run_it_would_not_start_afresh(tmp_path, monkeypatch):
    """Estimated at 120 s whole, a 90 s budget does not start the run; cut off after its first of
    two rounds (60 s left), the same budget starts and finishes it from the checkpoint."""
    from fedlib.run import run_many

    cfg = TINY  # two rounds
    monkeypatch.setenv("FEDLIB_RESULTS_DIR", str(tmp_path))
    monkeypatch.setattr(campaign, "needed", lambda profile, pages=None, n_seeds=None: {"page": [cfg]})
    monkeypatch.setattr(campaign, "claims_for", lambda profile, n_seeds=None: [("P", "page", "c", [cfg])])
    per_sample = 120.0 / campaign.estimate_s(cfg, 1.0, campaign.record_dp_cost("cpu"))
    monkeypatch.setattr(campaign, "bench_seconds_per_sample", lambda kind: (per_sample, "stub"))
    first = campaign.run("smoke", budget_min=1.5, root=tmp_path, progress=False)
    assert first["trained"] == 0 and first["resumable at start"] == 0
    run_many([cfg], root=tmp_path, progress=False, deadline=0.0)  # cut off after round 1
    out = campaign.run("smoke", budget_min=1.5, root=tmp_path, progress=False)
    assert out["trained"] == 1 and out["still missing"] == 0 and out["resumable at start"] == 1
    assert json.loads(result_path(cfg, tmp_path).read_text())["meta"]["resumed_from_round"] == 1


def test_carry_over_starts_a_run_longer_than_the_budget_when_two_of_its_rounds_fit(tmp_path, monkeypatch):
    """TINY with four rounds estimated at 120 s (30 s a round): a 90 s budget starts it only with
    ``carry_over`` (a run cut off at the deadline checkpoints and resumes:
    test_a_deadline_mid_run_checkpoints_and_resumes); a 45 s budget, under two rounds, starts nothing
    even so."""
    cfg = TINY.replace(rounds=4)
    monkeypatch.setenv("FEDLIB_RESULTS_DIR", str(tmp_path))
    monkeypatch.setattr(campaign, "needed", lambda profile, pages=None, n_seeds=None: {"page": [cfg]})
    monkeypatch.setattr(campaign, "claims_for", lambda profile, n_seeds=None: [("P", "page", "c", [cfg])])
    per_sample = 120.0 / campaign.estimate_s(cfg, 1.0, campaign.record_dp_cost("cpu"))
    monkeypatch.setattr(campaign, "bench_seconds_per_sample", lambda kind: (per_sample, "stub"))
    assert campaign.CARRY_OVER_MIN_ROUNDS == 2  # 60 s of this run: more than 45 s, less than 90 s

    def run(budget_min: float, carry_over: bool) -> dict:
        return campaign.run("smoke", budget_min=budget_min, root=tmp_path, progress=False,
                            carry_over=carry_over)

    assert run(0.75, carry_over=True)["trained"] == 0
    assert run(1.5, carry_over=False)["trained"] == 0
    out = run(1.5, carry_over=True)
    assert out["trained"] == 1 and out["still missing"] == 0


def test_the_checkpoint_line_warns_only_when_carry_over_finds_nothing_to_resume(tmp_path):
    """A machine that is new each working period keeps no checkpoint: with ``carry_over`` on and none
    found, the line says how a new machine resumes (data/carry/); otherwise it only counts."""
    warned = campaign.checkpoint_line(0, 5, tmp_path, carry_over=True)
    assert warned.startswith(f"campaign: 0 of 5 missing runs resume from checkpoints in {tmp_path}")
    assert "data/carry/" in warned and "carry save" in warned
    for line in (campaign.checkpoint_line(0, 5, tmp_path, carry_over=False),
                 campaign.checkpoint_line(2, 5, tmp_path, carry_over=True)):
        assert "carry" not in line


def test_run_batches_resume_checkpointed_runs_first_and_never_mix_ages(tmp_path, monkeypatch):
    from fedlib.run import run_many

    monkeypatch.setenv("FEDLIB_RESULTS_DIR", str(tmp_path))
    seeds = [TINY.replace(seed=s) for s in range(3)]
    run_many([seeds[1]], root=tmp_path, progress=False, deadline=0.0)  # seed 1 checkpoints after round 1
    assert campaign.rounds_left(seeds[1], tmp_path) == 0.5
    first, fresh = (0.5, [seeds[1]]), [seeds[0], seeds[2]]
    assert campaign.chunks(seeds, max_batch=2, root=tmp_path) == [first, (1.0, fresh)]
    assert campaign.chunks(seeds, max_batch=1, root=tmp_path) == [first, *((1.0, [c]) for c in fresh)]


def test_groups_put_one_shape_together(pages):
    gs = campaign.groups(campaign.missing(pages), per_sample=1e-6)
    assert sorted(len(g) for g in gs) == [1, 2]  # scaffold alone; the two fedavg seeds together


def test_order_settles_the_most_claims_per_minute_first():
    a, b, c, d = (TINY.replace(seed=s) for s in range(4))
    cost = {a.key(): 1.0, b.key(): 10.0, c.key(): 10.0, d.key(): 5.0}.__getitem__
    claims = [("cheap", [a]), ("dear", [b, c]), ("one of dear", [b]), ("shared", [a, b])]
    steps = campaign.order([a, b, c, d], claims, lambda x: cost(x.key()))
    assert steps[0] == (["cheap"], [a])  # 1 claim per unit of cost
    assert steps[1][0] == ["one of dear", "shared"] and steps[1][1] == [b]  # 2 claims for 10
    assert steps[2] == (["dear"], [c])
    assert steps[3] == ([], [d])  # no claim needs it: last
    assert sorted(x.key() for _, cs in steps for x in cs) == sorted(x.key() for x in (a, b, c, d))


def test_order_trains_the_claims_an_issue_names_as_deciding_first():
    """Issue 63: claims flagged ``deciding`` go before every other, however dear; the rest keep the
    greedy order after them."""
    a, b, c = (TINY.replace(seed=s) for s in range(3))
    cost = {a.key(): 1.0, b.key(): 50.0, c.key(): 2.0}.__getitem__
    claims = [("cheap", [a]), ("deciding", [b]), ("other", [c])]
    steps = campaign.order([a, b, c], claims, lambda x: cost(x.key()), first={"deciding"})
    assert [names for names, _ in steps] == [["deciding"], ["cheap"], ["other"]]
    assert campaign.order([a, b, c], claims, lambda x: cost(x.key()))[0] == (["cheap"], [a])


def test_claim_plan_lists_each_claim_with_its_step(pages, tmp_path):
    rows = campaign.claim_plan("smoke", root=tmp_path, kind="cpu")
    claim = next(r for r in rows if r["claim"] == "SCAFFOLD vs FedAvg")
    assert claim["step"] == 1 and claim["missing"] == 2
    assert rows[-1]["page"].startswith("(no claim")  # page_a's second seed decides nothing
    # each step's FLOP is its configs' counted training FLOP, given once per step
    steps = campaign.order(campaign.missing(campaign.needed("smoke"), tmp_path),
                           [(f"{p}: {c}", cs) for _, p, c, cs in campaign.claims_for("smoke", None)],
                           campaign._cost(None))
    assert claim["pflop"] == pytest.approx(campaign.flops_of(steps[0][1]) / 1e15) and claim["pflop"] > 0


def test_pages_are_selected_by_pattern_and_a_typo_is_an_error():
    per_page = {"dpfl_claim1": [TINY], "fdl_fig3": [TINY]}
    assert list(campaign.select_pages(per_page, ["dpfl_*"])) == ["dpfl_claim1"]
    with pytest.raises(campaign.ConfigError, match="matches no page"):
        campaign.select_pages(per_page, ["dplf_*"])


def test_every_declared_claim_is_recorded_by_its_page():
    """The claims the campaign orders by (studies' CLAIMS) are the claims the pages record: the
    committed verdicts of every page that trains name exactly these, besides the ones no run decides
    (sanity checks and claims the paper makes untestable)."""
    from fedlib.results import REPO_ROOT
    from studies import claim_runs

    declared: dict[str, set[str]] = {}
    for _, page, needs, configs in claim_runs("quick"):
        declared.setdefault(page, set()).add(needs.claim)
        assert configs, (page, needs.claim)
    for page, claims in declared.items():
        d = json.loads((REPO_ROOT / "data" / "verdicts" / f"{page}.json").read_text())
        recorded = {f["claim"]: f["verdict"] for f in d["findings"]}
        assert claims <= set(recorded), (page, claims - set(recorded))
        rest = {c: v for c, v in recorded.items() if c not in claims}
        assert all(v in ("sanity check", "not testable") for v in rest.values()), (page, rest)


def test_the_campaign_computes_what_pages_need_from_the_models(pages, tmp_path, monkeypatch):
    """Model files stay on the machine that trained: a page's after-training step (the membership
    audit's losses) runs right after each of its runs is trained."""
    seen = []
    monkeypatch.setattr(campaign, "after_training_hooks",
                        lambda: {"page_b": lambda r, root: seen.append((r.config.key(), root))})
    campaign.run("smoke", budget_min=30, root=tmp_path, progress=False)
    assert sorted(k for k, _ in seen) == sorted(c.key() for c in PAGES["page_b"])
    assert all(root == tmp_path for _, root in seen)


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


@pytest.mark.e2e
def test_plan_of_the_real_pages_covers_every_profile():
    for profile in ("smoke", "paper"):
        rows = campaign.plan(profile, kind="cpu")
        assert sum(r["needed"] for r in rows) > 100


@pytest.mark.e2e
def test_the_short_command_plans_and_reports_the_distinct_missing(tmp_path):
    env = {**os.environ, "FEDLIB_RESULTS_DIR": str(tmp_path)}
    out = subprocess.run([sys.executable, "-m", "lab.campaign", "plan", "--profile", "smoke"],
                         capture_output=True, text=True, env=env, check=True).stdout
    line = next(x for x in out.splitlines() if x.startswith("missing configurations (distinct"))
    total = int(line.rsplit(":", 1)[1])
    assert total == len(campaign.missing(campaign.needed("smoke"), tmp_path)) > 0
    assert f"estimate for what is missing ({total} configurations" in out
    assert "FLOP for what is missing: " in out and "PFLOP" in out
    shapes = campaign.groups(campaign.missing(campaign.needed("smoke"), tmp_path), None)
    assert f"run batches by step shape across pages and seeds: {len(shapes)} " in out


def _archive(path, members: dict[str, bytes]):
    import io

    with tarfile.open(path, "w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


@pytest.fixture(scope="module")
def one_result(tmp_path_factory):
    from fedlib.run import run

    root = tmp_path_factory.mktemp("one")
    r = run(TINY, root=root, progress=False)
    return r.path.name, json.loads(r.path.read_text())


def _rehashed(d: dict) -> bytes:
    """A forger recomputes the content hash: the checks must not rest on it alone."""
    from fedlib.results import content_hash

    d["meta"]["content_sha256"] = content_hash(d)
    return json.dumps(d).encode()


def _forged(d: dict, **config) -> tuple[str, bytes]:
    """A result whose config was edited, with its key (and hash) recomputed so that its name matches."""
    d = json.loads(json.dumps(d))
    d["config"].update(config)
    c = Config(**d["config"])
    d["meta"]["config_key"] = c.key()
    return f"{c.algorithm}-{c.key()}.json", _rehashed(d)


REASONS = {"accuracy 7": "outside [0, 1]", "negative loss": "is negative",
           "invalid config": "config is invalid", "unknown field": "unknown config field",
           "a list": "not a result", "not json": "not JSON",
           "nan loss": "not marked diverged", "duplicate": "comes twice", "round missing": "out of order",
           "conflict": "other content", "stray audit": "no result", "edited": "content hash"}


@pytest.mark.parametrize("case", sorted(REASONS))
def test_unpack_refuses_bad_input_with_one_line_and_adds_nothing(case, one_result, tmp_path, capsys):
    name, good = one_result
    members: dict[str, bytes] = {}
    archives = [tmp_path / "a.tgz"]
    root = tmp_path / "results"
    if case == "accuracy 7":
        d = json.loads(json.dumps(good))
        d["history"][-1]["test_acc"] = 7.0
        members[name] = _rehashed(d)
    elif case == "negative loss":
        d = json.loads(json.dumps(good))
        d["history"][0]["train_loss"] = -1.0
        members[name] = _rehashed(d)
    elif case == "invalid config":
        members.update([_forged(good, clients=-5)])
    elif case == "unknown field":
        d = json.loads(json.dumps(good))
        d["config"]["warp_speed"] = 9
        members[name] = _rehashed(d)
    elif case == "a list":
        members[name] = b"[1, 2, 3]"
    elif case == "not json":
        members[name] = b"\x00garbage"
    elif case == "nan loss":
        d = json.loads(json.dumps(good))
        d["history"][-1]["test_loss"] = float("nan")  # not marked diverged
        members[name] = _rehashed(d)
    elif case == "duplicate":
        d = json.loads(json.dumps(good))
        d["history"][-1]["test_acc"] = 0.99
        members[name] = json.dumps(good).encode()
        _archive(tmp_path / "b.tgz", {name: json.dumps(d).encode()})
        archives.append(tmp_path / "b.tgz")
    elif case == "round missing":
        d = json.loads(json.dumps(good))
        d["history"][0]["round"] = 5
        members[name] = _rehashed(d)
    elif case == "conflict":
        d = json.loads(json.dumps(good))
        d["history"][-1]["test_acc"] = 0.99
        root.mkdir()
        (root / name).write_text(json.dumps(good))
        members[name] = _rehashed(d)
    elif case == "edited":
        d = json.loads(json.dumps(good))
        d["history"][-1]["test_acc"] = 0.1234  # by hand, without the hash
        members[name] = json.dumps(d).encode()
    elif case == "stray audit":
        members[name] = json.dumps(good).encode()
        members["audits/fedavg-0000000000000000.json"] = b'{"members": [0.1], "nonmembers": [0.2]}'
    _archive(archives[0], members)
    before = sorted(root.rglob("*")) if root.exists() else []
    assert campaign.main(["unpack", *map(str, archives)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "nothing was added" in err and len(err.splitlines()) == 1, err
    assert REASONS[case] in err and err.count("invalid config") <= 1, err
    assert (sorted(root.rglob("*")) if root.exists() else []) == before


@pytest.mark.parametrize("case", ["missing", "not gzip", "traversal"])
def test_unpack_refuses_bad_archives_with_one_line(case, tmp_path, capsys):
    a = tmp_path / "x.tgz"
    if case == "not gzip":
        a.write_bytes(b"plain text, not an archive")
    elif case == "traversal":
        _archive(a, {"../evil.json": b"{}"})
    assert campaign.main(["unpack", str(a)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and len(err.splitlines()) == 1, err


def test_unpack_accepts_a_result_with_its_audit_and_a_diverged_run(one_result, tmp_path):
    name, good = one_result
    d = json.loads(json.dumps(good))
    d["history"][-1]["test_loss"] = float("nan")
    d["meta"]["diverged"] = True
    audit = {"members": [0.1, 0.2], "nonmembers": [0.3]}
    archive = _archive(tmp_path / "a.tgz", {name: _rehashed(d),
                                            f"audits/{name}": json.dumps(audit).encode()})
    report = campaign.unpack([archive], root=tmp_path / "r")
    assert sorted(report["added"]) == sorted([name, f"audits/{name}"])
    assert json.loads((tmp_path / "r" / "audits" / name).read_text()) == audit
    assert campaign.unpack([archive], root=tmp_path / "r")["already present"]


def test_campaign_run_takes_cuda_graphs(monkeypatch, capsys, restore_kernels):
    from fedlib.kernels import kernel_settings

    seen = []
    monkeypatch.setattr(campaign, "run", lambda *a, **k: seen.append(kernel_settings()["cuda_graphs"]) or {})
    for flag in ([], ["--no-cuda-graphs"], ["--cuda-graphs"]):  # on by default, as on CUDA everywhere
        assert campaign.main(["run", "--profile", "smoke", "--budget-min", "1", *flag]) == 0
    assert seen == [True, False, True]


def test_record_dp_cost_is_the_devices_own_where_a_benchmark_measured_it(tmp_path, monkeypatch):
    """The CPU's factor for record-level DP-SGD stands until a benchmark of the device kind measured
    its own (``record_dp_cost``, timed with --scale); record-level runs' estimates scale with it."""
    monkeypatch.setenv("FEDLIB_BENCH_DIR", str(tmp_path))
    assert campaign.record_dp_cost("cuda") == campaign.RECORD_DP_COST  # no benchmark
    (tmp_path / "cuda-x-2026-01-01.json").write_text(json.dumps({"results": {"default_s": 1.0}}))
    assert campaign.record_dp_cost("cuda") == campaign.RECORD_DP_COST  # one without the measurement
    (tmp_path / "cuda-x-2026-01-02.json").write_text(json.dumps({"results": {"record_dp_cost": 2.5}}))
    assert campaign.record_dp_cost("cuda") == 2.5
    assert campaign.record_dp_cost("cpu") == campaign.RECORD_DP_COST
    (tmp_path / "cuda-a-2026-01-03.json").write_text(json.dumps({"results": {"record_dp_cost": 3.0}}))
    assert campaign.latest_bench("cuda")[1] == "cuda-a-2026-01-03.json"  # by date, not by device name
    assert campaign.record_dp_cost("cuda") == 3.0
    record = TINY.replace(algorithm="moon_dpap", dp="record", dp_epsilon_total=10.0, dp_schedule="constant")
    assert campaign.estimate_s(record, 1e-3, 2.5) == pytest.approx(campaign.estimate_s(record, 1e-3, 5.0) / 2)
    assert campaign.estimate_s(TINY, 1e-3, 2.5) == campaign.estimate_s(TINY, 1e-3, 5.0)  # no record DP
    # the formula in circulation clips every sample's gradient as record-level DP-SGD does: the same cost
    formula = record.replace(dp="formula", dp_epsilon_total=None, dp_epsilon_per_round=1.0,
                             dp_schedule="paper")
    assert campaign.estimate_s(formula, 1e-3, 2.5) == pytest.approx(campaign.estimate_s(record, 1e-3, 2.5))
    assert campaign.estimate_s(formula.replace(dp_grad="ghost"), 1e-3, 2.5, 1.5) == pytest.approx(
        1.5 * campaign.estimate_s(formula.replace(dp="none"), 1e-3))


def test_the_readme_states_what_is_trained_at_paper_as_the_results_say():
    """The README's count of paper-scale results is the committed results' (a new result that lands
    without the README line updated fails here)."""
    from fedlib.results import REPO_ROOT

    rows = campaign.trained_summary("paper", REPO_ROOT / "data" / "results")
    sentence = campaign.trained_sentence(rows)
    readme = (REPO_ROOT / "README.md").read_text()
    assert sentence + "." in readme, f"README.md should say: {sentence}."
    assert sum(r["trained"] for r in rows) > 0


def test_trained_summary_counts_devices_from_provenance(pages, tmp_path, monkeypatch):
    from fedlib.run import run

    monkeypatch.setattr("studies.page_study", lambda page: "fdl")
    run(TINY, root=tmp_path, progress=False, device="cpu")
    rows = campaign.trained_summary("smoke", tmp_path)
    assert rows == [{"study": "FDL", "needed": 3, "trained": 1, "devices": {"CPU": 1},
                     "hours": rows[0]["hours"]}]
    assert campaign.trained_sentence(rows) == "1 of 3 configurations trained: FDL 1 of 3 (1 on a CPU)"


def test_a_run_batch_s_training_time_is_counted_once(pages, tmp_path, monkeypatch):
    """Each run of a run batch records the whole batch's wall-clock time in ``duration_s`` (the H200's
    MOON-DPAP pair: 234.6 s each, 117 s of GPU time per run): the hours the README and the rerun page
    report share it out, so two runs trained together count the batch's time once, not twice."""
    from fedlib.results import run_seconds
    from fedlib.run import run_many

    assert run_seconds({"duration_s": 114.0, "run_batch": ["a", "b"]}) == 57.0
    assert run_seconds({"duration_s": 66.0}) == 66.0 and run_seconds({}) == 0.0
    monkeypatch.setattr("studies.page_study", lambda page: "fdl")
    a, b = run_many(PAGES["page_a"], engine="vectorized", root=tmp_path, progress=False, device="cpu")
    assert a.meta["run_batch"] == b.meta["run_batch"] == [a.config.key(), b.config.key()]
    both = a.meta["duration_s"] + b.meta["duration_s"]  # each about the batch's time (saved in turn)
    [row] = campaign.trained_summary("smoke", tmp_path)
    assert row["trained"] == 2 and row["hours"] == pytest.approx(both / 2 / 3600)


def test_a_niced_campaign_makes_its_session_yield(tmp_path, monkeypatch):
    """nice alone ranks processes within one session; the campaign writes its niceness to its
    autogroup so that the background run yields to the foreground work (issue 39)."""
    group = tmp_path / "autogroup"
    group.write_text("/autogroup-7 nice 0\n")
    monkeypatch.setattr(campaign.os, "nice", lambda inc: 19)
    assert campaign.yield_to_foreground(group) == 19 and group.read_text() == "19"
    monkeypatch.setattr(campaign.os, "nice", lambda inc: 0)
    assert campaign.yield_to_foreground(group) is None  # not niced: nothing to do
    assert campaign.yield_to_foreground(tmp_path / "absent") is None


def test_settled_claims_name_their_runs_devices_arithmetic_and_hours(pages, tmp_path, monkeypatch):
    """The rerun page's table of claims settled at a profile: only claims whose every run is trained,
    with the devices, the arithmetic (issue 64: a claim whose runs mix TF32 and float32 is named) and
    the hours their results record (issue 39)."""
    from fedlib.run import run

    assert campaign.settled_claims("smoke", root=tmp_path) == []
    results = [run(c, root=tmp_path, progress=False, device="cpu") for c in PAGES["page_b"]]
    [row] = campaign.settled_claims("smoke", root=tmp_path)
    assert (row["page"], row["claim"], row["runs"]) == ("page_b", "SCAFFOLD vs FedAvg", 2)
    assert row["devices"] == ["CPU"] and row["arithmetic"] == ["float32"]
    assert row["hours"] == pytest.approx(sum(r.meta["duration_s"] for r in results) / 3600)
    # a run of the claim trained on a GPU with TF32 convolutions (before float32 became the default)
    gpu = dict(results[0].meta, device="cuda:0 (NVIDIA H200)", kernels={"cudnn_tf32": True})
    real = campaign.Result.load
    monkeypatch.setattr(campaign.Result, "load", lambda path, expect=None: type("R", (), {
        "meta": gpu if path == results[0].path else real(path, expect).meta})())
    [row] = campaign.settled_claims("smoke", root=tmp_path)
    assert row["devices"] == ["CPU", "GPU"] and row["arithmetic"] == ["TF32", "float32"]


def test_every_claim_settled_at_paper_is_graded_there_by_its_page():
    """A page still short of the paper profile must grade the claims whose runs are complete at paper on
    those runs (studies.settled), else they would stay graded at quick (issue 39): this fails when the
    campaign settles a claim of a page whose notebook does not look for them."""
    from fedlib.results import REPO_ROOT

    per_page = campaign.needed("paper")
    for row in campaign.settled_claims("paper"):
        page = row["page"]
        if campaign.missing({page: per_page[page]}):  # the page renders below paper
            text = (REPO_ROOT / "notebooks" / f"{page}.ipynb").read_text()
            assert "show_settled_beyond(" in text, (page, row["claim"])


def test_campaign_run_passes_carry_over_and_carries_checkpoints_only_then(monkeypatch):
    """``--carry-over`` restores data/carry/ before training and saves into it after (lab.carry); a run
    without it leaves data/carry/ alone."""
    seen = []
    monkeypatch.setattr(campaign, "run", lambda *a, **k: seen.append(k["carry_over"]) or {})
    monkeypatch.setattr(campaign.carry, "restore", lambda: seen.append("restore") or {"restored": []})
    monkeypatch.setattr(campaign.carry, "save", lambda: seen.append("save") or {"carried": []})
    for flag in ([], ["--carry-over"]):
        assert campaign.main(["run", "--profile", "smoke", "--budget-min", "1", *flag]) == 0
    assert seen == [False, "restore", True, "save"]


def test_measured_against_estimate_compares_the_device_s_results_with_their_estimates(pages, tmp_path,
                                                                                     monkeypatch):
    """``campaign plan`` shows how the estimates it plans with compare with the results trained on
    the same kind of device (their recorded minutes, a run batch's time shared out)."""
    from fedlib.run import run

    monkeypatch.setattr(campaign, "bench_seconds_per_sample", lambda kind: (1e-4, "a benchmark"))
    assert campaign.measured_against_estimate("smoke", "cpu", tmp_path) == {}
    r = run(TINY, root=tmp_path, progress=False, device="cpu")
    got = campaign.measured_against_estimate("smoke", "cpu", tmp_path)
    est = campaign.estimate_s(TINY, 1e-4, campaign.record_dp_cost("cpu"),
                              campaign.record_dp_cost("cpu", ghost=True)) / 60
    assert got == {"fedavg": {"runs": 1, "measured_min": pytest.approx(r.meta["duration_s"] / 60),
                              "estimate_min": pytest.approx(est),
                              "ratio": pytest.approx(r.meta["duration_s"] / 60 / est)}}
    assert campaign.measured_against_estimate("smoke", "cuda", tmp_path) == {}  # trained on a CPU

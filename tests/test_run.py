"""Runs: cache, atomic writes, checkpoint and resume, evaluation schedule, CLI."""

import json
import os
import subprocess
import sys

import pytest
import torch

from fedlib import Config, run
from fedlib import results as results_mod
from fedlib.experiment import Experiment
from fedlib.results import checkpoint_path, result_path
from fedlib.run import load_model

CFG = Config(clients=4, train_samples=600, test_samples=300, rounds=4, min_client_samples=20)


def test_cache_hit_and_force(tmp_path, monkeypatch):
    first = run(CFG, root=tmp_path, progress=False)
    assert first.path == result_path(CFG, tmp_path) and first.path.exists()

    def boom(*a, **k):
        raise AssertionError("should not train on a cache hit")

    monkeypatch.setattr(Experiment, "prepare", boom)
    again = run(CFG, root=tmp_path, progress=False)
    assert again.history == first.history
    with pytest.raises(AssertionError, match="cache hit"):
        run(CFG, root=tmp_path, progress=False, force=True)
    other = CFG.replace(seed=1)
    with pytest.raises(AssertionError):
        run(other, root=tmp_path, progress=False)  # a different config is a miss


def test_result_records_provenance(tmp_path):
    r = run(CFG.replace(rounds=1), root=tmp_path, progress=False)
    for key in ("seed", "device", "cpu", "torch", "git_commit", "duration_s", "engine", "config_key"):
        assert key in r.meta
    rec = r.history[0]
    for key in ("round", "test_acc", "test_loss", "wall_s", "bytes_up", "bytes_down", "train_loss"):
        assert key in rec
    assert rec["bytes_up"] == rec["bytes_down"] == 4 * 4 * 424_266
    on_disk = json.loads(r.path.read_text())
    assert on_disk["config"] == CFG.replace(rounds=1).to_dict()


def test_cpu_model_names_the_processor_generation():
    """A VM's model name can be as vague as "AMD EPYC": family, model and stepping tell two hosts
    apart (their benchmarks differ by a third); an unknown layout falls back to the machine."""
    from fedlib.results import cpu_model

    info = ("processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 17\n"
            "model name\t: AMD EPYC\nstepping\t: 1\nflags\t\t: fpu avx2\n\nprocessor\t: 1\n"
            "cpu family\t: 99\n")
    assert cpu_model(info) == "AMD EPYC (family 25, model 17, stepping 1)"
    assert cpu_model("processor\t: 0\nBogoMIPS\t: 50.00\n")  # e.g. an ARM host: never empty


def test_atomic_write_leaves_nothing_half_written(tmp_path, monkeypatch):
    def failing_replace(src, dst):
        raise OSError("disk full (simulated)")

    monkeypatch.setattr(results_mod.os, "replace", failing_replace)
    with pytest.raises(OSError, match="simulated"):
        run(CFG.replace(rounds=1), root=tmp_path, progress=False)
    # lock files (``locks/``, empty but for a pid) stay by design: unlinking a flock'd file races
    # with a waiter (fedlib.results.ConfigLocks); they hold no result
    leftovers = [p for p in tmp_path.rglob("*") if p.is_file() and p.parent.name != "locks"]
    assert leftovers == [], leftovers


def _interrupted_run(monkeypatch, at_round: int, **kwargs) -> None:
    """Train ``CFG`` (checkpointing every round) and stop it with Ctrl-C as round ``at_round`` begins;
    the next run resumes from its checkpoint."""
    original = Experiment.prepare

    def interrupted(self, t, *args):
        if t == at_round:
            raise KeyboardInterrupt
        return original(self, t, *args)

    with monkeypatch.context() as m:
        m.setattr(Experiment, "prepare", interrupted)
        with pytest.raises(KeyboardInterrupt):
            run(CFG, progress=False, checkpoint_every=1, **kwargs)


def test_interrupt_and_resume_equals_uninterrupted(tmp_path, monkeypatch):
    full = run(CFG, root=tmp_path / "full", progress=False, checkpoint_every=1)
    _interrupted_run(monkeypatch, 2, root=tmp_path / "part")
    assert checkpoint_path(CFG, tmp_path / "part").exists()
    assert not result_path(CFG, tmp_path / "part").exists()

    resumed = run(CFG, root=tmp_path / "part", progress=False, checkpoint_every=1)
    assert resumed.meta["resumed_from_round"] == 2
    assert not checkpoint_path(CFG, tmp_path / "part").exists()
    _, p_full = load_model(full, tmp_path / "full")
    _, p_res = load_model(resumed, tmp_path / "part")
    for k in p_full:
        assert torch.equal(p_full[k], p_res[k]), k
    strip = [{k: v for k, v in h.items() if not k.endswith("_s")} for h in full.history]
    assert strip == [{k: v for k, v in h.items() if not k.endswith("_s")} for h in resumed.history]


def test_eval_every(tmp_path):
    r = run(CFG.replace(rounds=3, eval_every=2), root=tmp_path, progress=False)
    assert [h["test_acc"] is not None for h in r.history] == [False, True, True]


def test_client_fraction_samples_subset(tmp_path):
    r = run(CFG.replace(rounds=2, client_fraction=0.5), root=tmp_path, progress=False)
    assert [h["clients"] for h in r.history] == [2, 2]


def test_cli_json_line(tmp_path):
    env = {**os.environ, "FEDLIB_RESULTS_DIR": str(tmp_path)}
    out = subprocess.run(
        [sys.executable, "-m", "fedlib", "run", "--clients", "4", "--train-samples", "320",
         "--test-samples", "100", "--min-client-samples", "10", "--rounds", "2", "--seed", "3",
         "--engine", "parallel", "--device", "cpu", "--json", "--no-progress"],
        capture_output=True, text=True, env=env, check=True, timeout=300)
    line = json.loads(out.stdout.strip().splitlines()[-1])
    assert set(line) >= {"test_acc", "test_loss", "result_path", "config_key"}
    assert os.path.exists(line["result_path"]) and 0 <= line["test_acc"] <= 1
    assert line["engine"] == "parallel"  # every engine path can be chosen from the command line


def test_cli_rejects_bad_config(tmp_path):
    env = {**os.environ, "FEDLIB_RESULTS_DIR": str(tmp_path)}
    out = subprocess.run([sys.executable, "-m", "fedlib", "run", "--alpha", "-1", "--lr", "-2"],
                         capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 2
    assert "alpha must be > 0" in out.stderr and "lr must be > 0" in out.stderr
    assert not any(tmp_path.rglob("*.json"))


def test_commit_is_dirty_for_code_changes_not_for_build_outputs(tmp_path, monkeypatch):
    def git(*args):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path,
                       check=True, capture_output=True)

    git("init", "-q")
    (tmp_path / "data").mkdir()
    (tmp_path / "code.py").write_text("a = 1\n")
    (tmp_path / "data" / "timing.json").write_text("{}\n")
    git("add", ".")
    git("commit", "-qm", "init")
    monkeypatch.setattr(results_mod, "REPO_ROOT", tmp_path)
    assert not results_mod.git_commit().endswith("-dirty")
    (tmp_path / "data" / "timing.json").write_text('{"wall_s": 1}\n')  # what a build rewrites
    assert not results_mod.git_commit().endswith("-dirty")
    (tmp_path / "code.py").write_text("a = 2\n")
    assert results_mod.git_commit().endswith("-dirty")


def test_checkpoints_of_the_repository_results_live_outside_the_work_tree(tmp_path, monkeypatch):
    """The repository's own results checkpoint under the user's cache folder (a run cut off when a
    working period ends resumes from any clone on the same machine); other results folders keep
    theirs beside them, and $FEDLIB_CHECKPOINT_DIR overrides both."""
    from fedlib.results import REPO_ROOT, checkpoint_dir

    monkeypatch.delenv("FEDLIB_CHECKPOINT_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert checkpoint_dir(REPO_ROOT / "data" / "results") == tmp_path / "cache" / "fedlib" / "checkpoints"
    assert checkpoint_dir(tmp_path / "other") == tmp_path / "other" / "checkpoints"
    monkeypatch.setenv("FEDLIB_CHECKPOINT_DIR", str(tmp_path / "ck"))
    assert checkpoint_dir(tmp_path / "other") == tmp_path / "ck"
    assert checkpoint_path(CFG, REPO_ROOT / "data" / "results").parent == tmp_path / "ck"


def test_a_resumed_run_records_the_commit_that_checkpointed_it(tmp_path, monkeypatch):
    _interrupted_run(monkeypatch, 2, root=tmp_path)
    resumed = run(CFG, root=tmp_path, progress=False, checkpoint_every=1)
    assert resumed.meta["resumed_from_round"] == 2
    assert resumed.meta["resumed_from_commit"] == resumed.meta["git_commit"]
    assert resumed.meta["resumed_from_engine"] == resumed.meta["engine"]


def test_a_run_resumed_twice_records_which_commit_and_engine_trained_which_rounds(tmp_path, monkeypatch):
    """A paper run can span three working periods at three commits: its result names each stretch of
    rounds with the commit and engine that trained it, not only the last resume."""
    run_mod = sys.modules["fedlib.run"]  # the package's ``run`` is the function

    monkeypatch.setattr(run_mod, "code_commit", lambda: "a" * 40)
    _interrupted_run(monkeypatch, 1, root=tmp_path, engine="vectorized", device="cpu")
    monkeypatch.setattr(run_mod, "code_commit", lambda: "b" * 40)
    _interrupted_run(monkeypatch, 3, root=tmp_path, engine="sequential", device="cpu")
    monkeypatch.setattr(run_mod, "code_commit", lambda: "c" * 40)
    done = run(CFG, root=tmp_path, progress=False, checkpoint_every=1, engine="sequential", device="cpu")
    assert done.meta["trained_in"] == [
        {"from_round": 0, "to_round": 1, "commit": "a" * 40, "engine": "vectorized"},
        {"from_round": 1, "to_round": 3, "commit": "b" * 40, "engine": "sequential"},
        {"from_round": 3, "to_round": 4, "commit": "c" * 40, "engine": "sequential"}]
    assert done.meta["resumed_from_commit"] == "b" * 40
    from fedlib.privacy.guarantee import classify_meta

    assert "trained_in" in classify_meta(done.meta)["public_meta"]  # provenance, nothing about the data
    assert "trained_in" not in run(CFG.replace(rounds=1), root=tmp_path, progress=False).meta  # not resumed


def test_a_checkpoint_from_before_the_chain_names_its_writer_with_an_unknown_start(tmp_path, monkeypatch):
    """Checkpoints written before ``trained_in`` existed record only the commit that wrote them."""
    _interrupted_run(monkeypatch, 2, root=tmp_path)
    ckpt = checkpoint_path(CFG, tmp_path)
    saved = torch.load(ckpt, weights_only=True)
    del saved["trained_in"]
    torch.save({**saved, "commit": "d" * 40}, ckpt)
    done = run(CFG, root=tmp_path, progress=False, checkpoint_every=1)
    assert done.meta["trained_in"][0] == {"from_round": None, "to_round": 2, "commit": "d" * 40,
                                          "engine": done.meta["engine"]}
    assert done.meta["trained_in"][1]["from_round"] == 2


def test_a_run_resumed_on_another_engine_path_says_which_trained_first(tmp_path, monkeypatch):
    """The engine paths round differently, so a run checkpointed on one and finished on another
    records both: ``engine`` (the last) and ``resumed_from_engine``."""
    _interrupted_run(monkeypatch, 1, root=tmp_path, engine="vectorized", device="cpu")
    resumed = run(CFG, root=tmp_path, progress=False, checkpoint_every=1, engine="sequential", device="cpu")
    assert (resumed.meta["resumed_from_engine"], resumed.meta["engine"]) == ("vectorized", "sequential")


def test_a_rewrite_that_changes_only_stamps_leaves_the_file_as_it_was(tmp_path):
    """A book rebuild that changes no finding must leave git clean (issue 41): the verdict and
    timing files are rewritten only when something besides their stamps changed."""
    from fedlib.results import write_json_unless_stamps_only

    path = tmp_path / "page.json"
    first = {"page": "p", "commit": "a" * 40, "time": "t0", "findings": [("x", 1.5)]}
    assert write_json_unless_stamps_only(path, first, stamps=("commit", "time"))
    before = path.read_bytes()
    assert not write_json_unless_stamps_only(path, {**first, "commit": "b" * 40, "time": "t1"},
                                             stamps=("commit", "time"))
    assert path.read_bytes() == before
    assert write_json_unless_stamps_only(path, {**first, "findings": [("x", 1.6)]}, stamps=("commit", "time"))
    assert json.loads(path.read_text())["findings"] == [["x", 1.6]]
    path.write_text("{not json")  # a damaged file is replaced, not trusted
    assert write_json_unless_stamps_only(path, first, stamps=("commit", "time"))
    # a file stamped at a dirty tree takes a clean commit's stamp once (then stays), never the reverse
    assert not write_json_unless_stamps_only(path, {**first, "commit": "c" * 40 + "-dirty"},
                                             stamps=("commit", "time"))
    path.write_text(json.dumps({**first, "commit": "c" * 40 + "-dirty"}))
    assert not write_json_unless_stamps_only(path, {**first, "commit": "d" * 40 + "-dirty"},
                                             stamps=("commit", "time"))
    assert write_json_unless_stamps_only(path, {**first, "commit": "e" * 40}, stamps=("commit", "time"))
    assert json.loads(path.read_text())["commit"] == "e" * 40
    assert not write_json_unless_stamps_only(path, {**first, "commit": "f" * 40}, stamps=("commit", "time"))


def test_a_run_whose_loss_explodes_is_diverged_even_when_finite():
    """Issue 41: the audit's wrecked models (test loss up to 1.8e6, flagged not diverged) are
    diverged; a run whose loss grows 1,000x over an untrained model's is flagged, a noisy but
    learning run is not, and a non-finite loss still is."""
    import math

    from fedlib.results import EXPLODED_FACTOR, diverged, exploded, non_finite

    untrained = math.log(10)
    learning = [{"round": t, "test_loss": v, "train_loss": v} for t, v in enumerate([2.2, 1.1, 160.0, 0.9])]
    assert not diverged(learning)  # a spike of 70x (DP-FL's adaptive arm) is not an explosion
    wrecked = [{"round": 1, "test_loss": untrained}, {"round": 2, "test_loss": 1000.5 * untrained}]
    assert exploded(wrecked) and diverged(wrecked) and not non_finite(wrecked)
    assert diverged([{"round": 1, "test_loss": float("nan")}])
    assert non_finite([{"round": 1, "test_loss": math.inf}])
    assert not exploded([{"round": 1, "test_loss": 0.99 * EXPLODED_FACTOR * untrained}])
    assert exploded([{"round": 1, "test_loss": 3.0}], classes=2) is False


@pytest.mark.parametrize("damage", ["in place", "wrong shape", "missing tensor"])
def test_a_damaged_checkpoint_is_set_aside_and_the_run_recomputed(tmp_path, monkeypatch, capsys, damage):
    """Issue 65: a checkpoint whose tensor was changed in place (same shape: caught by its digest), has
    a tensor of another shape, or lacks one, is set aside with one line and the run starts from
    round 0; its final result equals a fresh run's."""
    fresh = run(CFG, root=tmp_path / "fresh", progress=False, checkpoint_every=1)
    _interrupted_run(monkeypatch, 2, root=tmp_path / "part")
    path = checkpoint_path(CFG, tmp_path / "part")
    saved = torch.load(path, weights_only=True)
    name = next(iter(saved["state"]["gparams"]))
    if damage == "in place":
        saved["state"]["gparams"][name].mul_(1.5)
    elif damage == "wrong shape":
        saved["state"]["gparams"][name] = torch.zeros(3)
    else:
        del saved["state"]["gparams"][name]
    torch.save(saved, path)
    capsys.readouterr()
    resumed = run(CFG, root=tmp_path / "part", progress=False, checkpoint_every=1)
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and "checkpoint not loaded" in err[0], err
    assert resumed.meta["resumed_from_round"] == 0
    assert list((path.parent / "rejected").iterdir())
    _, a = load_model(fresh, tmp_path / "fresh")
    _, b = load_model(resumed, tmp_path / "part")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert resumed.history[-1]["test_acc"] == fresh.history[-1]["test_acc"]


def test_set_aside_names_never_collide(tmp_path):
    """Two files of one name set aside within one second keep both (issue 65)."""
    from fedlib.results import set_aside

    targets = []
    for content in ("first", "second", "third"):
        f = tmp_path / "x.json"
        f.write_text(content)
        targets.append(set_aside(f, "test"))
    assert len(set(targets)) == 3 and sorted(t.read_text() for t in targets) == ["first", "second", "third"]


def test_identical_runs_write_identical_model_files_with_the_process_umask(tmp_path):
    """Issue 65: the model file of a run depends on the run only (no temporary file name inside the
    archive), and result, model and checkpoint files get 0666 less the umask, not 0600."""
    import hashlib

    from fedlib.results import model_path

    old = os.umask(0o022)
    try:
        a = run(CFG.replace(rounds=1), root=tmp_path / "a", progress=False)
        b = run(CFG.replace(rounds=1), root=tmp_path / "b", progress=False)
    finally:
        os.umask(old)
    pa, pb = model_path(a.config, tmp_path / "a"), model_path(b.config, tmp_path / "b")
    assert hashlib.sha256(pa.read_bytes()).digest() == hashlib.sha256(pb.read_bytes()).digest()
    for f in (pa, a.path):
        assert (f.stat().st_mode & 0o777) == 0o644, f

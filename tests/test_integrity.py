"""Results on disk are verified before they are reused, checkpoints hold data only, and worker
processes end with the run (issue 28)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from fedlib import Config, run
from fedlib.results import Result, checkpoint_path, result_path
from fedlib.run import run_many

TINY = Config(clients=3, train_samples=300, test_samples=100, rounds=2, min_client_samples=10,
              profile="smoke")


def _rejected(root: Path) -> list[Path]:
    return sorted((root / "rejected").glob("*")) if (root / "rejected").exists() else []


@pytest.mark.parametrize("damage", ["edited", "another config's", "truncated", "garbage"])
def test_a_damaged_result_is_set_aside_and_recomputed(damage, tmp_path, capsys):
    good = run(TINY, root=tmp_path, progress=False)
    path = good.path
    if damage == "edited":
        d = json.loads(path.read_text())
        d["history"][-1]["test_acc"] = 0.1234
        path.write_text(json.dumps(d))
    elif damage == "another config's":
        other = run(TINY.replace(seed=1), root=tmp_path / "other", progress=False)
        path.write_bytes(other.path.read_bytes())
    elif damage == "truncated":
        path.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 2])
    else:
        path.write_bytes(b"\x00\xff not json")
    again = run(TINY, root=tmp_path, progress=False)
    assert again.final["test_acc"] == good.final["test_acc"] and again.config == TINY
    assert len(_rejected(tmp_path)) == 1  # kept, out of the way, never deleted
    assert "set aside" in capsys.readouterr().err
    assert Result.load(path, expect=TINY).final["test_loss"] == good.final["test_loss"]


def test_campaign_plan_reports_a_damaged_result_instead_of_counting_it(tmp_path):
    from lab import campaign

    run(TINY, root=tmp_path, progress=False)
    per_page = {"page": [TINY]}
    assert campaign.missing(per_page, tmp_path) == []
    path = result_path(TINY, tmp_path)
    d = json.loads(path.read_text())
    d["history"][-1]["test_acc"] = 0.9
    path.write_text(json.dumps(d))
    assert campaign.missing(per_page, tmp_path) == [TINY]
    (bad, reason), = campaign.invalid(per_page, tmp_path)
    assert bad == path and "hash" in reason


def test_a_truncated_checkpoint_is_set_aside_and_the_run_restarts(tmp_path, capsys):
    cfg = TINY.replace(rounds=3)
    assert run_many([cfg], root=tmp_path, progress=False, deadline=0.0) == [None]  # stops after round 1
    ckpt = checkpoint_path(cfg, tmp_path)
    ckpt.write_bytes(ckpt.read_bytes()[:100])
    done = run(cfg, root=tmp_path, progress=False)
    assert done.meta["resumed_from_round"] == 0 and len(done.history) == 3
    assert "checkpoint not loaded" in capsys.readouterr().err
    assert done.final["test_loss"] == run(cfg, root=tmp_path / "clean", progress=False).final["test_loss"]


class _Boom:
    def __reduce__(self):
        return (os.system, ("touch PWNED",))


def test_a_checkpoint_that_would_run_code_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = TINY.replace(rounds=3)
    ckpt = checkpoint_path(cfg, tmp_path)
    ckpt.parent.mkdir(parents=True)
    torch.save({"state": _Boom(), "history": [], "next_round": 1, "config_key": cfg.key()}, ckpt)
    done = run(cfg, root=tmp_path, progress=False)
    assert not (tmp_path / "PWNED").exists() and done.meta["resumed_from_round"] == 0


def test_a_read_only_results_folder_fails_before_the_first_round(tmp_path, monkeypatch):
    from fedlib.experiment import Experiment

    if os.geteuid() == 0:  # root ignores permissions: simulate the folder's refusal instead
        real = os.open

        def refuse(path, *a, **k):
            if str(path).startswith(str(tmp_path / "ro")):
                raise PermissionError(13, "Permission denied", str(path))
            return real(path, *a, **k)

        monkeypatch.setattr(os, "open", refuse)
    (tmp_path / "ro").mkdir()
    os.chmod(tmp_path / "ro", 0o555)
    rounds = []
    monkeypatch.setattr(Experiment, "round", lambda *a, **k: rounds.append(1))
    with pytest.raises(OSError, match="cannot write to"):
        run(TINY, root=tmp_path / "ro", progress=False)
    assert rounds == []


def _children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        text = (task / "children").read_text() if (task / "children").exists() else ""
        out += [int(x) for x in text.split()]
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def _default_signals() -> None:
    for s in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, signal.SIG_DFL)


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs Linux /proc")
@pytest.mark.parametrize(
    "sig",
    [
        signal.SIGKILL,
        pytest.param(signal.SIGTERM, marks=pytest.mark.e2e),
        pytest.param(signal.SIGHUP, marks=pytest.mark.e2e),
    ],
)
def test_parallel_workers_end_with_their_run_whatever_signal_ends_it(sig, tmp_path):
    """kill -9 (or TERM, HUP) of a run on the parallel path leaves no worker behind, and a reader
    of its output (``... | cat``) sees the end of it."""
    code = ("from fedlib import Config, run; "
            "run(Config(clients=4, train_samples=2000, test_samples=100, rounds=500, min_client_samples=10), "
            "engine='parallel', device='cpu', progress=True)")
    env = {**os.environ, "FEDLIB_RESULTS_DIR": str(tmp_path)}
    # the run gets the default action for every signal sent here, whatever this test inherited (under
    # ``nohup make test`` SIGHUP is ignored, and the run would outlive it)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env=env, preexec_fn=_default_signals)
    deadline = time.time() + 120
    while len(_children(proc.pid)) < 2 and time.time() < deadline:
        time.sleep(0.2)
    workers = _children(proc.pid)
    assert len(workers) >= 2, "the run did not start its workers"
    time.sleep(1.0)  # the workers are serving rounds
    os.kill(proc.pid, sig)
    proc.wait(timeout=30)
    reader = threading.Thread(target=proc.stdout.read, daemon=True)  # ends at EOF: once nothing
    reader.start()  # holds the pipe's write end (a leftover worker would, forever)
    reader.join(timeout=30)
    try:
        assert not reader.is_alive(), "the run's output never ended: a worker still holds it"
    finally:
        for w in workers:  # never leave one behind, even when the test fails
            if _alive(w):
                os.kill(w, signal.SIGKILL)
    deadline = time.time() + 20
    while any(_alive(w) for w in workers) and time.time() < deadline:
        time.sleep(0.2)
    assert not any(_alive(w) for w in workers), "a worker outlived its run"


def test_a_run_another_process_trains_is_skipped_or_waited_for(tmp_path):
    """Concurrent campaign slices split the work: a config locked by another process is left to it
    (``skip``) or waited for and then loaded (``wait``); the lock of a killed holder is taken over."""
    other = TINY.replace(seed=1)
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from fedlib.results import ConfigLocks; from fedlib import Config; "
        f"locks = ConfigLocks({str(tmp_path)!r}); "
        f"assert locks.acquire(Config(**{TINY.to_dict()!r}), block=False); "
        "print('held', flush=True); time.sleep(600)")], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    try:
        skipped, trained = run_many([TINY, other], root=tmp_path, progress=False, locked="skip")
        assert skipped is None and trained is not None
        assert not result_path(TINY, tmp_path).exists()
        holder.kill()  # dies holding the lock: the kernel releases it
        holder.wait(timeout=10)
        waited = run_many([TINY], root=tmp_path, progress=False, locked="wait")[0]
        assert waited is not None and result_path(TINY, tmp_path).exists()
    finally:
        holder.kill()


def test_a_dataset_file_corrupted_at_the_same_size_is_detected_and_repaired(tmp_path, capsys):
    """A flipped byte keeps the file's size and the counts: its checksum shows it, and fetching
    again repairs it from the next source; every result records the data's identity."""
    import shutil

    from fedlib import data as data_mod

    root = tmp_path / "raw"
    shutil.copytree(data_mod.data_dir() / "MNIST", root / "MNIST")
    path = root / "MNIST" / "raw" / "train-images-idx3-ubyte"
    blob = bytearray(path.read_bytes())
    blob[5000] ^= 0xFF
    path.write_bytes(bytes(blob))
    with pytest.raises(ValueError, match="train-images-idx3-ubyte: SHA-256"):
        data_mod.verify_checksums("mnist", root)
    source = data_mod.fetch("mnist", root, verbose=False)
    assert source != "files already in the data folder"  # re-fetched, not used as it was
    said = capsys.readouterr().err.strip().splitlines()
    assert said == [f"mnist: {path} failed its checksum (corrupted) and was replaced from {source}"]
    data_mod.verify_checksums("mnist", root)
    r = run(TINY.replace(dataset="mnist"), root=tmp_path / "results", progress=False)
    digest = data_mod.dataset_digest
    assert r.meta["data_sha256"] == digest("mnist") != digest("fashionmnist")


def test_result_files_are_valid_json_and_read_back_their_non_finite_values(tmp_path):
    """Issue 65: a diverged run's NaN loss and an infinite epsilon are written as null with a record of
    what each was; the file is strict JSON and loads back with the same values."""
    import json
    import math

    from fedlib import Config
    from fedlib.results import Result

    cfg = Config(rounds=2)
    history = [{"round": 1, "train_loss": math.nan, "epsilon_spent": math.inf, "test_acc": None},
               {"round": 2, "train_loss": 1.5, "skew": -math.inf, "test_acc": 0.5}]
    meta = {"config_key": cfg.key(), "device": "cpu", "git_commit": "x", "torch": "x", "seed": 0,
            "duration_s": 1.0, "diverged": True}
    r = Result(cfg, history, meta)
    path = tmp_path / f"{cfg.algorithm}-{cfg.key()}.json"
    r.save(path)

    def refuse(c):
        raise AssertionError(f"{c} is not JSON")

    d = json.loads(path.read_text(), parse_constant=refuse)
    assert d["history"][0]["train_loss"] is None and d["nonfinite"]["history/0/train_loss"] == "nan"
    back = Result.load(path)
    assert math.isnan(back.history[0]["train_loss"]) and back.history[0]["epsilon_spent"] == math.inf
    assert back.history[1]["skew"] == -math.inf and back.history[0]["test_acc"] is None


def test_no_committed_result_holds_a_non_json_number():
    """Every committed result, audit and verdict is strict JSON (no NaN or Infinity literals)."""
    import json

    from fedlib.results import REPO_ROOT

    def refuse(c):
        raise AssertionError(c)

    bad = []
    for folder in ("data/results", "data/verdicts"):
        for f in (REPO_ROOT / folder).rglob("*.json"):
            if "rejected" in f.parts:
                continue
            try:
                json.loads(f.read_text(), parse_constant=refuse)
            except AssertionError:
                bad.append(f.name)
    assert not bad, bad[:5]


def _rehash(d: dict) -> str:
    """A forger (or a buggy writer) recomputes the content hash: the schema must hold without it."""
    from fedlib.results import content_hash

    d["meta"]["content_sha256"] = content_hash(d)
    return json.dumps(d)


#: The 13 ways a result can hold valid JSON of the wrong schema with a correct hash (issue 78): each
#: damages a fresh copy of a good result; the cache refuses every one as unpack does.
SCHEMA_DAMAGE = {
    "history entries as strings": lambda d: d.update(history=[json.dumps(h) for h in d["history"]]),
    "test_acc a string": lambda d: d["history"][-1].update(test_acc="0.9"),
    "test_acc true": lambda d: d["history"][-1].update(test_acc=True),
    "bad nonfinite entry": lambda d: d.update(nonfinite={"history/99/test_loss": "nan"}),
    "nonfinite not a mapping": lambda d: d.update(nonfinite=["history/0/test_loss"]),
    "short history": lambda d: d.update(history=d["history"][:1]),
    "negative loss": lambda d: d["history"][0].update(train_loss=-1.0),
    "accuracy above 1": lambda d: d["history"][-1].update(test_acc=7.0),
    "round out of order": lambda d: d["history"][0].update(round=5),
    "last round not evaluated": lambda d: d["history"][-1].update(test_acc=None),
    "provenance missing": lambda d: d["meta"].pop("git_commit"),
    "invalid config": lambda d: d["config"].update(lr=-1.0),
    "meta a list": lambda d: d.update(meta=[d["meta"]]),
}


@pytest.mark.parametrize("damage", sorted(SCHEMA_DAMAGE))
def test_a_cached_result_of_the_wrong_schema_is_set_aside_and_recomputed(damage, tmp_path, capsys):
    from lab.campaign import InvalidResult, check_result

    good = run(TINY, root=tmp_path, progress=False)
    d = json.loads(good.path.read_text())
    SCHEMA_DAMAGE[damage](d)
    text = _rehash(d) if isinstance(d.get("meta"), dict) else json.dumps(d)
    good.path.write_text(text)
    with pytest.raises(InvalidResult):  # the same rule in unpack
        check_result(good.path.name, text.encode())
    capsys.readouterr()
    again = run(TINY, root=tmp_path, progress=False)
    err = capsys.readouterr().err
    timeless = [{k: v for k, v in h.items() if not k.endswith("_s")} for h in again.history]
    assert timeless == [{k: v for k, v in h.items() if not k.endswith("_s")} for h in good.history]
    assert len(_rejected(tmp_path)) == 1 and "set aside" in err and good.path.name in err
    assert len([x for x in err.splitlines() if "set aside" in x]) == 1

"""The offline GPU slice end to end, on this CPU at the smoke profile: what a GPU node runs
(``bash tools/gpu-slice.sh MINUTES OUTDIR``) unpacks the carried data, runs the GPU tests (skipped
here) and the benchmark, trains a campaign slice claims first, and packs at most 8 files that
``campaign unpack`` accepts on the connected machine."""

import json
import os
import subprocess
import sys
import tarfile
import time

import pytest

from fedlib.results import REPO_ROOT
from lab import campaign
from lab.gpu_bundle import bundle_data, carried_datasets, unpack_data


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    """What make gpu-bundle carries besides the wheels: the compressed IDX files (lzma's fastest
    level: the format is what the node reads, the level only trades size for time)."""
    out = tmp_path_factory.mktemp("gpudata")
    bundle_data(out, preset=0)
    return out


@pytest.mark.slow
@pytest.mark.e2e
def test_gpu_slice_runs_end_to_end_and_its_results_unpack(tmp_path, bundle):
    assert len(list(bundle.glob("*/*.xz"))) == 8
    out = tmp_path / "out"  # the fixture's bundle of both datasets, not the one a make gpu-bundle left
    env = {**os.environ, "PYTHON": sys.executable, "FEDLIB_DATA_DIR": str(tmp_path / "raw"),
           "FEDLIB_RESULTS_DIR": str(tmp_path / "node" / "results"),
           "FEDLIB_BENCH_DIR": str(tmp_path / "bench")}
    # 8 minutes of budget for about 80 s of work on an idle 2-core CPU: the slice stops when its work
    # is done, and a loaded machine (4 minutes failed beside a mutation run) still finishes in time
    cmd = ["bash", str(REPO_ROOT / "tools" / "gpu-slice.sh"), "8", str(out), "--profile", "smoke",
           "--pages", "moon_dpap_table2", "dpfl_claim3", "--margin-min", "0.2", "--no-progress",
           "--allow-cpu", "--data-bundle", str(bundle), "--bench", "--bench-args",
           "--samples 400 --clients 4 --rounds 1 --batch-runs 1 --no-scale --paths sequential",
           "--bench-args", "--kernel-profile --samples 160 --clients 2 --rounds 1 --batch-runs 1"]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    files = sorted(p.name for p in out.iterdir())
    assert len(files) <= 8 and {"slice.json", "logs.tgz", "results-00.tgz"} <= set(files), files
    summary = json.loads((out / "slice.json").read_text())
    # the check, then training first, then one benchmark run per --bench-args
    assert list(summary["steps"]) == ["tests", "campaign", "bench", "bench-2"]
    assert summary["steps"]["tests"]["rc"] == 0 and summary["steps"]["bench"]["rc"] == 0
    assert summary["steps"]["bench-2"]["rc"] == 0
    assert "--kernel-profile" in summary["steps"]["bench-2"]["command"]
    # moon_dpap_table2: 5 variants and FedAvg; dpfl_claim3: 6 memorising and 5 learning federations, 1 seed
    assert summary["steps"]["campaign"]["still missing"] == 0 and summary["results"] == 17
    # the benchmark and the kernel profile, each under its own name
    bench_file, profile_file = summary["steps"]["bench"]["file"], summary["steps"]["bench-2"]["file"]
    assert bench_file.startswith("cpu-") and profile_file.endswith("-kernel-profile.json")
    assert {bench_file, profile_file} <= set(files)
    with tarfile.open(out / "logs.tgz") as tar:
        assert {"tests.log", "bench.log", "bench-2.log"} <= set(tar.getnames())
    # the connected machine: checked, then added (results and their membership-audit losses)
    report = campaign.unpack(sorted(out.glob("results-*.tgz")), root=tmp_path / "home")
    audits = [n for n in report["added"] if n.startswith("audits/")]
    assert len(report["added"]) == 17 + 11 and len(audits) == 11
    assert (tmp_path / "raw" / "MNIST" / "raw" / "train-images-idx3-ubyte").exists()


def test_the_slice_refuses_benchmark_options_it_would_not_run_or_cannot_split(tmp_path, capsys):
    from lab import gpu_slice

    assert gpu_slice.bench_runs("") == [""] and gpu_slice.bench_runs([]) == [""]
    assert gpu_slice.bench_runs(["--options-sweep", "--kernel-profile"]) == ["--options-sweep",
                                                                             "--kernel-profile"]
    for argv, said in ((["--bench-args=--kernel-profile"], "--bench is not"),
                       (["--bench", "--bench-args", "--rounds '2"], "No closing quotation")):
        with pytest.raises(SystemExit):
            gpu_slice.main(["1", str(tmp_path / "out"), "--allow-cpu", *argv])
        assert said in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_the_slice_refuses_a_non_empty_outdir_and_unknown_pages(tmp_path):
    from lab import gpu_slice

    (tmp_path / "x").write_text("old")
    with pytest.raises(SystemExit):
        gpu_slice.main(["1", str(tmp_path)])
    assert gpu_slice.main(["1", str(tmp_path / "new"), "--profile", "smoke", "--pages", "nope_*",
                           "--allow-cpu"]) == 2
    assert not (tmp_path / "new").exists()


def test_the_slice_refuses_a_machine_without_a_gpu_in_one_line(tmp_path, monkeypatch, capsys):
    import torch

    from lab import gpu_slice

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpu_slice.main(["1", str(tmp_path / "new")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "no GPU here" in err and "--allow-cpu" in err
    assert not (tmp_path / "new").exists()
    # on a GPU node the same call goes on to its work (here: stops at the unknown page, before any)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert gpu_slice.main(["1", str(tmp_path / "new"), "--profile", "smoke", "--pages", "nope_*"]) == 2
    assert "no GPU" not in capsys.readouterr().err


def test_test_workers_are_checked_before_any_work_and_passed_to_xdist(tmp_path, monkeypatch, capsys):
    import importlib.util

    from lab import gpu_slice

    with pytest.raises(SystemExit):
        gpu_slice.main(["1", str(tmp_path / "a"), "--test-workers", "-1"])
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "xdist" else real(name, *a))
    with pytest.raises(SystemExit):
        gpu_slice.main(["1", str(tmp_path / "a"), "--test-workers", "4"])
    assert "pytest-xdist" in capsys.readouterr().err and not (tmp_path / "a").exists()
    assert gpu_slice.test_workers_auto() == 0  # no xdist: one process
    assert gpu_slice.xdist_args(0) == [] and gpu_slice.xdist_args(8) == ["-n", "8", "--dist", "loadfile"]
    assert gpu_slice.xdist_args(4, "load") == ["-n", "4", "--dist", "load"]


def test_unpack_data_restores_the_idx_files(tmp_path, bundle):
    restored = unpack_data(bundle, tmp_path / "raw")
    from fedlib.data import data_dir

    assert len(restored) == 8
    for f in restored:
        assert f.read_bytes() == (data_dir() / f.relative_to(tmp_path / "raw")).read_bytes()


def test_a_bundle_of_one_dataset_replaces_what_was_there_and_unpacks(tmp_path, bundle):
    """Both datasets do not fit beside the repository in what one command carries: a bundle of one
    removes the other dataset's files and an older bundle's gzipped ones, the slice fetches only the
    one it carries, and older gzipped bundles still unpack."""
    import gzip
    import shutil

    out = tmp_path / "gpudata"
    shutil.copytree(bundle, out)
    legacy = out / "MNIST" / "t10k-labels-idx1-ubyte.gz"
    with open(out / "MNIST" / "t10k-labels-idx1-ubyte.xz", "rb") as f:
        import lzma

        legacy.write_bytes(gzip.compress(lzma.decompress(f.read())))
    assert carried_datasets(out) == {"fashionmnist", "mnist"}
    restored = unpack_data(out, tmp_path / "raw")
    assert len(restored) == 9 and len(set(restored)) == 8  # the .gz and the .xz give the same file
    files = bundle_data(out, datasets=["mnist"], preset=0)
    assert sorted(p.relative_to(out).parts[0] for p in out.glob("*/*")) == ["MNIST"] * 4
    assert sorted(files) == sorted(out.glob("*/*")) and carried_datasets(out) == {"mnist"}
    assert carried_datasets(tmp_path / "absent") is None
    with pytest.raises(ValueError, match="unknown datasets"):
        bundle_data(out, datasets=["cifar10"])


def test_what_the_node_leaves_out_exists():
    """A renamed test or module would silently leave the node's list (pytest ignores an unknown
    ``--deselect``): every entry must name a test module, or a test function in one, that exists."""
    from lab.gpu_slice import NODE_IGNORES

    assert NODE_IGNORES
    for arg in NODE_IGNORES:
        path, _, test = arg.split("=", 1)[1].partition("::")
        assert (REPO_ROOT / path).is_file(), arg
        assert not test or f"def {test}(" in (REPO_ROOT / path).read_text(), arg


def test_the_campaign_step_trains_with_cuda_graphs_unless_told_not_to(tmp_path, monkeypatch, restore_kernels):
    from fedlib import data as data_mod
    from fedlib.kernels import kernel_settings
    from lab import gpu_slice

    seen = []
    monkeypatch.setattr(data_mod, "fetch", lambda name: None)
    monkeypatch.setattr(campaign, "run", lambda *a, **k: seen.append(kernel_settings()["cuda_graphs"])
                        or {"still missing": 0})
    monkeypatch.setenv("FEDLIB_RESULTS_DIR", str(tmp_path / "results"))
    (tmp_path / "results").mkdir()
    for i, flag in enumerate(([], ["--no-cuda-graphs"], ["--cuda-graphs"])):
        out = tmp_path / f"out{i}"
        assert gpu_slice.main(["5", str(out), "--profile", "smoke", "--tests", "none", "--allow-cpu",
                               "--no-progress", "--data-bundle", str(tmp_path / "none"), *flag]) == 0
        assert json.loads((out / "slice.json").read_text())["cuda_graphs"] is (flag != ["--no-cuda-graphs"])
        assert "bench" not in json.loads((out / "slice.json").read_text())["steps"]  # only when asked
    assert seen == [True, False, True]


def test_the_tests_stop_at_their_share_of_the_budget_and_leave_the_rest_to_training(tmp_path, monkeypatch):
    """A hanging GPU test must not eat a loan: the tests get ``--tests-share`` of the budget (0.4 of
    10 minutes: 240 s), the campaign what is left less the packing margin."""
    from fedlib import data as data_mod
    from lab import gpu_slice

    limits, budgets = [], []
    monkeypatch.setattr(data_mod, "fetch", lambda name: None)
    monkeypatch.setattr(gpu_slice, "_step", lambda cmd, log, timeout_s: limits.append(timeout_s)
                        or {"command": "", "rc": 0, "seconds": 0.0})
    monkeypatch.setattr(campaign, "run",
                        lambda profile, budget, **k: budgets.append(budget) or {"still missing": 0})
    monkeypatch.setenv("FEDLIB_RESULTS_DIR", str(tmp_path / "results"))
    (tmp_path / "results").mkdir()
    args = ["10", str(tmp_path / "out"), "--profile", "smoke", "--tests", "gpu", "--allow-cpu",
            "--no-progress", "--data-bundle", str(tmp_path / "none"), "--test-workers", "0"]
    t0 = time.time()
    assert gpu_slice.main(args) == 0
    took = time.time() - t0  # the slice's own setup before each step (seconds on a loaded machine)
    assert 240 - took <= limits[0] <= 240 and 7.5 - took / 60 <= budgets[0] <= 7.5
    with pytest.raises(SystemExit):
        gpu_slice.main(["10", str(tmp_path / "out2"), "--tests-share", "0"])


def test_pytest_outcomes_name_the_failures_of_a_log_cut_off_before_its_summary():
    """A lent GPU's tests ran out of their share with 2 of 54 failed and no summary (2026-11-27): the
    verbose log's lines name each outcome as it happens, with or without xdist."""
    from lab.gpu_slice import pytest_outcomes

    log = "\n".join([
        "[gw0] [  1%] PASSED tests/test_cuda.py::test_a[grouped]",
        "[gw3] [  2%] FAILED tests/test_cuda.py::test_b ",
        "tests/test_engine.py::test_c PASSED                                   [  3%]",
        "tests/test_engine.py::test_d ERROR                                    [  4%]",
        "[gw1] [  5%] SKIPPED tests/test_cuda.py::test_e ",
        "FAILED tests/test_cuda.py::test_b - AssertionError: 1 != 2",
        "some line that names no test: FAILED",
    ])
    got = pytest_outcomes(log)
    assert got["failed"] == ["tests/test_cuda.py::test_b", "tests/test_engine.py::test_d"]
    assert got["outcomes"] == {"error": 1, "failed": 1, "passed": 2, "skipped": 1}
    assert pytest_outcomes("") == {"outcomes": {}, "failed": []}


def test_a_step_past_its_time_is_interrupted_first_so_it_can_report(tmp_path):
    """SIGINT before the kill: pytest prints what ran when interrupted; a process that reports on
    KeyboardInterrupt gets to write it, and the step's status is 124."""
    import sys

    from lab import gpu_slice

    code = ("import time\ntry:\n    print('started', flush=True); time.sleep(60)\n"
            "except KeyboardInterrupt:\n    print('interrupted: wrote its summary', flush=True)\n")
    step = gpu_slice._step([sys.executable, "-c", code], tmp_path / "log", timeout_s=1.5)
    assert step["rc"] == 124 and step["seconds"] < 30
    assert "interrupted: wrote its summary" in (tmp_path / "log").read_text()

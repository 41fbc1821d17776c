"""One slice of the paper campaign on an offline GPU node: ``bash tools/gpu-slice.sh MINUTES OUTDIR``.

The wrapper installs the carried wheels when the node lacks them (``make gpu-bundle`` made them on a
connected machine) and runs ``python -m lab.gpu_slice MINUTES OUTDIR``, which, within
``MINUTES`` from its start:

0. refuses, in one line, on a machine without a GPU (``--allow-cpu``: run anyway, for the tests);
1. unpacks the carried datasets (``.gpudata/``) into ``data/raw/`` and verifies them;
2. checks the device (``--tests check``, the default): the captured CUDA-graph step against the
   float64 CPU reference, about a minute; ``gpu``: every GPU test; ``all``: the suite that can run
   without papermill, a browser or Flower; ``none``; the log is kept; the tests stop after
   ``--tests-share`` (0.4) of the budget, so that training keeps the rest;
3. trains the campaign, claims first (:func:`lab.campaign.run`), in run batches of up to
   ``--max-batch`` runs, until ``--margin-min`` (2.5) minutes before the budget ends; a run batch
   that would not end in time is not started, a run still training at the deadline checkpoints and
   stops (the next slice on the same machine resumes it), and every finished run is written at once;
4. runs the benchmark only when asked (``--bench``: ``lab.bench --save``), after the training, once
   for each ``--bench-args`` given (in order: e.g. the options sweep, then the kernel profile);
5. packs every result (and audit) file the slice added, the benchmark JSON, a summary
   (``slice.json``) and the logs into at most 8 files of at most 16 MiB under ``OUTDIR`` (what the
   project's GPU machine returns per command).

The GPU machine runs one command for at most 10 minutes: a campaign is a series of such slices, each
resuming where the last stopped. On the connected machine,
``python -m lab.campaign unpack OUTDIR/results-*.tgz`` checks and adds the results, and
``OUTDIR/<device>-<date>.json`` goes to ``data/bench/`` (a benchmark with speed options,
``--bench-args '--matmul-tf32'``, is named ``<device>-<date>-<options>.json`` and goes to
``data/bench/options/``). A slice interrupted at any point loses nothing already written; rerun it to
go on. The exit status is 0 only if every step that ran succeeded (the results are packed whatever
the tests said).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tarfile
import time
from collections import Counter
from pathlib import Path

from fedlib.cli import OneLineParser
from fedlib.kernels import set_kernel_options
from fedlib.results import REPO_ROOT, atomic_write_bytes, results_dir

#: What the project's GPU machine returns from one command.
MAX_FILES, MAX_BYTES = 8, 16 * 2**20

#: Test modules an offline GPU node cannot collect (papermill, a browser, Flower) or should not run (the
#: slice itself), and three device-independent tests that need what the node lacks: Flower (every
#: module imports on its own), a package registry (a corrupted dataset is fetched again) and mutmut
#: (a real mutation run). ``make test`` runs them all.
NODE_IGNORES = [f"--ignore=tests/{m}.py" for m in (
    "test_notebooks", "test_browser_check", "test_flower", "test_flower_deploy", "test_flower_dp",
    "test_gpu_slice")] + [f"--deselect=tests/{t}" for t in (
        "test_layers.py::test_every_library_module_imports_alone_without_studies_or_lab",
        "test_integrity.py::test_a_dataset_file_corrupted_at_the_same_size_is_detected_and_repaired",
        "test_privacy_mutants.py::test_a_real_mutmut_run_reports_its_survivor_and_resumes")]


def result_files(root: Path) -> set[Path]:
    """The result and audit files under ``root`` now."""
    return {*root.glob("*.json"), *(root / "audits").glob("*.json")}


def test_workers_auto() -> int:
    """Test processes for the slice: 8 where pytest-xdist is installed and there are 16 cores or more
    (the H100 node has both; each test process runs torch on two threads, tests/conftest.py), else 0
    (one process). On the H100 one process ran 519 of the 540 tests that can run there in 400 s."""
    return 8 if importlib.util.find_spec("xdist") and (os.cpu_count() or 1) >= 16 else 0


def xdist_args(workers: int, dist: str = "loadfile") -> list[str]:
    """pytest-xdist's arguments for ``workers`` processes (none for 0): a test module per process
    (``loadfile``: module-scoped fixtures are built once), or test by test (``load``: the GPU tests
    are one module, tests/test_cuda.py; on the H200, 4 processes ran it in 200 s, one process had not
    finished half of it in 200 s)."""
    return ["-n", str(workers), "--dist", dist] if workers > 0 else []


#: Seconds a step past its time gets to stop after SIGINT (pytest then prints its summary of what
#: ran) before it is killed.
STOP_GRACE_S = 20.0

_TEST_ID = re.compile(r"(tests/\S+::\S+)")
_OUTCOME = re.compile(r"\b(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\b")


def bench_runs(bench_args: str | list[str]) -> list[str]:
    """The benchmark runs a slice makes: one per ``--bench-args`` string (a single string, or none,
    is one run). A string that ``shlex`` cannot split is refused before any work."""
    runs = [bench_args] if isinstance(bench_args, str) else list(bench_args) or [""]
    for args in runs:
        try:
            shlex.split(args)
        except ValueError as e:
            raise ValueError(f"--bench-args {args!r}: {e}") from None
    return runs


def _step(cmd: list[str], log: Path, timeout_s: float) -> dict:
    """Run ``cmd`` with its output in ``log``; its exit status and seconds (124 past ``timeout_s``:
    it is interrupted with SIGINT, given :data:`STOP_GRACE_S` to report, then killed)."""
    t0 = time.time()
    with open(log, "w") as f:
        # SIGINT back to its default in the child: a job started in the background (nohup ... &)
        # inherits SIGINT ignored, and Python then never raises KeyboardInterrupt for it
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=REPO_ROOT,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        try:
            rc = proc.wait(timeout=max(1.0, timeout_s))
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            rc = 124
    return {"command": shlex.join(cmd), "rc": rc, "seconds": round(time.time() - t0, 1)}


def pytest_outcomes(log_text: str) -> dict:
    """What a verbose pytest log (``-v``, with or without xdist) says each test did, so that a run cut
    off before pytest's own summary still names its failures: counts by outcome, and the ids of the
    tests that failed or errored."""
    last: dict[str, str] = {}
    for line in log_text.splitlines():
        test, outcome = _TEST_ID.search(line), _OUTCOME.search(line)
        if test and outcome:
            last[test.group(1)] = outcome.group(1)
    counts = Counter(outcome.lower() for outcome in last.values())
    bad = sorted(t for t, o in last.items() if o in ("FAILED", "ERROR"))
    return {"outcomes": dict(sorted(counts.items())), "failed": bad}


#: The device check of ``--tests check``: the captured step against the float64 CPU reference, for
#: six algorithm families (tests/test_cuda.py), about a minute on the H100.
CHECK_TESTS = ["tests/test_cuda.py", "-k", "cuda_graphs_equal_cpu_sequential"]

#: Share of the slice's budget the tests may use (a 9-minute slice: 3.6 minutes; ``-m gpu`` took
#: 200 s on the H200 with 4 workers, one process not half of it in 200 s).
TESTS_SHARE = 0.4

#: Minutes a slice keeps for packing by default: it trains until this long before its budget ends.
MARGIN_MIN = 2.5


def no_gpu_reason() -> str | None:
    """Why this machine cannot run a GPU slice (None when it can)."""
    import torch

    if torch.cuda.is_available():
        return None
    return ("no GPU here (torch.cuda.is_available() is False): a slice trains on a GPU node; "
            "--allow-cpu runs it on the CPU, for the tests")


def slice_(minutes: float, out: Path, profile: str = "paper", pages: list[str] | None = None,
           n_seeds: int | None = None, tests: str = "check", bench: bool = False,
           bench_args: str | list[str] = "",
           max_batch: int = 8, margin_min: float = MARGIN_MIN, progress: bool = True,
           data_bundle: Path | None = None, test_workers: int | None = None,
           cuda_graphs: bool = True, tests_share: float = TESTS_SHARE) -> dict:
    """The slice (see the module's docstring); returns its summary, also written to ``out/slice.json``.
    ``cuda_graphs``: the campaign's runs replay their steps as CUDA graphs (:mod:`fedlib.graphs`, the
    CUDA default; each result records it in ``meta.kernels``). ``tests_share``: the tests stop after
    this share of the budget, so that a slow or hanging test leaves time to train (their log says
    how far they got; the step's status is then 124)."""
    from lab import campaign
    from lab.bench import bench_dir
    from lab.gpu_bundle import DATA_BUNDLE, carried_datasets, unpack_data

    start = time.time()
    deadline = start + 60 * minutes

    def tests_limit() -> float:
        """Seconds the tests may take: until ``tests_share`` of the budget, at most the deadline."""
        return min(start + 60 * minutes * tests_share, deadline) - time.time()

    test_workers = test_workers_auto() if test_workers is None else test_workers
    campaign.needed(profile, pages, n_seeds)  # bad pages or profile: an error before any work
    out.mkdir(parents=True, exist_ok=True)
    if any(out.iterdir()):
        raise FileExistsError(f"{out} is not empty: a slice writes into an empty folder")
    logs = out / ".logs"
    logs.mkdir()
    summary: dict = {"minutes": minutes, "profile": profile, "pages": pages, "cuda_graphs": cuda_graphs,
                     "steps": {}}

    # 1. data
    from fedlib import data as data_mod

    bundle = Path(data_bundle or DATA_BUNDLE)
    # A bundle may carry one dataset only (the node takes 64 MiB per command): the other is left
    # alone here, and a page that needs it fails in the campaign with the fetch's own error.
    carried = carried_datasets(bundle)
    if carried is not None:
        unpack_data(bundle)
    for name in ("fashionmnist", "mnist"):
        if carried is None or name in carried:
            data_mod.fetch(name)
    summary["datasets"] = sorted(carried) if carried is not None else ["fashionmnist", "mnist"]
    root = results_dir()
    before = result_files(root)

    # 2. tests: the device check by default
    py = sys.executable
    if tests == "check":
        args = [py, "-m", "pytest", *CHECK_TESTS, "-v", "-p", "no:cacheprovider", "-rfEs"]
        summary["steps"]["tests"] = _step(args, logs / "tests.log", tests_limit())
    elif tests != "none":
        # The modules that need papermill, a browser or Flower are left out in both modes: they import
        # what the node lacks at collection, which would stop even ``-m gpu``.
        args = [py, "-m", "pytest", "tests", "-v", "-p", "no:cacheprovider", "-rfEs", *NODE_IGNORES]
        dist = "load" if tests == "gpu" else "loadfile"
        args += ["-m", "gpu" if tests == "gpu" else "not heavy", *xdist_args(test_workers, dist)]
        summary["steps"]["tests"] = _step(args, logs / "tests.log", tests_limit())
    if tests != "none" and (logs / "tests.log").exists():  # each test's outcome, even when cut off
        summary["steps"]["tests"].update(pytest_outcomes((logs / "tests.log").read_text(errors="replace")))

    # 3. campaign, with what is left (less the margin for packing)
    budget = (deadline - time.time()) / 60 - margin_min
    if budget > 0:
        t0 = time.time()
        set_kernel_options(cuda_graphs=cuda_graphs)
        try:
            report = campaign.run(profile, budget, root=root, max_batch=max_batch, progress=progress,
                                  pages=pages, n_seeds=n_seeds)
            summary["steps"]["campaign"] = {**report, "rc": 0}
        except Exception as e:  # noqa: BLE001 - recorded, and what was written is still packed
            summary["steps"]["campaign"] = {"rc": 1, "error": f"{type(e).__name__}: {e}"}
        summary["steps"]["campaign"]["seconds"] = round(time.time() - t0, 1)
    else:
        summary["steps"]["campaign"] = {"rc": 0, "skipped": f"no budget left ({budget:.1f} min)"}

    # 4. benchmark, when asked, after the training: one run of lab.bench per --bench-args
    for i, args in enumerate(bench_runs(bench_args) if bench else []):
        name = "bench" if i == 0 else f"bench-{i + 1}"
        before_bench = set(bench_dir().rglob("*.json"))
        cmd = [py, "-m", "lab.bench", "--json", "--save", *shlex.split(args)]
        summary["steps"][name] = _step(cmd, logs / f"{name}.log", deadline - time.time())
        for f in sorted(set(bench_dir().rglob("*.json")) - before_bench):
            (out / f.name).write_bytes(f.read_bytes())
            summary["steps"][name]["file"] = f.name

    # 5. pack
    new = sorted(result_files(root) - before)
    archives = campaign.pack(new, out)
    summary["results"] = len([f for f in new if f.parent == root])
    summary["archives"] = [a.name for a in archives]
    summary["seconds"] = round(time.time() - start, 1)
    summary["rc"] = max([s.get("rc", 0) for s in summary["steps"].values()], default=0)
    with tarfile.open(out / "logs.tgz", "w:gz") as tar:
        for f in sorted(logs.iterdir()):
            tar.add(f, arcname=f.name)
    for f in logs.iterdir():
        f.unlink()
    logs.rmdir()
    atomic_write_bytes(out / "slice.json", json.dumps(summary, indent=1).encode())
    files = sorted(out.iterdir())
    too_big = [f.name for f in files if f.stat().st_size > MAX_BYTES]
    if len(files) > MAX_FILES or too_big:
        summary["rc"] = summary["rc"] or 3
        print(f"error: {len(files)} files under {out} (at most {MAX_FILES}), too large: {too_big}; "
              "run campaign pack with a smaller slice", file=sys.stderr)
    return summary


def main(argv: list[str] | None = None) -> int:
    p = OneLineParser(prog="python -m lab.gpu_slice", description=__doc__.splitlines()[0])
    p.add_argument("minutes", type=float, help="the slice's whole budget, from its start")
    p.add_argument("outdir", type=Path, help="an empty folder for what comes back (at most 8 files)")
    p.add_argument("--profile", default="paper", choices=["smoke", "quick", "paper"])
    p.add_argument("--pages", nargs="+", metavar="PATTERN", help="only these pages (globs)")
    p.add_argument("--seeds", type=int, default=None)
    p.add_argument("--tests", default="check", choices=["check", "gpu", "all", "none"],
                   help="check: the captured step against the CPU reference (about a minute, the default); "
                        "gpu: every GPU test; all: the suite the node can run; none")
    p.add_argument("--test-workers", type=int, default=None,
                   help="pytest-xdist processes for the tests (0: one process; default: 8 where xdist and "
                        "16 cores are there, else 0)")
    p.add_argument("--tests-share", type=float, default=TESTS_SHARE,
                   help=f"share of the budget the tests may use (default {TESTS_SHARE})")
    p.add_argument("--bench", action="store_true", help="run the benchmark after the training")
    p.add_argument("--bench-args", action="append", default=[],
                   help="extra options of lab.bench (quoted); repeated: one benchmark run each, in order")
    p.add_argument("--max-batch", type=int, default=8)
    p.add_argument("--cuda-graphs", action=argparse.BooleanOptionalAction, default=True,
                   help="the campaign's runs replay their steps as CUDA graphs (fedlib.graphs; default on)")
    p.add_argument("--margin-min", type=float, default=MARGIN_MIN,
                   help=f"minutes kept for packing (default {MARGIN_MIN})")
    p.add_argument("--allow-cpu", action="store_true", help="run on a machine without a GPU (for the tests)")
    p.add_argument("--no-progress", dest="progress", action="store_false")
    p.add_argument("--data-bundle", type=Path, default=None, help="compressed datasets (default: .gpudata/)")
    args = p.parse_args(argv)
    if not args.minutes > 0:
        p.error("MINUTES must be > 0")
    if not 0 < args.tests_share <= 1:
        p.error("--tests-share must be in (0, 1]")
    if args.test_workers is not None and args.test_workers < 0:
        p.error("--test-workers must be >= 0")
    if args.test_workers and importlib.util.find_spec("xdist") is None:
        p.error("--test-workers needs pytest-xdist, which is not installed here (0: one process)")
    if args.bench_args and not args.bench:
        p.error("--bench-args is given but --bench is not: add --bench to run the benchmark")
    try:
        bench_runs(args.bench_args)
    except ValueError as e:
        p.error(str(e))
    if args.outdir.exists() and any(args.outdir.iterdir()):
        p.error(f"{args.outdir} is not empty")
    if not args.allow_cpu and (reason := no_gpu_reason()):
        print(f"error: {reason}", file=sys.stderr)
        return 2
    from fedlib.config import ConfigError

    try:
        s = slice_(args.minutes, args.outdir, args.profile, args.pages, args.seeds, args.tests, args.bench,
                   args.bench_args, args.max_batch, args.margin_min, args.progress, args.data_bundle,
                   args.test_workers, args.cuda_graphs, args.tests_share)
    except ConfigError as e:
        print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    print(json.dumps({k: s[k] for k in ("results", "archives", "seconds", "rc")}))
    return int(s["rc"])


if __name__ == "__main__":
    from fedlib.cli import entry

    sys.exit(entry(main, "python -m lab.gpu_slice"))

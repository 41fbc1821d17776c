"""The campaign: train every configuration the book's pages need at a profile, in slices, claims first.

``python -m lab.campaign plan --profile paper [--pages 'dpfl_*'] [--seeds N]``
    lists, per page, the configurations its notebook needs (collected from the studies' ``PAGES``,
    not retyped), how many are already in ``data/results/`` and the estimated time of the rest; then,
    per ledger claim (``studies.claim_runs``), in the order ``run`` trains them, what the claim still
    needs and the estimated minutes to settle it, on this machine's device kind (or
    ``--device-kind``), from the committed benchmark of that kind (``data/bench/``).

``python -m lab.campaign run --profile paper --budget-min 25 [--pages ...] [--seeds N]``
    trains the missing ones in the order that settles the most claims per estimated minute (greedy:
    each step trains what settles the most open claims per minute of training; runs that settle no
    claim, such as a frontier's dense grid, come last), configurations of one shape together as run
    batches (:func:`fedlib.run.run_many`: the seeds of a claim's runs train together, which on a GPU
    costs far less than one seed after another), and stops cleanly before the budget ends: a run
    batch that would not finish in time is not started, and one that runs past the deadline
    checkpoints and stops (no result is ever written partially; every finished batch is written at
    once). Rerun it until nothing is missing. Right after training it computes what a page needs
    from the model files, which stay on the machine that trained (the membership audit's losses).

``python -m lab.campaign pack --out DIR`` / ``unpack ARCHIVE...``
    put the result files that git does not track yet (and their audit files) into archives of at
    most 16 MiB each (a GPU machine returns at most 8 files per command), and add them to
    ``data/results/`` after checking every one like input (:func:`check_result`): its config valid
    (:meth:`fedlib.config.Config.validate`), its file name its config's key, its metrics in their
    ranges, its provenance present, no name twice; anything wrong is one clear line and nothing is
    added.

``python -m lab.campaign carry save`` / ``carry restore``
    carry the checkpoints of runs still missing through git (``data/carry/``, :mod:`lab.carry`), so
    that a run longer than a working period resumes on the next period's machine even when it is a
    new one; ``run --carry-over`` restores before training and saves after.

``make paper`` runs one slice (``run --profile paper``); ``bash tools/gpu-slice.sh`` runs a whole
slice on an offline GPU node.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import math
import os
import subprocess
import sys
import tarfile
import time
import zlib
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

from fedlib.cli import OneLineParser
from fedlib.config import Config, ConfigError
from fedlib.engine import PATHS
from fedlib.kernels import arithmetic, set_kernel_options
from fedlib.results import (
    MIN_FREE_BYTES,
    REPO_ROOT,
    Result,
    ResultRefused,
    atomic_write_bytes,
    check_writable,
    checkpoint_dir,
    checkpoint_path,
    is_number,
    result_path,
    result_status,
    results_dir,
    run_seconds,
    verify_result,
)
from fedlib.run import batch_key, run_many
from lab import carry

#: Relative cost of one round per training sample, by model and by algorithm (forward/backward
#: passes per step: MOON and MOON-DPAP run the global and previous models too, Ditto trains two
#: models). Anchored on the benchmark's FedAvg round of the MOON-DPAP CNN. MOON's factor is the CPU
#: benchmark's of 2026-11-26 (a MOON round 1.79x a FedAvg round, in the same run; 2.2 from the one of
#: 2026-11-23); MOON-DPAP's first paper run on this CPU (2026-11-26, `parallel`) took a median 23.5 s
#: a round (18.5 s in its first, faster hour), 1.5-1.9x that benchmark's FedAvg rate at the same
#: number of samples: this machine's speed drifts between hours.
MODEL_COST = {"cnn": 1.0, "mcmahan_cnn": 3.0, "mlp": 0.15}
ALGORITHM_COST = {"moon": 1.8, "moon_dpap": 1.8, "ditto": 2.0, "scaffold": 1.1, "feddyn": 1.1}
#: Record-level DP-SGD (per-sample gradients, Poisson batches) over the same algorithm without it:
#: the median seconds per round of MOON-DPAP's committed quick runs on the 2-core CPU (32.3 s
#: against 3.4 s). A benchmark that measured its device's own (``record_dp_cost``, ``--scale``)
#: overrides it for that device kind (:func:`record_dp_cost`).
RECORD_DP_COST = 9.5
#: The same with ghost clipping (``dp_grad = ghost``, what MOON-DPAP's record-level runs use at
#: ``paper``): one round of MOON-DPAP at the papers' scale (full FashionMNIST, 20 clients, alpha 0.5)
#: on the sequential path, one thread of the 2-core CPU (2026-11-28): 42.1 s with ghost-clipped
#: DP-SGD against 29.6 s without DP, once the CPU paths compute each Poisson batch on its real
#: samples (61.4 s before: the round's widest batch, 54, is 1.7 times the mean, 32). Earlier: 1.7 at
#: 4,000 samples (2026-11-26), 4.4 before the per-sample convolution gradients became one
#: backward-weights kernel. A benchmark run with ``--scale`` records a device's own ``ghost_dp_cost``.
GHOST_DP_COST = 1.4
#: The DP modes whose local steps clip each sample's gradient, and so cost what record-level DP-SGD's do:
#: record-level DP-SGD, and MOON-DPAP's formula in circulation (the same per-sample clip, its noise added
#: once to the update). Its paper runs on the 2-core CPU took 79.1 min each against 56.8 estimated
#: without the factor (1.39x), 79.5 with it.
PER_SAMPLE_CLIP_MODES = ("record", "formula")
PACK_LIMIT = 16 * 2**20


# ---- what is needed, what is there ----------------------------------------------------------------
def select_pages(per_page: dict[str, list[Config]], patterns: list[str] | None) -> dict[str, list[Config]]:
    """The pages whose names match one of ``patterns`` (shell globs, e.g. ``dpfl_*``); all when None.
    A pattern that matches no page is an error (a typo must not silently train nothing)."""
    if not patterns:
        return per_page
    for p in patterns:
        if not any(fnmatch.fnmatch(page, p) for page in per_page):
            raise ConfigError(f"--pages {p!r} matches no page; pages: {', '.join(per_page)}")
    return {page: cs for page, cs in per_page.items() if any(fnmatch.fnmatch(page, p) for p in patterns)}


def needed(profile: str, pages: list[str] | None = None,
           n_seeds: int | None = None) -> dict[str, list[Config]]:
    """Per page, the configurations its notebook needs at ``profile`` (``n_seeds`` seeds instead of
    the profile's own number when given)."""
    from studies import configs

    return select_pages(configs(profile, n_seeds), pages)


def claims_for(profile: str, n_seeds: int | None = None) -> list[tuple[str, str, str, list[Config]]]:
    """Every ledger claim that training settles: (paper, page, claim, the configs that decide it),
    the ``deciding`` ones (:class:`studies.common.Needs`) first."""
    from studies import claim_runs

    found = claim_runs(profile, n_seeds)
    found = sorted(found, key=lambda x: not x[2].deciding)
    return [(paper, page, n.claim, cs) for paper, page, n, cs in found]


def deciding_claims(profile: str, n_seeds: int | None = None) -> set[str]:
    """The ``page: claim`` names of the claims an open issue names as deciding a verdict."""
    from studies import claim_runs

    return {f"{page}: {n.claim}" for _, page, n, _ in claim_runs(profile, n_seeds) if n.deciding}


def missing(per_page: dict[str, list[Config]], root: Path | None = None) -> list[Config]:
    """Distinct configurations without a result under ``root`` that verifies (a file that does not,
    :func:`fedlib.results.result_status`, counts as missing: training sets it aside and redoes it)."""
    out, seen = [], set()
    for cs in per_page.values():
        for c in cs:
            if c.key() not in seen and result_status(c, root) != "present":
                seen.add(c.key())
                out.append(c)
    return out


def tf32_results(per_page: dict[str, list[Config]], root: Path | None = None) -> list[Config]:
    """Distinct configurations whose present result was trained in TF32
    (:func:`fedlib.kernels.arithmetic`): GPU runs from before float32 became fedlib's GPU default.
    A campaign on a GPU retrains them in float32 (:func:`run`: after the deciding steps, before the
    rest), so that no comparison mixes the two arithmetics (issue 64)."""
    out, seen = [], set()
    for cs in per_page.values():
        for c in cs:
            if c.key() in seen:
                continue
            seen.add(c.key())
            if result_status(c, root) == "present" and arithmetic(
                    Result.load(result_path(c, root), expect=c).meta, c.precision) == "TF32":
                out.append(c)
    return out


def invalid(per_page: dict[str, list[Config]], root: Path | None = None) -> list[tuple[Path, str]]:
    """Result files under ``root`` that a page needs but that do not verify, with the reason."""
    out, seen = [], set()
    for cs in per_page.values():
        for c in cs:
            status = result_status(c, root)
            if c.key() not in seen and status.startswith("invalid"):
                seen.add(c.key())
                out.append((result_path(c, root), status.split(": ", 1)[1]))
    return out


def latest_bench(kind: str) -> tuple[dict | None, str]:
    """The results of the latest committed benchmark of ``kind`` ("cuda" or "cpu") and its file
    name, or (None, "") when there is none. Latest by the date that ends the file name
    (``<device>-<YYYY-MM-DD>.json``, :func:`lab.bench.save`), not by the device's name: an H100's
    newer benchmark counts over an H200's older one."""
    from lab.bench import bench_dir

    files = sorted(bench_dir().glob(f"{kind}-*.json"), key=lambda f: (f.stem[-10:], f.name))
    if not files:
        return None, ""
    return json.loads(files[-1].read_text())["results"], files[-1].name


def bench_seconds_per_sample(kind: str) -> tuple[float | None, str]:
    """Seconds per training sample of one FedAvg round of the CNN on the latest committed benchmark
    of ``kind``, and the file it comes from."""
    r, name = latest_bench(kind)
    return (None, "") if r is None else (r["default_s"] / r["samples"], name)


def bench_flop_rate(kind: str) -> float | None:
    """FLOP per second that the latest committed benchmark of ``kind`` measured for one FedAvg round
    on its default path (its training FLOP, :func:`fedlib.flops.per_sample_flops`, over its time);
    None without a benchmark. Older benchmark files lack the rate; it follows from their setting."""
    from fedlib.flops import per_sample_flops

    r, _ = latest_bench(kind)
    if r is None:
        return None
    config = Config(dataset=r["dataset"], model=r["model"], batch_size=r["batch_size"], clients=r["clients"],
                    train_samples=r["samples"])
    return per_sample_flops(config)[0] * r["samples"] / r["default_s"]


def flops_of(configs: list[Config]) -> float:
    """The training FLOP of ``configs`` together (:func:`fedlib.flops.training_flops`)."""
    from fedlib.flops import training_flops

    return sum(training_flops(c) for c in configs)


def record_dp_cost(kind: str, ghost: bool = False) -> float:
    """Record-level DP-SGD's cost factor on ``kind`` (``ghost``: with ghost clipping): what the latest
    committed benchmark of that kind measured (``record_dp_cost`` / ``ghost_dp_cost``), else
    :data:`RECORD_DP_COST` / :data:`GHOST_DP_COST` (measured on the 2-core CPU)."""
    r, _ = latest_bench(kind)
    measured = r.get("ghost_dp_cost" if ghost else "record_dp_cost") if r else None
    return float(measured) if measured else (GHOST_DP_COST if ghost else RECORD_DP_COST)


def estimate_s(config: Config, per_sample: float | None, record_cost: float = RECORD_DP_COST,
               ghost_cost: float = GHOST_DP_COST) -> float:
    """Estimated seconds to train ``config`` (rounds x one epoch over its data x cost factors;
    ``record_cost`` / ``ghost_cost``: record-level DP-SGD's factor on the device per-sample / with
    ghost clipping, :func:`record_dp_cost`)."""
    if per_sample is None:
        return math.nan
    model = MODEL_COST.get(config.model, 1.0)
    algo = ALGORITHM_COST.get(config.algorithm, 1.0) * (
        (ghost_cost if config.dp_grad == "ghost" else record_cost) if config.dp in PER_SAMPLE_CLIP_MODES
        else 1.0)
    epoch = config.n_train * config.client_fraction * config.local_epochs
    return config.rounds_run * epoch * per_sample * model * algo


def device_kind() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


# ---- claims first -----------------------------------------------------------------------------------
Step = tuple[list[str], list[Config]]  # the claims a step settles, and the configs it trains


def order(todo: list[Config], claims: list[tuple[str, list[Config]]],
          cost: Callable[[Config], float], first: set[str] = frozenset()) -> list[Step]:
    """Training steps, most claims settled per unit of cost first (greedy).

    ``claims``: (name, the configs that decide it). A claim is settled when none of its configs is
    left to train. Each step takes the open claim whose remaining configs settle the most open
    claims (itself and every claim whose remaining configs they include) per unit of their cost, and
    trains those configs; the claims named in ``first`` (deciding a verdict an open issue names) are
    taken before any other, in the same greedy order among themselves; configs that settle no claim
    form the last step, longest first."""
    pending = {c.key(): c for c in todo}
    open_ = [(name, {c.key() for c in cs} & pending.keys()) for name, cs in claims]
    open_ = [(name, keys) for name, keys in open_ if keys]
    done: set[str] = set()
    steps: list[Step] = []
    while open_:
        best = None
        urgent = [(n, ks) for n, ks in open_ if n in first]
        for _, keys in (urgent or open_):
            rem = keys - done
            settled = [n for n, ks in open_ if ks - done <= rem]
            c = sum(cost(pending[k]) for k in rem)
            score = (len(settled) / max(c, 1e-12), -c)
            if best is None or score > best[0]:
                best = (score, rem, settled)
        _, rem, settled = best
        steps.append((settled, sorted((pending[k] for k in rem), key=lambda x: x.key())))
        done |= rem
        open_ = [(n, ks) for n, ks in open_ if ks - done]
    rest = [c for k, c in pending.items() if k not in done]
    if rest:
        steps.append(([], sorted(rest, key=lambda c: (-cost(c), c.key()))))
    return steps


def _cost(per_sample: float | None, record_cost: float = RECORD_DP_COST,
          ghost_cost: float = GHOST_DP_COST) -> Callable[[Config], float]:
    """The estimate in seconds; without a benchmark, the same formula in relative units (the order
    only needs ratios)."""
    return lambda c: estimate_s(c, per_sample if per_sample is not None else 1.0, record_cost, ghost_cost)


def claim_plan(profile: str, root: Path | None = None, kind: str | None = None,
               pages: list[str] | None = None, n_seeds: int | None = None) -> list[dict]:
    """Per claim, in the order :func:`run` would settle them: paper, page, claim, configs it needs,
    how many are missing, and the estimated minutes of the training step that settles it (the
    step's whole cost is given on the first claim it settles; the others it settles say ``with``)."""
    kind = kind or device_kind()
    per_sample, _ = bench_seconds_per_sample(kind)
    rc, gc = record_dp_cost(kind), record_dp_cost(kind, ghost=True)
    per_page = needed(profile, pages, n_seeds)
    todo = missing(per_page, root)
    claims = [x for x in claims_for(profile, n_seeds) if x[1] in per_page]
    names = {f"{page}: {claim}": (paper, page, claim, cs) for paper, page, claim, cs in claims}
    rows, listed = [], set()
    steps = order(todo, [(n, v[3]) for n, v in names.items()], _cost(per_sample, rc, gc),
                  deciding_claims(profile, n_seeds))
    for i, (settled, configs) in enumerate(steps):
        minutes = sum(estimate_s(c, per_sample, rc, gc) for c in configs) / 60
        pflop = flops_of(configs) / 1e15
        for j, name in enumerate(settled):
            paper, page, claim, cs = names[name]
            miss = [c for c in cs if result_status(c, root) != "present"]
            rows.append({"step": i + 1, "paper": paper, "page": page, "claim": claim,
                         "needed": len({c.key() for c in cs}), "missing": len({c.key() for c in miss}),
                         "estimate_min": minutes if j == 0 else None, "pflop": pflop if j == 0 else None})
            listed.add(name)
        if not settled:
            rows.append({"step": i + 1, "paper": "", "page": "(no claim: figures only)", "claim": "",
                         "needed": len(configs), "missing": len(configs), "estimate_min": minutes,
                         "pflop": pflop})
    for name, (paper, page, claim, cs) in names.items():
        if name not in listed:
            rows.append({"step": 0, "paper": paper, "page": page, "claim": claim,
                         "needed": len({c.key() for c in cs}), "missing": 0, "estimate_min": 0.0,
                         "pflop": 0.0})
    return rows


def rounds_left(config: Config, root: Path | None = None) -> float:
    """The share of ``config``'s rounds still to train: below 1 when a checkpoint of this config
    (left by a run cut off in an earlier working period on this machine) holds the first rounds, so
    that a short budget still starts the run that only needs its last rounds. An unreadable or
    foreign checkpoint counts as none (the run would start again from round 0)."""
    path = checkpoint_path(config, root)
    if not path.exists():
        return 1.0
    import torch

    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
        if saved.get("config_key") != config.key():
            return 1.0
        return min(1.0, max(0.0, 1.0 - int(saved["next_round"]) / config.rounds_run))
    except Exception:  # noqa: BLE001 - any unreadable checkpoint: as if there were none
        return 1.0


def plan(profile: str, root: Path | None = None, kind: str | None = None,
         pages: list[str] | None = None, n_seeds: int | None = None) -> list[dict]:
    """Per page: configurations needed, present, missing, estimated minutes of the missing ones."""
    kind = kind or device_kind()
    per_sample, source = bench_seconds_per_sample(kind)
    rc, gc = record_dp_cost(kind), record_dp_cost(kind, ghost=True)
    per_page = needed(profile, pages, n_seeds)
    rows = []
    for page, cs in per_page.items():
        todo = missing({page: cs}, root)
        rows.append({"page": page, "needed": len(cs), "present": len(cs) - len(todo), "missing": len(todo),
                     "estimate_min": sum(estimate_s(c, per_sample, rc, gc) for c in todo) / 60})
    where = source or f"no {kind} benchmark committed: make bench there"
    rows.append({"page": f"(estimates from {where})", "needed": 0, "present": 0,
                 "missing": len(missing(per_page, root)), "estimate_min": math.nan})
    return rows


def page_reruns(profile: str = "paper", root: Path | None = None, kind: str | None = None) -> list[dict]:
    """Per page: the command that trains exactly its missing runs at ``profile`` (``run --pages``), how
    many are missing and their estimated minutes, each run counted once for the page, and how many of
    them other pages need too (issue 79: those count in each page's cost, once in the total of
    :func:`plan`'s last row)."""
    kind = kind or device_kind()
    per_sample, _ = bench_seconds_per_sample(kind)
    rc, gc = record_dp_cost(kind), record_dp_cost(kind, ghost=True)
    per_page = needed(profile)
    owners: dict[str, set[str]] = defaultdict(set)
    for page, cs in per_page.items():
        for c in cs:
            owners[c.key()].add(page)
    rows = []
    for page, cs in per_page.items():
        todo = missing({page: cs}, root)
        est = sum(estimate_s(c, per_sample, rc, gc) for c in todo) / 60
        rows.append({"page": page, "missing": len(todo), "estimate_min": est,
                     "shared": sum(len(owners[c.key()]) > 1 for c in todo),
                     "command": (f"python -m lab.campaign run --profile {profile} --pages {page} "
                                 f"--budget-min {max(10, math.ceil(est * 1.2 / 10) * 10)}") if todo else ""})
    return rows


def measured_against_estimate(profile: str, kind: str, root: Path | None = None) -> dict[str, dict]:
    """How the estimates compare with what trained: per algorithm, the results present at
    ``profile`` that trained on ``kind`` (from their provenance), the minutes they record (a run
    batch's time shared among its runs, :func:`run_seconds`) and the minutes :func:`estimate_s` gives
    them on ``kind``'s latest benchmark. Measured on 2026-11-27: on the H200 FedAvg's and MOON-DPAP's
    paper runs took 0.63-0.68 of their estimate (batched in pairs), FDL's 2.2 times it; on the 2-core
    CPU MOON-DPAP took 1.24 times it, FDL 1.7 times and DP-FL's 1,000-client federations 6.3 times
    (the benchmark's round has 20 clients: per-client work that small is overhead)."""
    per_sample, _ = bench_seconds_per_sample(kind)
    rc, gc = record_dp_cost(kind), record_dp_cost(kind, ghost=True)
    seen: dict[str, Config] = {c.key(): c for cs in needed(profile).values() for c in cs}
    out: dict[str, dict] = {}
    for c in seen.values():
        if result_status(c, root) != "present":
            continue
        meta = Result.load(result_path(c, root), expect=c).meta
        if str(meta.get("device", "")).startswith("cuda") != (kind == "cuda"):
            continue
        row = out.setdefault(c.algorithm, {"runs": 0, "measured_min": 0.0, "estimate_min": 0.0})
        row["runs"] += 1
        row["measured_min"] += run_seconds(meta) / 60
        row["estimate_min"] += estimate_s(c, per_sample, rc, gc) / 60
    for row in out.values():
        row["ratio"] = row["measured_min"] / row["estimate_min"] if row["estimate_min"] else math.nan
    return dict(sorted(out.items()))


def total_minutes(per_page: dict[str, list[Config]], kind: str, root: Path | None = None,
                  only_missing: bool = False) -> tuple[float, int]:
    """Estimated minutes to train every distinct configuration of ``per_page`` (:func:`needed`; or
    only the missing ones) on ``kind``'s latest committed benchmark, run by run (run batches are
    faster on a GPU, so this is an upper estimate there), and how many configurations that is."""
    per_sample, _ = bench_seconds_per_sample(kind)
    rc, gc = record_dp_cost(kind), record_dp_cost(kind, ghost=True)
    configs = missing(per_page, root) if only_missing else list(
        {c.key(): c for cs in per_page.values() for c in cs}.values())
    return sum(estimate_s(c, per_sample, rc, gc) for c in configs) / 60, len(configs)


def trained_summary(profile: str = "paper", root: Path | None = None) -> list[dict]:
    """Per study: the distinct configurations its pages need at ``profile``, how many are trained
    (a result that verifies), on which devices (from each result's provenance) and the hours of
    training those results record (:func:`run_seconds`, resumed runs included)."""
    from studies import PAPER_NAMES, page_study

    per_study: dict[str, dict[str, Config]] = defaultdict(dict)
    for page, cs in needed(profile).items():
        for c in cs:
            per_study[page_study(page)][c.key()] = c
    rows = []
    for study, cs in per_study.items():
        devices: dict[str, int] = defaultdict(int)
        hours = 0.0
        for c in cs.values():
            if result_status(c, root) != "present":
                continue
            meta = Result.load(result_path(c, root), expect=c).meta
            devices["GPU" if str(meta.get("device", "")).startswith("cuda") else "CPU"] += 1
            hours += run_seconds(meta) / 3600
        rows.append({"study": PAPER_NAMES[study], "needed": len(cs), "trained": sum(devices.values()),
                     "devices": dict(sorted(devices.items())), "hours": hours})
    return rows


def trained_sentence(rows: list[dict]) -> str:
    """One sentence of :func:`trained_summary` (the README's and the rerun page's)."""
    parts = []
    for r in rows:
        where = " and ".join(f"{n:,} on a {d}" for d, n in r["devices"].items())
        parts.append(f"{r['study']} {r['trained']:,} of {r['needed']:,}" + (f" ({where})" if where else ""))
    total = sum(r["trained"] for r in rows), sum(r["needed"] for r in rows)
    return f"{total[0]:,} of {total[1]:,} configurations trained: " + "; ".join(parts)


def settled_claims(profile: str = "paper", root: Path | None = None) -> list[dict]:
    """Every claim whose runs are all trained at ``profile``: its paper and page, how many runs decide
    it, on which devices, in which arithmetic (:func:`fedlib.kernels.arithmetic`: more than one means
    the claim compares TF32 runs with float32 ones, issue 64), and the hours of training those runs
    record (:func:`run_seconds`, resumed runs included; runs shared with other claims count for each);
    what the rerun page shows."""
    rows = []
    for paper, page, needs, configs in claims_for(profile, None):
        distinct = list({c.key(): c for c in configs}.values())
        if any(result_status(c, root) != "present" for c in distinct):
            continue
        metas = [Result.load(result_path(c, root), expect=c).meta for c in distinct]
        devices = sorted({"GPU" if str(m.get("device", "")).startswith("cuda") else "CPU" for m in metas})
        kinds = sorted({arithmetic(m, c.precision) for m, c in zip(metas, distinct, strict=True)})
        rows.append({"paper": paper, "page": page, "claim": needs, "runs": len(distinct),
                     "devices": devices, "arithmetic": kinds,
                     "hours": sum(run_seconds(m) for m in metas) / 3600})
    return rows


# ---- training in slices -----------------------------------------------------------------------------
def groups(configs: list[Config], per_sample: float | None,
           record_cost: float = RECORD_DP_COST) -> list[list[Config]]:
    """Configurations of one shape together (a run batch), longest group first."""
    by_key: dict[str, list[Config]] = defaultdict(list)
    for c in configs:
        by_key[batch_key(c)].append(c)
    out = [sorted(g, key=lambda c: c.key()) for g in by_key.values()]
    cost = _cost(per_sample, record_cost)
    return sorted(out, key=lambda g: -sum(cost(c) for c in g))


def chunks(group: list[Config], max_batch: int, root: Path | None = None,
           left: dict[str, float] | None = None) -> list[tuple[float, list[Config]]]:
    """Run batches of at most ``max_batch`` runs from one group of :func:`groups`, each with the share
    of its rounds still to train (``left``, by config key, where the caller has read it; else
    :func:`rounds_left`, read once per run): runs resumed from a
    checkpoint first, the furthest along first (they finish soonest), and only runs at the same round
    in one batch (a batch of unequal ages would start all its runs afresh, :func:`fedlib.run.run_many`)."""
    by_left: dict[float, list[Config]] = defaultdict(list)
    for c in group:
        by_left[left[c.key()] if left is not None else rounds_left(c, root)].append(c)
    return [(left, by_left[left][i:i + max_batch]) for left in sorted(by_left)
            for i in range(0, len(by_left[left]), max_batch)]


def after_training_hooks() -> dict[str, Callable]:
    """page -> what to compute from a freshly trained result of that page (``AFTER_TRAINING``)."""
    from studies.dpfl.pages import AFTER_TRAINING

    return dict(AFTER_TRAINING)


#: With ``carry_over``, a run batch that will not finish within the budget starts only if the budget
#: leaves it at least this many of its rounds (estimated) before the deadline.
CARRY_OVER_MIN_ROUNDS = 2


def run(profile: str, budget_min: float, root: Path | None = None, engine: str = "auto",
        max_batch: int = 8, progress: bool = True, pages: list[str] | None = None,
        n_seeds: int | None = None, steps: int | None = None, carry_over: bool = False) -> dict:
    """Train missing configurations, claims first, until done or until the budget would be exceeded;
    ``steps``: only the first ``steps`` steps of the claims-first order as it stands now (what ``plan``
    lists as steps 1..steps; steps already trained have left the list).

    A run batch starts only if its estimate fits in what is left of the budget, and the next batches
    that fit are tried instead (right where checkpoints do not outlive the machine: a lent GPU). With
    ``carry_over`` (checkpoints kept in the machine's folder, :func:`fedlib.results.checkpoint_dir`, or
    carried through git to a new one, :mod:`lab.carry`), the next batch in claims-first order starts
    whenever at least :data:`CARRY_OVER_MIN_ROUNDS` of its
    rounds fit: at the deadline it checkpoints after the round it is in, and the next ``run`` resumes
    it, so a run longer than any one budget is trained across several.

    On a GPU, the results a page needs that were trained in TF32 (:func:`tf32_results`) are trained
    again in float32, replacing them (a few runs, minutes; the TF32 ones stay in git's history): after
    the steps that decide a verdict an open issue names, before any other step."""
    if steps is not None and steps < 1:
        raise ConfigError(f"--steps must be >= 1, got {steps}")
    start = time.time()
    deadline = start + 60 * budget_min
    root = Path(root or results_dir())
    per_sample, _ = bench_seconds_per_sample(device_kind())
    rc, gc = record_dp_cost(device_kind()), record_dp_cost(device_kind(), ghost=True)
    per_page = needed(profile, pages, n_seeds)
    todo = missing(per_page, root)
    claims = [(f"{page}: {claim}", cs) for _, page, claim, cs in claims_for(profile, n_seeds)
              if page in per_page]
    left_at_start = {c.key(): rounds_left(c, root) for c in todo}  # each checkpoint read once
    resumable = sum(share < 1 for share in left_at_start.values())
    if progress:
        print(checkpoint_line(resumable, len(todo), checkpoint_dir(root), carry_over), file=sys.stderr)
    hooks = after_training_hooks()
    pages_of: dict[str, list[str]] = defaultdict(list)
    for page, cs in per_page.items():
        for c in cs:
            pages_of[c.key()].append(page)
    done, skipped, settled = 0, 0, 0
    retrain = tf32_results(per_page, root) if device_kind() != "cpu" else []
    retrained = 0

    def train_tf32_again() -> int:  # float32 again where a result was trained in TF32 (issue 64)
        n = 0
        for group in groups(retrain, per_sample, rc):
            for chunk in (group[i:i + max_batch] for i in range(0, len(group), max_batch)):
                est = sum(estimate_s(c, per_sample, rc, gc) for c in chunk)
                if math.isfinite(est) and est > deadline - time.time():
                    continue
                finished = run_many(chunk, engine=engine, root=root, progress=progress, deadline=deadline,
                                    locked="skip", force=True)
                n += sum(r is not None for r in finished)
        retrain.clear()
        return n

    deciding = deciding_claims(profile, n_seeds)
    for claim_names, configs in order(todo, claims, _cost(per_sample, rc, gc), deciding)[:steps]:
        if retrain and not set(claim_names) & deciding:  # after the deciding runs, before the rest
            retrained += train_tf32_again()
        complete = True
        for group in groups(configs, per_sample, rc):
            for share_left, chunk in chunks(group, max_batch, root, left_at_start):
                est = share_left * sum(estimate_s(c, per_sample, rc, gc) for c in chunk)
                time_left = deadline - time.time()
                if carry_over:  # only what must fit: a few rounds, the rest carries over
                    est = min(est, CARRY_OVER_MIN_ROUNDS * sum(
                        estimate_s(c, per_sample, rc, gc) / c.rounds_run for c in chunk))
                if time_left <= 0 or (math.isfinite(est) and est > time_left):
                    skipped += len(chunk)
                    complete = False
                    continue
                finished = run_many(chunk, engine=engine, root=root, progress=progress, deadline=deadline,
                                    locked="skip")  # a run another slice trains is left to it
                for r in finished:
                    if r is None:
                        continue
                    for page in pages_of[r.config.key()]:
                        if page in hooks:
                            hooks[page](r, root)
                done += sum(r is not None for r in finished)
                skipped += sum(r is None for r in finished)
                complete &= all(r is not None for r in finished)
        settled += len(claim_names) if complete else 0
    if retrain:
        retrained += train_tf32_again()
    left = len(missing(per_page, root))
    return {"trained": done, "not started or stopped": skipped, "still missing": left,
            "claims settled": settled, "resumable at start": resumable,
            "retrained in float32": retrained, "minutes": (time.time() - start) / 60}


def checkpoint_line(resumable: int, missing_runs: int, folder: Path, carry_over: bool) -> str:
    """One line at the start of ``run``: how many missing runs resume from a checkpoint in ``folder``.
    None while ``carry_over`` is on is the sign of a machine that did not keep its cache folder since
    the last working period (a fresh cloud or CI machine): what a run leaves at the deadline is lost
    there, and a budget without ``--carry-over`` only starts runs that finish."""
    line = f"campaign: {resumable} of {missing_runs} missing runs resume from checkpoints in {folder}"
    if carry_over and resumable == 0:
        line += ("; none found (a new machine resumes from the checkpoints a working period carried "
                 "into data/carry/: `campaign carry save`, then commit them)")
    return line


# ---- moving results between machines ----------------------------------------------------------------
def _untracked(paths: list[str]) -> list[Path]:
    try:
        out = subprocess.run(["git", "ls-files", "--others", "--exclude-standard", "--", *paths],
                             cwd=REPO_ROOT, capture_output=True, text=True, check=True).stdout.split()
        return [REPO_ROOT / p for p in out]
    except (OSError, subprocess.CalledProcessError):
        return [f for p in paths for f in Path(p).glob("*.json")]


def untracked_results(root: Path | None = None) -> list[Path]:
    """Result files under ``root`` (and their audit files under ``root/audits``) that git does not
    track yet: what a slice produced."""
    root = Path(root or results_dir()).resolve()
    files = _untracked([str(root)])
    keep = [p for p in files if p.suffix == ".json" and p.resolve().parent in (root, root / "audits")]
    return sorted(keep)


def _arcname(f: Path) -> str:
    return f"audits/{f.name}" if f.parent.name == "audits" else f.name


def pack(files: list[Path], out_dir: Path, limit: int = PACK_LIMIT) -> list[Path]:
    """Tar-gzip ``files`` into archives of at most ``limit`` bytes each (result JSON compresses ~10x).
    All or nothing: the folder is checked for room first, each archive is written to a temporary file
    and renamed, and a failure removes the archives this call wrote (no empty or partial archive)."""
    check_writable([out_dir], need_bytes=sum(f.stat().st_size for f in files) // 4 + MIN_FREE_BYTES)
    archives: list[Path] = []
    try:
        return _pack(files, out_dir, limit, archives)
    except BaseException:
        for a in archives:
            a.unlink(missing_ok=True)
        raise


def _pack(files: list[Path], out_dir: Path, limit: int, archives: list[Path]) -> list[Path]:
    part, size = [], 0
    for f in files:
        n = f.stat().st_size // 8 + 1024  # compressed size, conservatively
        if part and size + n > limit:
            archives.append(_write(part, out_dir, len(archives)))
            part, size = [], 0
        part.append(f)
        size += n
    if part:
        archives.append(_write(part, out_dir, len(archives)))
    return archives


def _write(files: list[Path], out_dir: Path, i: int) -> Path:
    import io

    path = out_dir / f"results-{i:02d}.tgz"
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for f in files:
            tar.add(f, arcname=_arcname(f))
    atomic_write_bytes(path, buffer.getvalue())  # a failure leaves no archive behind
    return path


class InvalidResult(ValueError):
    """An incoming result or archive that is refused (one line says why)."""


def check_result(name: str, data: bytes) -> Result:
    """A result file as received, checked like input by :func:`fedlib.results.verify_result` (the
    results cache's own check): anything it refuses is an :class:`InvalidResult` naming the file."""
    try:
        config, history, meta = verify_result(data, name)
    except ResultRefused as e:
        raise InvalidResult(f"{name}: {e}") from None
    return Result(config, history, meta)


def check_audit(name: str, data: bytes) -> dict:
    """A membership-audit file as received: two lists of finite, non-negative losses."""
    try:
        d = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise InvalidResult(f"{name}: not JSON ({e})") from None
    if not isinstance(d, dict) or set(d) != {"members", "nonmembers"}:
        raise InvalidResult(f"{name}: not an audit file (members and nonmembers)")
    for k, v in d.items():
        if not isinstance(v, list) or not v or not all(
                is_number(x) and math.isfinite(x) and x >= 0 for x in v):
            raise InvalidResult(f"{name}: {k} is not a list of finite, non-negative losses")
    return d


def _read_archive(a: Path) -> list[tuple[str, bytes]]:
    if not a.is_file():
        raise InvalidResult(f"{a}: no such archive")
    try:
        with tarfile.open(a, "r:gz") as tar:
            out = []
            for m in tar.getmembers():
                parts = m.name.split("/")
                ok_name = (len(parts) == 1 or (len(parts) == 2 and parts[0] == "audits")) and \
                    m.name.endswith(".json") and ".." not in parts and not m.name.startswith("/")
                if not m.isfile() or not ok_name:
                    raise InvalidResult(f"{a.name}: unexpected member {m.name!r}")
                out.append((m.name, tar.extractfile(m).read()))
            return out
    except (tarfile.TarError, OSError, EOFError, zlib.error) as e:
        raise InvalidResult(f"{a.name}: not a gzipped tar archive ({e})") from None


def unpack(archives: list[Path], root: Path | None = None) -> dict[str, list[str]]:
    """Add the result (and audit) files of ``archives`` to ``root`` after checking each
    (:func:`check_result`, :func:`check_audit`); every file is checked before any is written, and a
    name that comes twice, or that is already there with other content, is refused."""
    root = Path(root or results_dir())
    members: dict[str, bytes] = {}
    for a in archives:
        for name, data in _read_archive(a):
            if name in members:
                raise InvalidResult(f"{a.name}: {name} comes twice in the archives")
            members[name] = data
    results = {n: check_result(n, data) for n, data in members.items() if "/" not in n}
    for n, data in members.items():
        if "/" in n:
            check_audit(n, data)
            base = n.split("/", 1)[1]
            if base not in results and not (root / base).exists():
                raise InvalidResult(f"{n}: no result {base} in the archives or in {root}")
    added, present = [], []
    for name, data in members.items():
        target = root / name
        if target.exists():
            old = target.read_bytes()
            if old != data and json.loads(old) != json.loads(data):
                raise InvalidResult(f"{name}: {target} exists with other content (nothing was added)")
            present.append(name)
    new = {name: data for name, data in members.items() if name not in present}
    folders = sorted({(root / name).parent for name in new} | {root})
    check_writable(folders, need_bytes=2 * sum(len(d) for d in new.values()) + MIN_FREE_BYTES)
    # all or nothing: every file is staged beside its target first, then the staged files are renamed
    # into place; a failure removes what this call staged or added, and the folder is as it was
    staged: dict[str, Path] = {}
    try:
        for name, data in new.items():
            tmp = (root / name).with_name(f".{Path(name).name}.unpack.tmp")
            atomic_write_bytes(tmp, data)  # the bytes as checked
            staged[name] = tmp
        for name, tmp in staged.items():
            os.replace(tmp, root / name)
            added.append(name)
    except BaseException:
        for tmp in staged.values():
            tmp.unlink(missing_ok=True)
        for name in added:
            (root / name).unlink(missing_ok=True)
        raise
    return {"added": added, "already present": present}


# ---- the command line ---------------------------------------------------------------------------------
def _print_plan(args) -> None:
    rows = plan(args.profile, kind=args.device_kind, pages=args.pages, n_seeds=args.seeds)
    width = max(len(r["page"]) for r in rows)
    print(f"{'page':<{width}}  needed  present  missing  estimate (min)")
    for row in rows:
        est = "-" if math.isnan(row["estimate_min"]) else f"{row['estimate_min']:.1f}"
        counts = f"{row['needed']:6d}  {row['present']:7d}  {row['missing']:7d}"
        print(f"{row['page']:<{width}}  {counts}  {est}")
    kind = args.device_kind or device_kind()
    claims = claim_plan(args.profile, kind=kind, pages=args.pages, n_seeds=args.seeds)
    open_ = [r for r in claims if r["step"] > 0]
    print(f"\nclaims, in training order ({kind}; a step's estimate and FLOP cover every claim it settles):")
    print(f"{'step':>4}  {'page':<20} {'missing':>7}  {'min':>7}  {'PFLOP':>7}  claim")
    for r in open_:
        est = "with the above" if r["estimate_min"] is None else (
            "-" if math.isnan(r["estimate_min"]) else f"{r['estimate_min']:.1f}")
        pflop = "" if r["pflop"] is None else f"{r['pflop']:.3f}"
        claim = r["claim"] if len(r["claim"]) <= 70 else r["claim"][:67] + "..."
        print(f"{r['step']:>4}  {r['page']:<20} {r['missing']:>7}  {est:>7}  {pflop:>7}  {claim}")
    settled, total = sum(1 for r in claims if r["step"] == 0), sum(1 for r in claims if r["claim"])
    print(f"claims already settled by the results present: {settled} of {total}")
    if not args.pages and args.seeds is None:
        print(trained_sentence(trained_summary(args.profile)))
    per_page = needed(args.profile, args.pages, args.seeds)
    bad = invalid(per_page)
    for path, reason in bad:
        print(f"invalid (counted as missing; training sets it aside): {path.name}: {reason}")
    distinct = missing(per_page)
    print(f"missing configurations (distinct, all pages): {len(distinct)}")
    tf32 = tf32_results(per_page)
    if tf32:
        print(f"trained in TF32, to train again in float32 on a GPU after the deciding steps (issue 64): "
              f"{len(tf32)} ({', '.join(sorted(c.key() for c in tf32))})")
    shapes = groups(distinct, None)
    if shapes:
        print(f"run batches by step shape across pages and seeds: {len(shapes)} (the largest holds "
              f"{max(map(len, shapes))} runs; a run batch trains its runs' clients together)")
    rate = bench_flop_rate(kind)
    if not args.pages:
        for only, what in ((False, "the whole campaign"), (True, "what is missing")):
            minutes, n = total_minutes(per_page, kind, only_missing=only)
            print(f"estimate for {what} ({n} configurations, run by run, {kind}): {minutes:,.0f} min")
            pflop = flops_of(distinct if only else list({c.key(): c for cs in per_page.values()
                                                        for c in cs}.values())) / 1e15
            at_rate = (f"; {pflop * 1e15 / rate / 60:,.0f} min at the benchmark's {rate / 1e9:,.1f} GFLOP/s "
                       "(a FedAvg CNN round)" if rate else "")
            print(f"FLOP for {what}: {pflop:,.1f} PFLOP{at_rate}")
        measured = measured_against_estimate(args.profile, kind)
        if measured:
            rows = "; ".join(f"{a} {r['runs']} runs, {r['measured_min']:,.1f} min against "
                             f"{r['estimate_min']:,.1f} ({r['ratio']:.2f}x)" for a, r in measured.items())
            print(f"measured against the estimate (results at {args.profile} trained on a {kind}): {rows}")


def yield_to_foreground(autogroup: Path = Path("/proc/self/autogroup")) -> int | None:
    """Carry this process's niceness (``nice -n 19``) over to its scheduling group. With Linux's
    autogroups (on by default), CPU time is shared between sessions first and niceness only ranks
    the processes of one session, so a background campaign started with ``nohup nice`` took as much
    CPU as the foreground work beside it (measured: half of each core against a mutation run at
    nice 0). Writing the niceness to ``/proc/self/autogroup`` makes the whole session yield. Returns
    the niceness written, or None where there is nothing to do (not niced, or no autogroups)."""
    niceness = os.nice(0)
    if niceness <= 0 or not autogroup.exists():
        return None
    try:
        autogroup.write_text(str(niceness))
    except OSError:  # not permitted here: the plain nice still applies within the session
        return None
    return niceness


def _counts(report: dict[str, list[str]]) -> str:
    return ", ".join(f"{len(v)} {k}" for k, v in report.items()) + "".join(
        f"\n  refused: {line}" for line in report.get("refused", []))


def main(argv: list[str] | None = None) -> int:
    p = OneLineParser(prog="python -m lab.campaign",
                                description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    pl = sub.add_parser("plan", help="what each page and claim needs at a profile, its estimated time")
    r = sub.add_parser("run", help="train what is missing within a time budget, claims first")
    for q in (pl, r):
        q.add_argument("--profile", default="paper", choices=["smoke", "quick", "paper"])
        q.add_argument("--pages", nargs="+", metavar="PATTERN", help="only these pages (globs: 'dpfl_*')")
        q.add_argument("--seeds", type=int, default=None, help="seeds per run (default: the profile's)")
    pl.add_argument("--device-kind", choices=["cpu", "cuda"], default=None)
    r.add_argument("--budget-min", type=float, required=True)
    r.add_argument("--engine", default="auto", choices=["auto", *PATHS])
    r.add_argument("--max-batch", type=int, default=8, help="runs trained together at most")
    r.add_argument("--steps", type=int, default=None,
                   help="only the first N steps of the claims-first order (plan lists them)")
    r.add_argument("--carry-over", action="store_true",
                   help="start runs that will not finish within the budget (they checkpoint at its end, are "
                        "carried into data/carry/, and the next run resumes them, on this machine or on a "
                        "new one once data/carry/ is committed); without it only runs estimated to finish "
                        "start, as a lent GPU needs")
    r.add_argument("--cuda-graphs", action=argparse.BooleanOptionalAction, default=True,
                   help="on a GPU, replay the vectorized step as a CUDA graph (fedlib.graphs; default on)")
    pk = sub.add_parser("pack", help="archive the result files git does not track yet")
    pk.add_argument("--out", type=Path, required=True)
    up = sub.add_parser("unpack", help="check and add result archives to data/results")
    up.add_argument("archives", nargs="+", type=Path)
    ca = sub.add_parser("carry", help="carry checkpoints of unfinished runs through git (data/carry/)")
    ca.add_argument("action", choices=["save", "restore"],
                    help="save: checkpoint folder -> data/carry/ (commit it); restore: data/carry/ -> "
                         "checkpoint folder (run --carry-over does both)")
    args = p.parse_args(argv)

    try:
        if args.command in ("plan", "run") and args.seeds is not None and args.seeds < 1:
            p.error("--seeds must be >= 1")
        if args.command == "plan":
            _print_plan(args)
            return 0
        if args.command == "run":
            if not args.budget_min > 0:
                p.error("--budget-min must be > 0")
            if args.max_batch < 1:
                p.error("--max-batch must be >= 1")
            set_kernel_options(cuda_graphs=args.cuda_graphs)
            yield_to_foreground()
            if args.carry_over:  # a new machine resumes what the last working period carried
                print(f"carry restore: {_counts(carry.restore())}", file=sys.stderr)
            report = run(args.profile, args.budget_min, engine=args.engine, max_batch=args.max_batch,
                         pages=args.pages, n_seeds=args.seeds, steps=args.steps, carry_over=args.carry_over)
            if args.carry_over:
                print(f"carry save: {_counts(carry.save())} (commit data/carry/)", file=sys.stderr)
            print(json.dumps(report))
            return 0
        if args.command == "carry":
            report = carry.save() if args.action == "save" else carry.restore()
            print(json.dumps(report, indent=1))
            return 1 if report["refused"] else 0
        if args.command == "pack":
            files = untracked_results()
            archives = pack(files, args.out)
            print(json.dumps({"files": len(files), "archives": [str(a) for a in archives]}))
            return 0
        report = unpack(args.archives)
    except InvalidResult as e:
        print(f"error: {e} (nothing was added)", file=sys.stderr)
        return 1
    except ConfigError as e:
        print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    print(json.dumps({k: len(v) for k, v in report.items()}))
    return 0


if __name__ == "__main__":
    from fedlib.cli import entry

    sys.exit(entry(main, "python -m lab.campaign"))


__all__ = ["check_audit", "check_result", "claim_plan", "groups", "missing", "needed", "order", "pack",
           "plan", "run", "unpack"]

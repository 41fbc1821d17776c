"""Engine benchmark: ``python -m lab.bench [--json]`` (also ``make bench``).

Measures, in one process and on one setting (dataset, model, clients, samples, batch):

* ``floor_s``: one centralized epoch over the same samples with the same model and batch
  size, a plain PyTorch loop (``nn.Module`` + ``torch.optim.SGD``): the no-federation floor
  (like the rounds, the median of several epochs after a warm-up);
* on a CPU, what the cores can give, measured rather than assumed: ``floor_1thread_s``
  (the floor on one thread; ``thread_scaling = floor_1thread_s / floor_s``) and
  ``plain_parallel_s``, the same plain loop split over one single-thread process per core,
  each training its share of the samples at the same time (``plain_parallel_vs_floor``):
  the limit of the engine's parallel path, which does the same plus the federation;
* on a CPU, ``engine_vs_plain_parallel``: the parallel path's round over the plain parallel loop's
  epoch, the median ratio of several pairs timed alternately in one run (:func:`engine_vs_plain_parallel`,
  ``--engine-floor`` times only this), so that host noise cannot pass for the engine's cost;
* ``sequential_s``, ``parallel_s``, ``vectorized_s``: one FedAvg round (local training of
  every client for one epoch, and aggregation) on each engine path, the median of several
  rounds after a warm-up; evaluation is timed separately (``eval_s``);
* ``default_s``: the path the engine picks by itself on this device;
* ``operators_per_step``: ATen operators (views excluded) one vectorized step dispatches, per algorithm
  family, at 2 and 16 lanes and in a run batch of 4 runs (:func:`step_operators`; constant when the
  step is);
* ``default_gflops``: that round's training FLOP (counted, :mod:`fedlib.flops`) over its time, and
  ``default_percent_of_peak``, its share of ``matmul_peak_gflops``, the device's matrix-multiply
  rate measured in the same run (:func:`matmul_peak_flops`), at its start and again after the
  paths are timed (``matmul_peak_gflops_measured``; the highest is the peak: a CPU's rate can
  drift by a third between hours, and a lower one would flatter the percentage); on a CPU the
  candidates include the cores' count times one thread's rate (measured at the start: two cores
  multiplying apart can outrun one product on two threads), and also
  ``plain_parallel_percent_of_peak``, the same share for the plain loop split over the cores
  (:func:`percent_of_peak`): the rate PyTorch's own kernels reach on this model without federation,
  the ceiling of the parallel path short of faster convolution kernels; and
  ``floor_1thread_percent_of_peak``, the plain loop on one thread against one thread's matmul rate
  (``matmul_peak_1thread_gflops``): the training step's own efficiency, without the cores' sharing.
  These shares depend on the host's processor, which the saved provenance names (``cpu``): a
  core with wider multiply-add units raises the matmul peak more than it speeds up small
  convolutions;
* ratios ``overhead_sequential = sequential_s / floor_s``,
  ``speedup_vectorized = sequential_s / vectorized_s``, ``default_vs_floor = default_s / floor_s``;
* round times of MOON, SCAFFOLD and MOON-DPAP with every component and client-level DP on
  (``moon_dpap_dp_s``; ``moon_dpap_dp_vs_fedavg`` is its ratio to a FedAvg round);
* ``server_noise``: the host's seconds per round of MOON-DPAP's exact discrete Gaussian, on one
  thread and drawn ahead by the worker processes and, for comparison, threads (:func:`server_noise`);
* ``floor_bf16_s``, ``default_bf16_s``: the same with ``precision="bfloat16"`` (forward
  pass under autocast; different numbers, so an option, not the default), and
  ``default_bf16_vs_floor = default_bf16_s / floor_s``;
* with ``--scale``: ``moon_dpap_s`` and ``moon_dpap_record_s``, MOON-DPAP rounds without DP and
  with record-level DP-SGD (per-sample gradients, Poisson batches, noise at every step), and their
  ratio ``record_dp_cost``, which the campaign's estimates for record-level runs use, and the same
  with ghost clipping (``moon_dpap_ghost_s``, ``ghost_dp_cost``); ``--record-cost`` times only these
  three rounds (:func:`record_costs`);
* ``moon_dpap_state_mb_1000``: the client state kept across rounds for 1000 clients of
  MOON-DPAP (each client's previous model), stacked as the engine stores it;
* ``run_batch_runs_per_s``: run-rounds per second when ``R`` runs (seeds) are trained as one
  run batch, for each ``R`` of ``--batch-runs`` (1, 3, 8), on the default path;
* with ``--scale`` (the default on a GPU): ``round_s_100_clients`` and ``round_s_1000_clients``
  (FedAvg, same total data, default path) and the papers' setting extrapolated from timed
  rounds: ``paper_fedavg_run_s`` (200 rounds, full FashionMNIST, 20 clients, batch 32, one
  evaluation per round), ``paper_fedavg_run_s_batched3`` (per run, three seeds batched) and
  ``paper_moon_dpap_dp_run_s`` (every component and client-level DP) and
  ``paper_moon_dpap_dp_run_s_batched3`` (per run, three seeds batched: three runs' server noise);
* on a GPU, ``kernels``: the CUDA kernel settings it ran with (:mod:`fedlib.kernels`; the
  speed options ``--matmul-tf32``, ``--cudnn-tf32``, ``--cudnn-autotune``, ``--cuda-graphs`` change
  them);
* :func:`clients_sweep`: round time against the number of clients at a fixed total of data,
  per engine path (the book's benchmark page plots it);
* alone, with ``--kernel-profile``: where a round's time goes, operator by operator (and, on a GPU,
  kernel by kernel), from ``torch.profiler`` (:func:`kernel_profile`; saved under
  ``data/bench/profile/``), and with ``--options-sweep`` the speed options against the defaults
  (:func:`options_sweep`).

With ``--json`` the last line is one JSON object with these keys; ``--save`` also writes it,
with provenance (device, commit, versions), to ``data/bench/<device>-<date>.json``, which the
book's benchmark page reads.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import os
import resource
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F

from fedlib.cli import OneLineParser
from fedlib.config import Config
from fedlib.engine import Executor, cpu_workers, default_path, worker_start_method
from fedlib.experiment import Experiment, RunBatch, evaluate
from fedlib.kernels import device_options, kernel_settings, prepare_host_memory, set_kernel_options
from fedlib.models import build_model
from fedlib.results import REPO_ROOT, atomic_write_bytes, provenance
from fedlib.run import pick_device
from fedlib.tree import leaves

#: Other algorithms whose round time the benchmark reports: name -> config changes.
OTHER_ALGORITHMS = {
    "moon": dict(algorithm="moon"),
    "scaffold": dict(algorithm="scaffold"),
    "moon_dpap_dp": dict(algorithm="moon_dpap", cosine_lr=True, lr_min=0.0005, dropout=0.2, prune=True,
                         prune_t_max=0.005, moon_tau=0.5, tau_min=0.1, mu_max=0.05, dp="central",
                         dp_epsilon_per_round=1.0, dp_clip=0.5, dp_delta=1e-5),
}


@contextlib.contextmanager
def _threads(n: int | None):
    """Run the block on ``n`` intra-op threads (None: leave PyTorch's setting), restoring it after."""
    before = torch.get_num_threads()
    if n is not None:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _plain_epoch(model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor,
                 batch_size: int, g: torch.Generator, precision: str = "float32") -> None:
    """One epoch of the plain PyTorch loop: shuffle, then minibatch SGD steps (the forward
    pass under bfloat16 autocast when ``precision`` says so, as the engine does)."""
    perm = torch.randperm(len(y), generator=g).to(x.device)
    bf16 = precision == "bfloat16"
    for i in range(0, len(y), batch_size):
        ids = perm[i:i + batch_size]
        opt.zero_grad(set_to_none=True)
        with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=bf16):
            logits = model(x[ids])
        F.cross_entropy(logits.float(), y[ids]).backward()
        opt.step()


def _plain_learner(config: Config, device: torch.device) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = build_model(config.model).to(device)
    return model, torch.optim.SGD(model.parameters(), lr=config.lr, momentum=config.momentum)


def path_ratios(out: dict) -> dict:
    """``overhead_sequential`` and ``speedup_vectorized`` from the timed paths; None for a ratio whose
    path was not timed (``--paths vectorized`` leaves the sequential one out)."""
    seq, vec = out.get("sequential_s"), out.get("vectorized_s")
    return {"overhead_sequential": seq / out["floor_s"] if seq else None,
            "speedup_vectorized": seq / vec if seq and vec else None}


def time_floor(config: Config, device: torch.device, repeats: int = 3, threads: int | None = None) -> float:
    """Seconds for one plain-PyTorch epoch over the same samples, the median of ``repeats``
    epochs after a warm-up one (the same statistic as the rounds), on ``threads`` intra-op
    threads (default: PyTorch's own setting)."""
    exp = Experiment(config, device)
    x, y = exp.data.x_train, exp.data.y_train
    model, opt = _plain_learner(config, device)
    g = torch.Generator().manual_seed(0)
    times = []
    with _threads(threads):
        for i in range(1 + repeats):
            _sync(device)
            t0 = time.perf_counter()
            _plain_epoch(model, opt, x, y, config.batch_size, g, config.precision)
            _sync(device)
            if i > 0:
                times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _plain_worker(rank: int, config: Config, x: torch.Tensor, y: torch.Tensor, start, done) -> None:
    torch.set_num_threads(1)
    model, opt = _plain_learner(config, x.device)
    g = torch.Generator().manual_seed(rank)
    _plain_epoch(model, opt, x, y, config.batch_size, g)  # warm-up, before the clock starts
    start.wait()
    _plain_epoch(model, opt, x, y, config.batch_size, g)
    done.put(rank)


def time_plain_parallel(config: Config, workers: int, repeats: int = 3) -> float:
    """Seconds for the plain loop split over ``workers`` single-thread processes, each one
    epoch over its share of the samples, all at the same time (median of ``repeats``, each
    after a warm-up epoch in every worker).

    The wall time from a common start to the last worker's end: no federation, no
    communication, no aggregation, the most the engine's parallel path could reach.
    """
    exp = Experiment(config, torch.device("cpu"))
    x, y = exp.data.x_train, exp.data.y_train
    ctx = mp.get_context(worker_start_method())
    times = []
    for _ in range(repeats):
        start, done = ctx.Barrier(workers + 1), ctx.Queue()
        procs = [ctx.Process(target=_plain_worker, daemon=True,
                             args=(r, config, x[r::workers].clone(), y[r::workers].clone(), start, done))
                 for r in range(workers)]
        for p in procs:
            p.start()
        try:
            start.wait(timeout=600)
            t0 = time.perf_counter()
            for _ in procs:
                done.get(timeout=600)
            times.append(time.perf_counter() - t0)
        finally:
            for p in procs:
                p.join(timeout=5)
                if p.is_alive():
                    p.kill()
    return statistics.median(times)


def _plain_server(conn, config: Config, x: torch.Tensor, y: torch.Tensor, rank: int) -> None:
    """A plain-loop worker that stays: one epoch over its share each time it is asked, then it answers."""
    torch.set_num_threads(1)
    model, opt = _plain_learner(config, x.device)
    g = torch.Generator().manual_seed(rank)
    while conn.recv() is not None:
        _plain_epoch(model, opt, x, y, config.batch_size, g)
        conn.send(rank)


class PlainParallel:
    """The plain loop split over ``workers`` single-thread processes that stay between epochs (as the
    engine's parallel workers stay between rounds), so that its epochs can alternate with the engine's
    rounds in one run: :func:`engine_vs_plain_parallel`."""

    def __init__(self, config: Config, x: torch.Tensor, y: torch.Tensor, workers: int):
        ctx = mp.get_context(worker_start_method())
        self.conns, self.procs = [], []
        for r in range(workers):
            parent, child = ctx.Pipe()
            p = ctx.Process(target=_plain_server, daemon=True,
                            args=(child, config, x[r::workers].clone(), y[r::workers].clone(), r))
            p.start()
            self.conns.append(parent)
            self.procs.append(p)

    def epoch(self) -> float:
        """Seconds from a common start to the last worker's end of one epoch over its share."""
        t0 = time.perf_counter()
        for c in self.conns:
            c.send(True)
        for c in self.conns:
            c.recv()
        return time.perf_counter() - t0

    def close(self) -> None:
        for c in self.conns:
            c.send(None)
        for p in self.procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()


def engine_vs_plain_parallel(config: Config, repeats: int = 7) -> dict:
    """The engine's parallel round against the plain loop split over the same cores, in one run:
    ``repeats`` pairs, a round and an epoch alternating (after one of each as warm-up), so that a host
    slowing down or speeding up weighs on both alike; each pair gives a ratio and the median ratio is
    the figure (``engine_vs_plain_parallel``; issue 75 asks for at most 1.1). The round is a whole
    round (the plan, every client's training, the hand-offs, the aggregation) without the evaluation,
    which is timed apart (``eval_s``); the epoch trains the same samples with no federation."""
    exp = Experiment(config, torch.device("cpu"))
    workers = cpu_workers()
    plain = PlainParallel(config, exp.data.x_train, exp.data.y_train, workers)
    rounds, epochs = [], []
    try:
        with Executor("parallel", exp.algo, exp.data.x_train, exp.data.y_train, workers=workers) as ex:
            for t in range(repeats + 1):
                t0 = time.perf_counter()
                exp.round(t, ex)
                r = time.perf_counter() - t0
                e = plain.epoch()
                if t > 0:
                    rounds.append(r)
                    epochs.append(e)
    finally:
        plain.close()
    ratios = [r / e for r, e in zip(rounds, epochs, strict=True)]
    return {"engine_parallel_round_s": statistics.median(rounds),
            "plain_parallel_epoch_s": statistics.median(epochs),
            "engine_vs_plain_parallel": statistics.median(ratios),
            "engine_vs_plain_parallel_each": [round(x, 4) for x in ratios],
            "engine_vs_plain_parallel_workers": workers}


def _median_round(round_fn, device: torch.device, rounds: int, warmup: int) -> float:
    """Median seconds of ``round_fn(t)`` over ``rounds`` rounds after ``warmup`` untimed ones."""
    times = []
    for t in range(warmup + rounds):
        _sync(device)
        t0 = time.perf_counter()
        round_fn(t)
        _sync(device)
        if t >= warmup:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def time_rounds(config: Config, device: torch.device, path: str, rounds: int = 3,
                warmup: int = 1) -> tuple[float, float]:
    """Median seconds per round on ``path`` and seconds of one evaluation."""
    exp = Experiment(config, device)
    with Executor(path, exp.algo, exp.data.x_train, exp.data.y_train) as ex:
        per_round = _median_round(lambda t: exp.round(t, ex), device, rounds, warmup)
    t0 = time.perf_counter()
    evaluate(exp.model, exp.gparams, exp.data.x_test, exp.data.y_test)
    _sync(device)
    return per_round, time.perf_counter() - t0


def time_run_batch(config: Config, device: torch.device, path: str, runs: int, rounds: int = 2,
                   warmup: int = 1) -> float:
    """Run-rounds per second when ``runs`` seeds of ``config`` are trained as one run batch
    (median round of ``rounds`` after ``warmup``)."""
    batch = RunBatch([Experiment(config.replace(seed=s), device) for s in range(runs)])
    with batch.executor(path) as ex:
        return runs / _median_round(lambda t: batch.round(t, ex), device, rounds, warmup)


#: Record-level DP-SGD as MOON-DPAP's Fig. 2 runs it (studies/moon_dpap/pages.py ``RECORD_DP``, at
#: one total epsilon): timed with ``--scale`` against MOON-DPAP without DP, the device's own
#: ``record_dp_cost`` that the campaign's estimates use (the CPU's factor does not carry to a GPU).
RECORD_DP = dict(algorithm="moon_dpap", dp="record", dp_delta=1e-5, dp_schedule="constant", dp_clip=1.0,
                 dp_epsilon_total=10.0)

#: The papers' scale for the extrapolated run times (MOON-DPAP, Sec. 4.1).
PAPER_SCALE = dict(dataset="fashionmnist", model="cnn", clients=20, alpha=0.5, train_samples=0,
                   test_samples=0, batch_size=32, lr=0.005, momentum=0.0)
PAPER_ROUNDS = 200


def record_costs(config: Config, device: torch.device, path: str, rounds: int) -> dict:
    """MOON-DPAP's round on ``config``'s data without DP (``moon_dpap_s``), with record-level DP-SGD
    on per-sample gradients (``moon_dpap_record_s``) and with ghost clipping (``moon_dpap_ghost_s``),
    on ``path``, and the two cost factors the campaign's estimates use: ``record_dp_cost`` and
    ``ghost_dp_cost`` (each over the round without DP). ``--record-cost`` times only these."""
    out = {"moon_dpap_s": time_rounds(config.replace(algorithm="moon_dpap"), device, path, rounds)[0],
           "moon_dpap_record_s": time_rounds(config.replace(**RECORD_DP), device, path, rounds)[0],
           "moon_dpap_ghost_s": time_rounds(config.replace(**RECORD_DP, dp_grad="ghost"), device, path,
                                            rounds)[0]}
    out["record_dp_cost"] = out["moon_dpap_record_s"] / out["moon_dpap_s"]
    out["ghost_dp_cost"] = out["moon_dpap_ghost_s"] / out["moon_dpap_s"]
    return out


def scale_figures(config: Config, device: torch.device, rounds: int, clients: tuple[int, int] = (100, 1000),
                  paper_scale: dict | None = None) -> dict:
    """Round time at 100 and 1000 clients (same data), MOON-DPAP's round without DP and with
    record-level DP-SGD (their ratio ``record_dp_cost``; ``ghost_dp_cost`` with ghost clipping), and
    paper-scale run times extrapolated from ``rounds`` timed rounds: ``200 x (round + evaluation)``."""
    path = default_path(device)
    out = {}
    for n in clients:
        cfg = config.replace(clients=n, partition="iid", min_client_samples=1)
        out[f"round_s_{n}_clients"] = time_rounds(cfg, device, path, rounds)[0]
    small, large = clients
    ratio = out[f"round_s_{large}_clients"] / out[f"round_s_{small}_clients"]
    out[f"round_{large}_vs_{small}_clients"] = ratio
    out.update(record_costs(config, device, path, rounds))
    paper = Config(**(paper_scale or PAPER_SCALE), rounds=rounds + 1)
    round_s, eval_s = time_rounds(paper, device, path, rounds)
    out["paper_fedavg_run_s"] = PAPER_ROUNDS * (round_s + eval_s)
    per_run_batched = 1.0 / time_run_batch(paper, device, path, 3, rounds)
    out["paper_fedavg_run_s_batched3"] = PAPER_ROUNDS * (per_run_batched + eval_s)
    dpap = paper.replace(**OTHER_ALGORITHMS["moon_dpap_dp"])
    round_s, eval_s = time_rounds(dpap, device, path, rounds)
    out["paper_moon_dpap_dp_run_s"] = PAPER_ROUNDS * (round_s + eval_s)
    per_run_batched = 1.0 / time_run_batch(dpap, device, path, 3, rounds)
    out["paper_moon_dpap_dp_run_s_batched3"] = PAPER_ROUNDS * (per_run_batched + eval_s)
    return out


def server_noise(config: Config, per_worker: int = 2) -> dict:
    """The host's cost of MOON-DPAP's central noise (:mod:`fedlib.privacy.central`: an exact
    discrete Gaussian on every coordinate of the model, round 0's sigma of ``moon_dpap_dp``):
    ``one_s``, one round's noise drawn on one thread (what a round waits for when nothing is drawn
    ahead); ``ahead_s``, the time per round when ``per_worker`` rounds per worker are drawn at once
    by :func:`~fedlib.privacy.central.noise_workers` worker processes, as the draws ahead are by
    default (the least a run's round can take on a GPU, whatever its training; the pool started
    and warmed up first, as a run's is after its first rounds); ``ahead_threads_s``, the same with
    worker threads (``noise_pool="threads"``)."""
    import numpy as np

    from fedlib.privacy import central
    from fedlib.privacy.guarantee import Relation

    exp = Experiment(config.replace(**OTHER_ALGORITHMS["moon_dpap_dp"], rounds=2), torch.device("cpu"))
    sizes = central._sizes(exp.gparams, 0)
    coordinates = sum(n for _, n in sizes)
    sigma = central._discrete_sigma(exp.config.dp_clip, exp.algo.hyper(0)["noise_multiplier"],
                                     Relation.REPLACE_ONE, coordinates)

    def one_round(i: int) -> None:
        central._draw_all(sizes, sigma, np.random.default_rng(i))

    one_round(0)  # warm-up
    t0 = time.perf_counter()
    one_round(1)
    one = time.perf_counter() - t0
    out: dict = {"coordinates": coordinates, "one_s": one}
    for kind, name in (("processes", "ahead_s"), ("threads", "ahead_threads_s")):
        workers = central.noise_workers(kind)
        pool = central.noise_pool(kind)
        for f in [pool.submit(central.draw_keyed, sizes, sigma, (i,)) for i in range(workers)]:
            f.result()  # every worker started and warm
        rounds = per_worker * workers
        t0 = time.perf_counter()
        for f in [pool.submit(central.draw_keyed, sizes, sigma, (i,)) for i in range(2, 2 + rounds)]:
            f.result()
        out[name] = (time.perf_counter() - t0) / rounds
        out["workers" if kind == "processes" else "thread_workers"] = workers
    return out


def client_state_mb(config: Config, clients: int) -> float:
    """MiB of the client state the engine keeps across rounds, stacked over ``clients``
    clients (for MOON-DPAP each client's previous model): the size of one client's state
    tree, as the algorithm builds it, times ``clients``."""
    exp = Experiment(config.replace(clients=1, partition="iid"), torch.device("cpu"))
    one = exp.algo.init_client_state(exp.gparams)
    return clients * sum(t.numel() * t.element_size() for t in leaves(one)) / 2**20


def matmul_peak_flops(device: torch.device, seconds: float = 1.0, threads: int | None = None) -> float:
    """The device's measured matrix-multiply rate (FLOP/s): square float32 products (n = 2048 on a
    CPU, on every thread torch uses, or on ``threads``; 8192 on a GPU, under the run's TF32 setting),
    repeated for about ``seconds`` after a warm-up, the best of three passes: the peak an achieved
    rate is compared with."""
    n = 2048 if device.type == "cpu" else 8192
    a, b = (torch.randn(n, n, device=device) for _ in range(2))
    best = 0.0
    with _threads(threads):
        torch.mm(a, b)
        _sync(device)
        for _ in range(3):
            reps, t0 = 0, time.perf_counter()
            while time.perf_counter() - t0 < seconds / 3:
                torch.mm(a, b)
                reps += 1
                _sync(device)
            best = max(best, 2 * n ** 3 * reps / (time.perf_counter() - t0))
    return best


def flop_rates(config: Config, device: torch.device, default_s: float,
               earlier_peaks: tuple[float, ...] = ()) -> dict:
    """The default path's achieved training rate on the benchmark's round (its FLOP, counted by
    :func:`fedlib.flops.per_sample_flops`, over its measured time) against the device's own measured
    matrix-multiply peak, in the same process: measured now and compared with ``earlier_peaks``
    (FLOP/s measured earlier in the run), the highest of them counting as the peak."""
    from fedlib.flops import per_sample_flops

    per_sample = per_sample_flops(config)[0]
    achieved = config.n_train * per_sample / default_s
    peaks = [*earlier_peaks, matmul_peak_flops(device)]
    peak = max(peaks)
    return {"train_mflop_per_sample": per_sample / 1e6, "default_gflops": achieved / 1e9,
            "matmul_peak_gflops": peak / 1e9, "matmul_peak_gflops_measured": [p / 1e9 for p in peaks],
            "default_percent_of_peak": 100 * achieved / peak}


def percent_of_peak(results: dict, seconds: float, peak_gflops: float | None = None) -> float:
    """The share (%) of a benchmark's matrix-multiply peak (``matmul_peak_gflops``, or ``peak_gflops``)
    reached by one pass over its training samples (``samples`` x ``train_mflop_per_sample``) in
    ``seconds``: the measure of ``default_percent_of_peak``, for any other timing the benchmark
    recorded (it applies to committed results too, which store the three numbers)."""
    flop = results["samples"] * results["train_mflop_per_sample"] * 1e6
    return 100 * flop / seconds / ((peak_gflops or results["matmul_peak_gflops"]) * 1e9)


def batch_round_cost(results: dict) -> dict[int, float]:
    """What one round of a run batch of ``R`` runs costs, in rounds of a single run, for each ``R``
    that ``run_batch_runs_per_s`` timed: ``R x rate(1) / rate(R)`` (the rates are run-rounds per
    second). Near 1, the runs share the step's time: it goes to launches and fixed costs, as a
    launch-bound step's does. Near ``R``, batching shares nothing: the time is the runs' own work,
    and the kernels' speed on that work is what bounds the step. Empty when the benchmark did not
    time one run alone."""
    rates = {int(r): float(v) for r, v in (results.get("run_batch_runs_per_s") or {}).items()}
    if rates.get(1, 0) <= 0:
        return {}
    return {r: r * rates[1] / v for r, v in sorted(rates.items()) if v > 0}


#: The algorithm families whose vectorized step's operator count the benchmark reports.
STEP_FAMILIES = {
    "fedavg": dict(),
    "moon_dpap_central": OTHER_ALGORITHMS["moon_dpap_dp"],
    "moon_dpap_record": dict(algorithm="moon_dpap", dp="record", dp_epsilon_total=50.0,
                             dp_schedule="constant"),
    "ldp_fl": dict(algorithm="ldp_fl"),
}


def step_operators(config: Config) -> dict[str, dict[str, int]]:
    """ATen operators per vectorized step (:func:`fedlib.flops.operators_per_step`) of each family in
    :data:`STEP_FAMILIES` on the benchmark's model, at 2 and 16 lanes and with a run batch of 4 runs:
    a step of constant launch count dispatches the same number in every case. Record-level DP-SGD
    also with its noise drawn for all lanes at once (``moon_dpap_record_counter``: the
    ``step_noise="counter"`` option, :mod:`fedlib.kernels`)."""
    from fedlib.flops import operators_per_step
    from fedlib.kernels import step_noise

    def counts(c: Config) -> dict[str, int]:
        return {"2 lanes": operators_per_step(c, 2), "16 lanes": operators_per_step(c, 16),
                "2 lanes x 4 runs": operators_per_step(c, 2, runs=4)}

    out = {name: counts(config.replace(**changes)) for name, changes in STEP_FAMILIES.items()}
    before = step_noise()
    try:
        set_kernel_options(step_noise="counter")
        out["moon_dpap_record_counter"] = counts(config.replace(**STEP_FAMILIES["moon_dpap_record"]))
    finally:
        set_kernel_options(step_noise=before)
    return out


def peak_memory_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    self_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return self_kb / 1024


def record_dp_step(model_name: str = "cnn", batch: int = 32, clip: float = 1.0, repeats: int = 15,
                   device: torch.device | None = None) -> dict:
    """One record-level DP-SGD step's gradient (the clipped sum of ``batch`` per-sample gradients of
    a cross-entropy loss) against the plain step's, every way measured in the same run, interleaved
    (median of ``repeats``; one thread on the CPU): fedlib's per-sample path (``vmap`` of ``grad``),
    fedlib's ghost clipping (:mod:`fedlib.privacy.ghost`), Opacus' hooks (``GradSampleModule``, then
    the clip and the sum) and Opacus' ghost clipping (``GradSampleModuleFastGradientClipping``, its
    two backward passes); ``*_x`` is each as a multiple of the plain step, and
    ``ghost_vs_opacus_rel`` the largest relative difference of fedlib's ghost sum from Opacus'."""
    import copy

    from opacus.grad_sample import GradSampleModule, GradSampleModuleFastGradientClipping
    from torch.func import functional_call, grad

    from fedlib.privacy.dpsgd import clip_per_sample, per_sample_grads
    from fedlib.privacy.ghost import ghost_clipped_sum

    device = device or torch.device("cpu")
    threads = torch.get_num_threads()
    if device.type == "cpu":
        torch.set_num_threads(1)
    try:
        torch.manual_seed(0)
        model = build_model(model_name).to(device)
        params = {k: v.detach() for k, v in model.named_parameters()}
        x = torch.randn(batch, 1, 28, 28, device=device)
        y = torch.randint(0, 10, (batch,), device=device)
        data = {"x": x, "y": y, "w": torch.ones(batch, device=device)}

        def loss(p, b):
            per = F.cross_entropy(functional_call(model, p, (b["x"],)), b["y"], reduction="none")
            return (per * b["w"]).sum() / b["w"].sum().clamp_min(1.0)

        hooked = GradSampleModule(copy.deepcopy(model))
        fast_model = copy.deepcopy(model)
        fast = GradSampleModuleFastGradientClipping(fast_model, batch_first=True, loss_reduction="sum",
                                                    max_grad_norm=clip, use_ghost_clipping=True)

        def opacus_hooks():
            F.cross_entropy(hooked(x), y, reduction="sum").backward()
            grads = {k: p.grad_sample for k, p in hooked._module.named_parameters()}
            for p in hooked.parameters():
                p.grad, p.grad_sample = None, None
            return clip_per_sample(grads, clip, data["w"])[0]

        def opacus_ghost():
            per = F.cross_entropy(fast(x), y, reduction="none")
            per.sum().backward(retain_graph=True)
            for p in fast_model.parameters():
                p.grad = None
            coef = fast.get_clipping_coef()
            fast.disable_hooks()
            (coef * per).sum().backward()
            fast.enable_hooks()
            out = {k: p.grad for k, p in fast_model.named_parameters()}
            for p in fast_model.parameters():
                p.grad = None
            return out

        ways = {
            "plain": lambda: grad(loss)(params, data),
            "per_sample": lambda: clip_per_sample(per_sample_grads(loss, params, data)[0], clip,
                                                  data["w"])[0],
            "ghost": lambda: ghost_clipped_sum(model, loss, params, data, clip, data["w"])[0],
            "opacus_hooks": opacus_hooks,
            "opacus_ghost": opacus_ghost,
        }
        with warnings.catch_warnings():  # Opacus' hooks fire on outputs when no input needs a gradient
            warnings.simplefilter("ignore", UserWarning)
            results = {k: f() for k, f in ways.items()}  # warm-up, and the sums compared below
            times: dict[str, list[float]] = {k: [] for k in ways}
            for _ in range(repeats):
                for k, f in ways.items():
                    _sync(device)
                    t0 = time.perf_counter()
                    f()
                    _sync(device)
                    times[k].append(time.perf_counter() - t0)
    finally:
        torch.set_num_threads(threads)
    med = {k: statistics.median(v) for k, v in times.items()}
    out = {"model": model_name, "batch": batch, "plain_ms": 1e3 * med["plain"]}
    out.update({f"{k}_x": med[k] / med["plain"] for k in ways if k != "plain"})
    ref, got = results["opacus_ghost"], results["ghost"]
    out["ghost_vs_opacus_rel"] = max(float((got[k] - ref[k]).norm() / ref[k].norm()) for k in ref)
    return out


def benchmark(config: Config, device: torch.device, rounds: int = 3,
              paths: tuple[str, ...] | None = None, batch_runs: tuple[int, ...] = (1, 3, 8),
              scale: bool | None = None) -> dict:
    cpu = device.type == "cpu"
    paths = paths or (("sequential", "parallel", "vectorized") if cpu else ("sequential", "vectorized"))
    out: dict = {"device": device_label(device),
                 "model": config.model, "dataset": config.dataset, "clients": config.clients,
                 "samples": config.n_train, "batch_size": config.batch_size,
                 "threads": torch.get_num_threads()}
    if cpu:  # before the floor too, so that the plain loop and the engine allocate alike
        out["host_memory"] = prepare_host_memory(device)
    peaks_at_start = (matmul_peak_flops(device),)
    if cpu:  # each core on its own, as the parallel path's single-thread workers use them
        out["matmul_peak_1thread_gflops"] = matmul_peak_flops(device, threads=1) / 1e9
        peaks_at_start += (cpu_workers() * out["matmul_peak_1thread_gflops"] * 1e9,)
    out["floor_s"] = time_floor(config, device)
    if cpu:
        out["floor_1thread_s"] = time_floor(config, device, repeats=2, threads=1)
        out["thread_scaling"] = out["floor_1thread_s"] / out["floor_s"]
        out["plain_parallel_workers"] = workers = cpu_workers()
        out["plain_parallel_s"] = time_plain_parallel(config, workers)
        out["plain_parallel_vs_floor"] = out["plain_parallel_s"] / out["floor_s"]
        out.update(engine_vs_plain_parallel(config))  # alternating: host noise weighs on both alike
    for path in paths:
        out[f"{path}_s"], out["eval_s"] = time_rounds(config, device, path, rounds)
    default = default_path(device)
    out["default_path"] = default
    out["default_s"] = out.get(f"{default}_s") or time_rounds(config, device, default, rounds)[0]
    out.update(path_ratios(out))
    out["default_vs_floor"] = out["default_s"] / out["floor_s"]
    out["rounds_per_s"] = 1.0 / out["default_s"]
    out.update(flop_rates(config, device, out["default_s"], peaks_at_start))
    if cpu:
        out["plain_parallel_percent_of_peak"] = percent_of_peak(out, out["plain_parallel_s"])
        out["floor_1thread_percent_of_peak"] = percent_of_peak(out, out["floor_1thread_s"],
                                                               out["matmul_peak_1thread_gflops"])
    out["operators_per_step"] = step_operators(config)
    out["operators_exclude_views"] = True  # (results before 2026-11-26 counted views too)
    out["record_dp_step"] = record_dp_step(config.model, config.batch_size, device=device)
    for name, changes in OTHER_ALGORITHMS.items():
        out[f"{name}_s"] = time_rounds(config.replace(**changes), device, default, rounds)[0]
    out["moon_dpap_dp_vs_fedavg"] = out["moon_dpap_dp_s"] / out["default_s"]
    out["server_noise"] = server_noise(config)
    # Opt-in bfloat16 (other numbers, so not what the targets are about): the floor and the
    # default path with the forward pass under autocast.
    bf16 = config.replace(precision="bfloat16")
    out["floor_bf16_s"] = time_floor(bf16, device)
    out["default_bf16_s"] = time_rounds(bf16, device, default, rounds)[0]
    out["default_bf16_vs_floor"] = out["default_bf16_s"] / out["floor_s"]
    out["moon_dpap_state_mb_1000"] = client_state_mb(config.replace(**OTHER_ALGORITHMS["moon_dpap_dp"]), 1000)
    out["run_batch_runs_per_s"] = {str(r): time_run_batch(config, device, default, r, rounds)
                                   for r in batch_runs}
    if scale if scale is not None else not cpu:
        out.update(scale_figures(config, device, rounds))
    out["peak_mem_mb"] = peak_memory_mb(device)
    return out


#: The speed options ``--options-sweep`` compares with the defaults (issue 38, step 1): convolutions
#: as one batched matmul over the lanes, TF32 in float32 matmuls, TF32 in cuDNN convolutions
#: (PyTorch's default, not fedlib's: what float32 convolutions cost, issue 64), cuDNN autotuning, the
#: two best together, and the eager step (what CUDA graphs save). The CUDA-only ones are left out on a
#: CPU. A variant with TF32 computes in another arithmetic than the results
#: (:func:`fedlib.kernels.arithmetic`).
SWEEP_VARIANTS: dict[str, dict[str, bool | str]] = {
    "default": {},
    "lane_conv=im2col": {"lane_conv": "im2col"},
    "matmul_tf32": {"matmul_tf32": True},
    "cudnn_tf32": {"cudnn_tf32": True},
    "cudnn_autotune": {"cudnn_autotune": True},
    "lane_conv=im2col+matmul_tf32": {"lane_conv": "im2col", "matmul_tf32": True},
    "no cuda_graphs": {"cuda_graphs": False},
}
_CUDA_ONLY = {"matmul_tf32", "cudnn_tf32", "cudnn_autotune", "cuda_graphs"}


def options_sweep(config: Config, device: torch.device, rounds: int = 2, repeats: int = 2,
                  runs: int = 1) -> dict:
    """Seconds per run-round of the default path under each of :data:`SWEEP_VARIANTS` (a run batch
    of ``runs`` seeds), each variant timed ``repeats`` times in turn, interleaved so that a drift of
    the machine's speed falls on all of them alike; the median per variant, its ratio to the
    default's, and the fastest. The settings in force before are restored after each variant."""
    cuda = device.type == "cuda"
    variants = {name: v for name, v in SWEEP_VARIANTS.items() if cuda or not (v.keys() & _CUDA_ONLY)}
    now = kernel_settings()
    restore = {"lane_conv": now["lane_conv"], **({"matmul_tf32": now["matmul_tf32"],
               "cudnn_tf32": now["cudnn_tf32"], "cudnn_autotune": now["cudnn_benchmark"],
               "cuda_graphs": now["cuda_graphs"]} if cuda else {})}
    path = default_path(device)
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(repeats):
        for name, changes in variants.items():
            set_kernel_options(**changes)
            try:
                times[name].append(1.0 / time_run_batch(config, device, path, runs, rounds))
            finally:
                set_kernel_options(**restore)
    median = {name: statistics.median(ts) for name, ts in times.items()}
    return {"path": path, "runs": runs, "samples": config.n_train, "clients": config.clients,
            "s_per_run_round": median,
            "vs_default": {name: t / median["default"] for name, t in median.items()},
            "fastest": min(median, key=median.get)}


def profile_path(device: torch.device, paths: tuple[str, ...] | None = None) -> str:
    """The path :func:`kernel_profile` profiles: the first of ``paths``, else the device's default,
    except the CPU's ``parallel``, whose workers are other processes that a profiler in this one
    does not see: there each worker's own loop, ``sequential``."""
    path = paths[0] if paths else default_path(device)
    return "sequential" if path == "parallel" else path


def kernel_profile(config: Config, device: torch.device, path: str, runs: int = 1, rounds: int = 2,
                   top: int = 20) -> dict:
    """Where a round's time goes, operator by operator (``--kernel-profile``): ``rounds`` rounds of a
    run batch of ``runs`` seeds on ``path``, after one warm-up round, under ``torch.profiler``.

    The step runs eagerly (CUDA graphs off for the profile: a replay runs the same kernels but hides
    which operator launched each). On CUDA an operator's time is its own kernels' device time
    (``self_device_time_total``) and the ``top`` kernels are listed as well; on a CPU it is the
    operator's own CPU time. ``ops`` holds the ``top`` operators by that time, each with its calls
    and seconds per round and its share of all operators' time (``timed_s_per_round``);
    ``wall_s_per_round`` is the round under the profiler (which adds to every operator's cost, so it
    is no benchmark of the round)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    graphs = kernel_settings().get("cuda_graphs") if cuda else None
    if cuda:
        set_kernel_options(cuda_graphs=False)
    try:
        batch = RunBatch([Experiment(config.replace(seed=s), device) for s in range(runs)])
        with batch.executor(path) as ex:
            batch.round(0, ex)
            _sync(device)
            activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
            t0 = time.perf_counter()
            with profile(activities=activities) as prof:
                for t in range(1, rounds + 1):
                    batch.round(t, ex)
                _sync(device)
            wall = (time.perf_counter() - t0) / rounds
    finally:
        if cuda:
            set_kernel_options(cuda_graphs=graphs)

    def seconds(e) -> float:
        return (e.self_device_time_total if cuda else e.self_cpu_time_total) / 1e6 / rounds

    def rows(events) -> tuple[list[dict], float]:
        timed = [e for e in events if seconds(e) > 0]
        total = sum(seconds(e) for e in timed)
        best = sorted(timed, key=seconds, reverse=True)[:top]
        return [{"name": e.key, "calls_per_round": e.count / rounds, "s_per_round": seconds(e),
                 "share": seconds(e) / total} for e in best], total

    events = prof.key_averages()
    ops, total = rows([e for e in events if e.device_type == DeviceType.CPU])
    out = {"path": path, "runs": runs, "rounds": rounds, "samples": config.n_train,
           "clients": config.clients, "timed": "device" if cuda else "cpu", "eager": True,
           "wall_s_per_round": wall, "timed_s_per_round": total, "ops": ops}
    if cuda:
        out["kernels"], _ = rows([e for e in events if e.device_type == DeviceType.CUDA])
    return out


def device_label(device: torch.device) -> str:
    """The device as results name it: ``cpu``, or ``cuda:0 (NVIDIA H200)``."""
    return str(device) if device.type == "cpu" else f"{device} ({torch.cuda.get_device_name(device)})"


def device_slug(device: torch.device) -> str:
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device).lower()
        return "cuda-" + "".join(c if c.isalnum() else "-" for c in name).strip("-")
    return f"cpu-{cpu_workers()}core"


def bench_dir() -> Path:
    """``$FEDLIB_BENCH_DIR`` or ``data/bench/``: where benchmarks are saved and the campaign reads
    its time estimates from."""
    return Path(os.environ.get("FEDLIB_BENCH_DIR", REPO_ROOT / "data" / "bench"))


def variant_name(options: dict[str, bool | str]) -> str:
    """A file-name part for the speed options set on the command line (sorted; "" for none)."""
    return "-".join(f"{k.replace('_', '-')}-{v if isinstance(v, str) else 'on' if v else 'off'}"
                    for k, v in sorted(options.items()))


def save(res: dict, device: torch.device, folder: Path | None = None, variant: str = "",
         subfolder: str = "options") -> Path:
    """Write ``res`` with provenance to ``data/bench/<device>-<date>.json`` (atomically). A run
    with speed options (``variant``, from :func:`variant_name`) goes to
    ``data/bench/options/<device>-<date>-<variant>.json`` instead (``subfolder``): the campaign's
    time estimates read the default settings' files only. A kernel profile goes to
    ``data/bench/profile/<device>-<date>-[<options>-]kernel-profile.json``."""
    folder = Path(folder or bench_dir())
    stamp = time.strftime("%Y-%m-%d")
    if variant:
        folder, stamp = folder / subfolder, f"{stamp}-{variant}"
    path = folder / f"{device_slug(device)}-{stamp}.json"
    payload = {"results": res, "provenance": provenance(device, res.get("default_path", "")),
               "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    atomic_write_bytes(path, json.dumps(payload, indent=1).encode())
    return path


def clients_sweep(config: Config, device: torch.device, clients: list[int], paths: tuple[str, ...],
                  rounds: int = 2) -> list[dict]:
    """Seconds per FedAvg round for each number of clients (same total data) and path."""
    rows = []
    for n in clients:
        cfg = config.replace(clients=n, partition="iid")
        for path in paths:
            rows.append({"clients": n, "path": path, "round_s": time_rounds(cfg, device, path, rounds)[0]})
    return rows


def main(argv: list[str] | None = None) -> int:
    p = OneLineParser(prog="python -m lab.bench", description=__doc__.splitlines()[0])
    p.add_argument("--dataset", default="fashionmnist")
    p.add_argument("--model", default="cnn")
    p.add_argument("--clients", type=int, default=20)
    p.add_argument("--samples", type=int, default=12_000, help="training samples (0 = all)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--alpha", type=float, default=0.5)
    p.add_argument("--rounds", type=int, default=3, help="timed rounds per path (after one warm-up)")
    p.add_argument("--device", default="auto")
    p.add_argument("--paths", nargs="*", help="engine paths to time (default: all for the device)")
    p.add_argument("--batch-runs", nargs="*", type=int, default=[1, 3, 8],
                   help="run-batch sizes to time (runs trained together)")
    p.add_argument("--scale", action=argparse.BooleanOptionalAction, default=None,
                   help="also time 100/1000 clients and the papers' full-data setting "
                        "(default: on a GPU only)")
    p.add_argument("--sweep", nargs="*", type=int, default=[],
                   help="also time a FedAvg round for these numbers of clients (same total data), every path")
    p.add_argument("--matmul-tf32", action=argparse.BooleanOptionalAction, default=None,
                   help="TF32 in float32 matmuls (a CUDA speed option; default: PyTorch's, off)")
    p.add_argument("--cudnn-tf32", action=argparse.BooleanOptionalAction, default=None,
                   help="TF32 in cuDNN convolutions (default: fedlib's, off: float32 as on a CPU; "
                        "PyTorch's own default is on)")
    p.add_argument("--cudnn-autotune", action=argparse.BooleanOptionalAction, default=None,
                   help="cuDNN autotuning among deterministic algorithms (default: off)")
    p.add_argument("--cuda-graphs", action=argparse.BooleanOptionalAction, default=None,
                   help="replay the vectorized path's step as a CUDA graph (fedlib.graphs; default: on, "
                        "fedlib.kernels; --no-cuda-graphs times the eager step)")
    p.add_argument("--lane-conv", choices=["grouped", "im2col"], default=None,
                   help="how convolutions compute (fedlib.kernels: grouped, PyTorch's and the default, or "
                        "im2col, a batched matrix multiply over lanes); any device")
    p.add_argument("--step-noise", choices=["generator", "counter"], default=None,
                   help="how record-level DP-SGD draws its step noise (fedlib.kernels: generator, a "
                        "torch.Generator per client and step and the default, or counter, Philox for "
                        "every lane in one draw); any device")
    p.add_argument("--noise-ahead", choices=["auto", "on", "off"], default=None,
                   help="draw the server's exact discrete Gaussian ahead, by noise workers while the "
                        "clients train (fedlib.kernels; auto, the default: on CUDA only; the same values "
                        "either way)")
    p.add_argument("--noise-pool", choices=["processes", "threads"], default=None,
                   help="what draws the server noise ahead (fedlib.kernels: processes, the default, "
                        "or threads; the same values either way)")
    p.add_argument("--host-memory", choices=["reuse", "system"], default=None,
                   help="leave glibc's own behaviour (system, the default) or keep freed host memory for "
                        "the next step (reuse); fedlib.host_memory, the same numbers either way")
    p.add_argument("--record-cost", action="store_true",
                   help="time only MOON-DPAP's round without DP, with record-level DP-SGD and with ghost "
                        "clipping on the default path (record_dp_cost, ghost_dp_cost), nothing else")
    p.add_argument("--options-sweep", action="store_true",
                   help="only compare the speed options with the defaults (SWEEP_VARIANTS), interleaved; "
                        "--batch-runs' first size is the run batch; with --save, under data/bench/options/")
    p.add_argument("--kernel-profile", action="store_true",
                   help="only profile a round of a run batch (--batch-runs' first size) operator by "
                        "operator with torch.profiler, eagerly (kernel_profile); with --save, under "
                        "data/bench/profile/, named ...-kernel-profile.json")
    p.add_argument("--engine-floor", action="store_true",
                   help="only time the parallel path's round against the plain loop split over the same "
                        "cores, alternating (engine_vs_plain_parallel), on a CPU")
    p.add_argument("--json", action="store_true", help="print one JSON object on the last line")
    p.add_argument("--save", action="store_true", help="write the result with provenance under data/bench/")
    args = p.parse_args(argv)
    for part_only in ("record_cost", "engine_floor"):
        if getattr(args, part_only) and args.save:
            p.error(f"--{part_only.replace('_', '-')} times a part of the benchmark: it is not saved as one")
    config = Config(dataset=args.dataset, model=args.model, clients=args.clients,
                    train_samples=args.samples, batch_size=args.batch_size, alpha=args.alpha,
                    test_samples=2_000, rounds=args.rounds + 1).validate()
    options = {k: v for k, v in (("matmul_tf32", args.matmul_tf32), ("cudnn_tf32", args.cudnn_tf32),
                                 ("cudnn_autotune", args.cudnn_autotune), ("cuda_graphs", args.cuda_graphs))
               if v is not None}
    device = pick_device(args.device)
    if options and device.type != "cuda":
        p.error(f"{', '.join('--' + k.replace('_', '-') for k in options)}: CUDA kernel options, "
                f"but this benchmark runs on {device}")
    for option in ("lane_conv", "step_noise", "noise_ahead", "noise_pool", "host_memory"):
        if getattr(args, option) is not None:
            options[option] = getattr(args, option)
    kernels = set_kernel_options(**options)
    paths = tuple(args.paths) if args.paths else None
    parts = [f"--{name}" for name, on in (("options-sweep", args.options_sweep),
                                           ("record-cost", args.record_cost),
                                           ("kernel-profile", args.kernel_profile),
                                           ("engine-floor", args.engine_floor)) if on]
    if len(parts) > 1:
        p.error(f"{' and '.join(parts)} each time a part of the benchmark: choose one")
    if args.engine_floor and device.type != "cpu":
        p.error(f"--engine-floor compares the CPU's parallel path with plain parallel training, not {device}")
    if args.engine_floor:
        res = {"device": device_label(device), "samples": config.n_train, "clients": config.clients,
               **engine_vs_plain_parallel(config, repeats=max(3, args.rounds))}
    elif args.kernel_profile:
        res = {"device": device_label(device),
               "kernel_profile": kernel_profile(config, device, profile_path(device, paths),
                                                runs=args.batch_runs[0], rounds=args.rounds)}
    elif args.options_sweep:
        res = {"device": device_label(device),
               "options_sweep": options_sweep(config, device, args.rounds, runs=args.batch_runs[0])}
    elif args.record_cost:
        path = default_path(device)
        res = {"device": device_label(device), "samples": config.n_train, "clients": config.clients,
               "path": path, **record_costs(config, device, path, args.rounds)}
    else:
        res = benchmark(config, device, args.rounds, paths, tuple(args.batch_runs), args.scale)
    if device.type == "cuda":
        res["kernels"] = kernels
    elif device_options():
        res["kernels"] = device_options()
    if args.sweep and not parts:
        sweep_paths = paths or (("sequential", "parallel", "vectorized") if device.type == "cpu"
                                else ("sequential", "vectorized"))
        res["clients_sweep"] = clients_sweep(config, device, args.sweep, sweep_paths, rounds=1)
    width = max(map(len, res))
    for k, v in res.items():
        print(f"{k:<{width}}  {v:.3f}" if isinstance(v, float) else f"{k:<{width}}  {v}")
    if args.save:
        part = parts[0].removeprefix("--") if parts else ""  # --record-cost is refused with --save
        variant = "-".join(filter(None, [variant_name(options), part]))
        subfolder = "profile" if part == "kernel-profile" else "options"
        print(f"saved {save(res, device, variant=variant, subfolder=subfolder)}")
    if args.json:
        print(json.dumps(res))
    return 0


if __name__ == "__main__":
    from fedlib.cli import entry

    sys.exit(entry(main, "python -m lab.bench"))

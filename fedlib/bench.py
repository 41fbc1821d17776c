"""Engine benchmark: ``python -m fedlib.bench [--json]`` (also ``make bench``).

Measures, in one process and on one setting (dataset, model, clients, samples, batch):

* ``floor_s``: one centralized epoch over the same samples with the same model and batch
  size, a plain PyTorch loop (``nn.Module`` + ``torch.optim.SGD``): the no-federation floor;
* ``sequential_s``, ``parallel_s``, ``vectorized_s``: one FedAvg round (local training of
  every client for one epoch, and aggregation) on each engine path, the median of several
  rounds after a warm-up; evaluation is timed separately (``eval_s``);
* ``default_s``: the path the engine picks by itself on this device;
* ratios ``overhead_sequential = sequential_s / floor_s``,
  ``speedup_vectorized = sequential_s / vectorized_s``, ``default_vs_floor = default_s / floor_s``;
* round times of MOON, SCAFFOLD and MOON-DPAP with every component and client-level DP on
  (``moon_dpap_dp_s``; ``moon_dpap_dp_vs_fedavg`` is its ratio to a FedAvg round);
* :func:`clients_sweep`: round time against the number of clients at a fixed total of data,
  per engine path (the book's benchmark page plots it).

With ``--json`` the last line is one JSON object with these keys.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import time

import torch
import torch.nn.functional as F

from fedlib.config import Config
from fedlib.engine import Executor, default_path
from fedlib.models import build_model
from fedlib.run import Experiment, evaluate, pick_device

#: Other algorithms whose round time the benchmark reports: name -> config changes.
OTHER_ALGORITHMS = {
    "moon": dict(algorithm="moon"),
    "scaffold": dict(algorithm="scaffold"),
    "moon_dpap_dp": dict(algorithm="moon_dpap", cosine_lr=True, lr_min=0.0005, dropout=0.2, prune=True,
                         prune_t_max=0.005, moon_tau=0.5, tau_min=0.1, mu_max=0.05, dp="central",
                         dp_epsilon=1.0, dp_clip=0.5, dp_delta=1e-5),
}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_floor(config: Config, device: torch.device, repeats: int = 2) -> float:
    """Seconds for one plain-PyTorch epoch over the same samples (best of ``repeats``)."""
    exp = Experiment(config, device)
    x, y = exp.data.x_train, exp.data.y_train
    model = build_model(config.model).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=config.lr, momentum=config.momentum)
    g = torch.Generator().manual_seed(0)
    best = float("inf")
    for _ in range(repeats):
        perm = torch.randperm(len(y), generator=g).to(device)
        _sync(device)
        t0 = time.perf_counter()
        for i in range(0, len(y), config.batch_size):
            ids = perm[i:i + config.batch_size]
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(x[ids]), y[ids]).backward()
            opt.step()
        _sync(device)
        best = min(best, time.perf_counter() - t0)
    return best


def time_rounds(config: Config, device: torch.device, path: str, rounds: int = 3,
                warmup: int = 1) -> tuple[float, float]:
    """Median seconds per round on ``path`` and seconds of one evaluation."""
    exp = Experiment(config, device)
    times = []
    with Executor(path, exp.algo, exp.data.x_train, exp.data.y_train) as ex:
        for t in range(warmup + rounds):
            _sync(device)
            t0 = time.perf_counter()
            exp.round(t, ex)
            _sync(device)
            if t >= warmup:
                times.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    evaluate(exp.model, exp.gparams, exp.data.x_test, exp.data.y_test)
    _sync(device)
    return statistics.median(times), time.perf_counter() - t0


def peak_memory_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    self_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return self_kb / 1024


def benchmark(config: Config, device: torch.device, rounds: int = 3,
              paths: tuple[str, ...] | None = None) -> dict:
    cpu = device.type == "cpu"
    paths = paths or (("sequential", "parallel", "vectorized") if cpu else ("sequential", "vectorized"))
    out: dict = {"device": str(device) if cpu else f"{device} ({torch.cuda.get_device_name(device)})",
                 "model": config.model, "dataset": config.dataset, "clients": config.clients,
                 "samples": config.n_train, "batch_size": config.batch_size,
                 "threads": torch.get_num_threads()}
    out["floor_s"] = time_floor(config, device)
    for path in paths:
        out[f"{path}_s"], out["eval_s"] = time_rounds(config, device, path, rounds)
    default = default_path(device)
    out["default_path"] = default
    out["default_s"] = out.get(f"{default}_s") or time_rounds(config, device, default, rounds)[0]
    out["overhead_sequential"] = out["sequential_s"] / out["floor_s"]
    out["speedup_vectorized"] = out["sequential_s"] / out["vectorized_s"] if "vectorized_s" in out else None
    out["default_vs_floor"] = out["default_s"] / out["floor_s"]
    out["rounds_per_s"] = 1.0 / out["default_s"]
    for name, changes in OTHER_ALGORITHMS.items():
        out[f"{name}_s"] = time_rounds(config.replace(**changes), device, default, rounds)[0]
    out["moon_dpap_dp_vs_fedavg"] = out["moon_dpap_dp_s"] / out["default_s"]
    out["peak_mem_mb"] = peak_memory_mb(device)
    return out


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
    p = argparse.ArgumentParser(prog="python -m fedlib.bench", description=__doc__.splitlines()[0])
    p.add_argument("--dataset", default="fashionmnist")
    p.add_argument("--model", default="cnn")
    p.add_argument("--clients", type=int, default=20)
    p.add_argument("--samples", type=int, default=12_000, help="training samples (0 = all)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--alpha", type=float, default=0.5)
    p.add_argument("--rounds", type=int, default=3, help="timed rounds per path (after one warm-up)")
    p.add_argument("--device", default="auto")
    p.add_argument("--paths", nargs="*", help="engine paths to time (default: all for the device)")
    p.add_argument("--json", action="store_true", help="print one JSON object on the last line")
    args = p.parse_args(argv)
    config = Config(dataset=args.dataset, model=args.model, clients=args.clients,
                    train_samples=args.samples, batch_size=args.batch_size, alpha=args.alpha,
                    test_samples=2_000, rounds=args.rounds + 1).validate()
    device = pick_device(args.device)
    res = benchmark(config, device, args.rounds, tuple(args.paths) if args.paths else None)
    width = max(map(len, res))
    for k, v in res.items():
        print(f"{k:<{width}}  {v:.3f}" if isinstance(v, float) else f"{k:<{width}}  {v}")
    if args.json:
        print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())

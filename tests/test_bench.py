"""``python -m fedlib.bench --json`` prints the keys issue 7 asks for (values not judged:
speed is measured by the benchmark, never asserted in a test)."""

import json

import torch

from fedlib import bench
from fedlib.config import Config
from fedlib.run import Experiment

KEYS = {"device", "model", "clients", "samples", "floor_s", "sequential_s", "vectorized_s", "eval_s",
        "default_s", "overhead_sequential", "speedup_vectorized", "default_vs_floor", "rounds_per_s",
        "peak_mem_mb", "moon_s", "scaffold_s", "moon_dpap_dp_s",
        "floor_1thread_s", "plain_parallel_s", "plain_parallel_vs_floor", "default_bf16_s",
        "moon_dpap_state_mb_1000"}


def test_bench_json_line_has_every_key(capsys):
    assert bench.main(["--samples", "400", "--clients", "4", "--rounds", "1", "--json"]) == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert KEYS <= set(res)
    assert res["clients"] == 4 and res["samples"] == 400
    assert res["overhead_sequential"] == res["sequential_s"] / res["floor_s"]
    assert res["plain_parallel_vs_floor"] == res["plain_parallel_s"] / res["floor_s"]
    assert all(res[k] > 0 for k in KEYS if k.endswith("_s"))


def test_client_state_size_is_the_stacked_state_of_the_engine():
    cfg = Config(algorithm="moon", clients=3, train_samples=300, test_samples=100, partition="iid")
    exp = Experiment(cfg, torch.device("cpu"))
    stored = sum(t.numel() * t.element_size() for t in exp.client_states["prev"].values()) / 2**20
    assert bench.client_state_mb(cfg, 3) == stored

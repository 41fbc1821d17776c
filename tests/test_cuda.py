"""Every part of fedlib on CUDA (``make test-gpu``, or ``pytest -m gpu``).

These tests select the GPU explicitly and are skipped, with that reason, on a machine without
one (CI's is CPU-only); the rest of the suite pins the CPU where a test needs it. Tolerances are
those of tests/test_engine.py: float64 for logic (cuDNN and cuBLAS in double precision round at
1e-16 like the CPU, so CPU and GPU agree to ``ATOL64``), and for float32 a multiple of the
reference path's own error against float64, which would also absorb TF32 convolutions (PyTorch's
default on Ampere and later, 10-bit mantissas, ~5e-4 relative; fedlib runs float32 instead).
"""

import json
import math
import subprocess
import sys

import numpy as np
import pytest
import torch

from fedlib import Config, run
from fedlib.algorithms import ALGORITHMS
from fedlib.run import load_model, run_many
from fedlib.tree import leaves

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(),
                                                  reason="needs a CUDA GPU (none on this machine)")]

CUDA = torch.device("cuda")
SMALL = Config(clients=4, train_samples=320, test_samples=100, rounds=2, min_client_samples=10, lr=0.02,
               momentum=0.9)
ATOL64 = 1e-11

#: One configuration per algorithm (with its privacy mechanism on where it has one).
ALGORITHM_CASES = {
    "fedavg": {}, "fedprox": {}, "scaffold": {}, "feddyn": {}, "moon": {"dropout": 0.2}, "ditto": {},
    "moon_dpap": {"cosine_lr": True, "prune": True, "dropout": 0.2, "dp": "central",
                  "dp_epsilon_per_round": 4.0},
    "moon_dpap_local": {"algorithm": "moon_dpap", "dp": "local", "dp_epsilon_per_round": 4.0},
    "dp_fedavg": {"client_fraction": 0.5, "adaptive_clip": True, "dp_noise_multiplier": 0.5,
                  "clip_count_std": 1.0},
    "ldp_fl": {"model": "mlp"}, "signds_fl": {"model": "mlp"},
    "fdl": {"model": "mlp"}, "fdl_corrected": {"algorithm": "fdl", "model": "mlp", "fdl_mode": "corrected"},
}


def _config(case: str, **kw) -> Config:
    changes = dict(ALGORITHM_CASES[case])
    return SMALL.replace(algorithm=changes.pop("algorithm", case), **changes, **kw)


def _max_diff(a: dict, b: dict) -> float:
    return max((a[k].double().cpu() - b[k].double().cpu()).abs().max().item() for k in a)


def test_cases_cover_every_algorithm():
    covered = {ALGORITHM_CASES[c].get("algorithm", c) for c in ALGORITHM_CASES}
    assert covered == set(ALGORITHMS)


@pytest.mark.parametrize("case", sorted(ALGORITHM_CASES))
@pytest.mark.parametrize("engine", ["sequential", "vectorized"])
def test_every_algorithm_trains_on_cuda(tmp_path, case, engine):
    r = run(_config(case), engine=engine, device="cuda", root=tmp_path, progress=False)
    assert r.meta["device"].startswith("cuda") and r.meta["engine"] == engine
    assert all(math.isfinite(h["test_acc"]) for h in r.history if h["test_acc"] is not None)
    _, params = load_model(r, tmp_path)
    assert all(torch.isfinite(p).all() for p in params.values())


@pytest.mark.parametrize("case", ["fedavg", "scaffold", "moon", "ditto", "moon_dpap"])
def test_cuda_vectorized_equals_cpu_sequential_in_float64(tmp_path, case):
    cfg = _config(case, precision="float64")
    cpu = run(cfg, engine="sequential", device="cpu", root=tmp_path / "cpu", progress=False)
    gpu = run(cfg, engine="vectorized", device="cuda", root=tmp_path / "gpu", progress=False)
    assert _max_diff(load_model(cpu, tmp_path / "cpu")[1], load_model(gpu, tmp_path / "gpu")[1]) < ATOL64


def test_cuda_float32_paths_agree_within_the_reference_error(tmp_path):
    cfg = SMALL.replace(dropout=0.3, client_fraction=0.75, lr=0.01)
    p64 = load_model(run(cfg.replace(precision="float64"), engine="sequential", device="cuda",
                         root=tmp_path / "64", progress=False), tmp_path / "64")[1]
    seq = load_model(run(cfg, engine="sequential", device="cuda", root=tmp_path / "s", progress=False),
                     tmp_path / "s")[1]
    vec = load_model(run(cfg, engine="vectorized", device="cuda", root=tmp_path / "v", progress=False),
                     tmp_path / "v")[1]
    own = _max_diff(p64, seq)
    assert _max_diff(p64, vec) <= 4 * own + 1e-7


def test_same_seed_same_result_on_one_gpu(tmp_path):
    cfg = _config("moon_dpap")
    a = run(cfg, device="cuda", root=tmp_path / "a", progress=False)
    b = run(cfg, device="cuda", root=tmp_path / "b", progress=False)
    pa, pb = load_model(a, tmp_path / "a")[1], load_model(b, tmp_path / "b")[1]
    assert all(torch.equal(pa[k], pb[k]) for k in pa)
    assert [h["test_acc"] for h in a.history] == [h["test_acc"] for h in b.history]


@pytest.mark.parametrize("graphs", [False, True])
def test_run_batch_on_cuda_equals_each_run_alone(tmp_path, restore_kernels, graphs):
    from fedlib.kernels import set_kernel_options

    set_kernel_options(cuda_graphs=graphs)
    base = _config("scaffold", precision="float64")
    cfgs = [base, base.replace(seed=1), base.replace(seed=2, lr=0.03)]
    batch = run_many(cfgs, engine="vectorized", device="cuda", root=tmp_path / "b", progress=False)
    for c, r in zip(cfgs, batch, strict=True):
        alone = run(c, engine="sequential", device="cpu", root=tmp_path / "a", progress=False)
        assert _max_diff(load_model(alone, tmp_path / "a")[1], load_model(r, tmp_path / "b")[1]) < ATOL64


def test_client_states_and_server_state_live_on_the_gpu():
    from fedlib.engine import Executor
    from fedlib.experiment import Experiment

    for case in ("scaffold", "ditto", "dp_fedavg", "moon_dpap"):
        exp = Experiment(_config(case), CUDA)
        with Executor("vectorized", exp.algo, exp.data.x_train, exp.data.y_train) as ex:
            exp.round(0, ex)
        for t in leaves((exp.gparams, exp.server_state, exp.client_states)):
            assert t.device.type == "cuda", case


def test_attacks_on_cuda():
    import torch.nn.functional as F

    from fedlib.attacks.inversion import DLGNet, dlg_attack, target_gradient
    from fedlib.attacks.membership import loss_threshold_attack, per_sample_losses
    from fedlib.data import load
    from fedlib.models import build_model

    ds = load("mnist", train_samples=64, test_samples=64, seed=0, device=CUDA)
    model = build_model("cnn").to(CUDA)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for _ in range(5):
        opt.zero_grad()
        F.cross_entropy(model(ds.x_train), ds.y_train).backward()
        opt.step()
    params = dict(model.named_parameters())
    res = loss_threshold_attack(per_sample_losses(model, params, ds.x_train, ds.y_train),
                                per_sample_losses(model, params, ds.x_test, ds.y_test), n_boot=10)
    assert 0 <= res.auc <= 1
    net = DLGNet().to(CUDA)
    x = (ds.x_train[:1] * 0.3081 + 0.1307).clamp(0, 1)
    g = target_gradient(net, x, ds.y_train[:1])
    rec = dlg_attack(net, g, tuple(x.shape), x, steps=2)
    assert rec.image.device.type == "cuda" and np.isfinite(rec.mse)


def test_bench_and_cli_on_cuda(tmp_path):
    env_cmd = [sys.executable, "-m", "lab.bench", "--samples", "400", "--clients", "4",
               "--rounds", "1", "--batch-runs", "1", "2", "--no-scale", "--json", "--device", "cuda"]
    out = subprocess.run(env_cmd, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["device"].startswith("cuda") and res["vectorized_s"] > 0
    cli = subprocess.run([sys.executable, "-m", "fedlib", "run", "--clients", "4", "--train-samples", "320",
                          "--test-samples", "100", "--rounds", "1", "--device", "cuda", "--json",
                          "--no-progress"], capture_output=True, text=True, timeout=600,
                         env={**__import__("os").environ, "FEDLIB_RESULTS_DIR": str(tmp_path)})
    assert cli.returncode == 0, cli.stderr[-2000:]
    assert json.loads(cli.stdout.strip().splitlines()[-1])["device"].startswith("cuda")


def test_cuda_results_record_their_kernel_settings(tmp_path):
    r = run(SMALL, device="cuda", root=tmp_path, progress=False)
    # pick_device's defaults: deterministic cuDNN, no autotuning, float32 convolutions (issue 64) and
    # matmuls (TF32 matmuls off, as PyTorch leaves them)
    assert r.meta["kernels"]["cudnn_deterministic"] is True and r.meta["kernels"]["cudnn_benchmark"] is False
    assert r.meta["kernels"]["cudnn_tf32"] is False and r.meta["kernels"]["matmul_tf32"] is False
    assert r.meta["kernels"] == json.loads(r.path.read_text())["meta"]["kernels"]


def test_bench_speed_options_on_cuda(tmp_path):
    cmd = [sys.executable, "-m", "lab.bench", "--samples", "400", "--clients", "4", "--rounds", "1",
           "--batch-runs", "1", "--no-scale", "--json", "--device", "cuda", "--matmul-tf32",
           "--cudnn-autotune", "--save"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                         env={**__import__("os").environ, "FEDLIB_BENCH_DIR": str(tmp_path)})
    assert out.returncode == 0, out.stderr[-2000:]
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["kernels"]["matmul_tf32"] is True and res["kernels"]["cudnn_benchmark"] is True
    assert res["kernels"]["cudnn_deterministic"] is True  # autotuning among deterministic algorithms
    (saved,) = (tmp_path / "options").glob("cuda-*-cudnn-autotune-on-matmul-tf32-on.json")
    assert json.loads(saved.read_text())["provenance"]["kernels"] == res["kernels"]
    assert not list(tmp_path.glob("*.json"))  # not where the campaign's estimates read


@pytest.fixture
def cuda_graphs(restore_kernels):
    """The vectorized path replays its step as a CUDA graph (fedlib.graphs) during the test."""
    from fedlib.kernels import set_kernel_options

    set_kernel_options(cuda_graphs=True)


@pytest.mark.parametrize("case", ["fedavg", "scaffold", "moon", "moon_dpap", "moon_dpap_record",
                                  "moon_dpap_ghost", "ldp_fl"])
def test_cuda_graphs_equal_cpu_sequential_in_float64(tmp_path, cuda_graphs, case):
    """The replayed step computes the eager step's function: in float64 it agrees with the CPU
    reference to rounding, as the eager vectorized path does (client switches, inactive lanes,
    client states, dropout, central, record-level and local DP). Record-level DP-SGD's noise and the
    local-DP randomisers are drawn by generators on the run's device (fedlib.privacy.noise), so a GPU
    draws other values than a CPU: their reference is the sequential path on the GPU (eager, the
    per-sample clip)."""
    reference_device = "cuda" if case == "ldp_fl" else "cpu"  # local-DP draws on the device, too
    if case in ("moon_dpap_record", "moon_dpap_ghost"):
        cfg = SMALL.replace(algorithm="moon_dpap", dp="record", dp_epsilon_total=50.0, dp_schedule="constant",
                            dropout=0.2, precision="float64")
        reference_device = "cuda"
    else:
        cfg = _config(case, precision="float64")
    cpu = run(cfg, engine="sequential", device=reference_device, root=tmp_path / "cpu", progress=False)
    assert cpu.meta["engine"] == "sequential" and cpu.meta["device"].startswith(reference_device)
    if case == "moon_dpap_ghost":  # ghost clipping on the GPU against the per-sample path on the CPU
        cfg = cfg.replace(dp_grad="ghost")
    gpu = run(cfg, engine="vectorized", device="cuda", root=tmp_path / "gpu", progress=False)
    assert gpu.meta["kernels"]["cuda_graphs"] is True
    assert _max_diff(load_model(cpu, tmp_path / "cpu")[1], load_model(gpu, tmp_path / "gpu")[1]) < ATOL64


def test_cuda_graphs_float32_reproducible_and_within_the_reference_error(tmp_path, cuda_graphs):
    """In float32 a replayed run repeats itself bit for bit on one GPU, and is no further from the
    float64 result than the eager vectorized path may be (the bound of
    test_cuda_float32_paths_agree_within_the_reference_error)."""
    from fedlib.kernels import set_kernel_options

    cfg = SMALL.replace(dropout=0.3, client_fraction=0.75, lr=0.01)
    a = load_model(run(cfg, engine="vectorized", device="cuda", root=tmp_path / "a", progress=False),
                   tmp_path / "a")[1]
    b = load_model(run(cfg, engine="vectorized", device="cuda", root=tmp_path / "b", progress=False),
                   tmp_path / "b")[1]
    assert all(torch.equal(a[k], b[k]) for k in a)
    set_kernel_options(cuda_graphs=False)
    p64 = load_model(run(cfg.replace(precision="float64"), engine="sequential", device="cuda",
                         root=tmp_path / "64", progress=False), tmp_path / "64")[1]
    seq = load_model(run(cfg, engine="sequential", device="cuda", root=tmp_path / "s", progress=False),
                     tmp_path / "s")[1]
    assert _max_diff(p64, a) <= 4 * _max_diff(p64, seq) + 1e-7


def test_bench_with_cuda_graphs(tmp_path):
    cmd = [sys.executable, "-m", "lab.bench", "--samples", "400", "--clients", "4", "--rounds", "1",
           "--batch-runs", "1", "2", "--no-scale", "--json", "--device", "cuda", "--cuda-graphs"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["kernels"]["cuda_graphs"] is True and res["vectorized_s"] > 0


def test_local_dp_draws_happen_on_the_gpu_with_their_distributions():
    """A generator keyed for a GPU draws there (no host round trip per client), reproducibly, and its
    draws have the mechanisms' distributions: KS tests at a fixed seed (false-failure rate 1e-3 each
    for a correct sampler), and float64 uniforms with 53-bit resolution (2^20 Gumbel draws: a repeat
    is expected 6e-5 times from 53-bit uniforms, about 128 times from 32-bit ones)."""
    from scipy import stats

    from fedlib.privacy import local
    from fedlib.privacy.noise import gaussian_noise_like, generator_for, laplace_noise_like

    g = generator_for(5, 6, device="cuda")
    assert g.device.type == "cuda"
    lap = laplace_noise_like({"w": torch.zeros(100_000, device=CUDA)}, 0.7, g)["w"]
    gau = gaussian_noise_like({"w": torch.zeros(100_000, device=CUDA)}, 0.7, g)["w"]
    gum = local.gumbel((2**20,), generator_for(7, device="cuda"), CUDA)
    assert lap.device.type == gau.device.type == gum.device.type == "cuda"
    assert stats.kstest(lap[:5000].double().cpu().numpy(), "laplace", args=(0, 0.7)).pvalue > 1e-3
    assert stats.kstest(gau[:5000].double().cpu().numpy(), "norm", args=(0, 0.7)).pvalue > 1e-3
    assert stats.kstest(gum[:5000].cpu().numpy(), stats.gumbel_r.cdf).pvalue > 1e-3
    assert gum.dtype == torch.float64 and torch.isfinite(gum).all() and gum.unique().numel() >= 2**20 - 2
    again = local.gumbel((2**20,), generator_for(7, device="cuda"), CUDA)
    assert torch.equal(gum, again)  # the same key, the same draws on one GPU
    w = torch.full((200_000, 1), 0.004, device=CUDA)
    out = local.two_point(w, 0.0, 0.01, 0.5, generator_for(8, device="cuda"))
    level = 0.01 * (math.e**0.5 + 1) / (math.e**0.5 - 1)
    assert out.device.type == "cuda" and abs(float(out.double().mean()) - 0.004) < 5 * level / math.sqrt(2e5)


@pytest.mark.parametrize("case", ["fdl", "fdl_corrected", "ldp_fl"])
def test_local_dp_runs_repeat_on_one_gpu(tmp_path, case):
    """Device draws keyed by (run, client, round, purpose): the same config trains the same model
    twice on one GPU (sequential and vectorized paths alike)."""
    cfg = _config(case, precision="float64")
    a = run(cfg, engine="vectorized", device="cuda", root=tmp_path / "a", progress=False)
    b = run(cfg, engine="sequential", device="cuda", root=tmp_path / "b", progress=False)
    assert _max_diff(load_model(a, tmp_path / "a")[1], load_model(b, tmp_path / "b")[1]) < ATOL64


@pytest.mark.parametrize("graphs", [False, True])
def test_im2col_lanes_equal_cpu_sequential_in_float64(tmp_path, restore_kernels, graphs):
    """The vectorized path with its convolutions as batched matrix multiplies (``lane_conv="im2col"``),
    eager and captured, trains the CPU reference's model (client switches and dropout included)."""
    from fedlib.kernels import set_kernel_options

    cfg = _config("moon", precision="float64")
    cpu = run(cfg, engine="sequential", device="cpu", root=tmp_path / "cpu", progress=False)
    set_kernel_options(lane_conv="im2col", cuda_graphs=graphs)
    gpu = run(cfg, engine="vectorized", device="cuda", root=tmp_path / "gpu", progress=False)
    assert gpu.meta["kernels"]["lane_conv"] == "im2col" and gpu.meta["kernels"]["cuda_graphs"] is graphs
    assert _max_diff(load_model(cpu, tmp_path / "cpu")[1], load_model(gpu, tmp_path / "gpu")[1]) < ATOL64


def test_philox_words_and_normals_on_the_gpu_equal_the_cpus():
    """The counter-based generator is integer arithmetic: the GPU computes the CPU's words bit for
    bit (Random123's known answers included) and the same normals up to the last bits of float64
    log/cos/sin (1e-13 absolute at |z| <= 8.6)."""
    from fedlib.privacy.philox import gaussians, philox4x32

    words = [torch.tensor([0x243F6A88, 0xFFFFFFFF]), torch.tensor([0x85A308D3, 0xFFFFFFFF]),
             torch.tensor([0x13198A2E, 0xFFFFFFFF]), torch.tensor([0x03707344, 0xFFFFFFFF])]
    key = [torch.tensor([0xA4093822, 0xFFFFFFFF]), torch.tensor([0x299F31D0, 0xFFFFFFFF])]
    gpu = philox4x32(tuple(w.to(CUDA) for w in words), tuple(k.to(CUDA) for k in key))
    assert [int(w[0]) for w in gpu] == [0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1]
    cpu = philox4x32(tuple(words), tuple(key))
    assert all(torch.equal(g.cpu(), c) for g, c in zip(gpu, cpu, strict=True))
    k = torch.tensor([[1, 2], [3, 4]])
    s = torch.tensor([[5, 6], [7, 8]])
    z_cpu = gaussians(k, s, 100_001, torch.float64)
    z_gpu = gaussians(k.to(CUDA), s.to(CUDA), 100_001, torch.float64)
    assert float((z_gpu.cpu() - z_cpu).abs().max()) < 1e-13


@pytest.mark.parametrize("graphs", [False, True])
def test_counter_step_noise_on_the_gpu_trains_the_cpus_model_in_float64(tmp_path, restore_kernels, graphs):
    """With ``step_noise="counter"`` record-level DP-SGD adds the same noise on every device, so the
    GPU's vectorized run (eager and captured, every lane's noise in one draw) trains the CPU
    sequential reference's model to float64 rounding, not just its own GPU reference's."""
    from fedlib.kernels import set_kernel_options

    set_kernel_options(step_noise="counter", cuda_graphs=graphs)
    cfg = SMALL.replace(algorithm="moon_dpap", dp="record", dp_epsilon_total=50.0, dp_schedule="constant",
                        dropout=0.2, precision="float64")
    cpu = run(cfg, engine="sequential", device="cpu", root=tmp_path / "cpu", progress=False)
    gpu = run(cfg, engine="vectorized", device="cuda", root=tmp_path / "gpu", progress=False)
    assert gpu.meta["kernels"]["step_noise"] == "counter" and cpu.meta["kernels"] == {"step_noise": "counter"}
    assert _max_diff(load_model(cpu, tmp_path / "cpu")[1], load_model(gpu, tmp_path / "gpu")[1]) < ATOL64


def test_server_noise_drawn_ahead_on_cuda_changes_nothing(tmp_path, restore_kernels):
    """On CUDA the server's discrete Gaussian is drawn ahead by default, in a worker thread while the
    clients train: the run equals the same run with it off (float64: any other noise would differ by
    its scale, far above rounding)."""
    from fedlib.kernels import noise_ahead, set_kernel_options

    assert noise_ahead(CUDA)
    cfg = _config("moon_dpap", rounds=3, precision="float64")
    ahead = run(cfg, engine="vectorized", device="cuda", root=tmp_path / "ahead", progress=False)
    set_kernel_options(noise_ahead="off")
    inline = run(cfg, engine="vectorized", device="cuda", root=tmp_path / "inline", progress=False)
    assert ahead.meta["kernels"]["noise_ahead"] == "auto"
    assert inline.meta["kernels"]["noise_ahead"] == "off"
    models = load_model(ahead, tmp_path / "ahead")[1], load_model(inline, tmp_path / "inline")[1]
    assert _max_diff(*models) < ATOL64

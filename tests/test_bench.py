"""``python -m lab.bench --json`` prints the keys issue 7 asks for (values not judged:
speed is measured by the benchmark, never asserted in a test)."""

import json

import pytest
import torch

from fedlib.config import Config
from fedlib.experiment import Experiment
from fedlib.kernels import kernel_settings, set_kernel_options
from fedlib.results import provenance
from lab import bench
from lab.campaign import bench_seconds_per_sample

KEYS = {"device", "model", "clients", "samples", "floor_s", "sequential_s", "vectorized_s", "eval_s",
        "default_s", "overhead_sequential", "speedup_vectorized", "default_vs_floor", "rounds_per_s",
        "peak_mem_mb", "moon_s", "scaffold_s", "moon_dpap_dp_s", "default_bf16_s",
        "moon_dpap_state_mb_1000", "run_batch_runs_per_s", "default_gflops", "matmul_peak_gflops",
        "default_percent_of_peak", "train_mflop_per_sample", "operators_per_step", "operators_exclude_views",
        "record_dp_step", "server_noise"}
#: What the cores can give: measured on a CPU only.
CPU_KEYS = {"floor_1thread_s", "plain_parallel_s", "plain_parallel_vs_floor",
            "plain_parallel_percent_of_peak", "matmul_peak_1thread_gflops", "floor_1thread_percent_of_peak"}


@pytest.mark.e2e
def test_bench_json_line_has_every_key(capsys):
    assert bench.main(["--samples", "400", "--clients", "4", "--rounds", "1", "--batch-runs", "1", "2",
                       "--no-scale", "--json"]) == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    keys = KEYS | (CPU_KEYS if res["device"].startswith("cpu") else set())
    assert keys <= set(res)
    assert res["clients"] == 4 and res["samples"] == 400
    assert res["overhead_sequential"] == res["sequential_s"] / res["floor_s"]
    if "plain_parallel_s" in res:
        assert res["plain_parallel_vs_floor"] == res["plain_parallel_s"] / res["floor_s"]
        assert res["plain_parallel_percent_of_peak"] == pytest.approx(
            res["default_percent_of_peak"] * res["default_s"] / res["plain_parallel_s"])
    assert all(res[k] > 0 for k in keys if k.endswith("_s") and k != "run_batch_runs_per_s")
    assert set(res["run_batch_runs_per_s"]) == {"1", "2"} and min(res["run_batch_runs_per_s"].values()) > 0
    gflops, peak = res["default_gflops"], res["matmul_peak_gflops"]
    measured = res["matmul_peak_gflops_measured"]  # start, (on a CPU: cores x one thread), end
    assert len(measured) == (3 if "floor_1thread_s" in res else 2) and peak == max(measured)
    assert res["default_percent_of_peak"] == pytest.approx(100 * gflops / peak)
    if "floor_1thread_s" in res:  # cores x one thread's peak; the one-thread step against that thread's
        assert measured[1] == pytest.approx(res["plain_parallel_workers"] * res["matmul_peak_1thread_gflops"])
        assert res["floor_1thread_percent_of_peak"] == pytest.approx(
            400 * res["train_mflop_per_sample"] / 1e3 / res["floor_1thread_s"]
            / res["matmul_peak_1thread_gflops"] * 100)
    assert gflops == pytest.approx(400 * res["train_mflop_per_sample"] / 1e3 / res["default_s"])


def test_server_noise_times_one_rounds_discrete_gaussian_over_the_whole_model():
    """The host's central-noise cost covers every coordinate of MOON-DPAP's model, on one thread and
    per round through the worker processes and threads that draw ahead (times positive, not judged)."""
    from fedlib.privacy.central import noise_workers

    cfg = Config(model="mlp", clients=2, train_samples=100, test_samples=50)
    exp = Experiment(cfg.replace(algorithm="moon_dpap"), torch.device("cpu"))
    out = bench.server_noise(cfg, per_worker=1)
    assert out["coordinates"] == sum(v.numel() for v in exp.gparams.values())
    assert out["workers"] == noise_workers("processes") and out["thread_workers"] == noise_workers("threads")
    assert out["one_s"] > 0 and out["ahead_s"] > 0 and out["ahead_threads_s"] > 0


def test_record_cost_times_only_the_three_moon_dpap_rounds(capsys):
    """``--record-cost`` reports MOON-DPAP's round without DP, with per-sample DP-SGD and with ghost
    clipping and their ratios (the campaign's cost factors), and refuses ``--save`` before any work."""
    with pytest.raises(SystemExit):
        bench.main(["--record-cost", "--save"])
    assert "not saved" in capsys.readouterr().err
    assert bench.main(["--record-cost", "--samples", "160", "--clients", "2", "--rounds", "1", "--json"]) == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    # ("kernels": the device options in force, as every benchmark result records them when set)
    assert set(res) - {"kernels"} == {"device", "samples", "clients", "path", "moon_dpap_s",
                                      "moon_dpap_record_s", "moon_dpap_ghost_s", "record_dp_cost",
                                      "ghost_dp_cost"}
    assert res["record_dp_cost"] == res["moon_dpap_record_s"] / res["moon_dpap_s"]
    assert res["ghost_dp_cost"] == res["moon_dpap_ghost_s"] / res["moon_dpap_s"]
    assert min(res[k] for k in res if k.endswith("_s")) > 0


def test_ratios_of_paths_that_were_not_timed_are_none():
    """``--paths vectorized`` times no sequential round: its ratios are None, not a KeyError after the
    timing (which a GPU session once paid for)."""
    assert bench.path_ratios({"floor_s": 2.0, "vectorized_s": 0.5}) == {
        "overhead_sequential": None, "speedup_vectorized": None}
    assert bench.path_ratios({"floor_s": 2.0, "sequential_s": 3.0, "vectorized_s": 0.5}) == {
        "overhead_sequential": 1.5, "speedup_vectorized": 6.0}


def test_batch_round_cost_is_runs_times_one_runs_rate_over_the_batchs():
    """A batch whose rate grows with its runs (launch-bound: the runs share the step) costs about one
    round; one whose rate stays flat costs ``R`` rounds; a benchmark without a single-run timing (or
    without the key) gives nothing rather than a ratio to a missing base."""
    shared = bench.batch_round_cost({"run_batch_runs_per_s": {"1": 2.0, "3": 6.0, "8": 16.0}})
    assert shared == pytest.approx({1: 1.0, 3: 1.0, 8: 1.0})
    flat = bench.batch_round_cost({"run_batch_runs_per_s": {"1": 2.0, "3": 2.0, "8": 2.0}})
    assert flat == pytest.approx({1: 1.0, 3: 3.0, 8: 8.0})
    assert bench.batch_round_cost({"run_batch_runs_per_s": {"1": 11.5, "8": 19.7}})[8] == pytest.approx(
        8 * 11.5 / 19.7)
    assert bench.batch_round_cost({"run_batch_runs_per_s": {"3": 6.0}}) == {}
    assert bench.batch_round_cost({}) == {}


def test_percent_of_peak_reproduces_each_committed_benchmarks_own_figure():
    """:func:`lab.bench.percent_of_peak` applied to a committed benchmark's default round gives the
    ``default_percent_of_peak`` that run computed from its own FLOP count and peak (so the book may
    apply it to the plain loop's time in results saved before the key existed)."""
    from fedlib.results import REPO_ROOT

    checked = 0
    for f in sorted((REPO_ROOT / "data" / "bench").glob("*.json")):
        r = json.loads(f.read_text())["results"]
        if "default_percent_of_peak" in r:
            assert bench.percent_of_peak(r, r["default_s"]) == pytest.approx(r["default_percent_of_peak"],
                                                                             rel=1e-12), f.name
            checked += 1
    assert checked >= 1


def test_flops_are_counted_from_the_step_and_scaled_by_the_plan():
    """The CNN's step (batch 32) is 1.09 GFLOP forward and backward: the first convolution needs no
    input gradient, so training costs a little under three forward passes; MOON adds two forward
    passes (the global and the previous model); the plan scales it."""
    from fedlib.flops import per_sample_flops, training_flops

    cnn = Config(model="cnn", batch_size=32, clients=20, rounds=200, test_samples=0)
    train, ev = per_sample_flops(cnn)
    assert 32 * train / 1e9 == pytest.approx(1.09, abs=0.01)
    assert 2.5 * ev < train < 3 * ev
    moon, _ = per_sample_flops(cnn.replace(algorithm="moon"))
    assert moon == pytest.approx(train + 2 * ev, rel=0.01)
    total = training_flops(cnn)
    assert total == pytest.approx(200 * (60_000 * train + 10_000 * ev))
    assert training_flops(cnn.replace(client_fraction=0.5, local_epochs=2)) == pytest.approx(total)
    # a linear layer by hand: 2 FLOP per multiply-add, forward; backward twice that (input and weight)
    mlp_train, mlp_eval = per_sample_flops(Config(model="mlp", batch_size=10))
    assert mlp_eval == 2 * (784 * 100 + 100 * 10)
    assert mlp_train == 3 * mlp_eval - 2 * 784 * 100  # the first layer needs no input gradient


def test_client_state_size_is_the_stacked_state_of_the_engine():
    cfg = Config(algorithm="moon", clients=3, train_samples=300, test_samples=100, partition="iid")
    exp = Experiment(cfg, torch.device("cpu"))
    stored = sum(t.numel() * t.element_size() for t in exp.client_states["prev"].values()) / 2**20
    assert bench.client_state_mb(cfg, 3) == stored


def test_matmul_peak_on_one_thread_restores_the_thread_count():
    before = torch.get_num_threads()
    assert bench.matmul_peak_flops(torch.device("cpu"), seconds=0.05, threads=1) > 0
    assert torch.get_num_threads() == before


@pytest.mark.e2e  # a whole make-bench scale run (~15 s): make test-full
def test_scale_figures_and_saved_provenance(tmp_path):
    cfg = Config(clients=4, train_samples=240, test_samples=100, rounds=2, partition="iid")
    tiny_paper = dict(bench.PAPER_SCALE, train_samples=240, test_samples=100, clients=4)
    out = bench.scale_figures(cfg, torch.device("cpu"), rounds=1, clients=(4, 8), paper_scale=tiny_paper)
    for k in ("round_s_4_clients", "round_s_8_clients", "paper_fedavg_run_s", "paper_fedavg_run_s_batched3",
              "paper_moon_dpap_dp_run_s", "paper_moon_dpap_dp_run_s_batched3", "moon_dpap_s",
              "moon_dpap_record_s"):
        assert out[k] > 0
    assert out["record_dp_cost"] == out["moon_dpap_record_s"] / out["moon_dpap_s"]
    assert out["ghost_dp_cost"] == out["moon_dpap_ghost_s"] / out["moon_dpap_s"]
    path = bench.save(out, torch.device("cpu"), tmp_path)
    saved = json.loads(path.read_text())
    assert saved["results"] == out
    for k in ("device", "cpu", "git_commit", "torch", "python"):
        assert k in saved["provenance"]


def test_kernel_options_change_the_settings_a_result_records(restore_kernels):
    before = kernel_settings()
    assert set(before) == {"cudnn_deterministic", "cudnn_benchmark", "cudnn_tf32", "matmul_tf32",
                           "cuda_graphs", "cuda_graphs_fell_back", "lane_conv", "step_noise",
                           "noise_ahead", "noise_pool"}
    now = set_kernel_options(matmul_tf32=not before["matmul_tf32"], cudnn_autotune=True)
    assert now == kernel_settings()
    assert now["matmul_tf32"] is (not before["matmul_tf32"]) and now["cudnn_benchmark"] is True
    assert now["cudnn_tf32"] == before["cudnn_tf32"]  # None leaves a setting as it is
    assert torch.backends.cuda.matmul.allow_tf32 is now["matmul_tf32"]
    assert set_kernel_options(cudnn_tf32=False)["cudnn_tf32"] is False
    assert set_kernel_options(cuda_graphs=True)["cuda_graphs"] is True
    assert set_kernel_options(lane_conv="im2col")["lane_conv"] == "im2col"
    name = bench.variant_name({"lane_conv": "im2col", "cuda_graphs": False})
    assert name == "cuda-graphs-off-lane-conv-im2col"


def test_a_cpu_result_records_lane_conv_and_step_noise_only_when_not_the_default(restore_kernels):
    from fedlib.results import provenance

    assert "kernels" not in provenance(torch.device("cpu"), "vectorized")
    set_kernel_options(lane_conv="im2col")
    assert provenance(torch.device("cpu"), "vectorized")["kernels"] == {"lane_conv": "im2col"}
    set_kernel_options(lane_conv="grouped", step_noise="counter")
    assert provenance(torch.device("cpu"), "vectorized")["kernels"] == {"step_noise": "counter"}
    with pytest.raises(ValueError, match="step_noise"):
        set_kernel_options(step_noise="philox")
    with pytest.raises(ValueError, match="host_memory"):  # checked before anything is set
        set_kernel_options(lane_conv="im2col", host_memory="swap")
    assert kernel_settings()["lane_conv"] == "grouped"


def test_kernel_options_are_refused_on_a_cpu_before_any_work(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FEDLIB_BENCH_DIR", str(tmp_path))
    monkeypatch.setattr(bench, "benchmark", lambda *a, **k: pytest.fail("the benchmark ran"))
    with pytest.raises(SystemExit) as exc:
        bench.main(["--device", "cpu", "--matmul-tf32", "--no-cudnn-autotune", "--save"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--matmul-tf32, --cudnn-autotune: CUDA kernel options" in err and "cpu" in err
    assert not list(tmp_path.iterdir())


def test_cpu_results_record_no_kernel_settings():
    assert "kernels" not in provenance(torch.device("cpu"), "sequential")


def test_a_benchmark_with_options_is_kept_apart_from_the_estimates(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDLIB_BENCH_DIR", str(tmp_path))
    cpu = torch.device("cpu")
    assert bench.variant_name({}) == ""
    variant = bench.variant_name({"matmul_tf32": True, "cudnn_autotune": False})
    assert variant == "cudnn-autotune-off-matmul-tf32-on"
    default = bench.save({"default_s": 2.0, "samples": 100}, cpu)
    other = bench.save({"default_s": 1.0, "samples": 100}, cpu, variant=variant)
    assert other.parent == tmp_path / "options" and other.name.endswith(f"-{variant}.json")
    assert default.parent == tmp_path
    per_sample, name = bench_seconds_per_sample("cpu")
    assert (per_sample, name) == (2.0 / 100, default.name)


def test_the_kernel_profile_ranks_a_rounds_operators_and_is_saved_apart(tmp_path, monkeypatch, capsys):
    """``--kernel-profile`` profiles a run batch's rounds operator by operator: the operators come
    sorted by their time, their shares of the total are fractions that sum to at most 1, the
    convolutions of the CNN are among them, and the file lands under ``profile/``, where neither the
    estimates nor the speed options' table read. The CPU's parallel path is profiled as its workers'
    own loop, since the workers are other processes."""
    cpu = torch.device("cpu")
    assert bench.profile_path(cpu) == "sequential"
    assert bench.profile_path(cpu, ("vectorized",)) == "vectorized"
    monkeypatch.setenv("FEDLIB_BENCH_DIR", str(tmp_path))
    bench.main(["--device", "cpu", "--kernel-profile", "--samples", "160", "--clients", "2", "--rounds", "1",
                "--batch-runs", "2", "--paths", "vectorized", "--save", "--json"])
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["kernel_profile"]
    assert (res["path"], res["runs"], res["rounds"], res["timed"]) == ("vectorized", 2, 1, "cpu")
    times = [o["s_per_round"] for o in res["ops"]]
    assert times == sorted(times, reverse=True) and times[-1] > 0
    assert all(0 < o["share"] <= 1 and o["calls_per_round"] > 0 for o in res["ops"])
    assert sum(o["share"] for o in res["ops"]) <= 1 + 1e-9
    assert sum(times) <= res["timed_s_per_round"] * (1 + 1e-9)
    assert any("convolution" in o["name"] for o in res["ops"]) and "kernels" not in res
    (saved,) = tmp_path.rglob("*.json")
    assert saved.parent == tmp_path / "profile" and saved.name.endswith("-kernel-profile.json")
    assert json.loads(saved.read_text())["results"]["kernel_profile"]["ops"] == res["ops"]


def test_the_benchmarks_parts_are_refused_together_before_any_work(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FEDLIB_BENCH_DIR", str(tmp_path))
    monkeypatch.setattr(bench, "kernel_profile", lambda *a, **k: pytest.fail("the profile ran"))
    with pytest.raises(SystemExit) as exc:
        bench.main(["--device", "cpu", "--kernel-profile", "--options-sweep"])
    assert exc.value.code == 2
    assert "--options-sweep and --kernel-profile each time a part" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


RECORD_DP = dict(algorithm="moon_dpap", dp="record", dp_epsilon_per_round=1.0, dp_clip=0.5)


@pytest.mark.parametrize("changes", [dict(), dict(algorithm="ldp_fl"), dict(algorithm="fdl"),
                                     dict(algorithm="moon_dpap", dp="central", dp_epsilon_per_round=1.0,
                                          dp_clip=0.5), RECORD_DP, dict(RECORD_DP, dp_grad="ghost")],
                         ids=["fedavg", "ldp_fl", "fdl", "moon_dpap_central", "record", "record_ghost"])
def test_a_vectorized_step_dispatches_as_many_operators_for_2_and_64_lanes_and_1_and_8_runs(
        changes, restore_kernels):
    """Issue 37 item 1: the step's computing operators (views excluded: they launch nothing) do not
    grow with the lanes nor with the runs of a run batch, for every algorithm family. Record-level
    DP-SGD with its noise drawn by Philox for all lanes at once (``step_noise="counter"``); with a
    generator per (client, step), the default that keeps the committed results' streams, its count
    grows with the lanes (checked too, so that this test sees a per-lane draw)."""
    from fedlib.flops import operators_per_step
    from fedlib.kernels import set_kernel_options

    config = Config(model="mlp", batch_size=8, **changes)
    if config.dp == "record":
        assert operators_per_step(config, 2) < operators_per_step(config, 8)  # generator: per lane
        set_kernel_options(step_noise="counter")
    two = operators_per_step(config, 2)
    assert two > 0 and two == operators_per_step(config, 64) == operators_per_step(config, 2, runs=8)
    assert two == operators_per_step(config, 2, runs=1)


def test_moon_dpaps_cnn_step_does_not_grow_with_the_runs_of_a_run_batch():
    """With the CNN, a run batch (2 runs or more) computes MOON's frozen global-model pass with each
    lane's own run's weights (a grouped convolution: 4 more operators than one run's shared weights,
    measured), and from then on the count is the same whatever the runs."""
    from fedlib.flops import operators_per_step

    config = Config(model="cnn", batch_size=8, algorithm="moon_dpap", dp="central", dp_epsilon_per_round=1.0,
                    dp_clip=0.5)
    assert operators_per_step(config, 2, runs=2) == operators_per_step(config, 2, runs=8)


def test_the_record_level_step_is_timed_beside_opacus_and_agrees_with_its_ghost_clipping():
    """make bench times the DP-SGD step every way in one run (no speed asserted here); fedlib's ghost
    sum equals Opacus' ghost clipping to float32 rounding (sums of 8 per-sample terms over 3,200
    inputs: ~1e-6 relative measured; 1e-4 leaves two orders of magnitude for other CPUs)."""
    out = bench.record_dp_step("cnn", batch=8, repeats=1)
    assert {"plain_ms", "per_sample_x", "ghost_x", "opacus_hooks_x", "opacus_ghost_x"} <= set(out)
    assert all(out[k] > 0 for k in ("per_sample_x", "ghost_x", "opacus_hooks_x", "opacus_ghost_x"))
    assert out["ghost_vs_opacus_rel"] < 1e-4


def test_the_peak_is_the_highest_of_the_rates_measured_in_the_run(monkeypatch):
    """A CPU's matmul rate drifts between hours: the percentage of peak divides by the higher of
    the rate measured at the run's start and after its paths, never the lower."""
    monkeypatch.setattr(bench, "matmul_peak_flops", lambda device: 100e9)
    config = Config(dataset="fashionmnist", model="cnn", clients=2, train_samples=100)
    for earlier, peak in ((300e9, 300), (50e9, 100)):
        res = bench.flop_rates(config, torch.device("cpu"), 1.0, (earlier,))
        assert res["matmul_peak_gflops"] == peak
        assert sorted(res["matmul_peak_gflops_measured"]) == sorted([earlier / 1e9, 100])
        assert res["default_percent_of_peak"] == pytest.approx(100 * res["default_gflops"] / peak)


def test_the_options_sweep_times_each_variant_and_restores_the_settings(capsys, tmp_path, monkeypatch,
                                                                       restore_kernels):
    """``--options-sweep`` (issue 38, step 1 on a lent GPU) times the default path under each speed
    option the device has (on a CPU: the im2col convolutions only), interleaved, names the fastest,
    leaves the settings as they were, and saves under ``options/`` apart from the campaign's files."""
    before = kernel_settings()
    seen = []
    real = bench.time_run_batch
    monkeypatch.setattr(bench, "time_run_batch", lambda *a, **k: seen.append(kernel_settings()["lane_conv"])
                        or real(*a, **k))
    monkeypatch.setenv("FEDLIB_BENCH_DIR", str(tmp_path))
    with pytest.raises(SystemExit):
        bench.main(["--options-sweep", "--record-cost"])
    assert bench.main(["--options-sweep", "--samples", "160", "--clients", "2", "--rounds", "1",
                       "--batch-runs", "2", "--json", "--save"]) == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["options_sweep"]
    assert set(res["s_per_run_round"]) == {"default", "lane_conv=im2col"} and res["runs"] == 2
    assert res["vs_default"]["default"] == 1.0 and res["fastest"] in res["s_per_run_round"]
    assert seen == ["grouped", "im2col"] * 2  # interleaved, two repeats
    assert kernel_settings() == before
    [saved] = (tmp_path / "options").glob("cpu-*-options-sweep.json")
    assert not list(tmp_path.glob("*.json"))  # the campaign's estimates never read it
    set_kernel_options(lane_conv="im2col")  # a sweep restores what was set, not the defaults
    bench.options_sweep(Config(train_samples=160, clients=2, test_samples=100, rounds=2).validate(),
                        torch.device("cpu"), rounds=1, repeats=1)
    assert kernel_settings()["lane_conv"] == "im2col"


def test_the_first_cuda_run_turns_tf32_convolutions_off_unless_they_were_chosen(restore_kernels,
                                                                                 monkeypatch):
    """fedlib computes in float32 on every device (issue 64: a comparison never mixes TF32 and float32
    runs): the first CUDA run of a process turns off the TF32 that PyTorch leaves on in cuDNN
    convolutions; a setting chosen explicitly (a benchmark's variant) is kept."""
    from fedlib import kernels

    monkeypatch.setattr(kernels, "_CONV_PRECISION_CHOSEN", [])
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    state = (torch.are_deterministic_algorithms_enabled(),
             torch.is_deterministic_algorithms_warn_only_enabled(),
             torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark)
    torch.backends.cudnn.allow_tf32 = True  # PyTorch's own default
    try:
        kernels.make_deterministic()
        assert kernel_settings()["cudnn_tf32"] is False
        set_kernel_options(cudnn_tf32=True)
        kernels.make_deterministic()  # a later run leaves the chosen setting alone
        assert kernel_settings()["cudnn_tf32"] is True
    finally:
        torch.use_deterministic_algorithms(state[0], warn_only=state[1])
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = state[2], state[3]


def test_a_results_arithmetic_comes_from_its_recorded_kernel_settings():
    from fedlib.kernels import arithmetic

    gpu = "cuda:0 (NVIDIA H200)"
    assert arithmetic({"device": "cpu"}) == "float32"
    assert arithmetic({"device": "cpu", "kernels": {"lane_conv": "im2col"}}) == "float32"
    assert arithmetic({"device": gpu, "kernels": {"cudnn_tf32": True, "matmul_tf32": False}}) == "TF32"
    assert arithmetic({"device": gpu, "kernels": {"cudnn_tf32": False, "matmul_tf32": True}}) == "TF32"
    assert arithmetic({"device": gpu, "kernels": {"cudnn_tf32": False, "matmul_tf32": False}}) == "float32"
    assert arithmetic({"device": "cpu"}, precision="float64") == "float64"


def test_a_grouped_convolutions_backward_is_counted_once_per_group():
    """Issue 75: PyTorch's counter counts a grouped convolution's weight gradient as if each group saw
    every channel; fedlib's formula divides it by the groups. The per-sample weight gradients of ghost
    clipping (one grouped convolution, the samples as groups) are counted exactly as the same gradients
    computed sample by sample with ungrouped convolutions under PyTorch's own counter."""
    from torch import nn
    from torch.utils.flop_counter import FlopCounterMode

    from fedlib.flops import flop_counter_mode
    from fedlib.privacy.ghost import _per_sample_conv

    torch.manual_seed(0)
    layer = nn.Conv2d(16, 32, 5)
    a, g = torch.randn(8, 16, 12, 12), torch.randn(8, 32, 8, 8)
    with flop_counter_mode() as grouped:
        together = _per_sample_conv(layer, a, g)
    with FlopCounterMode(display=False) as stock:  # groups = 1: PyTorch's formula holds
        alone = torch.stack([_per_sample_conv(layer, a[b:b + 1], g[b:b + 1])[0] for b in range(8)])
    assert grouped.get_total_flops() == stock.get_total_flops() > 0
    torch.testing.assert_close(together, alone, rtol=1e-4, atol=1e-4)


def test_record_level_flop_counts_what_the_ghost_path_computes():
    """Issue 75: the campaign's FLOP of a record-level run (``training_flops``) is the ghost path's own
    count: one step counted with the per-sample convolutions computed sample by sample (ungrouped, under
    PyTorch's own counter) agrees with it, and a ghost step costs 1.2-1.5 plain steps, not the ~7 the
    uncorrected counter gave."""
    from unittest import mock

    from torch.utils.flop_counter import FlopCounterMode

    from fedlib.flops import _counted, per_sample_flops, probe_config
    from fedlib.privacy import ghost
    from studies.moon_dpap.pages import record_tuned
    from studies.moon_dpap.settings import config_for

    record = record_tuned("paper", 0)
    counted, _ = per_sample_flops(record)
    plain, _ = per_sample_flops(config_for("moon_dpap", "paper", 0))
    assert 1.0 < counted / plain < 1.5

    real = ghost._per_sample_conv

    def one_by_one(layer, a, g):  # the same gradients, each sample its own ungrouped convolution
        return torch.stack([real(layer, a[b:b + 1], g[b:b + 1])[0] for b in range(a.shape[0])])

    stock = lambda: FlopCounterMode(display=False)  # noqa: E731 - PyTorch's counter, uncorrected
    with mock.patch.object(ghost, "_per_sample_conv", one_by_one), \
            mock.patch("fedlib.flops.flop_counter_mode", stock):
        _counted.cache_clear()
        independent, _ = _counted(probe_config(record).validate())
    _counted.cache_clear()
    assert independent == pytest.approx(counted, rel=1e-9)

import os

import pytest
import torch


def threads_for_tests(environ=os.environ) -> int:
    """Tests run on the CPU with a fixed thread count so timings of other work do not change results:
    two, or one under mutation testing. mutmut forks one test process per mutant from a process that
    has already run torch, and a child forked after an OpenMP parallel region deadlocks in its next
    one (GNU OpenMP is not fork-safe): with two threads every mutant hung until its time limit and
    was counted as detected. On one thread there is no parallel region; mutmut runs mutants side by
    side instead."""
    return 1 if "MUTANT_UNDER_TEST" in environ else min(2, os.cpu_count() or 1)


torch.set_num_threads(threads_for_tests())


@pytest.fixture
def restore_kernels():
    """The kernel options (fedlib.kernels) are process-global: put back what was there."""
    from fedlib import kernels
    from fedlib.kernels import kernel_settings, set_kernel_options

    before = kernel_settings()
    chosen = list(kernels._CONV_PRECISION_CHOSEN)
    yield
    set_kernel_options(matmul_tf32=before["matmul_tf32"], cudnn_tf32=before["cudnn_tf32"],
                       cudnn_autotune=before["cudnn_benchmark"], cuda_graphs=before["cuda_graphs"],
                       lane_conv=before["lane_conv"], step_noise=before["step_noise"],
                       noise_ahead=before["noise_ahead"], noise_pool=before["noise_pool"])
    kernels._CONV_PRECISION_CHOSEN[:] = chosen  # restoring the TF32 flag is no choice of the tests


@pytest.fixture(autouse=True)
def _isolated_results(tmp_path, monkeypatch):
    """Every test writes results to its own folder, never to data/results."""
    monkeypatch.setenv("FEDLIB_RESULTS_DIR", str(tmp_path / "results"))
    yield

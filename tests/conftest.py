import os

import pytest
import torch

# Tests run on the CPU with a fixed thread count so timings of other work do not change results.
torch.set_num_threads(min(2, os.cpu_count() or 1))


@pytest.fixture(autouse=True)
def _isolated_results(tmp_path, monkeypatch):
    """Every test writes results to its own folder, never to data/results."""
    monkeypatch.setenv("FEDLIB_RESULTS_DIR", str(tmp_path / "results"))
    yield

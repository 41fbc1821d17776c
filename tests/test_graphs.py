"""The captured step of the vectorized path (fedlib.graphs), on a CPU.

CUDA graphs need a GPU (tests/test_cuda.py runs them there); here the CPU stand-in
:class:`~fedlib.graphs.EagerReplay` re-runs the recorded function at each replay, which exercises
everything the engine does around a capture: the fixed buffers, what is loaded into them at a
step and at a client switch, the in-place update, and the warm-up that must leave no trace. The
replayed step runs the same operations on the same values as the eager loop, so the results must
be bit-identical (``torch.equal``, no tolerance).
"""

import pytest
import torch

import fedlib.engine as engine_mod
from fedlib import Config
from fedlib.engine import Executor
from fedlib.experiment import Experiment
from fedlib.graphs import WARMUP_STEPS, CapturedStep, EagerReplay, capture_backend, copy_into
from fedlib.kernels import set_kernel_options
from fedlib.run import load_model, run_many

BASE = Config(clients=4, train_samples=200, test_samples=50, rounds=2, min_client_samples=10, lr=0.02,
              momentum=0.9, client_fraction=0.75)

#: Cases that reach every input of the captured step: client switches within a lane (unequal
#: clients, non-IID), inactive lanes, client states (SCAFFOLD's control variates, Ditto's personal
#: models), dropout masks, record-level DP-SGD noise (a Poisson plan), and a local randomiser after
#: the steps. One round where the client states do not matter (they are loaded all the same).
CASES = {
    "fedavg_dropout": {"dropout": 0.3, "rounds": 1},
    "scaffold": {"algorithm": "scaffold"},
    "ditto": {"algorithm": "ditto"},
    "moon_dpap_central": {"algorithm": "moon_dpap", "cosine_lr": True, "prune": True, "dropout": 0.2,
                          "dp": "central", "dp_epsilon_per_round": 50.0, "dp_clip": 1.0,
                          "client_fraction": 1.0, "rounds": 1},
    "moon_dpap_record": {"algorithm": "moon_dpap", "dp": "record", "dp_epsilon_total": 50.0,
                         "dp_schedule": "constant", "client_fraction": 1.0, "rounds": 1},
    "moon_dpap_ghost": {"algorithm": "moon_dpap", "dp": "record", "dp_epsilon_total": 50.0,
                        "dp_grad": "ghost", "dp_schedule": "constant", "client_fraction": 1.0, "rounds": 1},
    "ldp_fl": {"algorithm": "ldp_fl", "model": "mlp", "rounds": 1},
}


def _params(r, root):
    return load_model(r, root)[1]


def _equal(a, b) -> bool:
    return all(torch.equal(a[k], b[k]) for k in a)


def _train(cfg: Config, capture, lanes) -> dict:
    exp = Experiment(cfg, torch.device("cpu"))
    with Executor("vectorized", exp.algo, exp.data.x_train, exp.data.y_train, lanes=lanes) as ex:
        ex.capture = capture
        for t in range(cfg.rounds):
            exp.round(t, ex)
    return exp.gparams


@pytest.mark.parametrize("case", sorted(CASES))
def test_replayed_step_gives_the_eager_results(case):
    """Two lanes for three clients: one lane runs two clients (a switch: the client state and
    the new client's start are loaded into the buffers) and one lane finishes early (inactive)."""
    cfg = BASE.replace(**CASES[case])
    assert _equal(_train(cfg, None, 2), _train(cfg, EagerReplay(), 2))


def test_replayed_step_draws_every_lanes_noise_itself(restore_kernels, monkeypatch):
    """Record-level DP-SGD with ``step_noise="counter"``: the captured step is loaded with the lanes'
    Philox keys, streams and stds only (no noise is copied in) and draws all lanes' noise itself (zero
    std on the finished lane), giving the eager step's results."""
    from fedlib.kernels import set_kernel_options

    set_kernel_options(step_noise="counter")
    cfg = BASE.replace(**CASES["moon_dpap_record"])
    eager = _train(cfg, None, 2)
    loaded = []
    real = engine_mod._selection
    monkeypatch.setattr(engine_mod, "_selection", lambda *a: loaded.append(real(*a)) or loaded[-1])
    assert _equal(eager, _train(cfg, EagerReplay(), 2))
    assert loaded and all("noise" not in sel and sel["noise_key"].shape == (2, 2) for sel in loaded)


def test_replayed_run_batch_gives_the_eager_results(tmp_path, monkeypatch):
    """A run batch whose runs differ in a client hyperparameter: each lane's run context is a
    buffer too, reloaded when a lane moves on to a client of another run."""
    base = BASE.replace(algorithm="scaffold", alpha=0.3, rounds=1)
    cfgs = [base, base.replace(seed=1, lr=0.05)]
    eager = run_many(cfgs, engine="vectorized", device="cpu", root=tmp_path / "eager", progress=False)
    monkeypatch.setattr(engine_mod, "capture_backend", lambda device: EagerReplay())
    replayed = run_many(cfgs, engine="vectorized", device="cpu", root=tmp_path / "replay", progress=False)
    for a, b in zip(eager, replayed, strict=True):
        assert _equal(_params(a, tmp_path / "eager"), _params(b, tmp_path / "replay"))


def _toy_step(state, batch, cstate, context):
    return {"w": state["w"] + batch["x"].sum(1) * context["lr"] + cstate["c"], "n": state["n"] + 1}


def _toy(backend=None, warmup_steps=2):
    state = {"w": torch.zeros(3), "n": torch.zeros(3)}
    sel = {"x": torch.ones(3, 2), "active": torch.tensor([True, True, False])}
    return CapturedStep(lambda s: s, _toy_step, state, sel, {"c": torch.zeros(3)}, {"lr": torch.ones(3)},
                        backend or EagerReplay(), warmup_steps)


def test_warmup_leaves_no_trace_and_replays_update_the_state_in_place():
    cs = _toy(warmup_steps=3)
    assert torch.equal(cs.state["w"], torch.zeros(3)) and torch.equal(cs.state["n"], torch.zeros(3))
    w = cs.state["w"]
    cs.replay()
    assert cs.state["w"] is w  # the same buffer, updated in place
    assert cs.state["w"].tolist() == [2.0, 2.0, 0.0]  # the inactive lane keeps its state
    everyone = torch.ones(3, dtype=torch.bool)
    cs.load(cstate={"c": torch.tensor([1.0, 0.0, 0.0])},
            selection={"x": torch.zeros(3, 2), "active": everyone})
    cs.replay()
    assert cs.state["w"].tolist() == [3.0, 2.0, 0.0] and cs.state["n"].tolist() == [2.0, 2.0, 1.0]
    cs.set_state({"w": torch.full((3,), 5.0), "n": torch.zeros(3)})
    cs.replay()
    assert cs.state["w"].tolist() == [6.0, 5.0, 5.0]


class CountingReplay(EagerReplay):
    def __init__(self):
        self.warmed = 0

    def warmup(self, fn, steps):
        self.warmed += steps
        super().warmup(fn, steps)


def test_a_step_is_warmed_up_once_per_tag_and_shapes():
    """The first capture of a step in a process warms up; the next rounds of the same run (same tag,
    same shapes) do not; another run (tag) or other shapes (more lanes) do."""
    def capture(tag, lanes=3):
        backend = CountingReplay()
        state = {"w": torch.zeros(lanes), "n": torch.zeros(lanes)}
        sel = {"x": torch.ones(lanes, 2), "active": torch.ones(lanes, dtype=torch.bool)}
        CapturedStep(lambda s: s, _toy_step, state, sel, {"c": torch.zeros(lanes)}, {"lr": torch.ones(lanes)},
                     backend, tag=tag)
        return backend.warmed

    tag = ("test", object())  # new in this process
    assert capture(tag) == WARMUP_STEPS
    assert capture(tag) == 0
    assert capture(tag, lanes=4) == WARMUP_STEPS
    assert capture(("test", object())) == WARMUP_STEPS


def test_captured_step_refuses_what_it_cannot_hold():
    with pytest.raises(ValueError, match="active"):
        CapturedStep(lambda s: s, _toy_step, {"w": torch.zeros(3)}, {"x": torch.ones(3, 2)}, {}, {},
                     EagerReplay())
    cs = _toy()
    with pytest.raises(ValueError, match="unknown inputs"):
        cs.load(batch={"x": torch.zeros(3, 2)})
    with pytest.raises(ValueError, match="trees differ"):
        copy_into({"a": torch.zeros(1)}, {"a": torch.zeros(1), "b": torch.zeros(1)})


def test_cuda_graphs_only_where_asked_and_on_a_gpu(restore_kernels):
    set_kernel_options(cuda_graphs=False)
    assert capture_backend(torch.device("cpu")) is None and capture_backend(torch.device("cuda")) is None
    set_kernel_options(cuda_graphs=True)
    assert capture_backend(torch.device("cpu")) is None  # no graphs on a CPU: the eager loop
    assert type(capture_backend(torch.device("cuda"))).__name__ == "CudaGraphs"


class _FailingCapture(EagerReplay):
    """A backend whose recording fails (as a CUDA capture can: an operation not allowed while a
    stream captures, a library that initialises lazily inside the graph)."""

    def capture(self, fn):
        raise RuntimeError("operation not permitted when stream is capturing")


def test_a_failed_capture_falls_back_to_the_eager_step_once_and_is_recorded(capsys, restore_kernels):
    """Never fatal: the round runs eagerly with the same result, one warning line is printed (not
    one per round), later rounds do not try again, and the settings a result records say so."""
    from fedlib.kernels import kernel_settings

    set_kernel_options(cuda_graphs=True)  # forgets any earlier failure of this process
    assert kernel_settings()["cuda_graphs_fell_back"] is False
    cfg = BASE.replace(algorithm="scaffold")
    tried = []

    class Counting(_FailingCapture):
        def capture(self, fn):
            tried.append(1)
            super().capture(fn)

    fell_back = _train(cfg, Counting(), 2)
    assert _equal(fell_back, _train(cfg, None, 2))
    err = capsys.readouterr().err
    assert err.count("warning: capturing the vectorized step failed (RuntimeError: operation not") == 1
    assert len(tried) == 1  # round 2 did not try again
    assert kernel_settings()["cuda_graphs_fell_back"] is True
    assert capture_backend(torch.device("cpu")) is None
    set_kernel_options(cuda_graphs=True)
    assert kernel_settings()["cuda_graphs_fell_back"] is False

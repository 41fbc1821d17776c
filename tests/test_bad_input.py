"""Bad input gets one clear line before any work (issue 28): 34 command-line cases, config fields
that reject NaN and infinity, device names, and notebook parameters."""

from __future__ import annotations

import pytest

from fedlib.__main__ import main

SMALL = ["--clients", "2", "--train-samples", "100", "--test-samples", "50", "--rounds", "1", "--no-progress"]

#: (what is wrong, the arguments): each must end in one line ``error: ...`` and exit status != 0.
BAD_CLI = [
    ("unknown algorithm", ["--algorithm", "fedsgd"]),
    ("unknown dataset", ["--dataset", "cifar"]),
    ("unknown model", ["--model", "resnet"]),
    ("unknown partition", ["--partition", "zipf"]),
    ("no clients", ["--clients", "0"]),
    ("negative clients", ["--clients", "-5"]),
    ("clients not a number", ["--clients", "many"]),
    ("Dirichlet alpha 0", ["--alpha", "0"]),
    ("client fraction 0", ["--client-fraction", "0"]),
    ("client fraction above 1", ["--client-fraction", "1.5"]),
    ("no rounds", ["--rounds", "0"]),
    ("no local epochs", ["--local-epochs", "0"]),
    ("batch size 0", ["--batch-size", "0"]),
    ("learning rate 0", ["--lr", "0"]),
    ("learning rate infinite", ["--lr", "inf"]),
    ("learning rate NaN", ["--lr", "nan"]),
    ("server learning rate infinite", ["--server-lr", "inf"]),
    ("momentum 1", ["--momentum", "1"]),
    ("weight decay NaN", ["--weight-decay", "nan"]),
    ("negative weight decay", ["--weight-decay", "-1"]),
    ("dropout 1", ["--dropout", "1"]),
    ("unknown precision", ["--precision", "float16"]),
    ("negative seed", ["--seed", "-1"]),
    ("more training samples than exist", ["--train-samples", "70000"]),
    ("negative test samples", ["--test-samples", "-1"]),
    ("unknown profile", ["--profile", "huge"]),
    ("unknown DP mode", ["--algorithm", "moon_dpap", "--dp", "global"]),
    ("infinite clip", ["--algorithm", "dp_fedavg", "--dp-clip", "inf"]),
    ("NaN noise multiplier", ["--algorithm", "dp_fedavg", "--dp-noise-multiplier", "nan"]),
    ("delta above 1", ["--algorithm", "dp_fedavg", "--dp-delta", "2"]),
    ("cuda without a GPU", ["--device", "cuda:7"]),
    ("unknown device", ["--device", "tpu"]),
    ("checkpoint every 0 rounds", ["--checkpoint-every", "0"]),
    ("unknown engine", ["--engine", "warp"]),
]


def test_there_are_34_cases():
    assert len(BAD_CLI) == 34


@pytest.mark.parametrize("what,args", BAD_CLI, ids=[w for w, _ in BAD_CLI])
def test_bad_command_line_input_is_one_line_before_any_work(what, args, capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("FEDLIB_RESULTS_DIR", str(tmp_path / "results"))
    from fedlib.experiment import Experiment

    monkeypatch.setattr(Experiment, "__init__", lambda *a, **k: pytest.fail("work started"))
    with pytest.raises(SystemExit) as ex:
        raise SystemExit(main(["run", *SMALL, *args]))
    assert ex.value.code not in (0, None), what
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and len(err.splitlines()) == 1, (what, err)
    assert not (tmp_path / "results").exists()


def test_json_line_is_valid_json_when_a_run_diverges(capsys, tmp_path, monkeypatch):
    import json

    monkeypatch.setenv("FEDLIB_RESULTS_DIR", str(tmp_path))
    assert main(["run", *SMALL, "--lr", "1e6", "--momentum", "0.99", "--json"]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    d = json.loads(line, parse_constant=lambda c: pytest.fail(f"bare {c} in the JSON line"))
    assert d["test_loss"] is None and d["diverged"] is True


@pytest.mark.parametrize("field", ["lr", "server_lr", "weight_decay", "dp_clip", "dp_noise_multiplier",
                                   "alpha", "prune_t_max", "fdl_r"])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_every_float_field_rejects_non_finite_values(field, value):
    from fedlib import Config
    from fedlib.config import ConfigError

    with pytest.raises(ConfigError, match=f"{field} must be a finite number"):
        Config().replace(**{field: value}).validate()


#: (what is wrong, the notebook, its parameters): 13 bad notebook parameters, each refused in one
#: line before the notebook runs.
BAD_NOTEBOOK = [
    ("unknown profile", "dpfl_claim1", ["-p", "profile", "huge"]),
    ("no seeds", "dpfl_claim1", ["-p", "n_seeds", "0"]),
    ("negative seeds", "fdl_fig3", ["-p", "n_seeds", "-2"]),
    ("seeds as words", "moon_dpap_fig1", ["-p", "n_seeds", "three"]),
    ("epsilon 0", "dpfl_claim2", ["-p", "epsilon", "0"]),
    ("epsilon NaN", "fdl_fig4", ["-p", "epsilon", "nan"]),
    ("epsilon_0 infinite", "moon_dpap_fig2", ["-p", "eps0", "inf"]),
    ("clip 0", "moon_dpap_fig2", ["-p", "clip", "0"]),
    ("unknown engine", "fedavg", ["-p", "engine", "warp"]),
    ("negative seed", "fedavg", ["-p", "seed", "-1"]),
    ("no images", "dpfl_claim4", ["-p", "images", "0"]),
    ("empty alphas", "moon_dpap_alpha", ["-p", "alphas", "[]"]),
    ("a parameter the page lacks", "dpfl_claim1", ["-p", "n_sedes", "3"]),
]


def test_there_are_13_notebook_cases():
    assert len(BAD_NOTEBOOK) == 13


@pytest.mark.parametrize("what,stem,args", BAD_NOTEBOOK, ids=[w for w, _, _ in BAD_NOTEBOOK])
def test_bad_notebook_parameters_are_one_line_before_the_notebook_runs(what, stem, args, capsys, monkeypatch):
    from lab import notebooks

    monkeypatch.setattr(notebooks, "execute_timed", lambda *a, **k: pytest.fail("the notebook ran"))
    with pytest.raises(SystemExit) as ex:
        notebooks.main(["--only", stem, *args])
    assert ex.value.code == 2, what
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and len(err.splitlines()) == 1, (what, err)


def test_every_notebook_checks_all_its_parameters_first():
    """Each notebook calls check_parameters with every parameter it has, in the cell right after
    its parameters (where papermill's values have landed), so a direct papermill run is refused too."""
    import json

    from lab.notebooks import NOTEBOOKS, parameters_of

    for src in sorted(NOTEBOOKS.glob("*.ipynb")):
        cells = json.loads(src.read_text())["cells"]
        at = next(i for i, c in enumerate(cells) if "parameters" in c.get("metadata", {}).get("tags", []))
        after = next(c for c in cells[at + 1:] if c["cell_type"] == "code")
        text = "".join(after["source"])
        for prm in parameters_of(src):
            assert f"{prm['name']}={prm['name']}" in text, (src.stem, prm["name"])


def test_check_parameters_rules():
    from studies.common import ParameterError, check_parameters

    check_parameters(profile="paper", n_seeds=None, epsilon=0.5, alphas=[0.1], delta_round=1e-8)
    for bad in ({"delta_round": 1.0}, {"n_seeds": True}, {"clips": [0.1, -1]}, {"profile": "custom"}):
        with pytest.raises(ParameterError):
            check_parameters(**bad)


# ---- issue 78: every value checked where it enters --------------------------------------------------
def _kernel_namespace(**injected) -> dict:
    """What a notebook kernel's globals hold after its parameters cells: IPython's own names, a
    declared parameter, and what papermill injected."""
    return {"get_ipython": lambda: None, "In": ["", "x = 1"], "Out": {}, "open": open, "exit": exit,
            "quit": quit, "_": None, "__": None, "_i": "", "_ii": "", "_i1": "x = 1", "_1": 3,
            "_dh": ["/"], "_oh": {}, "_ih": [], "__name__": "__main__", "__builtins__": {},
            "profile": "quick", **injected}


@pytest.mark.parametrize("name", ["_x", "In", "Out", "open", "exit", "quit", "get_ipython", "nosuch"])
def test_a_parameter_injected_under_a_kernel_name_is_refused(name):
    from studies.common import _undeclared

    assert _undeclared({"profile": "quick"}, _kernel_namespace()) == []
    assert _undeclared({"profile": "quick"}, _kernel_namespace(**{name: 1})) == [name]


#: A DP setting no mechanism could accept, given with DP off (issue 78): refused all the same.
DP_FIELDS_WITH_DP_OFF = [("--dp-delta", "5", "dp_delta"), ("--dp-clip", "0", "dp_clip"),
                         ("--dp-epsilon-per-round", "-1", "dp_epsilon_per_round"),
                         ("--dp-epsilon-total", "0", "dp_epsilon_total"),
                         ("--dp-eps-floor", "-0.5", "dp_eps_floor")]
#: Extremes that used to end in a library's error (a solver's NaN, a float overflow, a C long overflow).
EXTREMES = [("--dp-epsilon-per-round", "1e300", "dp_epsilon_per_round"), ("--dp-clip", "1e300", "dp_clip"),
            ("--seed", "99999999999999999999", "seed")]


@pytest.mark.parametrize("option,value,field", DP_FIELDS_WITH_DP_OFF + EXTREMES)
def test_a_field_out_of_its_range_is_refused_in_every_mode(option, value, field, capsys):
    from fedlib.__main__ import main

    code = main(["run", "--algorithm", "moon_dpap", "--dp", "none", "--clients", "3", "--train-samples",
                 "300", "--test-samples", "100", "--rounds", "1", option, value])
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and len(err.splitlines()) == 1 and field in err, err
    assert err.count("invalid config") == 1, err


def test_every_field_range_accepts_the_default():
    from fedlib.config import FIELD_RANGES, Config

    d = Config()
    for name, (test, _) in FIELD_RANGES.items():
        assert test(getattr(d, name)), name


# the record-level calibration at the largest epsilon (~9 s on a slow 2-core host) goes to test-full
# to keep make test under its 10 minutes; the other Gaussian paths stay in make test
@pytest.mark.parametrize("case", ["gaussian epsilon", pytest.param("record epsilon", marks=pytest.mark.heavy),
                                  "local epsilon", "clip", "seed"])
def test_each_mechanism_runs_at_the_edge_of_its_range(case, tmp_path):
    """The bounds are where the computations still work: one round of each mechanism at them."""
    import math

    from fedlib import Config, run
    from fedlib.config import INT_MAX, MAX_CLIP, MAX_GAUSSIAN_EPSILON, MAX_LDP_FL_EPSILON, MAX_LOCAL_EPSILON

    base = Config(clients=3, train_samples=300, test_samples=100, rounds=2, profile="smoke", momentum=0.0)
    e, le = MAX_GAUSSIAN_EPSILON, MAX_LOCAL_EPSILON
    cases = {
        "gaussian epsilon": [dict(algorithm="moon_dpap", dp="central", dp_epsilon_per_round=e),
                             dict(algorithm="moon_dpap", dp="local", dp_epsilon_per_round=e),
                             dict(algorithm="moon_dpap", dp="central", dp_schedule="constant",
                                  dp_epsilon_total=e),
                             dict(algorithm="moon_dpap", dp="formula", dp_epsilon_per_round=e)],
        "record epsilon": [dict(algorithm="moon_dpap", dp="record", dp_schedule="constant",
                                dp_epsilon_total=e)],
        "local epsilon": [dict(algorithm="ldp_fl", ldp_fl_epsilon_per_coordinate=MAX_LDP_FL_EPSILON),
                          dict(algorithm="signds_fl", signds_epsilon_per_round=le),
                          dict(algorithm="fdl", fdl_epsilon_per_draw=le),
                          dict(algorithm="fdl", fdl_mode="corrected", fdl_epsilon_per_round=le)],
        "clip": [dict(algorithm="moon_dpap", dp="central", dp_clip=MAX_CLIP),
                 dict(algorithm="moon_dpap", dp="record", dp_schedule="constant", dp_clip=MAX_CLIP),
                 dict(algorithm="dp_fedavg", dp_clip=MAX_CLIP, dp_noise_multiplier=1e6),
                 dict(algorithm="fdl", fdl_mode="corrected", ldp_clip=MAX_CLIP)],
        "seed": [dict(seed=INT_MAX)],
    }
    for kw in cases[case]:
        r = run(base.replace(**kw), root=tmp_path, progress=False, engine="sequential")
        assert 0 <= r.final["test_acc"] <= 1, kw
        eps = r.history[-1].get("epsilon_spent")
        assert eps is None or eps >= 0 and not math.isnan(eps), kw


@pytest.mark.parametrize("setting", ["FEDLIB_RESULTS_DIR", "FEDLIB_CHECKPOINT_DIR", "FEDLIB_DATA_DIR"])
def test_an_empty_folder_setting_is_refused_with_its_name(setting, tmp_path, monkeypatch, capsys):
    from fedlib.__main__ import main

    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    monkeypatch.setenv(setting, "")
    code = main(["run", "--clients", "3", "--train-samples", "300", "--test-samples", "100", "--rounds", "1"])
    err = capsys.readouterr().err.strip()
    assert code != 0 and setting in err and len(err.splitlines()) == 1, err
    assert list(here.iterdir()) == []  # nothing written into the current folder
    assert not (tmp_path / "results").exists()  # nor anywhere else: refused before any work


def test_two_processes_setting_aside_one_file_leave_no_placeholder(tmp_path):
    from fedlib.results import set_aside

    bad = tmp_path / "fedavg-0123456789abcdef.json"
    bad.write_text("garbage")
    first = set_aside(bad, "test")
    assert first is not None and first.read_text() == "garbage"
    assert set_aside(bad, "test") is None  # the other process: the file has gone
    assert [p.name for p in (tmp_path / "rejected").iterdir()] == [first.name]


def test_a_failed_result_write_leaves_no_model_without_its_result(tmp_path, monkeypatch):
    from fedlib import Config, run
    from fedlib.results import Result, model_path

    cfg = Config(clients=3, train_samples=300, test_samples=100, rounds=1, profile="smoke")

    def full_disk(self, path):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Result, "save", full_disk)
    with pytest.raises(OSError):
        run(cfg, root=tmp_path, progress=False, engine="sequential")
    assert not model_path(cfg, tmp_path).exists()


def test_lock_files_follow_the_umask(tmp_path):
    import os

    from fedlib import Config
    from fedlib.results import ConfigLocks

    old = os.umask(0o002)
    try:
        locks = ConfigLocks(tmp_path)
        locks.acquire(Config(), block=False)
        locks.release_all()
    finally:
        os.umask(old)
    (lock,) = (tmp_path / "locks").iterdir()
    assert lock.stat().st_mode & 0o777 == 0o664

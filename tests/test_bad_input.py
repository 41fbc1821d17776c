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

"""The mutation-testing driver (``make test-privacy-mutants``): its parsing of mutmut's output, its
report, and one real mutmut run on a toy repository with a known survivor."""

import json
import re
import subprocess
import sys
import textwrap

import pytest

from fedlib.results import REPO_ROOT
from lab import privacy_mutants as pm


def test_changed_lines_of_a_one_line_diff():
    diff = textwrap.dedent("""\
        --- fedlib/privacy/clipping.py
        +++ fedlib/privacy/clipping.py
        @@ -3,3 +3,3 @@
             norm = x.norm()
        -    if norm > clip:
        +    if norm >= clip:
                 x = x * (clip / norm)
        """)
    assert pm.changed_lines(diff) == ("if norm > clip:", "if norm >= clip:")


def test_source_file_of_function_and_method_mutants():
    assert pm.source_file("fedlib.privacy.clipping.x_clip_by_l2__mutmut_6") == "fedlib/privacy/clipping.py"
    assert pm.source_file("fedlib.privacy.record.x\u01c1Release\u01c1__post_init____mutmut_3") == \
        "fedlib/privacy/record.py"


def test_only_message_edits_are_equivalent_by_rule():
    assert pm.equivalence("f.py", 'raise ValueError("clip must be positive")', 'raise ValueError("XXclipXX")')
    assert pm.equivalence("f.py", 'raise ValueError("x")', "raise ValueError(None)")
    # a changed condition in front of the raise is not a message edit
    assert pm.equivalence("f.py", 'if clip <= 0: raise ValueError("x")',
                          'if clip < 0: raise ValueError("x")') is None
    assert pm.equivalence("f.py", "sigma = z * clip", "sigma = z / clip") is None
    line = 'return ["LDP-FL needs ldp_clip > 0"]'
    assert pm.equivalence("f.py", line, 'return ["XXLDP-FL needs ldp_clip > 0XX"]')
    assert pm.equivalence("f.py", "return [x]", "return [y]") is None


def test_only_device_edits_are_equivalent_by_rule():
    line = "return lap.to(device=x.device, dtype=x.dtype)"
    assert pm.equivalence("f.py", line, "return lap.to(device=None, dtype=x.dtype)")
    assert pm.equivalence("f.py", line, "return lap.to(dtype=x.dtype)")
    assert pm.equivalence("f.py", line, "return lap.to(device=x.device, dtype=None)") is None
    assert pm.equivalence("f.py", line, "return (lap * 2).to(dtype=x.dtype)") is None
    # positional devices, dropped or None; never another argument
    line = "out = torch.from_numpy(v).to(values.device, values.dtype)"
    for new in ("out = torch.from_numpy(v).to(None, values.dtype)",
                "out = torch.from_numpy(v).to(values.dtype)"):
        assert pm.device_only(line, new), new
    for new in ("out = torch.from_numpy(v).to(values.device, )",
                "out = torch.from_numpy(v).to(values.device, None)",
                "out = torch.from_numpy(v).to(None, None)"):
        assert not pm.device_only(line, new), new
    line = "scores = w.double() + gumbel(tuple(w.shape), generator, w.device)"
    assert pm.device_only(line, "scores = w.double() + gumbel(tuple(w.shape), generator, None)")
    assert pm.device_only(line, "scores = w.double() + gumbel(tuple(w.shape), generator, )")
    assert not pm.device_only(line, "scores = w.double() + gumbel(tuple(w.shape), None, w.device)")
    assert pm.device_only("x = y.to(dev, z.dtype)", "x = y.to(None, z.dtype)")


def test_only_release_labels_are_equivalent_by_rule():
    line = 'note(Release("laplace", epsilon=k * eps))'
    for new in ('note(Release(None, epsilon=k * eps))', 'note(Release("XXlaplaceXX", epsilon=k * eps))'):
        assert pm.equivalence("f.py", line, new)
    for new in ('note(Release("laplace", epsilon=k / eps))', 'note(Release("laplace", epsilon=None))'):
        assert pm.equivalence("f.py", line, new) is None


def test_every_equivalence_argument_is_about_a_line_that_exists():
    """An argued survivor is matched on its source line: each entry's original line must still be
    in its file, and its mutated line must differ, or the argument is about code that is gone."""

    for file, old, new, why in pm.EQUIVALENT:
        lines = {line.strip() for line in (REPO_ROOT / file).read_text().splitlines()}
        assert old in lines, (file, old)
        assert new != old and len(why) > 40


def test_verdicts_made_with_other_tests_are_forgotten(tmp_path):
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_a.py").write_text("def test_a(): pass\n")
    (tmp_path / "pyproject.toml").write_text("[tool.mutmut]\n")
    (tmp_path / "mutants").mkdir()
    (tmp_path / "mutants" / "x.py.meta").write_text("{}")
    assert pm.forget_stale_verdicts(tmp_path)  # no fingerprint yet: stale
    (tmp_path / "mutants").mkdir()
    assert not pm.forget_stale_verdicts(tmp_path) and (tmp_path / "mutants").exists()
    (tmp_path / "tests" / "test_a.py").write_text("def test_a(): assert 1\n")
    assert pm.forget_stale_verdicts(tmp_path) and not (tmp_path / "mutants").exists()


def test_parse_results_reads_every_status():
    text = ("    fedlib.privacy.noise.x_gauss__mutmut_1: killed\n"
            "    fedlib.privacy.record.x\u01c1Release\u01c1check__mutmut_12: survived\n"
            "    fedlib.privacy.noise.x_gauss__mutmut_2: not checked\n"
            "some other line\n")
    assert [(m["name"].split(".")[-1], m["status"]) for m in pm.parse_results(text)] == [
        ("x_gauss__mutmut_1", "killed"), ("x\u01c1Release\u01c1check__mutmut_12", "survived"),
        ("x_gauss__mutmut_2", "not checked")]


def test_summary_counts_unchecked_and_timeouts_honestly():
    mutants = ([{"status": "killed"}] * 5 + [{"status": "segfault"}] + [{"status": "timeout"}] * 2
               + [{"status": "survived", "equivalent": "why"}, {"status": "survived"}]
               + [{"status": "not checked"}] * 5)
    s = pm.summarise(mutants, finished=False)
    counts = (s["generated"], s["checked"], s["detected"], s["equivalent"], s["unexplained"])
    assert counts == (15, 10, 8, 1, 1)
    assert s["score"] == pytest.approx(8 / 9, abs=1e-4) and not s["complete"]
    assert pm.summarise([{"status": "killed"}], finished=True)["complete"]
    # a finished run that left mutants unchecked is not complete either
    assert not pm.summarise([{"status": "not checked"}], finished=True)["complete"]


def test_the_books_paragraph_says_when_the_run_is_missing_or_partial():
    assert "has not been run" in pm.describe(None)
    mutants = [{"file": "a.py", "status": "killed"}, {"file": "a.py", "status": "survived"},
               {"file": "b.py", "status": "not checked"}]
    report = {"tool": "mutmut 3.8.1", "commit": "0123456789abcdef", **pm.summarise(mutants, True),
              "mutants": mutants}
    text = pm.describe(report)
    assert "ran the privacy tests against 2 of them" in text and "1 survivors are unexplained" in text
    assert "incomplete" in text and "1 mutants are not checked" in text
    assert pm.by_file(report) == [
        {"file": "a.py", "generated": 2, "checked": 2, "detected": 1, "equivalent": 0, "unexplained": 1},
        {"file": "b.py", "generated": 1, "checked": 0, "detected": 0, "equivalent": 0, "unexplained": 0}]


def test_under_mutmut_the_tests_run_on_one_thread():
    from conftest import threads_for_tests

    assert threads_for_tests({"MUTANT_UNDER_TEST": "fedlib.privacy.clipping.x_clip_by_l2__mutmut_1"}) == 1
    assert threads_for_tests({}) >= 1


def test_an_interrupted_run_leaves_its_half_tested_mutants_to_the_next(tmp_path):
    meta = tmp_path / "mutants" / "fedlib" / "privacy" / "noise.py.meta"
    meta.parent.mkdir(parents=True)
    meta.write_text(json.dumps({"exit_code_by_key": {"a": 1, "b": 2, "c": -15, "d": 0, "e": None, "f": -24}}))
    assert pm.reset_interrupted(tmp_path) == 2
    codes = json.loads(meta.read_text())["exit_code_by_key"]
    assert codes == {"a": 1, "b": None, "c": None, "d": 0, "e": None, "f": -24}


@pytest.fixture
def toy_repository(tmp_path):
    """A git repository with one clipping function, a test (with a torch product, which deadlocks
    in mutmut's forked processes unless they run on one thread) that checks it on both sides of the
    threshold but never at it (so ``>`` -> ``>=`` survives: at x == c both return c, a survivor
    to explain) and never reads its error message (a survivor that is equivalent by rule), and
    the mutmut configuration."""
    repo = tmp_path / "toy"
    (repo / "toy").mkdir(parents=True)
    (repo / "tests").mkdir()
    (repo / "toy" / "__init__.py").write_text("")
    (repo / "toy" / "clip.py").write_text(textwrap.dedent('''\
        def clip(x: float, c: float) -> float:
            if c <= 0:
                raise ValueError("the clip must be positive")
            if x > c:
                return c
            return x
        '''))
    (repo / "tests" / "test_clip.py").write_text(textwrap.dedent('''\
        import pytest
        import torch

        from toy.clip import clip


        def test_clip():
            a = torch.randn(512, 512)
            assert torch.isfinite(a @ a).all()  # a parallel region before and after each fork
            assert clip(5.0, 1.0) == 1.0
            assert clip(0.5, 1.0) == 0.5
            with pytest.raises(ValueError):
                clip(1.0, 0.0)
        '''))
    (repo / "pyproject.toml").write_text(textwrap.dedent('''\
        [tool.mutmut]
        source_paths = ["toy"]
        pytest_add_cli_args_test_selection = ["tests/test_clip.py"]
        pytest_add_cli_args = ["-p", "no:cacheprovider"]
        '''))
    commit = ["-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "toy"]
    for cmd in (["init", "-q"], ["add", "."], commit):
        subprocess.run(["git", *cmd], cwd=repo, check=True, capture_output=True)
    return repo


@pytest.mark.e2e
def test_a_real_mutmut_run_reports_its_survivor_and_resumes(toy_repository, tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "path", [str(toy_repository), *sys.path])
    work = tmp_path / "work"
    report = pm.run(work, source=toy_repository)
    by_status = {}
    for mt in report["mutants"]:
        by_status.setdefault(mt["status"], []).append(mt)
    assert report["complete"] and report["generated"] == report["checked"] >= 4
    survivors = {(m["old"], m["new"]): m.get("equivalent") for m in by_status["survived"]}
    assert survivors[("if x > c:", "if x >= c:")] is None
    reasons = [why for why in survivors.values() if why]
    assert reasons and all("message" in why for why in reasons)
    assert report["unexplained"] == 1 and report["detected"] == report["generated"] - len(survivors) >= 2
    # a second run over the kept folder tests nothing again and reports the same
    again = pm.run(work, source=toy_repository)
    statuses = lambda r: {m["name"]: m["status"] for m in r["mutants"]}  # noqa: E731
    assert statuses(again) == statuses(report)
    # the report alone, from the kept folder, running nothing: the same verdicts and provenance
    alone = pm.build_report(work)
    assert statuses(alone) == statuses(report) and alone["minutes"] is None
    assert alone["commit"] == report["commit"] and alone["tests_sha256"] == report["tests_sha256"]
    out = tmp_path / "report.json"
    assert pm.main(["report", "--workdir", str(work), "--out", str(out)]) == 1  # one unexplained survivor
    assert json.loads(out.read_text())["unexplained"] == 1
    with pytest.raises(SystemExit):
        pm.main(["report", "--workdir", str(tmp_path / "nothing")])


def test_a_run_without_mutmut_or_without_mutants_is_an_error_not_an_empty_report(toy_repository, tmp_path,
                                                                                monkeypatch):
    """``python -m mutmut`` without mutmut exits with 1, mutmut's code for "survivors": on the GPU
    node that lacks it the run reported 0 mutants as complete. Both cases must raise instead."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "mutmut" else real(name, *a))
    with pytest.raises(RuntimeError, match="mutmut is not installed"):
        pm.run(tmp_path / "work", source=toy_repository)
    assert not (tmp_path / "work").exists()  # refused before any work
    monkeypatch.setattr(importlib.util, "find_spec", real)
    monkeypatch.setattr(pm, "_mutmut_run", lambda *a, **k: True)  # mutmut ran and made nothing
    with pytest.raises(RuntimeError, match="no mutants"):
        pm.run(tmp_path / "work", source=toy_repository)


# ---- key mutations (lab.key_mutants) ------------------------------------------------------------
def test_every_privacy_key_call_in_the_source_is_a_key_site():
    """Cross-checked against a plain text scan: every line of the key files that calls a key
    function with a privacy stream (or passes a ``*seed`` on) is a site, and no public stream is."""
    from lab import key_mutants as km

    at = {(s.file, s.line) for s in km.sites()}
    calls = re.compile(r"\b(noise_seed|generator_for|StepNoise)\((Stream\.(\w+)|\*seed|self\.noise_seed)")
    expected = set()
    for rel in km.KEY_FILES:
        for n, line in enumerate((REPO_ROOT / rel).read_text().splitlines(), 1):
            m = calls.search(line)
            if m and not line.lstrip().startswith(("def ", "#")) and m.group(3) not in km.PUBLIC_STREAMS:
                expected.add((rel, n))
    assert expected and expected <= at, sorted(expected - at)
    assert not [s for s in km.sites() if {"BATCHES", "DROPOUT", "SAMPLING"} & {
        getattr(e, "attr", None) for e in s.elements}]
    assert {s.file for s in km.sites()} >= {*km.FLOWER_FILES, "fedlib/algorithms/base.py"}


def test_the_issues_example_and_each_operator_are_made():
    from lab import key_mutants as km

    found = km.mutants()
    by_op = {op: [m for m in found if m.operator == op] for op in ("constant", "drop", "stream")}
    assert all(by_op.values())
    central = [m for m in by_op["constant"] if m.file == "fedlib/algorithms/moon_dpap.py"
               and "CENTRAL_NOISE" in m.lines((REPO_ROOT / m.file).read_text())[0]]
    assert len(central) == 1
    old, new = central[0].lines((REPO_ROOT / central[0].file).read_text())
    assert "noise_seed(Stream.CENTRAL_NOISE, ctx.t)" in old and "noise_seed(Stream.CENTRAL_NOISE, 0)" in new
    swap = [m for m in by_op["stream"] if m.file == "fedlib/algorithms/dp_fedavg.py"
            and m.old == "Stream.DP_FEDAVG_NOISE" and m.new == "Stream.DP_FEDAVG_COUNT"]
    assert len(swap) == 1
    drop = [m for m in by_op["drop"] if m.file == "fedlib/privacy/noise.py" and "step" in m.old]
    assert drop and "[*self.key, client]" in drop[0].apply((REPO_ROOT / drop[0].file).read_text())
    flower = [m for m in found if m.file in km.FLOWER_FILES]
    assert flower and {m.operator for m in flower} == {"constant"}
    assert len({m.name for m in found}) == len(found)


def test_a_key_mutant_refuses_a_source_that_changed():
    from lab import key_mutants as km

    m = km.mutants()[0]
    with pytest.raises(ValueError, match="no longer reads"):
        m.apply("x = 1\n" * (m.end_line + 1))


def test_every_key_equivalence_argument_is_about_a_line_that_exists():
    from lab import key_mutants as km

    for file, old, _new, why in km.EQUIVALENT:
        lines = {line.strip() for line in (REPO_ROOT / file).read_text().splitlines()}
        assert old in lines or all(part in lines for part in old.split(" / ")), (file, old)
        assert len(why) > 40


def test_every_file_in_the_mutation_scope_has_well_formed_no_mutate_regions():
    """mutmut reads the module's fences before its classes' (a region left open to the end of a
    module clashes with a fence inside a class: the whole run stops). Its own reader, on every file
    it would mutate."""
    import fnmatch
    import tomllib

    pytest.importorskip("mutmut")
    import libcst as cst
    from libcst.metadata import MetadataWrapper
    from mutmut.mutation.pragma_handling import PragmaVisitor

    cfg = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["mutmut"]
    files = [p for p in sorted((REPO_ROOT / "fedlib").rglob("*.py"))
             if any(fnmatch.fnmatch(str(p.relative_to(REPO_ROOT)), g) for g in cfg["only_mutate"])]
    assert len(files) > 10
    for p in files:
        MetadataWrapper(cst.parse_module(p.read_text())).visit(PragmaVisitor(str(p)))  # raises if not


def test_a_second_run_in_the_same_work_folder_is_refused(tmp_path):
    """Two runs in one work folder edited each other's files (a key mutant written by one was
    copied into mutmut's state by the other): the folder is held for one run."""
    with pm._exclusive(tmp_path):
        with pytest.raises(RuntimeError, match="another mutation run"):
            with pm._exclusive(tmp_path):
                pass
    with pm._exclusive(tmp_path):  # released when the run ends
        pass


def test_the_score_never_rounds_a_gap_away():
    assert pm.score_text({"score": 0.9997, "unexplained": 1}) == "99.97 %"
    assert pm.score_text({"score": 1.0, "unexplained": 0}) == "100.0 %"
    assert pm.score_text({"score": 0.912, "unexplained": 30}) == "91.2 %"


def test_the_key_mutants_replace_the_accountants_accumulations_by_assignments():
    """Issue 65: the mutation driver makes the edit that keeps only the last round's epsilon (an
    accumulation become an assignment) at each of the accountant's sums; the one that cannot change a
    released epsilon is argued equivalent."""
    from lab import key_mutants as km

    found = {m.name for m in km.accumulation_mutants()}
    for edit in ("self.pure += event.epsilon->self.pure = event.epsilon",
                 "self.rdp = self.rdp + event.count * curve->self.rdp = event.count * curve"):
        assert any(name.endswith(edit) for name in found), edit
    assert all(":accumulate:" in name for name in found)
    assert km.equivalence("fedlib/privacy/guarantee.py", "self.gaussian_rounds += 1",
                          "self.gaussian_rounds = 1")

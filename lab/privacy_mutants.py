"""Mutation testing of the privacy code with mutmut: ``make test-privacy-mutants``.

``python -m lab.privacy_mutants run`` copies the repository into a temporary folder and runs
`mutmut <https://github.com/boxed/mutmut>`_ 3 there with the configuration in ``pyproject.toml``
(``[tool.mutmut]``): the files mutated are ``fedlib/privacy/`` and the DP parts of the algorithms
(the parts of those files that are not privacy code are fenced off with ``# pragma: no mutate``
regions, each saying why), only lines the privacy tests cover, and the test command is the privacy
tests (``tests/test_privacy*.py``, ``test_local_dp``, ``test_discrete``, ``test_dpsgd``, ``test_ghost``,
``test_call_sites``, ``test_dp_fedavg``; heavy audits and the tests that edit source text by hand
left out). Each mutant is one small edit (a flipped comparison, a changed constant, a dropped
argument); the tests must fail for it ("killed"). The Flower code that applies the mechanisms
(``fedlib/flower/client.py``, ``server.py``, ``records.py``) is in scope too; the in-process Flower
test (``tests/test_flower_inprocess.py``) runs it where mutmut can see it.

mutmut never edits the integers that key a random stream (a round replaced by a constant adds the
same noise in every round): :mod:`lab.key_mutants` makes those edits at every key site and runs the
same tests against each, after mutmut, in the same work folder; its mutants (named ``key:...``)
join the report and its counts like mutmut's.

A mutant the tests do not kill is either a gap (write the test that kills it) or *equivalent*: it
changes no released distribution (an error message, a dtype the next line casts back, a boundary
where both sides compute the same value). Every equivalent mutant is argued in
:data:`EQUIVALENT` (matched on its file and the line it changes, not on mutmut's numbering, which
shifts when the code does). The report, ``data/audits/privacy-mutants.json``, lists every mutant with
its status, the diff and argument of each survivor, and the counts the book shows; the command
fails while any survivor is unexplained.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import hashlib
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

from fedlib.cli import OneLineParser
from fedlib.results import REPO_ROOT, atomic_write_bytes, git_commit
from lab import key_mutants

REPORT = REPO_ROOT / "data" / "audits" / "privacy-mutants.json"

_AT_ONE = ("where the norm equals C both branches give exactly 1 (C / C is 1 in IEEE arithmetic), so "
           "the scale and the release are the same for every input")
_BOUNDARY = ("moves the switch between the float32 and the float64 product onto its boundary value; "
             "there both products are normal-range roundings of the same scaled vector, within the "
             "secure sum's NORM_SLACK (property-tested), so the release's bound is unchanged")
_FIRST_WORD = ("SeedSequence.generate_state(n) returns the first n words of one stream: word 0 is the "
               "same for n = 1 and n = 2, so the seed and every draw are the same")
_DEFAULT_DTYPE = ("torch's default dtype is float32 and fedlib never changes it (no "
                  "set_default_dtype anywhere), so the draw is the same float32 sample")

_LOG_COMB = "val = torch.lgamma(n + 1) - torch.lgamma(r.clamp(0) + 1) - torch.lgamma((n - r).clamp(0) + 1)"
_SIGNS = ("signs = torch.from_numpy(np.where(rng.integers(0, 2, size=m) == 0, -1.0, 1.0))"
          ".to(dev, updates.dtype)")
_FAIR_COIN = ("maps the other face of a fair coin to -1: the random direction is still +1 or -1 with "
              "probability 1/2 each, so its distribution, and every release after it, is the same")

_EXACT_MARGIN = ("changes the working precision (by a few bits) or the safety margin err = 2^-prec of the "
                 "exact comparison of a uniform with exp(-num/den). A round decides only when the "
                 "uniform's interval, of width 2^-bits with prec = bits + 203, is clear of the target "
                 "by err; with the edit a decision can be wrong only if exp(-num/den) lies within "
                 "2^-(prec - 20) of an end of that interval: probability below 2^-180 per comparison "
                 "(tests/test_discrete.py checks the decisions at the boundary against 1000-bit "
                 "arithmetic), far below the 2^-53 resolution of every other draw")

_NO_REPLACE = ("numpy's Generator.choice reads replace as a truth value: None, like False, draws "
               "without replacement")

_LOCAL, _DISCRETE = "fedlib/privacy/local.py", "fedlib/privacy/discrete.py"
_C_ORDER = 'arrays = {k: Array(v.detach().cpu().numpy().copy(order="C"))'


def _swap(file: str, line: str, old: str, new: str, why: str) -> tuple[str, str, str, str]:
    """An entry of :data:`EQUIVALENT`: ``line`` of ``file`` with its first ``old`` made ``new``."""
    if old not in line:
        raise ValueError(f"{old!r} is not in {line!r}")
    return file, line, line.replace(old, new, 1), why


#: Surviving mutants that change no released distribution: (file, the original line, the mutated
#: line, why), each line compared without surrounding whitespace. A test checks that every
#: original line still exists, so an entry cannot outlive the code it argues about.
EQUIVALENT: list[tuple[str, str, str, str]] = [
    _swap(_LOCAL, _SIGNS, "rng.integers(0, 2, size=m)", "rng.integers(2, size=m)",
          "numpy's Generator.integers(2) draws from [0, 2), the same call as integers(0, 2)"),
    _swap(_LOCAL, "top = torch.topk(signs[:, None] * updates, k, dim=1).indices.cpu().numpy()",
          ", dim=1)", ", )", "the updates are 2-d (m, d): torch.topk's default dim, -1, is dim 1"),
    _swap(_LOCAL, "inside = rng.choice(k, size=min(int(nu[i]), k), replace=False)",
          "replace=False", "replace=None", _NO_REPLACE),
    _swap(_LOCAL, "r = rng.choice(d - k, size=h - int(nu[i]), replace=False)",
          "replace=False", "replace=None", _NO_REPLACE),
    _swap(_LOCAL, "nu = rng.choice(h + 1, size=m, p=probs / probs.sum())",
          "probs / probs", "probs * probs",
          "the probabilities are normalised in float64 (logsumexp), so their sum is 1 within ~1e-15: "
          "dividing or multiplying by it changes each by a factor 1 +- 1e-15, and numpy's choice "
          "renormalises its cumulative sum anyway"),
    _swap(_LOCAL, "noisy = grid.encode(kept) + drawn", " + drawn", " - drawn",
          "the discrete Laplace is symmetric about 0: adding -X releases the same distribution as adding X"),
    _swap(_LOCAL,
          "true_l1 = 2.0 * float(mask.reshape(-1, mask.shape[-1]).sum(-1).max()) if mask.numel() else 0.0",
          ".sum(-1)", ".sum(+1)", "the mask is reshaped to 2-d (rows, d), where dim +1 is dim -1"),
    _swap("fedlib/algorithms/signds_fl.py",
          "values = torch.where(mask, c.signds_lr * signs[:, None], torch.zeros_like(flat))", "lr * signs",
          "lr / signs",
          "the signs are exactly +1 or -1, and lr / s equals lr * s for s = +-1 in IEEE arithmetic"),
    _swap("fedlib/algorithms/fdl.py",
          "logw = exponential_mechanism_log_weights(1.0 + v.abs(), c.fdl_epsilon_per_draw)",
          "(1.0 + ", "(2.0 + ",
          "adds the same constant, eps / 2, to every log-weight of a row: the exponential mechanism's "
          "probabilities are unchanged (the Gumbel top-k order too, up to float64 rounding of near-ties, "
          "probability ~1e-16); the filtered coordinates stay at -inf"),
    *[_swap(_DISCRETE, line, a, b, _EXACT_MARGIN) for line, a, b in [
        ("prec = 256", "256", "257"),
        ("with mpmath.workprec(prec + 16):", "+ 16", "- 16"),
        ("with mpmath.workprec(prec + 16):", "16", "17"),
        ("err = mpmath.mpf(2) ** (-prec)", "mpf(2)", "mpf(3)"),
        ("if hi < target - err:", "<", "<="),
        ("if hi < target - err:", "- err", "+ err"),
        ("if lo > target + err:", ">", ">="),
        ("if lo > target + err:", "+ err", "- err"),
        ("prec += 64", "64", "65")]],
    *[_swap(_LOCAL, "n = torch.as_tensor(n, dtype=torch.float64)", "dtype=torch.float64", new,
            "n (k or d - k) is the same for every tau, so lgamma(n + 1), float32 or float64, is one "
            "constant in every log-weight, removed by the normalisation (up to float64 rounding, ~1e-10)")
      for new in ("dtype=None", "")],
    ("fedlib/privacy/local.py", "return torch.topk(log_weights.double() + noise, k, dim=-1).indices",
     "return torch.topk(log_weights.double() + noise, k, ).indices",
     "torch.topk's dim defaults to -1, the same dimension the argument names"),
    *[("fedlib/flower/records.py", _C_ORDER, _C_ORDER.replace('order="C"', new),
       "the copy's memory layout only: flwr's Array serialises with np.save, which records the layout in "
       "its header, and np.load restores the same values in the same shape, so the message carries "
       "the same numbers") for new in ("order=None", 'order="c"')],
    ("fedlib/privacy/clipping.py",
     "scale = torch.where(norm > clip, clip / norm.clamp_min(clip), torch.ones_like(norm))",
     "scale = torch.where(norm >= clip, clip / norm.clamp_min(clip), torch.ones_like(norm))", _AT_ONE),
    ("fedlib/privacy/clipping.py",
     "scale64 = torch.where(norm64 > clip, clip / norm64.clamp_min(clip), torch.ones_like(norm64))",
     "scale64 = torch.where(norm64 >= clip, clip / norm64.clamp_min(clip), torch.ones_like(norm64))",
     _AT_ONE),
    ("fedlib/privacy/clipping.py", "precise = (norm64 > info.max) | (scale < info.tiny)",
     "precise = (norm64 >= info.max) | (scale < info.tiny)", _BOUNDARY),
    ("fedlib/privacy/clipping.py", "precise = (norm64 > info.max) | (scale < info.tiny)",
     "precise = (norm64 > info.max) | (scale <= info.tiny)", _BOUNDARY),
    ("fedlib/privacy/clipping.py",
     "return tmap(lambda x: torch.where(precise, (x.double() * scale64).to(x.dtype), x * scale.to(x.dtype)),",
     "return tmap(lambda x: torch.where(precise, (x.double() * scale64).to(x.dtype), x * scale.to(None)),",
     "the scale is computed from the norm in the leaves' dtype, so casting it to that dtype is the "
     "identity (a tree's leaves share one dtype; flat_norm assumes it too)"),
    ("fedlib/privacy/noise.py", "seed = int(np.random.SeedSequence(list(parts)).generate_state(1)[0])",
     "seed = int(np.random.SeedSequence(list(parts)).generate_state(2)[0])", _FIRST_WORD),
    ("fedlib/privacy/noise.py",
     "seed = int(np.random.SeedSequence([*self.key, client, step]).generate_state(1)[0])",
     "seed = int(np.random.SeedSequence([*self.key, client, step]).generate_state(2)[0])", _FIRST_WORD),
    ("fedlib/privacy/noise.py",
     "z = torch.randn(x.shape, generator=generator, dtype=torch.float32, device=generator.device)",
     "z = torch.randn(x.shape, generator=generator, dtype=None, device=generator.device)", _DEFAULT_DTYPE),
    ("fedlib/privacy/noise.py",
     "z = torch.randn(x.shape, generator=generator, dtype=torch.float32, device=generator.device)",
     "z = torch.randn(x.shape, generator=generator, device=generator.device)", _DEFAULT_DTYPE),
    ("fedlib/privacy/local.py", "return torch.where(u < p, center + level, center - level).to(values.dtype)",
     "return torch.where(u <= p, center + level, center - level).to(values.dtype)",
     "differs only where the float64 uniform equals p exactly, an event of probability at most 2^-53 "
     "(one atom of the uniform), which moves P[+] by at most that atom"),
    ("fedlib/privacy/local.py", "out[mask] = values[mask] + noise", "out[mask] = values[mask] - noise",
     "subtracts the Laplace noise instead of adding it; Laplace(0, b) is symmetric, so the released "
     "distribution is the same"),
    ("fedlib/privacy/local.py", _LOG_COMB, _LOG_COMB.replace("lgamma(n + 1)", "lgamma(n + 2)"),
     "n is the same for every tau within one call (k, or d - k), so the edit adds one finite constant "
     "to every log-weight, which the normalisation removes"),
    ("fedlib/privacy/local.py", _LOG_COMB, _LOG_COMB.replace("r.clamp(0) + 1", "r.clamp(1) + 1"),
     "differs only at r = 0, where lgamma(2) = lgamma(1) = 0: the same value"),
    ("fedlib/privacy/local.py", _LOG_COMB, _LOG_COMB.replace("(n - r).clamp(0) + 1", "(n - r).clamp(1) + 1"),
     "differs only at n - r = 0, where lgamma(2) = lgamma(1) = 0 (negative n - r is masked out)"),
    ("fedlib/privacy/local.py", _SIGNS, _SIGNS.replace("== 0, -1.0", "== 1, -1.0"), _FAIR_COIN),
    ("fedlib/privacy/local.py", _SIGNS, _SIGNS.replace("== 0, -1.0", "!= 0, -1.0"), _FAIR_COIN),
    ("fedlib/privacy/noise.py", "lap = -scale * torch.sign(u) * torch.log1p(-2 * u.abs())",
     "lap = +scale * torch.sign(u) * torch.log1p(-2 * u.abs())",
     "negates every Laplace draw; Laplace(0, b) is symmetric, so the released distribution is the same "
     "(the draws differ, as with another seed)"),
]

#: Flower's transport around the algorithm (fedlib/flower/server.py, client.py): what these lines
#: carry is logged, labelled or scheduled, never released or accounted.
_CLIENT, _SERVER = "fedlib/flower/client.py", "fedlib/flower/server.py"
_THREADS = ("the ClientApp's torch thread count: where the work runs, not what it computes; the "
            "privacy noise comes from keyed generators whatever the thread count, and the client reads "
            "a missing count as 1, the value every caller passes")
_GROUP = ("Flower's group id labels a round's messages for its logs; neither app reads it, and Flower "
          "delivers replies by message id")
_METRICS = ("the MetricRecord a round returns goes to Flower's log only; the result's history is "
            "written from the same round record through on_round, and the released model, noise and "
            "accounting are fixed before this line")
_ON_ROUND = ("on_round writes the result file and the progress bar after the round's release and "
             "accounting; a wrong wall time or a crash here changes no released value (a crash ends "
             "the run with an error)")
_ON_ROUND_CALL = ("self.on_round(ctx.t, {**rec, TRANSPORT: transport(replies, t0, received)}, "
                  "time.time() - t0)")
_NUMERIC = "numeric = {k: float(v) for k, v in rec.items() if isinstance(v, (int, float)) and v == v}"
_GROUP_LINE = "message_type=MessageType.TRAIN, group_id=str(server_round))"
_JOB = 'self.job = {"config": json.dumps(experiment.config.to_dict()), "threads": threads}'
_STATE = "return from_records(context.state[key]) if key in context.state else node.initial_state(c)"
FLOWER_EQUIVALENT: list[tuple[str, str, str, str]] = [
    _swap(_CLIENT, _STATE, "initial_state(c)", "initial_state(None)",
          "NodeClients.initial_state ignores its client id: every client starts from the algorithm's "
          "state for the seeded initial model, as in the engine"),
    _swap(_SERVER, "threads: int = 1):", "1", "2", _THREADS),
    _swap(_SERVER, _JOB, '"threads"', '"XXthreadsXX"', _THREADS),
    _swap(_SERVER, _JOB, '"threads"', '"THREADS"', _THREADS),
    _swap(_SERVER, "self._round: tuple[list[int], RoundContext, float] | None = None", "= None", '= ""',
          "the initial value is overwritten by configure_train before aggregate_train reads it "
          "(Flower configures a round before it aggregates it)"),
    _swap(_SERVER, _GROUP_LINE, "group_id=str(server_round)", "group_id=None", _GROUP),
    (_SERVER, _GROUP_LINE, "message_type=MessageType.TRAIN, )", _GROUP),
    _swap(_SERVER, _GROUP_LINE, "str(server_round)", "str(None)", _GROUP),
    _swap(_SERVER, "uploads = metrics = None", "None", '""',
          "the value stays only when no client is sampled, and then Experiment.aggregate takes its "
          "no-client branch (the server step on empty uploads) without reading uploads or metrics"),
    _swap(_SERVER, _ON_ROUND_CALL, "ctx.t", "None", _ON_ROUND),
    _swap(_SERVER, _ON_ROUND_CALL, "time.time() - t0)", "None)", _ON_ROUND),
    _swap(_SERVER, _ON_ROUND_CALL, "time.time() - t0", "time.time() + t0", _ON_ROUND),
    (_SERVER, _NUMERIC, "numeric = None", _METRICS),
    _swap(_SERVER, _NUMERIC, ") and v == v", ") or v == v", _METRICS),
    _swap(_SERVER, _NUMERIC, "v == v", "v != v", _METRICS),
    _swap(_SERVER, "return to_records(self.exp.gparams)[0], MetricRecord(numeric)", "MetricRecord(numeric)",
          "MetricRecord(None)", _METRICS),
    *[_swap(_SERVER, 'if name == "app":', a, b,
            "how Flower's app loader finds the deployment's ServerApp (fedlib.flower.server:app): a "
            "wrong name fails the deployment's start, it releases nothing")
      for a, b in (("==", "!="), ('"app"', '"XXappXX"'), ('"app"', '"APP"'))],
]
EQUIVALENT += FLOWER_EQUIVALENT

_DEVICE_ARG = re.compile(r"device=[\w.]+")
_DEVICE_VALUE = re.compile(r"(?<=[(,\s])(?:[\w.]*\bdevice|dev)\b(?!\s*=)")


def _squeeze(line: str) -> str:
    """A line without whitespace and without the empty argument slots that removing one leaves."""
    line = re.sub(r"\s+", "", line)
    while True:
        shorter = line.replace("(,", "(").replace(",,", ",").replace(",)", ")")
        if shorter == line:
            return line
        line = shorter


def device_only(old: str, new: str) -> bool:
    """Whether a mutant only drops a device argument (``device=x``, or a positional ``x.device`` /
    ``device`` / ``dev``) or replaces it by None: the tensor is then made on (or left on) the CPU.
    Device placement never changes a value: on a CPU nothing changes; on a GPU a CPU tensor of more
    than zero dimensions combined with a GPU one raises, or is copied unchanged (tests/test_cuda.py
    runs the mechanisms there), so no released value changes silently."""
    if old == new:
        return False
    target = _squeeze(new)
    for pattern in (_DEVICE_ARG, _DEVICE_VALUE):
        for m in pattern.finditer(old):
            for repl in ("", "None", "device=None"):
                if _squeeze(old[:m.start()] + repl + old[m.end():]) == target:
                    return True
    return False


#: A recorded release's label (:class:`fedlib.privacy.record.Release`'s ``mechanism``) names the
#: call for people; :func:`fedlib.privacy.record.check` compares only its noise multiplier or epsilon.
_RELEASE_LABEL = re.compile(r"""Release\((None|"[^"]*"|'[^']*')""")


_INSTRUMENTATION = re.compile(r"^note_(draw|key)\(")


def instrumentation_only(old: str, new: str) -> bool:
    """Whether a mutant changes only a call that records what a mechanism drew, or which key seeded a
    generator (:func:`fedlib.privacy.record.note_draw` / ``note_key``): those calls append to a log
    that exists only inside a test's ``drawing`` block and return nothing, so no release depends on
    them (the tests check that every mechanism records non-empty draws, which kills a call emptied
    by a mutant)."""
    a, b = _INSTRUMENTATION.match(old), _INSTRUMENTATION.match(new)
    return bool(a and b and a.group(1) == b.group(1))


def release_label_only(old: str, new: str) -> bool:
    """Whether a mutant changes only the label of a recorded :class:`Release` (its first argument)."""
    return (old != new and bool(_RELEASE_LABEL.search(old))
            and _RELEASE_LABEL.sub("Release(L", old) == _RELEASE_LABEL.sub("Release(L", new))


def _mutmut(args: list[str], cwd: Path, env: dict) -> str:
    """Run one short mutmut command (results, show, version) in ``cwd`` and return its output."""
    out = subprocess.run([sys.executable, "-m", "mutmut", *args], cwd=cwd, env=env, text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    if out.returncode not in (0, 1):  # mutmut exits 1 when there are survivors
        raise RuntimeError(f"mutmut {' '.join(args)} failed with {out.returncode}: {out.stdout[-2000:]}")
    return out.stdout


def _mutmut_run(cwd: Path, env: dict, log, budget_s: float | None, names: list[str] = ()) -> bool:
    """``mutmut run`` in ``cwd`` (only the mutants matching ``names``, globs, if given); past
    ``budget_s`` seconds it is interrupted as Ctrl-C would (mutmut saves each mutant's verdict as
    it comes, so the next run goes on from there). Returns whether it finished."""
    proc = subprocess.Popen([sys.executable, "-m", "mutmut", "run", *names], cwd=cwd, env=env, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        code = proc.wait(timeout=budget_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=300)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        return False
    if code not in (0, 1):
        raise RuntimeError(f"mutmut run failed with {code}: see {cwd / 'mutmut.log'}")
    return True


#: Exit codes of mutants a stopped run left undecided (pytest's "interrupted", SIGINT, SIGTERM):
#: reset to "not checked" so that the next run tests them again.
INTERRUPTED = (2, -2, -15)


def reset_interrupted(workdir: Path) -> int:
    """Mark the mutants that an interrupted run left half-tested as not checked; their count."""
    count = 0
    for meta in (workdir / "mutants").rglob("*.meta"):
        data = json.loads(meta.read_text())
        codes = data.get("exit_code_by_key", {})
        stale = [k for k, v in codes.items() if v in INTERRUPTED]
        if stale:
            codes.update(dict.fromkeys(stale))
            atomic_write_bytes(meta, json.dumps(data).encode())
            count += len(stale)
    return count


#: The file in a work folder that holds the fingerprint of the tests its verdicts were made with.
TESTS_MARK = "tests.sha256"
#: The file in a work folder that says which commit its code was copied from.
SOURCE_MARK = "source.json"


def tests_fingerprint(root: Path) -> str:
    """SHA-256 of what decides a mutant's verdict besides its own code: every file under ``tests/``
    and ``pyproject.toml`` (mutmut's settings, the test selection)."""
    h = hashlib.sha256()
    for f in sorted([*(root / "tests").rglob("*"), root / "pyproject.toml"]):
        if f.is_file() and "__pycache__" not in f.parts:
            h.update(str(f.relative_to(root)).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def forget_stale_verdicts(workdir: Path) -> bool:
    """Drop mutmut's state in ``workdir`` when the tests changed since its verdicts were made
    (mutmut keeps a verdict while the mutated function is unchanged, even when a new test would now
    kill a survivor, or a removed one no longer kills it). Returns whether it did; records the
    current fingerprint."""
    mark, now = workdir / TESTS_MARK, tests_fingerprint(workdir)
    stale = (workdir / "mutants").exists() and (not mark.exists() or mark.read_text() != now)
    if stale:
        shutil.rmtree(workdir / "mutants")
    atomic_write_bytes(mark, now.encode())
    return stale


def copy_repository(target: Path, source: Path = REPO_ROOT) -> None:
    """The tracked files (and untracked, not ignored ones) of the repository ``source`` into
    ``target``, replacing an earlier copy there but keeping mutmut's state (``mutants/``, whose
    verdicts stay valid for every function that did not change) and its log. Copies keep their
    modification times, which is how mutmut tells which files changed."""
    for old in target.iterdir():
        if old.name not in ("mutants", "mutmut.log", TESTS_MARK, SOURCE_MARK, key_mutants.VERDICTS):
            shutil.rmtree(old) if old.is_dir() and not old.is_symlink() else old.unlink()
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=source,
                           capture_output=True, check=True).stdout.split(b"\0")
    for f in files:
        if not f:
            continue
        src = source / f.decode()
        if src.is_file() and not src.is_symlink():
            dst = target / f.decode()
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)


_DIFF_LINE = re.compile(r"^([-+])(?![-+]{2} )(.*)$")


def changed_lines(diff: str) -> tuple[str, str]:
    """The original and the mutated line of a one-line mutmut diff (stripped)."""
    old = [m.group(2).strip() for m in map(_DIFF_LINE.match, diff.splitlines()) if m and m.group(1) == "-"]
    new = [m.group(2).strip() for m in map(_DIFF_LINE.match, diff.splitlines()) if m and m.group(1) == "+"]
    return " / ".join(old), " / ".join(new)


def source_file(name: str) -> str:
    """``fedlib.privacy.clipping.x_clip_by_l2__mutmut_6`` -> ``fedlib/privacy/clipping.py``."""
    module = name.split(".x")[0] if ".x" in name else name.rsplit(".", 1)[0]
    return module.replace(".", "/") + ".py"


_STRING = re.compile(r"""(?:[rbfRBF]{0,2})("(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')""")
_MESSAGE_CALL = re.compile(r"^(raise \w+\(|errs\.append\(|warnings\.warn\(|print\(|log\("
                           r"|return \[(?=[rbfRBF]{0,2}[\"']))")


def message_only(old: str, new: str) -> bool:
    """Whether a mutant changes only the text of a message: the line raises the same exception, or
    appends to (or returns) a list of configuration errors, with another message (or None); or it is a
    bare string literal (a continuation of such a message) changed into another one."""
    m_old, m_new = _MESSAGE_CALL.match(old), _MESSAGE_CALL.match(new)
    if m_old and m_new and m_old.group(1) == m_new.group(1):
        return True
    bare = lambda line: _STRING.sub("S", line).strip().rstrip(",)") in ("S", "S S")  # noqa: E731
    return bare(old) and bare(new)


def equivalence(file: str, old: str, new: str) -> str | None:
    """Why a surviving mutant changes no released distribution, or None (a gap)."""
    if message_only(old, new):
        return "changes the text of an error or a message only, not what is released"
    if device_only(old, new):
        return ("changes only the device a tensor is made on: identical values on a CPU; on a GPU an "
                "error (a CPU tensor meets a GPU one) or the same values copied, never another "
                "released value")
    if release_label_only(old, new):
        return ("changes only the label of a recorded release, which names the call for people; the "
                "check of what was released against what is accounted reads its noise multiplier "
                "or epsilon only")
    if instrumentation_only(old, new):
        return ("changes only what a mechanism notes of its draws or keys for the tests (a log kept "
                "inside a test's drawing block, read by nothing else), not what it releases")
    for f, o, n, why in EQUIVALENT:
        if f == file and o == old and n == new:
            return why
    return None


#: Statuses that count as detected: the tests failed, crashed the test process (a segfault: a
#: mutant that hands a native routine a bad argument), or ran past mutmut's time limit (a mutant
#: that makes a sampler loop for ever; the limit is on CPU time and on wall time, the latter a
#: multiple of the test's measured duration, so run it on an otherwise idle machine).
DETECTED = ("killed", "timeout", "segfault", "caught by type check")


def parse_results(text: str) -> list[dict]:
    """The mutants listed by ``mutmut results --all true``: name and status."""
    out = []
    for line in text.splitlines():
        m = re.match(r"\s*([\w.\u01c1]+__mutmut_\d+): (.+)$", line)
        if m:
            out.append({"name": m.group(1), "status": m.group(2).strip()})
    return out


def summarise(mutants: list[dict], finished: bool) -> dict:
    """Counts, score and completeness of a list of mutants (each with its ``status``, and with
    ``equivalent`` where a survivor is argued to change nothing released).

    The score is detected / (checked - equivalent); ``complete`` is whether every mutant was
    checked, so that a report of a run cut short says so rather than passing for a full one."""
    counts: dict[str, int] = {}
    for mt in mutants:
        counts[mt["status"]] = counts.get(mt["status"], 0) + 1
    unchecked = counts.get("not checked", 0)
    detected = sum(counts.get(s, 0) for s in DETECTED)
    equivalent = sum("equivalent" in mt for mt in mutants)
    unexplained = [mt for mt in mutants if mt["status"] not in (*DETECTED, "not checked")
                   and "equivalent" not in mt]
    checked = len(mutants) - unchecked
    return {"generated": len(mutants), "checked": checked, "complete": finished and unchecked == 0,
            "counts": counts, "detected": detected, "equivalent": equivalent,
            "unexplained": len(unexplained),
            "score": round(detected / max(1, checked - equivalent), 4)}


def run(workdir: Path | None = None, budget_min: float | None = None, source: Path = REPO_ROOT,
        names: list[str] = (), timeout_multiplier: float | None = None) -> dict:
    """Run mutmut on a copy of the repository and return the report (see the module docstring).

    ``workdir`` keeps mutmut's state between runs: the repository is copied over it again, mutmut
    regenerates the mutants of the functions that changed and tests only the mutants without a
    verdict; if the tests changed, every verdict is dropped first (:func:`forget_stale_verdicts`).
    With ``budget_min`` the run stops after that many minutes (plus mutmut's start-up
    and the report) and the report says how many mutants are still unchecked. ``source`` is the
    repository to mutate (another one only in the tests). ``names`` (globs of mutant names, e.g.
    ``fedlib.privacy.clipping.*``) tests only those mutants, again even where they have a verdict.
    ``timeout_multiplier`` replaces the configured one in the copy: mutmut also limits each
    mutant's wall time to that multiple of its tests' measured time, which a busy machine can
    exceed (a false "timeout"); it is recorded in the report."""
    if importlib.util.find_spec("mutmut") is None:
        # ``python -m mutmut`` would then exit with 1, which mutmut also uses for "survivors": the
        # run would report zero mutants as complete (seen on the GPU node, which lacks mutmut)
        raise RuntimeError(f"mutmut is not installed in {sys.executable}: make test-privacy-mutants "
                           "installs it (pinned in requirements.txt)")
    start = time.time()
    commit = git_commit()  # of the code as it is copied, not as it is when the run ends
    tmp = Path(workdir or tempfile.mkdtemp(prefix="fedlib-mutants-"))
    tmp.mkdir(parents=True, exist_ok=True)
    with _exclusive(tmp), _terminate_as_exit():
        return _run_locked(tmp, workdir, budget_min, source, names, timeout_multiplier, start, commit)


@contextlib.contextmanager
def _exclusive(workdir: Path):
    """Hold the work folder for one run: a second run there would edit the same files (the key
    mutants are written into the copy and restored) and build mutmut's state from them."""
    with open(workdir / ".run.lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RuntimeError(f"another mutation run is using {workdir}: wait for it or stop it") from None
        yield


@contextlib.contextmanager
def _terminate_as_exit():
    """SIGTERM (a stopped job) unwinds like an exception, so that a key mutant written into the
    copy is restored (and a running test process killed) before the run ends."""
    previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _run_locked(tmp: Path, workdir: Path | None, budget_min: float | None, source: Path, names,
                timeout_multiplier: float | None, start: float, commit: str) -> dict:
    copy_repository(tmp, source)
    if timeout_multiplier is not None:
        cfg = tmp / "pyproject.toml"
        cfg.write_text(re.sub(r"(?m)^timeout_multiplier = .*$", f"timeout_multiplier = {timeout_multiplier}",
                              cfg.read_text()))
    if forget_stale_verdicts(tmp):
        print(f"the tests changed since the verdicts in {tmp} were made: testing every mutant again",
              file=sys.stderr)
    atomic_write_bytes(tmp / SOURCE_MARK, json.dumps({"commit": commit}).encode())
    reset_interrupted(tmp)
    budget_s = None if budget_min is None else budget_min * 60
    with open(tmp / "mutmut.log", "a") as log:
        finished = _mutmut_run(tmp, _env(), log, budget_s, list(names))
        if finished:
            tested = parse_results(_mutmut(["results", "--all", "true"], tmp, _env()))
            if all(m["status"] == "not checked" for m in tested):
                # mutmut exits with 1 for survivors and also when it stops early (a test that fails
                # on the unmutated code, a bad pragma): then it has made or tested no mutants, and
                # the key mutants must not run on a copy it may have left half-built
                raise RuntimeError(f"mutmut made no mutants or stopped before testing any (a test failing "
                                   f"on the unmutated code, a bad pragma): see {tmp / 'mutmut.log'}")
        if finished and not names:  # then the key mutants (lab.key_mutants), in what is left
            left = None if budget_s is None else max(0.0, budget_s - (time.time() - start))
            finished = key_mutants.test_pending(tmp, tests_fingerprint(tmp), left, log)
    report = build_report(tmp, finished, minutes=round((time.time() - start) / 60, 1))
    if workdir is None:
        shutil.rmtree(tmp, ignore_errors=True)
    if not report["generated"]:
        raise RuntimeError(f"mutmut made no mutants of {source}: check [tool.mutmut] in pyproject.toml"
                           + ("" if workdir is None else f" and {tmp / 'mutmut.log'}"))
    return report


def _env() -> dict:
    """mutmut's environment: the shared data folder, and one OpenMP thread (mutmut forks a process
    per mutant, and a child forked after a parallel region deadlocks (see tests/conftest.py), which
    mutmut would count as a timeout, "detected")."""
    from fedlib.data import data_dir

    env = {**os.environ, "FEDLIB_DATA_DIR": str(data_dir().resolve()), "PYTHONUNBUFFERED": "1",
           "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    env.pop("FEDLIB_RESULTS_DIR", None)
    return env


def build_report(workdir: Path, finished: bool = True, minutes: float | None = None) -> dict:
    """The report of the verdicts kept in ``workdir`` (see the module docstring): every mutant with
    its status, each survivor with its diff and the argument that it is equivalent, if any; the
    commit the code was copied from and the fingerprint of the tests that made the verdicts.
    ``finished``: whether the run that made them ended by itself (not stopped at its budget)."""
    env = _env()
    reset_interrupted(workdir)
    mutants = parse_results(_mutmut(["results", "--all", "true"], workdir, env))
    for mt in mutants:
        mt["file"] = source_file(mt["name"])
        if mt["status"] not in (*DETECTED, "not checked"):
            old, new = changed_lines(_mutmut(["show", mt["name"]], workdir, env))
            mt.update({"old": old, "new": new})
            why = equivalence(mt["file"], old, new)
            if why:
                mt["equivalent"] = why
    mutants += key_mutants.entries(workdir, tests_fingerprint(workdir))
    source = workdir / SOURCE_MARK
    return {
        "tool": "mutmut " + _mutmut(["--version"], workdir, env).strip().split()[-1],
        "commit": json.loads(source.read_text())["commit"] if source.exists() else "unknown",
        "tests_sha256": tests_fingerprint(workdir),
        "time": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "minutes": minutes,
        "timeout_multiplier": tomllib.loads((workdir / "pyproject.toml").read_text())["tool"]["mutmut"]
        .get("timeout_multiplier"),
        **summarise(mutants, finished),
        "mutants": mutants,
    }


def load_report(path: Path = REPORT) -> dict | None:
    """The committed report, or None where mutation testing has not been run."""
    return json.loads(path.read_text()) if path.exists() else None


def by_file(report: dict) -> list[dict]:
    """Per mutated file: mutants generated, checked, detected, argued equivalent, unexplained."""
    rows: dict[str, dict] = {}
    for mt in report["mutants"]:
        r = rows.setdefault(mt["file"], {"file": mt["file"], "generated": 0, "checked": 0, "detected": 0,
                                         "equivalent": 0, "unexplained": 0})
        r["generated"] += 1
        r["checked"] += mt["status"] != "not checked"
        r["detected"] += mt["status"] in DETECTED
        r["equivalent"] += "equivalent" in mt
        r["unexplained"] += mt["status"] not in (*DETECTED, "not checked") and "equivalent" not in mt
    return sorted(rows.values(), key=lambda r: r["file"])


def score_text(report: dict) -> str:
    """The score as a percentage that reads 100 % only when no survivor is unexplained (0.9997 with
    one gap is 99.97 %, not a rounded 100.0 %)."""
    digits = 1
    while report["unexplained"] and round(100 * report["score"], digits) >= 100 and digits < 6:
        digits += 1
    return f"{100 * report['score']:.{digits}f} %"


def describe(report: dict | None) -> str:
    """A paragraph for the book: what the mutation testing of the privacy code found."""
    if report is None:
        return ("Mutation testing of the privacy code (`make test-privacy-mutants`) has not been run "
                "for this build, so no mutation score is shown.")
    text = (f"{report['tool']} made {report['generated']:,} small edits (mutants) of the privacy code "
            f"at commit `{report['commit'][:10]}` and ran the privacy tests against "
            f"{report['checked']:,} of them: {report['detected']:,} were detected (a test failed or "
            f"timed out), {report['equivalent']:,} survivors are argued equivalent (they change no "
            f"released distribution) and {report['unexplained']:,} survivors are unexplained, gaps "
            f"in the tests. Score {score_text(report)} (detected over checked non-equivalent).")
    keys = [mt for mt in report["mutants"] if mt.get("operator")]
    if keys:
        text += (f" {len(keys):,} of the mutants are key mutations, which mutmut does not make: a round, "
                 f"step or client index in a privacy stream's key replaced by a constant, an element "
                 f"of a key dropped, or two mechanisms' streams swapped "
                 f"({sum(mt['status'] in DETECTED for mt in keys):,} detected).")
    if not report["complete"]:
        text += (f" **The run is incomplete**: {report['generated'] - report['checked']:,} mutants "
                 f"are not checked yet, so the score covers only part of the code; "
                 f"`make test-privacy-mutants` goes on from where it stopped.")
    return text


WORKDIR = REPO_ROOT / ".mutants"


def run_keys(patterns: list[str]) -> int:
    """Test the key mutants matching ``patterns`` in a fresh copy of the repository and print each
    verdict (a developer's check; ``run`` tests them all and writes the report). Exit 1 if one
    survives without an argument."""
    with tempfile.TemporaryDirectory(prefix="fedlib-key-mutants-") as tmp:
        work = Path(tmp)
        copy_repository(work)
        sha = tests_fingerprint(work)
        names = {m.name for m in key_mutants.chosen(patterns, work)}
        key_mutants.skip_all_but(work, sha, names)
        key_mutants.test_pending(work, sha, log=sys.stdout)
        mine = [e for e in key_mutants.entries(work, sha) if e["name"] in names]
    survivors = [e for e in mine if e["status"] not in DETECTED]
    for e in survivors:
        argued = f" (argued: {e['equivalent'][:80]}...)" if "equivalent" in e else ""
        print(f"{e['status']}: {e['name']}{argued}")
    print(f"{len(mine) - len(survivors)} of {len(mine)} detected")
    return 1 if any("equivalent" not in e for e in survivors) else 0


def main(argv: list[str] | None = None) -> int:
    p = OneLineParser(prog="python -m lab.privacy_mutants",
                                description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="run mutmut on the privacy code and write the report")
    r.add_argument("--workdir", "--keep", type=Path, default=WORKDIR,
                   help="mutmut's working copy, kept so that a later run goes on where this one "
                        "stopped (default: .mutants/, git-ignored)")
    r.add_argument("--budget-min", type=float, default=None,
                   help="stop testing mutants after this many minutes (default: test them all)")
    r.add_argument("--only", nargs="+", default=[], metavar="GLOB",
                   help="test only the mutants whose names match (e.g. 'fedlib.privacy.clipping.*')")
    r.add_argument("--timeout-multiplier", type=float, default=None,
                   help="mutmut's wall-time limit per mutant, as a multiple of its tests' time "
                        "(raise it on a busy machine; default: pyproject.toml's)")
    r.add_argument("--out", type=Path, default=REPORT)
    k = sub.add_parser("keys", help="test only key mutants (lab.key_mutants) in a fresh copy and print "
                                    "each verdict; writes no report")
    k.add_argument("--only", nargs="+", default=["*"], metavar="GLOB",
                   help="only the key mutants whose names match (python -m lab.key_mutants lists them)")
    b = sub.add_parser("report", help="write the report of the verdicts kept in a work folder, "
                                      "running nothing")
    b.add_argument("--workdir", type=Path, default=WORKDIR)
    b.add_argument("--out", type=Path, default=REPORT)
    args = p.parse_args(argv)
    if args.command == "keys":
        if not key_mutants.chosen(args.only):
            p.error(f"no key mutant matches {args.only}")
        return run_keys(args.only)
    if args.command == "report":
        if not (args.workdir / "mutants").is_dir():
            p.error(f"{args.workdir} holds no mutmut verdicts (no mutants/ folder)")
        report = build_report(args.workdir)
        # the run's own duration, kept from the report it wrote (the verdicts carry no clock)
        before = load_report(args.out) if args.out.exists() else None
        same = ("commit", "tests_sha256")
        if before and all(before[k] == report[k] for k in same):
            report["minutes"] = before.get("minutes")
    else:
        if args.budget_min is not None and args.budget_min <= 0:
            p.error(f"--budget-min must be positive, got {args.budget_min}")
        report = run(args.workdir, args.budget_min, names=args.only,
                     timeout_multiplier=args.timeout_multiplier)
    atomic_write_bytes(args.out, json.dumps(report, indent=1, ensure_ascii=False).encode())
    took = "" if report["minutes"] is None else f" ({report['minutes']} min)"
    print(f"{report['checked']} of {report['generated']} mutants checked: {report['counts']}; "
          f"equivalent {report['equivalent']}, unexplained survivors {report['unexplained']}, "
          f"score {score_text(report)}{took} -> {args.out}")
    for mt in report["mutants"]:
        if mt["status"] not in (*DETECTED, "not checked") and "equivalent" not in mt:
            print(f"  {mt['status']}: {mt['name']}\n    - {mt['old']}\n    + {mt['new']}")
    if not report["complete"]:
        print(f"incomplete: {report['generated'] - report['checked']} mutants not checked yet; the "
              f"same command goes on from here (its state is in {args.workdir})")
    return 1 if report["unexplained"] else (0 if report["complete"] else 3)


if __name__ == "__main__":
    from fedlib.cli import entry

    sys.exit(entry(main, "python -m lab.privacy_mutants"))

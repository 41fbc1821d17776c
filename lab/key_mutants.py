"""Key mutations: edits of the integers that key a privacy stream, which mutmut does not make.

mutmut varies operators and constants; it never replaces the round in ``noise_seed(Stream.X, ctx.t)``
by a constant, although that one edit adds the same noise vector in every round (the difference of
two releases then carries no noise at all, issue 44). This module makes that class of mutant at
every place a privacy stream's key is built or handed on, and runs the privacy tests against each,
like :mod:`lab.privacy_mutants` does for mutmut's (which calls :func:`test_pending` and merges the verdicts
into the same report).

A *site* is a call that keys a random stream of a privacy mechanism, found in the source (:func:`sites`):

* ``noise_seed``, ``generator_for``, ``rng_for``, ``SeedSequence``, ``default_rng`` and
  ``StepNoise`` calls in :data:`KEY_FILES`, except those keyed by a public stream (minibatches,
  dropout, the partition: not privacy mechanisms), and the key tuples inside
  :meth:`fedlib.algorithms.base.Algorithm.noise_seed` itself;
* in the Flower code that applies the mechanisms (:data:`FLOWER_FILES`), the round and the client
  it hands to them: ``RoundContext``, ``sample_clients``, ``client_plan`` and a node's ``run``, and
  the ``"round"`` / ``"client"`` entries of a job.

Operators (:func:`mutants`), each one edit at one site:

* ``constant``: a round, step or client index (``t``, ``ctx.t``, ``client``, ``cid``, ``step``)
  replaced by ``0``;
* ``drop``: one element of a key removed (an argument of a key call, an element of a key list or
  tuple, a ``*key`` expansion);
* ``stream``: the stream id replaced by another privacy stream used in the same file (two
  mechanisms then share a stream);
* ``accumulate``: an accumulation in the privacy code (:data:`ACCUMULATE_FILES`: ``x += y`` or
  ``x = x + y``) replaced by an assignment (``x = y``): an accountant that keeps only its last
  round's epsilon, a noisy sum that keeps only its last client (issue 65).

A surviving key mutant is a gap unless it is argued in :data:`EQUIVALENT` (file, the original
line, the mutated line, why), as for mutmut's.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from fedlib.cli import OneLineParser
from fedlib.results import REPO_ROOT, atomic_write_bytes

#: The files whose key calls are mutated: the privacy code, the algorithms that apply it, where a
#: round's plan keys record sampling (experiment) and where Poisson batches are drawn (engine).
KEY_FILES = ("fedlib/algorithms/base.py", "fedlib/privacy/noise.py", "fedlib/privacy/discrete.py",
             "fedlib/privacy/central.py", "fedlib/algorithms/dp_fedavg.py", "fedlib/algorithms/moon_dpap.py",
             "fedlib/algorithms/sparse.py", "fedlib/algorithms/ldp_fl.py", "fedlib/algorithms/signds_fl.py",
             "fedlib/algorithms/fdl.py", "fedlib/experiment.py", "fedlib/engine.py")
#: The Flower code that hands the round and the client to the mechanisms.
FLOWER_FILES = ("fedlib/flower/client.py", "fedlib/flower/server.py")

#: The files whose accumulations are mutated (the ``accumulate`` operator): where privacy is added up.
ACCUMULATE_FILES = ("fedlib/privacy/guarantee.py", "fedlib/privacy/accounting.py",
                    "fedlib/privacy/central.py", "fedlib/privacy/record.py", "fedlib/privacy/dpsgd.py",
                    "fedlib/privacy/ghost.py")

#: Calls whose arguments are a stream's key.
KEY_CALLS = {"noise_seed", "generator_for", "rng_for", "SeedSequence", "default_rng", "StepNoise"}
#: Calls (in the Flower files) that hand a round or a client to the mechanisms.
HANDOFF_CALLS = {"RoundContext", "sample_clients", "client_plan", "run"}
#: Names of round, step and client indices.
INDEX_NAMES = {"t", "client", "cid", "step", "round_", "server_round"}
#: Streams of public randomness (not a privacy mechanism's): their call sites are not mutated.
PUBLIC_STREAMS = {"DATA_SUBSET", "PARTITION", "BATCHES", "DROPOUT", "SAMPLING"}
#: Streams of one mechanism defined in different files (a swap candidate across files).
STREAM_PARTNERS = {"RECORD_SAMPLING": ("RECORD_NOISE",), "RECORD_NOISE": ("RECORD_SAMPLING",)}

#: The tests each key mutant runs against: the mutation run's selection, the independence test
#: first so that most mutants fail within seconds (``-x``).
FIRST_TESTS = ("tests/test_noise_independence.py", "tests/test_flower_inprocess.py")


@dataclass(frozen=True)
class KeyMutant:
    """One edit of one key: ``old`` (a segment of ``file`` at 1-based ``line``, column ``col``)
    becomes ``new``."""

    file: str
    line: int
    col: int
    end_line: int
    end_col: int
    old: str
    new: str
    operator: str  # constant | drop | stream | accumulate

    @property
    def name(self) -> str:
        return f"key:{self.file}:{self.line}:{self.operator}:{self.old}->{self.new or '(dropped)'}"

    def apply(self, text: str) -> str:
        """``text`` (the file's source) with this edit."""
        lines = text.splitlines(keepends=True)
        start, end = _offset(lines, self.line, self.col), _offset(lines, self.end_line, self.end_col)
        if text[start:end] != self.old:
            raise ValueError(f"{self.name}: {self.file}:{self.line} no longer reads {self.old!r}")
        return text[:start] + self.new + text[end:]

    def lines(self, text: str) -> tuple[str, str]:
        """The original and the mutated line(s) (stripped, joined by " / "), as the report shows them."""
        a = text.splitlines()[self.line - 1:self.end_line]
        shown = self.end_line - self.line + 1 - (self.old.count("\n") - self.new.count("\n"))
        b = self.apply(text).splitlines()[self.line - 1:self.line - 1 + shown]
        return " / ".join(s.strip() for s in a), " / ".join(s.strip() for s in b)


def _offset(lines: list[str], line: int, col: int) -> int:
    """The string index of ast's (1-based line, UTF-8 byte column) in the text of ``lines``."""
    return sum(len(s) for s in lines[:line - 1]) + len(lines[line - 1].encode()[:col].decode())


def _callee(node: ast.Call) -> str | None:
    f = node.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None


def _is_index(node: ast.expr) -> bool:
    return ((isinstance(node, ast.Name) and node.id in INDEX_NAMES)
            or (isinstance(node, ast.Attribute) and node.attr in INDEX_NAMES))


def _stream_name(node: ast.expr) -> str | None:
    if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "Stream"):
        return node.attr
    return None


def _streams_in(node: ast.AST) -> set[str]:
    return {s for n in ast.walk(node) if (s := _stream_name(n))}


@dataclass(frozen=True)
class Site:
    """A key: the elements that make it (arguments or a list/tuple display's elements)."""

    file: str
    line: int
    call: str
    elements: tuple[ast.expr, ...]
    droppable: bool


def _key_elements(args: list[ast.expr]) -> list[ast.expr]:
    """A key call's elements: its arguments, with a list/tuple display (or ``list(x)``) opened."""
    out: list[ast.expr] = []
    for a in args:
        if isinstance(a, (ast.List, ast.Tuple)):
            out.extend(a.elts)
        else:
            out.append(a)
    return out


def sites(root: Path = REPO_ROOT) -> list[Site]:
    """Every key site of :data:`KEY_FILES` and :data:`FLOWER_FILES` (see the module docstring)."""
    found: list[Site] = []
    for rel in (*KEY_FILES, *FLOWER_FILES):
        if not (root / rel).is_file():  # another repository (the driver's own tests)
            continue
        tree = ast.parse((root / rel).read_text())
        flower = rel in FLOWER_FILES
        noise_seed_defs = [n for n in ast.walk(tree)
                           if isinstance(n, ast.FunctionDef) and n.name == "noise_seed"]
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                name = _callee(node)
                if not flower and name in KEY_CALLS:
                    if _streams_in(node) & PUBLIC_STREAMS:
                        continue
                    args = node.args[:1] if name == "StepNoise" else node.args  # StepNoise(key, std, ...)
                    found.append(Site(rel, node.lineno, name, tuple(_key_elements(args)), True))
                elif flower and name in HANDOFF_CALLS:
                    elements = tuple(e for e in _key_elements(node.args) if _is_index(e))
                    if elements:
                        found.append(Site(rel, node.lineno, name, elements, False))
            elif flower and isinstance(node, ast.Dict):
                elements = tuple(v for k, v in zip(node.keys, node.values, strict=True)
                                 if isinstance(k, ast.Constant) and k.value in ("round", "client")
                                 and _is_index(v))
                if elements:
                    found.append(Site(rel, node.lineno, "job", elements, False))
        for fn in noise_seed_defs:  # the key tuples noise_seed builds (in its body, not its annotation)
            for node in (n for stmt in fn.body for n in ast.walk(stmt)):
                if isinstance(node, ast.Tuple) and len(node.elts) >= 2:
                    found.append(Site(rel, node.lineno, "noise_seed key", tuple(node.elts), True))
    return sorted(found, key=lambda s: (s.file, s.line))


def _segment(lines: list[str], node: ast.expr) -> tuple[int, int, int, int, str]:
    seg = ast.get_source_segment("".join(lines), node)
    return node.lineno, node.col_offset, node.end_lineno, node.end_col_offset, seg


def mutants(root: Path = REPO_ROOT) -> list[KeyMutant]:
    """Every key mutant of every site (see the module docstring), in a stable order."""
    out: list[KeyMutant] = []
    streams_by_file: dict[str, set[str]] = {}
    all_sites = sites(root)
    for s in all_sites:
        streams_by_file.setdefault(s.file, set()).update(
            n for e in s.elements if (n := _stream_name(e)))
    texts = {f: (root / f).read_text() for f in {s.file for s in all_sites}}
    for s in all_sites:
        lines = texts[s.file].splitlines(keepends=True)
        for i, e in enumerate(s.elements):
            line, col, end_line, end_col, seg = _segment(lines, e)
            if _is_index(e):
                out.append(KeyMutant(s.file, line, col, end_line, end_col, seg, "0", "constant"))
            stream = _stream_name(e)
            if stream:
                others = (streams_by_file[s.file] | set(STREAM_PARTNERS.get(stream, ()))) - {stream}
                out += [KeyMutant(s.file, line, col, end_line, end_col, seg, f"Stream.{o}", "stream")
                        for o in sorted(others)]
            if s.droppable:
                # remove the element with the separator that follows it (or, for the last, precedes it)
                if i + 1 < len(s.elements):
                    nxt = s.elements[i + 1]
                    end_line, end_col = nxt.lineno, nxt.col_offset
                elif i > 0:
                    prev = s.elements[i - 1]
                    line, col = prev.end_lineno, prev.end_col_offset
                dropped = "".join(lines)[_offset(lines, line, col):_offset(lines, end_line, end_col)]
                out.append(KeyMutant(s.file, line, col, end_line, end_col, dropped, "", "drop"))
    out += accumulation_mutants(root)
    unique = {m.name: m for m in out}
    return sorted(unique.values(), key=lambda m: (m.file, m.line, m.col, m.operator, m.new))


def _fenced(text: str) -> set[int]:
    """1-based lines inside ``# pragma: no mutate start`` / ``end`` regions (not privacy code)."""
    fenced, inside = set(), False
    for i, line in enumerate(text.splitlines(), 1):
        if "pragma: no mutate start" in line:
            inside = True
        elif "pragma: no mutate end" in line:
            inside = False
        elif inside or "pragma: no mutate" in line:
            fenced.add(i)
    return fenced


def accumulation_mutants(root: Path = REPO_ROOT) -> list[KeyMutant]:
    """The ``accumulate`` operator: every ``x += y`` and ``x = x + y`` of :data:`ACCUMULATE_FILES`
    outside fenced regions, each made ``x = y``."""
    out: list[KeyMutant] = []
    for rel in ACCUMULATE_FILES:
        if not (root / rel).is_file():
            continue
        text = (root / rel).read_text()
        lines, fenced = text.splitlines(keepends=True), _fenced(text)
        for node in ast.walk(ast.parse(text)):
            if node.lineno in fenced if isinstance(node, ast.stmt) else True:
                continue
            target = value = None
            if isinstance(node, ast.AugAssign) and isinstance(node.op, ast.Add):
                target, value = node.target, node.value
            elif (isinstance(node, ast.Assign) and len(node.targets) == 1
                  and isinstance(node.value, ast.BinOp) and isinstance(node.value.op, ast.Add)
                  and ast.get_source_segment(text, node.value.left) == ast.get_source_segment(
                      text, node.targets[0])):
                target, value = node.targets[0], node.value.right
            if target is None:
                continue
            line, col, end_line, end_col, seg = _segment(lines, node)
            new = f"{ast.get_source_segment(text, target)} = {ast.get_source_segment(text, value)}"
            out.append(KeyMutant(rel, line, col, end_line, end_col, seg, new, "accumulate"))
    return out


#: Surviving key mutants that change no released distribution: (file, original line, mutated
#: line, why), compared without surrounding whitespace; a test checks every original line exists.
_SECRET = ("under randomness='secret' every key starts with 128 fresh bits of OS entropy, drawn anew at "
           "each call: two keys coincide with probability 2^-128 whatever follows them, so the "
           "stream id and the round add nothing to a key's uniqueness and no draw repeats without them "
           "(the seeded branch, which the simulations use, keeps them and its mutants are killed)")
_SECRET_LINE = "parts = (secrets.randbits(128), int(stream), t)"
_RECORD_LINE = ('return StepNoise(self.noise_seed(Stream.RECORD_NOISE, t), self.record["sigma"] * '
                'self.config.dp_clip,')
_EXCLUSIVE = ("MOON-DPAP's DP modes are exclusive (config.dp is one of none, record, central, local): a "
              "record-level run draws no {} noise, so the stream is this line's alone, and its keys "
              "(seed, stream, round, client, step) stay distinct across rounds, clients and steps")
_SAMPLING = ("the record-level run's Poisson sampling (fedlib.experiment) uses that stream id with keys "
             "(seed, stream, round, client) of four integers, the noise (seed, stream, round, client, "
             "step) of five: no key is shared (SeedSequence hashes the whole list, so a longer key is "
             "another stream), and the two feed different generators (numpy's for the sampling, "
             "torch's for the noise); the tests' key check, which fails on a repeated key, passes")
_CENTRAL_LINE = "return self.noise_seed(Stream.CENTRAL_NOISE, ctx.t)"
_SAMPLING_LINE = "keys = [algo.noise_seed(Stream.RECORD_SAMPLING, t, cid) for cid in selected]"
_CENTRAL_EXCLUSIVE = ("MOON-DPAP's DP modes are exclusive (config.dp is one of none, record, central, "
                      "local): a client-level (central) run draws no {} noise, so the stream is this "
                      "line's alone, and its keys (seed, stream, round) differ from round to round")
EQUIVALENT: list[tuple[str, str, str, str]] = [
    *[("fedlib/algorithms/moon_dpap.py", _CENTRAL_LINE, _CENTRAL_LINE.replace("CENTRAL_NOISE", other),
       _CENTRAL_EXCLUSIVE.format(what)) for other, what in (("LOCAL_NOISE", "local"),
                                                             ("RECORD_NOISE", "record-level"))],
    ("fedlib/experiment.py", _SAMPLING_LINE, _SAMPLING_LINE.replace("RECORD_SAMPLING", "RECORD_NOISE"),
     "the record-level noise uses that stream id with keys (seed, stream, round, client, step) of five "
     "integers, the sampling (seed, stream, round, client) of four: no key is shared (SeedSequence "
     "hashes the whole list), and the two feed different generators (numpy's for the sampling, "
     "torch's for the noise); the tests' key check, which fails on a repeated key, passes"),
    ("fedlib/experiment.py", _SAMPLING_LINE, _SAMPLING_LINE.replace("Stream.RECORD_SAMPLING, ", ""),
     "the sampling keys become (seed, round, client): still distinct for every round and client, and "
     "no other privacy key of a record-level run has three integers (only MOON-DPAP's record mode "
     "samples records, and its noise keys have five), so no stream is shared and the released "
     "distribution is the same in this code. The stream id is what keeps such keys apart in general: "
     "the key-shape test added after this report (tests/test_noise_independence.py) fails on it"),
    *[("fedlib/algorithms/moon_dpap.py", _RECORD_LINE, _RECORD_LINE.replace("RECORD_NOISE", other), why)
      for other, why in (("CENTRAL_NOISE", _EXCLUSIVE.format("client-level (central)")),
                         ("LOCAL_NOISE", _EXCLUSIVE.format("local")), ("RECORD_SAMPLING", _SAMPLING))],
    ("fedlib/privacy/guarantee.py", "self.gaussian_rounds += 1", "self.gaussian_rounds = 1",
     "gaussian_rounds is read only as 'any Gaussian round yet' (== 0); the epsilon comes from the RDP "
     "curve, which accumulates on its own line (whose accumulate mutant is killed)"),
    ("fedlib/algorithms/base.py", _SECRET_LINE, "parts = (secrets.randbits(128), t)", _SECRET),
    ("fedlib/algorithms/base.py", _SECRET_LINE, "parts = (secrets.randbits(128), int(stream))", _SECRET),
    ("fedlib/algorithms/base.py", _SECRET_LINE, "parts = (secrets.randbits(128), int(stream), 0)", _SECRET),
]


def equivalence(file: str, old: str, new: str) -> str | None:
    for f, o, n, why in EQUIVALENT:
        if f == file and o == old and n == new:
            return why
    return None


def _tests(root: Path) -> list[str]:
    import tomllib

    selection = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["mutmut"][
        "pytest_add_cli_args_test_selection"]
    return [*[t for t in FIRST_TESTS if t in selection], *[t for t in selection if t not in FIRST_TESTS]]


def _pytest(root: Path, timeout_s: float) -> tuple[str, float]:
    """Run the test selection in ``root``: ``killed`` (a test failed or the tests could not even be
    collected), ``survived``, or ``timeout``; and the seconds it took."""
    env = {**os.environ, "PYTHONPATH": str(root), "PYTHONDONTWRITEBYTECODE": "1",
           "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    env.pop("FEDLIB_RESULTS_DIR", None)
    cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-p", "no:randomly",
           "-m", "not heavy and not source_mutation", "--no-header", "-o", "addopts=", *_tests(root)]
    start = time.time()
    try:
        code = subprocess.run(cmd, cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              timeout=timeout_s).returncode
    except subprocess.TimeoutExpired:
        return "timeout", time.time() - start
    return ("survived" if code == 0 else "killed"), time.time() - start


VERDICTS = "key-verdicts.json"


def _verdict_key(m: KeyMutant, source: str, tests_sha: str) -> str:
    """A verdict stays valid while the mutated file and the tests are unchanged."""
    return hashlib.sha256(f"{m.name}\0{source}\0{tests_sha}".encode()).hexdigest()


def _verdicts(workdir: Path) -> dict:
    path = workdir / VERDICTS
    return json.loads(path.read_text()) if path.exists() else {}


def test_pending(workdir: Path, tests_sha: str, budget_s: float | None = None, log=None) -> bool:
    """Test the key mutants of the copy ``workdir`` (made by
    :func:`lab.privacy_mutants.copy_repository`) that have no verdict yet, each against the privacy
    tests with the mutated file written into the copy (and restored). Verdicts are kept in
    ``workdir`` and stay valid while the mutated file and the tests (their fingerprint
    ``tests_sha``, :func:`lab.privacy_mutants.tests_fingerprint`) are unchanged. Past
    ``budget_s`` seconds no new mutant is started. Returns whether every mutant has a verdict."""
    found = mutants(workdir)
    verdicts = _verdicts(workdir)
    texts = {f: (workdir / f).read_text() for f in {m.file for m in found}}
    pending = [m for m in found if _verdict_key(m, texts[m.file], tests_sha) not in verdicts]
    if not pending:
        return True
    clean, clean_s = _pytest(workdir, 3600)
    if clean != "survived":
        raise RuntimeError(f"the privacy tests fail on the unmutated copy in {workdir}: fix them first")
    timeout_s = 3 * clean_s + 30  # as mutmut limits a mutant: a multiple of the clean time and a constant
    start = time.time()
    for n, m in enumerate(pending, 1):
        if budget_s is not None and time.time() - start > budget_s:
            return False
        original = texts[m.file]
        (workdir / m.file).write_text(m.apply(original))
        try:
            status, took = _pytest(workdir, timeout_s)
        finally:
            (workdir / m.file).write_text(original)
        verdicts[_verdict_key(m, original, tests_sha)] = status
        atomic_write_bytes(workdir / VERDICTS, json.dumps(verdicts, indent=0).encode())
        if log is not None:
            print(f"key mutant {n}/{len(pending)}: {status} ({took:.0f} s) {m.name}", file=log, flush=True)
    return True


def entries(workdir: Path, tests_sha: str) -> list[dict]:
    """Every key mutant of ``workdir`` as an entry of the mutation report: name, file, operator,
    status (``not checked`` without a valid verdict) and, for a survivor, its lines and the argument
    that it is equivalent, if any. Runs nothing."""
    found = mutants(workdir)
    verdicts = _verdicts(workdir)
    out = []
    for m in found:
        original = (workdir / m.file).read_text()
        status = verdicts.get(_verdict_key(m, original, tests_sha), "not checked")
        entry = {"name": m.name, "file": m.file, "operator": m.operator, "status": status}
        if status == "survived":
            old, new = m.lines(original)
            entry.update({"old": old, "new": new})
            why = equivalence(m.file, old, new)
            if why:
                entry["equivalent"] = why
        out.append(entry)
    return out


def chosen(patterns: list[str], root: Path = REPO_ROOT) -> list[KeyMutant]:
    """The key mutants of ``root`` whose names match one of the glob ``patterns``."""
    import fnmatch

    return [m for m in mutants(root) if any(fnmatch.fnmatch(m.name, g) for g in patterns)]


def skip_all_but(workdir: Path, tests_sha: str, names: set[str]) -> None:
    """Give every key mutant of ``workdir`` not in ``names`` the verdict ``skipped``, so that
    :func:`test_pending` tests only those (a developer's partial run; never a report's)."""
    verdicts = _verdicts(workdir)
    for m in mutants(workdir):
        if m.name not in names:
            verdicts[_verdict_key(m, (workdir / m.file).read_text(), tests_sha)] = "skipped"
    atomic_write_bytes(workdir / VERDICTS, json.dumps(verdicts).encode())


def main(argv: list[str] | None = None) -> int:

    p = OneLineParser(prog="python -m lab.key_mutants", description=__doc__.splitlines()[0])
    p.add_argument("--only", nargs="+", default=["*"], metavar="GLOB",
                   help="only the mutants whose names match (e.g. 'key:fedlib/algorithms/base.py*')")
    args = p.parse_args(argv)
    found = chosen(args.only)
    for m in found:
        print(m.name)
    print(f"{len(found)} of {len(mutants())} key mutants, at {len(sites())} sites; test them with "
          "python -m lab.privacy_mutants keys [--only GLOB]")
    return 0


if __name__ == "__main__":
    from fedlib.cli import entry

    sys.exit(entry(main, "python -m lab.key_mutants"))


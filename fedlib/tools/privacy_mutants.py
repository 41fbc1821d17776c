"""Mutation testing of the privacy code with mutmut: ``make test-privacy-mutants``.

``python -m fedlib.tools.privacy_mutants run`` copies the repository into a temporary folder and runs
`mutmut <https://github.com/boxed/mutmut>`_ 3 there with the configuration in ``pyproject.toml``
(``[tool.mutmut]``): the files mutated are ``fedlib/privacy/`` and the DP parts of the algorithms
(the parts of those files that are not privacy code are fenced off with ``# pragma: no mutate``
regions, each saying why), only lines the privacy tests cover, and the test command is the privacy
tests (``tests/test_privacy*.py``, ``test_local_dp``, ``test_discrete``, ``test_dpsgd``,
``test_call_sites``, ``test_dp_fedavg``; heavy audits and the tests that edit source text by hand
left out). Each mutant is one small edit (a flipped comparison, a changed constant, a dropped
argument); the tests must fail for it ("killed").

A mutant the tests do not kill is either a gap (write the test that kills it) or *equivalent*: it
changes no released distribution (an error message, a dtype the next line casts back, a boundary
where both sides compute the same value). Every equivalent mutant is argued in
:data:`EQUIVALENT` (matched on its file and the line it changes, not on mutmut's numbering, which
shifts when the code does). The report, ``data/audits/privacy-mutants.json``, lists every mutant with
its status, the diff and argument of each survivor, and the counts the book shows; the command
fails while any survivor is unexplained.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from fedlib.results import REPO_ROOT, atomic_write_bytes, git_commit

REPORT = REPO_ROOT / "data" / "audits" / "privacy-mutants.json"

#: Surviving mutants that change no released distribution: (file, the original line, the mutated
#: line, why), each line compared without surrounding whitespace.
EQUIVALENT: list[tuple[str, str, str, str]] = []


def _mutmut(args: list[str], cwd: Path, env: dict, log=None, timeout: float | None = None) -> str:
    out = subprocess.run([sys.executable, "-m", "mutmut", *args], cwd=cwd, env=env, text=True,
                         stdout=subprocess.PIPE if log is None else log, stderr=subprocess.STDOUT,
                         timeout=timeout)
    if out.returncode not in (0, 1):  # mutmut exits 1 when there are survivors
        raise RuntimeError(f"mutmut {' '.join(args)} failed with {out.returncode}: "
                           f"{(out.stdout or '')[-2000:]}")
    return out.stdout or ""


def copy_repository(target: Path) -> None:
    """The tracked files (and untracked, not ignored ones) of the repository into ``target``."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO_ROOT,
                           capture_output=True, check=True).stdout.split(b"\0")
    for f in files:
        if not f:
            continue
        src = REPO_ROOT / f.decode()
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
_MESSAGE_CALL = re.compile(r"^(raise \w+\(|errs\.append\(|warnings\.warn\(|print\(|log\()")


def message_only(old: str, new: str) -> bool:
    """Whether a mutant changes only the text of a message: the line raises the same exception, or
    appends to the same list of configuration errors, with another message (or None); or it is a
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
    for f, o, n, why in EQUIVALENT:
        if f == file and o == old and n == new:
            return why
    return None


def run(workdir: Path | None = None, timeout_h: float = 6.0) -> dict:
    """Run mutmut on a copy of the repository and return the report (see the module docstring)."""
    from fedlib.data import data_dir

    start = time.time()
    tmp = Path(workdir or tempfile.mkdtemp(prefix="fedlib-mutants-"))
    copy_repository(tmp)
    env = {**os.environ, "FEDLIB_DATA_DIR": str(data_dir().resolve()), "PYTHONUNBUFFERED": "1"}
    env.pop("FEDLIB_RESULTS_DIR", None)
    with open(tmp / "mutmut.log", "w") as log:
        _mutmut(["run"], tmp, env, log=log, timeout=timeout_h * 3600)
    lines = _mutmut(["results", "--all", "true"], tmp, env).splitlines()
    mutants = []
    for line in lines:
        m = re.match(r"\s*([\w.]+__mutmut_\d+): (.+)$", line)
        if m:
            mutants.append({"name": m.group(1), "status": m.group(2).strip()})
    for mt in mutants:
        mt["file"] = source_file(mt["name"])
        if mt["status"] != "killed":
            diff = _mutmut(["show", mt["name"]], tmp, env)
            old, new = changed_lines(diff)
            mt.update({"old": old, "new": new})
            why = equivalence(mt["file"], old, new)
            if why:
                mt["equivalent"] = why
    counts: dict[str, int] = {}
    for mt in mutants:
        counts[mt["status"]] = counts.get(mt["status"], 0) + 1
    unexplained = [mt for mt in mutants if mt["status"] != "killed" and "equivalent" not in mt]
    equivalent = sum("equivalent" in mt for mt in mutants)
    report = {
        "tool": "mutmut " + _mutmut(["--version"], tmp, env).strip().split()[-1],
        "commit": git_commit(),
        "time": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "minutes": round((time.time() - start) / 60, 1),
        "generated": len(mutants),
        "counts": counts,
        "equivalent": equivalent,
        "unexplained": len(unexplained),
        "score": round(counts.get("killed", 0) / max(1, len(mutants) - equivalent), 4),
        "mutants": mutants,
    }
    if workdir is None:
        shutil.rmtree(tmp, ignore_errors=True)
    return report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m fedlib.tools.privacy_mutants",
                                description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="run mutmut on the privacy code and write the report")
    r.add_argument("--keep", type=Path, default=None, help="work in this folder and keep it (mutmut's cache)")
    r.add_argument("--out", type=Path, default=REPORT)
    args = p.parse_args(argv)
    report = run(args.keep)
    atomic_write_bytes(args.out, json.dumps(report, indent=1).encode())
    print(f"{report['generated']} mutants: {report['counts']}; equivalent {report['equivalent']}, "
          f"unexplained survivors {report['unexplained']} ({report['minutes']} min) -> {args.out}")
    for mt in report["mutants"]:
        if mt["status"] != "killed" and "equivalent" not in mt:
            print(f"  {mt['status']}: {mt['name']}\n    - {mt['old']}\n    + {mt['new']}")
    return 1 if report["unexplained"] else 0


if __name__ == "__main__":
    sys.exit(main())

"""One place where every command line of the project (``fedlib``, ``fedlib.flower``, ``lab.*``,
``studies``) ends: :func:`entry` runs a command's ``main`` and turns the ways it can stop into one
line and an exit status (issue 65).

* Ctrl-C (SIGINT): one line, exit 130; SIGTERM: one line, exit 143. A training run has written its
  checkpoints as it went (every few rounds): rerunning the same command resumes from the last one.
  The parallel path's worker processes ignore SIGINT (the parent stops them).
* A closed pipe (``... | head -1``): nothing more is written, exit 141 (as a shell reports SIGPIPE).
* The project's own errors (a refused configuration, a result or archive that does not verify, a
  folder that cannot be written, data that cannot be read, a missing device): ``error: <one line>``,
  exit 1. ``FEDLIB_DEBUG=1`` lets the traceback through instead.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Callable


class OneLineParser(argparse.ArgumentParser):
    """An argument parser whose errors are one line (``error: ...``) and exit status 2 (its
    subcommands' parsers too)."""

    def error(self, message: str):  # type: ignore[override]
        print(f"error: {message} (see --help)", file=sys.stderr)
        sys.exit(2)


class Terminated(BaseException):
    """SIGTERM, raised in the main thread so that ``finally`` blocks (workers, locks) run."""


def _terminate(signum, frame) -> None:
    raise Terminated()


def _checkpoints() -> str:
    try:
        from fedlib.results import checkpoint_dir

        return str(checkpoint_dir())
    except Exception:  # noqa: BLE001 - only a hint
        return "the checkpoint folder"


def one_line(e: BaseException) -> str:
    """An error's message on one line (at most 400 characters)."""
    text = " ".join(str(e).split()) or type(e).__name__
    return text if len(text) <= 400 else text[:397] + "..."


def entry(main: Callable[[], int | None], what: str = "the command") -> int:
    """Run ``main`` (a command's, reading ``sys.argv``) and return its exit status, every way it
    can stop being one line on stderr (see the module docstring)."""
    if os.environ.get("FEDLIB_DEBUG") == "1":
        return main() or 0
    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        return main() or 0
    except KeyboardInterrupt:
        print(f"\ninterrupted: {what} stopped; a training run resumes from its last checkpoint "
              f"({_checkpoints()}) when the same command is run again", file=sys.stderr)
        return 130
    except Terminated:
        print(f"terminated: {what} stopped; a training run resumes from its last checkpoint "
              f"({_checkpoints()}) when the same command is run again", file=sys.stderr)
        return 143
    except BrokenPipeError:
        try:  # the reader is gone: say nothing more, and let the interpreter's final flush be silent
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return 141
    except (OSError, ValueError, RuntimeError, LookupError) as e:
        print(f"error: {one_line(e)} (FEDLIB_DEBUG=1 shows the traceback)", file=sys.stderr)
        return 1
    finally:
        signal.signal(signal.SIGTERM, previous)

"""Freed host memory kept for the next step: a CPU training step that does not page-fault.

PyTorch allocates CPU tensors with the C library's ``malloc``. glibc serves a request above its
mmap threshold (128 KiB at first, rising with use to at most 32 MiB) with freshly mapped pages,
unmaps them again on ``free``, and trims the top of its heap back to the kernel. A training step
allocates and frees the same large activations, gradients and lane stacks every step, so every
step maps them, has the kernel zero-fill each page on first touch (a minor page fault) and
unmaps them. Measured on the project's 2-core CPU (``getrusage``, FDL with the McMahan CNN, two
runs on the vectorized path, 100 clients): 38-43 % of the process's CPU time was spent in the
kernel, 250,000 page faults a second.

:func:`keep_freed_memory` asks glibc (``mallopt``) to serve every request from its heap
(``M_MMAP_MAX = 0``) and never to trim it (``M_TRIM_THRESHOLD``), so that what a step frees is
reused by the next one. In the same measurement the kernel's share fell from 38 % to 9 % and a
run-round took 21 % less time (26 % more rounds a second); at 20 clients 37 % less. The numbers
do not change (where memory comes from is not arithmetic: ``tests/test_host_memory.py`` trains
a run both ways and compares bit for bit). The cost: the process keeps its peak memory until it
exits, and the heap fragments. That cost decides the default: the peak resident size rose from
10.9 to 15.0 GB in that measurement, and the FDL paper campaign (two runs of 100 clients and
60,000 samples stacked) grew from 6.6 GB to 19-21 GB within minutes, too much for a 24 GB machine.
So glibc's own behaviour stays the default; keeping memory is for a vectorized CPU run that has
memory to spare. The CPU's default path, ``parallel``, barely faults (its tensors are one
client's, under glibc's adaptive threshold: 3 % of the CPU time in the kernel, measured on the
sequential path its workers run) and is the faster path on a CPU anyway.

It acts on glibc only (Linux; elsewhere it does nothing and says so) and once per process
(forked workers inherit it). The option ``host_memory`` (:func:`fedlib.kernels.set_kernel_options`,
``lab.bench --host-memory``) chooses: ``system`` (glibc's own behaviour), the default, or
``reuse``; the environment variable ``FEDLIB_HOST_MEMORY`` sets the same option for a process that
does not call fedlib's API directly, e.g. ``FEDLIB_HOST_MEMORY=reuse python -m lab.campaign run``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import platform

#: ``mallopt`` parameters (glibc's ``malloc.h``).
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
#: Trim threshold large enough never to be reached (glibc stores it as a ``size_t``; the ``int``
#: argument's largest value is 2 GiB, above which freed heap would be given back).
_NEVER_TRIM = 2**31 - 1

_APPLIED: list[str] = []


def _libc() -> ctypes.CDLL | None:
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    name = ctypes.util.find_library("c") or "libc.so.6"
    try:
        libc = ctypes.CDLL(name)
        return libc if hasattr(libc, "mallopt") else None
    except OSError:
        return None


def keep_freed_memory() -> str:
    """Ask glibc to keep freed memory for reuse (see the module's docstring), once per process.

    Returns what holds now: ``"reuse"`` (set now or earlier), or ``"unavailable"`` (not glibc,
    or ``mallopt`` refused). Never raises: this is a speed setting, not a correctness one."""
    if _APPLIED:
        return _APPLIED[0]
    libc = _libc()
    ok = libc is not None and libc.mallopt(_M_MMAP_MAX, 0) == 1 \
        and libc.mallopt(_M_TRIM_THRESHOLD, _NEVER_TRIM) == 1
    _APPLIED.append("reuse" if ok else "unavailable")
    return _APPLIED[0]


def state() -> str:
    """``"reuse"`` once :func:`keep_freed_memory` has acted in this process, ``"unavailable"``
    where it could not, ``"system"`` before (glibc's own behaviour)."""
    return _APPLIED[0] if _APPLIED else "system"

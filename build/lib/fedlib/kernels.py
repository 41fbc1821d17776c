"""CUDA kernel settings: the choices that change a GPU run's numbers or its speed.

:func:`make_deterministic` is what every CUDA run starts from (:func:`fedlib.run.pick_device`);
:func:`kernel_settings` is what each CUDA result records in its provenance (``meta.kernels``);
:func:`set_kernel_options` turns the speed options on for a benchmark (issue 24 measures them on
a GPU before any becomes a default). Besides the libraries' flags, one option of fedlib's own:
``cuda_graphs``, the vectorized path's step captured once per round and replayed as a CUDA graph
(:mod:`fedlib.graphs`); on a CPU none of these has an effect. And one that acts on every device:
``lane_conv``, how a convolution computes (:class:`fedlib.models.LaneConv2d`): ``grouped``, PyTorch's
convolution (under the engine's vmap, one grouped convolution over the lanes), or ``im2col``, the
patches unfolded and multiplied by the weights (under vmap, one batched matrix multiply over the
lanes); equal in exact arithmetic, so which is faster is for ``lab.bench --lane-conv`` to measure on
each device (issue 37 item 4). And ``step_noise``, how record-level DP-SGD draws the noise of each
(client, step) (:class:`fedlib.privacy.noise.StepNoise`): ``generator``, a ``torch.Generator``
seeded per pair (the stream of every committed result), or ``counter``, Philox4x32-10 in tensor
operations (:mod:`fedlib.privacy.philox`), every lane of a vectorized step in one draw (issue 37
items 1 and 3). A CPU result records these two only when they are not the default. And
``host_memory``, whether CPU training keeps freed host memory for the next step
(:mod:`fedlib.host_memory`: ``system``, the default, or ``reuse``; the same numbers either way).

The arithmetic of a result (:func:`arithmetic`): float32 on every device. PyTorch leaves TF32 on in
cuDNN convolutions on Ampere and later (10-bit mantissas); fedlib turns it off at the first CUDA run of
a process (:func:`make_deterministic`), so that a GPU run computes in the same float32 as a CPU run
and a comparison never mixes TF32 and float32 runs (issue 64). ``lab.bench --options-sweep`` times
the ``cudnn_tf32`` variant beside it; results trained before this default record ``cudnn_tf32: true``
and :func:`arithmetic` calls them TF32.
"""

from __future__ import annotations

import os

import torch

#: fedlib's own speed options (process-wide, like PyTorch's flags): see :func:`set_kernel_options`.
#: CUDA graphs are on by default on CUDA (issue 37): a capture that fails falls back to the eager
#: step (:func:`note_capture_failure`), which the results record.
_OPTIONS: dict[str, bool | str] = {"cuda_graphs": True, "lane_conv": "grouped", "step_noise": "generator",
                                   "noise_ahead": "auto", "noise_pool": "processes",
                                   "host_memory": os.environ.get("FEDLIB_HOST_MEMORY", "system")}
#: How :class:`fedlib.models.LaneConv2d` computes (see the module's docstring).
LANE_CONVS = ("grouped", "im2col")
#: How record-level DP-SGD's step noise is drawn (see the module's docstring).
STEP_NOISES = ("generator", "counter")
#: When the server's exact discrete Gaussian is drawn ahead, by noise workers while the clients
#: train (:func:`fedlib.privacy.central.prefetch_noisy_sum`; the same values either way, so results
#: do not record it): ``auto``, on CUDA only (a CPU's cores are busy training); ``on``; ``off``.
NOISE_AHEAD = ("auto", "on", "off")
#: What draws the server noise ahead: worker ``processes`` (the default) or ``threads``. NumPy's
#: rejection loops run many small array operations, each of which takes the GIL, so threads scale
#: poorly (8 threads on the H200 machine's 16 cores drew 2.4x as fast as one) and slow the training
#: thread's kernel launches; processes draw in parallel. The same values either way.
NOISE_POOLS = ("processes", "threads")
#: Whether CPU training keeps freed host memory for reuse (:mod:`fedlib.host_memory`); the same
#: numbers either way. Its default can be set with the environment variable ``FEDLIB_HOST_MEMORY``.
HOST_MEMORY = ("reuse", "system")
if _OPTIONS["host_memory"] not in HOST_MEMORY:
    raise ValueError(f"FEDLIB_HOST_MEMORY must be one of {HOST_MEMORY}, got {_OPTIONS['host_memory']!r}")
#: The options that act on every device, with their defaults (a CPU result records the others).
DEVICE_OPTIONS = {"lane_conv": "grouped", "step_noise": "generator"}
#: Why the first capture of this process failed (empty: none failed); from then on the step is eager.
_CAPTURE_FAILURE: list[str] = []
#: Whether this process's TF32 setting of cuDNN convolutions has been chosen: by the first CUDA run
#: (fedlib's default, off) or by an explicit :func:`set_kernel_options` (kept as chosen).
_CONV_PRECISION_CHOSEN: list[bool] = []


def note_capture_failure(reason: str) -> bool:
    """Record that a capture failed (the step runs eagerly from now on in this process); True the
    first time, when the caller says so in one line."""
    first = not _CAPTURE_FAILURE
    if first:
        _CAPTURE_FAILURE.append(reason)
    return first


def capture_failure() -> str | None:
    """Why this process's first capture failed, or None."""
    return _CAPTURE_FAILURE[0] if _CAPTURE_FAILURE else None


def make_deterministic() -> None:
    """Ask CUDA for run-to-run reproducible kernels, so that one config and seed give the same
    result on one device: deterministic cuDNN convolutions (no autotuning) and a fixed cuBLAS
    workspace. Operations without a deterministic CUDA kernel warn instead of failing.
    (Results still differ *between* devices: other GPUs, TF32 convolutions, CPU vs GPU round
    differently.)"""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    torch.use_deterministic_algorithms(True, warn_only=True)
    if not _CONV_PRECISION_CHOSEN:  # float32 convolutions, as on a CPU (see the module's docstring)
        torch.backends.cudnn.allow_tf32 = False
        _CONV_PRECISION_CHOSEN.append(True)


def arithmetic(meta: dict, precision: str = "float32") -> str:
    """The arithmetic a result was trained in, from its provenance (``meta``) and its config's
    ``precision``: ``TF32`` for a CUDA result whose recorded kernel settings (``meta.kernels``) had
    TF32 on in cuDNN convolutions or float32 matmuls, else ``precision`` (``float32`` for every CPU
    result and every CUDA result since float32 became the default)."""
    kernels = meta.get("kernels") or {}
    on_cuda = str(meta.get("device", "")).startswith("cuda")
    if precision == "float32" and on_cuda and (kernels.get("cudnn_tf32") or kernels.get("matmul_tf32")):
        return "TF32"
    return precision


def kernel_settings() -> dict[str, bool | str]:
    """The CUDA kernel settings in force now that change a GPU run's numbers or speed:
    deterministic cuDNN algorithms, cuDNN autotuning (``cudnn_benchmark``; with
    ``cudnn_deterministic`` it chooses among deterministic algorithms only), TF32 in cuDNN
    convolutions (PyTorch's default: on; fedlib's from the first CUDA run: off) and in float32
    matmuls (default: off), whether the
    vectorized path replays its step as a CUDA graph (``cuda_graphs``, default: on) and whether a
    capture failed so that the step ran eagerly instead (``cuda_graphs_fell_back``). Every CUDA
    result records them in its provenance (``kernels``): two settings may round differently."""
    return {"cudnn_deterministic": bool(torch.backends.cudnn.deterministic),
            "cudnn_benchmark": bool(torch.backends.cudnn.benchmark),
            "cudnn_tf32": bool(torch.backends.cudnn.allow_tf32),
            "matmul_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
            "cuda_graphs": bool(_OPTIONS["cuda_graphs"]),
            "cuda_graphs_fell_back": capture_failure() is not None,
            "lane_conv": str(_OPTIONS["lane_conv"]),
            "step_noise": str(_OPTIONS["step_noise"]), "noise_ahead": str(_OPTIONS["noise_ahead"]),
            "noise_pool": str(_OPTIONS["noise_pool"])}


def set_kernel_options(*, matmul_tf32: bool | None = None, cudnn_autotune: bool | None = None,
                       cudnn_tf32: bool | None = None, cuda_graphs: bool | None = None,
                       lane_conv: str | None = None, step_noise: str | None = None,
                       noise_ahead: str | None = None, noise_pool: str | None = None,
                       host_memory: str | None = None) -> dict[str, bool | str]:
    """Turn the speed options of :func:`kernel_settings` on or off (None: leave as is) and return
    the settings now in force. Autotuning keeps cuDNN's deterministic flag: it picks the fastest
    *deterministic* algorithm for each shape, timed at first use, so which one it picks (and the
    last bits of the numbers) may differ between processes; TF32 rounds matmul inputs to 10-bit
    mantissas; CUDA graphs replay the recorded kernels of a step with one launch (setting it again
    forgets an earlier capture failure). The defaults are what measures fastest on a GPU
    (``python -m lab.bench --matmul-tf32 --cudnn-autotune --cuda-graphs``) and stays correct."""
    choices = {"lane_conv": (lane_conv, LANE_CONVS), "host_memory": (host_memory, HOST_MEMORY),
               "noise_ahead": (noise_ahead, NOISE_AHEAD), "noise_pool": (noise_pool, NOISE_POOLS),
               "step_noise": (step_noise, STEP_NOISES)}
    for name, (value, allowed) in choices.items():  # all checked before any is set
        if value is not None and value not in allowed:
            raise ValueError(f"{name} must be one of {allowed}, got {value!r}")
    _OPTIONS.update({name: value for name, (value, _) in choices.items() if value is not None})
    if cuda_graphs is not None:
        _OPTIONS["cuda_graphs"] = bool(cuda_graphs)
        _CAPTURE_FAILURE.clear()
    if matmul_tf32 is not None:
        torch.backends.cuda.matmul.allow_tf32 = bool(matmul_tf32)
    if cudnn_tf32 is not None:
        torch.backends.cudnn.allow_tf32 = bool(cudnn_tf32)
        _CONV_PRECISION_CHOSEN[:] = [True]  # chosen: the first CUDA run keeps it
    if cudnn_autotune is not None:
        torch.backends.cudnn.benchmark = bool(cudnn_autotune)
    return kernel_settings()


def cuda_graphs_enabled() -> bool:
    """Whether the step is captured: the ``cuda_graphs`` option is on (see
    :func:`set_kernel_options`) and no capture of this process has failed."""
    return _OPTIONS["cuda_graphs"] and not _CAPTURE_FAILURE


def lane_conv() -> str:
    """How convolutions compute now: ``grouped`` (the default) or ``im2col``."""
    return str(_OPTIONS["lane_conv"])


def step_noise() -> str:
    """How record-level DP-SGD draws its step noise now: ``generator`` (the default) or ``counter``."""
    return str(_OPTIONS["step_noise"])


def device_options() -> dict[str, str]:
    """The options of every device (``lane_conv``, ``step_noise``) that differ from their defaults:
    what a CPU result records (``meta.kernels``), empty for a default run."""
    return {k: str(_OPTIONS[k]) for k, default in DEVICE_OPTIONS.items() if _OPTIONS[k] != default}


def prepare_host_memory(device: torch.device) -> str:
    """Before CPU training: keep freed host memory for reuse where the ``host_memory`` option says
    so (:func:`fedlib.host_memory.keep_freed_memory`, once per process); returns
    :func:`fedlib.host_memory.state`. Nothing to do on other devices."""
    from fedlib import host_memory
    if device.type == "cpu" and _OPTIONS["host_memory"] == "reuse":
        host_memory.keep_freed_memory()
    return host_memory.state()


def noise_pool() -> str:
    """What draws the server noise ahead now: ``processes`` (the default) or ``threads``."""
    return str(_OPTIONS["noise_pool"])


def noise_ahead(device: torch.device) -> bool:
    """Whether a run on ``device`` draws its server noise ahead (the ``noise_ahead`` option)."""
    mode = _OPTIONS["noise_ahead"]
    return mode == "on" or (mode == "auto" and device.type == "cuda")

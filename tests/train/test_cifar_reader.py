"""train/data.py reads CIFAR python batches without numpy and without running pickled code."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import pytest
import torch

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture
def cifar(train_modules):
    return train_modules("data")


@pytest.mark.parametrize("name", ["numpy2.4.6_protocol2.pkl", "numpy2.4.6_protocol5.pkl"])
def test_reads_batches_pickled_by_real_numpy(cifar, name):
    # Files written by numpy 2.4.6 itself (pickle.dump of {'data': uint8 2x3072 array,
    # 'labels': [3, 8]}); expected_first_bytes.txt holds numpy's own view of the bytes.
    first, last = (list(map(int, line.split())) for line in
                   (FIXTURES / "expected_first_bytes.txt").read_text().splitlines())
    x, y = cifar.read_images_labels(FIXTURES / name)
    assert tuple(x.shape) == (2, 3, 32, 32) and x.dtype == torch.uint8
    assert x.flatten()[:8].tolist() == first and x.flatten()[-8:].tolist() == last
    assert y.tolist() == [3, 8]


class _RunsCode:
    def __reduce__(self):
        return (os.system, ("true",))


def test_refuses_a_batch_file_that_would_run_code(cifar, tmp_path):
    bad = tmp_path / "data_batch_1"
    bad.write_bytes(pickle.dumps({b"data": _RunsCode(), b"labels": [0]}, protocol=2))
    with pytest.raises(cifar.DataFormatError, match="refusing to load"):
        cifar.read_images_labels(bad)


def test_missing_files_are_named_with_the_command_that_fetches_them(cifar, tmp_path):
    (tmp_path / "cifar-10-batches-py").mkdir()
    (tmp_path / "cifar-10-batches-py" / "data_batch_1").write_bytes(b"")
    with pytest.raises(cifar.DataMissingError) as exc:
        cifar.find_root(tmp_path)
    msg = str(exc.value)
    assert "data_batch_2" in msg and "test_batch" in msg
    assert f"python -m orchestrator data cifar10 --dest {tmp_path}" in msg


def test_augment_keeps_shape_and_is_reproducible(cifar):
    x = torch.randn(16, 3, 32, 32)
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    a, b = cifar.augment(x, g1), cifar.augment(x, g2)
    assert a.shape == x.shape and torch.equal(a, b)
    assert not torch.equal(a, x)  # crops/flips did change images
    # a crop with zero offset and no flip is the identity on the 32x32 window
    same = cifar.augment(x, torch.Generator().manual_seed(5), pad=0)
    flipped_or_not = [(same[i] == x[i]).all() or (same[i] == x[i].flip(2)).all()
                      for i in range(16)]
    assert all(flipped_or_not)

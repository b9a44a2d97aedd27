"""The digits split: first 1347 samples for training, last 450 for testing, in order."""

from __future__ import annotations

import numpy as np
import pytest

from sporenet.cloud.datasets import load_digits

sklearn = pytest.importorskip(
    "sklearn", reason="the digits data ships with scikit-learn (the optional `datasets` extra)"
)


def test_digits_split_sizes_order_and_dtypes():
    from sklearn.datasets import load_digits as sk_load

    raw = sk_load()
    d = load_digits()
    assert d.x_train.shape == (1347, 1, 8, 8) and d.x_test.shape == (450, 1, 8, 8)
    assert d.x_train.dtype == np.float32 and d.y_train.dtype == np.int64
    np.testing.assert_array_equal(d.x_train.reshape(1347, 64), raw.data[:1347])
    np.testing.assert_array_equal(d.y_test, raw.target[1347:])
    assert d.x_train.min() == 0 and d.x_train.max() == 16
    assert load_digits(flat=True).x_test.shape == (450, 64)
    assert d.labels == [str(k) for k in range(10)]


def test_random_shift_moves_each_image_by_at_most_one_pixel():
    from sporenet.cloud.datasets import random_shift

    x = np.random.default_rng(0).uniform(1, 16, size=(64, 1, 8, 8)).astype(np.float32)
    shifted = random_shift(x, np.random.default_rng(1))
    assert shifted.shape == x.shape and shifted.dtype == x.dtype
    moves = set()
    for k in range(len(x)):
        padded = np.pad(x[k, 0], 1)
        match = [
            (dy, dx)
            for dy in range(3)
            for dx in range(3)
            if np.array_equal(padded[dy : dy + 8, dx : dx + 8], shifted[k, 0])
        ]
        assert match, f"image {k} is not a one-pixel shift of the original"
        moves.add(match[0])
    assert len(moves) > 3  # the shifts really vary across the batch


# ---- Fashion-MNIST (Debian's dataset-fashion-mnist; CI installs it in .ci/run)


def _write_idx(path, array, *, gz):
    import gzip

    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(
        int(d).to_bytes(4, "big") for d in array.shape
    )
    data = header + array.astype(np.uint8).tobytes()
    if gz:
        path.write_bytes(gzip.compress(data))
    else:
        path.write_bytes(data)


def _fake_fashion(folder, n_train=5, n_test=3):
    rng = np.random.default_rng(0)
    parts = {
        "train-images-idx3-ubyte": rng.integers(0, 256, (n_train, 28, 28)),
        "train-labels-idx1-ubyte": rng.integers(0, 10, n_train),
        "t10k-images-idx3-ubyte": rng.integers(0, 256, (n_test, 28, 28)),
        "t10k-labels-idx1-ubyte": rng.integers(0, 10, n_test),
    }
    for k, (name, array) in enumerate(parts.items()):
        gz = k % 2 == 0  # both plain and gzipped files are read
        _write_idx(folder / (name + (".gz" if gz else "")), array, gz=gz)
    return parts


def test_fashion_mnist_reads_idx_files_from_a_folder(tmp_path):
    from sporenet.cloud.datasets import load_fashion_mnist

    parts = _fake_fashion(tmp_path)
    d = load_fashion_mnist(tmp_path)
    assert d.x_train.shape == (5, 1, 28, 28) and d.x_train.dtype == np.float32
    np.testing.assert_array_equal(d.x_train[:, 0], parts["train-images-idx3-ubyte"])
    np.testing.assert_array_equal(d.y_test, parts["t10k-labels-idx1-ubyte"])
    assert d.labels[9] == "Ankle boot"
    small = load_fashion_mnist(tmp_path, flat=True, train_limit=2, test_limit=1)
    assert small.x_train.shape == (2, 784) and small.y_test.shape == (1,)


def test_fashion_mnist_missing_files_say_how_to_install(tmp_path):
    from sporenet.cloud.datasets import load_fashion_mnist
    from sporenet.cloud.errors import DatasetError

    with pytest.raises(DatasetError, match="apt-get install dataset-fashion-mnist"):
        load_fashion_mnist(tmp_path)


def test_fashion_mnist_truncated_file_is_named(tmp_path):
    from sporenet.cloud.datasets import read_idx
    from sporenet.cloud.errors import DatasetError

    _write_idx(tmp_path / "x", np.zeros((4, 28, 28)), gz=False)
    data = (tmp_path / "x").read_bytes()
    (tmp_path / "x").write_bytes(data[:-10])
    with pytest.raises(DatasetError, match="expected 3136 bytes"):
        read_idx(tmp_path / "x")
    (tmp_path / "y").write_bytes(b"PK\x03\x04rest")
    with pytest.raises(DatasetError, match="not an IDX file"):
        read_idx(tmp_path / "y")


def test_fashion_mnist_from_the_debian_package():
    from sporenet.cloud.datasets import fashion_mnist_path, load_fashion_mnist
    from sporenet.cloud.errors import DatasetError

    try:
        fashion_mnist_path()
    except DatasetError as exc:
        pytest.skip(f"Fashion-MNIST is not installed: {exc}")
    d = load_fashion_mnist(train_limit=200, test_limit=50)
    assert d.x_train.shape == (200, 1, 28, 28) and d.x_test.shape == (50, 1, 28, 28)
    assert d.x_train.max() <= 255 and d.x_train.min() >= 0
    assert set(np.unique(d.y_train)) <= set(range(10)) and len(np.unique(d.y_train)) == 10

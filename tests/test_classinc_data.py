"""agents.classinc.data: the IDX / CIFAR pickle / embedding loaders, their errors, the digits split, the stream."""

from __future__ import annotations

import gzip
import pickle
from pathlib import Path

import numpy as np
import pytest

from agents.classinc.data import (
    DATASETS,
    FASHION_DEBIAN,
    DataError,
    Dataset,
    load_dataset,
    seen_mask,
    stream_indices,
    task_classes,
)

IDX_NAMES = {"train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
             "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")}


# ------------------------------------------------------------------------------------------------------ helpers

def idx_bytes(arr: np.ndarray, magic: int | None = None) -> bytes:
    """An IDX file's bytes for a uint8 array (1-D labels or 3-D images)."""
    magic = (0x0800 | arr.ndim) if magic is None else magic
    header = magic.to_bytes(4, "big") + b"".join(int(d).to_bytes(4, "big") for d in arr.shape)
    return header + np.ascontiguousarray(arr, dtype=np.uint8).tobytes()


def write_idx(path: Path, arr: np.ndarray, *, gz: bool, magic: int | None = None) -> Path:
    data = idx_bytes(arr, magic)
    if gz:
        path = path.with_name(path.name + ".gz")
        path.write_bytes(gzip.compress(data))
    else:
        path.write_bytes(data)
    return path


def make_mnist(root: Path, *, gz: bool = True, n_train: int = 30, n_test: int = 20, rows: int = 6,
               cols: int = 5, seed: int = 0) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Four small IDX files in ``root`` (every class 0..9 in training); returns the raw arrays per split."""
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    out = {}
    for split, n in (("train", n_train), ("test", n_test)):
        images = rng.integers(0, 256, size=(n, rows, cols), dtype=np.uint8)
        labels = (np.arange(n) % 10).astype(np.uint8)
        img_name, lab_name = IDX_NAMES[split]
        write_idx(root / img_name, images, gz=gz)
        write_idx(root / lab_name, labels, gz=gz)
        out[split] = (images, labels)
    return out


def idx_file(root: Path, name: str) -> Path:
    """The existing variant (plain or .gz) of IDX file ``name`` in ``root``."""
    plain = root / name
    return plain if plain.exists() else root / f"{name}.gz"


def make_cifar(folder: Path, n: int = 10, seed: int = 0) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """CIFAR-10-style pickle batches (bytes keys, as the real ones) with ``n`` samples each."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    out = {}
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        data = rng.integers(0, 256, size=(n, 3072), dtype=np.uint8)
        labels = [int(v) for v in np.arange(n) % 10]
        with (folder / name).open("wb") as f:
            pickle.dump({b"batch_label": name.encode(), b"data": data, b"labels": labels}, f)
        out[name] = (data, np.asarray(labels))
    return out


def embed_arrays(n: int = 12, m: int = 8, d: int = 5, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"x_train": rng.normal(size=(n, d)), "y_train": np.arange(n) % 4,
            "x_test": rng.normal(size=(m, d)), "y_test": np.arange(m) % 4}


# ------------------------------------------------------------------------------------------------------- names

def test_unknown_dataset_lists_choices():
    with pytest.raises(DataError, match="unknown dataset 'split-svhn'") as err:
        load_dataset("split-svhn")
    assert all(name in str(err.value) for name in DATASETS)
    assert issubclass(DataError, ValueError)


# --------------------------------------------------------------------------------------------------------- IDX

@pytest.mark.parametrize("gz", [True, False])
def test_idx_round_trip(tmp_path, gz):
    raw = make_mnist(tmp_path, gz=gz)
    data = load_dataset("split-mnist", tmp_path)
    assert isinstance(data, Dataset) and data.name == "split-mnist" and data.source == str(tmp_path)
    assert data.x_train.shape == (30, 1, 6, 5) and data.x_test.shape == (20, 1, 6, 5)
    assert data.x_train.dtype == np.float32 and data.y_train.dtype == np.int64
    assert data.input_shape == (1, 6, 5) and data.n_classes == 10
    np.testing.assert_allclose(data.x_train[:, 0], raw["train"][0] / 255.0, rtol=1e-6)
    np.testing.assert_allclose(data.x_test[:, 0], raw["test"][0] / 255.0, rtol=1e-6)
    np.testing.assert_array_equal(data.y_train, raw["train"][1])
    np.testing.assert_array_equal(data.y_test, raw["test"][1])
    assert 0.0 <= data.x_train.min() and data.x_train.max() <= 1.0


def test_idx_prefers_the_existing_variant(tmp_path):
    raw = make_mnist(tmp_path, gz=True, seed=1)
    # a plain test-images file beside the .gz one wins; the other three are read from .gz
    other = np.full_like(raw["test"][0], 255)
    write_idx(tmp_path / IDX_NAMES["test"][0], other, gz=False)
    data = load_dataset("split-mnist", str(tmp_path))
    assert (data.x_test == 1.0).all()
    np.testing.assert_allclose(data.x_train[:, 0], raw["train"][0] / 255.0, rtol=1e-6)
    # a mix of plain and .gz files loads
    (tmp_path / f"{IDX_NAMES['test'][0]}.gz").unlink()
    assert load_dataset("split-mnist", tmp_path).x_test.shape == (20, 1, 6, 5)


def test_idx_missing_file(tmp_path):
    make_mnist(tmp_path)
    idx_file(tmp_path, "t10k-labels-idx1-ubyte").unlink()
    with pytest.raises(DataError, match="t10k-labels-idx1-ubyte") as err:
        load_dataset("split-mnist", tmp_path)
    assert "t10k-labels-idx1-ubyte.gz" in str(err.value) and str(tmp_path) in str(err.value)


def test_idx_wrong_magic(tmp_path):
    raw = make_mnist(tmp_path, gz=False)
    path = write_idx(tmp_path / "train-images-idx3-ubyte", raw["train"][0], gz=False, magic=0x00000801)
    with pytest.raises(DataError, match="wrong magic number") as err:
        load_dataset("split-mnist", tmp_path)
    assert str(path) in str(err.value)


@pytest.mark.parametrize("gz", [True, False])
def test_idx_truncated_or_extra_payload(tmp_path, gz):
    make_mnist(tmp_path, gz=gz)
    name = "train-images-idx3-ubyte"
    path = idx_file(tmp_path, name)
    data = idx_bytes(np.zeros((30, 6, 5), np.uint8))
    for bad, word in ((data[:-7], "truncated"), (data + b"\0\0", "extra bytes")):
        path.write_bytes(gzip.compress(bad) if gz else bad)
        with pytest.raises(DataError, match=word) as err:
            load_dataset("split-mnist", tmp_path)
        assert str(path) in str(err.value)


def test_idx_corrupt_gzip(tmp_path):
    make_mnist(tmp_path, gz=True)
    path = tmp_path / "train-labels-idx1-ubyte.gz"
    path.write_bytes(np.random.default_rng(0).integers(0, 256, 200, dtype=np.uint8).tobytes())
    with pytest.raises(DataError, match="gzip") as err:
        load_dataset("split-mnist", tmp_path)
    assert str(path) in str(err.value)
    # a gzip stream cut short (EOFError inside gzip) is a DataError too
    path.write_bytes(gzip.compress(idx_bytes(np.zeros(30, np.uint8)))[:-12])
    with pytest.raises(DataError, match="gzip") as err:
        load_dataset("split-mnist", tmp_path)
    assert str(path) in str(err.value)


def test_idx_count_mismatch(tmp_path):
    make_mnist(tmp_path, gz=False)
    path = write_idx(tmp_path / "t10k-labels-idx1-ubyte", (np.arange(19) % 10).astype(np.uint8), gz=False)
    with pytest.raises(DataError, match="20 images but .* 19 labels") as err:
        load_dataset("split-mnist", tmp_path)
    assert str(path) in str(err.value)


def test_idx_label_out_of_range(tmp_path):
    make_mnist(tmp_path, gz=True)
    labels = (np.arange(30) % 10).astype(np.uint8)
    labels[3] = 10
    path = write_idx(tmp_path / "train-labels-idx1-ubyte", labels, gz=True)
    with pytest.raises(DataError, match="label 10 out of range") as err:
        load_dataset("split-mnist", tmp_path)
    assert str(path) in str(err.value)


def test_mnist_needs_a_root(tmp_path):
    with pytest.raises(DataError, match="--data-root"):
        load_dataset("split-mnist")
    with pytest.raises(DataError, match="does not exist"):
        load_dataset("split-mnist", tmp_path / "nowhere")


def test_fashion_missing_root_hints_the_debian_package(tmp_path):
    with pytest.raises(DataError, match="apt-get install dataset-fashion-mnist") as err:
        load_dataset("split-fashion", tmp_path / "nowhere")
    assert "dpkg -L dataset-fashion-mnist" in str(err.value)
    make_mnist(tmp_path)  # with a root of good files, split-fashion reads them as split-mnist does
    assert load_dataset("split-fashion", tmp_path).name == "split-fashion"


@pytest.mark.skipif(not FASHION_DEBIAN.is_dir(), reason=f"{FASHION_DEBIAN} not installed (dataset-fashion-mnist)")
def test_fashion_from_debian():
    data = load_dataset("split-fashion")
    assert data.x_train.shape == (60000, 1, 28, 28) and data.x_test.shape == (10000, 1, 28, 28)
    assert data.n_classes == 10 and data.source == str(FASHION_DEBIAN)
    assert 0.0 <= data.x_test.min() and data.x_test.max() <= 1.0


# ---------------------------------------------------------------------------------------------------- CIFAR-10

@pytest.mark.parametrize("parent", [False, True])
def test_cifar_both_root_forms(tmp_path, parent):
    folder = tmp_path / "cifar-10-batches-py"
    raw = make_cifar(folder)
    data = load_dataset("split-cifar10", tmp_path if parent else folder)
    assert data.x_train.shape == (50, 3, 32, 32) and data.x_test.shape == (10, 3, 32, 32)
    assert data.x_train.dtype == np.float32 and data.y_train.dtype == np.int64 and data.n_classes == 10
    assert data.source == str(folder)
    np.testing.assert_allclose(data.x_train[:10].reshape(10, -1), raw["data_batch_1"][0] / 255.0, rtol=1e-6)
    np.testing.assert_allclose(data.x_test.reshape(10, -1), raw["test_batch"][0] / 255.0, rtol=1e-6)
    np.testing.assert_array_equal(data.y_train[40:], raw["data_batch_5"][1])


def test_cifar_accepts_str_keys(tmp_path):
    make_cifar(tmp_path)
    path = tmp_path / "test_batch"
    with path.open("wb") as f:
        pickle.dump({"data": np.zeros((10, 3072), np.uint8), "labels": list(range(10))}, f)
    assert load_dataset("split-cifar10", tmp_path).x_test.shape == (10, 3, 32, 32)


def test_cifar_errors(tmp_path):
    with pytest.raises(DataError, match="--data-root"):
        load_dataset("split-cifar10")
    make_cifar(tmp_path)
    (tmp_path / "data_batch_3").unlink()
    with pytest.raises(DataError, match="data_batch_3"):
        load_dataset("split-cifar10", tmp_path)
    make_cifar(tmp_path)
    path = tmp_path / "test_batch"
    path.write_bytes(b"\x80\x04not really a pickle")
    with pytest.raises(DataError, match="pickle") as err:
        load_dataset("split-cifar10", tmp_path)
    assert str(path) in str(err.value)
    with path.open("wb") as f:
        pickle.dump({b"data": np.zeros((10, 3072), np.uint8)}, f)
    with pytest.raises(DataError, match="missing key 'labels'"):
        load_dataset("split-cifar10", tmp_path)
    with path.open("wb") as f:
        pickle.dump({b"data": np.zeros((10, 3072), np.uint8), b"labels": [10] * 10}, f)
    with pytest.raises(DataError, match="out of range"):
        load_dataset("split-cifar10", tmp_path)


# -------------------------------------------------------------------------------------------------- embeddings

def test_embed_npz_and_npy_folder(tmp_path):
    arrays = embed_arrays()
    np.savez(tmp_path / "emb.npz", **arrays)
    folder = tmp_path / "emb"
    folder.mkdir()
    for key, value in arrays.items():
        np.save(folder / f"{key}.npy", value)
    for root in (tmp_path / "emb.npz", folder):
        data = load_dataset("embed", root)
        assert data.x_train.shape == (12, 5) and data.x_test.shape == (8, 5) and data.input_shape == (5,)
        assert data.x_train.dtype == np.float32 and data.y_test.dtype == np.int64 and data.n_classes == 4
        np.testing.assert_allclose(data.x_train, arrays["x_train"].astype(np.float32))
        np.testing.assert_array_equal(data.y_train, arrays["y_train"])
        assert data.source == str(root)


def test_embed_errors(tmp_path):
    with pytest.raises(DataError, match="--data-root"):
        load_dataset("embed")
    with pytest.raises(DataError, match="does not exist"):
        load_dataset("embed", tmp_path / "none.npz")

    def bad(**changes: np.ndarray | None) -> str:
        arrays = {k: v for k, v in {**embed_arrays(), **changes}.items() if v is not None}
        path = tmp_path / "bad.npz"
        np.savez(path, **arrays)
        with pytest.raises(DataError) as err:
            load_dataset("embed", path)
        assert str(path) in str(err.value)
        return str(err.value)

    assert "missing key(s) y_test" in bad(y_test=None)
    assert "12 samples but y_train has 11" in bad(y_train=np.arange(11) % 4)
    assert "non-finite" in bad(x_test=np.full((8, 5), np.nan))
    assert "non-finite" in bad(x_train=np.full((12, 5), 1e300))  # overflows float32
    assert "integer" in bad(y_train=(np.arange(12) % 4).astype(float))
    assert "negative" in bad(y_test=-np.ones(8, int))
    assert "shape" in bad(x_test=np.zeros((8, 6)))
    assert "2-D" in bad(x_train=np.zeros((12, 5, 1)))
    assert "no training samples" in bad(y_test=np.full(8, 7))
    folder = tmp_path / "npy"
    folder.mkdir()
    np.save(folder / "x_train.npy", np.zeros((3, 2)))
    with pytest.raises(DataError, match="y_train.npy"):
        load_dataset("embed", folder)
    (folder / "x_test.npy").write_bytes(b"garbage")
    for key in ("y_train", "y_test"):
        np.save(folder / f"{key}.npy", np.zeros(3, int))
    with pytest.raises(DataError, match="x_test.npy"):
        load_dataset("embed", folder)
    np.save(folder / "x_test.npy", np.array([{"a": 1}] * 3, dtype=object))  # needs pickle: refused
    with pytest.raises(DataError, match="x_test.npy"):
        load_dataset("embed", folder)


# ------------------------------------------------------------------------------------------------------ digits

def test_split_digits():
    data = load_dataset("split-digits")
    assert data.source == "sklearn.datasets.load_digits"
    assert data.x_train.shape[1:] == (1, 8, 8) and data.input_shape == (1, 8, 8)
    assert len(data.y_train) + len(data.y_test) == 1797
    assert (len(data.y_train), len(data.y_test)) == (1201, 596)  # floor(n_c / 3) of each class to test
    assert data.x_train.dtype == np.float32 and data.y_train.dtype == np.int64
    assert 0.0 <= min(data.x_train.min(), data.x_test.min()) and max(data.x_train.max(), data.x_test.max()) == 1.0
    assert data.n_classes == 10
    n_train, n_test = np.bincount(data.y_train, minlength=10), np.bincount(data.y_test, minlength=10)
    assert (n_train > 0).all() and (n_test > 0).all()
    np.testing.assert_array_equal(n_test, (n_train + n_test) // 3)
    again = load_dataset("split-digits")
    np.testing.assert_array_equal(again.x_test, data.x_test)
    np.testing.assert_array_equal(again.y_train, data.y_train)
    # train and test partition the 1797 images: together they are exactly sklearn's digits, each once
    from sklearn.datasets import load_digits

    bunch = load_digits()

    def rows(x: np.ndarray, y: np.ndarray) -> list[tuple[int, bytes]]:
        return sorted(zip(y.tolist(), map(bytes, np.asarray(x, np.float32).reshape(len(y), -1))))

    both = rows(np.concatenate([data.x_train, data.x_test]) * 16, np.concatenate([data.y_train, data.y_test]))
    assert both == rows(bunch.images, bunch.target)
    with pytest.raises(DataError, match="takes no root"):
        load_dataset("split-digits", "/tmp")


# ------------------------------------------------------------------------------------------------------ stream

def test_task_classes():
    assert task_classes(10) == [(0, 1), (2, 3), (4, 5), (6, 7), (8, 9)]
    assert task_classes(6, 3) == [(0, 1, 2), (3, 4, 5)]
    rand = task_classes(10, 2, order="random", seed=3)
    assert rand == task_classes(10, 2, order="random", seed=3)
    assert rand != task_classes(10, 2, order="random", seed=4)
    assert sorted(c for t in rand for c in t) == list(range(10)) and all(len(t) == 2 for t in rand)
    assert [c for t in rand for c in t] == np.random.default_rng([3, 2]).permutation(10).tolist()
    with pytest.raises(ValueError, match="divide"):
        task_classes(10, 3)
    with pytest.raises(ValueError, match="unknown class order 'sorted'"):
        task_classes(10, order="sorted")


def test_stream_indices():
    rng = np.random.default_rng(0)
    y = rng.integers(0, 10, size=500)
    tasks = task_classes(10, 2, order="random", seed=1)[:4]  # one pair of classes left out
    stream = stream_indices(y, tasks, seed=7)
    assert len(stream) == 4 and all(ix.dtype == np.int64 for ix in stream)
    for task, ix in zip(tasks, stream):
        assert set(y[ix].tolist()) <= set(task)
    used = np.concatenate(stream)
    assert len(used) == len(np.unique(used))  # the single-pass rule
    np.testing.assert_array_equal(np.sort(used), np.flatnonzero(np.isin(y, [c for t in tasks for c in t])))
    again = stream_indices(y, tasks, seed=7)
    assert all((a == b).all() for a, b in zip(stream, again))
    other = stream_indices(y, tasks, seed=8)
    assert any((a != b).any() for a, b in zip(stream, other))
    assert any((np.diff(ix) < 0).any() for ix in stream)  # shuffled, not in sample order
    with pytest.raises(ValueError, match="share classes"):
        stream_indices(y, [(0, 1), (1, 2)], seed=0)


def test_seen_mask():
    y = np.array([0, 1, 2, 3, 4, 5, 5, 0])
    tasks = [(4, 5), (0, 1), (2, 3)]
    np.testing.assert_array_equal(seen_mask(y, tasks, 0), [0, 0, 0, 0, 1, 1, 1, 0])
    np.testing.assert_array_equal(seen_mask(y, tasks, 1), [1, 1, 0, 0, 1, 1, 1, 1])
    assert seen_mask(y, tasks, 2).all() and seen_mask(y, tasks, 2).dtype == bool
    with pytest.raises(ValueError, match="out of range"):
        seen_mask(y, tasks, 3)

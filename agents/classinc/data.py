"""Datasets and class splits for class-incremental streaming classification (Split MNIST and friends).

Nothing is downloaded at run time. The datasets (:data:`DATASETS`):

* ``split-digits`` -- scikit-learn's bundled 8x8 digits (1797 images, 10 classes), the default: it needs no files.
* ``split-mnist`` -- MNIST's four IDX files in ``--data-root DIR`` (plain or ``.gz``).
* ``split-fashion`` -- Fashion-MNIST's IDX files; the root defaults to :data:`FASHION_DEBIAN`, where Debian's
  ``dataset-fashion-mnist`` package installs them.
* ``split-cifar10`` -- CIFAR-10's python pickle batches (``cifar-10-batches-py``).
* ``embed`` -- user-supplied embeddings (the paper's "Split Embedding"): one ``.npz`` or a folder of ``.npy``.

Images come out as float32 (N, C, H, W) in [0, 1], embeddings as float32 (N, D) as given, labels as int64 in
0..n_classes-1. Every problem with the files (missing, wrong magic number, truncated or corrupt, sizes that
disagree, labels out of range, missing keys) is a :class:`DataError` naming the file and the problem.

The stream: :func:`task_classes` splits the classes into tasks, :func:`stream_indices` gives each task's training
samples in a seeded order, each sample used at most once, and :func:`seen_mask` selects the test samples of all
classes seen up to a task.
"""

from __future__ import annotations

import gzip
import os
import pickle
import zipfile
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "DATASETS",
    "FASHION_DEBIAN",
    "DataError",
    "Dataset",
    "load_dataset",
    "task_classes",
    "stream_indices",
    "seen_mask",
]

DATASETS = ("split-digits", "split-mnist", "split-fashion", "split-cifar10", "embed")
FASHION_DEBIAN = Path("/usr/share/datasets/fashion-mnist")  # where Debian's dataset-fashion-mnist puts the IDX files

IDX_IMAGES_MAGIC = 0x00000803  # 2051: unsigned bytes, 3 dims (n, rows, cols)
IDX_LABELS_MAGIC = 0x00000801  # 2049: unsigned bytes, 1 dim (n,)
IDX_FILES = {  # split -> (images, labels), without the optional .gz suffix
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
CIFAR_DIR = "cifar-10-batches-py"
CIFAR_TRAIN = tuple(f"data_batch_{i}" for i in range(1, 6))
CIFAR_TEST = "test_batch"
EMBED_KEYS = ("x_train", "y_train", "x_test", "y_test")
DIGITS_TEST_FRACTION = 3  # 1/3 of each class (floor) goes to the test split
FASHION_HINT = ("install Debian's package with `sudo apt-get install dataset-fashion-mnist` "
                "(`dpkg -L dataset-fashion-mnist` shows where its files are), or pass --data-root DIR")

# what reading a damaged file can raise from inside gzip / zlib / numpy / zipfile
_READ_ERRORS = (OSError, EOFError, gzip.BadGzipFile, zlib.error, zipfile.BadZipFile, ValueError, KeyError)


class DataError(ValueError):
    """A dataset could not be loaded or split; the message names the file (or setting) and the problem."""


@dataclass(frozen=True)
class Dataset:
    """One dataset's train and test splits, ready for the stream."""

    name: str  # one of DATASETS
    x_train: np.ndarray  # float32; images (N, C, H, W) in [0, 1]; embeddings (N, D) as given
    y_train: np.ndarray  # int64 (N,), classes 0..n_classes-1
    x_test: np.ndarray  # float32 (M, ...) as x_train
    y_test: np.ndarray  # int64 (M,)
    source: str  # where it came from (a path, or "sklearn.datasets.load_digits")

    @property
    def n_classes(self) -> int:
        """Max label + 1 over train and test."""
        return int(max(self.y_train.max(initial=-1), self.y_test.max(initial=-1))) + 1

    @property
    def input_shape(self) -> tuple[int, ...]:
        """One sample's shape, ``x_train.shape[1:]``."""
        return tuple(self.x_train.shape[1:])


def load_dataset(name: str, root: str | os.PathLike | None = None) -> Dataset:
    """Load dataset ``name`` (one of :data:`DATASETS`) from ``root`` (a folder or file; see the module docstring).

    ``split-digits`` takes no root; ``split-fashion`` defaults to :data:`FASHION_DEBIAN`; ``split-mnist``,
    ``split-cifar10`` and ``embed`` need one. Raises :class:`DataError` for an unknown name and for any problem
    with the files.
    """
    if name not in DATASETS:
        raise DataError(f"unknown dataset {name!r}; choose from {', '.join(DATASETS)}")
    path = None if root is None else Path(root).expanduser()
    if name == "split-digits":
        if path is not None:
            raise DataError(f"split-digits ships with scikit-learn and takes no root (got {str(path)!r})")
        return _load_digits()
    if name == "split-fashion":
        return _load_idx_dataset(name, FASHION_DEBIAN if path is None else path, hint=FASHION_HINT)
    if path is None:
        needs = {"split-mnist": "a folder with the four MNIST IDX files "
                                + ", ".join(f for pair in IDX_FILES.values() for f in pair) + " (or .gz)",
                 "split-cifar10": f"the folder {CIFAR_DIR} (or its parent) with data_batch_1..5 and test_batch",
                 "embed": "a .npz file with " + ", ".join(EMBED_KEYS) + ", or a folder with those four as .npy"}
        raise DataError(f"{name} needs its files: pass --data-root DIR, {needs[name]}")
    if name == "split-mnist":
        return _load_idx_dataset(name, path, hint="")
    if name == "split-cifar10":
        return _load_cifar10(path)
    return _load_embed(path)


# ---------------------------------------------------------------------------------------------------- validation

def _finish(name: str, x_train: np.ndarray, y_train: np.ndarray, x_test: np.ndarray, y_test: np.ndarray,
            source: str) -> Dataset:
    """Check the arrays agree (lengths, sample shapes, finite x, integer labels >= 0, every class in training)
    and wrap them as float32 / int64 in a :class:`Dataset`."""
    for split, x, y in (("train", x_train, y_train), ("test", x_test, y_test)):
        if y.ndim != 1:
            raise DataError(f"{source}: y_{split} must be 1-D (N,), got shape {y.shape}")
        if len(x) != len(y):
            raise DataError(f"{source}: x_{split} has {len(x)} samples but y_{split} has {len(y)} labels")
        if not np.issubdtype(y.dtype, np.integer):
            raise DataError(f"{source}: y_{split} must hold integer class labels, got dtype {y.dtype}")
        if len(y) and y.min() < 0:
            raise DataError(f"{source}: y_{split} has negative label {int(y.min())}; classes must be 0..n-1")
    if not len(y_train):
        raise DataError(f"{source}: the training split is empty")
    if x_train.shape[1:] != x_test.shape[1:]:
        raise DataError(f"{source}: train samples have shape {x_train.shape[1:]} but test samples "
                        f"{x_test.shape[1:]}")
    with np.errstate(over="ignore"):  # values beyond float32's range become inf and are reported just below
        x_train, x_test = x_train.astype(np.float32, copy=False), x_test.astype(np.float32, copy=False)
    for split, x in (("train", x_train), ("test", x_test)):
        if not np.isfinite(x).all():
            raise DataError(f"{source}: x_{split} has non-finite values (NaN or inf, or too large for float32)")
    y_train, y_test = y_train.astype(np.int64, copy=False), y_test.astype(np.int64, copy=False)
    n_classes = int(max(y_train.max(), y_test.max(initial=-1))) + 1
    missing = np.setdiff1d(np.arange(n_classes), y_train)
    if len(missing):
        raise DataError(f"{source}: classes {missing.tolist()} have no training samples (labels must be "
                        f"0..{n_classes - 1} with every class in the training split)")
    return Dataset(name, x_train, y_train, x_test, y_test, source)


# ------------------------------------------------------------------------------------------------------ digits

def _load_digits() -> Dataset:
    """scikit-learn's 8x8 digits, (N, 1, 8, 8) in [0, 1] (pixels 0..16 / 16), with a fixed stratified split.

    The split does not depend on any run seed: one ``np.random.default_rng(0)`` draws, class by class in order
    0..9, a permutation of that class's samples, and the first ``floor(n_c / 3)`` go to the test split (596 of
    the 1797 images), the rest to training (1201). Both splits keep the original sample order.
    """
    try:
        from sklearn.datasets import load_digits
    except ImportError as err:
        raise DataError("split-digits needs scikit-learn's bundled digits: pip install scikit-learn") from err
    try:
        bunch = load_digits()
    except _READ_ERRORS as err:
        raise DataError(f"sklearn.datasets.load_digits failed: {err}") from err
    x = np.asarray(bunch.images, dtype=np.float32)[:, None] / np.float32(16.0)
    y = np.asarray(bunch.target, dtype=np.int64)
    rng = np.random.default_rng(0)
    test = np.zeros(len(y), dtype=bool)
    for c in np.unique(y):
        idx = rng.permutation(np.flatnonzero(y == c))
        test[idx[: len(idx) // DIGITS_TEST_FRACTION]] = True
    return _finish("split-digits", x[~test], y[~test], x[test], y[test], "sklearn.datasets.load_digits")


# --------------------------------------------------------------------------------------------------------- IDX

def _idx_path(name: str, root: Path, stem: str, hint: str) -> Path:
    """``root/stem`` if it exists, else ``root/stem.gz``; plain wins when both exist (no decompression)."""
    for candidate in (root / stem, root / f"{stem}.gz"):
        if candidate.is_file():
            return candidate
    expected = "; ".join(f"{s} (or {s}.gz)" for pair in IDX_FILES.values() for s in pair)
    where = f"the folder {root} does not exist" if not root.is_dir() else f"{stem} (or {stem}.gz) is missing"
    raise DataError(f"{name}: cannot read {root / stem}: {where}; expected the four IDX files {expected}"
                    + (f"; {hint}" if hint else ""))


def _read_idx(path: Path, magic: int) -> np.ndarray:
    """One IDX file (plain or ``.gz``) as a uint8 array of the header's dims; ``magic`` is the expected number
    (``IDX_IMAGES_MAGIC`` or ``IDX_LABELS_MAGIC``)."""
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rb") as f:
                raw = f.read()
        else:
            raw = path.read_bytes()
    except _READ_ERRORS as err:
        kind = "corrupt or truncated gzip file" if path.suffix == ".gz" else "unreadable file"
        raise DataError(f"{path}: {kind} ({type(err).__name__}: {err})") from err
    ndim = magic & 0xFF
    header = 4 + 4 * ndim
    if len(raw) < 4:
        raise DataError(f"{path}: only {len(raw)} bytes, too short for an IDX header")
    found = int.from_bytes(raw[:4], "big")
    if found != magic:
        raise DataError(f"{path}: wrong magic number {found} (0x{found:08x}), expected {magic} (0x{magic:08x}) "
                        f"for an IDX {'image' if ndim == 3 else 'label'} file")
    if len(raw) < header:
        raise DataError(f"{path}: truncated IDX header ({len(raw)} bytes, need {header})")
    dims = tuple(int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim))
    expected = int(np.prod(dims, dtype=np.int64))
    if len(raw) - header != expected:
        raise DataError(f"{path}: the header's dims {dims} need {expected} payload bytes but the file has "
                        f"{len(raw) - header} ({'truncated' if len(raw) - header < expected else 'extra bytes'})")
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(dims)


def _load_idx_dataset(name: str, root: Path, hint: str) -> Dataset:
    """MNIST-format IDX files in ``root``: images (N, 1, rows, cols) / 255, labels 0..9."""
    splits = {}
    for split, (img_stem, lab_stem) in IDX_FILES.items():
        img_path, lab_path = _idx_path(name, root, img_stem, hint), _idx_path(name, root, lab_stem, hint)
        images, labels = _read_idx(img_path, IDX_IMAGES_MAGIC), _read_idx(lab_path, IDX_LABELS_MAGIC)
        if len(images) != len(labels):
            raise DataError(f"{img_path} has {len(images)} images but {lab_path} has {len(labels)} labels")
        if len(labels) and labels.max() > 9:
            raise DataError(f"{lab_path}: label {int(labels.max())} out of range 0..9")
        x = images.astype(np.float32)[:, None] / np.float32(255.0)
        splits[split] = (x, labels.astype(np.int64))
    return _finish(name, *splits["train"], *splits["test"], str(root))


# ----------------------------------------------------------------------------------------------------- CIFAR-10

def _cifar_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """One CIFAR-10 pickle batch: images uint8 (N, 3, 32, 32), labels int64 (N,).

    Pickle files run code when loaded: only load files you trust (this is the format CIFAR-10 ships in).
    """
    if not path.is_file():
        raise DataError(f"split-cifar10: missing {path}; expected {', '.join(CIFAR_TRAIN)} and {CIFAR_TEST} in "
                        f"{path.parent} (the folder {CIFAR_DIR} of cifar-10-python.tar.gz, or its parent)")
    try:
        with path.open("rb") as f:
            batch: Any = pickle.load(f, encoding="bytes")
    except Exception as err:  # unpickling can raise nearly anything on a damaged file
        raise DataError(f"{path}: not a readable CIFAR-10 pickle batch ({type(err).__name__}: {err})") from err
    if not isinstance(batch, dict):
        raise DataError(f"{path}: expected a pickled dict with keys 'data' and 'labels', got {type(batch).__name__}")

    def field(key: str) -> Any:
        for k in (key.encode(), key):
            if k in batch:
                return batch[k]
        raise DataError(f"{path}: missing key {key!r} (keys: {sorted(map(str, batch))})")

    try:
        data, labels = np.asarray(field("data")), np.asarray(field("labels"))
    except (ValueError, TypeError) as err:
        raise DataError(f"{path}: malformed 'data' or 'labels' ({err})") from err
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3 * 32 * 32:
        raise DataError(f"{path}: 'data' must be uint8 (N, 3072), got {data.dtype} {data.shape}")
    if labels.ndim != 1 or len(labels) != len(data) or not np.issubdtype(labels.dtype, np.integer):
        raise DataError(f"{path}: 'labels' must be {len(data)} integers, got {labels.dtype} {labels.shape}")
    if len(labels) and (labels.min() < 0 or labels.max() > 9):
        raise DataError(f"{path}: labels out of range 0..9 (min {int(labels.min())}, max {int(labels.max())})")
    return data.reshape(-1, 3, 32, 32), labels.astype(np.int64)


def _load_cifar10(root: Path) -> Dataset:
    """CIFAR-10 from ``root`` (``cifar-10-batches-py`` or its parent): (N, 3, 32, 32) / 255."""
    folder = root / CIFAR_DIR if (root / CIFAR_DIR).is_dir() else root
    if not folder.is_dir():
        raise DataError(f"split-cifar10: {root} is not a folder; pass --data-root with {CIFAR_DIR} or its parent")
    train = [_cifar_batch(folder / f) for f in CIFAR_TRAIN]
    x_test, y_test = _cifar_batch(folder / CIFAR_TEST)
    scale = np.float32(255.0)
    x_train = np.concatenate([x for x, _ in train]).astype(np.float32) / scale
    y_train = np.concatenate([y for _, y in train])
    return _finish("split-cifar10", x_train, y_train, x_test.astype(np.float32) / scale, y_test, str(folder))


# --------------------------------------------------------------------------------------------------- embeddings

def _load_embed(root: Path) -> Dataset:
    """Embeddings from a ``.npz`` (keys x_train, y_train, x_test, y_test) or a folder of those four ``.npy``.

    Features (N, D) of any real dtype become float32; labels must have an integer dtype, >= 0.
    Loaded with ``allow_pickle=False``.
    """
    arrays: dict[str, np.ndarray] = {}
    if root.is_dir():
        for key in EMBED_KEYS:
            path = root / f"{key}.npy"
            if not path.is_file():
                raise DataError(f"embed: missing {path}; the folder needs {', '.join(k + '.npy' for k in EMBED_KEYS)}")
            try:
                arrays[key] = np.load(path, allow_pickle=False)
            except _READ_ERRORS as err:
                raise DataError(f"{path}: not a readable .npy array ({type(err).__name__}: {err})") from err
    elif root.is_file():
        try:
            with np.load(root, allow_pickle=False) as npz:
                if not isinstance(npz, np.lib.npyio.NpzFile):
                    raise DataError(f"{root}: expected a .npz archive with {', '.join(EMBED_KEYS)}, got one array")
                missing = [k for k in EMBED_KEYS if k not in npz.files]
                if missing:
                    raise DataError(f"{root}: missing key(s) {', '.join(missing)} (has: {', '.join(npz.files)}); "
                                    f"needs {', '.join(EMBED_KEYS)}")
                arrays = {k: npz[k] for k in EMBED_KEYS}
        except DataError:
            raise
        except _READ_ERRORS as err:
            raise DataError(f"{root}: not a readable .npz archive ({type(err).__name__}: {err})") from err
    else:
        raise DataError(f"embed: {root} does not exist; pass a .npz file with {', '.join(EMBED_KEYS)} or a folder "
                        "with those four as .npy files")
    for key in ("x_train", "x_test"):
        x = arrays[key]
        if x.ndim != 2:
            raise DataError(f"{root}: {key} must be 2-D (N, D), got shape {x.shape}")
        if not (np.issubdtype(x.dtype, np.integer) or np.issubdtype(x.dtype, np.floating)):
            raise DataError(f"{root}: {key} must be real numbers, got dtype {x.dtype}")
    return _finish("embed", arrays["x_train"], arrays["y_train"], arrays["x_test"], arrays["y_test"], str(root))


# ------------------------------------------------------------------------------------------------------ stream

def task_classes(n_classes: int, classes_per_task: int = 2, *, order: str = "fixed",
                 seed: int = 0) -> list[tuple[int, ...]]:
    """The classes of each task, in stream order.

    ``order="fixed"``: (0, 1), (2, 3), ...; ``order="random"``: a permutation of 0..n_classes-1 drawn with
    ``np.random.default_rng([seed, 2])`` (a stream of its own, apart from :func:`stream_indices`' shuffles), cut
    into consecutive chunks of ``classes_per_task`` (kept in drawn order).
    """
    if n_classes < 1 or classes_per_task < 1:
        raise DataError(f"n_classes ({n_classes}) and classes_per_task ({classes_per_task}) must be positive")
    if n_classes % classes_per_task:
        raise DataError(f"{n_classes} classes do not split into tasks of {classes_per_task}: "
                        f"classes_per_task must divide n_classes")
    if order == "fixed":
        classes = np.arange(n_classes)
    elif order == "random":
        classes = np.random.default_rng([seed, 2]).permutation(n_classes)
    else:
        raise DataError(f"unknown class order {order!r}; choose from fixed, random")
    return [tuple(int(c) for c in classes[i: i + classes_per_task]) for i in range(0, n_classes, classes_per_task)]


def stream_indices(y: np.ndarray, tasks: Sequence[Sequence[int]], seed: int) -> list[np.ndarray]:
    """Per task, in order: int64 indices of the samples of ``y`` whose label is in that task, shuffled.

    One ``np.random.default_rng(seed)`` shuffles the tasks in order. Each index appears at most once over the
    whole stream (the single-pass rule), so a class may be in at most one task; classes in no task are unused.
    """
    y = np.asarray(y)
    flat = [int(c) for task in tasks for c in task]
    if len(flat) != len(set(flat)):
        raise DataError(f"tasks {[tuple(t) for t in tasks]} share classes; each class may be in one task only")
    rng = np.random.default_rng(seed)
    return [rng.permutation(np.flatnonzero(np.isin(y, list(task)))).astype(np.int64) for task in tasks]


def seen_mask(y: np.ndarray, tasks: Sequence[Sequence[int]], k: int) -> np.ndarray:
    """Bool mask (N,) of the samples of ``y`` whose class is in ``tasks[0..k]`` (inclusive): all classes seen
    after task ``k``."""
    if not 0 <= k < len(tasks):
        raise DataError(f"task index {k} out of range 0..{len(tasks) - 1}")
    return np.isin(np.asarray(y), [int(c) for task in tasks[: k + 1] for c in task])

"""Tasks: what a batch is, how batches are ordered, where data come from.

A task turns labelled images (or the synthetic tasks' draws) into batches of sequences

    x        float32 (B, T, m)   C-contiguous, the model's input
    y        the targets, as the task's readout and loss take them (nprnn.core.model): class
             labels int64 (B,) in [0, K) for the image tasks; adding's sums float32 (B, 1);
             copy's labels at every step int64 (B, T)
    lengths  int64 (B,) in [1, T], each row's length, for a task whose rows have their own
             (`has_lengths`: adding-varlen); else None. `batches(..., with_lengths=True)`
             yields (x, y, lengths), the default (x, y)

Every task declares what the model reads and how it is scored: `readout` ("last" or "every"),
`loss` ("xent" or "mse"), K = `num_classes` (the output size for "mse"), `metric` ("accuracy" or
"mse") and `baseline` (what a model without memory scores, or None).

The splits are three: "train", "valid" (`valid_size` examples held out of the training set) and
"test". Every task answers the same questions (`Task` below): its T, m and K, the size of a split,
the number of batches of a given size, and an iterator over the batches.

Batch order and noise
---------------------
train:       a permutation of the training examples drawn from (seed, epoch), so every epoch is
             shuffled differently and the same (seed, epoch) always gives the same order; the
             last incomplete batch is dropped.
valid, test: file order, the last batch may be smaller.
`start` skips the first `start` batches of that order, so a run resumed in the middle of an epoch
sees exactly the batches it would have seen. Noise is drawn per batch, never stored, each example
from its own stream (nprnn.data.noise): in a training batch (shuffled, of the train split) keyed by
(seed, epoch, batch index, position in the batch), fresh every batch and reproducible; in every
other batch (validation, test, and training examples taken in file order to be scored) keyed by
the example's file and row, so every evaluation sees the same noise whatever the batch size.
A synthetic task's train split has no files: each training batch is drawn from (seed, epoch,
batch index) (nprnn/data/synthetic.py), its valid and test sets come from its cache.
`batches(..., device="cuda")` makes the same batches on the GPU: the images are uploaded and the
noise is drawn there (the same numbers to float32 rounding), for training on --device cuda; with
reuse=True (what training uses) into buffers reused in turn, without waiting for the GPU.

The tasks themselves are in tasks.py, their HDF5 cache in cache.py.
"""
import json
import os
import weakref
from pathlib import Path

import h5py
import numpy as np

from ..core.device import resolve_device
from ..core.memory import Staging, to_device
from ..util.files import remove_stale_temporaries
from . import synthetic
from .cache import _say, build_cache, check_cache, read_synthetic
from .tasks import (_FILE_CODE, DEFAULT_PERMUTATION_SEED, NOISE_EVAL, NOISE_TRAIN, cache_path,
                    check_pixels, pixel_table, resolve_data_dir, sequences,
                    splitmix64_permutation, task_spec)

SPLITS = ("train", "valid", "test")
DEVICES = ("cpu", "cuda")                   # where batches.x lives

# The validation examples are a fixed random subset of the training set, the same for every
# training seed, so two runs with different seeds are scored on the same held-out digits.
VALID_SPLIT_SEED = 20190101


def _check_split(split):
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; the splits are {', '.join(SPLITS)}")


MAX_SEED = 2**63 - 1          # seeds and positions become int64 keys of the noise streams


def _check_int(name, value, minimum=0):
    """value as an int, checked to be in minimum .. 2**63 - 1 (seeds and positions become int64
    keys of the noise streams)."""
    if (isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer))
            or not minimum <= value <= MAX_SEED):
        raise ValueError(f"{name} must be an integer in {minimum} .. 2**63 - 1, got {value!r}")
    return int(value)


# Permutations that are the same everywhere (pmnist's pixel order, the validation subset)
def split_train_valid(num_train, valid_size):
    """(train_indices, valid_indices) of a training set of `num_train` examples, both sorted.

    The `valid_size` validation examples are the first `valid_size` entries of
    splitmix64_permutation(num_train, VALID_SPLIT_SEED): random (so class-sorted files still give
    a mixed validation set) and the same examples on every run, machine and NumPy version."""
    valid_size = _check_int("valid_size", valid_size)
    if valid_size >= num_train:
        raise ValueError(f"valid_size={valid_size} leaves no training examples: the training set "
                         f"has {num_train}; choose valid_size in [0, {num_train - 1}]")
    if valid_size == 0:
        return np.arange(num_train), np.arange(0)
    perm = splitmix64_permutation(num_train, VALID_SPLIT_SEED)
    return np.sort(perm[valid_size:]), np.sort(perm[:valid_size])


class Task:
    """The interface every task offers; subclasses say how to build the batch for given examples.

    Attributes: name (str), T (steps), m (inputs per step), num_classes (K), and what the model
    reads and is scored by: readout, loss, metric, baseline, has_lengths (the module docstring).
    A subclass provides `size(split)` and `_make_batch(split, idx, fresh)`, which returns x
    float32 (len(idx), T, m) C-contiguous, y and lengths (or None) for the examples `idx`
    (positions within the split, in the order wanted). `fresh` is (seed, epoch, batch index)
    for a training batch, whose noise (if the task has any) is drawn fresh for it, and None
    for a batch to be scored, whose examples each get their own noise."""

    name = "task"
    T = m = num_classes = 0
    readout, loss, metric, baseline, has_lengths = "last", "xent", "accuracy", None, False

    # -- sizes ---------------------------------------------------------------------------------
    def size(self, split):
        raise NotImplementedError

    @property
    def image_steps(self):
        """How many of the first steps carry the example; noise fills the rest (none here)."""
        return self.T

    @staticmethod
    def _defaults(split, shuffle, drop_last):
        train = split == "train"
        return (train if shuffle is None else bool(shuffle),
                train if drop_last is None else bool(drop_last))

    def num_batches(self, split, batch_size, drop_last=None):
        """Number of batches of `batch_size` in `split`: floor(N / B) if drop_last else ceil(N / B).
        drop_last defaults to True for train and False for valid/test."""
        _check_split(split)
        B = _check_int("batch_size", batch_size, minimum=1)
        _, drop_last = self._defaults(split, None, drop_last)
        N = self.size(split)
        return N // B if drop_last else -(-N // B)

    # -- order and batches ---------------------------------------------------------------------
    def order(self, split, seed=0, epoch=0, shuffle=None):
        """The example order of one epoch over `split` (int64 positions within the split).

        shuffle (default: True for train, False otherwise) draws the permutation from a generator
        seeded with (seed, epoch); without it the order is 0 .. N-1."""
        _check_split(split)
        shuffle, _ = self._defaults(split, shuffle, None)
        N = self.size(split)
        if not shuffle:
            return np.arange(N, dtype=np.int64)
        seed = _check_int("seed", seed)
        epoch = _check_int("epoch", epoch)
        return np.random.default_rng([seed, epoch]).permutation(N).astype(np.int64)

    def batches(self, split, batch_size, seed=0, epoch=0, start=0, shuffle=None, drop_last=None,
                device="cpu", reuse=False, with_lengths=False):
        """Iterate over (x float32 (B, T, m), y) batches of one epoch over `split`, or with
        `with_lengths` over (x, y, lengths (B,) or None) (the module docstring).

        The order is `order(split, seed, epoch, shuffle)`; batch b holds order[b*B : (b+1)*B].
        `start` is the index of the first batch yielded (resume mid-epoch). Only the batch being
        yielded is held in memory. device="cuda" yields x as a float32 device array (numba.cuda):
        the noise tasks then draw their noise on the GPU (the same numbers to float32 rounding)
        and only the image part crosses from the host; y stays a NumPy array.

        reuse=True (cuda only) fills a few device buffers in turn instead of fresh arrays, and
        uploads without waiting for the GPU (nprnn.core.memory.Staging): each x yielded is overwritten
        two batches later, after the kernels launched on it before then. The training loop and
        evaluation use it; keep it off to hold on to batches. reuse may also be a memory.Staging
        to fill, so that passes one after another (the epochs of a run and its evaluations)
        keep the same buffers rather than each allocating its own: "two batches later" then
        counts the batches of every pass filling it."""
        if device not in DEVICES:
            raise ValueError(f"device must be one of {', '.join(DEVICES)}, got {device!r}")
        if reuse is None or isinstance(reuse, (bool, np.bool_, int, np.integer)):
            reuse = bool(reuse)                 # else a Staging, checked below
        if reuse is not False and device != "cuda":
            raise ValueError(f"reuse={reuse!r} reuses GPU buffers: it needs device='cuda', got "
                             f"{device!r}")
        if device == "cuda":
            resolve_device(device)     # DeviceUnavailable, saying why, when no GPU is usable
            if not isinstance(reuse, (bool, Staging)):
                raise ValueError(f"reuse must be True, False or an nprnn.core.memory.Staging, got "
                                 f"{reuse!r}")
        _check_split(split)
        B = _check_int("batch_size", batch_size, minimum=1)
        start = _check_int("start", start)
        seed = _check_int("seed", seed)
        epoch = _check_int("epoch", epoch)
        nb = self.num_batches(split, B, drop_last)
        if start > nb:
            raise ValueError(f"start={start} is past the end: {split!r} has {nb} batches of "
                             f"{B}")
        order = self.order(split, seed, epoch, shuffle)
        training = split == "train" and self._defaults(split, shuffle, drop_last)[0]

        def fresh(b):           # a training batch's own noise; None: each example's own
            return (seed, epoch, b) if training else None

        # the checks above run at this call; the batches are made as they are asked for
        keep = slice(None) if with_lengths else slice(2)
        if device == "cpu":
            return (self._make_batch(split, order[b * B:(b + 1) * B], fresh(b))[keep]
                    for b in range(start, nb))
        staging = reuse if isinstance(reuse, Staging) else Staging() if reuse else None
        return (self._make_device_batch(split, order[b * B:(b + 1) * B], fresh(b), staging)[keep]
                for b in range(start, nb))

    def _make_batch(self, split, idx, fresh):
        raise NotImplementedError

    def _make_device_batch(self, split, idx, fresh, staging=None):
        """The batch with x on the GPU (in a slot of `staging`, a memory.Staging, if given);
        a task that can build part of it there overrides this."""
        x, y, lengths = self._make_batch(split, idx, fresh)
        return to_device(x, staging=staging, name="x"), y, lengths

    def info(self):
        """A JSON-able summary: shapes, split sizes, label histograms."""
        return dict(name=self.name, T=self.T, m=self.m, num_classes=self.num_classes,
                    sizes={s: self.size(s) for s in SPLITS})

    def close(self):
        """Release what the task holds open (an in-memory task holds nothing)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        sizes = ", ".join(f"{s}={self.size(s)}" for s in SPLITS)
        return (f"<{type(self).__name__} {self.name!r} T={self.T} m={self.m} "
                f"K={self.num_classes} {sizes}>")


class ArrayTask(Task):
    """A task over in-memory sequences: x_train (N, T, m), y_train (N,), x_test (M, T, m),
    y_test (M,).

    x arrays (floating point) are stored as float32, labels as int64 (checked to lie in
    [0, num_classes)). The `valid_size` validation examples are held out of x_train as
    `split_train_valid` chooses."""

    def __init__(self, name, x_train, y_train, x_test, y_test, num_classes, valid_size=0):
        self.name = str(name)
        self.num_classes = _check_int("num_classes", num_classes, minimum=2)
        x_train, y_train = self._check_pair("train", x_train, y_train)
        x_test, y_test = self._check_pair("test", x_test, y_test)
        if x_train.shape[1:] != x_test.shape[1:]:
            raise ValueError(f"x_train and x_test must have the same (T, m); got "
                             f"{x_train.shape[1:]} and {x_test.shape[1:]}")
        self.T, self.m = x_train.shape[1], x_train.shape[2]
        train_idx, valid_idx = split_train_valid(len(x_train), valid_size)
        self._x = dict(train=x_train[train_idx], valid=x_train[valid_idx], test=x_test)
        self._y = dict(train=y_train[train_idx], valid=y_train[valid_idx], test=y_test)

    def _check_pair(self, split, x, y):
        x, y = np.asarray(x), np.asarray(y)
        if x.ndim != 3 or 0 in x.shape[1:]:
            raise ValueError(f"x_{split} must have shape (N, T, m) with T, m >= 1, got {x.shape}")
        if not np.issubdtype(x.dtype, np.floating):     # as Model refuses it (model.py)
            raise TypeError(f"x_{split} must hold floating-point values, got dtype {x.dtype}; "
                            f"scale integer pixels first, e.g. x.astype('float32') / 255")
        if y.shape != (x.shape[0],) or not np.issubdtype(y.dtype, np.integer):
            raise ValueError(f"y_{split} must be integer labels of shape ({x.shape[0]},), got "
                             f"dtype {y.dtype} and shape {y.shape}")
        if len(y) and (y.min() < 0 or y.max() >= self.num_classes):
            raise ValueError(f"y_{split} holds labels outside [0, {self.num_classes - 1}]: "
                             f"min {y.min()}, max {y.max()}")
        return np.ascontiguousarray(x, dtype=np.float32), np.ascontiguousarray(y, dtype=np.int64)

    def size(self, split):
        _check_split(split)
        return len(self._y[split])

    def _make_batch(self, split, idx, fresh):
        return self._x[split][idx], self._y[split][idx], None   # fancy indexing copies

    def info(self):
        out = super().info()
        out["label_counts"] = {s: np.bincount(self._y[s], minlength=self.num_classes).tolist()
                               for s in SPLITS}
        return out


# ----------------------------------------------------------------------------------------------
# the task over a cache
# ----------------------------------------------------------------------------------------------

def _contiguous_layout(dataset):
    """(byte offset in the file, bytes per row) of an uncompressed, contiguous HDF5 dataset of
    uint8 rows; None for any other layout (read through h5py then)."""
    offset = dataset.id.get_offset()
    if (dataset.chunks is not None or dataset.compression is not None or offset is None
            or dataset.dtype != np.uint8):
        return None
    return offset, int(np.prod(dataset.shape[1:]))


def _close_cache_file(file, fd):
    """Close a CachedTask's h5py file and raw descriptor (fd None: there is none)."""
    if fd is not None:
        os.close(fd)
    file.close()


class CachedTask(Task):
    """A task read from its HDF5 cache (see the module docstring). Use `get_task` to make one.

    Batches gather their images from the open file; labels are held in memory."""

    def __init__(self, name, path, T=None, seed=DEFAULT_PERMUTATION_SEED, valid_size=0,
                 pixels="unit"):
        spec = task_spec(name)
        self.spec, self.name, self.path = spec, spec.name, Path(path)
        self.T, self.m = spec.shape(T)
        check_pixels(pixels)                        # refuse an unknown scaling before opening
        self.pixels = pixels
        self._file, self._fd = self._open()
        # both closed by close(), or when the task is garbage-collected without it
        self._closer = weakref.finalize(self, _close_cache_file, self._file, self._fd)
        try:
            self._read_index(seed, valid_size)
        except BaseException:
            self.close()
            raise

    def _read_index(self, seed, valid_size):
        """Everything but the images, from the open file: classes, labels, permutation, splits."""
        f = self._file
        self.num_classes = int(f.attrs["num_classes"])
        self._table = pixel_table(self.pixels, f.attrs["pixel_mean"], f.attrs["pixel_std"])
        self._images = dict(train=f["train/images"], test=f["test/images"])
        # Rows are read straight from the file where the dataset's bytes lie in one piece (as the
        # cache writes them): one positioned read per row costs ~2 us, where h5py's selection of
        # 128 scattered rows costs ~4 ms, more than a pixel-MNIST batch may (under 5% of a step).
        self._layout = {s: _contiguous_layout(d) for s, d in self._images.items()}
        labels = dict(train=f["train/labels"][:].astype(np.int64),
                      test=f["test/labels"][:].astype(np.int64))
        self.permutation = f["permutation"][:] if "permutation" in f else None
        self.permutation_seed = seed if self.permutation is not None else None
        train_rows, valid_rows = split_train_valid(len(labels["train"]), valid_size)
        # split -> (file split, rows of that file split, in order)
        self._rows = dict(train=("train", train_rows), valid=("train", valid_rows),
                          test=("test", np.arange(len(labels["test"]))))
        self._labels = {s: labels[fs][rows] for s, (fs, rows) in self._rows.items()}

    def _open(self, tries=5):
        """(h5py file, raw descriptor or None) of the same cache file. A rebuild may rename a new
        file over the path between the two opens; the descriptor, opened first, still holds the
        old file. The path still naming the descriptor's file after both opens proves that h5py
        opened that file too (a rebuild never brings an old file back)."""
        if not hasattr(os, "preadv"):
            return h5py.File(self.path, "r"), None
        for _ in range(tries):
            fd = os.open(self.path, os.O_RDONLY)
            f = h5py.File(self.path, "r")
            a, b = os.fstat(fd), os.stat(self.path)
            if (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino):
                return f, fd
            f.close()
            os.close(fd)
        raise RuntimeError(f"{self.path} was replaced {tries} times while being opened; is "
                           f"another process rebuilding it in a loop?")

    def size(self, split):
        _check_split(split)
        return len(self._labels[split])

    @property
    def image_steps(self):
        return self.spec.image_steps(self.T)

    def _read_images(self, file_split, rows):
        """uint8 (len(rows), H, W, C) for rows of the file's split, in the order of `rows`: by
        positioned reads where the rows lie contiguously in the file, else through h5py (whose
        reads need increasing indices: read sorted, then put back in order)."""
        images = np.empty((len(rows),) + self._images[file_split].shape[1:], dtype=np.uint8)
        layout = self._layout[file_split]
        if self._fd is not None and layout is not None:
            offset, row_bytes = layout
            flat = images.reshape(len(rows), row_bytes)
            for i, r in enumerate(rows):
                got = os.preadv(self._fd, [flat[i]], offset + int(r) * row_bytes)
                if got != row_bytes:
                    raise OSError(f"{self.path}: short read of {file_split} row {r} ({got} of "
                                  f"{row_bytes} bytes); the cache changed while open")
            return images
        order = np.argsort(rows, kind="stable")
        images[order] = self._images[file_split][rows[order]]
        return images

    def _make_batch(self, split, idx, fresh, device="cpu", staging=None):
        file_split, all_rows = self._rows[split]
        rows = all_rows[idx]
        images = self._read_images(file_split, rows)
        keys = None
        if self.spec.noisy:
            B = len(rows)
            if fresh is not None:                       # a training batch: fresh for it
                seed, epoch, batch_index = fresh
                keys = np.column_stack([np.full(B, NOISE_TRAIN), np.full(B, seed),
                                        np.full(B, epoch), np.full(B, batch_index),
                                        np.arange(B)])
            else:                                       # the example's own, at every evaluation
                keys = np.column_stack([np.full(B, NOISE_EVAL),
                                        np.full(B, _FILE_CODE[file_split]), rows])
        x = sequences(self.spec.layout, images, self.T, self.permutation, keys, device, staging,
                      self._table)
        return x, self._labels[split][idx], None

    def _make_device_batch(self, split, idx, fresh, staging=None):
        return self._make_batch(split, idx, fresh, "cuda", staging)

    def info(self):
        out = super().info()
        f = self._file
        out.update(
            task=self.spec.summary, layout=self.spec.layout, source=self.spec.source,
            origin=f.attrs["origin"], pixels=self.pixels,
            normalisation=(f.attrs["normalisation"] if self.pixels == "unit" else
                           "x = (pixel / 255 - mean) / std, per channel (float32)"),
            pixel_mean=np.asarray(f.attrs["pixel_mean"]).round(4).tolist(),
            pixel_std=np.asarray(f.attrs["pixel_std"]).round(4).tolist(),
            image_shape=list(self._images["train"].shape[1:]),
            label_counts={s: np.bincount(self._labels[s], minlength=self.num_classes).tolist()
                          for s in SPLITS},
            raw_files=json.loads(f.attrs["raw_files"]),
            cache=dict(path=str(self.path), bytes=self.path.stat().st_size,
                       format_version=int(f.attrs["format_version"]), created=f.attrs["created"],
                       nprnn_version=f.attrs["nprnn_version"], state="verified"))
        if self.permutation is not None:
            out["permutation"] = dict(seed=self.permutation_seed,
                                      first=self.permutation[:8].tolist())
        if self.spec.noisy:
            out["noise"] = ("N(0, 1) float32 (nprnn.data.noise); training batches: fresh per "
                            "batch, keyed by (seed, epoch, batch, position); scored examples "
                            "(valid, test, train in file order): fixed per example, keyed by "
                            "(file, row)")
        return out

    def close(self):
        self._closer()                        # a finalizer runs once; later calls do nothing
        self._fd = None


# ----------------------------------------------------------------------------------------------
# the synthetic tasks
# ----------------------------------------------------------------------------------------------

class SyntheticTask(Task):
    """A synthetic task (nprnn/data/synthetic.py) at its T. Use `get_task` to make one.

    train: synthetic.TRAIN_SIZE rows a nominal epoch, every training batch drawn afresh from
    (seed, epoch, batch index), or in file order each row from its own key; valid: the first
    `valid_size` rows of the cache's validation set; test: the cache's test set. T is the task's
    own (copy: the delay), `self.T` the sequences' length."""

    def __init__(self, name, path, T, valid_size=0):
        spec = task_spec(name)
        self.spec, self.name, self.path = spec, spec.name, Path(path)
        self.task_T = spec.check_T(T)
        self.T, self.m = spec.shape(T)
        self.num_classes = spec.num_classes
        self.readout, self.loss, self.metric = spec.readout, spec.loss, spec.metric
        self.baseline, self.has_lengths = spec.baseline(T), spec.varlen
        valid_size = _check_int("valid_size", valid_size)
        if valid_size > synthetic.EVAL_SIZE:
            raise ValueError(f"valid_size={valid_size}: task {name!r} has a validation set of "
                             f"{synthetic.EVAL_SIZE} rows; choose valid_size in [0, "
                             f"{synthetic.EVAL_SIZE}]")
        self._rows = read_synthetic(self.path, spec, self.task_T)
        self._rows["valid"] = {k: v[:valid_size] for k, v in self._rows["valid"].items()}

    def size(self, split):
        _check_split(split)
        if split == "train":
            return synthetic.TRAIN_SIZE
        return len(next(iter(self._rows[split].values())))

    def order(self, split, seed=0, epoch=0, shuffle=None):
        """0 .. N-1: the rows of a training batch are drawn for it, so need no shuffling."""
        _check_split(split)
        return np.arange(self.size(split), dtype=np.int64)

    def _make_batch(self, split, idx, fresh):
        spec, T = self.spec, self.task_T
        if split == "train":
            keys = (synthetic.training_keys(spec, T, *fresh, len(idx)) if fresh is not None
                    else synthetic.scored_keys(spec, T, "train", idx))
            drawn = synthetic.draw(spec, T, keys)
        else:
            drawn = {k: v[idx] for k, v in self._rows[split].items()}
        return synthetic.sequences(spec, T, drawn)

    def info(self):
        out = super().info()
        out.update(task=self.spec.summary, task_T=self.task_T, readout=self.readout,
                   loss=self.loss, metric=self.metric, baseline=self.baseline,
                   lengths=self.has_lengths,
                   draws=("each row from its own key (nprnn.data.synthetic): training batches "
                          "from (seed, epoch, batch, position), valid and test rows fixed in "
                          "the cache, train rows in file order from (split, row); the train "
                          "split's size is a nominal epoch"),
                   cache=dict(path=str(self.path), bytes=self.path.stat().st_size,
                              state="verified"))
        return out


def get_task(name, data_dir=None, T=None, seed=DEFAULT_PERMUTATION_SEED, valid_size=0,
             download=True, progress=True, pixels="unit"):
    """The task `name` (one of TASKS), built from its cache, which is built first if needed.

    data_dir:   where caches and raw files live (default $NPRNN_DATA_DIR, else ./data)
    T:          sequence length of the noise tasks (cifar10-noise, mnist-noise: 1000;
                padded-mnist: 100) and of adding (needed), copy's delay (needed); must be
                None or the natural length for the others
    seed:       pmnist's permutation seed (default 0; other seeds get their own cache file);
                ignored by the other tasks
    valid_size: training examples held out as the "valid" split (a fixed random subset)
    pixels:     how pixels become inputs, PIXEL_SCALINGS: "unit" (p / 255) or "standardised"
                (mean 0, variance 1 per channel over the training file)
    download:   fetch missing raw files from the canonical sources
    A cache that is missing, outdated, truncated or corrupt is (re)built, the latter with a
    message on stderr. Raises nprnn.data.sources.DataError subclasses when the raw files are missing
    (DataUnavailable, whose message says which files to place where), damaged or wrong."""
    spec = task_spec(name)
    spec.shape(T)                                   # reject a bad T before any work
    check_pixels(pixels)                            # and an unknown pixel scaling
    if spec.synthetic and pixels != "unit":
        raise ValueError(f"pixels = {pixels!r} scales images; task {name!r} has none: leave "
                         f"pixels at 'unit'")
    seed = _check_int("seed", seed)
    valid_size = _check_int("valid_size", valid_size)  # its upper bound needs the cache
    data_dir = resolve_data_dir(data_dir)
    path = cache_path(name, data_dir, seed, T)
    remove_stale_temporaries(path.parent, "tmp")      # what killed builds left behind
    problem = check_cache(path, name, seed, T)
    if problem is not None:
        if path.exists():
            _say(f"the cache {path} is not usable: {problem}; rebuilding it")
        build_cache(name, data_dir, seed, download=download, progress=progress, T=T)
        problem = check_cache(path, name, seed, T)
        if problem is not None:
            raise RuntimeError(f"the cache {path} that was just built fails its check: {problem}")
    if spec.synthetic:
        return SyntheticTask(name, path, T, valid_size)
    return CachedTask(name, path, T, seed, valid_size, pixels)

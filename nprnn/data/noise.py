"""Gaussian noise for the noise-padded tasks: N(0, 1) float32, reproducible from a key, cheap, and
the same numbers on the CPU and on the GPU.

Each example's noise is its own stream, started at s_0 = hash(key) for a key of integers such as
(seed, epoch, batch, row); the hash chains SplitMix64's mixing function over the key's entries:

    h = 0;  h = mix(h + gamma + key_j) for each entry j;  s_0 = h

Streams start 2^64-uniformly apart, so two streams of L words overlap with probability about
2 L / 2^64 per pair. Word j of a stream gives noise values 2j and 2j + 1 by the Box-Muller
transform; the kernels, and why they are written the way they are, are in `nprnn/kernels/noise.py`.

    fill_gaussian(x, t0, keys)          x a NumPy array, on the CPU threads
    fill_gaussian_device(x, t0, keys)   x a device array: drawn on the GPU, never copied
    head_then_noise_device(head, T, keys)   a noise-padded batch made on the GPU
"""
import numpy as np

from ..kernels import noise as K
from ..kernels.common import njit
from ..kernels.layout import copy_leading_steps_gpu
from ..core.memory import device_array, is_device_array, to_device

# the largest |z| the transform can give: R at u = 2^-32
MAX_ABS = float(np.sqrt(64 * np.log(2.0)))


@njit
def stream_starts(keys):
    """Starting states (B,) uint64 of the streams keyed by the rows of keys (B, k) uint64:
    h = 0; h = mix(h + gamma + key_j) for each entry of the row."""
    starts = np.empty(keys.shape[0], dtype=np.uint64)
    for b in range(keys.shape[0]):
        h = np.uint64(0)
        for j in range(keys.shape[1]):
            h = K.mix(h + K.GAMMA + keys[b, j])
        starts[b] = h
    return starts


def _starts(x, t0, keys):
    """Checks the arguments common to both fills and returns the streams' starting states."""
    B, T = x.shape[0], x.shape[1]
    keys = np.asarray(keys)
    if (keys.ndim != 2 or keys.shape[0] != B or not np.issubdtype(keys.dtype, np.integer)
            or (keys < 0).any()):
        raise ValueError(f"need one row of non-negative integer keys per example: x has {B} "
                         f"rows, keys have shape {keys.shape} and dtype {keys.dtype}")
    if (isinstance(t0, (bool, np.bool_)) or not isinstance(t0, (int, np.integer))
            or not 0 <= t0 <= T):
        raise ValueError(f"t0 must be an integer in [0, T = {T}], got {t0!r}")
    return stream_starts(keys.astype(np.uint64))


def fill_gaussian(x, t0, keys):
    """x[b, t0:] = i.i.d. N(0, 1) float32 noise from the stream of keys[b], for b < B.

    x float32 (B, T, m) C-contiguous NumPy array (written in place); keys (B, k) non-negative
    integers."""
    if (not isinstance(x, np.ndarray) or x.dtype != np.float32 or x.ndim != 3
            or not x.flags.c_contiguous):
        raise ValueError(f"x must be a C-contiguous float32 array of shape (B, T, m), got "
                         f"{getattr(x, 'dtype', type(x).__name__)} {getattr(x, 'shape', '')}")
    K.gaussian_fill_cpu(x, int(t0), _starts(x, t0, keys))


def fill_gaussian_device(x, t0, keys, staging=None):
    """The same numbers as `fill_gaussian` (to float32 rounding), drawn on the GPU into the
    device array x float32 (B, T, m); keys (B, k) is a host array of non-negative integers.
    The streams' starting states are uploaded through `staging` (a memory.Staging) if given."""
    if not is_device_array(x) or x.dtype != np.float32 or len(x.shape) != 3:
        raise ValueError(f"x must be a float32 device array of shape (B, T, m), got "
                         f"{type(x).__name__} {getattr(x, 'dtype', '')} {getattr(x, 'shape', '')}")
    starts = to_device(_starts(x, t0, keys), staging=staging, name="noise_starts")
    K.gaussian_fill_gpu(x, int(t0), starts)


def head_then_noise_device(head, T, keys, staging=None):
    """x float32 (B, T, m) on the device: x[:, :t0] = head (B, t0, m, a host array, uploaded),
    then N(0, 1) noise drawn on the GPU from the streams of keys (B, k): the device twin of
    `nprnn.data.datasets.head_then_noise`, so that a noise-padded batch never crosses the bus whole.
    With a Staging, x and the uploads live in its slots "x", "head" and "noise_starts"."""
    B, t0, m = head.shape
    if not t0 <= T:         # checked before the copy: a kernel writing past x checks nothing
        raise ValueError(f"the head's {t0} steps do not fit in T = {T} steps")
    if staging is None:
        x = device_array((B, T, m), np.float32)
    else:
        x = staging.buffer("x", (B, T, m), np.float32)
    if t0:
        copy_leading_steps_gpu(x, to_device(head, np.float32, staging, "head"))
    fill_gaussian_device(x, t0, keys, staging)
    return x

"""The noise generator: SplitMix64 reference values, the compiled Box-Muller transform against a
float64 NumPy version of the same formulas (edge words included), the N(0, 1) distribution, and
reproducibility from keys."""
import math

import re

import numpy as np
import pytest
from scipy import stats

from nprnn.data import noise
from nprnn.data.tasks import splitmix64
from nprnn.kernels import noise as K

MASK64 = (1 << 64) - 1


def words_numpy(s0, count):
    """Words 0 .. count - 1 of the stream starting at s0, in NumPy uint64 arithmetic."""
    j = np.arange(1, count + 1, dtype=np.uint64)
    with np.errstate(over="ignore"):
        z = np.uint64(s0) + j * K.GAMMA
        z = (z ^ (z >> np.uint64(30))) * K._M1
        z = (z ^ (z >> np.uint64(27))) * K._M2
        return z ^ (z >> np.uint64(31))


def box_muller_float64(w):
    """(z0, z1) float64 for words w: the transform of kernels/noise.py with libm's functions."""
    w = np.asarray(w, dtype=np.uint64)
    u = 1.0 - (w & np.uint64(0xFFFFFFFF)).astype(np.float64) * 2.0 ** -32
    h = w >> np.uint64(32)
    alpha = (h & np.uint64((1 << 30) - 1)).astype(np.float64) * (math.pi / 2 / 2 ** 30)
    R = np.sqrt(-2.0 * np.log(u))
    sign0 = 1.0 - 2.0 * ((h >> np.uint64(31)) & np.uint64(1)).astype(np.float64)
    sign1 = 1.0 - 2.0 * ((h >> np.uint64(30)) & np.uint64(1)).astype(np.float64)
    return sign0 * R * np.cos(alpha), sign1 * R * np.sin(alpha)


def ulps(got, want):
    """|got - want| in units of the last place of float32 at want (want floored at 1e-30).
    Computed in float64: np.spacing of a tiny float32 is subnormal, which becomes 0 in a process
    where PyTorch has set flush-to-zero (the comparison tests import it)."""
    unit = np.exp2(np.floor(np.log2(np.maximum(np.abs(want), 1e-30))) - 23)
    return np.abs(got.astype(np.float64) - want) / unit


def test_stream_words_are_splitmix64():
    t = 12345
    for j in range(5):
        t, z = splitmix64(t)                        # datasets' sequential version, Python ints
        assert int(K.stream_word(np.uint64(12345), j)) == z
    assert int(K.stream_word(np.uint64(0), 0)) == 0xE220A8397B1DCDAF    # Vigna's reference value
    assert np.array_equal(words_numpy(12345, 5),
                          [K.stream_word(np.uint64(12345), j) for j in range(5)])


def edge_words():
    """Words at the edges of every branch of log_u and of the angle fold."""
    lows = [0, 1, 2, 1 << 31, (1 << 31) - 1, (1 << 31) + 1, (1 << 32) - 1, (1 << 32) - 2,
            int((1 - math.sqrt(0.5)) * 2 ** 32), int((1 - math.sqrt(0.5)) * 2 ** 32) + 1,
            int((1 - 2 ** -0.5 / 2) * 2 ** 32), 3 << 30, (1 << 32) - (1 << 16), 12345]
    angles = [0, 1, (1 << 29) - 1, 1 << 29, (1 << 29) + 1, (1 << 30) - 1, 1 << 28]
    highs = [k | (s << 30) for k in angles for s in range(4)]
    return np.array([(h << 32) | a for h in highs for a in lows], dtype=np.uint64)


def test_pair_within_a_few_float32_ulps_of_the_exact_transform():
    rng = np.random.default_rng(0)
    words = np.concatenate([edge_words(), words_numpy(777, 100_000),
                            rng.integers(0, 1 << 63, 1000, dtype=np.uint64) << np.uint64(1)])
    got = np.array([K.gaussian_pair(w) for w in words], dtype=np.float32)
    want = np.stack(box_muller_float64(words), axis=1)
    assert ulps(got, want).max() <= 8
    # u = 1 (a = 0) gives 0; u = 2^-32 (a = 2^32 - 1) the largest |z|
    assert K.gaussian_pair(np.uint64(0)) == (0.0, 0.0)
    R = max(abs(v) for v in K.gaussian_pair(np.uint64((1 << 32) - 1)))
    assert abs(R - noise.MAX_ABS) < 1e-5


def test_fill_is_the_stream_in_row_major_order_from_t0():
    keys = np.array([[3, 1], [3, 2]])
    x = np.full((2, 4, 5), 7.0, dtype=np.float32)   # from t0 = 1: 15 values, an odd count
    noise.fill_gaussian(x, 1, keys)
    assert np.all(x[:, 0] == 7)                      # before t0: untouched
    starts = noise.stream_starts(keys.astype(np.uint64))
    for b in range(2):
        z0, z1 = box_muller_float64(words_numpy(starts[b], 8))
        want = np.stack([z0, z1], axis=1).ravel()[:15]     # the last pair gives only z0
        assert ulps(x[b, 1:].ravel(), want).max() <= 8


def test_gaussian_distribution():
    x = np.zeros((64, 1, 40_000), dtype=np.float32)    # 2.56 million draws
    noise.fill_gaussian(x, 0, np.column_stack([np.full(64, 9), np.arange(64)]))
    z = x.ravel().astype(np.float64)
    assert abs(z.mean()) < 4 / math.sqrt(z.size)       # 4 standard errors
    assert abs(z.var() - 1) < 4 * math.sqrt(2 / z.size)
    assert stats.kstest(z, "norm").pvalue > 1e-3
    # chi-square over 60 bins of equal probability, tails included
    edges = stats.norm.ppf(np.linspace(0, 1, 61))
    counts = np.histogram(z, edges)[0]
    assert stats.chisquare(counts).pvalue > 1e-3
    # the far tail has its mass, and nothing lies beyond the largest |z| the transform allows
    for c in (3.5, 4.5):
        beyond, expected = np.mean(np.abs(z) > c), 2 * stats.norm.sf(c)
        assert abs(beyond - expected) < 5 * math.sqrt(expected / z.size)
    assert np.abs(z).max() <= noise.MAX_ABS
    # the two values of a pair are uncorrelated, also in their squares
    pairs = z.reshape(-1, 2)
    assert abs(np.corrcoef(pairs.T)[0, 1]) < 4 / math.sqrt(len(pairs))
    assert abs(np.corrcoef((pairs ** 2).T)[0, 1]) < 4 / math.sqrt(len(pairs))


def test_keys_decide_the_noise():
    a = np.zeros((3, 2, 50), dtype=np.float32)
    b = np.zeros((3, 2, 50), dtype=np.float32)
    keys = np.array([[1, 5, 0], [1, 5, 1], [2, 5, 0]])
    noise.fill_gaussian(a, 0, keys)
    noise.fill_gaussian(b, 0, keys[[1, 0, 2]])
    assert np.array_equal(a[0], b[1]) and np.array_equal(a[1], b[0])   # per row, not position
    assert not np.array_equal(a[0], a[1]) and not np.array_equal(a[0], a[2])
    assert abs(np.corrcoef(a[0].ravel(), a[1].ravel())[0, 1]) < 0.3


def test_fill_gaussian_rejects_bad_arguments():
    with pytest.raises(ValueError, match="C-contiguous float32"):
        noise.fill_gaussian(np.zeros((2, 3, 4)), 0, np.zeros((2, 1), int))
    with pytest.raises(ValueError, match="one row of non-negative integer keys per example"):
        noise.fill_gaussian(np.zeros((2, 3, 4), np.float32), 0, np.zeros((3, 1), int))
    with pytest.raises(ValueError, match="one row of non-negative integer keys per example"):
        noise.fill_gaussian(np.zeros((2, 3, 4), np.float32), 0, -np.ones((2, 1), int))
    for t0 in (4, -1, 2.7, True):                 # past T = 3, negative, not an integer
        with pytest.raises(ValueError, match=r"t0 must be an integer in \[0, T = 3\], got "
                                             + re.escape(repr(t0))):
            noise.fill_gaussian(np.zeros((2, 3, 4), np.float32), t0, np.zeros((2, 1), int))
    with pytest.raises(ValueError, match="float32 device array"):
        noise.fill_gaussian_device(np.zeros((2, 3, 4), np.float32), 0, np.zeros((2, 1), int))


def test_noise_does_not_depend_on_the_number_of_threads():
    import numba
    keys = np.column_stack([np.ones(16, int), np.arange(16)])
    x = np.zeros((16, 30, 7), dtype=np.float32)
    y = np.zeros_like(x)
    noise.fill_gaussian(x, 2, keys)
    before = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        noise.fill_gaussian(y, 2, keys)
    finally:
        numba.set_num_threads(before)
    assert np.array_equal(x, y)

"""The noise generator: SplitMix64 reference values, the ziggurat's tables, the compiled fill
against its own Python source, the N(0, 1) distribution, and reproducibility from keys."""
import math

import numpy as np
import pytest
from scipy import stats

from nprnn import noise
from nprnn.datasets import splitmix64


def test_splitmix64_words_match_the_plain_integer_version():
    s, t = 0, 0
    for _ in range(5):
        s, w = noise._next(np.uint64(s))            # the compiled step, on uint64
        t, z = splitmix64(t)                        # datasets' version, on Python ints
        assert (int(s), int(w)) == (t, z)
    assert int(noise._next(np.uint64(0))[1]) == 0xE220A8397B1DCDAF    # Vigna's reference value


def test_ziggurat_tables_close_and_have_equal_areas():
    x, k, fx = noise.ziggurat_tables()
    N, r, v = noise.ZIGGURAT_LAYERS, noise.ZIGGURAT_R, noise.ZIGGURAT_V
    assert x[1] == r and x[N] == 0 and np.all(np.diff(x[1:]) < 0)
    # the top layer reaches f(0) = 1: r and v are consistent
    assert abs(math.exp(-0.5 * x[N - 1] ** 2) + v / x[N - 1] - 1) < 1e-9
    areas = x[1:N] * (fx[2:N + 1] - fx[1:N])                  # layers 1 .. N-1: boxes
    assert np.allclose(areas, v, rtol=1e-9)
    tail = math.sqrt(math.pi / 2) * math.erfc(r / math.sqrt(2))  # integral of f beyond r
    assert abs(r * fx[1] + tail - v) < 1e-9                    # layer 0: box + tail
    assert np.all((0 <= k) & (k < 1)) and k[N - 1] == 0


def test_compiled_fill_equals_its_python_source(monkeypatch):
    keys = np.array([[3, 1], [3, 2]], dtype=np.uint64)
    starts = noise.stream_starts(keys)
    fast = np.zeros((2, 5, 2500), dtype=np.float32)    # 20,000 draws
    slow = fast.copy()
    noise.gaussian_fill(fast, 1, starts, noise.ZIG_X, noise.ZIG_K, noise.ZIG_F)
    # the same source run by the Python interpreter, helpers included; count the rare paths
    for name in ("_mix", "_next", "_uniform_open"):
        monkeypatch.setattr(noise, name, getattr(noise, name).py_func)
    visits, slow_path = [], noise._gaussian_slow.py_func

    def counting_slow(s, i, *args):
        visits.append(i)
        return slow_path(s, i, *args)
    monkeypatch.setattr(noise, "_gaussian_slow", counting_slow)
    with np.errstate(over="ignore"):                   # uint64 wrap-around is the algorithm
        starts_py = noise.stream_starts.py_func(keys)
        noise.gaussian_fill.py_func(slow, 1, starts_py, noise.ZIG_X, noise.ZIG_K, noise.ZIG_F)
    assert np.array_equal(starts, starts_py)
    assert np.array_equal(fast, slow) and np.all(fast[:, 0] == 0)
    assert 0 in visits and len(set(visits)) > 50       # the tail and many wedges were taken
    assert np.sum(np.abs(fast) > noise.ZIGGURAT_R) > 0  # and the tail produced values beyond r


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
    # the tail beyond r (drawn by its own method) has the right mass
    beyond = np.mean(np.abs(z) > noise.ZIGGURAT_R)
    expected = 2 * stats.norm.sf(noise.ZIGGURAT_R)
    assert abs(beyond - expected) < 5 * math.sqrt(expected / z.size)


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
    with pytest.raises(ValueError, match="t0 must lie in"):
        noise.fill_gaussian(np.zeros((2, 3, 4), np.float32), 4, np.zeros((2, 1), int))


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

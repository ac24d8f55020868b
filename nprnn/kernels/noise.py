"""N(0, 1) noise kernels for the noise-padded tasks: the CPU twin above the GPU twin.

Every example's noise is its own stream of 64-bit words, and the stream is *counter-based*: word j
of the stream that starts at s_0 is

    w_j = mix(s_0 + (j + 1) gamma)        (mod 2^64)

with SplitMix64's constant gamma = 0x9E3779B97F4A7C15 and output function mix (Steele, Lea &
Flood 2014). These are exactly the words a sequential SplitMix64 generator seeded with s_0 gives,
but any word can be computed on its own, so the CPU loop vectorises and the GPU's threads share
out the words in any order. Word j becomes the pair of outputs 2j and 2j + 1 of the example's
noise, by the Box-Muller transform (Box & Muller 1958):

    a = w_j mod 2^32                 u = 1 - a 2^-32  in (0, 1]       R = sqrt(-2 ln u)
    k = bits 0-29 of w_j >> 32       alpha = k (pi/2) 2^-30  in [0, pi/2)
    z_{2j}   = +-R cos(alpha)        sign from bit 31 of w_j >> 32
    z_{2j+1} = +-R sin(alpha)        sign from bit 30

An angle uniform on [0, pi/2) with two independent signs is an angle uniform on the whole circle,
so (z_{2j}, z_{2j+1}) are two independent N(0, 1) draws; |z| <= sqrt(64 ln 2) = 6.66 (u >= 2^-32),
which cuts off a tail of probability 3e-11.

Why not libm's log and cos: a call to logf or cosf stops LLVM from vectorising the loop (the
earlier ziggurat generator, a table lookup per draw, could not vectorise either). The
transcendental functions below are written as float32 multiply-adds, one division and one square
root, so the CPU loop runs in AVX-512 vectors (8 words at a time) and CPU and GPU share the same
scalar code:

  ln u    The integer input is rounded to float32 once, as d = 1 - u = a 2^-32 when u >= 1/2
          (so that ln u ~ -d keeps its relative precision near u = 1), else as 2^32 - a = u 2^32.
          Halving by powers of two (exact) gives u = m 2^e with f = m - 1 in
          [sqrt(1/2) - 1, sqrt(2) - 1], and ln u = e ln 2 + ln(1 + f) with
          ln(1 + f) = 2 atanh(s) = 2 s (1 + s^2/3 + ... + s^8/9),  s = f / (2 + f),  |s| <= 0.172
          (truncation error < 2e-9).
  cos, sin  Taylor polynomials on [0, pi/4] (truncation error < 4e-8 relative); an angle in
          [pi/4, pi/2) is folded to beta = pi/2 - alpha, computed exactly from the integer k, and
          cos / sin swap.

The result is within a few float32 units in the last place of the exact transform of the same
bits (`tests/test_noise.py` compares with float64 NumPy) on the CPU and the GPU alike; the two
devices may differ in the last bits, since the GPU contracts multiply-adds into FMAs.
"""
import math

import numba
import numpy as np

from .common import njit, njit_inline, njit_parallel
from .gpu_common import cdiv, cuda, line_launch

# SplitMix64
GAMMA = np.uint64(0x9E3779B97F4A7C15)
_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
_S27, _S30, _S31, _S32 = np.uint64(27), np.uint64(30), np.uint64(31), np.uint64(32)
_ONE64, _LOW32 = np.uint64(1), np.uint64(0xFFFFFFFF)
_ANGLE_BITS = np.uint64((1 << 30) - 1)
_FOLD_BIT = np.int64(1 << 29)
_TWO32 = np.int64(1 << 32)

# float32 constants: a Python float literal would turn the float32 arithmetic into float64
_F = np.float32
_0, _1, _2, _HALF = _F(0), _F(1), _F(2), _F(0.5)
_2M32 = _F(2.0 ** -32)
_LN2 = _F(math.log(2.0))
_SQRT2 = _F(math.sqrt(2.0))
_NEAR_FOLD = _F(1 - math.sqrt(0.5))            # u = 1 - d < sqrt(1/2)  <=>  d > 1 - sqrt(1/2)
_ANGLE_STEP = _F(0.5 * math.pi / 2 ** 30)      # pi/2 over 2^30 angles
# ln(1 + f) = 2 s (1 + s^2 / 3 + s^4 / 5 + s^6 / 7 + s^8 / 9)
_L3, _L5, _L7, _L9 = _F(1 / 3), _F(1 / 5), _F(1 / 7), _F(1 / 9)
# cos x = 1 + sum_k (-1)^k x^2k / (2k)!,  sin x = x (1 + sum_k (-1)^k x^2k / (2k + 1)!),  k = 1..5
_C1, _C2, _C3, _C4, _C5 = (_F((-1) ** k / math.factorial(2 * k)) for k in range(1, 6))
_S1, _S2, _S3, _S4, _S5 = (_F((-1) ** k / math.factorial(2 * k + 1)) for k in range(1, 6))
# powers of two for the exponent of an integer in [1, 2^31]
_P16, _P8, _P4, _P2, _P1 = _F(2.0 ** 16), _F(2.0 ** 8), _F(2.0 ** 4), _F(2.0 ** 2), _F(2.0)
_Q16, _Q8, _Q4, _Q2, _Q1 = _F(2.0 ** -16), _F(2.0 ** -8), _F(2.0 ** -4), _F(2.0 ** -2), _F(0.5)
_E16, _E8, _E4, _E2, _E1, _E32 = _F(16), _F(8), _F(4), _F(2), _F(1), _F(32)


# ------------------------------------------------------------------------------------------
# Scalar math shared by the twins
# ------------------------------------------------------------------------------------------

@njit_inline
def mix(z):
    """SplitMix64's output function, a bijection of 64-bit words."""
    z = (z ^ (z >> _S30)) * _M1
    z = (z ^ (z >> _S27)) * _M2
    return z ^ (z >> _S31)


@njit_inline
def stream_word(s0, j):
    """Word j >= 0 of the stream that starts at s0: mix(s0 + (j + 1) gamma)."""
    return mix(s0 + np.uint64(j + 1) * GAMMA)


@njit_inline
def log1p_small(f):
    """ln(1 + f) for float32 f in [sqrt(1/2) - 1, sqrt(2) - 1]: 2 atanh(f / (2 + f))."""
    s = f / (_2 + f)
    z = s * s
    return _2 * s * (_1 + z * (_L3 + z * (_L5 + z * (_L7 + z * _L9))))


@njit_inline
def _scale_down(c, e, power, inverse, bits):
    """(c / 2^bits, e + bits) if c >= power = 2^bits, else (c, e): one step of finding the binary
    exponent of c without a branch (exact: a multiplication by a power of two)."""
    big = c >= power
    return (c * inverse if big else c), (e + bits if big else e)


@njit_inline
def log_u(a):
    """ln(1 - a 2^-32) in float32 for an integer 0 <= a < 2^32 (int64).

    u >= 1/2: d = a 2^-32 (rounded once), and ln u = ln(1 - d) = e ln 2 + ln(1 + f) with
              f = -d (e = 0) or, for u < sqrt(1/2), f = 1 - 2 d (e = -1), both exact given d.
    u < 1/2:  c = 2^32 - a (an integer, rounded once to float32) = m 2^e with m in [1, 2) by
              halving (exact); f = m - 1 or m / 2 - 1 (exact), and ln u = (e - 32) ln 2 + ln(1 + f).
    Both are computed and one is selected, so the function has no branch."""
    d = _F(a) * _2M32
    folded = d > _NEAR_FOLD
    f_near = _1 - _2 * d if folded else -d
    e_near = -_1 if folded else _0
    c, e = _scale_down(_F(_TWO32 - a), _0, _P16, _Q16, _E16)      # c in [1, 2^31] ...
    c, e = _scale_down(c, e, _P8, _Q8, _E8)
    c, e = _scale_down(c, e, _P4, _Q4, _E4)
    c, e = _scale_down(c, e, _P2, _Q2, _E2)
    c, e = _scale_down(c, e, _P1, _Q1, _E1)                        # ... -> c in [1, 2)
    big = c > _SQRT2
    f_far = c * _HALF - _1 if big else c - _1
    e_far = e + _1 - _E32 if big else e - _E32
    near = d <= _HALF
    f = f_near if near else f_far
    e = e_near if near else e_far
    return e * _LN2 + log1p_small(f)


@njit_inline
def sin_cos_quarter(x):
    """(sin x, cos x) in float32 for 0 <= x <= pi/4."""
    z = x * x
    s = x * (_1 + z * (_S1 + z * (_S2 + z * (_S3 + z * (_S4 + z * _S5)))))
    c = _1 + z * (_C1 + z * (_C2 + z * (_C3 + z * (_C4 + z * _C5))))
    return s, c


@njit_inline
def gaussian_pair(w):
    """Two independent N(0, 1) float32 draws from one 64-bit word w (the module docstring)."""
    a = np.int64(w & _LOW32)
    h = w >> _S32
    R = math.sqrt(max(_F(-2) * log_u(a), _0))
    k = np.int64(h & _ANGLE_BITS)
    folded = k >= _FOLD_BIT                       # alpha >= pi/4: use beta = pi/2 - alpha
    kk = np.int64(2) * _FOLD_BIT - k if folded else k
    s, c = sin_cos_quarter(_F(kk) * _ANGLE_STEP)
    cos_a = s if folded else c
    sin_a = c if folded else s
    sign0 = _1 - _2 * _F(np.int64((h >> _S31) & _ONE64))
    sign1 = _1 - _2 * _F(np.int64((h >> _S30) & _ONE64))
    return sign0 * R * cos_a, sign1 * R * sin_a


# ------------------------------------------------------------------------------------------
# CPU twin
# ------------------------------------------------------------------------------------------

@njit
def gaussian_row_cpu(out, s0):
    """out[i] = noise value i of the stream starting at s0, for i < len(out). out (L,) float32."""
    L = out.shape[0]
    for j in range(L // 2):
        z0, z1 = gaussian_pair(stream_word(s0, j))
        out[2 * j] = z0
        out[2 * j + 1] = z1
    if L % 2:
        out[L - 1] = gaussian_pair(stream_word(s0, L // 2))[0]


@njit_parallel
def gaussian_fill_cpu(x, t0, starts):
    """x[b, t0:, :] = the noise of the stream starting at starts[b], in row-major order, for every
    b. x (B, T, m) float32 C-contiguous, starts (B,) uint64. The examples are split over the CPU
    threads; each has its own stream, so the result does not depend on the number of threads."""
    B, T, m = x.shape
    for b in numba.prange(B):
        gaussian_row_cpu(x[b].reshape(T * m)[t0 * m:], starts[b])


# ------------------------------------------------------------------------------------------
# GPU twin
# ------------------------------------------------------------------------------------------

@cuda.jit(cache=True)
def gaussian_fill_kernel(x, t0, starts):
    """Word j of example b's stream gives its noise values 2j and 2j + 1: x[b, t0:, :] in
    row-major order, as gaussian_fill_cpu. x (B, T, m) float32, starts (B,) uint64. The (b, j)
    in row-major order, in a grid-stride loop over a 1-d grid (line_launch)."""
    B, T, m = x.shape
    L = (T - t0) * m
    pairs = (L + 1) // 2
    for e in range(cuda.grid(1), B * pairs, cuda.gridsize(1)):
        b, j = e // pairs, e % pairs
        # (np.uint64 around the word: the CUDA simulator hands it over as a Python int)
        z0, z1 = gaussian_pair(np.uint64(stream_word(np.uint64(starts[b]), j)))
        i = t0 * m + 2 * j
        x[b, i // m, i % m] = z0
        if 2 * j + 1 < L:
            x[b, (i + 1) // m, (i + 1) % m] = z1


def gaussian_fill_gpu(x, t0, starts, *, threads=256):
    """The launch of gaussian_fill_kernel: (row, pair of values) over `threads`-thread blocks."""
    B, T, m = x.shape
    gaussian_fill_kernel[line_launch(B * cdiv((T - t0) * m, 2), threads)](x, t0, starts)

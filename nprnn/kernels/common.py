"""Scalar math shared by the CPU (`@numba.njit`) and GPU (`@numba.cuda.jit`) twins.

Each function of the first part works on one scalar. It is compiled with `numba.njit`, and
numba-cuda can call such a function from inside a `@cuda.jit` kernel as well, so the math exists
exactly once and the twins differ only in how they split the work. Those whose float32 and
float64 versions differ (`tanh`, `sigmoid`, `dtanh_from_y`, `dsigmoid_from_y`, `flush_subnormal`)
are plain Python functions with a numba `@overload` below each: called from Python they run the
body shown, while inside `@njit` and `@cuda.jit` code numba replaces each call with what the
overload returns for the argument's type. That is where float32 and float64 part. The
floating-point mode switches (flush_denormals) and, in the second part, the row-splitting helpers
that the CPU twins share (row_slice, matmul_tn_rows, ...) work on arrays.

Derivatives are written in terms of the *output* of the nonlinearity, because that is what the
forward pass stores for BPTT:

    y = tanh(a)     =>  dy/da = 1 - y**2
    y = sigmoid(a)  =>  dy/da = y * (1 - y)

Why `tanh` is not simply `math.tanh` on the CPU
-----------------------------------------------
A forward pass at B=128, n=128, T=784 evaluates tanh 12.8 million times. libm's tanhf is a
function call that LLVM cannot vectorise (~13 ns each here: 160 ms, six times the cost of all the
pass's matrix products). For float32 we therefore use a rational function that is pure
multiply-add, which LLVM turns into AVX code: Lambert's continued fraction

    tanh a = a / (1 + a^2 / (3 + a^2 / (5 + ... + a^2 / 25)))

multiplied out into tanh a ~ a P(a^2) / Q(a^2) with the integer coefficients below, for |a| <= 9
(beyond, tanh a is within 1 ulp of +-1 in float32). Its largest relative error in float32 is
below 5e-7, a few units in the last place (`tests/test_common.py` measures it). float64 — the
precision of the gradient checks — keeps the exact `math.tanh`, so float64 kernels agree with the
reference to rounding.
"""
import math
import platform
from typing import Callable, NamedTuple

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic, overload

# One decorator for all kernels of the project: compiled once per machine and cached on disk
# (numba writes the cache into __pycache__ beside the source), so later runs start in seconds.
njit = numba.njit(cache=True, error_model="numpy")
# The same for kernels that split their work over CPU threads with numba.prange.
njit_parallel = numba.njit(cache=True, error_model="numpy", parallel=True)
# Scalar helpers that must be inlined into their callers' loops for those to vectorise (numba
# inlines them in its own IR, before LLVM decides).
njit_inline = numba.njit(cache=True, error_model="numpy", inline="always")

# tanh a ~ a P(a^2) / Q(a^2): the continued fraction above, lowest power first
TANH_P = (7905853580625, 1159525191825, 41247931725, 523783260, 2552550, 4095, 1)
TANH_Q = (7905853580625, 3794809718700, 252070693875, 5237832600, 41351310, 120120, 91)
TANH_CLAMP = 9.0
_P = tuple(np.float32(c / TANH_P[0]) for c in TANH_P)
_Q = tuple(np.float32(c / TANH_Q[0]) for c in TANH_Q)
_CLAMP32 = np.float32(TANH_CLAMP)
_ONE32 = np.float32(1.0)
_HALF32 = np.float32(0.5)


@njit
def tanh_rational32(a):
    """float32 tanh by the rational function above: branch-free, so loops over it vectorise.

    The clamps are comparisons (selects, no branches), not min/max: on the GPU numba-cuda turns
    min/max into fminf/fmaxf, which return the other operand for a NaN, so tanh(NaN) was -1 there
    and a NaN state passed as a finite one. A comparison with NaN is false and the NaN goes on."""
    a = _CLAMP32 if a > _CLAMP32 else (-_CLAMP32 if a < -_CLAMP32 else a)
    y = a * a
    p = _P[0] + y * (_P[1] + y * (_P[2] + y * (_P[3] + y * (_P[4] + y * (_P[5] + y * _P[6])))))
    q = _Q[0] + y * (_Q[1] + y * (_Q[2] + y * (_Q[3] + y * (_Q[4] + y * (_Q[5] + y * _Q[6])))))
    r = a * p / q
    return _ONE32 if r > _ONE32 else (-_ONE32 if r < -_ONE32 else r)


def tanh(a):
    """tanh(a): the rational form for float32, math.tanh otherwise (chosen at compile time)."""
    return math.tanh(a)


@overload(tanh)
def _tanh_by_precision(a):
    if isinstance(a, types.Float) and a.bitwidth == 32:
        return lambda a: tanh_rational32(a)
    return lambda a: math.tanh(a)


def _sigmoid64(a):
    """1 / (1 + exp(-a)), written so that neither branch overflows."""
    if a >= 0:
        return 1.0 / (1.0 + math.exp(-a))
    e = math.exp(a)
    return e / (1.0 + e)


def sigmoid(a):
    """sigma(a) = 1 / (1 + exp(-a)); float32 goes through tanh: sigma(a) = (1 + tanh(a/2)) / 2,
    within 3e-7 absolute of the exact value but not relative: 1 + tanh(a/2) is a difference of
    numbers near 1, so sigma(-10) = 4.55e-5 is off by 0.2% and from a = -18 on it is 0
    (tests/test_common.py)."""
    return _sigmoid64(a)


@overload(sigmoid)
def _sigmoid_by_precision(a):
    if isinstance(a, types.Float) and a.bitwidth == 32:
        return lambda a: _HALF32 + _HALF32 * tanh_rational32(_HALF32 * a)
    return _sigmoid64


_TINY32 = np.finfo(np.float32).tiny        # the smallest normal float32, 1.18e-38


def flush_subnormal(g):
    """g, or 0 where g is a float32 subnormal (|g| < 1.18e-38); float64 passes through.

    Gradients that die away over hundreds of steps (the LSTM's dL/dc_t, multiplied by f_t < 1 at
    every step) reach the subnormal range in float32, where each multiply-add costs ~100 cycles:
    in the B=128, T=784 LSTM backward pass 14% of the entries were subnormal and the products
    ran 3x slower. Such a gradient is 1e-38 of its start; dropping it to 0 changes nothing."""
    return g


@overload(flush_subnormal)
def _flush_by_precision(g):
    if isinstance(g, types.Float) and g.bitwidth == 32:
        # g * 0 rather than 0.0: the result keeps g's sign and stays float32
        return lambda g: g if abs(g) >= _TINY32 else g * np.float32(0.0)
    return lambda g: g


def dtanh_from_y(y):
    """d tanh(a) / da, given y = tanh(a): 1 - y**2, in y's precision."""
    return 1.0 - y * y


def dsigmoid_from_y(y):
    """d sigma(a) / da, given y = sigma(a): y (1 - y), in y's precision."""
    return y * (1.0 - y)


# A float literal such as 1.0 is a float64 to numba, so `1.0 - y*y` would turn every float32
# backward loop into float64 arithmetic (half the vector width on the CPU, double-precision
# units on the GPU). The overloads keep float32 in float32.
@overload(dtanh_from_y)
def _dtanh_by_precision(y):
    if isinstance(y, types.Float) and y.bitwidth == 32:
        return lambda y: _ONE32 - y * y
    return lambda y: 1.0 - y * y


@overload(dsigmoid_from_y)
def _dsigmoid_by_precision(y):
    if isinstance(y, types.Float) and y.bitwidth == 32:
        return lambda y: y * (_ONE32 - y)
    return lambda y: y * (1.0 - y)


# Subnormal *results* inside a product are the other half of the problem: once a BPTT gradient has
# decayed to ~1e-37, a BLAS product of such normal numbers yields subnormals, each again ~100
# cycles. In the GRU backward pass at B=128, T=784 a step's product in that range took up to 6 ms
# instead of 0.1 ms, and a few dozen steps are in it. x86 CPUs can round subnormal results to
# zero and read subnormal inputs as zero in hardware (the FTZ and DAZ bits of the MXCSR register),
# which is what PyTorch's `torch.set_flush_denormal(True)` turns on. The float32 BPTT kernels turn
# it on for their own threads, for the duration of their work, and then put the register back:
#
#     mode = flush_denormals(like)     # like: a float32 array; float64 leaves the mode as it is
#     ...                              # the step loop, BLAS calls included (single-threaded BLAS
#     restore_fp_mode(mode)            # runs on the calling thread)
#
# The register belongs to each thread, so this happens inside each prange body. On other CPUs
# these do nothing and `flush_subnormal` alone remains. Whether a value is flushed changes it by
# less than 1.2e-38, so results agree with the float64 oracle as before.

MXCSR_FTZ_DAZ = 0x8040          # bit 15 flush-to-zero, bit 6 denormals-are-zero
_X86 = platform.machine().lower() in ("x86_64", "amd64")
_I8P = ir.IntType(8).as_pointer()


def _mxcsr_intrinsic(builder, name, slot):
    fn = cgutils.get_or_insert_function(builder.module,
                                        ir.FunctionType(ir.VoidType(), [_I8P]), name)
    builder.call(fn, [builder.bitcast(slot, _I8P)])


@intrinsic
def _read_mxcsr(typingctx):
    def codegen(context, builder, sig, args):
        slot = cgutils.alloca_once(builder, ir.IntType(32))
        _mxcsr_intrinsic(builder, "llvm.x86.sse.stmxcsr", slot)
        return builder.zext(builder.load(slot), ir.IntType(64))
    return types.int64(), codegen


@intrinsic
def _write_mxcsr(typingctx, value):
    def codegen(context, builder, sig, args):
        slot = cgutils.alloca_once(builder, ir.IntType(32))
        builder.store(builder.trunc(args[0], ir.IntType(32)), slot)
        _mxcsr_intrinsic(builder, "llvm.x86.sse.ldmxcsr", slot)
        return context.get_dummy_value()
    return types.none(types.int64), codegen


def flush_denormals(like):
    """Make this thread flush float32 subnormals to zero if `like` is a float32 array (x86 only);
    returns the previous mode for `restore_fp_mode`, or -1 when nothing was changed."""
    return -1


@overload(flush_denormals)
def _flush_denormals(like):
    if _X86 and isinstance(like, types.Array) and like.dtype == types.float32:
        def on(like):
            mode = _read_mxcsr()
            _write_mxcsr(mode | MXCSR_FTZ_DAZ)
            return mode
        return on
    return lambda like: -1


def restore_fp_mode(mode):
    """Undo `flush_denormals`: put back the mode it returned."""


@overload(restore_fp_mode)
def _restore_fp_mode(mode):
    if _X86:
        def restore(mode):
            if mode >= 0:
                _write_mxcsr(mode)
        return restore
    return lambda mode: None


# ---------------------------------------------------------------------------------------------
# CPU work split: threads own slices of rows; BLAS runs single-threaded inside each slice
# ---------------------------------------------------------------------------------------------
#
# A recurrent step at B=128, n=128 is a 128 x 128 x 128 matrix product: ~30 microseconds. If BLAS
# splits each such product over its own threads, they meet once per step, T times per pass, and on
# a busy 2-core machine that meeting costs more than the product (we measured a pass 6x slower).
# So the CPU kernels split the *batch* instead: each numba thread owns a slice of the batch rows
# for all T steps (the CPU analogue of the persistent GPU kernel), and the BLAS calls inside run
# on one thread (`one_blas_thread`). Large products over all steps are split by rows the same way.
# Every CPU kernel runs so (backends.CPU), the readout's too: after a product large enough for
# OpenBLAS to use its own threads, they spin-wait for the next one, and on 2 cores they took the
# cores from the BPTT that followed (a readout at every step made it 2x slower; docs/speed.md).

_blas = None


def one_blas_thread():
    """Context manager: BLAS on one thread while our own threads split the work."""
    global _blas
    if _blas is None:
        # numba's np.dot calls the BLAS that scipy ships, loaded on first use; a controller made
        # before it is loaded would not know it, and leave it on all cores
        import scipy.linalg.cython_blas  # noqa: F401
        from threadpoolctl import ThreadpoolController
        _blas = ThreadpoolController()
    return _blas.limit(limits=1, user_api="blas")


@njit
def row_slice(c, num_slices, rows):
    """Rows [r0, r1) of slice c when `rows` rows are split into `num_slices` near-equal slices."""
    return c * rows // num_slices, (c + 1) * rows // num_slices


# How many rows a thread's slice holds. Fixed, rather than derived from the number of threads, so
# that our sums are taken in the same order whatever the core count: results do not depend on it
# (a run resumed with other NUMBA_NUM_THREADS is bit-identical to an uninterrupted one; another
# CPU model may still change the bits, through the code paths BLAS and LLVM pick for it).
SLICE_ROWS = 64
# Rows of one partial product in matmul_tn_rows, matmul_nt_rows, sum_rows and the peephole sums:
# large enough that each product runs at BLAS speed, small enough that T*B = 100,352 rows make
# ~25 slices to share among threads. Fixed for the reason above.
BLOCK_ROWS = 4096


@njit
def num_slices(rows, slice_rows=SLICE_ROWS):
    return max(1, (rows + slice_rows - 1) // slice_rows)


@njit_parallel
def matmul_nt_rows(out, X, V):
    """out = X V^T, rows split across threads. X (R, m), V (n, m), out (R, n) written (=)."""
    S = num_slices(X.shape[0], BLOCK_ROWS)
    for c in numba.prange(S):
        r0, r1 = row_slice(c, S, X.shape[0])
        np.dot(X[r0:r1], V.T, out[r0:r1])


@njit_parallel
def matmul_nn_rows(out, X, W, accumulate):
    """out (+)= X W, rows split across threads. X (R, p), W (p, q), out (R, q) written (=), or
    added to (+=) when `accumulate`."""
    S = num_slices(X.shape[0], BLOCK_ROWS)
    for c in numba.prange(S):
        r0, r1 = row_slice(c, S, X.shape[0])
        if accumulate:
            out[r0:r1] += np.dot(X[r0:r1], W)
        else:
            np.dot(X[r0:r1], W, out[r0:r1])


@njit_parallel
def matmul_tn_rows(out, D, H):
    """out = D^T H = sum_r D[r]^T H[r] over the rows of two tall matrices, the rows split across
    threads and the partial sums added in a fixed order. D (R, p), H (R, q), out (p, q) (=)."""
    S = num_slices(D.shape[0], BLOCK_ROWS)
    partial = np.empty((S, D.shape[1], H.shape[1]), dtype=out.dtype)
    for c in numba.prange(S):
        r0, r1 = row_slice(c, S, D.shape[0])
        mode = flush_denormals(partial)
        np.dot(D[r0:r1].T, H[r0:r1], partial[c])
        restore_fp_mode(mode)
    out[:, :] = partial[0]
    for c in range(1, S):
        out += partial[c]


@njit_parallel
def sum_rows(out, D):
    """out = sum_r D[r]. D (R, p), out (p,) written (=)."""
    S = num_slices(D.shape[0], BLOCK_ROWS)
    partial = np.zeros((S, D.shape[1]), dtype=out.dtype)
    for c in numba.prange(S):
        r0, r1 = row_slice(c, S, D.shape[0])
        for r in range(r0, r1):
            partial[c] += D[r]
    out[:] = partial[0]
    for c in range(1, S):
        out += partial[c]


# ----------------------------------------------------------------------------------------------
# Sequences: lengths, and gradients entering at every step (the CPU twins of every cell)
# ----------------------------------------------------------------------------------------------
# Every pass takes `lengths` (B,), each in [1, T]: row b's state stops changing after its step
# lengths[b] (h_t = h_{t-1} from there on, so that h_T is the state at the row's own end). Every
# BPTT also takes `dhs` (T, B, n): dL/dh_t from outside the recurrence (a readout at every step,
# the layer above), dhs[t] for the state that step t writes, hs[t + 1]; or an empty (0, B, n) where
# dL/dh_T is the only gradient. Past a row's end the step was the identity: its pre-activation
# gradients are 0 and dL/dh_{t-1} = dL/dh_t.

@njit_inline
def hold_state(hs, kept, t, b):
    """Step t of row b past its end (t >= lengths[b]): h_t = h_{t-1}, that is hs[t + 1, b] =
    hs[t, b], and the activations the step keeps for BPTT, kept[t, b], are 0."""
    hs[t + 1, b] = hs[t, b]
    kept[t, b] = 0.0


@njit_inline
def add_upstream(dh, dhs, da, t, b, b0, lengths):
    """BPTT's step t for row b, before the unit's derivative: dh[b - b0], which holds dL/dh_t from
    the later steps, gets dhs[t, b] (when dhs has steps). Returns whether step t is past the
    row's end, having then written da[t, b] = 0 (dh passes on unchanged)."""
    if dhs.shape[0] > 0:
        for i in range(dh.shape[1]):            # a loop: a row's += would allocate each step
            dh[b - b0, i] += dhs[t, b, i]
    if t >= lengths[b]:
        da[t, b] = 0.0
        return True
    return False


# ----------------------------------------------------------------------------------------------
# Twins: how a backend (nprnn/core/backends.py) finds a kernel's two versions
# ----------------------------------------------------------------------------------------------

class Twins(NamedTuple):
    """A kernel's twins, with identical positional arguments: the `cpu` function (@njit) and the
    GPU host functions, `gpu` (for a cell's pass: one launch per step), `gpu_persistent` (one
    launch per pass, where there is one) and `gpu_split` (one launch per pass, several lanes per
    unit, where there is one). `gpu_options(launch)` gives the GPU function's keyword launch
    settings from a backends.Launch (a cell's passes take theirs from the backend)."""
    cpu: Callable
    gpu: Callable
    gpu_persistent: Callable = None
    gpu_options: Callable = None
    gpu_split: Callable = None

"""The vanilla (Elman) RNN baseline: forward pass and BPTT kernels.

    h_t = tanh(W_ih x_t + b_ih + W_hh h_{t-1} + b_hh)

Parameters are PyTorch's single-layer nn.RNN (nonlinearity tanh), names and layouts included:
W_ih = weight_ih (n, m), W_hh = weight_hh (n, n), b_ih = bias_ih (n,), b_hh = bias_hh (n,).
Both biases are kept, as PyTorch keeps them, so weights can be exchanged; they always receive the
same gradient.

Shapes: B batch, T time, m input size, n hidden size. Kernels are time-major: x is (T, B, m) and
hs is (T+1, B, n) with hs[0] = h_0 given by the caller (zero in the models).

How the CPU work is split (the recipe of `antisym.py`, on threads that own batch rows):
  1. one (T*B, m) @ (m, n) product for the input projections W_ih x_t of all T steps;
  2. one thread per slice of batch rows runs all T steps of its slice: per step one
     (B_slice, n) @ (n, n) product with W_hh^T, then one fused elementwise pass;
  3. in BPTT, the same slices run the reverse time loop with one (B_slice, n) @ (n, n) product
     per step, and the weight gradients are products over all stored steps, split by rows:
     dW_hh = DA^T H with DA, H reshaped to (T*B, n).
The caller holds BLAS to one thread (`common.one_blas_thread`) while these kernels run.
"""
import numpy as np
from numba import prange

from .common import (Twins, add_upstream, dtanh_from_y, flush_denormals, flush_subnormal,
                     matmul_nt_rows, matmul_tn_rows, njit_parallel, num_slices, restore_fp_mode,
                     row_slice, sum_rows, tanh)
from .gpu_common import (TILE, cuda, rows_times_matrix_gpu, stacked_param_grads_gpu, step_grid,
                         transposed, upstream)


@njit_parallel
def rnn_forward_cpu(hs, x, W_ih, W_hh, b_ih, b_hh, lengths):
    """Forward pass over a whole sequence.

    Written (=):  hs[1:] of (T+1, B, n), h_1 .. h_T (h_t = tanh(a_t) is all BPTT needs).
    Read:         hs[0] (B, n) = h_0; x (T, B, m); W_ih (n, m); W_hh (n, n); b_ih, b_hh (n,);
                  lengths (B,) in [1, T]: past row b's end the state holds (common.py,
                  "Sequences").
    Work split:   one thread per slice of batch rows, each running all T steps.
    """
    T, B, m = x.shape
    n = W_hh.shape[0]
    # 1. input projections of all steps at once; hs[t+1] holds W_ih x_t until step t overwrites it
    matmul_nt_rows(hs[1:].reshape(T * B, n), x.reshape(T * B, m), W_ih)
    S = num_slices(B)
    for c in prange(S):
        b0, b1 = row_slice(c, S, B)
        Wh = np.empty((b1 - b0, n), dtype=hs.dtype)
        for t in range(T):
            # 2. recurrence: row b of Wh is W_hh h_{t-1}[b]
            np.dot(hs[t, b0:b1], W_hh.T, Wh)
            for b in range(b0, b1):
                if t >= lengths[b]:                      # past the row's end: h_t = h_{t-1}
                    hs[t + 1, b] = hs[t, b]
                    continue
                for j in range(n):
                    # a_t = W_ih x_t + b_ih + W_hh h_{t-1} + b_hh;  h_t = tanh(a_t)
                    hs[t + 1, b, j] = tanh(hs[t + 1, b, j] + b_ih[j] + Wh[b - b0, j] + b_hh[j])


@njit_parallel
def rnn_backward_cpu(dW_ih, dW_hh, db_ih, db_hh, dh0, da, dh_T, hs, x, W_hh, dhs, lengths):
    """BPTT over the whole sequence.

    Written (=):  dW_ih (n, m); dW_hh (n, n); db_ih, db_hh (n,); dh0 (B, n) = dL/dh_0;
                  da (T, B, n) = dL/da_t (scratch, kept for the products at the end).
    Read:         dh_T (B, n) = dL/dh_T; hs (T+1, B, n) from the forward pass; x (T, B, m);
                  W_hh (n, n);
                  dhs (T, B, n) (or (0, B, n)) and lengths (B,): common.py, "Sequences".
    Work split:   one thread per slice of batch rows for the reverse time loop; the weight
                  gradients as products over all T*B rows, split by rows.
    """
    T, B, m = x.shape
    n = W_hh.shape[0]
    dh0[:, :] = dh_T              # the running dL/dh_t lives in dh0's buffer; it ends as dL/dh_0
    S = num_slices(B)
    for c in prange(S):
        b0, b1 = row_slice(c, S, B)
        mode = flush_denormals(dh0)      # float32: subnormals to zero (common.py)
        dh = dh0[b0:b1]
        dh_rec = np.empty((b1 - b0, n), dtype=dh0.dtype)  # the part of dh_{t-1} through W_hh
        for t in range(T - 1, -1, -1):
            for b in range(b0, b1):
                if add_upstream(dh, dhs, da, t, b, b0, lengths):
                    continue                    # past the row's end: dh passes on unchanged
                for j in range(n):
                    # forward was: h_t = tanh(a_t)
                    # so:          da_t = dh_t * (1 - h_t**2)   (a float32 subnormal set to 0,
                    #              for CPU speed only: common.flush_subnormal)
                    da[t, b, j] = flush_subnormal(dh[b - b0, j] * dtanh_from_y(hs[t + 1, b, j]))
                    dh[b - b0, j] = 0.0         # h_{t-1} reaches h_t only through W_hh
            # forward was: a_t = W_ih x_t + b_ih + W_hh h_{t-1} + b_hh; h_{t-1} goes nowhere else
            # so:          dh_{t-1} = da_t W_hh   (row form; added to the 0 left above)
            np.dot(da[t, b0:b1], W_hh, dh_rec)
            dh += dh_rec
        restore_fp_mode(mode)
    # 3. weight gradients over all steps at once
    da2 = da.reshape(T * B, n)
    matmul_tn_rows(dW_hh, da2, hs[:T].reshape(T * B, n))    # dW_hh = sum_t da_t^T h_{t-1}
    matmul_tn_rows(dW_ih, da2, x.reshape(T * B, m))         # dW_ih = sum_t da_t^T x_t
    sum_rows(db_ih, da2)                                    # db_ih = sum_t sum_b da_t
    db_hh[:] = db_ih                                        # b_hh enters a_t as b_ih does


# ------------------------------------------------------------------------------------------
# GPU twins (three versions, as for antisym; tests/gpu/test_gpu_baselines.py checks them)
# ------------------------------------------------------------------------------------------
#   version 1, "step"        one thread per (b, j), one launch per step (BPTT: two per step,
#                            the elementwise part and dh_{t-1} = da_t W_hh)
#   version 2, "persistent"  one launch per pass; block k owns batch rows [k R, (k+1) R) and keeps
#                            their h_{t-1} (forward) or dL/dh and da_t (BPTT) in shared memory.
#   version 3, "split"       one launch per pass, several lanes per unit, W_hh in registers
# Versions 2 and 3 are in kernels/fast/rnn.py.
# Shared memory per batch row, in vectors of n values: the forward pass keeps h_{t-1} and h_t
# (read one, write the other); BPTT keeps dL/dh and two copies of da_t.
FORWARD_VALUES = 2
BACKWARD_VALUES = 3
# W_hh (n, n) is 64 KiB at n = 128 in float32, more than a block's 48 KiB of shared memory, so the
# persistent kernels read it from global memory every step: all blocks read the same matrix, and
# it stays in the L2 cache. The forward pass reads W_hh^T (made once per call) so that for each
# k consecutive threads read consecutive addresses; BPTT reads W_hh itself, which already has
# that property. Host functions take the CPU twins' arguments (device arrays), then keyword-only
# launch options; the weight gradients are `stacked_param_grads_gpu` (gpu_common.py).

@cuda.jit(cache=True)
def rnn_forward_step_kernel(hs, x, W_ih, WT, b_ih, b_hh, t, lengths):
    """Step t: h_t = tanh(W_ih x_t + b_ih + W_hh h_{t-1} + b_hh) (h_t = h_{t-1} past row b's end).
    Written (=): hs[t+1] (B, n). Read: hs[t], x[t], W_ih (n, m), WT = W_hh^T (n, n), b_ih, b_hh
    (n,), lengths (B,). One thread per (b, j); 2-d grid over (j, b). W_hh is read transposed: for
    each k the threads of a warp read consecutive WT[k, j] (`gpu_common.transposed`)."""
    j, b = cuda.grid(2)
    B, n, m = hs.shape[1], hs.shape[2], x.shape[2]
    if b < B and j < n and t >= lengths[b]:
        hs[t + 1, b, j] = hs[t, b, j]
        return
    if b < B and j < n:
        a = b_ih[j] + b_hh[j]
        for k in range(m):
            a += W_ih[j, k] * x[t, b, k]
        for k in range(n):
            a += WT[k, j] * hs[t, b, k]                          # W_hh[j, k] h_{t-1}[b, k]
        hs[t + 1, b, j] = tanh(a)


@cuda.jit(cache=True)
def rnn_backward_unit_kernel(da, dh, hs, t, dhs, lengths):
    """The elementwise part of BPTT through step t.
    forward was: h_t = tanh(a_t)
    so:          da_t = dh_t * (1 - h_t**2)
    Written (=): da[t] (B, n). Updated: dh (B, n), dL/dh_t from the later steps (dhs[t] added:
    gpu_common.upstream) -> the part of dL/dh_{t-1} that skips W_hh: 0, or past row b's end
    (lengths) all of it, with da_t = 0. Read: hs[t+1]. One thread per (b, j)."""
    j, b = cuda.grid(2)
    B, n = dh.shape
    if b < B and j < n:
        g = upstream(dh, dhs, t, b, j)
        if t >= lengths[b]:
            da[t, b, j] = 0
            dh[b, j] = g
        else:
            da[t, b, j] = g * dtanh_from_y(hs[t + 1, b, j])
            dh[b, j] = 0


def rnn_forward_gpu(hs, x, W_ih, W_hh, b_ih, b_hh, lengths, *, block=(128, 1)):
    """Version 1 twin of rnn_forward_cpu: T launches of rnn_forward_step_kernel.
    Written (=): hs[1:]. Read: hs[0] = h_0, x, W_ih, W_hh, b_ih, b_hh."""
    T, B, _ = x.shape
    n = W_hh.shape[0]
    grid, block = step_grid(B, n, block)
    WT = transposed(W_hh, "rnn_WT")
    for t in range(T):
        rnn_forward_step_kernel[grid, block](hs, x, W_ih, WT, b_ih, b_hh, t, lengths)


def rnn_backward_gpu(dW_ih, dW_hh, db_ih, db_hh, dh0, da, dh_T, hs, x, W_hh, dhs, lengths, *,
                     block=(128, 1), tile=TILE):
    """Version 1 twin of rnn_backward_cpu: per step rnn_backward_unit_kernel, then
    dh_{t-1} += da_t W_hh (rows_times_matrix_gpu); then the weight gradients.
    Written (=): dW_ih, dW_hh, db_ih, db_hh, dh0, da. Read: dh_T, hs, x, W_hh."""
    T, B, _ = x.shape
    n = W_hh.shape[0]
    grid, block = step_grid(B, n, block)
    dh0.copy_to_device(dh_T)              # the running dL/dh_t lives in dh0; it ends as dL/dh_0
    for t in range(T - 1, -1, -1):
        rnn_backward_unit_kernel[grid, block](da, dh0, hs, t, dhs, lengths)
        rows_times_matrix_gpu(dh0, da, W_hh, t, True, block=block)
    stacked_param_grads_gpu(dW_ih, dW_hh, db_ih, db_hh, da, da, hs, x, tile=tile)


# the twins, as nprnn/core/backends.py runs them: the CPU kernels and GPU version 1 (versions 2 and 3,
# persistent and split, are in kernels/fast/rnn.py, whose twins add them)
rnn_forward = Twins(rnn_forward_cpu, rnn_forward_gpu)
rnn_backward = Twins(rnn_backward_cpu, rnn_backward_gpu)

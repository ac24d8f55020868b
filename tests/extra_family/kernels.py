"""The leaky tanh cell (not one of nprnn's): forward pass and BPTT kernels.

    y_t = tanh(W h_{t-1} + V_h x_t + b_h)
    h_t = h_{t-1} + alpha (y_t - h_{t-1})        (= (1 - alpha) h_{t-1} + alpha y_t)

with a fixed leak alpha in (0, 1] (alpha = 1 is the vanilla RNN). W (n, n), V_h (n, m), b_h (n,).

Shapes: B batch, T time, m input size, n hidden size. Kernels are time-major: x is (T, B, m),
hs is (T+1, B, n) with hs[0] = h_0 given by the caller, th (T, B, n) holds y_t for BPTT.
The CPU work is split as in nprnn/kernels/rnn.py: one product for the input projections of all
steps, one thread per slice of batch rows for the time loop, products over all stored steps for
the weight gradients. The GPU twins are version 1 only: one thread per (b, j), one launch per
step. alpha - h is written as such, never 1 - alpha: an integer literal would make float32
arithmetic float64.
"""
import numpy as np
from numba import prange

from nprnn.kernels.common import (Twins, add_upstream, dtanh_from_y, flush_denormals,
                                  flush_subnormal, hold_state, matmul_nt_rows, matmul_tn_rows,
                                  njit_parallel, num_slices, restore_fp_mode, row_slice, sum_rows,
                                  tanh)
from nprnn.kernels.gpu_common import (TILE, column_sums_gpu, cuda, hold_unit, matmul_tn_gpu,
                                      rows_times_matrix_gpu, step_grid, transposed, upstream)

# The kinds of the kernels' arguments that nprnn's kernels do not name (tests/test_ptx.py types
# every kernel argument by its name): the leak, a scalar of the model's dtype.
ARG_KINDS = {"alpha": "f"}


@njit_parallel
def leaky_forward_cpu(hs, th, x, W, V_h, b_h, alpha, lengths):
    """Forward pass over a whole sequence.

    Written (=):  hs[1:] of (T+1, B, n), h_1 .. h_T; th (T, B, n), y_1 .. y_T.
    Read:         hs[0] (B, n) = h_0; x (T, B, m); W (n, n); V_h (n, m); b_h (n,); alpha;
                  lengths (B,) (nprnn/kernels/common.py, "Sequences").
    Work split:   one thread per slice of batch rows, each running all T steps.
    """
    T, B, m = x.shape
    n = W.shape[0]
    # 1. input projections of all steps at once; th[t] holds V_h x_t until step t overwrites it
    matmul_nt_rows(th.reshape(T * B, n), x.reshape(T * B, m), V_h)
    S = num_slices(B)
    for c in prange(S):
        b0, b1 = row_slice(c, S, B)
        Wh = np.empty((b1 - b0, n), dtype=hs.dtype)
        for t in range(T):
            # 2. recurrence: row b of Wh is W h_{t-1}[b]
            np.dot(hs[t, b0:b1], W.T, Wh)
            for b in range(b0, b1):
                if t >= lengths[b]:
                    hold_state(hs, th, t, b)
                    continue
                for j in range(n):
                    y = tanh(th[t, b, j] + Wh[b - b0, j] + b_h[j])
                    th[t, b, j] = y
                    hs[t + 1, b, j] = hs[t, b, j] + alpha * (y - hs[t, b, j])


@njit_parallel
def leaky_backward_cpu(dW, dV_h, db_h, dh0, da, dh_T, hs, th, x, W, alpha, dhs, lengths):
    """BPTT over the whole sequence.

    Written (=):  dW (n, n); dV_h (n, m); db_h (n,); dh0 (B, n) = dL/dh_0;
                  da (T, B, n) = dL/da_t (scratch, kept for the products at the end).
    Read:         dh_T (B, n); hs (T+1, B, n), th (T, B, n) from the forward pass; x (T, B, m);
                  W (n, n); alpha; dhs, lengths (nprnn/kernels/common.py, "Sequences").
    Work split:   one thread per slice of batch rows for the reverse time loop; the weight
                  gradients as products over all T*B rows.
    """
    T, B, m = x.shape
    n = W.shape[0]
    dh0[:, :] = dh_T              # the running dL/dh_t lives in dh0's buffer; it ends as dL/dh_0
    S = num_slices(B)
    for c in prange(S):
        b0, b1 = row_slice(c, S, B)
        mode = flush_denormals(dh0)
        dh = dh0[b0:b1]
        daW = np.empty((b1 - b0, n), dtype=dh0.dtype)
        for t in range(T - 1, -1, -1):
            for b in range(b0, b1):
                if add_upstream(dh, dhs, da, t, b, b0, lengths):
                    continue
                for j in range(n):
                    # forward was: h_t = h_{t-1} + alpha (y_t - h_{t-1}),  y_t = tanh(a_t)
                    # so:          da_t = dh_t alpha (1 - y_t**2) ;  dh_{t-1} = dh_t - alpha dh_t
                    #              (+ da_t W, below)
                    g = dh[b - b0, j]
                    da[t, b, j] = flush_subnormal(g * alpha * dtanh_from_y(th[t, b, j]))
                    dh[b - b0, j] = g - alpha * g
            # forward was: a_t = W h_{t-1} + V_h x_t + b_h
            # so:          dh_{t-1} += da_t W   (row form)
            np.dot(da[t, b0:b1], W, daW)
            dh += daW
        restore_fp_mode(mode)
    # 3. weight gradients over all steps at once
    da2 = da.reshape(T * B, n)
    matmul_tn_rows(dW, da2, hs[:T].reshape(T * B, n))       # dW = sum_t da_t^T h_{t-1}
    matmul_tn_rows(dV_h, da2, x.reshape(T * B, m))          # dV_h = sum_t da_t^T x_t
    sum_rows(db_h, da2)                                     # db_h = sum_t sum_b da_t


# ------------------------------------------------------------------------------------------
# GPU twins, version 1: one thread per (b, j), one launch per step (BPTT: two per step, the
# elementwise part and dh_{t-1} += da_t W). The host functions take the CPU twins' arguments
# (device arrays), then keyword-only launch options.
# ------------------------------------------------------------------------------------------

@cuda.jit
def leaky_forward_step_kernel(hs, th, x, WT, V_h, b_h, alpha, t, lengths):
    """Step t: y_t = tanh(W h_{t-1} + V_h x_t + b_h), h_t = h_{t-1} + alpha (y_t - h_{t-1}).
    Written (=): hs[t+1], th[t] (B, n). Read: hs[t], x[t], WT = W^T (n, n), V_h (n, m),
    b_h (n,). One thread per (b, j); 2-d grid over (j, b)."""
    j, b = cuda.grid(2)
    B, n, m = hs.shape[1], hs.shape[2], x.shape[2]
    if b < B and j < n and not hold_unit(hs, th, t, b, j, lengths):
        a = b_h[j]
        for k in range(m):
            a += V_h[j, k] * x[t, b, k]
        for k in range(n):
            a += WT[k, j] * hs[t, b, k]                             # W[j, k] h_{t-1}[b, k]
        y = tanh(a)
        th[t, b, j] = y
        hs[t + 1, b, j] = hs[t, b, j] + alpha * (y - hs[t, b, j])


@cuda.jit
def leaky_backward_unit_kernel(da, dh, th, alpha, t, dhs, lengths):
    """The elementwise part of BPTT through step t.
    forward was: h_t = h_{t-1} + alpha (y_t - h_{t-1}),  y_t = tanh(a_t)
    so:          da_t = dh_t alpha (1 - y_t**2) ;  dh_{t-1} = dh_t - alpha dh_t (+ da_t W, next)
    Written (=): da[t] (B, n); dh (B, n), from dL/dh_t to its part through the leak.
    Read: th[t]. One thread per (b, j)."""
    j, b = cuda.grid(2)
    B, n = dh.shape
    if b < B and j < n:
        g = upstream(dh, dhs, t, b, j)
        if t >= lengths[b]:
            da[t, b, j] = 0
            dh[b, j] = g
            return
        da[t, b, j] = g * alpha * dtanh_from_y(th[t, b, j])
        dh[b, j] = g - alpha * g


def leaky_forward_gpu(hs, th, x, W, V_h, b_h, alpha, lengths, *, block=(128, 1)):
    """Twin of leaky_forward_cpu: T launches of leaky_forward_step_kernel.
    Written (=): hs[1:], th. Read: hs[0] = h_0, x, W, V_h, b_h, alpha."""
    T, B, _ = x.shape
    grid, block = step_grid(B, W.shape[0], block)
    WT = transposed(W, "leaky_WT")
    for t in range(T):
        leaky_forward_step_kernel[grid, block](hs, th, x, WT, V_h, b_h, alpha, t, lengths)


def leaky_backward_gpu(dW, dV_h, db_h, dh0, da, dh_T, hs, th, x, W, alpha, dhs, lengths, *,
                       block=(128, 1), tile=TILE):
    """Twin of leaky_backward_cpu: per step leaky_backward_unit_kernel, then
    dh_{t-1} += da_t W (rows_times_matrix_gpu); then the weight gradients.
    Written (=): dW, dV_h, db_h, dh0, da. Read: dh_T, hs, th, x, W, alpha."""
    T, B, m = x.shape
    n = W.shape[0]
    grid, block = step_grid(B, n, block)
    dh0.copy_to_device(dh_T)              # the running dL/dh_t lives in dh0; it ends as dL/dh_0
    for t in range(T - 1, -1, -1):
        leaky_backward_unit_kernel[grid, block](da, dh0, th, alpha, t, dhs, lengths)
        rows_times_matrix_gpu(dh0, da, W, t, True, block=block)
    DA = da.reshape(T * B, n)
    matmul_tn_gpu(dW, DA, hs[:T].reshape(T * B, n), tile=tile)    # dW = DA^T H
    matmul_tn_gpu(dV_h, DA, x.reshape(T * B, m), tile=tile)       # dV_h = DA^T X
    column_sums_gpu(db_h, DA, tile=tile)                          # db_h = DA^T 1


leaky_forward = Twins(leaky_forward_cpu, leaky_forward_gpu)
leaky_backward = Twins(leaky_backward_cpu, leaky_backward_gpu)

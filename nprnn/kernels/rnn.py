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

from .common import (dtanh_from_y, matmul_nt_rows, matmul_tn_rows, njit_parallel, num_slices,
                     row_slice, sum_rows, tanh)


@njit_parallel
def rnn_forward_cpu(hs, x, W_ih, W_hh, b_ih, b_hh):
    """Forward pass over a whole sequence.

    Written (=):  hs[1:] (T+1, B, n), h_1 .. h_T (h_t = tanh(a_t) is all BPTT needs).
    Read:         hs[0] (B, n) = h_0; x (T, B, m); W_ih (n, m); W_hh (n, n); b_ih, b_hh (n,).
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
                for j in range(n):
                    # a_t = W_ih x_t + b_ih + W_hh h_{t-1} + b_hh;  h_t = tanh(a_t)
                    hs[t + 1, b, j] = tanh(hs[t + 1, b, j] + b_ih[j] + Wh[b - b0, j] + b_hh[j])


@njit_parallel
def rnn_backward_cpu(dW_ih, dW_hh, db_ih, db_hh, dh0, da, dh_T, hs, x, W_hh):
    """BPTT over the whole sequence.

    Written (=):  dW_ih (n, m); dW_hh (n, n); db_ih, db_hh (n,); dh0 (B, n) = dL/dh_0;
                  da (T, B, n) = dL/da_t (scratch, kept for the products at the end).
    Read:         dh_T (B, n) = dL/dh_T; hs (T+1, B, n) from the forward pass; x (T, B, m);
                  W_hh (n, n).
    Work split:   one thread per slice of batch rows for the reverse time loop; the weight
                  gradients as products over all T*B rows, split by rows.
    """
    T, B, m = x.shape
    n = W_hh.shape[0]
    dh0[:, :] = dh_T              # the running dL/dh_t lives in dh0's buffer; it ends as dL/dh_0
    S = num_slices(B)
    for c in prange(S):
        b0, b1 = row_slice(c, S, B)
        dh = dh0[b0:b1]
        for t in range(T - 1, -1, -1):
            for b in range(b0, b1):
                for j in range(n):
                    # forward was: h_t = tanh(a_t)
                    # so:          da_t = dh_t * (1 - h_t**2)
                    da[t, b, j] = dh[b - b0, j] * dtanh_from_y(hs[t + 1, b, j])
            # forward was: a_t = W_ih x_t + b_ih + W_hh h_{t-1} + b_hh; h_{t-1} goes nowhere else
            # so:          dh_{t-1} = da_t W_hh   (row form)
            np.dot(da[t, b0:b1], W_hh, dh)
    # 3. weight gradients over all steps at once
    da2 = da.reshape(T * B, n)
    matmul_tn_rows(dW_hh, da2, hs[:T].reshape(T * B, n))    # dW_hh = sum_t da_t^T h_{t-1}
    matmul_tn_rows(dW_ih, da2, x.reshape(T * B, m))         # dW_ih = sum_t da_t^T x_t
    sum_rows(db_ih, da2)                                    # db_ih = sum_t sum_b da_t
    db_hh[:] = db_ih                                        # b_hh enters a_t as b_ih does

"""The GRU baseline (PyTorch's nn.GRU): forward pass and BPTT kernels.

    r = sigmoid(W_ir x_t + b_ir + W_hr h_{t-1} + b_hr)               reset gate
    z = sigmoid(W_iz x_t + b_iz + W_hz h_{t-1} + b_hz)               update gate
    n_t = tanh(W_in x_t + b_in + r o (W_hn h_{t-1} + b_hn))          candidate
    h_t = (1 - z) o n_t + z o h_{t-1}

Parameters follow nn.GRU's layout: W_ih = weight_ih (3n, m), W_hh = weight_hh (3n, n),
b_ih = bias_ih (3n,), b_hh = bias_hh (3n,); rows [k n, (k+1) n) hold gate k of (r, z, n).
Unlike the LSTM's, the two biases of the candidate are not interchangeable: b_hn sits inside
r o (...), so the kernels keep hn_t = W_hn h_{t-1} + b_hn of every step for BPTT, and the input
side and the hidden side of the candidate get different pre-activation gradients:
dL/d(W_in x_t + b_in) = da_n, but dL/d(W_hn h_{t-1} + b_hn) = da_n o r.

Shapes: B batch, T time, m input size, n hidden size. Time-major: x (T, B, m); hs (T+1, B, n)
with hs[0] = h_0 given by the caller (zero in the models); gates (T, B, 3n) keeps r, z, n_t of
every step; hn (T, B, n) keeps W_hn h_{t-1} + b_hn.

How the CPU work is split (the recipe of `antisym.py`, on threads that own batch rows):
  1. one (T*B, m) @ (m, 3n) product for the input projections W_ih x_t of all T steps;
  2. one thread per slice of batch rows runs all T steps of its slice: per step one
     (B_slice, n) @ (n, 3n) product with W_hh^T, then one fused elementwise pass;
  3. in BPTT, the same slices run the reverse time loop with one (B_slice, 3n) @ (3n, n) product
     per step, and the weight gradients are products over all stored steps, split by rows:
     dW_hh = DGH^T H and dW_ih = DGI^T X.
The caller holds BLAS to one thread (`common.one_blas_thread`) while these kernels run.
"""
import numpy as np
from numba import prange

from .common import (dsigmoid_from_y, dtanh_from_y, matmul_nt_rows, matmul_tn_rows,
                     njit_parallel, num_slices, row_slice, sigmoid, sum_rows, tanh)


@njit_parallel
def gru_forward_cpu(hs, gates, hn, x, W_ih, W_hh, b_ih, b_hh):
    """Forward pass over a whole sequence.

    Written (=):  hs[1:] (T+1, B, n): h_t; gates (T, B, 3n): r, z, n_t of each step, in blocks
                  of n; hn (T, B, n): W_hn h_{t-1} + b_hn of each step.
    Read:         hs[0] (B, n) = h_0; x (T, B, m); W_ih (3n, m); W_hh (3n, n); b_ih, b_hh (3n,).
    Work split:   one thread per slice of batch rows, each running all T steps.
    """
    T, B, m = x.shape
    n = W_hh.shape[1]
    # 1. input projections of all steps at once; gates[t] holds W_ih x_t until step t overwrites it
    matmul_nt_rows(gates.reshape(T * B, 3 * n), x.reshape(T * B, m), W_ih)
    S = num_slices(B)
    for c in prange(S):
        b0, b1 = row_slice(c, S, B)
        Wh = np.empty((b1 - b0, 3 * n), dtype=hs.dtype)
        for t in range(T):
            # 2. recurrence: row b of Wh is W_hh h_{t-1}[b]
            np.dot(hs[t, b0:b1], W_hh.T, Wh)
            for b in range(b0, b1):
                k = b - b0
                for j in range(n):
                    r = sigmoid(gates[t, b, j] + b_ih[j] + Wh[k, j] + b_hh[j])
                    z = sigmoid(gates[t, b, n + j] + b_ih[n + j] + Wh[k, n + j] + b_hh[n + j])
                    hn_t = Wh[k, 2 * n + j] + b_hh[2 * n + j]         # W_hn h_{t-1} + b_hn
                    n_t = tanh(gates[t, b, 2 * n + j] + b_ih[2 * n + j] + r * hn_t)
                    gates[t, b, j] = r
                    gates[t, b, n + j] = z
                    gates[t, b, 2 * n + j] = n_t
                    hn[t, b, j] = hn_t
                    hs[t + 1, b, j] = (1.0 - z) * n_t + z * hs[t, b, j]


@njit_parallel
def gru_backward_cpu(dW_ih, dW_hh, db_ih, db_hh, dh0, dgi, dgh, dh_T, hs, gates, hn, x, W_hh):
    """BPTT over the whole sequence.

    Written (=):  dW_ih (3n, m); dW_hh (3n, n); db_ih, db_hh (3n,); dh0 (B, n) = dL/dh_0;
                  scratch, kept for the products at the end:
                  dgi (T, B, 3n) = dL/d(W_ih x_t + b_ih) = (da_r, da_z, da_n),
                  dgh (T, B, 3n) = dL/d(W_hh h_{t-1} + b_hh) = (da_r, da_z, da_n o r).
    Read:         dh_T (B, n) = dL/dh_T; hs, gates, hn from the forward pass; x (T, B, m);
                  W_hh (3n, n).
    Work split:   one thread per slice of batch rows for the reverse time loop; the weight
                  gradients as products over all T*B rows, split by rows.
    """
    T, B, m = x.shape
    n = W_hh.shape[1]
    dh0[:, :] = dh_T              # the running dL/dh_t lives in dh0's buffer; it ends as dL/dh_0
    S = num_slices(B)
    for c in prange(S):
        b0, b1 = row_slice(c, S, B)
        dh = dh0[b0:b1]
        dWh = np.empty((b1 - b0, n), dtype=dh0.dtype)
        for t in range(T - 1, -1, -1):
            for b in range(b0, b1):
                k = b - b0
                for j in range(n):
                    r = gates[t, b, j]
                    z = gates[t, b, n + j]
                    n_t = gates[t, b, 2 * n + j]
                    d = dh[k, j]
                    # forward was: h_t = (1 - z) * n_t + z * h_{t-1}
                    # so:          dn_t = dh_t (1 - z) ; dz = dh_t (h_{t-1} - n_t) ; dh_{t-1} = dh_t z
                    # forward was: n_t = tanh(a_n + r * hn_t),  r = sigmoid(a_r),  z = sigmoid(a_z)
                    # so:          da_n = dn_t (1 - n_t**2) ;  dr = da_n hn_t ;  dhn_t = da_n r
                    da_n = d * (1.0 - z) * dtanh_from_y(n_t)
                    da_r = da_n * hn[t, b, j] * dsigmoid_from_y(r)
                    da_z = d * (hs[t, b, j] - n_t) * dsigmoid_from_y(z)
                    dgi[t, b, j] = da_r
                    dgi[t, b, n + j] = da_z
                    dgi[t, b, 2 * n + j] = da_n
                    dgh[t, b, j] = da_r
                    dgh[t, b, n + j] = da_z
                    dgh[t, b, 2 * n + j] = da_n * r
                    dh[k, j] = d * z
            # forward was: (a_r, a_z, hn_t) read W_hh h_{t-1} + b_hh
            # so:          dh_{t-1} += dgh_t W_hh   (row form)
            np.dot(dgh[t, b0:b1], W_hh, dWh)
            dh += dWh
    # 3. weight gradients over all steps at once
    dgi2 = dgi.reshape(T * B, 3 * n)
    dgh2 = dgh.reshape(T * B, 3 * n)
    matmul_tn_rows(dW_hh, dgh2, hs[:T].reshape(T * B, n))   # dW_hh = sum_t dgh_t^T h_{t-1}
    matmul_tn_rows(dW_ih, dgi2, x.reshape(T * B, m))        # dW_ih = sum_t dgi_t^T x_t
    sum_rows(db_hh, dgh2)
    sum_rows(db_ih, dgi2)

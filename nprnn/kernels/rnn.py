"""The vanilla (Elman) RNN baseline: forward pass and BPTT kernels.

    h_t = tanh(W_ih x_t + b_ih + W_hh h_{t-1} + b_hh)

Parameters are PyTorch's single-layer nn.RNN (nonlinearity tanh), names and layouts included:
W_ih = weight_ih (n, m), W_hh = weight_hh (n, n), b_ih = bias_ih (n,), b_hh = bias_hh (n,).
Both biases are kept, as PyTorch keeps them, so weights can be exchanged; they always receive the
same gradient.

Shapes: B batch, T time, m input size, n hidden size. Kernels are time-major: x is (T, B, m) and
hs is (T+1, B, n) with hs[0] = h_0 given by the caller (zero in the models).

How the CPU work is split (the recipe of `antisym.py`):
  1. one (T*B, m) @ (m, n) product for the input projections W_ih x_t of all T steps;
  2. per step, one (B, n) @ (n, n) product with W_hh^T, then one fused elementwise pass;
  3. in BPTT, one (B, n) @ (n, n) product per step to carry dL/dh back, and the weight gradients
     as large products over all stored steps: dW_hh = DA^T H with DA, H reshaped to (T*B, n).
"""
import numpy as np

from .common import dtanh_from_y, njit


@njit
def rnn_forward_cpu(hs, x, W_ih, W_hh, b_ih, b_hh):
    """Forward pass over a whole sequence.

    Written (=):  hs[1:] (T+1, B, n), h_1 .. h_T (h_t = tanh(a_t) is all BPTT needs).
    Read:         hs[0] (B, n) = h_0; x (T, B, m); W_ih (n, m); W_hh (n, n); b_ih, b_hh (n,).
    """
    T, B, m = x.shape
    n = W_hh.shape[0]
    # 1. input projections of all steps at once; hs[t+1] holds W_ih x_t until step t overwrites it
    np.dot(x.reshape(T * B, m), W_ih.T, hs[1:].reshape(T * B, n))
    Wh = np.empty((B, n), dtype=hs.dtype)
    for t in range(T):
        # 2. recurrence: row b of Wh is W_hh h_{t-1}[b]
        np.dot(hs[t], W_hh.T, Wh)
        for b in range(B):
            for j in range(n):
                # a_t = W_ih x_t + b_ih + W_hh h_{t-1} + b_hh;  h_t = tanh(a_t)
                hs[t + 1, b, j] = np.tanh(hs[t + 1, b, j] + b_ih[j] + Wh[b, j] + b_hh[j])


@njit
def rnn_backward_cpu(dW_ih, dW_hh, db_ih, db_hh, dh0, da, dh_T, hs, x, W_hh):
    """BPTT over the whole sequence.

    Written (=):  dW_ih (n, m); dW_hh (n, n); db_ih, db_hh (n,); dh0 (B, n) = dL/dh_0;
                  da (T, B, n) = dL/da_t (scratch, kept for the products at the end).
    Read:         dh_T (B, n) = dL/dh_T; hs (T+1, B, n) from the forward pass; x (T, B, m);
                  W_hh (n, n).
    """
    T, B, m = x.shape
    n = W_hh.shape[0]
    dh = dh0                      # the running dL/dh_t lives in dh0's buffer; it ends as dL/dh_0
    dh[:, :] = dh_T
    for t in range(T - 1, -1, -1):
        for b in range(B):
            for j in range(n):
                # forward was: h_t = tanh(a_t)
                # so:          da_t = dh_t * (1 - h_t**2)
                da[t, b, j] = dh[b, j] * dtanh_from_y(hs[t + 1, b, j])
        # forward was: a_t = W_ih x_t + b_ih + W_hh h_{t-1} + b_hh, and h_{t-1} goes nowhere else
        # so:          dh_{t-1} = da_t W_hh   (row form)
        np.dot(da[t], W_hh, dh)
    # 3. weight gradients over all steps at once
    da2 = da.reshape(T * B, n)
    np.dot(da2.T, hs[:T].reshape(T * B, n), dW_hh)     # dW_hh = sum_t da_t^T h_{t-1}
    np.dot(da2.T, x.reshape(T * B, m), dW_ih)          # dW_ih = sum_t da_t^T x_t
    db_ih[:] = da2.sum(axis=0)                         # db_ih = db_hh = sum_t sum_b da_t
    db_hh[:] = db_ih

"""The LSTM baselines, standard and with peepholes: forward pass and BPTT kernels.

Standard LSTM (PyTorch's nn.LSTM; the baseline of the paper's Tables 1 and 2):

    a_t = W_ih x_t + b_ih + W_hh h_{t-1} + b_hh          (4n pre-activations, blocks i, f, g, o)
    i = sigmoid(a_i),  f = sigmoid(a_f),  g = tanh(a_g),  o = sigmoid(a_o)
    c_t = f o c_{t-1} + i o g
    h_t = o o tanh(c_t)

Peephole LSTM (Gers et al., 2002; the model of Gilboa et al., 2019): the gates also see the cell
state through diagonal weights w_ci, w_cf, w_co (n,), and the output gate sees the NEW one:

    i = sigmoid(a_i + w_ci o c_{t-1}),  f = sigmoid(a_f + w_cf o c_{t-1})
    o = sigmoid(a_o + w_co o c_t)

Parameters follow nn.LSTM's layout: W_ih = weight_ih (4n, m), W_hh = weight_hh (4n, n),
b_ih = bias_ih (4n,), b_hh = bias_hh (4n,); rows [k n, (k+1) n) hold gate k of (i, f, g, o).
Both biases are kept, as PyTorch keeps them; they always receive the same gradient.

Shapes: B batch, T time, m input size, n hidden size. Time-major: x (T, B, m); hs, cs
(T+1, B, n) with hs[0] = h_0 and cs[0] = c_0 given by the caller (the models use h_0 = 0 unless
told otherwise, and always c_0 = 0); gates (T, B, 4n) keeps i, f, g, o of every step for BPTT.

How the CPU work is split (the recipe of `antisym.py`, on threads that own batch rows):
  1. one (T*B, m) @ (m, 4n) product for the input projections W_ih x_t of all T steps;
  2. one thread per slice of batch rows runs all T steps of its slice: per step one
     (B_slice, n) @ (n, 4n) product with W_hh^T, then one fused elementwise pass that makes all
     four gates, c_t and h_t;
  3. in BPTT, the same slices run the reverse time loop with one (B_slice, 4n) @ (4n, n) product
     per step, and the weight gradients are products over all stored steps, split by rows:
     dW_hh = DA^T H with DA (T*B, 4n), H (T*B, n).
The caller holds BLAS to one thread (`common.one_blas_thread`) while these kernels run.
"""
import numpy as np
from numba import prange

from .common import (dsigmoid_from_y, dtanh_from_y, flush_subnormal, matmul_nt_rows,
                     matmul_tn_rows, njit_parallel, num_slices, row_slice, sigmoid, sum_rows,
                     tanh)


@njit_parallel
def lstm_forward_cpu(hs, cs, gates, x, W_ih, W_hh, b_ih, b_hh):
    """Forward pass of the standard LSTM over a whole sequence.

    Written (=):  hs[1:], cs[1:] (T+1, B, n): h_t and c_t;
                  gates (T, B, 4n): i, f, g, o of each step, in blocks of n.
    Read:         hs[0], cs[0] (B, n) = h_0, c_0; x (T, B, m); W_ih (4n, m); W_hh (4n, n);
                  b_ih, b_hh (4n,).
    Work split:   one thread per slice of batch rows, each running all T steps.
    """
    T, B, m = x.shape
    n = W_hh.shape[1]
    # 1. input projections of all steps at once; gates[t] holds W_ih x_t until step t overwrites it
    matmul_nt_rows(gates.reshape(T * B, 4 * n), x.reshape(T * B, m), W_ih)
    bias = b_ih + b_hh
    S = num_slices(B)
    for c in prange(S):
        b0, b1 = row_slice(c, S, B)
        Wh = np.empty((b1 - b0, 4 * n), dtype=hs.dtype)
        for t in range(T):
            # 2. recurrence: row b of Wh is W_hh h_{t-1}[b]
            np.dot(hs[t, b0:b1], W_hh.T, Wh)
            for b in range(b0, b1):
                r = b - b0
                for j in range(n):
                    # a_t = W_ih x_t + b_ih + W_hh h_{t-1} + b_hh, gate k at column k n + j
                    i = sigmoid(gates[t, b, j] + Wh[r, j] + bias[j])
                    f = sigmoid(gates[t, b, n + j] + Wh[r, n + j] + bias[n + j])
                    g = tanh(gates[t, b, 2 * n + j] + Wh[r, 2 * n + j] + bias[2 * n + j])
                    o = sigmoid(gates[t, b, 3 * n + j] + Wh[r, 3 * n + j] + bias[3 * n + j])
                    cell = f * cs[t, b, j] + i * g              # c_t = f c_{t-1} + i g
                    gates[t, b, j] = i
                    gates[t, b, n + j] = f
                    gates[t, b, 2 * n + j] = g
                    gates[t, b, 3 * n + j] = o
                    cs[t + 1, b, j] = cell
                    hs[t + 1, b, j] = o * tanh(cell)            # h_t = o tanh(c_t)


@njit_parallel
def lstm_backward_cpu(dW_ih, dW_hh, db_ih, db_hh, dh0, da, dh_T, hs, cs, gates, x, W_hh):
    """BPTT of the standard LSTM over the whole sequence.

    Written (=):  dW_ih (4n, m); dW_hh (4n, n); db_ih, db_hh (4n,); dh0 (B, n) = dL/dh_0;
                  da (T, B, 4n) = dL/da_t, the pre-activation gradients (scratch, kept for the
                  products at the end). dL/dc_0 is not returned: c_0 is not an input of the model.
    Read:         dh_T (B, n) = dL/dh_T (c_T reaches the loss only through h_T);
                  hs, cs, gates from the forward pass; x (T, B, m); W_hh (4n, n).
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
        dc = np.zeros((b1 - b0, n), dtype=dh0.dtype)     # the running dL/dc_t; dL/dc_T = 0
        for t in range(T - 1, -1, -1):
            for b in range(b0, b1):
                r = b - b0
                for j in range(n):
                    i = gates[t, b, j]
                    f = gates[t, b, n + j]
                    g = gates[t, b, 2 * n + j]
                    o = gates[t, b, 3 * n + j]
                    tc = tanh(cs[t + 1, b, j])
                    # forward was: h_t = o * tanh(c_t)
                    # so:          do = dh_t tanh(c_t) ;  dc_t += dh_t o (1 - tanh(c_t)**2)
                    do = dh[r, j] * tc
                    dc_t = dc[r, j] + dh[r, j] * o * dtanh_from_y(tc)
                    # forward was: c_t = f * c_{t-1} + i * g
                    # so:          di = dc_t g ; df = dc_t c_{t-1} ; dg = dc_t i ; dc_{t-1} = dc_t f
                    # forward was: i, f, o = sigmoid(a_i, a_f, a_o) ;  g = tanh(a_g)
                    # so:          da_i = di i (1 - i) ;  ... ;  da_g = dg (1 - g**2)
                    da[t, b, j] = flush_subnormal(dc_t * g * dsigmoid_from_y(i))
                    da[t, b, n + j] = flush_subnormal(dc_t * cs[t, b, j] * dsigmoid_from_y(f))
                    da[t, b, 2 * n + j] = flush_subnormal(dc_t * i * dtanh_from_y(g))
                    da[t, b, 3 * n + j] = flush_subnormal(do * dsigmoid_from_y(o))
                    dc[r, j] = flush_subnormal(dc_t * f)
            # forward was: a_t = W_ih x_t + b_ih + W_hh h_{t-1} + b_hh; h_{t-1} goes nowhere else
            # so:          dh_{t-1} = da_t W_hh   (row form)
            np.dot(da[t, b0:b1], W_hh, dh)
    # 3. weight gradients over all steps at once
    da2 = da.reshape(T * B, 4 * n)
    matmul_tn_rows(dW_hh, da2, hs[:T].reshape(T * B, n))    # dW_hh = sum_t da_t^T h_{t-1}
    matmul_tn_rows(dW_ih, da2, x.reshape(T * B, m))         # dW_ih = sum_t da_t^T x_t
    sum_rows(db_ih, da2)                                    # db_ih = sum_t sum_b da_t
    db_hh[:] = db_ih                                        # b_hh enters a_t as b_ih does


@njit_parallel
def peephole_lstm_forward_cpu(hs, cs, gates, x, W_ih, W_hh, b_ih, b_hh, w_ci, w_cf, w_co):
    """Forward pass of the peephole LSTM over a whole sequence.

    Written (=):  hs[1:], cs[1:] (T+1, B, n): h_t and c_t;
                  gates (T, B, 4n): i, f, g, o of each step, in blocks of n.
    Read:         hs[0], cs[0] (B, n) = h_0, c_0; x (T, B, m); W_ih (4n, m); W_hh (4n, n);
                  b_ih, b_hh (4n,); w_ci, w_cf, w_co (n,).
    Work split:   one thread per slice of batch rows, each running all T steps.
    """
    T, B, m = x.shape
    n = W_hh.shape[1]
    matmul_nt_rows(gates.reshape(T * B, 4 * n), x.reshape(T * B, m), W_ih)   # W_ih x_t for now
    bias = b_ih + b_hh
    S = num_slices(B)
    for c in prange(S):
        b0, b1 = row_slice(c, S, B)
        Wh = np.empty((b1 - b0, 4 * n), dtype=hs.dtype)
        for t in range(T):
            np.dot(hs[t, b0:b1], W_hh.T, Wh)
            for b in range(b0, b1):
                r = b - b0
                for j in range(n):
                    c_prev = cs[t, b, j]
                    i = sigmoid(gates[t, b, j] + Wh[r, j] + bias[j] + w_ci[j] * c_prev)
                    f = sigmoid(gates[t, b, n + j] + Wh[r, n + j] + bias[n + j]
                                + w_cf[j] * c_prev)
                    g = tanh(gates[t, b, 2 * n + j] + Wh[r, 2 * n + j] + bias[2 * n + j])
                    cell = f * c_prev + i * g                   # c_t = f c_{t-1} + i g
                    o = sigmoid(gates[t, b, 3 * n + j] + Wh[r, 3 * n + j] + bias[3 * n + j]
                                + w_co[j] * cell)               # o peeks at the new c_t
                    gates[t, b, j] = i
                    gates[t, b, n + j] = f
                    gates[t, b, 2 * n + j] = g
                    gates[t, b, 3 * n + j] = o
                    cs[t + 1, b, j] = cell
                    hs[t + 1, b, j] = o * tanh(cell)            # h_t = o tanh(c_t)


@njit_parallel
def peephole_lstm_backward_cpu(dW_ih, dW_hh, db_ih, db_hh, dw_ci, dw_cf, dw_co, dh0, da,
                               dh_T, hs, cs, gates, x, W_hh, w_ci, w_cf, w_co):
    """BPTT of the peephole LSTM over the whole sequence.

    Written (=):  dW_ih (4n, m); dW_hh (4n, n); db_ih, db_hh (4n,); dw_ci, dw_cf, dw_co (n,);
                  dh0 (B, n) = dL/dh_0; da (T, B, 4n) = dL/da_t, the pre-activation gradients
                  (scratch, kept for the products at the end). dL/dc_0 is not returned.
    Read:         dh_T (B, n) = dL/dh_T; hs, cs, gates from the forward pass; x (T, B, m);
                  W_hh (4n, n); w_ci, w_cf, w_co (n,).
    Work split:   as `lstm_backward_cpu`; the peephole gradients one thread per unit j.
    """
    T, B, m = x.shape
    n = W_hh.shape[1]
    dh0[:, :] = dh_T
    S = num_slices(B)
    for c in prange(S):
        b0, b1 = row_slice(c, S, B)
        dh = dh0[b0:b1]
        dc = np.zeros((b1 - b0, n), dtype=dh0.dtype)     # the running dL/dc_t; dL/dc_T = 0
        for t in range(T - 1, -1, -1):
            for b in range(b0, b1):
                r = b - b0
                for j in range(n):
                    i = gates[t, b, j]
                    f = gates[t, b, n + j]
                    g = gates[t, b, 2 * n + j]
                    o = gates[t, b, 3 * n + j]
                    c_prev = cs[t, b, j]
                    tc = tanh(cs[t + 1, b, j])
                    # forward was: h_t = o * tanh(c_t),  o = sigmoid(a_o + w_co c_t)
                    # so:          da_o = dh_t tanh(c_t) o (1 - o)
                    #              dc_t += dh_t o (1 - tanh(c_t)**2) + da_o w_co
                    da_o = dh[r, j] * tc * dsigmoid_from_y(o)
                    dc_t = dc[r, j] + dh[r, j] * o * dtanh_from_y(tc) + da_o * w_co[j]
                    # forward was: c_t = f * c_{t-1} + i * g
                    #              i = sigmoid(a_i + w_ci c_{t-1}),  f = sigmoid(a_f + w_cf c_{t-1})
                    # so:          da_i = dc_t g i (1 - i) ;  da_f = dc_t c_{t-1} f (1 - f)
                    #              dc_{t-1} = dc_t f + da_i w_ci + da_f w_cf
                    da_i = dc_t * g * dsigmoid_from_y(i)
                    da_f = dc_t * c_prev * dsigmoid_from_y(f)
                    da[t, b, j] = flush_subnormal(da_i)
                    da[t, b, n + j] = flush_subnormal(da_f)
                    da[t, b, 2 * n + j] = flush_subnormal(dc_t * i * dtanh_from_y(g))
                    da[t, b, 3 * n + j] = flush_subnormal(da_o)
                    dc[r, j] = flush_subnormal(dc_t * f + da_i * w_ci[j] + da_f * w_cf[j])
            np.dot(da[t, b0:b1], W_hh, dh)                # dh_{t-1} = da_t W_hh
    da2 = da.reshape(T * B, 4 * n)
    matmul_tn_rows(dW_hh, da2, hs[:T].reshape(T * B, n))    # dW_hh = sum_t da_t^T h_{t-1}
    matmul_tn_rows(dW_ih, da2, x.reshape(T * B, m))         # dW_ih = sum_t da_t^T x_t
    sum_rows(db_ih, da2)
    db_hh[:] = db_ih
    # the peepholes: dw_ci = sum_{t,b} da_i c_{t-1};  dw_cf = sum da_f c_{t-1};  dw_co = sum da_o c_t
    for j in prange(n):
        s_i = s_f = s_o = 0.0
        for t in range(T):
            for b in range(B):
                s_i += da[t, b, j] * cs[t, b, j]
                s_f += da[t, b, n + j] * cs[t, b, j]
                s_o += da[t, b, 3 * n + j] * cs[t + 1, b, j]
        dw_ci[j] = s_i
        dw_cf[j] = s_f
        dw_co[j] = s_o

"""The LSTM baselines, standard and with peepholes: forward pass and BPTT kernels.

Standard LSTM (PyTorch's nn.LSTM; the baseline of the paper's Tables 1 and 2):

    a_t = W_ih x_t + b_ih + W_hh h_{t-1} + b_hh          (4n pre-activations, blocks i, f, g, o)
    i = sigmoid(a_i),  f = sigmoid(a_f),  g = tanh(a_g),  o = sigmoid(a_o)
    c_t = f * c_{t-1} + i * g                            (products of vectors, written * or
    h_t = o * tanh(c_t)                                  side by side, are elementwise)

Peephole LSTM (Gers et al., 2002; Gilboa et al. 2019 use another peephole form, see
`cells.LSTMCell`): the gates also see the cell state through diagonal weights w_ci, w_cf, w_co
(n,), and the output gate sees the NEW one:

    i = sigmoid(a_i + w_ci * c_{t-1}),  f = sigmoid(a_f + w_cf * c_{t-1})
    o = sigmoid(a_o + w_co * c_t)

Parameters follow nn.LSTM's layout: W_ih = weight_ih (4n, m), W_hh = weight_hh (4n, n),
b_ih = bias_ih (4n,), b_hh = bias_hh (4n,); rows [k n, (k+1) n) hold gate k of (i, f, g, o).
Both biases are kept, as PyTorch keeps them; they always receive the same gradient.

Shapes: B batch, T time, m input size, n hidden size. Time-major: x (T, B, m); hs, cs
(T+1, B, n) with hs[0] = h_0 and cs[0] = c_0 given by the caller (the models use h_0 = 0 unless
told otherwise, and c_0 = 0); gates (T, B, 4n) keeps i, f, g, o of every step for BPTT. BPTT
takes dL/dc_T and returns dL/dc_0 in one array, dc (0 in for the models, whose loss reads h only).

How the CPU work is split (the recipe of `antisym.py`, on threads that own batch rows):
  1. one (T*B, m) @ (m, 4n) product for the input projections W_ih x_t of all T steps;
  2. one thread per slice of batch rows runs all T steps of its slice: per step one
     (B_slice, n) @ (n, 4n) product with W_hh^T, then one fused elementwise pass that makes all
     four gates, c_t and h_t;
  3. in BPTT, the same slices run the reverse time loop with one (B_slice, 4n) @ (4n, n) product
     per step, and the weight gradients are products over all stored steps, split by rows:
     dW_hh = DA^T H with DA (T*B, 4n), H (T*B, n).
The caller holds BLAS to one thread (`common.one_blas_thread`) while these kernels run.

A map of this file, in reading order:
  * one unit's step and its derivative, written once for every version: `lstm_unit`,
    `lstm_unit_backward` (with `peephole` a flag);
  * the CPU twins over a whole sequence: `lstm_forward_cpu`, `lstm_backward_cpu` and the peephole
    pair, both inlining `_forward` and `_backward`;
  * GPU version 1, one thread per (batch row, unit) and one launch per step:
    `lstm_forward_gpu` and the rest, with the peephole gradients `peephole_grads_gpu`;
  * the twins (`Twins`) of the CPU kernels and version 1.
The fast GPU version, 2 (persistent: one launch per pass), is in kernels/fast/lstm.py, held to the
CPU twin by tests/gpu/test_gpu_baselines.py; its twins, which nprnn/core/cells.py runs, add it.
"""
import numpy as np
from numba import prange

from .common import (Twins, BLOCK_ROWS, add_upstream, dsigmoid_from_y, dtanh_from_y,
                     flush_denormals, flush_subnormal, hold_state, matmul_nt_rows, matmul_tn_rows,
                     njit_inline, njit_parallel, num_slices, restore_fp_mode, row_slice, sigmoid,
                     sum_rows, tanh)
from .gpu_common import (TILE, WARP, cdiv, cuda, hold_unit, rows_times_matrix_gpu, scratch,
                         splits_for, stacked_param_grads_gpu, step_grid, transposed, upstream)


# ------------------------------------------------------------------------------------------
# The unit's math, shared by the CPU and the GPU twins of both LSTMs
# ------------------------------------------------------------------------------------------
# `peephole` is a literal at every CPU call site, so the branches on it fold away when numba
# inlines these functions; without peepholes w_ci, w_cf, w_co are not read, and the callers pass
# any value of the kernel's dtype in their place (a float64 literal would turn the float32
# arithmetic into float64: tests/test_precision.py).

@njit_inline
def lstm_unit(a_i, a_f, a_g, a_o, c_prev, w_ci, w_cf, w_co, peephole):
    """One unit of one step, from its four pre-activations a = W_ih x_t + b_ih + W_hh h + b_hh:
        i = sigmoid(a_i [+ w_ci c_{t-1}]), f = sigmoid(a_f [+ w_cf c_{t-1}]), g = tanh(a_g)
        c_t = f c_{t-1} + i g ;  o = sigmoid(a_o [+ w_co c_t]) ;  h_t = o tanh(c_t)
    Returns (i, f, g, o, c_t, h_t)."""
    if peephole:
        a_i += w_ci * c_prev
        a_f += w_cf * c_prev
    i = sigmoid(a_i)
    f = sigmoid(a_f)
    g = tanh(a_g)
    c = f * c_prev + i * g
    if peephole:
        a_o += w_co * c
    o = sigmoid(a_o)
    return i, f, g, o, c, o * tanh(c)


@njit_inline
def lstm_unit_backward(dh, dc, i, f, g, o, c_prev, c, w_ci, w_cf, w_co, peephole):
    """BPTT through lstm_unit, given dh = dL/dh_t and dc = dL/dc_t from the later steps.

    forward was: h_t = o tanh(c_t),  o = sigmoid(a_o [+ w_co c_t])
    so:          da_o = dh tanh(c_t) o (1 - o) ;  dc_t = dc + dh o (1 - tanh(c_t)**2) [+ da_o w_co]
    forward was: c_t = f c_{t-1} + i g,  i = sigmoid(a_i [+ w_ci c_{t-1}]), f = ..., g = tanh(a_g)
    so:          da_i = dc_t g i (1 - i) ;  da_f = dc_t c_{t-1} f (1 - f)
                 da_g = dc_t i (1 - g**2)
                 dc_{t-1} = dc_t f [+ da_i w_ci + da_f w_cf]
    Returns (da_i, da_f, da_g, da_o, dc_{t-1})."""
    tc = tanh(c)
    da_o = dh * tc * dsigmoid_from_y(o)
    dc_t = dc + dh * o * dtanh_from_y(tc)
    if peephole:
        dc_t += da_o * w_co
    da_i = dc_t * g * dsigmoid_from_y(i)
    da_f = dc_t * c_prev * dsigmoid_from_y(f)
    da_g = dc_t * i * dtanh_from_y(g)
    dc_prev = dc_t * f
    if peephole:
        dc_prev += da_i * w_ci + da_f * w_cf
    return da_i, da_f, da_g, da_o, dc_prev


@njit_inline
def _forward(hs, cs, gates, x, W_ih, W_hh, b_ih, b_hh, w_ci, w_cf, w_co, peephole, lengths):
    """The forward pass of both LSTMs (see the two kernels below); inlined into each, where
    `peephole` is a literal and its branches fold away."""
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
                if t >= lengths[b]:                      # past the row's end: h, c hold
                    hold_state(hs, gates, t, b)
                    cs[t + 1, b] = cs[t, b]
                    continue
                r = b - b0
                for j in range(n):
                    # a_t = W_ih x_t + b_ih + W_hh h_{t-1} + b_hh, gate k at column k n + j
                    i, f, g, o, cell, h = lstm_unit(
                        gates[t, b, j] + Wh[r, j] + bias[j],
                        gates[t, b, n + j] + Wh[r, n + j] + bias[n + j],
                        gates[t, b, 2 * n + j] + Wh[r, 2 * n + j] + bias[2 * n + j],
                        gates[t, b, 3 * n + j] + Wh[r, 3 * n + j] + bias[3 * n + j],
                        cs[t, b, j], w_ci[j], w_cf[j], w_co[j], peephole)
                    gates[t, b, j] = i
                    gates[t, b, n + j] = f
                    gates[t, b, 2 * n + j] = g
                    gates[t, b, 3 * n + j] = o
                    cs[t + 1, b, j] = cell
                    hs[t + 1, b, j] = h


@njit_inline
def _backward(dW_ih, dW_hh, db_ih, db_hh, dh0, dc, da, dh_T, hs, cs, gates, x, W_hh, w_ci,
              w_cf, w_co, peephole, dhs, lengths):
    """BPTT of both LSTMs but the peephole gradients (see the two kernels below); inlined into
    each, where `peephole` is a literal and its branches fold away."""
    T, B, m = x.shape
    n = W_hh.shape[1]
    dh0[:, :] = dh_T              # the running dL/dh_t lives in dh0's buffer; it ends as dL/dh_0
    S = num_slices(B)
    for c in prange(S):
        b0, b1 = row_slice(c, S, B)
        mode = flush_denormals(dh0)      # float32: subnormals to zero (common.py)
        dh = dh0[b0:b1]
        # dc_rows: the part of dL/dc_t that arrives through c_{t+1} (at t = T: from outside, the
        # caller's dL/dc_T, 0 for the models); it ends as dL/dc_0
        dc_rows = dc[b0:b1]
        dh_rec = np.empty((b1 - b0, n), dtype=dh0.dtype)  # the part of dh_{t-1} through W_hh
        for t in range(T - 1, -1, -1):
            for b in range(b0, b1):
                if add_upstream(dh, dhs, da, t, b, b0, lengths):
                    continue                    # past the row's end: dh and dc pass on
                r = b - b0
                for j in range(n):
                    # forward was: (i, f, g, o, c_t, h_t) = lstm_unit(a_t, c_{t-1}[, w_c*])
                    # so:          da_t and dc_{t-1} by lstm_unit_backward
                    da_i, da_f, da_g, da_o, dc_prev = lstm_unit_backward(
                        dh[r, j], dc_rows[r, j], gates[t, b, j], gates[t, b, n + j],
                        gates[t, b, 2 * n + j], gates[t, b, 3 * n + j], cs[t, b, j],
                        cs[t + 1, b, j], w_ci[j], w_cf[j], w_co[j], peephole)
                    da[t, b, j] = flush_subnormal(da_i)
                    da[t, b, n + j] = flush_subnormal(da_f)
                    da[t, b, 2 * n + j] = flush_subnormal(da_g)
                    da[t, b, 3 * n + j] = flush_subnormal(da_o)
                    dc_rows[r, j] = flush_subnormal(dc_prev)
                    dh[r, j] = 0.0              # h_{t-1} reaches step t only through W_hh
            # forward was: a_t = W_ih x_t + b_ih + W_hh h_{t-1} + b_hh; h_{t-1} goes nowhere else
            # so:          dh_{t-1} = da_t W_hh   (row form; added to the 0 left above)
            np.dot(da[t, b0:b1], W_hh, dh_rec)
            dh += dh_rec
        restore_fp_mode(mode)
    # 3. weight gradients over all steps at once
    da2 = da.reshape(T * B, 4 * n)
    matmul_tn_rows(dW_hh, da2, hs[:T].reshape(T * B, n))    # dW_hh = sum_t da_t^T h_{t-1}
    matmul_tn_rows(dW_ih, da2, x.reshape(T * B, m))         # dW_ih = sum_t da_t^T x_t
    sum_rows(db_ih, da2)                                    # db_ih = sum_t sum_b da_t
    db_hh[:] = db_ih                                        # b_hh enters a_t as b_ih does


@njit_parallel
def lstm_forward_cpu(hs, cs, gates, x, W_ih, W_hh, b_ih, b_hh, lengths):
    """Forward pass of the standard LSTM over a whole sequence.

    Written (=):  hs[1:], cs[1:] of (T+1, B, n): h_t and c_t;
                  gates (T, B, 4n): i, f, g, o of each step, in blocks of n.
    Read:         hs[0], cs[0] (B, n) = h_0, c_0; x (T, B, m); W_ih (4n, m); W_hh (4n, n);
                  b_ih, b_hh (4n,); lengths (B,): past row b's end h and c hold, gates = 0
                  (common.py, "Sequences").
    Work split:   one thread per slice of batch rows, each running all T steps.
    """
    # no peepholes: b_ih stands in for w_ci, w_cf, w_co, which are not read
    _forward(hs, cs, gates, x, W_ih, W_hh, b_ih, b_hh, b_ih, b_ih, b_ih, False, lengths)


@njit_parallel
def lstm_backward_cpu(dW_ih, dW_hh, db_ih, db_hh, dh0, dc, da, dh_T, hs, cs, gates, x, W_hh,
                      dhs, lengths):
    """BPTT of the standard LSTM over the whole sequence.

    Written (=):  dW_ih (4n, m); dW_hh (4n, n); db_ih, db_hh (4n,); dh0 (B, n) = dL/dh_0;
                  da (T, B, 4n) = dL/da_t, the pre-activation gradients (scratch, kept for the
                  products at the end).
    Updated:      dc (B, n): dL/dc_T from outside on entry (0 when c_T reaches the loss only
                  through h_T, as in the models), dL/dc_0 on exit.
    Read:         dh_T (B, n) = dL/dh_T;
                  hs, cs, gates from the forward pass; x (T, B, m); W_hh (4n, n);
                  dhs (T, B, n) (or (0, B, n)) and lengths (B,): common.py, "Sequences".
    Work split:   one thread per slice of batch rows for the reverse time loop; the weight
                  gradients as products over all T*B rows, split by rows.
    """
    # no peepholes: db_ih stands in for w_ci, w_cf, w_co, which are not read
    _backward(dW_ih, dW_hh, db_ih, db_hh, dh0, dc, da, dh_T, hs, cs, gates, x, W_hh, db_ih,
              db_ih, db_ih, False, dhs, lengths)


@njit_parallel
def peephole_lstm_forward_cpu(hs, cs, gates, x, W_ih, W_hh, b_ih, b_hh, w_ci, w_cf, w_co,
                              lengths):
    """Forward pass of the peephole LSTM over a whole sequence.

    Written (=):  hs[1:], cs[1:] of (T+1, B, n): h_t and c_t;
                  gates (T, B, 4n): i, f, g, o of each step, in blocks of n.
    Read:         hs[0], cs[0] (B, n) = h_0, c_0; x (T, B, m); W_ih (4n, m); W_hh (4n, n);
                  b_ih, b_hh (4n,); w_ci, w_cf, w_co (n,); lengths (B,), as lstm_forward_cpu.
    Work split:   one thread per slice of batch rows, each running all T steps.
    """
    _forward(hs, cs, gates, x, W_ih, W_hh, b_ih, b_hh, w_ci, w_cf, w_co, True, lengths)


@njit_parallel
def peephole_lstm_backward_cpu(dW_ih, dW_hh, db_ih, db_hh, dw_ci, dw_cf, dw_co, dh0, dc, da,
                               dh_T, hs, cs, gates, x, W_hh, w_ci, w_cf, w_co, dhs, lengths):
    """BPTT of the peephole LSTM over the whole sequence.

    Written (=):  dW_ih (4n, m); dW_hh (4n, n); db_ih, db_hh (4n,); dw_ci, dw_cf, dw_co (n,);
                  dh0 (B, n) = dL/dh_0; da (T, B, 4n) = dL/da_t, the pre-activation gradients
                  (scratch, kept for the products at the end).
    Updated:      dc (B, n): dL/dc_T in, dL/dc_0 out, as in lstm_backward_cpu.
    Read:         dh_T (B, n) = dL/dh_T; hs, cs, gates from the forward pass; x (T, B, m);
                  W_hh (4n, n); w_ci, w_cf, w_co (n,); dhs, lengths as lstm_backward_cpu.
    Work split:   as `lstm_backward_cpu`; the peephole gradients over slices of the T*B rows.
    """
    _backward(dW_ih, dW_hh, db_ih, db_hh, dh0, dc, da, dh_T, hs, cs, gates, x, W_hh, w_ci,
              w_cf, w_co, True, dhs, lengths)
    T, B, n = da.shape[0], da.shape[1], cs.shape[2]
    # the peepholes: dw_ci = sum_{t,b} da_i c_{t-1};  dw_cf = sum da_f c_{t-1};
    # dw_co = sum da_o c_t; over slices of the T*B rows in memory order (a loop over units outside
    # would read da with a stride of 4n), the slices' partial sums added in a fixed order
    R = T * B
    S = num_slices(R, BLOCK_ROWS)
    partial = np.zeros((S, 3, n), dtype=dw_ci.dtype)
    for c in prange(S):
        r0, r1 = row_slice(c, S, R)
        for r in range(r0, r1):
            t, b = r // B, r % B
            for j in range(n):
                partial[c, 0, j] += da[t, b, j] * cs[t, b, j]
                partial[c, 1, j] += da[t, b, n + j] * cs[t, b, j]
                partial[c, 2, j] += da[t, b, 3 * n + j] * cs[t + 1, b, j]
    dw_ci[:] = partial[0, 0]
    dw_cf[:] = partial[0, 1]
    dw_co[:] = partial[0, 2]
    for c in range(1, S):
        dw_ci += partial[c, 0]
        dw_cf += partial[c, 1]
        dw_co += partial[c, 2]


# ------------------------------------------------------------------------------------------
# GPU twins (tests/gpu/test_gpu_baselines.py checks them)
# ------------------------------------------------------------------------------------------
#   version 1, "step"        one thread per (b, j) computes all four gates of unit j: one launch
#                            per step (BPTT: two per step, the elementwise part and
#                            dh_{t-1} = da_t W_hh)
#   version 2, "persistent"  one launch per pass; block k owns batch rows [k R, (k+1) R) and keeps
#                            their h_{t-1} (forward) or dL/dh, dL/dc and da_t (BPTT) in shared
#                            memory. It is in kernels/fast/lstm.py.
# Shared memory per batch row of version 2, in vectors of n values: the forward pass keeps h_{t-1}
# and h_t (read one, write the other); BPTT keeps dL/dh, dL/dc and two copies of
# (da_i, da_f, da_g, da_o).
FORWARD_VALUES = 2
BACKWARD_VALUES = 10
# The standard and the peephole LSTM share every GPU kernel through `peephole`; without peepholes
# w_ci, w_cf, w_co are not read (the standard LSTM's host functions pass a bias vector in their
# place). c_t of a unit is touched only by the thread that owns it. Every version calls the CPU
# twins' `lstm_unit` and `lstm_unit_backward` (above), here with `peephole` a kernel argument. The
# CPU twins flush float32 subnormal gradients to zero (a CPU speed measure); GPUs handle
# subnormals at full speed, so the GPU twins keep them (a difference below 1.2e-38).

@cuda.jit(cache=True)
def lstm_forward_step_kernel(hs, cs, gates, x, W_ih, WT, b_ih, b_hh, w_ci, w_cf, w_co,
                             peephole, t, lengths):
    """Step t of the (peephole) LSTM, see lstm_unit.
    Written (=): gates[t] (B, 4n) = i, f, g, o; cs[t+1], hs[t+1] (B, n).
    Read: hs[t], cs[t], x[t], W_ih (4n, m), WT = W_hh^T (n, 4n), b_ih, b_hh (4n,), w_c* (n,),
    lengths (B,) (past row b's end h and c hold and the gates are 0).
    One thread per (b, j), computing the four gates of unit j; 2-d grid over (j, b). W_hh is
    read transposed: for each k the threads of a warp read consecutive WT[k, j]."""
    j, b = cuda.grid(2)
    B, n, m = hs.shape[1], hs.shape[2], x.shape[2]
    if b < B and j < n and hold_unit(hs, gates, t, b, j, lengths):
        cs[t + 1, b, j] = cs[t, b, j]
        for k in range(1, 4):
            gates[t, b, k * n + j] = 0
        return
    if b < B and j < n:
        a_i = b_ih[j] + b_hh[j]
        a_f = b_ih[n + j] + b_hh[n + j]
        a_g = b_ih[2 * n + j] + b_hh[2 * n + j]
        a_o = b_ih[3 * n + j] + b_hh[3 * n + j]
        for k in range(m):
            xk = x[t, b, k]
            a_i += W_ih[j, k] * xk
            a_f += W_ih[n + j, k] * xk
            a_g += W_ih[2 * n + j, k] * xk
            a_o += W_ih[3 * n + j, k] * xk
        for k in range(n):
            hk = hs[t, b, k]                    # W_hh[G n + j, k] h_{t-1}[b, k], gate G
            a_i += WT[k, j] * hk
            a_f += WT[k, n + j] * hk
            a_g += WT[k, 2 * n + j] * hk
            a_o += WT[k, 3 * n + j] * hk
        i, f, g, o, c, h = lstm_unit(a_i, a_f, a_g, a_o, cs[t, b, j], w_ci[j], w_cf[j], w_co[j],
                                     peephole)
        gates[t, b, j] = i
        gates[t, b, n + j] = f
        gates[t, b, 2 * n + j] = g
        gates[t, b, 3 * n + j] = o
        cs[t + 1, b, j] = c
        hs[t + 1, b, j] = h


@cuda.jit(cache=True)
def lstm_backward_unit_kernel(da, dc, dh, cs, gates, w_ci, w_cf, w_co, peephole, t, dhs,
                              lengths):
    """The elementwise part of BPTT through step t (lstm_unit_backward).
    Written (=): da[t] (B, 4n). Updated: dc (B, n), the part of dL/dc_t that arrives through
    c_{t+1} -> the part of dL/dc_{t-1} that arrives through c_t (as in lstm_unit_backward);
    dh (B, n), dL/dh_t from the later steps (dhs[t] added: gpu_common.upstream) -> the part of
    dL/dh_{t-1} that skips W_hh: 0, or past row b's end (lengths) all of it, with da_t = 0 and
    dc passed on. Read: cs[t], cs[t+1], gates[t]. One thread per (b, j)."""
    j, b = cuda.grid(2)
    B, n = dh.shape
    if b < B and j < n:
        g = upstream(dh, dhs, t, b, j)
        if t >= lengths[b]:
            for k in range(4):
                da[t, b, k * n + j] = 0
            dh[b, j] = g
            return
        da_i, da_f, da_g, da_o, dc_prev = lstm_unit_backward(
            g, dc[b, j], gates[t, b, j], gates[t, b, n + j], gates[t, b, 2 * n + j],
            gates[t, b, 3 * n + j], cs[t, b, j], cs[t + 1, b, j], w_ci[j], w_cf[j], w_co[j],
            peephole)
        da[t, b, j] = da_i
        da[t, b, n + j] = da_f
        da[t, b, 2 * n + j] = da_g
        da[t, b, 3 * n + j] = da_o
        dc[b, j] = dc_prev
        dh[b, j] = 0


@cuda.jit(cache=True)
def peephole_partial_kernel(partial, da, cs):
    """The peephole gradients over slice s of the T*B rows r = t B + b (written, =):

        partial[s, 0, j] = sum_r da_i c_{t-1} ; partial[s, 1, j] = sum_r da_f c_{t-1} ;
        partial[s, 2, j] = sum_r da_o c_t

    partial (S, 3, n); da (T, B, 4n); cs (T+1, B, n). Slice s is rows [s k, min(T B, (s+1) k))
    with k = ceil(T B / S) (the CPU twin slices the rows its own way, so the two sums are added
    in different orders and agree to rounding). One thread per unit j, grid
    (ceil(n / blockDim.x), S): n threads alone, each summing all T*B rows, would leave a GPU
    nearly idle for milliseconds. Neighbouring threads read neighbouring units: coalesced."""
    j, s = cuda.grid(1), cuda.blockIdx.y
    S = partial.shape[0]
    T, B, n = da.shape[0], da.shape[1], cs.shape[2]
    if j < n:
        R = T * B
        k = (R + S - 1) // S
        s_i = s_f = s_o = partial.dtype.type(0)
        for r in range(s * k, min(R, (s + 1) * k)):
            t, b = r // B, r % B
            s_i += da[t, b, j] * cs[t, b, j]
            s_f += da[t, b, n + j] * cs[t, b, j]
            s_o += da[t, b, 3 * n + j] * cs[t + 1, b, j]
        partial[s, 0, j] = s_i
        partial[s, 1, j] = s_f
        partial[s, 2, j] = s_o


@cuda.jit(cache=True)
def peephole_sums_kernel(dw_ci, dw_cf, dw_co, partial):
    """dw_ci[j] = sum_s partial[s, 0, j], dw_cf from partial[:, 1], dw_co from partial[:, 2]
    (written, =), the slices added in order. One thread per unit j; 1-d grid."""
    j = cuda.grid(1)
    if j < dw_ci.shape[0]:
        s_i = s_f = s_o = partial.dtype.type(0)
        for s in range(partial.shape[0]):
            s_i += partial[s, 0, j]
            s_f += partial[s, 1, j]
            s_o += partial[s, 2, j]
        dw_ci[j] = s_i
        dw_cf[j] = s_f
        dw_co[j] = s_o


def peephole_grads_gpu(dw_ci, dw_cf, dw_co, da, cs, *, threads=128, splits=None):
    """dw_ci = sum_{t,b} da_i c_{t-1} ; dw_cf = sum da_f c_{t-1} ; dw_co = sum da_o c_t
    (written, =): the peephole part of BPTT's parameter gradients, as a sum over slices of the
    T*B rows (peephole_partial_kernel) and then over the slices (peephole_sums_kernel).
    `splits` (S) defaults to enough slices for about TARGET_BLOCKS blocks, and at most one per
    warp of rows (so that a slice has about a warp of rows or more; fewer when T*B is small)."""
    T, B, n = da.shape[0], da.shape[1], cs.shape[2]
    blocks = cdiv(n, threads)
    if splits is None:
        splits = splits_for(blocks, T * B, WARP)
    partial = scratch("peephole_grads", (splits, 3, n), dw_ci.dtype)
    peephole_partial_kernel[(blocks, splits), threads](partial, da, cs)
    peephole_sums_kernel[blocks, threads](dw_ci, dw_cf, dw_co, partial)


def _forward_steps(hs, cs, gates, x, W_ih, W_hh, b_ih, b_hh, w_ci, w_cf, w_co, peephole,
                   lengths, block):
    T, B, _ = x.shape
    n = W_hh.shape[1]
    grid, block = step_grid(B, n, block)
    WT = transposed(W_hh, "lstm_WT")
    for t in range(T):
        lstm_forward_step_kernel[grid, block](hs, cs, gates, x, W_ih, WT, b_ih, b_hh,
                                              w_ci, w_cf, w_co, peephole, t, lengths)


def _backward_steps(dh0, dc, da, dh_T, cs, gates, W_hh, w_ci, w_cf, w_co, peephole, dhs,
                    lengths, block):
    T, B, n = cs.shape[0] - 1, cs.shape[1], cs.shape[2]
    grid, block = step_grid(B, n, block)
    # dc: dL/dc_t through c_{t+1}, the caller's dL/dc_T at t = T; it ends as dL/dc_0
    dh0.copy_to_device(dh_T)              # the running dL/dh_t lives in dh0; it ends as dL/dh_0
    for t in range(T - 1, -1, -1):
        lstm_backward_unit_kernel[grid, block](da, dc, dh0, cs, gates, w_ci, w_cf, w_co,
                                               peephole, t, dhs, lengths)
        rows_times_matrix_gpu(dh0, da, W_hh, t, True, block=block)


def lstm_forward_gpu(hs, cs, gates, x, W_ih, W_hh, b_ih, b_hh, lengths, *, block=(128, 1)):
    """Version 1 twin of lstm_forward_cpu: T launches of lstm_forward_step_kernel.
    Written (=): hs[1:], cs[1:], gates. Read: hs[0], cs[0], x, W_ih, W_hh, b_ih, b_hh, lengths."""
    _forward_steps(hs, cs, gates, x, W_ih, W_hh, b_ih, b_hh, b_ih, b_ih, b_ih, False, lengths,
                   block)


def peephole_lstm_forward_gpu(hs, cs, gates, x, W_ih, W_hh, b_ih, b_hh, w_ci, w_cf, w_co,
                              lengths, *, block=(128, 1)):
    """Version 1 twin of peephole_lstm_forward_cpu (as lstm_forward_gpu, with peepholes)."""
    _forward_steps(hs, cs, gates, x, W_ih, W_hh, b_ih, b_hh, w_ci, w_cf, w_co, True, lengths,
                   block)


def lstm_backward_gpu(dW_ih, dW_hh, db_ih, db_hh, dh0, dc, da, dh_T, hs, cs, gates, x, W_hh,
                      dhs, lengths, *, block=(128, 1), tile=TILE):
    """Version 1 twin of lstm_backward_cpu: per step lstm_backward_unit_kernel, then
    dh_{t-1} += da_t W_hh (rows_times_matrix_gpu); then the weight gradients.
    Written (=): dW_ih, dW_hh, db_ih, db_hh, dh0, da. Updated: dc (dL/dc_T in, dL/dc_0 out)."""
    _backward_steps(dh0, dc, da, dh_T, cs, gates, W_hh, db_ih, db_ih, db_ih, False, dhs,
                    lengths, block)
    stacked_param_grads_gpu(dW_ih, dW_hh, db_ih, db_hh, da, da, hs, x, tile=tile)


def peephole_lstm_backward_gpu(dW_ih, dW_hh, db_ih, db_hh, dw_ci, dw_cf, dw_co, dh0, dc, da,
                               dh_T, hs, cs, gates, x, W_hh, w_ci, w_cf, w_co, dhs, lengths, *,
                               block=(128, 1), tile=TILE):
    """Version 1 twin of peephole_lstm_backward_cpu; the peephole gradients by
    peephole_grads_gpu. Written (=): dW_ih, dW_hh, db_ih, db_hh, dw_c*, dh0, da. Updated: dc."""
    _backward_steps(dh0, dc, da, dh_T, cs, gates, W_hh, w_ci, w_cf, w_co, True, dhs, lengths,
                    block)
    stacked_param_grads_gpu(dW_ih, dW_hh, db_ih, db_hh, da, da, hs, x, tile=tile)
    peephole_grads_gpu(dw_ci, dw_cf, dw_co, da, cs, threads=block[0])


# the twins, as nprnn/core/backends.py runs them: the CPU kernels and GPU version 1 (version 2,
# persistent, is in kernels/fast/lstm.py, whose twins add it)
lstm_forward = Twins(lstm_forward_cpu, lstm_forward_gpu)
lstm_backward = Twins(lstm_backward_cpu, lstm_backward_gpu)
peephole_lstm_forward = Twins(peephole_lstm_forward_cpu, peephole_lstm_forward_gpu)
peephole_lstm_backward = Twins(peephole_lstm_backward_cpu, peephole_lstm_backward_gpu)

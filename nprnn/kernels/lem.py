"""Long Expressive Memory (LEM; Rusch, Mishra, Erichson & Mahoney, ICLR 2022): forward pass and
BPTT kernels.

LEM is a multiscale time discretisation of two coupled ODEs, for a state z and a state y, with
learned, input-dependent step sizes. As its official code computes every step t = 1 .. T, with
u_t the input x_t (the paper's Dt_n is our g_t, its Dtbar_n our gbar_t):

    [A1 | A2 | A3 | A4] = weight_ih u_t + bias_ih           (4 blocks of n: the official inp2hid)
    [H1 | H2 | H3]      = weight_hh y_{t-1} + bias_hh       (3 blocks of n: hid2hid, on y)
    gbar_t = dt sigmoid(A1 + H1)                            y's step
    g_t    = dt sigmoid(A2 + H2)                            z's step
    z_t = (1 - g_t) z_{t-1} + g_t tanh(A4 + H3)
    y_t = (1 - gbar_t) y_{t-1} + gbar_t tanh(weight_z z_t + bias_z + A3)      (the NEW z_t)

The readout reads y (the models' hs holds y_0 .. y_T); z is internal, as an LSTM's c is, and
starts at z_0 = 0. Both updates are one gated step of the same form,

    new = prev + dt s (c - prev),   s = sigmoid(a_gate),  c = tanh(a_cand)

(= (1 - dt s) prev + dt s c), written once as `lem_step`, z's first, then y's, which reads the
new z_t through weight_z: a step is two phases, each a product and an elementwise pass.

Parameters, the official layout and chunk order: weight_ih (4n, m), bias_ih (4n,) [y's gate,
z's gate, input term of y's candidate, input term of z's candidate]; weight_hh (3n, n),
bias_hh (3n,) acting on y_{t-1} [y's gate, z's gate, z's candidate]; weight_z (n, n),
bias_z (n,) acting on the new z_t (the official transform_z).

Shapes: B batch, T time, m input size, n hidden size. Time-major: x (T, B, m); hs, zs (T+1, B, n)
with hs[0] = y_0 and zs[0] = z_0 given by the caller (z_0 = 0 in the models, whose loss reads y
alone; the BPTT takes dL/dz_T and returns dL/dz_0, for nprnn.torch); gates (T, B, 4n) keeps,
in blocks of n, sigmoid(A1 + H1), sigmoid(A2 + H2) (y's and z's gates, in (0, 1)), y's candidate
tanh(weight_z z_t + bias_z + A3) and z's candidate tanh(A4 + H3) of every step for BPTT. dt is a
scalar of the arrays' dtype (no literal enters the float32 arithmetic).

BPTT keeps three pre-activation gradients of every step: da (T, B, 4n) = dL/d(weight_ih u_t),
in inp2hid's blocks [dA1 | dA2 | dq | dA4]; dgh (T, B, 3n) = dL/d(weight_hh y_{t-1}), in
hid2hid's blocks [dA1 | dA2 | dA4]; dq (T, B, n) = dL/d(weight_z z_t), the same dq as da's third
block. Each is contiguous per step, so the products of BPTT read them as they are.

How the CPU work is split (the recipe of `lstm.py`):
  1. one (T*B, m) @ (m, 4n) product for the input projections weight_ih u_t of all T steps;
  2. one thread per slice of batch rows runs all T steps of its slice: per step the product
     y_{t-1} weight_hh^T (B_slice, 3n), z's elementwise pass, the product z_t weight_z^T
     (B_slice, n), y's elementwise pass;
  3. in BPTT the same slices run the reverse time loop, per step: y's elementwise pass, dq_t
     weight_z (z_t's share of y's candidate), z's elementwise pass, dgh_t weight_hh; the weight
     gradients are products over all stored steps: dW_ih = DA^T X, dW_hh = DGH^T Y,
     dW_z = DQ^T Z with the T*B rows of each.

A map of this file: the gated step and its derivative (`lem_step`, `lem_step_backward`), written
once for every version; the CPU twins (`lem_forward_cpu`, `lem_backward_cpu`); GPU version 1, one
thread per (batch row, unit) and two launches per step; the twins (`Twins`).
"""
import numpy as np
from numba import prange

from .common import (Twins, add_upstream, dsigmoid_from_y, dtanh_from_y, flush_denormals,
                     flush_subnormal, hold_state, matmul_nt_rows, matmul_tn_rows, njit_inline,
                     njit_parallel, num_slices, restore_fp_mode, row_slice, sigmoid, sum_rows,
                     tanh)
from .gpu_common import (TILE, column_sums_gpu, cuda, hold_unit, matmul_tn_gpu,
                         rows_times_matrix_gpu, step_grid, transposed, upstream)

# The kinds of this file's kernel arguments that tests/test_ptx.py does not know: the second
# state and the running gradients (arrays of the model's dtype), dt (a scalar of it).
ARG_KINDS = {"zs": "3", "dq": "3", "dy": "2", "dz": "2", "WzT": "2", "dt": "f"}


# ------------------------------------------------------------------------------------------
# The unit's math, shared by the CPU and the GPU twins
# ------------------------------------------------------------------------------------------

@njit_inline
def lem_step(a_gate, a_cand, prev, dt):
    """One unit's gated step, z's (a_gate = A2 + H2, a_cand = A4 + H3) or y's (a_gate = A1 + H1,
    a_cand = weight_z z_t + bias_z + A3):
        s = sigmoid(a_gate),  c = tanh(a_cand)
        new = prev + dt s (c - prev)          (= (1 - dt s) prev + dt s c)
    Returns (s, c, new)."""
    s = sigmoid(a_gate)
    c = tanh(a_cand)
    return s, c, prev + dt * s * (c - prev)


@njit_inline
def lem_step_backward(d, s, c, prev, dt):
    """BPTT through lem_step, given d = dL/dnew (all of it).

    forward was: new = prev + dt s (c - prev),  s = sigmoid(a_gate),  c = tanh(a_cand)
    so:          da_gate = d dt (c - prev) s (1 - s) ;  da_cand = d dt s (1 - c**2)
                 dprev = d - d dt s        (the direct part; the rest through the products)
    Returns (da_gate, da_cand, dprev)."""
    g = d * dt
    return g * (c - prev) * dsigmoid_from_y(s), g * s * dtanh_from_y(c), d - g * s


# ------------------------------------------------------------------------------------------
# CPU twins: whole sequences
# ------------------------------------------------------------------------------------------

@njit_parallel
def lem_forward_cpu(hs, zs, gates, x, W_ih, W_hh, W_z, b_ih, b_hh, b_z, dt, lengths):
    """Forward pass over a whole sequence (module docstring).

    Written (=):  hs[1:], zs[1:] of (T+1, B, n): y_t and z_t; gates (T, B, 4n): y's gate, z's
                  gate, y's candidate, z's candidate of each step, in blocks of n.
    Read:         hs[0], zs[0] (B, n) = y_0, z_0; x (T, B, m); W_ih (4n, m); W_hh (3n, n);
                  W_z (n, n); b_ih (4n,); b_hh (3n,); b_z (n,); dt; lengths (B,): past row r's
                  end y and z hold and the gates are 0 (common.py, "Sequences").
    Work split:   one thread per slice of batch rows, each running all T steps.
    """
    T, B, m = x.shape
    n = W_z.shape[0]
    # 1. input projections of all steps at once; gates[t] holds W_ih u_t until step t
    #    overwrites it
    matmul_nt_rows(gates.reshape(T * B, 4 * n), x.reshape(T * B, m), W_ih)
    S = num_slices(B)
    for c in prange(S):
        b0, b1 = row_slice(c, S, B)
        Hh = np.empty((b1 - b0, 3 * n), dtype=hs.dtype)
        Zw = np.empty((b1 - b0, n), dtype=hs.dtype)
        for t in range(T):
            # 2. row r of Hh is W_hh y_{t-1}[r]: [H1 | H2 | H3] without b_hh
            np.dot(hs[t, b0:b1], W_hh.T, Hh)
            for row in range(b0, b1):
                if t >= lengths[row]:                    # past the row's end: y, z hold
                    hold_state(hs, gates, t, row)
                    zs[t + 1, row] = zs[t, row]
                    continue
                r = row - b0
                for j in range(n):
                    # z's step: gate A2 + H2, candidate A4 + H3
                    s, cand, z = lem_step(
                        gates[t, row, n + j] + b_ih[n + j] + Hh[r, n + j] + b_hh[n + j],
                        gates[t, row, 3 * n + j] + b_ih[3 * n + j] + Hh[r, 2 * n + j]
                        + b_hh[2 * n + j], zs[t, row, j], dt)
                    gates[t, row, n + j] = s
                    gates[t, row, 3 * n + j] = cand
                    zs[t + 1, row, j] = z
            # row r of Zw is W_z z_t[r], the NEW z
            np.dot(zs[t + 1, b0:b1], W_z.T, Zw)
            for row in range(b0, b1):
                if t >= lengths[row]:
                    continue
                r = row - b0
                for j in range(n):
                    # y's step: gate A1 + H1, candidate W_z z_t + b_z + A3
                    s, cand, y = lem_step(
                        gates[t, row, j] + b_ih[j] + Hh[r, j] + b_hh[j],
                        Zw[r, j] + b_z[j] + gates[t, row, 2 * n + j] + b_ih[2 * n + j],
                        hs[t, row, j], dt)
                    gates[t, row, j] = s
                    gates[t, row, 2 * n + j] = cand
                    hs[t + 1, row, j] = y


@njit_parallel
def lem_backward_cpu(dW_ih, dW_hh, dW_z, db_ih, db_hh, db_z, dh0, dz, da, dgh, dq, dh_T, hs,
                     zs, gates, x, W_hh, W_z, dt, dhs, lengths):
    """BPTT over the whole sequence.

    Written (=):  dW_ih (4n, m); dW_hh (3n, n); dW_z (n, n); db_ih (4n,); db_hh (3n,);
                  db_z (n,); dh0 (B, n) = dL/dy_0; da (T, B, 4n), dgh (T, B, 3n), dq (T, B, n):
                  the pre-activation gradients (module docstring; scratch, kept for the products
                  at the end; da is dL/du_t of u_t = W_ih x_t for a layer below).
    Updated:      dz (B, n): dL/dz_T from outside on entry (0 in the models, whose loss reads y
                  only), dL/dz_0 on return.
    Read:         dh_T (B, n) = dL/dy_T; hs, zs, gates
                  from the forward pass; x (T, B, m); W_hh (3n, n); W_z (n, n); dt;
                  dhs (T, B, n) (or (0, B, n)) and lengths (B,): common.py, "Sequences".
    Work split:   one thread per slice of batch rows for the reverse time loop; the weight
                  gradients as products over all T*B rows, split by rows.
    """
    T, B, m = x.shape
    n = W_z.shape[0]
    dh0[:, :] = dh_T              # the running dL/dy_t lives in dh0's buffer; it ends as dL/dy_0
    S = num_slices(B)
    for c in prange(S):
        b0, b1 = row_slice(c, S, B)
        mode = flush_denormals(dh0)      # float32: subnormals to zero (common.py)
        dy = dh0[b0:b1]
        # dz_r: the part of dL/dz_t that arrives through z_{t+1} (at t = T, the caller's)
        dz_r = dz[b0:b1]
        back_z = np.empty((b1 - b0, n), dtype=dh0.dtype)        # dq_t W_z
        back_y = np.empty((b1 - b0, n), dtype=dh0.dtype)        # dgh_t W_hh
        for t in range(T - 1, -1, -1):
            for row in range(b0, b1):
                if add_upstream(dy, dhs, da, t, row, b0, lengths):
                    dgh[t, row] = 0.0           # past the row's end: dy and dz pass on
                    dq[t, row] = 0.0
                    continue
                r = row - b0
                for j in range(n):
                    # forward was: (s, c, y_t) = lem_step(A1 + H1, W_z z_t + b_z + A3, y_{t-1})
                    # so:          dA1, dq and the direct part of dy_{t-1} by lem_step_backward
                    da1, dcand, dy_prev = lem_step_backward(
                        dy[r, j], gates[t, row, j], gates[t, row, 2 * n + j], hs[t, row, j], dt)
                    da1 = flush_subnormal(da1)
                    dcand = flush_subnormal(dcand)
                    da[t, row, j] = da1
                    dgh[t, row, j] = da1
                    da[t, row, 2 * n + j] = dcand
                    dq[t, row, j] = dcand
                    dy[r, j] = flush_subnormal(dy_prev)
            # forward was: y's candidate reads W_z z_t
            # so:          dL/dz_t = dz_r + dq_t W_z   (row form)
            np.dot(dq[t, b0:b1], W_z, back_z)
            for row in range(b0, b1):
                if t >= lengths[row]:
                    continue
                r = row - b0
                for j in range(n):
                    # forward was: (s, c, z_t) = lem_step(A2 + H2, A4 + H3, z_{t-1})
                    # so:          dA2, dA4 and dz_{t-1} by lem_step_backward
                    da2, da4, dz_prev = lem_step_backward(
                        dz_r[r, j] + back_z[r, j], gates[t, row, n + j],
                        gates[t, row, 3 * n + j], zs[t, row, j], dt)
                    da2 = flush_subnormal(da2)
                    da4 = flush_subnormal(da4)
                    da[t, row, n + j] = da2
                    dgh[t, row, n + j] = da2
                    da[t, row, 3 * n + j] = da4
                    dgh[t, row, 2 * n + j] = da4
                    dz_r[r, j] = flush_subnormal(dz_prev)
            # forward was: [H1 | H2 | H3] = W_hh y_{t-1} + b_hh
            # so:          dy_{t-1} += dgh_t W_hh   (row form)
            np.dot(dgh[t, b0:b1], W_hh, back_y)
            dy += back_y
        restore_fp_mode(mode)
    # 3. weight gradients over all steps at once
    da2d, dgh2d, dq2d = da.reshape(T * B, 4 * n), dgh.reshape(T * B, 3 * n), dq.reshape(T * B, n)
    matmul_tn_rows(dW_ih, da2d, x.reshape(T * B, m))          # dW_ih = sum_t da_t^T u_t
    matmul_tn_rows(dW_hh, dgh2d, hs[:T].reshape(T * B, n))    # dW_hh = sum_t dgh_t^T y_{t-1}
    matmul_tn_rows(dW_z, dq2d, zs[1:].reshape(T * B, n))      # dW_z = sum_t dq_t^T z_t
    sum_rows(db_ih, da2d)
    sum_rows(db_hh, dgh2d)
    sum_rows(db_z, dq2d)


# ------------------------------------------------------------------------------------------
# GPU twins, version 1: one thread per (row, j), two launches per step, one per phase (BPTT:
# four, each phase's elementwise part and its product). The host functions take the CPU twins'
# arguments (device arrays), then keyword-only launch options. Every kernel calls the CPU twins'
# `lem_step` and `lem_step_backward`. The CPU twins flush float32 subnormal gradients to zero (a
# CPU speed measure); the GPU twins keep them (a difference below 1.2e-38).
# ------------------------------------------------------------------------------------------

@cuda.jit(cache=True)
def lem_z_step_kernel(hs, zs, gates, x, W_ih, WT, b_ih, b_hh, dt, t, lengths):
    """Step t's first phase: z's step, and y's gate and candidate pre-activations but for W_z z_t.
    Written (=): zs[t+1] (B, n); gates[t]: z's gate and candidate (blocks 1 and 3), and, for
    lem_y_step_kernel, A1 + H1 (block 0) and A3 (block 2), the pre-activations. Past row r's end
    (lengths): y and z hold (hs[t+1], zs[t+1]) and the gates are 0.
    Read: hs[t], zs[t], x[t], W_ih (4n, m), WT = W_hh^T (n, 3n), b_ih (4n,), b_hh (3n,), dt.
    One thread per (row, j); 2-d grid over (j, row)."""
    j, row = cuda.grid(2)
    B, n, m = hs.shape[1], hs.shape[2], x.shape[2]
    if row < B and j < n and hold_unit(hs, gates, t, row, j, lengths):
        zs[t + 1, row, j] = zs[t, row, j]
        for k in range(1, 4):
            gates[t, row, k * n + j] = 0
        return
    if row < B and j < n:
        a1 = b_ih[j] + b_hh[j]
        a2 = b_ih[n + j] + b_hh[n + j]
        a3 = b_ih[2 * n + j]
        a4 = b_ih[3 * n + j] + b_hh[2 * n + j]
        for k in range(m):
            xk = x[t, row, k]
            a1 += W_ih[j, k] * xk
            a2 += W_ih[n + j, k] * xk
            a3 += W_ih[2 * n + j, k] * xk
            a4 += W_ih[3 * n + j, k] * xk
        for k in range(n):
            yk = hs[t, row, k]                  # W_hh[G n + j, k] y_{t-1}[row, k], block G
            a1 += WT[k, j] * yk
            a2 += WT[k, n + j] * yk
            a4 += WT[k, 2 * n + j] * yk
        s, cand, z = lem_step(a2, a4, zs[t, row, j], dt)
        gates[t, row, j] = a1
        gates[t, row, n + j] = s
        gates[t, row, 2 * n + j] = a3
        gates[t, row, 3 * n + j] = cand
        zs[t + 1, row, j] = z


@cuda.jit(cache=True)
def lem_y_step_kernel(hs, zs, gates, WzT, b_z, dt, t, lengths):
    """Step t's second phase: y's step, reading the new z_t (all of lem_z_step_kernel's).
    Written (=): hs[t+1] (B, n); gates[t]: y's gate and candidate (blocks 0 and 2, in place of
    the pre-activations the first phase left there). Rows past their end are left as the first
    phase held them. Read: hs[t], zs[t+1], WzT = W_z^T (n, n), b_z (n,), dt.
    One thread per (row, j); 2-d grid over (j, row)."""
    j, row = cuda.grid(2)
    B, n = hs.shape[1], hs.shape[2]
    if row < B and j < n and t < lengths[row]:
        a = gates[t, row, 2 * n + j] + b_z[j]
        for k in range(n):
            a += WzT[k, j] * zs[t + 1, row, k]          # W_z[j, k] z_t[row, k]
        s, cand, y = lem_step(gates[t, row, j], a, hs[t, row, j], dt)
        gates[t, row, j] = s
        gates[t, row, 2 * n + j] = cand
        hs[t + 1, row, j] = y


@cuda.jit(cache=True)
def lem_backward_y_kernel(da, dgh, dq, dy, gates, hs, dt, t, dhs, lengths):
    """BPTT's first phase at step t: through y's step (lem_step_backward).
    Written (=): da[t] blocks 0 and 2, dgh[t] block 0, dq[t] (all of da[t], dgh[t], dq[t] = 0
    past row r's end). Updated: dy (B, n), dL/dy_t from the later steps (dhs[t] added:
    gpu_common.upstream) -> its direct part of dL/dy_{t-1} (all of it past the row's end).
    Read: gates[t], hs[t]. One thread per (row, j)."""
    j, row = cuda.grid(2)
    B, n = dy.shape
    if row < B and j < n:
        g = upstream(dy, dhs, t, row, j)
        if t >= lengths[row]:
            for k in range(4):
                da[t, row, k * n + j] = 0
            for k in range(3):
                dgh[t, row, k * n + j] = 0
            dq[t, row, j] = 0
            dy[row, j] = g
            return
        da1, dcand, dy_prev = lem_step_backward(g, gates[t, row, j], gates[t, row, 2 * n + j],
                                                hs[t, row, j], dt)
        da[t, row, j] = da1
        dgh[t, row, j] = da1
        da[t, row, 2 * n + j] = dcand
        dq[t, row, j] = dcand
        dy[row, j] = dy_prev


@cuda.jit(cache=True)
def lem_backward_z_kernel(da, dgh, dz, gates, zs, dt, t, lengths):
    """BPTT's second phase at step t: through z's step (lem_step_backward), after dz has
    received dq_t W_z. Written (=): da[t] blocks 1 and 3, dgh[t] blocks 1 and 2. Updated: dz
    (B, n), all of dL/dz_t -> its direct part of dL/dz_{t-1} (past row r's end it passes on).
    Read: gates[t], zs[t]. One thread per (row, j)."""
    j, row = cuda.grid(2)
    B, n = dz.shape
    if row < B and j < n and t < lengths[row]:
        da2, da4, dz_prev = lem_step_backward(dz[row, j], gates[t, row, n + j],
                                              gates[t, row, 3 * n + j], zs[t, row, j], dt)
        da[t, row, n + j] = da2
        dgh[t, row, n + j] = da2
        da[t, row, 3 * n + j] = da4
        dgh[t, row, 2 * n + j] = da4
        dz[row, j] = dz_prev


def lem_forward_gpu(hs, zs, gates, x, W_ih, W_hh, W_z, b_ih, b_hh, b_z, dt, lengths, *,
                    block=(128, 1)):
    """Version 1 twin of lem_forward_cpu: per step lem_z_step_kernel, then lem_y_step_kernel.
    Written (=): hs[1:], zs[1:], gates. Read: hs[0], zs[0], x, the parameters, dt, lengths."""
    T, B, _ = x.shape
    grid, block = step_grid(B, W_z.shape[0], block)
    WT, WzT = transposed(W_hh, "lem_WT"), transposed(W_z, "lem_WzT")
    dt = hs.dtype.type(dt)
    for t in range(T):
        lem_z_step_kernel[grid, block](hs, zs, gates, x, W_ih, WT, b_ih, b_hh, dt, t, lengths)
        lem_y_step_kernel[grid, block](hs, zs, gates, WzT, b_z, dt, t, lengths)


def lem_backward_gpu(dW_ih, dW_hh, dW_z, db_ih, db_hh, db_z, dh0, dz, da, dgh, dq, dh_T, hs,
                     zs, gates, x, W_hh, W_z, dt, dhs, lengths, *, block=(128, 1), tile=TILE):
    """Version 1 twin of lem_backward_cpu: per step lem_backward_y_kernel, dz += dq_t W_z,
    lem_backward_z_kernel, dy += dgh_t W_hh (rows_times_matrix_gpu); then the weight gradients
    as products over all steps. Written (=): the six gradients, dh0, da, dgh, dq. Updated: dz
    (dL/dz_T in, dL/dz_0 out)."""
    T, B, m = x.shape
    n = W_z.shape[0]
    grid, block = step_grid(B, n, block)
    dt = dh0.dtype.type(dt)
    # dz: dL/dz_t through z_{t+1}, the caller's dL/dz_T at t = T; it ends as dL/dz_0
    dh0.copy_to_device(dh_T)              # the running dL/dy_t lives in dh0; it ends as dL/dy_0
    for t in range(T - 1, -1, -1):
        lem_backward_y_kernel[grid, block](da, dgh, dq, dh0, gates, hs, dt, t, dhs, lengths)
        rows_times_matrix_gpu(dz, dq, W_z, t, True, block=block)
        lem_backward_z_kernel[grid, block](da, dgh, dz, gates, zs, dt, t, lengths)
        rows_times_matrix_gpu(dh0, dgh, W_hh, t, True, block=block)
    DA, DGH, DQ = da.reshape(T * B, 4 * n), dgh.reshape(T * B, 3 * n), dq.reshape(T * B, n)
    matmul_tn_gpu(dW_ih, DA, x.reshape(T * B, m), tile=tile)         # dW_ih = DA^T X
    matmul_tn_gpu(dW_hh, DGH, hs[:T].reshape(T * B, n), tile=tile)   # dW_hh = DGH^T Y
    matmul_tn_gpu(dW_z, DQ, zs[1:].reshape(T * B, n), tile=tile)     # dW_z = DQ^T Z
    column_sums_gpu(db_ih, DA, tile=tile)                            # db_ih = DA^T 1
    column_sums_gpu(db_hh, DGH, tile=tile)                           # db_hh = DGH^T 1
    column_sums_gpu(db_z, DQ, tile=tile)                             # db_z = DQ^T 1


# the twins, as nprnn/core/backends.py runs them: the CPU kernels and GPU version 1
lem_forward = Twins(lem_forward_cpu, lem_forward_gpu)
lem_backward = Twins(lem_backward_cpu, lem_backward_gpu)

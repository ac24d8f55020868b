"""The coupled oscillatory RNN (coRNN; Rusch & Mishra, ICLR 2021): forward pass and BPTT kernels.

coRNN is a time discretisation of a network of damped, driven oscillators (the paper's eq. 1,
y'' = tanh(W y + W_z y' + V u + b) - gamma y - epsilon y'), written as a first-order system in
the position y and the velocity z = y' (eq. 2) and stepped with a time step dt (eq. 3). Its
official code computes, for every step t = 1 .. T:

    a_t = W y_{t-1} + W_z z_{t-1} + V u_t + b
    s_t = tanh(a_t)
    z_t = z_{t-1} + dt (s_t - gamma y_{t-1} - epsilon z_{t-1})          (the code's form)
    y_t = y_{t-1} + dt z_t

with u_t the input x_t. The readout reads y (y plays the role of h: the models' hs holds y_0 ..
y_T); z is internal, as an LSTM's c is: the models start it at z_0 = 0 and their loss reads y
alone, but the kernels take any z_0 and dL/dz_T (nprnn.torch passes them). The paper's eq. (3)
is the IMEX form: the damping acts on the NEW velocity,

    z_t = z_{t-1} + dt (s_t - gamma y_{t-1}) - dt epsilon z_t
        = (z_{t-1} + dt (s_t - gamma y_{t-1})) / (1 + dt epsilon)                     (IMEX)

which is the code's form with z's step dt_z = dt / (1 + dt epsilon) in place of dt:

    z_t = z_{t-1} + dt_z (s_t - gamma y_{t-1} - epsilon z_{t-1}),    y_t = y_{t-1} + dt z_t

(expand the quotient: z_{t-1} + dt_z (s_t - gamma y_{t-1}) - dt_z epsilon z_{t-1}). So every
kernel here takes both steps, dt (y's) and dt_z (z's): dt_z = dt runs the code's form, dt_z =
dt / (1 + dt epsilon) the IMEX form (`successors.CoRNNCell` passes one or the other; the float64
oracle, nprnn/core/reference.py, writes each form as it is).

Parameters, the paper's names: W (n, n) acting on y, W_z (n, n) acting on z (the paper's
script W), V (n, m), b (n,). The official code holds [V | W_z | W] as one Linear over (u, z, y):
`successors.CoRNNCell.from_official` splits it.

Shapes: B batch, T time, m input size, n hidden size. Time-major: x (T, B, m); hs, zs
(T+1, B, n) with hs[0] = y_0 and zs[0] = z_0 given by the caller; th (T, B, n)
keeps s_t for BPTT. dt, dt_z, gamma, epsilon are scalars of the arrays' dtype, so that float32
kernels compute in float32 (no literal enters the arithmetic).

How the CPU work is split (the recipe of `antisym.py` and `lstm.py`):
  1. one (T*B, m) @ (m, n) product for the input projections V u_t of all T steps;
  2. one thread per slice of batch rows runs all T steps of its slice: per step two (B_slice, n)
     @ (n, n) products, y_{t-1} W^T and z_{t-1} W_z^T, then one fused elementwise pass;
  3. in BPTT, the same slices run the reverse time loop with two (B_slice, n) @ (n, n) products
     per step (da_t W and da_t W_z), and the weight gradients are products over all stored steps:
     dW = DA^T Y, dW_z = DA^T Z, dV = DA^T X with DA, Y, Z (T*B, n), X (T*B, m).

A map of this file: the unit's step and its derivative (`cornn_unit`, `cornn_unit_backward`),
written once for every version; the CPU twins (`cornn_forward_cpu`, `cornn_backward_cpu`); GPU
version 1, one thread per (batch row, unit) and one launch per step; the twins (`Twins`).
"""
import numpy as np
from numba import prange

from .common import (Twins, add_upstream, dtanh_from_y, flush_denormals, flush_subnormal,
                     hold_state, matmul_nt_rows, matmul_tn_rows, njit_inline, njit_parallel,
                     num_slices, restore_fp_mode, row_slice, sum_rows, tanh)
from .gpu_common import (TILE, column_sums_gpu, cuda, hold_unit, matmul_tn_gpu,
                         rows_times_matrix_gpu, step_grid, transposed, upstream)

# The kinds of this file's kernel arguments that tests/test_ptx.py does not know: the states and
# their gradients, the transposed matrices, and the four scalars, all of the model's dtype
# (gamma included: the Euler kernels' gamma, a Python float, builds their matrix A once per pass;
# here it enters every unit's step).
ARG_KINDS = {"zs": "3", "dy": "2", "dz": "2", "WzT": "2", "dt": "f", "dt_z": "f", "gamma": "f",
             "epsilon": "f"}


# ------------------------------------------------------------------------------------------
# The unit's math, shared by the CPU and the GPU twins
# ------------------------------------------------------------------------------------------

@njit_inline
def cornn_unit(a, y_prev, z_prev, dt, dt_z, gamma, epsilon):
    """One unit of one step, from its pre-activation a_t = W y_{t-1} + W_z z_{t-1} + V u_t + b:
        s_t = tanh(a_t)
        z_t = z_{t-1} + dt_z (s_t - gamma y_{t-1} - epsilon z_{t-1})
        y_t = y_{t-1} + dt z_t
    (dt_z = dt: the code's form; dt / (1 + dt epsilon): the IMEX form). Returns (s_t, y_t, z_t)."""
    s = tanh(a)
    z = z_prev + dt_z * (s - gamma * y_prev - epsilon * z_prev)
    return s, y_prev + dt * z, z


@njit_inline
def cornn_unit_backward(dy, dz, s, dt, dt_z, gamma, epsilon):
    """BPTT through cornn_unit, given dy = dL/dy_t (all of it) and dz, the part of dL/dz_t that
    arrives through z_{t+1} and y_{t+1}'s step (0 at t = T).

    forward was: y_t = y_{t-1} + dt z_t
    so:          dL/dz_t = dz + dt dy ;  dy_{t-1} = dy (+ the terms below)
    forward was: z_t = z_{t-1} + dt_z (s_t - gamma y_{t-1} - epsilon z_{t-1}),  s_t = tanh(a_t)
    so:          da_t = dL/dz_t dt_z (1 - s_t**2)
                 dy_{t-1} = dy - dL/dz_t dt_z gamma ;  dz_{t-1} = dL/dz_t - dL/dz_t dt_z epsilon
                 (the parts through a_t, da_t W and da_t W_z, are added by the callers' products)
    Returns (da_t, dy_{t-1}, dz_{t-1}) without the parts through a_t."""
    dz_t = dz + dt * dy
    g = dz_t * dt_z                                  # dL/ds_t
    return g * dtanh_from_y(s), dy - g * gamma, dz_t - g * epsilon


# ------------------------------------------------------------------------------------------
# CPU twins: whole sequences
# ------------------------------------------------------------------------------------------

@njit_parallel
def cornn_forward_cpu(hs, zs, th, x, W, W_z, V, b, dt, dt_z, gamma, epsilon, lengths):
    """Forward pass over a whole sequence (module docstring).

    Written (=):  hs[1:], zs[1:] of (T+1, B, n): y_t and z_t; th (T, B, n): s_t.
    Read:         hs[0], zs[0] (B, n) = y_0, z_0; x (T, B, m); W, W_z (n, n); V (n, m); b (n,);
                  dt, dt_z, gamma, epsilon; lengths (B,): past row r's end y and z hold and
                  th = 0 (common.py, "Sequences").
    Work split:   one thread per slice of batch rows, each running all T steps.
    """
    T, B, m = x.shape
    n = W.shape[0]
    # 1. input projections of all steps at once; th[t] holds V u_t until step t overwrites it
    matmul_nt_rows(th.reshape(T * B, n), x.reshape(T * B, m), V)
    S = num_slices(B)
    for c in prange(S):
        b0, b1 = row_slice(c, S, B)
        Wy = np.empty((b1 - b0, n), dtype=hs.dtype)
        Wz = np.empty((b1 - b0, n), dtype=hs.dtype)
        for t in range(T):
            # 2. recurrence: row r of Wy is W y_{t-1}[r], of Wz W_z z_{t-1}[r]
            np.dot(hs[t, b0:b1], W.T, Wy)
            np.dot(zs[t, b0:b1], W_z.T, Wz)
            for row in range(b0, b1):
                if t >= lengths[row]:                    # past the row's end: y, z hold
                    hold_state(hs, th, t, row)
                    zs[t + 1, row] = zs[t, row]
                    continue
                r = row - b0
                for j in range(n):
                    s, y, z = cornn_unit(th[t, row, j] + Wy[r, j] + Wz[r, j] + b[j],
                                         hs[t, row, j], zs[t, row, j], dt, dt_z, gamma, epsilon)
                    th[t, row, j] = s
                    hs[t + 1, row, j] = y
                    zs[t + 1, row, j] = z


@njit_parallel
def cornn_backward_cpu(dW, dW_z, dV, db, dh0, dz, da, dh_T, hs, zs, th, x, W, W_z, dt, dt_z,
                       gamma, epsilon, dhs, lengths):
    """BPTT over the whole sequence.

    Written (=):  dW, dW_z (n, n); dV (n, m); db (n,); dh0 (B, n) = dL/dy_0; da (T, B, n) =
                  dL/da_t (scratch, kept for the products at the end, and dL/du_t of u_t = V x_t
                  for a layer below).
    Updated:      dz (B, n): dL/dz_T from outside on entry (0 in the models, whose loss reads y
                  only), dL/dz_0 on return.
    Read:         dh_T (B, n) = dL/dy_T; hs, zs, th from
                  the forward pass; x (T, B, m); W, W_z (n, n); dt, dt_z, gamma, epsilon;
                  dhs (T, B, n) (or (0, B, n)) and lengths (B,): common.py, "Sequences".
    Work split:   one thread per slice of batch rows for the reverse time loop; the weight
                  gradients as products over all T*B rows, split by rows.
    """
    T, B, m = x.shape
    n = W.shape[0]
    dh0[:, :] = dh_T              # the running dL/dy_t lives in dh0's buffer; it ends as dL/dy_0
    S = num_slices(B)
    for c in prange(S):
        b0, b1 = row_slice(c, S, B)
        mode = flush_denormals(dh0)      # float32: subnormals to zero (common.py)
        dy = dh0[b0:b1]
        # dz_r: the part of dL/dz_t that arrives through step t + 1 (at t = T, the caller's)
        dz_r = dz[b0:b1]
        back = np.empty((b1 - b0, n), dtype=dh0.dtype)    # da_t W, then da_t W_z
        for t in range(T - 1, -1, -1):
            for row in range(b0, b1):
                if add_upstream(dy, dhs, da, t, row, b0, lengths):
                    continue                    # past the row's end: dy and dz pass on
                r = row - b0
                for j in range(n):
                    # forward was: (s_t, y_t, z_t) = cornn_unit(a_t, y_{t-1}, z_{t-1}, ...)
                    # so:          da_t and the direct parts of dy_{t-1}, dz_{t-1} by
                    #              cornn_unit_backward
                    g, dy_prev, dz_prev = cornn_unit_backward(dy[r, j], dz_r[r, j],
                                                              th[t, row, j], dt, dt_z, gamma,
                                                              epsilon)
                    da[t, row, j] = flush_subnormal(g)
                    dy[r, j] = flush_subnormal(dy_prev)
                    dz_r[r, j] = flush_subnormal(dz_prev)
            # forward was: a_t = W y_{t-1} + W_z z_{t-1} + V u_t + b
            # so:          dy_{t-1} += da_t W ;  dz_{t-1} += da_t W_z   (row form)
            np.dot(da[t, b0:b1], W, back)
            dy += back
            np.dot(da[t, b0:b1], W_z, back)
            dz_r += back
        restore_fp_mode(mode)
    # 3. weight gradients over all steps at once
    da2 = da.reshape(T * B, n)
    matmul_tn_rows(dW, da2, hs[:T].reshape(T * B, n))      # dW = sum_t da_t^T y_{t-1}
    matmul_tn_rows(dW_z, da2, zs[:T].reshape(T * B, n))    # dW_z = sum_t da_t^T z_{t-1}
    matmul_tn_rows(dV, da2, x.reshape(T * B, m))           # dV = sum_t da_t^T u_t
    sum_rows(db, da2)                                      # db = sum_t sum_rows da_t


# ------------------------------------------------------------------------------------------
# GPU twins, version 1: one thread per (row, j), one launch per step (BPTT: three per step, the
# elementwise part, then dy_{t-1} += da_t W and dz_{t-1} += da_t W_z). The host functions take
# the CPU twins' arguments (device arrays), then keyword-only launch options. Both call the CPU
# twins' `cornn_unit` and `cornn_unit_backward`. The CPU twins flush float32 subnormal gradients
# to zero (a CPU speed measure); the GPU twins keep them (a difference below 1.2e-38).
# ------------------------------------------------------------------------------------------

@cuda.jit(cache=True)
def cornn_forward_step_kernel(hs, zs, th, x, WT, WzT, V, b, dt, dt_z, gamma, epsilon, t,
                              lengths):
    """Step t, see cornn_unit. Written (=): th[t], hs[t+1], zs[t+1] (B, n). Read: hs[t], zs[t],
    x[t], WT = W^T and WzT = W_z^T (n, n), V (n, m), b (n,), the scalars, lengths (B,) (past
    row r's end y and z hold and th is 0). One thread per (row, j); 2-d grid over (j, row). The
    matrices are read transposed: for each k the threads of a warp read consecutive WT[k, j]."""
    j, row = cuda.grid(2)
    B, n, m = hs.shape[1], hs.shape[2], x.shape[2]
    if row < B and j < n and hold_unit(hs, th, t, row, j, lengths):
        zs[t + 1, row, j] = zs[t, row, j]
        return
    if row < B and j < n:
        a = b[j]
        for k in range(m):
            a += V[j, k] * x[t, row, k]
        for k in range(n):
            # W[j, k] y_{t-1}[row, k] + W_z[j, k] z_{t-1}[row, k]
            a += WT[k, j] * hs[t, row, k] + WzT[k, j] * zs[t, row, k]
        s, y, z = cornn_unit(a, hs[t, row, j], zs[t, row, j], dt, dt_z, gamma, epsilon)
        th[t, row, j] = s
        hs[t + 1, row, j] = y
        zs[t + 1, row, j] = z


@cuda.jit(cache=True)
def cornn_backward_unit_kernel(da, dy, dz, th, dt, dt_z, gamma, epsilon, t, dhs, lengths):
    """The elementwise part of BPTT through step t (cornn_unit_backward).
    Written (=): da[t] (B, n). Updated: dy (B, n), dL/dy_t from the later steps (dhs[t] added:
    gpu_common.upstream) -> the part of dL/dy_{t-1} that skips W; dz (B, n), the part of dL/dz_t
    through step t + 1 -> the part of dL/dz_{t-1} that skips W_z. Past row r's end (lengths)
    da_t = 0 and dy, dz pass on. Read: th[t]. One thread per (row, j)."""
    j, row = cuda.grid(2)
    B, n = dy.shape
    if row < B and j < n:
        g = upstream(dy, dhs, t, row, j)
        if t >= lengths[row]:
            da[t, row, j] = 0
            dy[row, j] = g
            return
        d, dy_prev, dz_prev = cornn_unit_backward(g, dz[row, j], th[t, row, j], dt, dt_z, gamma,
                                                  epsilon)
        da[t, row, j] = d
        dy[row, j] = dy_prev
        dz[row, j] = dz_prev


def cornn_forward_gpu(hs, zs, th, x, W, W_z, V, b, dt, dt_z, gamma, epsilon, lengths, *,
                      block=(128, 1)):
    """Version 1 twin of cornn_forward_cpu: T launches of cornn_forward_step_kernel.
    Written (=): hs[1:], zs[1:], th. Read: hs[0], zs[0], x, W, W_z, V, b, the scalars, lengths."""
    T, B, _ = x.shape
    grid, block = step_grid(B, W.shape[0], block)
    WT, WzT = transposed(W, "cornn_WT"), transposed(W_z, "cornn_WzT")
    dt, dt_z, gamma, epsilon = (hs.dtype.type(v) for v in (dt, dt_z, gamma, epsilon))
    for t in range(T):
        cornn_forward_step_kernel[grid, block](hs, zs, th, x, WT, WzT, V, b, dt, dt_z, gamma,
                                               epsilon, t, lengths)


def cornn_backward_gpu(dW, dW_z, dV, db, dh0, dz, da, dh_T, hs, zs, th, x, W, W_z, dt, dt_z,
                       gamma, epsilon, dhs, lengths, *, block=(128, 1), tile=TILE):
    """Version 1 twin of cornn_backward_cpu: per step cornn_backward_unit_kernel, then
    dy_{t-1} += da_t W and dz_{t-1} += da_t W_z (rows_times_matrix_gpu); then the weight
    gradients as products over all steps. Written (=): dW, dW_z, dV, db, dh0, da. Updated: dz
    (dL/dz_T in, dL/dz_0 out)."""
    T, B, m = x.shape
    n = W.shape[0]
    grid, block = step_grid(B, n, block)
    dt, dt_z, gamma, epsilon = (dh0.dtype.type(v) for v in (dt, dt_z, gamma, epsilon))
    # dz: dL/dz_t through step t + 1, the caller's dL/dz_T at t = T; it ends as dL/dz_0
    dh0.copy_to_device(dh_T)              # the running dL/dy_t lives in dh0; it ends as dL/dy_0
    for t in range(T - 1, -1, -1):
        cornn_backward_unit_kernel[grid, block](da, dh0, dz, th, dt, dt_z, gamma, epsilon, t,
                                                dhs, lengths)
        rows_times_matrix_gpu(dh0, da, W, t, True, block=block)
        rows_times_matrix_gpu(dz, da, W_z, t, True, block=block)
    DA = da.reshape(T * B, n)
    matmul_tn_gpu(dW, DA, hs[:T].reshape(T * B, n), tile=tile)       # dW = DA^T Y
    matmul_tn_gpu(dW_z, DA, zs[:T].reshape(T * B, n), tile=tile)     # dW_z = DA^T Z
    matmul_tn_gpu(dV, DA, x.reshape(T * B, m), tile=tile)            # dV = DA^T X
    column_sums_gpu(db, DA, tile=tile)                               # db = DA^T 1


# the twins, as nprnn/core/backends.py runs them: the CPU kernels and GPU version 1
cornn_forward = Twins(cornn_forward_cpu, cornn_forward_gpu)
cornn_backward = Twins(cornn_backward_cpu, cornn_backward_gpu)

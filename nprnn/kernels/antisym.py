"""AntisymmetricRNN and its Euler-family relatives: forward pass and BPTT kernels.

The models of this family are one forward-Euler step (eq. 3) of an ODE h' = f(h, x)
(eqs. 1, 8). The paper's W_h is our parameter W:

    (12) h_t = h_{t-1} + eps * tanh((W - W^T - gamma I) h_{t-1} + V_h x_t + b_h)
    (13) z_t = sigmoid((W - W^T - gamma I) h_{t-1} + V_z x_t + b_z)
         h_t = h_{t-1} + eps * z_t o tanh((W - W^T - gamma I) h_{t-1} + V_h x_t + b_h)

    ablation (section 5.4): (13) with W - W^T replaced by an unstructured W
    feedback (section 4):   (12) with W - W^T - gamma I replaced by an unstructured W
    antisym-xgate:          (13) with z_t = sigmoid(V_z x_t + b_z) (not in the paper; `kz`)

so the kernels take the recurrent matrix A (n, n) ready-made and do not know which model they
serve. A is built from the parameter W by `antisym_matrix_cpu` below (A = W - W^T - gamma I, the
antisymmetric models, whose W is strictly upper triangular or, in the "full" form, a full n x n
matrix: the paper's W_h in R^{n x n}) or `shifted_matrix_cpu` (A = W - gamma I, ablation), and dA is turned back
into dW by `antisym_dW_cpu`; `cells.EulerCell` calls them (feedback uses W itself).

Shapes: B batch, T time, m input size, n hidden size. Kernels are time-major: x is (T, B, m) so
that the rows of one step are contiguous, and hs is (T+1, B, n) with hs[0] = h_0 given by the
caller (zero in the models). The paper writes one state as a column, A h; the kernels hold a
batch of states as the rows of a (B, n) array, where the same product is h A^T ("row form"). So
the backward line dh_{t-1} += A^T da_t (column form, in the GPU docstrings) is dh += da_t A in
row form (the CPU code): the same numbers.

How the CPU work is split (the standard recipe, on threads that own batch rows):
  1. one large matrix product for the input projections of all T steps, (T*B, m) @ (m, n);
  2. the batch rows are split into slices of 64 (`common.SLICE_ROWS`, fixed so that the sums do
     not depend on the core count), which numba's threads share; a thread runs all T steps of a
     slice: per step one (B_slice, n) @ (n, n) product for the recurrence, then the elementwise
     work fused into one pass. Threads never wait for each other inside the time loop (see
     `common.py` for why BLAS itself is kept to one thread);
  3. in BPTT, the parameter gradients as one large product over all stored steps,
     dA = sum_t da_t^T h_{t-1} = DA^T H with DA, H reshaped to (T*B, n), split by rows.
`np.dot` inside `@njit` calls BLAS, so steps 1-3 run at BLAS speed with no Python in the loop.
"""
import functools
from typing import NamedTuple

import numpy as np
from numba import prange

from .common import (Twins, dsigmoid_from_y, dtanh_from_y, flush_denormals, matmul_nt_rows,
                     matmul_tn_rows, njit, njit_inline, njit_parallel, num_slices,
                     restore_fp_mode, row_slice, sigmoid, sum_rows, tanh)
from .gpu_common import (SHARED_BYTES_MAX, TILE, column_sums_gpu, cuda,
                         input_projection_gpu, lane_dot, lane_sum, load_block_rows,
                         load_lane_values, load_padded_rows, matmul_tn_gpu, matrix_launch,
                         persistent_grid, persistent_kernel, scratch, split_bound, split_kernel,
                         split_pass, step_grid, transposed, zero_shared)


# ------------------------------------------------------------------------------------------
# Building A from W, and dW from dA (tiny; shared by the CPU path and the GPU path's host code)
# ------------------------------------------------------------------------------------------

@njit
def antisym_matrix_cpu(A, W, gamma):
    """A = W - W^T - gamma I (eq. 12). A (n, n) written; W (n, n) strictly upper triangular."""
    n = W.shape[0]
    for i in range(n):
        for j in range(n):
            A[i, j] = W[i, j] - W[j, i]
        A[i, i] -= gamma


@njit
def shifted_matrix_cpu(A, W, gamma):
    """A = W - gamma I, the ablation model's matrix (section 5.4). A (n, n) written; W (n, n)."""
    n = W.shape[0]
    for i in range(n):
        for j in range(n):
            A[i, j] = W[i, j]
        A[i, i] -= gamma


@njit
def antisym_dW_cpu(dW, dA, triangle):
    """Undo A = W - W^T - gamma I: dW_ij = dA_ij - dA_ji. With `triangle` (W strictly upper
    triangular, the default form) only for i < j, and 0 on and below the diagonal, so that W
    stays so under any optimizer; else (a full W) for every i, j. dW written."""
    n = dA.shape[0]
    for i in range(n):
        for j in range(n):
            dW[i, j] = dA[i, j] - dA[j, i] if j > i or not triangle else 0.0


# ------------------------------------------------------------------------------------------
# The unit's math, shared by the CPU and the GPU twins of every version
# ------------------------------------------------------------------------------------------
# The kernels below differ in how they form the pre-activations (a BLAS product, a loop over the
# matrix in shared or global memory) and split the work; what one unit does with its
# pre-activations, and the derivative of that, is written once here.

@njit_inline
def euler_unit(a, h_prev, eps):
    """One unit of one step of (12), from its pre-activation a = A h_{t-1} + V_h x_t + b_h:
        y = tanh(a) ;  h_t = h_{t-1} + eps y
    Returns (y, h_t); y is kept for BPTT."""
    y = tanh(a)
    return y, h_prev + eps * y


@njit_inline
def euler_unit_backward(dh, y, eps):
    """BPTT through euler_unit, given dh = dL/dh_t and y = tanh(a_t).

    forward was: h_t = h_{t-1} + eps * y,  y = tanh(a_t)
    so:          da_t = dh_t * eps * (1 - y**2)   (and dh_{t-1} += dh_t, left to the caller)
    Returns da_t."""
    return dh * eps * dtanh_from_y(y)


# The gated kernels take kz, the share of A h_{t-1} in the gate's pre-activation
# zp = kz A h_{t-1} + V_z x_t + b_z: 1 in (13); 0 in antisym-xgate, whose gate reads x_t alone
# (not in the paper; with it the step's Jacobian is I + eps diag(z tanh'(a)) A, a positive
# diagonal times A, and eq. (5)'s criterion holds, which (13)'s gate breaks: analysis.py).

@njit_inline
def euler_gated_unit(a, zp, h_prev, eps):
    """One unit of one step of (13), from a = A h_{t-1} + V_h x_t + b_h and
    zp = kz A h_{t-1} + V_z x_t + b_z:
        y = tanh(a) ;  z = sigmoid(zp) ;  h_t = h_{t-1} + eps z y
    Returns (y, z, h_t); y and z are kept for BPTT."""
    z = sigmoid(zp)
    y = tanh(a)
    return y, z, h_prev + eps * z * y


@njit_inline
def euler_gated_unit_backward(dh, y, z, eps):
    """BPTT through euler_gated_unit, given dh = dL/dh_t, y = tanh(a_t), z = sigmoid(zp_t).

    forward was: h_t = h_{t-1} + eps * z * y
    so:          da_t  = dh_t * eps * z * (1 - y**2)
                 dzp_t = dh_t * eps * y * z * (1 - z)   (and dh_{t-1} += dh_t, left to the caller)
    Returns (da_t, dzp_t)."""
    g = dh * eps
    return g * z * dtanh_from_y(y), g * y * dsigmoid_from_y(z)


# ------------------------------------------------------------------------------------------
# CPU twins
# ------------------------------------------------------------------------------------------

@njit_parallel
def euler_forward_cpu(hs, th, x, A, V_h, b_h, eps):
    """Forward pass of (12) over a whole sequence.

    Written (=):  hs[1:] of (T+1, B, n) hidden states; th (T, B, n) = tanh(a_t), kept for BPTT.
    Read:         hs[0] (B, n) = h_0; x (T, B, m); A (n, n); V_h (n, m); b_h (n,).
    Work split:   one thread per slice of batch rows, each running all T steps.
    """
    T, B, m = x.shape
    n = A.shape[0]
    # 1. input projections of all steps at once; th holds V_h x_t until step t overwrites it
    matmul_nt_rows(th.reshape(T * B, n), x.reshape(T * B, m), V_h)
    S = num_slices(B)
    for c in prange(S):
        b0, b1 = row_slice(c, S, B)
        Ah = np.empty((b1 - b0, n), dtype=hs.dtype)
        for t in range(T):
            # 2. recurrence: Ah = h_{t-1} A^T, i.e. row b is A h_{t-1}[b]
            np.dot(hs[t, b0:b1], A.T, Ah)
            for b in range(b0, b1):
                for i in range(n):
                    # a_t = A h_{t-1} + V_h x_t + b_h ;  h_t = h_{t-1} + eps tanh(a_t)
                    y, h_new = euler_unit(Ah[b - b0, i] + th[t, b, i] + b_h[i], hs[t, b, i], eps)
                    th[t, b, i] = y
                    hs[t + 1, b, i] = h_new


@njit_parallel
def euler_backward_cpu(dA, dV_h, db_h, dh0, da, dh_T, hs, th, x, A, eps):
    """BPTT of (12) over the whole sequence.

    Written (=):  dA (n, n); dV_h (n, m); db_h (n,); dh0 (B, n) = dL/dh_0;
                  da (T, B, n) = dL/da_t (scratch, kept for the products at the end).
    Read:         dh_T (B, n) = dL/dh_T; hs, th from the forward pass; x (T, B, m); A (n, n).
    Work split:   one thread per slice of batch rows for the reverse time loop; the parameter
                  gradients as products over all T*B rows, split by rows.
    """
    T, B, m = x.shape
    n = A.shape[0]
    dh0[:, :] = dh_T              # the running dL/dh_t lives in dh0's buffer; it ends as dL/dh_0
    S = num_slices(B)
    for c in prange(S):
        b0, b1 = row_slice(c, S, B)
        mode = flush_denormals(dh0)      # float32: subnormals to zero (common.py)
        dh = dh0[b0:b1]
        dh_rec = np.empty((b1 - b0, n), dtype=dh0.dtype)  # the part of dh_{t-1} through A
        for t in range(T - 1, -1, -1):
            for b in range(b0, b1):
                for i in range(n):
                    # forward was: h_t = h_{t-1} + eps * tanh(a_t)            (euler_unit)
                    # so:          dh_{t-1} += dh_t ;  da_t = dh_t * eps * (1 - tanh(a_t)**2)
                    # (dh holds dh_t and becomes dh_{t-1} in place: the "+= dh_t" is free)
                    da[t, b, i] = euler_unit_backward(dh[b - b0, i], th[t, b, i], eps)
            # forward was: a_t = h_{t-1} A^T + x_t V_h^T + b_h   (row form: rows are batch rows)
            # so:          dh_{t-1} += da_t A
            np.dot(da[t, b0:b1], A, dh_rec)
            dh += dh_rec
        restore_fp_mode(mode)
    # 3. parameter gradients over all steps at once
    da2 = da.reshape(T * B, n)
    matmul_tn_rows(dA, da2, hs[:T].reshape(T * B, n))    # dA   = sum_t da_t^T h_{t-1}
    matmul_tn_rows(dV_h, da2, x.reshape(T * B, m))       # dV_h = sum_t da_t^T x_t
    sum_rows(db_h, da2)                                  # db_h = sum_t sum_b da_t


@njit_parallel
def euler_gated_forward_cpu(hs, th, z, x, A, V_h, b_h, V_z, b_z, eps, kz):
    """Forward pass of (13) over a whole sequence. The gate and the candidate share A h_{t-1}
    (the gate takes kz of it).

    Written (=):  hs[1:] of (T+1, B, n); th (T, B, n) = tanh(a_t); z (T, B, n) = z_t.
    Read:         hs[0] = h_0; x (T, B, m); A (n, n); V_h, V_z (n, m); b_h, b_z (n,).
    Work split:   one thread per slice of batch rows, each running all T steps.
    """
    T, B, m = x.shape
    n = A.shape[0]
    matmul_nt_rows(th.reshape(T * B, n), x.reshape(T * B, m), V_h)  # th holds V_h x_t for now
    matmul_nt_rows(z.reshape(T * B, n), x.reshape(T * B, m), V_z)   # z  holds V_z x_t for now
    S = num_slices(B)
    for c in prange(S):
        b0, b1 = row_slice(c, S, B)
        Ah = np.empty((b1 - b0, n), dtype=hs.dtype)
        for t in range(T):
            np.dot(hs[t, b0:b1], A.T, Ah)
            for b in range(b0, b1):
                for i in range(n):
                    # z_t = sigma(kz A h + V_z x + b_z) ;  y_t = tanh(A h + V_h x + b_h)
                    # h_t = h_{t-1} + eps z_t o y_t
                    y, zt, h_new = euler_gated_unit(Ah[b - b0, i] + th[t, b, i] + b_h[i],
                                                    kz * Ah[b - b0, i] + z[t, b, i] + b_z[i],
                                                    hs[t, b, i], eps)
                    z[t, b, i] = zt
                    th[t, b, i] = y
                    hs[t + 1, b, i] = h_new


@njit_parallel
def euler_gated_backward_cpu(dA, dV_h, db_h, dV_z, db_z, dh0, da, dzp, ds,
                             dh_T, hs, th, z, x, A, eps, kz):
    """BPTT of (13) over the whole sequence.

    Written (=):  dA (n, n); dV_h, dV_z (n, m); db_h, db_z (n,); dh0 (B, n) = dL/dh_0;
                  scratch da, dzp (T, B, n): dL/d(pre-activation) of candidate and gate;
                  ds = da + kz dzp (T, B, n), the total signal reaching A h_{t-1}.
    Read:         dh_T (B, n); hs, th, z from the forward pass; x (T, B, m); A (n, n).
    Work split:   as `euler_backward_cpu`.
    """
    T, B, m = x.shape
    n = A.shape[0]
    dh0[:, :] = dh_T
    S = num_slices(B)
    for c in prange(S):
        b0, b1 = row_slice(c, S, B)
        mode = flush_denormals(dh0)      # float32: subnormals to zero (common.py)
        dh = dh0[b0:b1]
        dh_rec = np.empty((b1 - b0, n), dtype=dh0.dtype)  # the part of dh_{t-1} through A
        for t in range(T - 1, -1, -1):
            for b in range(b0, b1):
                for i in range(n):
                    # forward was: h_t = h_{t-1} + eps * z_t * y_t,
                    #              y_t = tanh(a_t), z_t = sigma(zp_t)
                    # so:          dh_{t-1} += dh_t   (free: dh becomes dh_{t-1} in place)
                    #              da_t  = dh_t * eps * z_t * (1 - y_t**2)
                    #              dzp_t = dh_t * eps * y_t * z_t * (1 - z_t)
                    #              (euler_gated_unit_backward)
                    da_i, dzp_i = euler_gated_unit_backward(dh[b - b0, i], th[t, b, i],
                                                            z[t, b, i], eps)
                    da[t, b, i] = da_i
                    dzp[t, b, i] = dzp_i
                    ds[t, b, i] = da_i + kz * dzp_i
            # forward was: a_t = h_{t-1} A^T + ..., zp_t = kz h_{t-1} A^T + ...  (row form;
            #              both read h_{t-1} A^T)
            # so:          dh_{t-1} += (da_t + kz dzp_t) A
            np.dot(ds[t, b0:b1], A, dh_rec)
            dh += dh_rec
        restore_fp_mode(mode)
    x2 = x.reshape(T * B, m)
    matmul_tn_rows(dA, ds.reshape(T * B, n), hs[:T].reshape(T * B, n))  # sum_t ds_t^T h
    matmul_tn_rows(dV_h, da.reshape(T * B, n), x2)                      # sum_t da_t^T x_t
    matmul_tn_rows(dV_z, dzp.reshape(T * B, n), x2)                     # sum_t dzp_t^T x_t
    sum_rows(db_h, da.reshape(T * B, n))
    sum_rows(db_z, dzp.reshape(T * B, n))


# ------------------------------------------------------------------------------------------
# GPU twins
# ------------------------------------------------------------------------------------------
# Three versions of every pass, side by side (as llm.c's dev/cuda keeps its kernel versions), all
# checked against the CPU twins above by tests/gpu/test_gpu_euler.py:
#
#   version 1, "step"        one thread per (b, i) and one launch per time step. Obvious, and at
#                            n = 128 the T launches cost more than the arithmetic they run.
#   version 2, "persistent"  one launch runs all T steps (the persistent RNN of Diamos et al.,
#                            2016). Block k owns batch rows [k R, (k+1) R) and keeps its rows'
#                            state, and A where it fits, in shared memory for the whole
#                            sequence (A stays in global memory where it does not). Rows never
#                            exchange data, so blocks never wait for each other and
#                            cuda.syncthreads() is the only synchronisation: one per step.
#   version 3, "split"       as version 2, with several threads of a warp per unit, each
#                            holding its share of A in registers (below version 2).
#
# All versions end BPTT with the same parameter-gradient products as the CPU twins,
# dA = DA^T H, dV_h = DA^T X, db_h = DA^T 1, formed by `matmul_tn_gpu` (see gpu_common.py for
# why a tiled product over the stored steps and not an accumulation inside the BPTT kernel).
#
# Every version computes a unit's step and its derivative with the functions the CPU twins
# call (`euler_unit`, `euler_gated_unit` and their `_backward`s, above). Host functions named
# like the CPU twins (`euler_forward_gpu`, ...) take the CPU twin's arguments, all device
# arrays, followed by keyword-only launch options.

@cuda.jit
def antisym_matrix_kernel(A, W, gamma):
    """A = W - W^T - gamma I (written, =). One thread per (i, j); 2-d grid over (j, i)."""
    j, i = cuda.grid(2)
    n = W.shape[0]
    if i < n and j < n:
        a = W[i, j] - W[j, i]
        if i == j:
            a -= gamma
        A[i, j] = a


@cuda.jit
def shifted_matrix_kernel(A, W, gamma):
    """A = W - gamma I (written, =). One thread per (i, j); 2-d grid over (j, i)."""
    j, i = cuda.grid(2)
    n = W.shape[0]
    if i < n and j < n:
        A[i, j] = W[i, j] - gamma if i == j else W[i, j]


@cuda.jit
def antisym_dW_kernel(dW, dA, triangle):
    """dW_ij = dA_ij - dA_ji; with `triangle` above the diagonal only, 0 on and below it
    (written, =). One thread per (i, j); 2-d grid over (j, i)."""
    j, i = cuda.grid(2)
    n = dA.shape[0]
    if i < n and j < n:
        dW[i, j] = dA[i, j] - dA[j, i] if j > i or not triangle else 0


def antisym_matrix_gpu(A, W, gamma, *, block=(16, 16)):
    """Twin of antisym_matrix_cpu (device arrays): A = W - W^T - gamma I (written, =)."""
    n = W.shape[0]
    antisym_matrix_kernel[matrix_launch(n, n, block)](A, W, gamma)


def shifted_matrix_gpu(A, W, gamma, *, block=(16, 16)):
    """Twin of shifted_matrix_cpu (device arrays): A = W - gamma I (written, =)."""
    n = W.shape[0]
    shifted_matrix_kernel[matrix_launch(n, n, block)](A, W, gamma)


def antisym_dW_gpu(dW, dA, triangle, *, block=(16, 16)):
    """Twin of antisym_dW_cpu (device arrays): dW = dA - dA^T, with `triangle` on the strict
    upper triangle and 0 elsewhere (written, =)."""
    n = dA.shape[0]
    antisym_dW_kernel[matrix_launch(n, n, block)](dW, dA, triangle)


# -- version 1: one thread per (b, i), one launch per step ----------------------------------

@cuda.jit
def euler_forward_step_kernel(hs, th, x, AT, V_h, b_h, eps, t):
    """Step t of (12): a = A h_{t-1} + V_h x_t + b_h ; th_t = tanh(a) ; h_t = h_{t-1} + eps th_t.

    Written (=): th[t] (B, n), hs[t+1] (B, n). Read: hs[t], x[t] (B, m), AT (n, n) = A^T,
    V_h (n, m), b_h (n,). One thread per (b, i); 2-d grid over (i, b). A is read transposed so
    that for each j the threads of a warp read consecutive addresses, AT[j, i .. i+31] (one
    memory transaction, where A[i .. i+31, j] would be 32, n values apart).
    """
    i, b = cuda.grid(2)
    B, n, m = hs.shape[1], AT.shape[0], x.shape[2]
    if b < B and i < n:
        a = b_h[i]
        for j in range(n):
            a += AT[j, i] * hs[t, b, j]                          # A[i, j] h_{t-1}[b, j]
        for k in range(m):
            a += V_h[i, k] * x[t, b, k]
        y, h_new = euler_unit(a, hs[t, b, i], eps)
        th[t, b, i] = y
        hs[t + 1, b, i] = h_new


@cuda.jit
def euler_gated_forward_step_kernel(hs, th, z, x, AT, V_h, b_h, V_z, b_z, eps, kz, t):
    """Step t of (13): with s = A h_{t-1} (shared by gate and candidate),
    z_t = sigmoid(kz s + V_z x_t + b_z) ; th_t = tanh(s + V_h x_t + b_h) ;
    h_t = h_{t-1} + eps z_t th_t.

    Written (=): th[t], z[t], hs[t+1] (B, n). Read: hs[t], x[t], AT = A^T (read transposed as
    in euler_forward_step_kernel), V_h, b_h, V_z, b_z. One thread per (b, i); 2-d grid over
    (i, b).
    """
    i, b = cuda.grid(2)
    B, n, m = hs.shape[1], AT.shape[0], x.shape[2]
    if b < B and i < n:
        s = hs.dtype.type(0)
        for j in range(n):
            s += AT[j, i] * hs[t, b, j]                          # A[i, j] h_{t-1}[b, j]
        a = s + b_h[i]
        zp = kz * s + b_z[i]
        for k in range(m):
            a += V_h[i, k] * x[t, b, k]
            zp += V_z[i, k] * x[t, b, k]
        y, zt, h_new = euler_gated_unit(a, zp, hs[t, b, i], eps)
        z[t, b, i] = zt
        th[t, b, i] = y
        hs[t + 1, b, i] = h_new


@cuda.jit
def euler_backward_step_kernel(dh_prev, da, dh, th, A, eps, t):
    """BPTT through step t of (12).

    forward was: h_t = h_{t-1} + eps * tanh(a_t),   a_t = A h_{t-1} + V_h x_t + b_h
    so:          da_t = dh_t * eps * (1 - th_t**2) ;  dh_{t-1} = dh_t + A^T da_t

    Written (=): da[t] (B, n), dh_prev (B, n). Read: dh (B, n) = dL/dh_t, th[t], A.
    One thread per (b, i); 2-d grid over (i, b). dh_{t-1}[b, i] needs da_t[b, j] for every j,
    which other threads (maybe other blocks) own, and a launch has no barrier across blocks:
    so each thread recomputes the n values da_t[b, :] it needs. That is about three times the
    work of the n multiply-adds of A^T da_t alone: the price of having no barrier, which the
    persistent version 2 does not pay.
    """
    i, b = cuda.grid(2)
    B, n = dh.shape
    if b < B and i < n:
        acc = dh[b, i]
        for j in range(n):
            acc += euler_unit_backward(dh[b, j], th[t, b, j], eps) * A[j, i]
        da[t, b, i] = euler_unit_backward(dh[b, i], th[t, b, i], eps)
        dh_prev[b, i] = acc


@cuda.jit
def euler_gated_backward_step_kernel(dh_prev, da, dzp, ds, dh, th, z, A, eps, kz, t):
    """BPTT through step t of (13).

    forward was: h_t = h_{t-1} + eps * z_t * th_t,  th_t = tanh(a_t), z_t = sigmoid(zp_t),
                 a_t = A h_{t-1} + ...,  zp_t = kz A h_{t-1} + ...
    so:          da_t  = dh_t * eps * z_t * (1 - th_t**2)
                 dzp_t = dh_t * eps * th_t * z_t * (1 - z_t)
                 ds_t  = da_t + kz dzp_t ;   dh_{t-1} = dh_t + A^T ds_t

    Written (=): da[t], dzp[t], ds[t] (B, n), dh_prev (B, n). Read: dh = dL/dh_t, th[t], z[t], A.
    One thread per (b, i); 2-d grid over (i, b); ds_t[b, :] recomputed per thread as in
    euler_backward_step_kernel.
    """
    i, b = cuda.grid(2)
    B, n = dh.shape
    if b < B and i < n:
        acc = dh[b, i]
        for j in range(n):
            da_j, dzp_j = euler_gated_unit_backward(dh[b, j], th[t, b, j], z[t, b, j], eps)
            acc += (da_j + kz * dzp_j) * A[j, i]
        da_i, dzp_i = euler_gated_unit_backward(dh[b, i], th[t, b, i], z[t, b, i], eps)
        da[t, b, i] = da_i
        dzp[t, b, i] = dzp_i
        ds[t, b, i] = da_i + kz * dzp_i
        dh_prev[b, i] = acc


def euler_forward_gpu(hs, th, x, A, V_h, b_h, eps, *, block=(128, 1)):
    """Version 1 twin of euler_forward_cpu (same arguments, device arrays): T launches of
    euler_forward_step_kernel. Written (=): hs[1:], th. Read: hs[0] = h_0, x, A, V_h, b_h."""
    T, B, _ = x.shape
    grid, block = step_grid(B, A.shape[0], block)
    eps = hs.dtype.type(eps)
    AT = transposed(A)
    for t in range(T):
        euler_forward_step_kernel[grid, block](hs, th, x, AT, V_h, b_h, eps, t)


def euler_gated_forward_gpu(hs, th, z, x, A, V_h, b_h, V_z, b_z, eps, kz, *, block=(128, 1)):
    """Version 1 twin of euler_gated_forward_cpu: T launches of euler_gated_forward_step_kernel.
    Written (=): hs[1:], th, z. Read: hs[0], x, A, V_h, b_h, V_z, b_z."""
    T, B, _ = x.shape
    grid, block = step_grid(B, A.shape[0], block)
    eps, kz = hs.dtype.type(eps), hs.dtype.type(kz)
    AT = transposed(A)
    for t in range(T):
        euler_gated_forward_step_kernel[grid, block](hs, th, z, x, AT, V_h, b_h, V_z, b_z, eps,
                                                     kz, t)


def _backward_buffers(dh0, dh_T, T):
    """The running dL/dh_t alternates between dh0 and a scratch buffer, one step writing what
    the next reads; the order is chosen so that step t = 0 writes dh0. Returns (first input,
    the other buffer) after copying dh_T into the first input."""
    other = scratch("euler_dh", dh0.shape, dh0.dtype)
    first_in = other if T % 2 == 1 else dh0        # step t writes dh0 exactly when t is even
    first_in.copy_to_device(dh_T)
    return first_in, (dh0 if first_in is other else other)


def euler_backward_gpu(dA, dV_h, db_h, dh0, da, dh_T, hs, th, x, A, eps, *, block=(128, 1),
                       tile=TILE):
    """Version 1 twin of euler_backward_cpu (same arguments, device arrays): T launches of
    euler_backward_step_kernel, then the parameter-gradient products.
    Written (=): dA, dV_h, db_h, dh0, da. Read: dh_T, hs, th, x, A."""
    T, B, _ = x.shape
    grid, block = step_grid(B, A.shape[0], block)
    eps = dh0.dtype.type(eps)
    dh, dh_prev = _backward_buffers(dh0, dh_T, T)
    for t in range(T - 1, -1, -1):
        euler_backward_step_kernel[grid, block](dh_prev, da, dh, th, A, eps, t)
        dh, dh_prev = dh_prev, dh
    euler_param_grads_gpu(dA, dV_h, db_h, da, da, hs, x, tile=tile)


def euler_gated_backward_gpu(dA, dV_h, db_h, dV_z, db_z, dh0, da, dzp, ds,
                             dh_T, hs, th, z, x, A, eps, kz, *, block=(128, 1), tile=TILE):
    """Version 1 twin of euler_gated_backward_cpu: T launches of
    euler_gated_backward_step_kernel, then the parameter-gradient products.
    Written (=): dA, dV_h, db_h, dV_z, db_z, dh0, da, dzp, ds. Read: dh_T, hs, th, z, x, A."""
    T, B, _ = x.shape
    grid, block = step_grid(B, A.shape[0], block)
    eps, kz = dh0.dtype.type(eps), dh0.dtype.type(kz)
    dh, dh_prev = _backward_buffers(dh0, dh_T, T)
    for t in range(T - 1, -1, -1):
        euler_gated_backward_step_kernel[grid, block](dh_prev, da, dzp, ds, dh, th, z, A, eps,
                                                      kz, t)
        dh, dh_prev = dh_prev, dh
    euler_param_grads_gpu(dA, dV_h, db_h, ds, da, hs, x, tile=tile)
    euler_input_grads_gpu(dV_z, db_z, dzp, x, tile=tile)


def euler_input_grads_gpu(dV, db, da, x, *, tile=TILE):
    """dV = sum_t da_t^T x_t = DA^T X ; db = DA^T 1 (both written, =).
    dV (n, m), db (n,), da (T, B, n), x (T, B, m)."""
    T, B, m = x.shape
    n = da.shape[2]
    DA = da.reshape(T * B, n)
    matmul_tn_gpu(dV, DA, x.reshape(T * B, m), tile=tile)
    column_sums_gpu(db, DA, tile=tile)


def euler_param_grads_gpu(dA, dV_h, db_h, ds, da, hs, x, *, tile=TILE):
    """The products that end BPTT, as in the CPU twins (all written, =):
    dA = sum_t ds_t^T h_{t-1} = DS^T H ; dV_h = DA^T X ; db_h = DA^T 1.
    ds is the signal reaching A h_{t-1} (da for (12), da + dzp for (13)); ds, da (T, B, n),
    hs (T+1, B, n), x (T, B, m)."""
    T, B, _ = x.shape
    n = hs.shape[2]
    matmul_tn_gpu(dA, ds.reshape(T * B, n), hs[:T].reshape(T * B, n), tile=tile)
    euler_input_grads_gpu(dV_h, db_h, da, x, tile=tile)


# -- version 2: persistent, one launch per pass ----------------------------------------------
#
# Each step of a pass multiplies by the recurrent matrix once: the forward pass forms A h_{t-1},
# BPTT forms A^T d for its signal d. The kernels write both as one product, u = D^T v:
#
#     u_i = sum_j D[j, i] v[j]          thread i reads column i of D
#
# with D = A^T in the forward pass (the transposed copy the step kernels read too) and D = A in
# BPTT. For each j the threads of a warp read D[j, i .. i+31], consecutive addresses, wherever D
# is kept. Where the block finds D's values is the pass's `layout`:
#
# * "skew" (antisym, antisym-gated, antisym-xgate): D = S - gamma I with S antisymmetric (A is,
#   and so is A^T with S^T = -S in place of S). The n(n-1)/2 values of S above the diagonal, plus
#   gamma = -D[0, 0], determine D. They go to shared memory by diagonals,
#   P[diag_start(k) + i] = S[i, i + k] for k = 1 .. n-1, and thread i visits j = (i + k) mod n
#   for k = 1 .. n-1: above the diagonal S[i, j] = P[diag_start(k) + i], below it
#   S[i, j] = -S[j, i] = -P[diag_start(n - k) + j]. For a given k consecutive threads read
#   consecutive addresses in either case. Then u_i = -gamma v_i + (S^T v)_i = -gamma v_i - (S v)_i
#   (the forward pass's S is the transpose of BPTT's, so the same line gives A h and A^T d).
#   n = 128 in float32 needs 8128 * 4 bytes = 31.75 KiB.
# * "dense" (ablation, feedback): all n*n values in shared memory, M[j*n + i] = D[j, i].
#   n = 128 in float32 would need 64 KiB.
# * "global": D read in place from global memory, through the L1 and L2 caches, as the
#   baselines' persistent kernels read W_hh. Any matrix, antisymmetric or not, and no shared
#   memory for it: the passes of ablation and feedback at n = 128 in float32, and of antisym at
#   n = 256 (Table 2), run in one launch this way rather than in T.
#
# A block also keeps its rows' state vectors in shared memory (`buffers` vectors of n per row).
# Everything must fit in SHARED_BYTES_MAX (48 KiB). `persistent_layouts` lists the layouts that
# fit a pass, global first: on an NVIDIA H100 (B = 128, T = 784, n = 128, float32) antisym's
# forward+backward took 11.3 ms reading the matrix from global memory and 20.3 ms from the skew
# triangle in shared memory (docs/gpu.md). nprnn/autotune.py times them on the user's own GPU.

LAYOUTS = ("skew", "dense", "global")
SKEW, DENSE, GLOBAL = range(3)              # the kernels' `layout` argument: LAYOUTS.index(name)


@cuda.jit(device=True)
def matrix_values(n, layout):
    """How many values of the n x n matrix a block keeps in shared memory under `layout` (a
    code: SKEW, DENSE or GLOBAL). The host's `persistent_shared_bytes` counts with it too."""
    if layout == SKEW:
        return n * (n - 1) // 2
    if layout == DENSE:
        return n * n
    return 0


@cuda.jit(device=True)
def diag_start(k, n):
    """Offset of diagonal k (1 <= k < n) of the strict upper triangle in the packed layout:
    diagonals 1 .. k-1 come first and hold (n - 1) + ... + (n - k + 1) values."""
    return (k - 1) * n - (k - 1) * k // 2


@cuda.jit(device=True)
def skew_dot(P, v, i, n):
    """sum_{j != i} S[i, j] v[j] for the antisymmetric S packed by diagonals in P.

    Step k reads diagonal k (above S's diagonal) or diagonal n - k (below it). Their offsets,
    diag_start(k, n) and diag_start(n - k, n), are carried from one step to the next rather
    than recomputed: recomputing them (two 64-bit multiplies and a halving per step) was half
    the PTX instructions of the loop body."""
    acc = v.dtype.type(0)
    up = 0                          # diag_start(k, n) at k = 1
    down = n * (n - 1) // 2 - 1     # diag_start(n - k, n) at k = 1: the last diagonal, one value
    for k in range(1, n):
        j = i + k
        if j < n:                                   # above the diagonal: S[i, j]
            acc += P[up + i] * v[j]
        else:                                       # below: S[i, j] = -S[j, i], j = i + k - n
            j -= n
            acc -= P[down + j] * v[j]
        up += n - k                 # diagonal k holds n - k values
        down -= k + 1               # diagonal n - k - 1 holds k + 1 values
    return acc


@cuda.jit(device=True)
def dense_dot(M, v, i, n):
    """sum_j D[j, i] v[j] for the n x n matrix D held row by row in the flat array M."""
    acc = v.dtype.type(0)
    for j in range(n):
        acc += M[j * n + i] * v[j]
    return acc


@cuda.jit(device=True)
def column_dot(D, v, i, n):
    """sum_j D[j, i] v[j] for D (n, n) in global memory."""
    acc = v.dtype.type(0)
    for j in range(n):
        acc += D[j, i] * v[j]
    return acc


@cuda.jit(device=True)
def load_matrix(Msh, D, layout):
    """Copy what `layout` keeps of D into the block's shared memory, every thread taking a
    share (see the layouts above): skew -> P, the strict upper triangle of D by diagonals;
    dense -> M, all of D row by row; global -> nothing (D is read where it is)."""
    n = D.shape[0]
    tid, nthreads = cuda.threadIdx.x, cuda.blockDim.x
    if layout == SKEW:
        for k in range(1, n):
            for i in range(tid, n - k, nthreads):
                Msh[diag_start(k, n) + i] = D[i, i + k]
    elif layout == DENSE:
        for e in range(tid, n * n, nthreads):
            Msh[e] = D[e // n, e % n]


@cuda.jit(device=True)
def matrix_dot(Msh, D, v, i, n, layout, diag):
    """u_i = (D^T v)_i = sum_j D[j, i] v[j], reading D as `layout` says (load_matrix has filled
    Msh). skew: D = diag I + S with S antisymmetric and diag = D[0, 0], so
    (D^T v)_i = diag v_i - (S v)_i."""
    if layout == SKEW:
        return diag * v[i] - skew_dot(Msh, v, i, n)
    if layout == DENSE:
        return dense_dot(Msh, v, i, n)
    return column_dot(D, v, i, n)


def persistent_shared_bytes(n, rows, itemsize, layout, buffers):
    """Shared memory of one block of a persistent kernel: what `layout` keeps of the matrix
    (n(n-1)/2 values for skew, n*n for dense, none for global) plus `buffers` state vectors of
    n values per batch row."""
    matrix = matrix_values.py_func(n, LAYOUTS.index(_checked_layout(layout)))
    return (matrix + buffers * rows * n) * itemsize


FORWARD_BUFFERS = 2             # h_{t-1} and h_t of the block's rows (read one, write the other)
BACKWARD_BUFFERS = 3            # dL/dh and two copies of the signal da_t (read one, write other)


def persistent_fits(n, dtype, layout, backward=True, rows=1):
    """Whether a persistent kernel's shared memory fits in SHARED_BYTES_MAX."""
    buffers = BACKWARD_BUFFERS if backward else FORWARD_BUFFERS
    return persistent_shared_bytes(n, rows, np.dtype(dtype).itemsize, layout,
                                   buffers) <= SHARED_BYTES_MAX


def persistent_layouts(n, dtype, antisymmetric, backward=True, rows=1):
    """The layouts a persistent pass over an n x n matrix fits with, beside the rows' state:
    "global", then the matrix in shared memory ("skew" for an antisymmetric A, else "dense")
    where it fits too. Empty where not even the state fits."""
    shared = "skew" if antisymmetric else "dense"
    return [layout for layout in ("global", shared)
            if persistent_fits(n, dtype, layout, backward, rows)]


def _checked_layout(layout):
    if layout not in LAYOUTS:
        raise ValueError(f"a persistent kernel's matrix layout is one of {LAYOUTS}, "
                         f"got layout={layout!r}")
    return layout


def persistent_launch(B, n, dtype, layout, buffers, rows, threads):
    """(grid, threads, shared bytes) of a persistent kernel, or ValueError if it cannot fit."""
    shared = persistent_shared_bytes(n, rows, np.dtype(dtype).itemsize, layout, buffers)
    instead = ("use fewer rows per block, or the step kernels (version 1)" if layout == "global"
               else "use layout='global', or the step kernels (version 1)")
    return persistent_grid(B, n, rows, threads, shared,
                           f"the persistent kernel needs {shared} bytes of shared memory at "
                           f"n={n}, rows={rows}, {np.dtype(dtype).name}, {layout} layout; at most "
                           f"{SHARED_BYTES_MAX} are available: {instead}")


@persistent_kernel
def euler_forward_persistent_kernel(hs, th, x, AT, V_h, b_h, eps, layout, rows):
    """All T steps of (12) in one launch:
        a = A h_{t-1} + V_h x_t + b_h ;  th_t = tanh(a) ;  h_t = h_{t-1} + eps th_t

    Written (=): hs[1:] of (T+1, B, n), th (T, B, n). Read: hs[0] = h_0, x (T, B, m),
    AT (n, n) = A^T, V_h (n, m), b_h (n,). `layout` (SKEW, DENSE or GLOBAL) says where the
    matrix is read from (see above); SKEW requires A = S - gamma I with S antisymmetric.
    Work split: block k owns batch rows b = k*rows .. k*rows + rows - 1; thread `tid` computes
    units i = tid, tid + blockDim, ... of each of them. Shared memory: the matrix (unless
    GLOBAL), then two (rows, n) copies of the rows' hidden state, h_{t-1} read while h_t is
    written.
    """
    T, B, m = x.shape
    n = AT.shape[0]
    tid, nthreads = cuda.threadIdx.x, cuda.blockDim.x
    b0 = cuda.blockIdx.x * rows
    size_A = matrix_values(n, layout)
    smem = cuda.shared.array(0, dtype=hs.dtype)
    Msh = smem[:size_A]
    hbuf = smem[size_A:size_A + 2 * rows * n]
    load_matrix(Msh, AT, layout)
    diag = AT[0, 0]
    load_block_rows(hbuf, hs[0], b0, rows)
    cuda.syncthreads()
    for t in range(T):
        cur, nxt = (t % 2) * rows * n, ((t + 1) % 2) * rows * n
        for r in range(rows):
            b = b0 + r
            if b < B:
                h = hbuf[cur + r * n:cur + r * n + n]                   # h_{t-1}, row b
                for i in range(tid, n, nthreads):
                    a = matrix_dot(Msh, AT, h, i, n, layout, diag) + b_h[i]    # (A h)_i + b_i
                    for k in range(m):
                        a += V_h[i, k] * x[t, b, k]
                    y, h_new = euler_unit(a, h[i], eps)
                    th[t, b, i] = y
                    hs[t + 1, b, i] = h_new
                    hbuf[nxt + r * n + i] = h_new
        cuda.syncthreads()


@persistent_kernel
def euler_gated_forward_persistent_kernel(hs, th, z, x, AT, V_h, b_h, V_z, b_z, eps, kz, layout,
                                          rows):
    """All T steps of (13) in one launch: with s = A h_{t-1} (shared by gate and candidate),
        z_t = sigmoid(kz s + V_z x_t + b_z) ; th_t = tanh(s + V_h x_t + b_h)
        h_t = h_{t-1} + eps z_t th_t

    Written (=): hs[1:], th, z (T, B, n). Read: hs[0], x, AT = A^T, V_h, b_h, V_z, b_z.
    Layout, work split and shared memory as in euler_forward_persistent_kernel.
    """
    T, B, m = x.shape
    n = AT.shape[0]
    tid, nthreads = cuda.threadIdx.x, cuda.blockDim.x
    b0 = cuda.blockIdx.x * rows
    size_A = matrix_values(n, layout)
    smem = cuda.shared.array(0, dtype=hs.dtype)
    Msh = smem[:size_A]
    hbuf = smem[size_A:size_A + 2 * rows * n]
    load_matrix(Msh, AT, layout)
    diag = AT[0, 0]
    load_block_rows(hbuf, hs[0], b0, rows)
    cuda.syncthreads()
    for t in range(T):
        cur, nxt = (t % 2) * rows * n, ((t + 1) % 2) * rows * n
        for r in range(rows):
            b = b0 + r
            if b < B:
                h = hbuf[cur + r * n:cur + r * n + n]
                for i in range(tid, n, nthreads):
                    s = matrix_dot(Msh, AT, h, i, n, layout, diag)               # (A h)_i
                    a = s + b_h[i]
                    zp = kz * s + b_z[i]
                    for k in range(m):
                        a += V_h[i, k] * x[t, b, k]
                        zp += V_z[i, k] * x[t, b, k]
                    y, zt, h_new = euler_gated_unit(a, zp, h[i], eps)
                    z[t, b, i] = zt
                    th[t, b, i] = y
                    hs[t + 1, b, i] = h_new
                    hbuf[nxt + r * n + i] = h_new
        cuda.syncthreads()


@persistent_kernel
def euler_backward_persistent_kernel(dh0, da, dh_T, th, A, eps, layout, rows):
    """BPTT through all T steps of (12) in one launch.

    forward was: h_t = h_{t-1} + eps * tanh(a_t),   a_t = A h_{t-1} + V_h x_t + b_h
    so:          da_t = dh_t * eps * (1 - th_t**2) ;  dh_{t-1} = dh_t + A^T da_t

    Written (=): dh0 (B, n) = dL/dh_0, da (T, B, n). Read: dh_T (B, n), th (T, B, n), A (n, n),
    where `layout` says (the forward kernel's layouts, with D = A). Work split as in the forward
    kernel. Shared memory: the matrix (unless GLOBAL), the rows' dL/dh (each value touched only
    by the thread that owns it), and two copies of the rows' da_t: step t writes one while step
    t+1's copy may still be read, so one barrier per step suffices.
    """
    T, B = th.shape[0], th.shape[1]
    n = A.shape[0]
    tid, nthreads = cuda.threadIdx.x, cuda.blockDim.x
    b0 = cuda.blockIdx.x * rows
    size_A = matrix_values(n, layout)
    smem = cuda.shared.array(0, dtype=dh0.dtype)
    Msh = smem[:size_A]
    dh = smem[size_A:size_A + rows * n]
    dbuf = smem[size_A + rows * n:size_A + 3 * rows * n]
    load_matrix(Msh, A, layout)
    diag = A[0, 0]
    load_block_rows(dh, dh_T, b0, rows)
    for t in range(T - 1, -1, -1):
        cur = (t % 2) * rows * n
        for r in range(rows):
            b = b0 + r
            if b < B:
                for i in range(tid, n, nthreads):
                    g = euler_unit_backward(dh[r * n + i], th[t, b, i], eps)
                    da[t, b, i] = g
                    dbuf[cur + r * n + i] = g
        cuda.syncthreads()                        # da_t of the block's rows complete (and A)
        for r in range(rows):
            b = b0 + r
            if b < B:
                d = dbuf[cur + r * n:cur + r * n + n]
                for i in range(tid, n, nthreads):
                    dh[r * n + i] += matrix_dot(Msh, A, d, i, n, layout, diag)  # (A^T da_t)_i
    for r in range(rows):
        b = b0 + r
        if b < B:
            for i in range(tid, n, nthreads):
                dh0[b, i] = dh[r * n + i]


@persistent_kernel
def euler_gated_backward_persistent_kernel(dh0, da, dzp, ds, dh_T, th, z, A, eps, kz, layout,
                                           rows):
    """BPTT through all T steps of (13) in one launch.

    forward was: h_t = h_{t-1} + eps * z_t * th_t,  th_t = tanh(a_t), z_t = sigmoid(zp_t),
                 a_t = A h_{t-1} + ...,  zp_t = kz A h_{t-1} + ...
    so:          da_t  = dh_t * eps * z_t * (1 - th_t**2)
                 dzp_t = dh_t * eps * th_t * z_t * (1 - z_t)
                 ds_t  = da_t + kz dzp_t ;   dh_{t-1} = dh_t + A^T ds_t

    Written (=): dh0 (B, n), da, dzp, ds (T, B, n). Read: dh_T, th, z, A.
    Layout, work split and shared memory as in euler_backward_persistent_kernel (ds_t in place
    of da_t).
    """
    T, B = th.shape[0], th.shape[1]
    n = A.shape[0]
    tid, nthreads = cuda.threadIdx.x, cuda.blockDim.x
    b0 = cuda.blockIdx.x * rows
    size_A = matrix_values(n, layout)
    smem = cuda.shared.array(0, dtype=dh0.dtype)
    Msh = smem[:size_A]
    dh = smem[size_A:size_A + rows * n]
    dbuf = smem[size_A + rows * n:size_A + 3 * rows * n]
    load_matrix(Msh, A, layout)
    diag = A[0, 0]
    load_block_rows(dh, dh_T, b0, rows)
    for t in range(T - 1, -1, -1):
        cur = (t % 2) * rows * n
        for r in range(rows):
            b = b0 + r
            if b < B:
                for i in range(tid, n, nthreads):
                    da_i, dzp_i = euler_gated_unit_backward(dh[r * n + i], th[t, b, i],
                                                            z[t, b, i], eps)
                    da[t, b, i] = da_i
                    dzp[t, b, i] = dzp_i
                    ds[t, b, i] = da_i + kz * dzp_i
                    dbuf[cur + r * n + i] = da_i + kz * dzp_i
        cuda.syncthreads()
        for r in range(rows):
            b = b0 + r
            if b < B:
                d = dbuf[cur + r * n:cur + r * n + n]
                for i in range(tid, n, nthreads):
                    dh[r * n + i] += matrix_dot(Msh, A, d, i, n, layout, diag)  # (A^T ds_t)_i
    for r in range(rows):
        b = b0 + r
        if b < B:
            for i in range(tid, n, nthreads):
                dh0[b, i] = dh[r * n + i]


def euler_forward_gpu_persistent(hs, th, x, A, V_h, b_h, eps, *, layout, rows=1, threads=None):
    """Version 2 twin of euler_forward_cpu: A^T into a scratch buffer, then one launch of
    euler_forward_persistent_kernel. `layout` is one of LAYOUTS ("skew" requires
    A = S - gamma I with S antisymmetric; `persistent_layouts` lists those that fit).
    ValueError if the block's shared memory would not fit. Written (=): hs[1:], th."""
    T, B, _ = x.shape
    grid, threads, shared = persistent_launch(B, A.shape[0], hs.dtype, layout, FORWARD_BUFFERS,
                                              rows, threads)
    euler_forward_persistent_kernel[grid, threads, 0, shared](
        hs, th, x, transposed(A), V_h, b_h, hs.dtype.type(eps), LAYOUTS.index(layout), rows)


def euler_gated_forward_gpu_persistent(hs, th, z, x, A, V_h, b_h, V_z, b_z, eps, kz, *, layout,
                                       rows=1, threads=None):
    """Version 2 twin of euler_gated_forward_cpu: A^T into a scratch buffer, then one launch of
    euler_gated_forward_persistent_kernel. Written (=): hs[1:], th, z."""
    T, B, _ = x.shape
    grid, threads, shared = persistent_launch(B, A.shape[0], hs.dtype, layout, FORWARD_BUFFERS,
                                              rows, threads)
    euler_gated_forward_persistent_kernel[grid, threads, 0, shared](
        hs, th, z, x, transposed(A), V_h, b_h, V_z, b_z, hs.dtype.type(eps), hs.dtype.type(kz),
        LAYOUTS.index(layout), rows)


def euler_backward_gpu_persistent(dA, dV_h, db_h, dh0, da, dh_T, hs, th, x, A, eps, *, layout,
                                  rows=1, threads=None, tile=TILE):
    """Version 2 twin of euler_backward_cpu: one launch of euler_backward_persistent_kernel,
    then the parameter-gradient products. Written (=): dA, dV_h, db_h, dh0, da."""
    T, B, _ = x.shape
    grid, threads, shared = persistent_launch(B, A.shape[0], dh0.dtype, layout, BACKWARD_BUFFERS,
                                              rows, threads)
    euler_backward_persistent_kernel[grid, threads, 0, shared](
        dh0, da, dh_T, th, A, dh0.dtype.type(eps), LAYOUTS.index(layout), rows)
    euler_param_grads_gpu(dA, dV_h, db_h, da, da, hs, x, tile=tile)


def euler_gated_backward_gpu_persistent(dA, dV_h, db_h, dV_z, db_z, dh0, da, dzp, ds,
                                        dh_T, hs, th, z, x, A, eps, kz, *, layout, rows=1,
                                        threads=None, tile=TILE):
    """Version 2 twin of euler_gated_backward_cpu: one launch of
    euler_gated_backward_persistent_kernel, then the parameter-gradient products.
    Written (=): dA, dV_h, db_h, dV_z, db_z, dh0, da, dzp, ds."""
    T, B, _ = x.shape
    grid, threads, shared = persistent_launch(B, A.shape[0], dh0.dtype, layout, BACKWARD_BUFFERS,
                                              rows, threads)
    euler_gated_backward_persistent_kernel[grid, threads, 0, shared](
        dh0, da, dzp, ds, dh_T, th, z, A, dh0.dtype.type(eps), dh0.dtype.type(kz),
        LAYOUTS.index(layout), rows)
    euler_param_grads_gpu(dA, dV_h, db_h, ds, da, hs, x, tile=tile)
    euler_input_grads_gpu(dV_z, db_z, dzp, x, tile=tile)


# -- version 3: split, the matrix in registers ----------------------------------------------
#
# In version 2 one thread forms unit i's whole dot product u_i = sum_j D[j, i] v[j], n dependent
# multiply-adds, each waiting for a load: a step is a chain of about n latencies (on an H100 at
# n = 128, 14 us per step of forward and BPTT together, docs/gpu.md). Version 3 gives each unit
# `lanes` threads (S, 2 to 16) of one warp:
#
#     thread tid serves unit i = tid // S as its lane l = tid % S; lane l holds in registers
#     D[j, i] for j = l, l + S, ..., cap = ceil(n / S) values, loaded once per pass
#     per step: lane l's partial sum over its j (two accumulators), the S partials added by
#     log2(S) warp shuffles (`lane_sum`), and lane 0, the unit's leader, does the unit's step
#
# At n = 128 and S = 8: 1,024 threads, 16 matrix values and 16 multiply-adds per thread and step.
# The rows' state vectors, which every lane reads, are the block's only shared memory: two copies
# per row (read one, write the other; one barrier per step), each padded with zeros to cap * S
# values so that no lane tests j < n inside the loop. The leader keeps its unit's own state
# (h_{t-1}, or dL/dh_t) in a register, and loads what the next step needs from global memory one
# step ahead: the input projections V x_t + b, formed for all steps before the pass
# (`input_projection_gpu`, as the CPU twin's first product), or the forward's th_t and z_t.
# cap, S and the rows per block are compile-time constants of each compiled kernel
# (`euler_split_kernels`), so that loops over them unroll and their arrays live in registers;
# `gpu_common.split_lanes` says which S fit a block's registers at n. Not timed on a GPU yet.


class SplitKernels(NamedTuple):
    """One compiled set of version 3 kernels (`euler_split_kernels`)."""
    forward: object
    gated_forward: object
    backward: object
    gated_backward: object


@functools.lru_cache(maxsize=None)
def euler_split_kernels(cap, lanes, rows):
    """The version 3 kernels for `lanes` lanes per unit, cap = ceil(n / lanes) matrix values per
    lane and `rows` batch rows per block (each combination compiled once)."""
    stride = cap * lanes                # a row's state vector in shared memory, zero-padded
    launch_bound = split_bound(cap, lanes)

    @split_kernel(launch_bound)
    def euler_forward_split_kernel(hs, th, AT, eps):
        """All T steps of (12): a = A h_{t-1} + u_t ; th_t = tanh(a) ; h_t = h_{t-1} + eps th_t,
        where th holds u_t = V_h x_t + b_h on entry (overwritten by th_t).
        Written (=): hs[1:] (T+1, B, n), th (T, B, n). Read: hs[0], th, AT (n, n) = A^T."""
        T, B, n = th.shape
        tid = cuda.threadIdx.x
        i, lane = tid // lanes, tid % lanes
        leader = i < n and lane == 0
        b0 = cuda.blockIdx.x * rows
        zero = hs.dtype.type(0)
        D = cuda.local.array(cap, hs.dtype)         # D[k] = A[i, lane + k lanes]
        load_lane_values(D, AT, i, lane, cap, lanes)
        h = cuda.local.array(rows, hs.dtype)        # the leader's h_{t-1}[b, i] of each row
        u = cuda.local.array(rows, hs.dtype)        # and its u_t, loaded a step ahead
        hbuf = cuda.shared.array(0, hs.dtype)
        load_padded_rows(hbuf, hs[0], b0, rows, stride)
        for r in range(rows):
            if leader and b0 + r < B and T > 0:
                h[r] = hs[0, b0 + r, i]
                u[r] = th[0, b0 + r, i]
        for t in range(T):
            cur, nxt = (t % 2) * rows * stride, ((t + 1) % 2) * rows * stride
            for r in range(rows):
                b = b0 + r
                u_next = th[t + 1, b, i] if leader and b < B and t + 1 < T else zero
                s = lane_sum(lane_dot(D, hbuf, cur + r * stride + lane, cap, lanes), lanes)
                if leader and b < B:
                    y, h_new = euler_unit(s + u[r], h[r], eps)      # s = (A h_{t-1})_i
                    th[t, b, i] = y
                    hs[t + 1, b, i] = h_new
                    hbuf[nxt + r * stride + i] = h_new
                    h[r], u[r] = h_new, u_next
            cuda.syncthreads()

    @split_kernel(launch_bound)
    def euler_gated_forward_split_kernel(hs, th, z, AT, eps, kz):
        """All T steps of (13): with s = A h_{t-1}, z_t = sigmoid(kz s + w_t), th_t = tanh(s + u_t),
        h_t = h_{t-1} + eps z_t th_t, where th holds u_t = V_h x_t + b_h and z holds
        w_t = V_z x_t + b_z on entry. Written (=): hs[1:], th, z. Read: hs[0], th, z, AT."""
        T, B, n = th.shape
        tid = cuda.threadIdx.x
        i, lane = tid // lanes, tid % lanes
        leader = i < n and lane == 0
        b0 = cuda.blockIdx.x * rows
        zero = hs.dtype.type(0)
        D = cuda.local.array(cap, hs.dtype)
        load_lane_values(D, AT, i, lane, cap, lanes)
        h = cuda.local.array(rows, hs.dtype)
        u = cuda.local.array(rows, hs.dtype)
        w = cuda.local.array(rows, hs.dtype)
        hbuf = cuda.shared.array(0, hs.dtype)
        load_padded_rows(hbuf, hs[0], b0, rows, stride)
        for r in range(rows):
            if leader and b0 + r < B and T > 0:
                h[r] = hs[0, b0 + r, i]
                u[r] = th[0, b0 + r, i]
                w[r] = z[0, b0 + r, i]
        for t in range(T):
            cur, nxt = (t % 2) * rows * stride, ((t + 1) % 2) * rows * stride
            for r in range(rows):
                b = b0 + r
                ahead = leader and b < B and t + 1 < T
                u_next = th[t + 1, b, i] if ahead else zero
                w_next = z[t + 1, b, i] if ahead else zero
                s = lane_sum(lane_dot(D, hbuf, cur + r * stride + lane, cap, lanes), lanes)
                if leader and b < B:
                    y, zt, h_new = euler_gated_unit(s + u[r], kz * s + w[r], h[r], eps)
                    z[t, b, i] = zt
                    th[t, b, i] = y
                    hs[t + 1, b, i] = h_new
                    hbuf[nxt + r * stride + i] = h_new
                    h[r], u[r], w[r] = h_new, u_next, w_next
            cuda.syncthreads()

    @split_kernel(launch_bound)
    def euler_backward_split_kernel(dh0, da, dh_T, th, A, eps):
        """BPTT through all T steps of (12).

        forward was: h_t = h_{t-1} + eps * tanh(a_t),   a_t = A h_{t-1} + V_h x_t + b_h
        so:          da_t = dh_t * eps * (1 - th_t**2) ;  dh_{t-1} = dh_t + A^T da_t

        Written (=): dh0 (B, n), da (T, B, n). Read: dh_T (B, n), th (T, B, n), A (n, n).
        The leader keeps dL/dh of its unit in a register; shared memory holds two copies of the
        rows' da_t, which every lane reads."""
        T, B, n = th.shape
        tid = cuda.threadIdx.x
        i, lane = tid // lanes, tid % lanes
        leader = i < n and lane == 0
        b0 = cuda.blockIdx.x * rows
        D = cuda.local.array(cap, dh0.dtype)        # D[k] = A[lane + k lanes, i]
        load_lane_values(D, A, i, lane, cap, lanes)
        dh = cuda.local.array(rows, dh0.dtype)      # the leader's dL/dh_t[b, i] of each row
        y = cuda.local.array(rows, dh0.dtype)       # and its th_t, loaded a step ahead
        dbuf = cuda.shared.array(0, dh0.dtype)
        zero_shared(dbuf, 2 * rows * stride)
        for r in range(rows):
            if leader and b0 + r < B and T > 0:
                y[r] = th[T - 1, b0 + r, i]
            if leader and b0 + r < B:
                dh[r] = dh_T[b0 + r, i]
        for t in range(T - 1, -1, -1):
            cur = (t % 2) * rows * stride
            for r in range(rows):
                b = b0 + r
                if leader and b < B:
                    g = euler_unit_backward(dh[r], y[r], eps)
                    da[t, b, i] = g
                    dbuf[cur + r * stride + i] = g
                    if t > 0:
                        y[r] = th[t - 1, b, i]
            cuda.syncthreads()                  # da_t of the block's rows complete
            for r in range(rows):
                s = lane_sum(lane_dot(D, dbuf, cur + r * stride + lane, cap, lanes), lanes)
                if leader and b0 + r < B:
                    dh[r] += s                                       # (A^T da_t)_i
        for r in range(rows):
            if leader and b0 + r < B:
                dh0[b0 + r, i] = dh[r]

    @split_kernel(launch_bound)
    def euler_gated_backward_split_kernel(dh0, da, dzp, ds, dh_T, th, z, A, eps, kz):
        """BPTT through all T steps of (13).

        forward was: h_t = h_{t-1} + eps * z_t * th_t,  th_t = tanh(a_t), z_t = sigmoid(zp_t),
                     a_t = A h_{t-1} + ...,  zp_t = kz A h_{t-1} + ...
        so:          da_t  = dh_t * eps * z_t * (1 - th_t**2)
                     dzp_t = dh_t * eps * th_t * z_t * (1 - z_t)
                     ds_t  = da_t + kz dzp_t ;   dh_{t-1} = dh_t + A^T ds_t

        Written (=): dh0 (B, n), da, dzp, ds (T, B, n). Read: dh_T, th, z, A. As `backward`,
        with ds_t in place of da_t."""
        T, B, n = th.shape
        tid = cuda.threadIdx.x
        i, lane = tid // lanes, tid % lanes
        leader = i < n and lane == 0
        b0 = cuda.blockIdx.x * rows
        D = cuda.local.array(cap, dh0.dtype)
        load_lane_values(D, A, i, lane, cap, lanes)
        dh = cuda.local.array(rows, dh0.dtype)
        y = cuda.local.array(rows, dh0.dtype)
        zt = cuda.local.array(rows, dh0.dtype)
        dbuf = cuda.shared.array(0, dh0.dtype)
        zero_shared(dbuf, 2 * rows * stride)
        for r in range(rows):
            if leader and b0 + r < B and T > 0:
                y[r] = th[T - 1, b0 + r, i]
                zt[r] = z[T - 1, b0 + r, i]
            if leader and b0 + r < B:
                dh[r] = dh_T[b0 + r, i]
        for t in range(T - 1, -1, -1):
            cur = (t % 2) * rows * stride
            for r in range(rows):
                b = b0 + r
                if leader and b < B:
                    da_i, dzp_i = euler_gated_unit_backward(dh[r], y[r], zt[r], eps)
                    da[t, b, i] = da_i
                    dzp[t, b, i] = dzp_i
                    ds[t, b, i] = da_i + kz * dzp_i
                    dbuf[cur + r * stride + i] = da_i + kz * dzp_i
                    if t > 0:
                        y[r] = th[t - 1, b, i]
                        zt[r] = z[t - 1, b, i]
            cuda.syncthreads()
            for r in range(rows):
                s = lane_sum(lane_dot(D, dbuf, cur + r * stride + lane, cap, lanes), lanes)
                if leader and b0 + r < B:
                    dh[r] += s                                       # (A^T ds_t)_i
        for r in range(rows):
            if leader and b0 + r < B:
                dh0[b0 + r, i] = dh[r]

    return SplitKernels(euler_forward_split_kernel, euler_gated_forward_split_kernel,
                        euler_backward_split_kernel, euler_gated_backward_split_kernel)


def euler_forward_gpu_split(hs, th, x, A, V_h, b_h, eps, *, lanes, rows=1):
    """Version 3 twin of euler_forward_cpu: th = x V_h^T + b_h for every step, A^T into a
    scratch buffer, then one launch of the split forward kernel. Written (=): hs[1:], th."""
    k, grid, threads, shared = split_pass(euler_split_kernels, x.shape[1], A.shape[0], lanes,
                                          rows, hs.dtype)
    input_projection_gpu(th, x, V_h, b_h)
    k.forward[grid, threads, 0, shared](hs, th, transposed(A), hs.dtype.type(eps))


def euler_gated_forward_gpu_split(hs, th, z, x, A, V_h, b_h, V_z, b_z, eps, kz, *, lanes,
                                  rows=1):
    """Version 3 twin of euler_gated_forward_cpu. Written (=): hs[1:], th, z."""
    k, grid, threads, shared = split_pass(euler_split_kernels, x.shape[1], A.shape[0], lanes,
                                          rows, hs.dtype)
    input_projection_gpu(th, x, V_h, b_h)
    input_projection_gpu(z, x, V_z, b_z)
    k.gated_forward[grid, threads, 0, shared](hs, th, z, transposed(A), hs.dtype.type(eps),
                                              hs.dtype.type(kz))


def euler_backward_gpu_split(dA, dV_h, db_h, dh0, da, dh_T, hs, th, x, A, eps, *, lanes, rows=1,
                             tile=TILE):
    """Version 3 twin of euler_backward_cpu: one launch of the split BPTT kernel, then the
    parameter-gradient products. Written (=): dA, dV_h, db_h, dh0, da."""
    k, grid, threads, shared = split_pass(euler_split_kernels, x.shape[1], A.shape[0], lanes,
                                          rows, dh0.dtype)
    k.backward[grid, threads, 0, shared](dh0, da, dh_T, th, A, dh0.dtype.type(eps))
    euler_param_grads_gpu(dA, dV_h, db_h, da, da, hs, x, tile=tile)


def euler_gated_backward_gpu_split(dA, dV_h, db_h, dV_z, db_z, dh0, da, dzp, ds, dh_T, hs, th, z,
                                   x, A, eps, kz, *, lanes, rows=1, tile=TILE):
    """Version 3 twin of euler_gated_backward_cpu. Written (=): dA, dV_h, db_h, dV_z, db_z,
    dh0, da, dzp, ds."""
    k, grid, threads, shared = split_pass(euler_split_kernels, x.shape[1], A.shape[0], lanes,
                                          rows, dh0.dtype)
    k.gated_backward[grid, threads, 0, shared](dh0, da, dzp, ds, dh_T, th, z, A,
                                               dh0.dtype.type(eps), dh0.dtype.type(kz))
    euler_param_grads_gpu(dA, dV_h, db_h, ds, da, hs, x, tile=tile)
    euler_input_grads_gpu(dV_z, db_z, dzp, x, tile=tile)


# ----------------------------------------------------------------------------------------------
# The twins, as nprnn/backends.py runs them
# ----------------------------------------------------------------------------------------------
antisym_matrix = Twins(antisym_matrix_cpu, antisym_matrix_gpu)
shifted_matrix = Twins(shifted_matrix_cpu, shifted_matrix_gpu)
antisym_dW = Twins(antisym_dW_cpu, antisym_dW_gpu)
euler_forward = Twins(euler_forward_cpu, euler_forward_gpu, euler_forward_gpu_persistent,
                      gpu_split=euler_forward_gpu_split)
euler_backward = Twins(euler_backward_cpu, euler_backward_gpu, euler_backward_gpu_persistent,
                       gpu_split=euler_backward_gpu_split)
euler_gated_forward = Twins(euler_gated_forward_cpu, euler_gated_forward_gpu,
                            euler_gated_forward_gpu_persistent,
                            gpu_split=euler_gated_forward_gpu_split)
euler_gated_backward = Twins(euler_gated_backward_cpu, euler_gated_backward_gpu,
                             euler_gated_backward_gpu_persistent,
                             gpu_split=euler_gated_backward_gpu_split)

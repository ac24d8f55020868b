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
matrix: the paper's W_h in R^{n x n}) or `shifted_matrix_cpu` (A = W - gamma I, ablation), and
dA is turned back into dW by `antisym_dW_cpu`; `cells.EulerCell` calls them (feedback uses W
itself).

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

A map of this file, in reading order:
  * A from W and dW from dA: `antisym_matrix_cpu`, `shifted_matrix_cpu`, `antisym_dW_cpu`;
  * one unit's step and its derivative, written once for every version: `euler_unit`,
    `euler_gated_unit` and their `_backward`s;
  * the CPU twins over a whole sequence: `euler_forward_cpu`, `euler_backward_cpu` and the gated
    pair;
  * GPU version 1, one thread per (batch row, unit) and one launch per step: `euler_forward_gpu`
    and the rest, with the weight-gradient products of gpu_common.py;
  * the twins (`Twins`) that nprnn/core/backends.py runs.
The fast GPU versions, 2 (persistent: one launch per pass, the matrix in shared or global memory)
and 3 (split: several lanes per unit, the matrix in registers), are in kernels/fast/antisym.py,
each held to the CPU twin by tests/gpu/test_gpu_euler.py.
"""
import numpy as np
from numba import prange

from .common import (Twins, add_upstream, dsigmoid_from_y, dtanh_from_y, flush_denormals,
                     hold_state, matmul_nt_rows, matmul_tn_rows, njit, njit_inline,
                     njit_parallel, num_slices, restore_fp_mode, row_slice, sigmoid, sum_rows,
                     tanh)
from .gpu_common import (TILE, column_sums_gpu, cuda, hold_unit, matmul_tn_gpu, matrix_launch,
                         scratch, step_grid, transposed, upstream)


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
def euler_forward_cpu(hs, th, x, A, V_h, b_h, eps, lengths):
    """Forward pass of (12) over a whole sequence.

    Written (=):  hs[1:] of (T+1, B, n) hidden states; th (T, B, n) = tanh(a_t), kept for BPTT.
    Read:         hs[0] (B, n) = h_0; x (T, B, m); A (n, n); V_h (n, m); b_h (n,);
                  lengths (B,) in [1, T]: row b's state stops changing after step lengths[b]
                  (h_t = h_{t-1} from there on, and th = 0).
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
                if t >= lengths[b]:                      # past the row's end: h_t = h_{t-1}
                    hold_state(hs, th, t, b)
                    continue
                for i in range(n):
                    # a_t = A h_{t-1} + V_h x_t + b_h ;  h_t = h_{t-1} + eps tanh(a_t)
                    y, h_new = euler_unit(Ah[b - b0, i] + th[t, b, i] + b_h[i], hs[t, b, i], eps)
                    th[t, b, i] = y
                    hs[t + 1, b, i] = h_new


@njit_parallel
def euler_backward_cpu(dA, dV_h, db_h, dh0, da, dh_T, hs, th, x, A, eps, dhs, lengths):
    """BPTT of (12) over the whole sequence.

    Written (=):  dA (n, n); dV_h (n, m); db_h (n,); dh0 (B, n) = dL/dh_0;
                  da (T, B, n) = dL/da_t (scratch, kept for the products at the end).
    Read:         dh_T (B, n) = dL/dh_T; hs, th from the forward pass; x (T, B, m); A (n, n);
                  dhs (T, B, n): dL/dh_t from outside the recurrence (a readout at every step,
                  the layer above), dhs[t-1] for h_t, or (0, B, n) for none; lengths (B,) as
                  in the forward pass: past a row's end h_t = h_{t-1}, so da_t = 0 and
                  dL/dh_{t-1} = dL/dh_t there.
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
                if add_upstream(dh, dhs, da, t, b, b0, lengths):
                    continue                    # past the row's end: da_t = 0, dh passes on
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
def euler_gated_forward_cpu(hs, th, z, x, A, V_h, b_h, V_z, b_z, eps, kz, lengths):
    """Forward pass of (13) over a whole sequence. The gate and the candidate share A h_{t-1}
    (the gate takes kz of it).

    Written (=):  hs[1:] of (T+1, B, n); th (T, B, n) = tanh(a_t); z (T, B, n) = z_t.
    Read:         hs[0] = h_0; x (T, B, m); A (n, n); V_h, V_z (n, m); b_h, b_z (n,);
                  lengths (B,), as in `euler_forward_cpu` (past a row's end z = 0 too).
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
                if t >= lengths[b]:                      # past the row's end: h_t = h_{t-1}
                    hold_state(hs, th, t, b)
                    z[t, b] = 0.0
                    continue
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
                             dh_T, hs, th, z, x, A, eps, kz, dhs, lengths):
    """BPTT of (13) over the whole sequence.

    Written (=):  dA (n, n); dV_h, dV_z (n, m); db_h, db_z (n,); dh0 (B, n) = dL/dh_0;
                  scratch da, dzp (T, B, n): dL/d(pre-activation) of candidate and gate;
                  ds = da + kz dzp (T, B, n), the total signal reaching A h_{t-1}.
    Read:         dh_T (B, n); hs, th, z from the forward pass; x (T, B, m); A (n, n);
                  dhs, lengths as in `euler_backward_cpu`.
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
                if add_upstream(dh, dhs, da, t, b, b0, lengths):
                    dzp[t, b] = 0.0
                    ds[t, b] = 0.0
                    continue
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
# Three versions of every pass (as llm.c's dev/cuda keeps its kernel versions): version 1 here,
# versions 2 and 3 in kernels/fast/antisym.py; all checked against the CPU twins above by
# tests/gpu/test_gpu_euler.py:
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
#                            holding its share of A in registers.
#
# All versions end BPTT with the same parameter-gradient products as the CPU twins,
# dA = DA^T H, dV_h = DA^T X, db_h = DA^T 1, formed by `matmul_tn_gpu` (see gpu_common.py for
# why a tiled product over the stored steps and not an accumulation inside the BPTT kernel).
#
# Every version computes a unit's step and its derivative with the functions the CPU twins
# call (`euler_unit`, `euler_gated_unit` and their `_backward`s, above). Host functions named
# like the CPU twins (`euler_forward_gpu`, ...) take the CPU twin's arguments, all device
# arrays, followed by keyword-only launch options.

@cuda.jit(cache=True)
def antisym_matrix_kernel(A, W, gamma):
    """A = W - W^T - gamma I (written, =). One thread per (i, j); 2-d grid over (j, i)."""
    j, i = cuda.grid(2)
    n = W.shape[0]
    if i < n and j < n:
        a = W[i, j] - W[j, i]
        if i == j:
            a -= gamma
        A[i, j] = a


@cuda.jit(cache=True)
def shifted_matrix_kernel(A, W, gamma):
    """A = W - gamma I (written, =). One thread per (i, j); 2-d grid over (j, i)."""
    j, i = cuda.grid(2)
    n = W.shape[0]
    if i < n and j < n:
        A[i, j] = W[i, j] - gamma if i == j else W[i, j]


@cuda.jit(cache=True)
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

@cuda.jit(cache=True)
def euler_forward_step_kernel(hs, th, x, AT, V_h, b_h, eps, t, lengths):
    """Step t of (12): a = A h_{t-1} + V_h x_t + b_h ; th_t = tanh(a) ; h_t = h_{t-1} + eps th_t.

    Written (=): th[t] (B, n), hs[t+1] (B, n). Read: hs[t], x[t] (B, m), AT (n, n) = A^T,
    V_h (n, m), b_h (n,), lengths (B,) (past row b's end, h_t = h_{t-1} and th_t = 0).
    One thread per (b, i); 2-d grid over (i, b). A is read transposed so
    that for each j the threads of a warp read consecutive addresses, AT[j, i .. i+31] (one
    memory transaction, where A[i .. i+31, j] would be 32, n values apart).
    """
    i, b = cuda.grid(2)
    B, n, m = hs.shape[1], AT.shape[0], x.shape[2]
    if b < B and i < n and hold_unit(hs, th, t, b, i, lengths):
        return
    if b < B and i < n:
        a = b_h[i]
        for j in range(n):
            a += AT[j, i] * hs[t, b, j]                          # A[i, j] h_{t-1}[b, j]
        for k in range(m):
            a += V_h[i, k] * x[t, b, k]
        y, h_new = euler_unit(a, hs[t, b, i], eps)
        th[t, b, i] = y
        hs[t + 1, b, i] = h_new


@cuda.jit(cache=True)
def euler_gated_forward_step_kernel(hs, th, z, x, AT, V_h, b_h, V_z, b_z, eps, kz, t, lengths):
    """Step t of (13): with s = A h_{t-1} (shared by gate and candidate),
    z_t = sigmoid(kz s + V_z x_t + b_z) ; th_t = tanh(s + V_h x_t + b_h) ;
    h_t = h_{t-1} + eps z_t th_t.

    Written (=): th[t], z[t], hs[t+1] (B, n). Read: hs[t], x[t], AT = A^T (read transposed as
    in euler_forward_step_kernel), V_h, b_h, V_z, b_z, lengths (B,). One thread per (b, i);
    2-d grid over (i, b).
    """
    i, b = cuda.grid(2)
    B, n, m = hs.shape[1], AT.shape[0], x.shape[2]
    if b < B and i < n and hold_unit(hs, th, t, b, i, lengths):
        z[t, b, i] = 0
        return
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


@cuda.jit(cache=True)
def euler_backward_step_kernel(dh_prev, da, dh, th, A, eps, t, dhs, lengths):
    """BPTT through step t of (12).

    forward was: h_t = h_{t-1} + eps * tanh(a_t),   a_t = A h_{t-1} + V_h x_t + b_h
    so:          da_t = dh_t * eps * (1 - th_t**2) ;  dh_{t-1} = dh_t + A^T da_t

    Written (=): da[t] (B, n), dh_prev (B, n). Read: dh (B, n) = dL/dh_t from the later steps,
    to which dhs[t] adds the outside gradient (`upstream`), th[t], A, lengths (past row b's end
    da_t = 0 and dh_{t-1} = dh_t).
    One thread per (b, i); 2-d grid over (i, b). dh_{t-1}[b, i] needs da_t[b, j] for every j,
    which other threads (maybe other blocks) own, and a launch has no barrier across blocks:
    so each thread recomputes the n values da_t[b, :] it needs. That is about three times the
    work of the n multiply-adds of A^T da_t alone: the price of having no barrier, which the
    persistent version 2 does not pay.
    """
    i, b = cuda.grid(2)
    B, n = dh.shape
    if b < B and i < n:
        dh_i = upstream(dh, dhs, t, b, i)
        if t >= lengths[b]:
            da[t, b, i] = 0
            dh_prev[b, i] = dh_i
            return
        acc = dh_i
        for j in range(n):
            acc += euler_unit_backward(upstream(dh, dhs, t, b, j), th[t, b, j], eps) * A[j, i]
        da[t, b, i] = euler_unit_backward(dh_i, th[t, b, i], eps)
        dh_prev[b, i] = acc


@cuda.jit(cache=True)
def euler_gated_backward_step_kernel(dh_prev, da, dzp, ds, dh, th, z, A, eps, kz, t, dhs,
                                     lengths):
    """BPTT through step t of (13).

    forward was: h_t = h_{t-1} + eps * z_t * th_t,  th_t = tanh(a_t), z_t = sigmoid(zp_t),
                 a_t = A h_{t-1} + ...,  zp_t = kz A h_{t-1} + ...
    so:          da_t  = dh_t * eps * z_t * (1 - th_t**2)
                 dzp_t = dh_t * eps * th_t * z_t * (1 - z_t)
                 ds_t  = da_t + kz dzp_t ;   dh_{t-1} = dh_t + A^T ds_t

    Written (=): da[t], dzp[t], ds[t] (B, n), dh_prev (B, n). Read: dh, dhs, lengths as in
    euler_backward_step_kernel, th[t], z[t], A. One thread per (b, i); 2-d grid over (i, b);
    ds_t[b, :] recomputed per thread as in euler_backward_step_kernel.
    """
    i, b = cuda.grid(2)
    B, n = dh.shape
    if b < B and i < n:
        dh_i = upstream(dh, dhs, t, b, i)
        if t >= lengths[b]:
            da[t, b, i] = 0
            dzp[t, b, i] = 0
            ds[t, b, i] = 0
            dh_prev[b, i] = dh_i
            return
        acc = dh_i
        for j in range(n):
            da_j, dzp_j = euler_gated_unit_backward(upstream(dh, dhs, t, b, j), th[t, b, j],
                                                    z[t, b, j], eps)
            acc += (da_j + kz * dzp_j) * A[j, i]
        da_i, dzp_i = euler_gated_unit_backward(dh_i, th[t, b, i], z[t, b, i], eps)
        da[t, b, i] = da_i
        dzp[t, b, i] = dzp_i
        ds[t, b, i] = da_i + kz * dzp_i
        dh_prev[b, i] = acc


def euler_forward_gpu(hs, th, x, A, V_h, b_h, eps, lengths, *, block=(128, 1)):
    """Version 1 twin of euler_forward_cpu (same arguments, device arrays): T launches of
    euler_forward_step_kernel. Written (=): hs[1:], th. Read: hs[0] = h_0, x, A, V_h, b_h."""
    T, B, _ = x.shape
    grid, block = step_grid(B, A.shape[0], block)
    eps = hs.dtype.type(eps)
    AT = transposed(A)
    for t in range(T):
        euler_forward_step_kernel[grid, block](hs, th, x, AT, V_h, b_h, eps, t, lengths)


def euler_gated_forward_gpu(hs, th, z, x, A, V_h, b_h, V_z, b_z, eps, kz, lengths, *,
                            block=(128, 1)):
    """Version 1 twin of euler_gated_forward_cpu: T launches of euler_gated_forward_step_kernel.
    Written (=): hs[1:], th, z. Read: hs[0], x, A, V_h, b_h, V_z, b_z."""
    T, B, _ = x.shape
    grid, block = step_grid(B, A.shape[0], block)
    eps, kz = hs.dtype.type(eps), hs.dtype.type(kz)
    AT = transposed(A)
    for t in range(T):
        euler_gated_forward_step_kernel[grid, block](hs, th, z, x, AT, V_h, b_h, V_z, b_z, eps,
                                                     kz, t, lengths)


def _backward_buffers(dh0, dh_T, T):
    """The running dL/dh_t alternates between dh0 and a scratch buffer, one step writing what
    the next reads; the order is chosen so that step t = 0 writes dh0. Returns (first input,
    the other buffer) after copying dh_T into the first input."""
    other = scratch("euler_dh", dh0.shape, dh0.dtype)
    first_in = other if T % 2 == 1 else dh0        # step t writes dh0 exactly when t is even
    first_in.copy_to_device(dh_T)
    return first_in, (dh0 if first_in is other else other)


def euler_backward_gpu(dA, dV_h, db_h, dh0, da, dh_T, hs, th, x, A, eps, dhs, lengths, *,
                       block=(128, 1), tile=TILE):
    """Version 1 twin of euler_backward_cpu (same arguments, device arrays): T launches of
    euler_backward_step_kernel, then the parameter-gradient products.
    Written (=): dA, dV_h, db_h, dh0, da. Read: dh_T, hs, th, x, A."""
    T, B, _ = x.shape
    grid, block = step_grid(B, A.shape[0], block)
    eps = dh0.dtype.type(eps)
    dh, dh_prev = _backward_buffers(dh0, dh_T, T)
    for t in range(T - 1, -1, -1):
        euler_backward_step_kernel[grid, block](dh_prev, da, dh, th, A, eps, t, dhs, lengths)
        dh, dh_prev = dh_prev, dh
    euler_param_grads_gpu(dA, dV_h, db_h, da, da, hs, x, tile=tile)


def euler_gated_backward_gpu(dA, dV_h, db_h, dV_z, db_z, dh0, da, dzp, ds,
                             dh_T, hs, th, z, x, A, eps, kz, dhs, lengths, *, block=(128, 1),
                             tile=TILE):
    """Version 1 twin of euler_gated_backward_cpu: T launches of
    euler_gated_backward_step_kernel, then the parameter-gradient products.
    Written (=): dA, dV_h, db_h, dV_z, db_z, dh0, da, dzp, ds. Read: dh_T, hs, th, z, x, A."""
    T, B, _ = x.shape
    grid, block = step_grid(B, A.shape[0], block)
    eps, kz = dh0.dtype.type(eps), dh0.dtype.type(kz)
    dh, dh_prev = _backward_buffers(dh0, dh_T, T)
    for t in range(T - 1, -1, -1):
        euler_gated_backward_step_kernel[grid, block](dh_prev, da, dzp, ds, dh, th, z, A, eps,
                                                      kz, t, dhs, lengths)
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


# ----------------------------------------------------------------------------------------------
# The twins, as nprnn/core/backends.py runs them: the CPU kernels and GPU version 1. The fast GPU
# versions (2: persistent, 3: split) live in kernels/fast/antisym.py, whose twins add them.
# ----------------------------------------------------------------------------------------------
antisym_matrix = Twins(antisym_matrix_cpu, antisym_matrix_gpu)
shifted_matrix = Twins(shifted_matrix_cpu, shifted_matrix_gpu)
antisym_dW = Twins(antisym_dW_cpu, antisym_dW_gpu)
euler_forward = Twins(euler_forward_cpu, euler_forward_gpu)
euler_backward = Twins(euler_backward_cpu, euler_backward_gpu)
euler_gated_forward = Twins(euler_gated_forward_cpu, euler_gated_forward_gpu)
euler_gated_backward = Twins(euler_gated_backward_cpu, euler_gated_backward_gpu)

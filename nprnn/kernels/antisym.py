"""AntisymmetricRNN and its Euler-family relatives: forward pass and BPTT kernels.

All four models of this family are one forward-Euler step of an ODE h' = f(h, x) (eq. 3):

    (12) h_t = h_{t-1} + eps * tanh((W - W^T - gamma I) h_{t-1} + V_h x_t + b_h)
    (13) z_t = sigmoid((W - W^T - gamma I) h_{t-1} + V_z x_t + b_z)
         h_t = h_{t-1} + eps * z_t o tanh((W - W^T - gamma I) h_{t-1} + V_h x_t + b_h)

    ablation (section 5.4): (13) with W - W^T replaced by an unstructured W
    feedback (section 4):   (12) with W - W^T - gamma I replaced by an unstructured W

so the kernels take the recurrent matrix A (n, n) ready-made; `cells.py` builds A from the
parameter W (A = W - W^T - gamma I for the antisymmetric models, see `antisym_matrix`) and turns
dA back into dW (`antisym_dW`). The kernels do not know which model they serve.

Shapes: B batch, T time, m input size, n hidden size. Kernels are time-major: x is (T, B, m) so
that the rows of one step are contiguous, and hs is (T+1, B, n) with hs[0] = h_0 given by the
caller (zero in the models).

How the CPU work is split (the standard recipe, on threads that own batch rows):
  1. one large matrix product for the input projections of all T steps, (T*B, m) @ (m, n);
  2. the batch rows are split into one slice per CPU thread; each thread runs all T steps of its
     slice: per step one (B_slice, n) @ (n, n) product for the recurrence, then the elementwise
     work fused into one pass. Threads never wait for each other inside the time loop (see
     `common.py` for why BLAS itself is kept to one thread);
  3. in BPTT, the parameter gradients as one large product over all stored steps,
     dA = sum_t da_t^T h_{t-1} = DA^T H with DA, H reshaped to (T*B, n), split by rows.
`np.dot` inside `@njit` calls BLAS, so steps 1-3 run at BLAS speed with no Python in the loop.
"""
import numpy as np
from numba import prange

from .common import (dsigmoid_from_y, dtanh_from_y, matmul_nt_rows, matmul_tn_rows, njit,
                     njit_parallel, num_slices, row_slice, sigmoid, sum_rows, tanh)


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
def antisym_dW_cpu(dW, dA):
    """Undo A = W - W^T - gamma I: dW_ij = dA_ij - dA_ji for i < j, and 0 on and below the
    diagonal, so that W stays strictly upper triangular under any optimizer. dW written."""
    n = dA.shape[0]
    for i in range(n):
        for j in range(n):
            dW[i, j] = dA[i, j] - dA[j, i] if j > i else 0.0


# ------------------------------------------------------------------------------------------
# CPU twins
# ------------------------------------------------------------------------------------------

@njit_parallel
def euler_forward_cpu(hs, th, x, A, V_h, b_h, eps):
    """Forward pass of (12) over a whole sequence.

    Written (=):  hs[1:] (T+1, B, n) hidden states; th (T, B, n) = tanh(a_t), kept for BPTT.
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
                    y = tanh(Ah[b - b0, i] + th[t, b, i] + b_h[i])   # a_t = A h + V_h x_t + b_h
                    th[t, b, i] = y
                    hs[t + 1, b, i] = hs[t, b, i] + eps * y        # h_t = h_{t-1} + eps tanh(a_t)


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
        dh = dh0[b0:b1]
        dA_h = np.empty((b1 - b0, n), dtype=dh0.dtype)
        for t in range(T - 1, -1, -1):
            for b in range(b0, b1):
                for i in range(n):
                    # forward was: h_t = h_{t-1} + eps * tanh(a_t)
                    # so:          dh_{t-1} += dh_t ;  da_t = dh_t * eps * (1 - tanh(a_t)**2)
                    da[t, b, i] = dh[b - b0, i] * eps * dtanh_from_y(th[t, b, i])
            # forward was: a_t = h_{t-1} A^T + V_h x_t + b_h   (row form)
            # so:          dh_{t-1} += da_t A
            np.dot(da[t, b0:b1], A, dA_h)
            dh += dA_h
    # 3. parameter gradients over all steps at once
    da2 = da.reshape(T * B, n)
    matmul_tn_rows(dA, da2, hs[:T].reshape(T * B, n))    # dA   = sum_t da_t^T h_{t-1}
    matmul_tn_rows(dV_h, da2, x.reshape(T * B, m))       # dV_h = sum_t da_t^T x_t
    sum_rows(db_h, da2)                                  # db_h = sum_t sum_b da_t


@njit_parallel
def euler_gated_forward_cpu(hs, th, z, x, A, V_h, b_h, V_z, b_z, eps):
    """Forward pass of (13) over a whole sequence. The gate and the candidate share A h_{t-1}.

    Written (=):  hs[1:] (T+1, B, n); th (T, B, n) = tanh(a_t); z (T, B, n) = z_t.
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
                    zt = sigmoid(Ah[b - b0, i] + z[t, b, i] + b_z[i])   # z_t = sigma(A h + V_z x + b_z)
                    y = tanh(Ah[b - b0, i] + th[t, b, i] + b_h[i])      # tanh(A h + V_h x + b_h)
                    z[t, b, i] = zt
                    th[t, b, i] = y
                    hs[t + 1, b, i] = hs[t, b, i] + eps * zt * y   # h_t = h_{t-1} + eps z_t o tanh


@njit_parallel
def euler_gated_backward_cpu(dA, dV_h, db_h, dV_z, db_z, dh0, da, dzp, ds,
                             dh_T, hs, th, z, x, A, eps):
    """BPTT of (13) over the whole sequence.

    Written (=):  dA (n, n); dV_h, dV_z (n, m); db_h, db_z (n,); dh0 (B, n) = dL/dh_0;
                  scratch da, dzp (T, B, n): dL/d(pre-activation) of candidate and gate;
                  ds = da + dzp (T, B, n), the total signal reaching A h_{t-1}.
    Read:         dh_T (B, n); hs, th, z from the forward pass; x (T, B, m); A (n, n).
    Work split:   as `euler_backward_cpu`.
    """
    T, B, m = x.shape
    n = A.shape[0]
    dh0[:, :] = dh_T
    S = num_slices(B)
    for c in prange(S):
        b0, b1 = row_slice(c, S, B)
        dh = dh0[b0:b1]
        dA_h = np.empty((b1 - b0, n), dtype=dh0.dtype)
        for t in range(T - 1, -1, -1):
            for b in range(b0, b1):
                for i in range(n):
                    # forward was: h_t = h_{t-1} + eps * z_t * y_t,  y_t = tanh(a_t), z_t = sigma(zp_t)
                    # so:          dh_{t-1} += dh_t
                    #              da_t  = dh_t * eps * z_t * (1 - y_t**2)
                    #              dzp_t = dh_t * eps * y_t * z_t * (1 - z_t)
                    g = dh[b - b0, i] * eps
                    da[t, b, i] = g * z[t, b, i] * dtanh_from_y(th[t, b, i])
                    dzp[t, b, i] = g * th[t, b, i] * dsigmoid_from_y(z[t, b, i])
                    ds[t, b, i] = da[t, b, i] + dzp[t, b, i]
            # forward was: a_t = A h_{t-1} + ..., zp_t = A h_{t-1} + ...  (both read A h_{t-1})
            # so:          dh_{t-1} += (da_t + dzp_t) A
            np.dot(ds[t, b0:b1], A, dA_h)
            dh += dA_h
    x2 = x.reshape(T * B, m)
    matmul_tn_rows(dA, ds.reshape(T * B, n), hs[:T].reshape(T * B, n))  # sum_t (da+dzp)^T h
    matmul_tn_rows(dV_h, da.reshape(T * B, n), x2)                      # sum_t da_t^T x_t
    matmul_tn_rows(dV_z, dzp.reshape(T * B, n), x2)                     # sum_t dzp_t^T x_t
    sum_rows(db_h, da.reshape(T * B, n))
    sum_rows(db_z, dzp.reshape(T * B, n))

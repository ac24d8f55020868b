"""The GRU baseline (PyTorch's nn.GRU): forward pass and BPTT kernels.

    r = sigmoid(W_ir x_t + b_ir + W_hr h_{t-1} + b_hr)               reset gate
    z = sigmoid(W_iz x_t + b_iz + W_hz h_{t-1} + b_hz)               update gate
    n_t = tanh(W_in x_t + b_in + r o (W_hn h_{t-1} + b_hn))          candidate
    h_t = (1 - z) o n_t + z o h_{t-1}                                (o: elementwise product)

The reset gate acts after the product with W_hn, as in nn.GRU. Cho et al. (2014), and the GRU of
Gilboa et al. (2019, Table 1), reset before it: tanh(W_in x_t + W_hn (r o h_{t-1}) + b).

Parameters follow nn.GRU's layout: W_ih = weight_ih (3n, m), W_hh = weight_hh (3n, n),
b_ih = bias_ih (3n,), b_hh = bias_hh (3n,); rows [k n, (k+1) n) hold gate k of (r, z, n) (the
third block, PyTorch's "n", is the candidate n_t, not the size n).
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

A map of this file, in reading order:
  * one unit's step and its derivative, written once for every version: `gru_unit`,
    `gru_unit_backward`;
  * the CPU twins over a whole sequence: `gru_forward_cpu`, `gru_backward_cpu`;
  * GPU version 1, one thread per (batch row, unit) and one launch per step: `gru_forward_gpu`,
    `gru_backward_gpu`;
  * the twins (`Twins`) of the CPU kernels and version 1.
The fast GPU version, 2 (persistent: one launch per pass), is in kernels/fast/gru.py, held to the
CPU twin by tests/gpu/test_gpu_baselines.py; its twins, which nprnn/core/cells.py runs, add it.
"""
import numpy as np
from numba import prange

from .common import (Twins, add_upstream, dsigmoid_from_y, dtanh_from_y, flush_denormals,
                     flush_subnormal, hold_state, matmul_nt_rows, matmul_tn_rows, njit_inline,
                     njit_parallel, num_slices, restore_fp_mode, row_slice, sigmoid, sum_rows,
                     tanh)
from .gpu_common import (TILE, cuda, hold_unit, rows_times_matrix_gpu, stacked_param_grads_gpu,
                         step_grid, transposed, upstream)


# ------------------------------------------------------------------------------------------
# The unit's math, shared by the CPU and the GPU twins
# ------------------------------------------------------------------------------------------
# h_t = (1 - z) n_t + z h_{t-1} is computed as n_t + z (h_{t-1} - n_t), the same value: a literal
# 1 is an int64 to numba, and an int64 with a float32 gives a float64, so `1 - z` would turn a
# float32 kernel's arithmetic into float64 (tests/test_precision.py checks that no kernel does so
# by accident).

@njit_inline
def gru_unit(gi_r, gi_z, gi_n, gh_r, gh_z, hn, h_prev):
    """One unit of one step, from gi = W_ih x_t + b_ih and gh = W_hh h_{t-1} + b_hh (hn = gh_n):
        r = sigmoid(gi_r + gh_r), z = sigmoid(gi_z + gh_z), n_t = tanh(gi_n + r hn)
        h_t = (1 - z) n_t + z h_{t-1}
    Returns (r, z, n_t, h_t)."""
    r = sigmoid(gi_r + gh_r)
    z = sigmoid(gi_z + gh_z)
    n_t = tanh(gi_n + r * hn)
    return r, z, n_t, n_t + z * (h_prev - n_t)


@njit_inline
def gru_unit_backward(dh, r, z, n_t, hn, h_prev):
    """BPTT through gru_unit, given dh = dL/dh_t.

    forward was: h_t = (1 - z) n_t + z h_{t-1}
    so:          dn_t = dh (1 - z) ;  dz = dh (h_{t-1} - n_t) ;  dh_{t-1} = dh * z + (through gh)
    forward was: n_t = tanh(gi_n + r hn),  r = sigmoid(gi_r + gh_r),  z = sigmoid(gi_z + gh_z)
    so:          da_n = dn_t (1 - n_t**2) ;  da_r = da_n hn r (1 - r) ;  da_z = dz z (1 - z)
                 dgi = (da_r, da_z, da_n) ;  dgh = (da_r, da_z, da_n r)
    (dz is dL/dz; dh * z, a product, is the part of dL/dh_{t-1} that skips W_hh.)
    Returns (da_r, da_z, da_n, da_n r, dh * z)."""
    carry = dh * z                                  # the direct part of dh_{t-1}
    da_n = (dh - carry) * dtanh_from_y(n_t)         # dh (1 - z) (1 - n_t**2)
    da_r = da_n * hn * dsigmoid_from_y(r)
    da_z = dh * (h_prev - n_t) * dsigmoid_from_y(z)
    return da_r, da_z, da_n, da_n * r, carry


@njit_parallel
def gru_forward_cpu(hs, gates, hn, x, W_ih, W_hh, b_ih, b_hh, lengths):
    """Forward pass over a whole sequence.

    Written (=):  hs[1:] of (T+1, B, n): h_t; gates (T, B, 3n): r, z, n_t of each step, in blocks
                  of n; hn (T, B, n): W_hn h_{t-1} + b_hn of each step.
    Read:         hs[0] (B, n) = h_0; x (T, B, m); W_ih (3n, m); W_hh (3n, n); b_ih, b_hh (3n,);
                  lengths (B,): past row b's end h holds and gates, hn are 0 (common.py,
                  "Sequences").
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
                if t >= lengths[b]:                      # past the row's end: h_t = h_{t-1}
                    hold_state(hs, gates, t, b)
                    hn[t, b] = 0.0
                    continue
                k = b - b0
                for j in range(n):
                    hn_t = Wh[k, 2 * n + j] + b_hh[2 * n + j]         # W_hn h_{t-1} + b_hn
                    r, z, n_t, h = gru_unit(
                        gates[t, b, j] + b_ih[j], gates[t, b, n + j] + b_ih[n + j],
                        gates[t, b, 2 * n + j] + b_ih[2 * n + j], Wh[k, j] + b_hh[j],
                        Wh[k, n + j] + b_hh[n + j], hn_t, hs[t, b, j])
                    gates[t, b, j] = r
                    gates[t, b, n + j] = z
                    gates[t, b, 2 * n + j] = n_t
                    hn[t, b, j] = hn_t
                    hs[t + 1, b, j] = h


@njit_parallel
def gru_backward_cpu(dW_ih, dW_hh, db_ih, db_hh, dh0, dgi, dgh, dh_T, hs, gates, hn, x, W_hh,
                     dhs, lengths):
    """BPTT over the whole sequence.

    Written (=):  dW_ih (3n, m); dW_hh (3n, n); db_ih, db_hh (3n,); dh0 (B, n) = dL/dh_0;
                  scratch, kept for the products at the end:
                  dgi (T, B, 3n) = dL/d(W_ih x_t + b_ih) = (da_r, da_z, da_n),
                  dgh (T, B, 3n) = dL/d(W_hh h_{t-1} + b_hh) = (da_r, da_z, da_n o r).
    Read:         dh_T (B, n) = dL/dh_T; hs, gates, hn from the forward pass; x (T, B, m);
                  W_hh (3n, n); dhs (T, B, n) (or (0, B, n)) and lengths (B,): common.py,
                  "Sequences".
    Work split:   one thread per slice of batch rows for the reverse time loop; the weight
                  gradients as products over all T*B rows, split by rows.
    """
    T, B, m = x.shape
    n = W_hh.shape[1]
    dh0[:, :] = dh_T              # the running dL/dh_t lives in dh0's buffer; it ends as dL/dh_0
    S = num_slices(B)
    for c in prange(S):
        b0, b1 = row_slice(c, S, B)
        mode = flush_denormals(dh0)      # float32: subnormals to zero (common.py)
        dh = dh0[b0:b1]
        dh_rec = np.empty((b1 - b0, n), dtype=dh0.dtype)  # the part of dh_{t-1} through W_hh
        for t in range(T - 1, -1, -1):
            # forward was: (r, z, n_t, h_t) from gi_t, gh_t and h_{t-1} (gru_unit)
            # so:          dgi_t, dgh_t by gru_unit_backward; dh keeps z o dh_t, the part of
            #              dh_{t-1} that skips W_hh (its W_hh part is added below)
            for b in range(b0, b1):
                if add_upstream(dh, dhs, dgi, t, b, b0, lengths):
                    dgh[t, b] = 0.0
                    continue                    # past the row's end: dh passes on unchanged
                k = b - b0
                for j in range(n):
                    r = gates[t, b, j]
                    da_r, da_z, da_n, dgh_n, carry = gru_unit_backward(
                        dh[k, j], r, gates[t, b, n + j], gates[t, b, 2 * n + j], hn[t, b, j],
                        hs[t, b, j])
                    da_r = flush_subnormal(da_r)
                    da_z = flush_subnormal(da_z)
                    da_n = flush_subnormal(da_n)
                    dgi[t, b, j] = da_r
                    dgi[t, b, n + j] = da_z
                    dgi[t, b, 2 * n + j] = da_n
                    dgh[t, b, j] = da_r
                    dgh[t, b, n + j] = da_z
                    dgh[t, b, 2 * n + j] = flush_subnormal(dgh_n)
                    dh[k, j] = flush_subnormal(carry)
            # forward was: gh_t = h_{t-1} W_hh^T + b_hh (row form), feeding r, z and hn_t
            # so:          dh_{t-1} += dgh_t W_hh
            np.dot(dgh[t, b0:b1], W_hh, dh_rec)
            dh += dh_rec
        restore_fp_mode(mode)
    # 3. weight gradients over all steps at once
    dgi2 = dgi.reshape(T * B, 3 * n)
    dgh2 = dgh.reshape(T * B, 3 * n)
    matmul_tn_rows(dW_hh, dgh2, hs[:T].reshape(T * B, n))   # dW_hh = sum_t dgh_t^T h_{t-1}
    matmul_tn_rows(dW_ih, dgi2, x.reshape(T * B, m))        # dW_ih = sum_t dgi_t^T x_t
    sum_rows(db_hh, dgh2)
    sum_rows(db_ih, dgi2)


# ------------------------------------------------------------------------------------------
# GPU twins (tests/gpu/test_gpu_baselines.py checks them)
# ------------------------------------------------------------------------------------------
#   version 1, "step"        one thread per (b, j) computes the three gates of unit j: one launch
#                            per step (BPTT: two per step, the elementwise part and
#                            dh_{t-1} += dgh_t W_hh)
#   version 2, "persistent"  one launch per pass; block k owns batch rows [k R, (k+1) R) and keeps
#                            their h_{t-1} (forward) or dL/dh and dgh_t (BPTT) in shared memory.
#                            It is in kernels/fast/gru.py.
# Shared memory per batch row of version 2, in vectors of n values: the forward pass keeps h_{t-1}
# and h_t (read one, write the other); BPTT keeps dL/dh and two copies of (da_r, da_z, dgh_n).
FORWARD_VALUES = 2
BACKWARD_VALUES = 7
# Every version's unit math is gru_unit and gru_unit_backward above, shared with the CPU twins.
# The CPU twins flush float32 subnormal gradients to zero (a CPU speed measure, as in lstm.py);
# the GPU twins keep them.

@cuda.jit(cache=True)
def gru_forward_step_kernel(hs, gates, hn, x, W_ih, WT, b_ih, b_hh, t, lengths):
    """Step t, see gru_unit. Written (=): gates[t] (B, 3n) = r, z, n_t;
    hn[t] (B, n) = W_hn h_{t-1} + b_hn; hs[t+1] (B, n).
    Read: hs[t], x[t], W_ih (3n, m), WT = W_hh^T (n, 3n), b_ih, b_hh (3n,), lengths (B,) (past
    row b's end h holds and gates, hn are 0).
    One thread per (b, j), computing the three gates of unit j; 2-d grid over (j, b). W_hh is
    read transposed: for each k the threads of a warp read consecutive WT[k, j]."""
    j, b = cuda.grid(2)
    B, n, m = hs.shape[1], hs.shape[2], x.shape[2]
    if b < B and j < n and hold_unit(hs, hn, t, b, j, lengths):
        for k in range(3):
            gates[t, b, k * n + j] = 0
        return
    if b < B and j < n:
        gi_r, gi_z, gi_n = b_ih[j], b_ih[n + j], b_ih[2 * n + j]
        gh_r, gh_z, gh_n = b_hh[j], b_hh[n + j], b_hh[2 * n + j]
        for k in range(m):
            xk = x[t, b, k]
            gi_r += W_ih[j, k] * xk
            gi_z += W_ih[n + j, k] * xk
            gi_n += W_ih[2 * n + j, k] * xk
        for k in range(n):
            hk = hs[t, b, k]                    # W_hh[G n + j, k] h_{t-1}[b, k], gate G
            gh_r += WT[k, j] * hk
            gh_z += WT[k, n + j] * hk
            gh_n += WT[k, 2 * n + j] * hk
        r, z, n_t, h = gru_unit(gi_r, gi_z, gi_n, gh_r, gh_z, gh_n, hs[t, b, j])
        gates[t, b, j] = r
        gates[t, b, n + j] = z
        gates[t, b, 2 * n + j] = n_t
        hn[t, b, j] = gh_n
        hs[t + 1, b, j] = h


@cuda.jit(cache=True)
def gru_backward_unit_kernel(dgi, dgh, dh, hs, gates, hn, t, dhs, lengths):
    """The elementwise part of BPTT through step t (gru_unit_backward).
    Written (=): dgi[t], dgh[t] (B, 3n). Updated: dh (B, n), dL/dh_t (dhs[t] added:
    gpu_common.upstream) -> dh * z, the part of dL/dh_{t-1} that does not pass through W_hh;
    past row b's end (lengths) dh passes on whole and dgi, dgh are 0. Read: hs[t], gates[t],
    hn[t]. One thread per (b, j)."""
    j, b = cuda.grid(2)
    B, n = dh.shape
    if b < B and j < n:
        g = upstream(dh, dhs, t, b, j)
        if t >= lengths[b]:
            for k in range(3):
                dgi[t, b, k * n + j] = 0
                dgh[t, b, k * n + j] = 0
            dh[b, j] = g
            return
        r = gates[t, b, j]
        da_r, da_z, da_n, dgh_n, carry = gru_unit_backward(
            g, r, gates[t, b, n + j], gates[t, b, 2 * n + j], hn[t, b, j], hs[t, b, j])
        dgi[t, b, j] = da_r
        dgi[t, b, n + j] = da_z
        dgi[t, b, 2 * n + j] = da_n
        dgh[t, b, j] = da_r
        dgh[t, b, n + j] = da_z
        dgh[t, b, 2 * n + j] = dgh_n
        dh[b, j] = carry


def gru_forward_gpu(hs, gates, hn, x, W_ih, W_hh, b_ih, b_hh, lengths, *, block=(128, 1)):
    """Version 1 twin of gru_forward_cpu: T launches of gru_forward_step_kernel.
    Written (=): hs[1:], gates, hn. Read: hs[0], x, W_ih, W_hh, b_ih, b_hh."""
    T, B, _ = x.shape
    n = W_hh.shape[1]
    grid, block = step_grid(B, n, block)
    WT = transposed(W_hh, "gru_WT")
    for t in range(T):
        gru_forward_step_kernel[grid, block](hs, gates, hn, x, W_ih, WT, b_ih, b_hh, t, lengths)


def gru_backward_gpu(dW_ih, dW_hh, db_ih, db_hh, dh0, dgi, dgh, dh_T, hs, gates, hn, x, W_hh,
                     dhs, lengths, *, block=(128, 1), tile=TILE):
    """Version 1 twin of gru_backward_cpu: per step gru_backward_unit_kernel, then
    dh_{t-1} += dgh_t W_hh (rows_times_matrix_gpu); then the weight gradients.
    Written (=): dW_ih, dW_hh, db_ih, db_hh, dh0, dgi, dgh."""
    T, B, _ = x.shape
    n = W_hh.shape[1]
    grid, block = step_grid(B, n, block)
    dh0.copy_to_device(dh_T)              # the running dL/dh_t lives in dh0; it ends as dL/dh_0
    for t in range(T - 1, -1, -1):
        gru_backward_unit_kernel[grid, block](dgi, dgh, dh0, hs, gates, hn, t, dhs, lengths)
        rows_times_matrix_gpu(dh0, dgh, W_hh, t, True, block=block)
    stacked_param_grads_gpu(dW_ih, dW_hh, db_ih, db_hh, dgi, dgh, hs, x, tile=tile)


# the twins, as nprnn/core/backends.py runs them: the CPU kernels and GPU version 1 (version 2,
# persistent, is in kernels/fast/gru.py, whose twins add it)
gru_forward = Twins(gru_forward_cpu, gru_forward_gpu)
gru_backward = Twins(gru_backward_cpu, gru_backward_gpu)

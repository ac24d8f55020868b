"""The vanilla (Elman) RNN baseline: forward pass and BPTT kernels.

    h_t = tanh(W_ih x_t + b_ih + W_hh h_{t-1} + b_hh)

Parameters are PyTorch's single-layer nn.RNN (nonlinearity tanh), names and layouts included:
W_ih = weight_ih (n, m), W_hh = weight_hh (n, n), b_ih = bias_ih (n,), b_hh = bias_hh (n,).
Both biases are kept, as PyTorch keeps them, so weights can be exchanged; they always receive the
same gradient.

Shapes: B batch, T time, m input size, n hidden size. Kernels are time-major: x is (T, B, m) and
hs is (T+1, B, n) with hs[0] = h_0 given by the caller (zero in the models).

How the CPU work is split (the recipe of `antisym.py`, on threads that own batch rows):
  1. one (T*B, m) @ (m, n) product for the input projections W_ih x_t of all T steps;
  2. one thread per slice of batch rows runs all T steps of its slice: per step one
     (B_slice, n) @ (n, n) product with W_hh^T, then one fused elementwise pass;
  3. in BPTT, the same slices run the reverse time loop with one (B_slice, n) @ (n, n) product
     per step, and the weight gradients are products over all stored steps, split by rows:
     dW_hh = DA^T H with DA, H reshaped to (T*B, n).
The caller holds BLAS to one thread (`common.one_blas_thread`) while these kernels run.
"""
import functools

import numpy as np
from numba import prange

from .common import (Twins, dtanh_from_y, flush_denormals, flush_subnormal, matmul_nt_rows,
                     matmul_tn_rows, njit_parallel, num_slices, restore_fp_mode, row_slice,
                     sum_rows, tanh)
from .gpu_common import (TILE, cuda, input_projection_gpu, lane_dot, lane_sum, load_block_rows,
                         load_lane_values, load_padded_rows, persistent_kernel,
                         rows_times_matrix_gpu, scratch, split_bound, split_kernel,
                         split_pass, stacked_param_grads_gpu, state_launch, step_grid,
                         transposed, zero_shared)


@njit_parallel
def rnn_forward_cpu(hs, x, W_ih, W_hh, b_ih, b_hh):
    """Forward pass over a whole sequence.

    Written (=):  hs[1:] of (T+1, B, n), h_1 .. h_T (h_t = tanh(a_t) is all BPTT needs).
    Read:         hs[0] (B, n) = h_0; x (T, B, m); W_ih (n, m); W_hh (n, n); b_ih, b_hh (n,).
    Work split:   one thread per slice of batch rows, each running all T steps.
    """
    T, B, m = x.shape
    n = W_hh.shape[0]
    # 1. input projections of all steps at once; hs[t+1] holds W_ih x_t until step t overwrites it
    matmul_nt_rows(hs[1:].reshape(T * B, n), x.reshape(T * B, m), W_ih)
    S = num_slices(B)
    for c in prange(S):
        b0, b1 = row_slice(c, S, B)
        Wh = np.empty((b1 - b0, n), dtype=hs.dtype)
        for t in range(T):
            # 2. recurrence: row b of Wh is W_hh h_{t-1}[b]
            np.dot(hs[t, b0:b1], W_hh.T, Wh)
            for b in range(b0, b1):
                for j in range(n):
                    # a_t = W_ih x_t + b_ih + W_hh h_{t-1} + b_hh;  h_t = tanh(a_t)
                    hs[t + 1, b, j] = tanh(hs[t + 1, b, j] + b_ih[j] + Wh[b - b0, j] + b_hh[j])


@njit_parallel
def rnn_backward_cpu(dW_ih, dW_hh, db_ih, db_hh, dh0, da, dh_T, hs, x, W_hh):
    """BPTT over the whole sequence.

    Written (=):  dW_ih (n, m); dW_hh (n, n); db_ih, db_hh (n,); dh0 (B, n) = dL/dh_0;
                  da (T, B, n) = dL/da_t (scratch, kept for the products at the end).
    Read:         dh_T (B, n) = dL/dh_T; hs (T+1, B, n) from the forward pass; x (T, B, m);
                  W_hh (n, n).
    Work split:   one thread per slice of batch rows for the reverse time loop; the weight
                  gradients as products over all T*B rows, split by rows.
    """
    T, B, m = x.shape
    n = W_hh.shape[0]
    dh0[:, :] = dh_T              # the running dL/dh_t lives in dh0's buffer; it ends as dL/dh_0
    S = num_slices(B)
    for c in prange(S):
        b0, b1 = row_slice(c, S, B)
        mode = flush_denormals(dh0)      # float32: subnormals to zero (common.py)
        dh = dh0[b0:b1]
        for t in range(T - 1, -1, -1):
            for b in range(b0, b1):
                for j in range(n):
                    # forward was: h_t = tanh(a_t)
                    # so:          da_t = dh_t * (1 - h_t**2)   (a float32 subnormal set to 0,
                    #              for CPU speed only: common.flush_subnormal)
                    da[t, b, j] = flush_subnormal(dh[b - b0, j] * dtanh_from_y(hs[t + 1, b, j]))
            # forward was: a_t = W_ih x_t + b_ih + W_hh h_{t-1} + b_hh; h_{t-1} goes nowhere else
            # so:          dh_{t-1} = da_t W_hh   (row form)
            np.dot(da[t, b0:b1], W_hh, dh)
        restore_fp_mode(mode)
    # 3. weight gradients over all steps at once
    da2 = da.reshape(T * B, n)
    matmul_tn_rows(dW_hh, da2, hs[:T].reshape(T * B, n))    # dW_hh = sum_t da_t^T h_{t-1}
    matmul_tn_rows(dW_ih, da2, x.reshape(T * B, m))         # dW_ih = sum_t da_t^T x_t
    sum_rows(db_ih, da2)                                    # db_ih = sum_t sum_b da_t
    db_hh[:] = db_ih                                        # b_hh enters a_t as b_ih does


# ------------------------------------------------------------------------------------------
# GPU twins (three versions, as in antisym.py; tests/gpu/test_gpu_baselines.py checks them)
# ------------------------------------------------------------------------------------------
#   version 1, "step"        one thread per (b, j), one launch per step (BPTT: two per step,
#                            the elementwise part and dh_{t-1} = da_t W_hh)
#   version 2, "persistent"  one launch per pass; block k owns batch rows [k R, (k+1) R) and keeps
#                            their h_{t-1} (forward) or dL/dh and da_t (BPTT) in shared memory.
#   version 3, "split"       one launch per pass, several lanes per unit, W_hh in registers
#                            (below the persistent kernels)
# Shared memory per batch row, in vectors of n values: the forward pass keeps h_{t-1} and h_t
# (read one, write the other); BPTT keeps dL/dh and two copies of da_t.
FORWARD_VALUES = 2
BACKWARD_VALUES = 3
# W_hh (n, n) is 64 KiB at n = 128 in float32, more than a block's 48 KiB of shared memory, so the
# persistent kernels read it from global memory every step: all blocks read the same matrix, and
# it stays in the L2 cache. The forward pass reads W_hh^T (made once per call) so that for each
# k consecutive threads read consecutive addresses; BPTT reads W_hh itself, which already has
# that property. Host functions take the CPU twins' arguments (device arrays), then keyword-only
# launch options; the weight gradients are `stacked_param_grads_gpu` (gpu_common.py).

@cuda.jit
def rnn_forward_step_kernel(hs, x, W_ih, WT, b_ih, b_hh, t):
    """Step t: h_t = tanh(W_ih x_t + b_ih + W_hh h_{t-1} + b_hh).
    Written (=): hs[t+1] (B, n). Read: hs[t], x[t], W_ih (n, m), WT = W_hh^T (n, n), b_ih, b_hh
    (n,). One thread per (b, j); 2-d grid over (j, b). W_hh is read transposed: for each k the
    threads of a warp read consecutive WT[k, j] (`gpu_common.transposed`)."""
    j, b = cuda.grid(2)
    B, n, m = hs.shape[1], hs.shape[2], x.shape[2]
    if b < B and j < n:
        a = b_ih[j] + b_hh[j]
        for k in range(m):
            a += W_ih[j, k] * x[t, b, k]
        for k in range(n):
            a += WT[k, j] * hs[t, b, k]                          # W_hh[j, k] h_{t-1}[b, k]
        hs[t + 1, b, j] = tanh(a)


@cuda.jit
def rnn_backward_unit_kernel(da, dh, hs, t):
    """The elementwise part of BPTT through step t.
    forward was: h_t = tanh(a_t)
    so:          da_t = dh_t * (1 - h_t**2)
    Written (=): da[t] (B, n). Read: dh (B, n) = dL/dh_t, hs[t+1]. One thread per (b, j)."""
    j, b = cuda.grid(2)
    B, n = dh.shape
    if b < B and j < n:
        da[t, b, j] = dh[b, j] * dtanh_from_y(hs[t + 1, b, j])


def rnn_forward_gpu(hs, x, W_ih, W_hh, b_ih, b_hh, *, block=(128, 1)):
    """Version 1 twin of rnn_forward_cpu: T launches of rnn_forward_step_kernel.
    Written (=): hs[1:]. Read: hs[0] = h_0, x, W_ih, W_hh, b_ih, b_hh."""
    T, B, _ = x.shape
    n = W_hh.shape[0]
    grid, block = step_grid(B, n, block)
    WT = transposed(W_hh, "rnn_WT")
    for t in range(T):
        rnn_forward_step_kernel[grid, block](hs, x, W_ih, WT, b_ih, b_hh, t)


def rnn_backward_gpu(dW_ih, dW_hh, db_ih, db_hh, dh0, da, dh_T, hs, x, W_hh, *, block=(128, 1),
                     tile=TILE):
    """Version 1 twin of rnn_backward_cpu: per step rnn_backward_unit_kernel, then
    dh_{t-1} = da_t W_hh (rows_times_matrix_gpu); then the weight gradients.
    Written (=): dW_ih, dW_hh, db_ih, db_hh, dh0, da. Read: dh_T, hs, x, W_hh."""
    T, B, _ = x.shape
    n = W_hh.shape[0]
    grid, block = step_grid(B, n, block)
    dh0.copy_to_device(dh_T)              # the running dL/dh_t lives in dh0; it ends as dL/dh_0
    for t in range(T - 1, -1, -1):
        rnn_backward_unit_kernel[grid, block](da, dh0, hs, t)
        rows_times_matrix_gpu(dh0, da, W_hh, t, False, block=block)
    stacked_param_grads_gpu(dW_ih, dW_hh, db_ih, db_hh, da, da, hs, x, tile=tile)


@persistent_kernel
def rnn_forward_persistent_kernel(hs, x, W_ih, WT, b_ih, b_hh, rows):
    """All T steps of h_t = tanh(W_ih x_t + b_ih + W_hh h_{t-1} + b_hh) in one launch.

    Written (=): hs[1:] of (T+1, B, n). Read: hs[0], x (T, B, m), W_ih (n, m), WT = W_hh^T (n, n),
    b_ih, b_hh (n,). Work split: block k owns batch rows k*rows .. k*rows + rows - 1; thread
    `tid` computes units j = tid, tid + blockDim, ... of each. Shared memory: two (rows, n)
    copies of the rows' state, h_{t-1} read while h_t is written; one barrier per step.
    """
    T, B, m = x.shape
    n = WT.shape[0]
    tid, nthreads = cuda.threadIdx.x, cuda.blockDim.x
    b0 = cuda.blockIdx.x * rows
    hbuf = cuda.shared.array(0, dtype=hs.dtype)
    load_block_rows(hbuf, hs[0], b0, rows)
    cuda.syncthreads()
    for t in range(T):
        cur, nxt = (t % 2) * rows * n, ((t + 1) % 2) * rows * n
        for r in range(rows):
            b = b0 + r
            if b < B:
                for j in range(tid, n, nthreads):
                    a = b_ih[j] + b_hh[j]
                    for k in range(m):
                        a += W_ih[j, k] * x[t, b, k]
                    for k in range(n):
                        a += WT[k, j] * hbuf[cur + r * n + k]
                    y = tanh(a)
                    hs[t + 1, b, j] = y
                    hbuf[nxt + r * n + j] = y
        cuda.syncthreads()


@persistent_kernel
def rnn_backward_persistent_kernel(dh0, da, dh_T, hs, W_hh, rows):
    """BPTT through all T steps in one launch.

    forward was: h_t = tanh(a_t),  a_t = W_ih x_t + b_ih + W_hh h_{t-1} + b_hh
    so:          da_t = dh_t * (1 - h_t**2) ;  dh_{t-1} = da_t W_hh   (row form)

    Written (=): dh0 (B, n), da (T, B, n). Read: dh_T (B, n), hs (T+1, B, n), W_hh (n, n).
    Work split as in the forward kernel. Shared memory: the rows' dL/dh (each value touched only
    by its owner thread) and two copies of their da_t (one barrier per step).
    """
    T, B, n = da.shape
    tid, nthreads = cuda.threadIdx.x, cuda.blockDim.x
    b0 = cuda.blockIdx.x * rows
    smem = cuda.shared.array(0, dtype=dh0.dtype)
    dh = smem[:rows * n]
    dbuf = smem[rows * n:3 * rows * n]
    load_block_rows(dh, dh_T, b0, rows)
    for t in range(T - 1, -1, -1):
        cur = (t % 2) * rows * n
        for r in range(rows):
            b = b0 + r
            if b < B:
                for j in range(tid, n, nthreads):
                    g = dh[r * n + j] * dtanh_from_y(hs[t + 1, b, j])
                    da[t, b, j] = g
                    dbuf[cur + r * n + j] = g
        cuda.syncthreads()
        for r in range(rows):
            b = b0 + r
            if b < B:
                for j in range(tid, n, nthreads):
                    acc = dh.dtype.type(0)
                    for k in range(n):
                        acc += dbuf[cur + r * n + k] * W_hh[k, j]
                    dh[r * n + j] = acc
    for r in range(rows):
        b = b0 + r
        if b < B:
            for j in range(tid, n, nthreads):
                dh0[b, j] = dh[r * n + j]


def rnn_forward_gpu_persistent(hs, x, W_ih, W_hh, b_ih, b_hh, *, rows=1, threads=None):
    """Version 2 twin of rnn_forward_cpu: W_hh^T into a scratch buffer, then one launch of
    rnn_forward_persistent_kernel. Written (=): hs[1:]."""
    T, B, _ = x.shape
    n = W_hh.shape[0]
    grid, threads, shared = state_launch(B, n, hs.dtype, FORWARD_VALUES * n, rows, threads)
    WT = transposed(W_hh, "rnn_WT")
    rnn_forward_persistent_kernel[grid, threads, 0, shared](hs, x, W_ih, WT, b_ih, b_hh, rows)


def rnn_backward_gpu_persistent(dW_ih, dW_hh, db_ih, db_hh, dh0, da, dh_T, hs, x, W_hh, *,
                                rows=1, threads=None, tile=TILE):
    """Version 2 twin of rnn_backward_cpu: one launch of rnn_backward_persistent_kernel, then
    the weight gradients. Written (=): dW_ih, dW_hh, db_ih, db_hh, dh0, da."""
    T, B, _ = x.shape
    n = W_hh.shape[0]
    grid, threads, shared = state_launch(B, n, dh0.dtype, BACKWARD_VALUES * n, rows, threads)
    rnn_backward_persistent_kernel[grid, threads, 0, shared](dh0, da, dh_T, hs, W_hh, rows)
    stacked_param_grads_gpu(dW_ih, dW_hh, db_ih, db_hh, da, da, hs, x, tile=tile)


# -- version 3: split, W_hh in registers (antisym.py's version 3, explained there) ---------------
# Unit j's lanes hold their share of row j of W_hh (forward) or of column j (BPTT) in registers;
# the leader lane adds the input projection W_ih x_t + b_ih (one kernel before the recurrence,
# into a scratch buffer) and b_hh, applies tanh and keeps h_t, or dL/dh_t, in a register.

@functools.lru_cache(maxsize=None)
def rnn_split_kernels(cap, lanes, rows):
    """The version 3 (forward, backward) kernels for `lanes` lanes per unit, cap = ceil(n / lanes)
    values of W_hh per lane and `rows` batch rows per block (each combination compiled once)."""
    stride = cap * lanes

    @split_kernel(split_bound(cap, lanes))
    def rnn_forward_split_kernel(hs, u, WT, b_hh):
        """All T steps of h_t = tanh(u_t + W_hh h_{t-1} + b_hh), u_t = W_ih x_t + b_ih given.
        Written (=): hs[1:] (T+1, B, n). Read: hs[0], u (T, B, n), WT = W_hh^T (n, n), b_hh."""
        T, B, n = u.shape
        tid = cuda.threadIdx.x
        j, lane = tid // lanes, tid % lanes
        leader = j < n and lane == 0
        b0 = cuda.blockIdx.x * rows
        zero = hs.dtype.type(0)
        D = cuda.local.array(cap, hs.dtype)         # D[k] = W_hh[j, lane + k lanes]
        load_lane_values(D, WT, j, lane, cap, lanes)
        c = b_hh[j] if j < n else zero
        a_in = cuda.local.array(rows, hs.dtype)     # the leader's u_t[b, j], loaded a step ahead
        hbuf = cuda.shared.array(0, hs.dtype)
        load_padded_rows(hbuf, hs[0], b0, rows, stride)
        for r in range(rows):
            if leader and b0 + r < B and T > 0:
                a_in[r] = u[0, b0 + r, j]
        for t in range(T):
            cur, nxt = (t % 2) * rows * stride, ((t + 1) % 2) * rows * stride
            for r in range(rows):
                b = b0 + r
                u_next = u[t + 1, b, j] if leader and b < B and t + 1 < T else zero
                s = lane_sum(lane_dot(D, hbuf, cur + r * stride + lane, cap, lanes), lanes)
                if leader and b < B:
                    h = tanh(a_in[r] + s + c)                  # s = (W_hh h_{t-1})_j
                    hs[t + 1, b, j] = h
                    hbuf[nxt + r * stride + j] = h
                    a_in[r] = u_next
            cuda.syncthreads()

    @split_kernel(split_bound(cap, lanes))
    def rnn_backward_split_kernel(dh0, da, dh_T, hs, W_hh):
        """BPTT through all T steps.

        forward was: h_t = tanh(a_t),  a_t = W_ih x_t + b_ih + W_hh h_{t-1} + b_hh
        so:          da_t = dh_t * (1 - h_t**2) ;  dh_{t-1} = W_hh^T da_t

        Written (=): dh0 (B, n), da (T, B, n). Read: dh_T (B, n), hs (T+1, B, n), W_hh (n, n).
        The leader keeps dL/dh of its unit in a register; shared memory holds two copies of the
        rows' da_t."""
        T, B, n = da.shape
        tid = cuda.threadIdx.x
        j, lane = tid // lanes, tid % lanes
        leader = j < n and lane == 0
        b0 = cuda.blockIdx.x * rows
        D = cuda.local.array(cap, dh0.dtype)        # D[k] = W_hh[lane + k lanes, j]
        load_lane_values(D, W_hh, j, lane, cap, lanes)
        dh = cuda.local.array(rows, dh0.dtype)      # the leader's dL/dh_t[b, j] of each row
        y = cuda.local.array(rows, dh0.dtype)       # and its h_t, loaded a step ahead
        dbuf = cuda.shared.array(0, dh0.dtype)
        zero_shared(dbuf, 2 * rows * stride)
        for r in range(rows):
            if leader and b0 + r < B:
                dh[r] = dh_T[b0 + r, j]
                y[r] = hs[T, b0 + r, j]
        for t in range(T - 1, -1, -1):
            cur = (t % 2) * rows * stride
            for r in range(rows):
                b = b0 + r
                if leader and b < B:
                    g = dh[r] * dtanh_from_y(y[r])
                    da[t, b, j] = g
                    dbuf[cur + r * stride + j] = g
                    y[r] = hs[t, b, j]                  # h_{t-1}, for the step before
            cuda.syncthreads()
            for r in range(rows):
                s = lane_sum(lane_dot(D, dbuf, cur + r * stride + lane, cap, lanes), lanes)
                if leader and b0 + r < B:
                    dh[r] = s                                        # (W_hh^T da_t)_j
        for r in range(rows):
            if leader and b0 + r < B:
                dh0[b0 + r, j] = dh[r]

    return rnn_forward_split_kernel, rnn_backward_split_kernel


def rnn_forward_gpu_split(hs, x, W_ih, W_hh, b_ih, b_hh, *, lanes, rows=1):
    """Version 3 twin of rnn_forward_cpu: u = x W_ih^T + b_ih for every step into a scratch
    buffer, W_hh^T into another, then one launch of the split forward kernel.
    Written (=): hs[1:]."""
    T, B, _ = x.shape
    n = W_hh.shape[0]
    (forward, _), grid, threads, shared = split_pass(rnn_split_kernels, B, n, lanes, rows,
                                                     hs.dtype)
    u = scratch("rnn_u", (T, B, n), hs.dtype)
    input_projection_gpu(u, x, W_ih, b_ih)
    forward[grid, threads, 0, shared](hs, u, transposed(W_hh, "rnn_WT"), b_hh)


def rnn_backward_gpu_split(dW_ih, dW_hh, db_ih, db_hh, dh0, da, dh_T, hs, x, W_hh, *, lanes,
                           rows=1, tile=TILE):
    """Version 3 twin of rnn_backward_cpu: one launch of the split BPTT kernel, then the weight
    gradients. Written (=): dW_ih, dW_hh, db_ih, db_hh, dh0, da."""
    (_, backward), grid, threads, shared = split_pass(rnn_split_kernels, x.shape[1],
                                                      W_hh.shape[0], lanes, rows, dh0.dtype)
    backward[grid, threads, 0, shared](dh0, da, dh_T, hs, W_hh)
    stacked_param_grads_gpu(dW_ih, dW_hh, db_ih, db_hh, da, da, hs, x, tile=tile)


# the twins, as nprnn/backends.py runs them
rnn_forward = Twins(rnn_forward_cpu, rnn_forward_gpu, rnn_forward_gpu_persistent,
                    gpu_split=rnn_forward_gpu_split)
rnn_backward = Twins(rnn_backward_cpu, rnn_backward_gpu, rnn_backward_gpu_persistent,
                     gpu_split=rnn_backward_gpu_split)

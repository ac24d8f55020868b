"""The vanilla RNN's fast GPU versions, beside the teaching file kernels/rnn.py: 2 (persistent,
one launch per pass, W_hh read from global memory) and 3 (split, several lanes per unit, W_hh in
registers; kernels/fast/antisym.py explains the design). Held to the CPU twin by
tests/gpu/test_gpu_baselines.py; the twins at the bottom are the teaching file's with these added.
"""
import functools

from numpy import uint32 as U

from .. import rnn as teaching
from ..common import dtanh_from_y, tanh
from ..gpu_common import (TILE, cuda, input_projection_gpu, lane_dot, lane_sum, load_block_rows,
                          load_lane_values, load_padded_rows, persistent_kernel, scratch,
                          split_bound, split_kernel, split_pass, stacked_param_grads_gpu,
                          state_launch, transposed, zero_shared)
from ..rnn import BACKWARD_VALUES, FORWARD_VALUES


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
        uj = U(j)                                   # unsigned indices: fast/antisym.py says why
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
            ut = U(t)
            cur = (ut & U(1)) * U(rows * stride)
            nxt = ((ut + U(1)) & U(1)) * U(rows * stride)
            for r in range(rows):
                b = b0 + r
                ub = U(b)
                u_next = u[ut + U(1), ub, uj] if leader and b < B and t + 1 < T else zero
                s = lane_sum(lane_dot(D, hbuf, cur + U(r * stride + lane), cap, lanes), lanes)
                if leader and b < B:
                    h = tanh(a_in[r] + s + c)                  # s = (W_hh h_{t-1})_j
                    hs[ut + U(1), ub, uj] = h
                    hbuf[nxt + U(r * stride) + uj] = h
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
        uj = U(j)
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
            ut = U(t)
            cur = (ut & U(1)) * U(rows * stride)
            for r in range(rows):
                b = b0 + r
                if leader and b < B:
                    ub = U(b)
                    g = dh[r] * dtanh_from_y(y[r])
                    da[ut, ub, uj] = g
                    dbuf[cur + U(r * stride) + uj] = g
                    y[r] = hs[ut, ub, uj]                # h_{t-1}, for the step before
            cuda.syncthreads()
            for r in range(rows):
                s = lane_sum(lane_dot(D, dbuf, cur + U(r * stride + lane), cap, lanes), lanes)
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


# the twins, as nprnn/core/backends.py runs them: the teaching file's, with versions 2 and 3
rnn_forward = teaching.rnn_forward._replace(gpu_persistent=rnn_forward_gpu_persistent,
                                            gpu_split=rnn_forward_gpu_split)
rnn_backward = teaching.rnn_backward._replace(gpu_persistent=rnn_backward_gpu_persistent,
                                              gpu_split=rnn_backward_gpu_split)

"""The LSTMs' fast GPU version, beside the teaching file kernels/lstm.py: 2 (persistent, one
launch per pass, W_hh read from global memory; kernels/fast/antisym.py explains the design). There
is no split version: the stacked W_hh (4n, n) does not fit a block's registers at n = 128.

Every kernel here computes a unit's step and its derivative with the teaching file's `lstm_unit`
and `lstm_unit_backward`, takes the CPU twin's arguments, and is held to the CPU twin by
tests/gpu/test_gpu_baselines.py. W_hh (4n, n) is 256 KiB at n = 128 in float32, far more than a
block's shared memory, so the kernels read it from global memory every step (all blocks read the
same matrix; it stays in the L2 cache): the forward pass reads W_hh^T (made once per call) so that
consecutive threads read consecutive addresses, and BPTT reads W_hh itself. The twins at the
bottom are the teaching file's with version 2 added; nprnn/core/cells.py runs them.
Timings: docs/gpu.md.
"""
from numpy import uint32 as U

from .. import lstm as teaching
from ..gpu_common import (TILE, cuda, load_block_rows, persistent_kernel, stacked_param_grads_gpu,
                          state_launch, transposed)
from ..lstm import (BACKWARD_VALUES, FORWARD_VALUES, lstm_unit, lstm_unit_backward,
                    peephole_grads_gpu)


@persistent_kernel
def lstm_forward_persistent_kernel(hs, cs, gates, x, W_ih, WT, b_ih, b_hh, w_ci, w_cf, w_co,
                                   peephole, rows):
    """All T steps of the (peephole) LSTM in one launch, see lstm_unit.

    Written (=): hs[1:], cs[1:] of (T+1, B, n), gates (T, B, 4n). Read: hs[0], cs[0], x (T, B, m),
    W_ih (4n, m), WT = W_hh^T (n, 4n), b_ih, b_hh (4n,), w_c* (n,). Work split: block k owns
    batch rows k*rows .. k*rows + rows - 1; thread `tid` computes units j = tid, tid + blockDim,
    ... (all four gates) of each. Shared memory: two (rows, n) copies of h, one barrier per step.
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
                    # unsigned indices: no test for negative ones (fast/antisym.py)
                    h0, j0 = U(cur + r * n), U(j)
                    j1, j2, j3 = j0 + U(n), j0 + U(2 * n), j0 + U(3 * n)
                    for k in range(n):
                        uk = U(k)
                        hk = hbuf[h0 + uk]
                        a_i += WT[uk, j0] * hk
                        a_f += WT[uk, j1] * hk
                        a_g += WT[uk, j2] * hk
                        a_o += WT[uk, j3] * hk
                    i, f, g, o, c, h = lstm_unit(a_i, a_f, a_g, a_o, cs[t, b, j], w_ci[j],
                                                 w_cf[j], w_co[j], peephole)
                    gates[t, b, j] = i
                    gates[t, b, n + j] = f
                    gates[t, b, 2 * n + j] = g
                    gates[t, b, 3 * n + j] = o
                    cs[t + 1, b, j] = c
                    hs[t + 1, b, j] = h
                    hbuf[nxt + r * n + j] = h
        cuda.syncthreads()


@persistent_kernel
def lstm_backward_persistent_kernel(dh0, dc0, da, dh_T, cs, gates, W_hh, w_ci, w_cf, w_co,
                                    peephole, rows):
    """BPTT through all T steps of the (peephole) LSTM in one launch (lstm_unit_backward, then
    dh_{t-1} = da_t W_hh in row form; the dL/dc_t arriving through c_{t+1} starts as dc0's).

    Written (=): dh0 (B, n), da (T, B, 4n). Updated: dc0 (B, n), dL/dc_T in, dL/dc_0 out.
    Read: dh_T (B, n), cs (T+1, B, n), gates, W_hh (4n, n),
    w_c* (n,). Work split as in the forward kernel. Shared memory: the rows' dL/dh and dL/dc
    (each value touched only by its owner thread) and two copies of their da_t (4n values per
    row; one barrier per step).
    """
    T, B, n = cs.shape[0] - 1, cs.shape[1], cs.shape[2]
    tid, nthreads = cuda.threadIdx.x, cuda.blockDim.x
    b0 = cuda.blockIdx.x * rows
    smem = cuda.shared.array(0, dtype=dh0.dtype)
    dh = smem[:rows * n]
    dc = smem[rows * n:2 * rows * n]
    dbuf = smem[2 * rows * n:10 * rows * n]              # two copies of (rows, 4n)
    for r in range(rows):                  # dL/dh_T and dL/dc_T in
        b = b0 + r
        if b < B:
            for j in range(tid, n, nthreads):
                dh[r * n + j] = dh_T[b, j]
                dc[r * n + j] = dc0[b, j]
    for t in range(T - 1, -1, -1):
        cur = (t % 2) * rows * 4 * n
        for r in range(rows):
            b = b0 + r
            if b < B:
                for j in range(tid, n, nthreads):
                    da_i, da_f, da_g, da_o, dc_prev = lstm_unit_backward(
                        dh[r * n + j], dc[r * n + j], gates[t, b, j], gates[t, b, n + j],
                        gates[t, b, 2 * n + j], gates[t, b, 3 * n + j], cs[t, b, j],
                        cs[t + 1, b, j], w_ci[j], w_cf[j], w_co[j], peephole)
                    da[t, b, j] = da_i
                    da[t, b, n + j] = da_f
                    da[t, b, 2 * n + j] = da_g
                    da[t, b, 3 * n + j] = da_o
                    row = cur + r * 4 * n
                    dbuf[row + j] = da_i
                    dbuf[row + n + j] = da_f
                    dbuf[row + 2 * n + j] = da_g
                    dbuf[row + 3 * n + j] = da_o
                    dc[r * n + j] = dc_prev
        cuda.syncthreads()
        for r in range(rows):
            b = b0 + r
            if b < B:
                row = cur + r * 4 * n
                for j in range(tid, n, nthreads):
                    # dh_{t-1}[j] = sum_k da_t[k] W_hh[k, j], one accumulator per gate block:
                    # four chains of n dependent multiply-adds, as in the forward pass, rather
                    # than one of 4n (docs/gpu.md)
                    acc_i = acc_f = acc_g = acc_o = dh.dtype.type(0)
                    r0, uj, un = U(row), U(j), U(n)    # unsigned indices (fast/antisym.py)
                    for k in range(n):
                        k0 = U(k)
                        k1, k2, k3 = k0 + un, k0 + U(2) * un, k0 + U(3) * un
                        acc_i += dbuf[r0 + k0] * W_hh[k0, uj]
                        acc_f += dbuf[r0 + k1] * W_hh[k1, uj]
                        acc_g += dbuf[r0 + k2] * W_hh[k2, uj]
                        acc_o += dbuf[r0 + k3] * W_hh[k3, uj]
                    dh[r * n + j] = (acc_i + acc_f) + (acc_g + acc_o)
    for r in range(rows):
        b = b0 + r
        if b < B:
            for j in range(tid, n, nthreads):
                dh0[b, j] = dh[r * n + j]
                dc0[b, j] = dc[r * n + j]


def _forward_persistent(hs, cs, gates, x, W_ih, W_hh, b_ih, b_hh, w_ci, w_cf, w_co, peephole,
                        rows, threads):
    T, B, _ = x.shape
    n = W_hh.shape[1]
    grid, threads, shared = state_launch(B, n, hs.dtype, FORWARD_VALUES * n, rows, threads)
    WT = transposed(W_hh, "lstm_WT")
    lstm_forward_persistent_kernel[grid, threads, 0, shared](
        hs, cs, gates, x, W_ih, WT, b_ih, b_hh, w_ci, w_cf, w_co, peephole, rows)


def _backward_persistent(dh0, dc, da, dh_T, cs, gates, W_hh, w_ci, w_cf, w_co, peephole, rows,
                         threads):
    B, n = dh0.shape
    grid, threads, shared = state_launch(B, n, dh0.dtype, BACKWARD_VALUES * n, rows, threads)
    lstm_backward_persistent_kernel[grid, threads, 0, shared](
        dh0, dc, da, dh_T, cs, gates, W_hh, w_ci, w_cf, w_co, peephole, rows)


def lstm_forward_gpu_persistent(hs, cs, gates, x, W_ih, W_hh, b_ih, b_hh, *, rows=1,
                                threads=None):
    """Version 2 twin of lstm_forward_cpu: W_hh^T into a scratch buffer, then one launch of
    lstm_forward_persistent_kernel. Written (=): hs[1:], cs[1:], gates."""
    _forward_persistent(hs, cs, gates, x, W_ih, W_hh, b_ih, b_hh, b_ih, b_ih, b_ih, False, rows,
                        threads)


def peephole_lstm_forward_gpu_persistent(hs, cs, gates, x, W_ih, W_hh, b_ih, b_hh, w_ci, w_cf,
                                         w_co, *, rows=1, threads=None):
    """Version 2 twin of peephole_lstm_forward_cpu."""
    _forward_persistent(hs, cs, gates, x, W_ih, W_hh, b_ih, b_hh, w_ci, w_cf, w_co, True, rows,
                        threads)


def lstm_backward_gpu_persistent(dW_ih, dW_hh, db_ih, db_hh, dh0, dc, da, dh_T, hs, cs, gates,
                                 x, W_hh, *, rows=1, threads=None, tile=TILE):
    """Version 2 twin of lstm_backward_cpu: one launch of lstm_backward_persistent_kernel, then
    the weight gradients. Written (=): dW_ih, dW_hh, db_ih, db_hh, dh0, da. Updated: dc."""
    _backward_persistent(dh0, dc, da, dh_T, cs, gates, W_hh, db_ih, db_ih, db_ih, False, rows,
                         threads)
    stacked_param_grads_gpu(dW_ih, dW_hh, db_ih, db_hh, da, da, hs, x, tile=tile)


def peephole_lstm_backward_gpu_persistent(dW_ih, dW_hh, db_ih, db_hh, dw_ci, dw_cf, dw_co, dh0,
                                          dc, da, dh_T, hs, cs, gates, x, W_hh, w_ci, w_cf, w_co,
                                          *, rows=1, threads=None, tile=TILE):
    """Version 2 twin of peephole_lstm_backward_cpu."""
    _backward_persistent(dh0, dc, da, dh_T, cs, gates, W_hh, w_ci, w_cf, w_co, True, rows,
                         threads)
    stacked_param_grads_gpu(dW_ih, dW_hh, db_ih, db_hh, da, da, hs, x, tile=tile)
    peephole_grads_gpu(dw_ci, dw_cf, dw_co, da, cs)


# the twins, as nprnn/core/backends.py runs them: the teaching file's, with version 2
lstm_forward = teaching.lstm_forward._replace(gpu_persistent=lstm_forward_gpu_persistent)
lstm_backward = teaching.lstm_backward._replace(gpu_persistent=lstm_backward_gpu_persistent)
peephole_lstm_forward = teaching.peephole_lstm_forward._replace(
    gpu_persistent=peephole_lstm_forward_gpu_persistent)
peephole_lstm_backward = teaching.peephole_lstm_backward._replace(
    gpu_persistent=peephole_lstm_backward_gpu_persistent)

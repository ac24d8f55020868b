"""The GRU's fast GPU version, beside the teaching file kernels/gru.py: 2 (persistent, one launch
per pass, W_hh read from global memory; kernels/fast/antisym.py explains the design). There is no
split version: the stacked W_hh (3n, n) does not fit a block's registers at n = 128.

Every kernel here computes a unit's step and its derivative with the teaching file's `gru_unit`
and `gru_unit_backward`, takes the CPU twin's arguments, and is held to the CPU twin by
tests/gpu/test_gpu_baselines.py. W_hh (3n, n) is 192 KiB at n = 128 in float32, more than a
block's shared memory, so the kernels read it from global memory every step (all blocks read the
same matrix; it stays in the L2 cache): the forward pass reads W_hh^T (made once per call) so that
consecutive threads read consecutive addresses, and BPTT reads W_hh itself. The twins at the
bottom are the teaching file's with version 2 added; nprnn/core/cells.py runs them.
Timings: docs/gpu.md.
"""
from numpy import uint32 as U

from .. import gru as teaching
from ..gpu_common import (TILE, cuda, load_block_rows, persistent_kernel, stacked_param_grads_gpu,
                          state_launch, transposed)
from ..gru import BACKWARD_VALUES, FORWARD_VALUES, gru_unit, gru_unit_backward


@persistent_kernel
def gru_forward_persistent_kernel(hs, gates, hn, x, W_ih, WT, b_ih, b_hh, rows):
    """All T steps in one launch, see gru_unit.

    Written (=): hs[1:] of (T+1, B, n), gates (T, B, 3n), hn (T, B, n). Read: hs[0], x (T, B, m),
    W_ih (3n, m), WT = W_hh^T (n, 3n), b_ih, b_hh (3n,). Work split: block k owns batch rows
    k*rows .. k*rows + rows - 1; thread `tid` computes units j = tid, tid + blockDim, ... (all
    three gates) of each. Shared memory: two (rows, n) copies of h, one barrier per step.
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
        for row in range(rows):
            b = b0 + row
            if b < B:
                for j in range(tid, n, nthreads):
                    gi_r, gi_z, gi_n = b_ih[j], b_ih[n + j], b_ih[2 * n + j]
                    gh_r, gh_z, gh_n = b_hh[j], b_hh[n + j], b_hh[2 * n + j]
                    for k in range(m):
                        xk = x[t, b, k]
                        gi_r += W_ih[j, k] * xk
                        gi_z += W_ih[n + j, k] * xk
                        gi_n += W_ih[2 * n + j, k] * xk
                    # unsigned indices: no test for negative ones (fast/antisym.py)
                    h0, j0 = U(cur + row * n), U(j)
                    j1, j2 = j0 + U(n), j0 + U(2 * n)
                    for k in range(n):
                        uk = U(k)
                        hk = hbuf[h0 + uk]
                        gh_r += WT[uk, j0] * hk
                        gh_z += WT[uk, j1] * hk
                        gh_n += WT[uk, j2] * hk
                    r, z, n_t, h = gru_unit(gi_r, gi_z, gi_n, gh_r, gh_z, gh_n,
                                            hbuf[cur + row * n + j])
                    gates[t, b, j] = r
                    gates[t, b, n + j] = z
                    gates[t, b, 2 * n + j] = n_t
                    hn[t, b, j] = gh_n
                    hs[t + 1, b, j] = h
                    hbuf[nxt + row * n + j] = h
        cuda.syncthreads()


@persistent_kernel
def gru_backward_persistent_kernel(dh0, dgi, dgh, dh_T, hs, gates, hn, W_hh, rows):
    """BPTT through all T steps in one launch (gru_unit_backward, then
    dh_{t-1} = dh_t * z + dgh_t W_hh in row form).

    Written (=): dh0 (B, n), dgi, dgh (T, B, 3n). Read: dh_T (B, n), hs, gates, hn, W_hh (3n, n).
    Work split as in the forward kernel. Shared memory: the rows' dL/dh (each value touched only
    by its owner thread) and two copies of their dgh_t (3n values per row; one barrier per step).
    """
    T, B, n = hn.shape
    tid, nthreads = cuda.threadIdx.x, cuda.blockDim.x
    b0 = cuda.blockIdx.x * rows
    smem = cuda.shared.array(0, dtype=dh0.dtype)
    dh = smem[:rows * n]
    dbuf = smem[rows * n:7 * rows * n]                   # two copies of (rows, 3n)
    load_block_rows(dh, dh_T, b0, rows)
    for t in range(T - 1, -1, -1):
        cur = (t % 2) * rows * 3 * n
        for row in range(rows):
            b = b0 + row
            if b < B:
                base = cur + row * 3 * n
                for j in range(tid, n, nthreads):
                    r = gates[t, b, j]
                    da_r, da_z, da_n, dgh_n, carry = gru_unit_backward(
                        dh[row * n + j], r, gates[t, b, n + j], gates[t, b, 2 * n + j],
                        hn[t, b, j], hs[t, b, j])
                    dgi[t, b, j] = da_r
                    dgi[t, b, n + j] = da_z
                    dgi[t, b, 2 * n + j] = da_n
                    dgh[t, b, j] = da_r
                    dgh[t, b, n + j] = da_z
                    dgh[t, b, 2 * n + j] = dgh_n
                    dbuf[base + j] = da_r
                    dbuf[base + n + j] = da_z
                    dbuf[base + 2 * n + j] = dgh_n
                    dh[row * n + j] = carry
        cuda.syncthreads()
        for row in range(rows):
            b = b0 + row
            if b < B:
                base = cur + row * 3 * n
                for j in range(tid, n, nthreads):
                    # dh_{t-1}[j] += sum_k dgh_t[k] W_hh[k, j], one accumulator per gate block
                    # (three chains of n dependent multiply-adds, not one of 3n)
                    acc_r = acc_z = acc_n = dh.dtype.type(0)
                    d0, uj, un = U(base), U(j), U(n)   # unsigned indices (fast/antisym.py)
                    for k in range(n):
                        k0 = U(k)
                        k1, k2 = k0 + un, k0 + U(2) * un
                        acc_r += dbuf[d0 + k0] * W_hh[k0, uj]
                        acc_z += dbuf[d0 + k1] * W_hh[k1, uj]
                        acc_n += dbuf[d0 + k2] * W_hh[k2, uj]
                    dh[row * n + j] += (acc_r + acc_z) + acc_n
    for row in range(rows):
        b = b0 + row
        if b < B:
            for j in range(tid, n, nthreads):
                dh0[b, j] = dh[row * n + j]


def gru_forward_gpu_persistent(hs, gates, hn, x, W_ih, W_hh, b_ih, b_hh, *, rows=1,
                               threads=None):
    """Version 2 twin of gru_forward_cpu: W_hh^T into a scratch buffer, then one launch of
    gru_forward_persistent_kernel. Written (=): hs[1:], gates, hn."""
    T, B, _ = x.shape
    n = W_hh.shape[1]
    grid, threads, shared = state_launch(B, n, hs.dtype, FORWARD_VALUES * n, rows, threads)
    WT = transposed(W_hh, "gru_WT")
    gru_forward_persistent_kernel[grid, threads, 0, shared](hs, gates, hn, x, W_ih, WT, b_ih,
                                                            b_hh, rows)


def gru_backward_gpu_persistent(dW_ih, dW_hh, db_ih, db_hh, dh0, dgi, dgh, dh_T, hs, gates, hn,
                                x, W_hh, *, rows=1, threads=None, tile=TILE):
    """Version 2 twin of gru_backward_cpu: one launch of gru_backward_persistent_kernel, then
    the weight gradients. Written (=): dW_ih, dW_hh, db_ih, db_hh, dh0, dgi, dgh."""
    T, B, _ = x.shape
    n = W_hh.shape[1]
    grid, threads, shared = state_launch(B, n, dh0.dtype, BACKWARD_VALUES * n, rows, threads)
    gru_backward_persistent_kernel[grid, threads, 0, shared](dh0, dgi, dgh, dh_T, hs, gates, hn,
                                                             W_hh, rows)
    stacked_param_grads_gpu(dW_ih, dW_hh, db_ih, db_hh, dgi, dgh, hs, x, tile=tile)


# the twins, as nprnn/core/backends.py runs them: the teaching file's, with version 2
gru_forward = teaching.gru_forward._replace(gpu_persistent=gru_forward_gpu_persistent)
gru_backward = teaching.gru_backward._replace(gpu_persistent=gru_backward_gpu_persistent)

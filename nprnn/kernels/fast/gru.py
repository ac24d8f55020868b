"""The GRU's fast GPU versions, beside the teaching file kernels/gru.py: 2 (persistent, one launch
per pass, W_hh read from global memory; kernels/fast/antisym.py explains the design) and 3 (split,
W_hh on chip: in registers, and the part that does not fit them in shared memory).

Every kernel here computes a unit's step and its derivative with the teaching file's `gru_unit`
and `gru_unit_backward`, takes the CPU twin's arguments, and is held to the CPU twin by
tests/gpu/test_gpu_baselines.py. W_hh (3n, n) is 192 KiB at n = 128 in float32, more than a
block's shared memory, so version 2 reads it from global memory every step (all blocks read the
same matrix; it stays in the L2 cache): the forward pass reads W_hh^T (made once per call) so that
consecutive threads read consecutive addresses, and BPTT reads W_hh itself. Version 3 keeps it on
chip (below). The twins at the bottom are the teaching file's with versions 2 and 3 added;
nprnn/core/cells.py runs them. Timings: docs/gpu.md.
"""
import functools
from typing import NamedTuple

import numpy as np
from numpy import uint32 as U

from .. import gru as teaching
from ..gpu_common import (MAX_THREADS_PER_BLOCK, REGISTERS_PER_THREAD_MAX, SHARED_BYTES_MAX,
                          SPLIT_LANES, TILE, cdiv, cuda,
                          input_projection_gpu, lane_sum, load_block_rows,
                          load_lane_values, load_padded_rows,
                          persistent_kernel, round_up, scratch, split_bound, split_capacity,
                          split_kernel, split_threads, stacked_param_grads_gpu, state_launch,
                          transposed, zero_shared)
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


# -- version 3: split, W_hh on chip --------------------------------------------------------------
# As rnn's version 3 (fast/rnn.py; fast/antisym.py explains the design): one block per batch row
# (or `rows` of them), `lanes` threads per unit j, each lane holding its share of unit j's matrix
# values, the partial dot products added by warp shuffles. Unit j needs three rows of W_hh in the
# forward pass (W_hr, W_hz, W_hn: gates r, z, n) and its three columns j in BPTT: 3 cap values
# per lane (cap = ceil(n / lanes)). At n = 128 in float32 that is 96 values at 4 lanes, more
# than the 128 registers a thread of a 512-thread block may have beside what the kernel needs
# else. So a lane keeps gates r's and z's values in registers, and of gate n's the first
# `n_held` (as many as fit) and the rest in shared memory, each thread its own, at
# [(k - n_held) threads + tid]: consecutive threads read consecutive addresses (no bank
# conflicts), and no thread reads another's (no barrier). All of W_hh stays on chip: 192 KiB at
# n = 128 float32, which version 2 reads from L2 in every block at every step. Every loop over
# a lane's values has a constant trip count, so that the compiler unrolls it and the register
# arrays are indexed by constants (else they would live in local memory: tests/test_ptx.py).

FORWARD_SPLIT_VALUES, BACKWARD_SPLIT_VALUES = 2, 6   # state vectors of `stride` per row in shared
# Registers the split GRU kernels need beside the matrix values (gpu_common.SPLIT_OTHER_REGISTERS
# for the simpler split kernels): its step reads three gates and keeps more values live. Set
# from ptxas for sm_90 at each lanes' tightest n, as tests/test_ptx.py checks (no spills).
GRU_OTHER_REGISTERS = 104


class SplitPlan(NamedTuple):
    """How a split GRU pass holds W_hh: `cap` values per gate and lane, of gate n's the first
    `n_held` in registers (gates r's and z's all), the rest in shared memory; the shared bytes
    of its forward and BPTT blocks."""
    cap: int
    n_held: int
    forward_shared: int
    backward_shared: int


def gru_split_plan(n, lanes, dtype, rows=1, most_n_held=None):
    """The SplitPlan at n units, `lanes` lanes per unit and `rows` batch rows per block, or None
    where it does not fit: at most MAX_THREADS_PER_BLOCK threads; registers for gates r's and
    z's values, n_held of gate n's and GRU_OTHER_REGISTERS more within a thread's share
    (gpu_common.split_fits); shared memory for the rest and the rows' states within
    SHARED_BYTES_MAX. most_n_held caps n_held (the tests' way to the shared part at small n)."""
    threads = split_threads(n, lanes)
    if lanes not in SPLIT_LANES or threads > MAX_THREADS_PER_BLOCK or rows < 1:
        return None
    size = np.dtype(dtype).itemsize
    cap = split_capacity(n, lanes)
    available = min(REGISTERS_PER_THREAD_MAX, 65536 // round_up(threads, 128) // 8 * 8)
    n_held = (available - GRU_OTHER_REGISTERS) // (size // 4) - 2 * cap
    if n_held < 0:
        return None
    n_held = min(cap, n_held, cap if most_n_held is None else most_n_held)
    matrix = (cap - n_held) * threads * size
    stride = cap * lanes
    forward, backward = (matrix + values * rows * stride * size
                         for values in (FORWARD_SPLIT_VALUES, BACKWARD_SPLIT_VALUES))
    if backward > SHARED_BYTES_MAX:
        return None
    return SplitPlan(cap, n_held, forward, backward)


def gru_split_lanes(n, dtype):
    """The lanes per unit with which split GRU passes fit at n units, each lane keeping two
    values of each gate or more (gpu_common.split_lanes)."""
    return [lanes for lanes in SPLIT_LANES if gru_split_plan(n, lanes, dtype) is not None
            and (split_capacity(n, lanes) >= 2 or lanes == SPLIT_LANES[0])]


@functools.lru_cache(maxsize=None)
def gru_split_kernels(cap, lanes, rows, n_held):
    """The version 3 (forward, backward) kernels for cap values per gate and lane, `lanes` lanes
    per unit, `rows` batch rows per block and n_held of gate n's values per lane in registers
    (each combination compiled once)."""
    stride = cap * lanes
    n_spare = cap - n_held                      # gate n's values per lane in shared memory
    n_size = max(n_held, 1)                     # D_n's size (a local array has one at least)

    @cuda.jit(device=True)
    def load_n_spare(sW, W, j, lane, by_row):
        """Gate n's values k >= n_held of this lane into sW (see load_values)."""
        n = W.shape[1]
        tid, threads = U(cuda.threadIdx.x), U(cuda.blockDim.x)
        for k in range(n_spare):
            i = lane + (n_held + k) * lanes
            w = W.dtype.type(0)
            if j < n and i < n:
                w = W[2 * n + j, i] if by_row else W[2 * n + i, j]
            sW[U(k) * threads + tid] = w

    @cuda.jit(device=True)
    def load_values(D_r, D_z, D_n, sW, W, j, lane, by_row):
        """This lane's values k < cap of gate g: W_hh[g n + j, lane + k lanes] (by_row: unit
        j's rows, the forward's) or W_hh[g n + lane + k lanes, j] (its columns, BPTT's), 0 past
        n; gates r's and z's in D_r, D_z, gate n's first n_held in D_n, the rest in sW."""
        n = W.shape[1]
        W_r, W_z, W_n = W[:n], W[n:2 * n], W[2 * n:]
        if by_row:                                  # load_lane_values reads a column
            W_r, W_z, W_n = W_r.T, W_z.T, W_n.T
        load_lane_values(D_r, W_r, j, lane, cap, lanes)
        load_lane_values(D_z, W_z, j, lane, cap, lanes)
        load_lane_values(D_n, W_n, j, lane, n_held, lanes)
        load_n_spare(sW, W, j, lane, by_row)

    @cuda.jit(device=True)
    def gate_dots(D_r, D_z, D_n, sW, v_r, v_z, v_n, start):
        """This lane's shares of the three gates' dot products, sum_k value_g(k) v_g[start + k
        lanes] for g = r, z, n, in one loop: each element read once and used at once (three
        separate loops over one vector, the forward's, would keep all its cap elements live)."""
        tid, threads = U(cuda.threadIdx.x), U(cuda.blockDim.x)
        acc_r = v_r.dtype.type(0)
        acc_z = v_r.dtype.type(0)
        acc_n = v_r.dtype.type(0)
        base = U(start)
        for k in range(n_held):                     # gate n's value in a register
            at = base + U(k * lanes)
            acc_r += D_r[k] * v_r[at]
            acc_z += D_z[k] * v_z[at]
            acc_n += D_n[k] * v_n[at]
        for k in range(n_held, cap):                # gate n's value in shared memory
            at = base + U(k * lanes)
            acc_r += D_r[k] * v_r[at]
            acc_z += D_z[k] * v_z[at]
            acc_n += sW[U(k - n_held) * threads + tid] * v_n[at]
        return acc_r, acc_z, acc_n

    @split_kernel(split_bound(cap, lanes))
    def gru_forward_split_kernel(hs, gates, hn, u, W_hh, b_hh):
        """All T steps of gru_unit, gi_t = u_t = W_ih x_t + b_ih given.
        Written (=): hs[1:] (T+1, B, n), gates (T, B, 3n), hn (T, B, n). Read: hs[0], u
        (T, B, 3n), W_hh (3n, n), b_hh (3n,). Shared memory: two copies of the rows' h (one
        barrier per step), then the lanes' matrix values that registers do not hold."""
        T, B, n = hn.shape
        tid = cuda.threadIdx.x
        j, lane = tid // lanes, tid % lanes
        leader = j < n and lane == 0
        b0 = cuda.blockIdx.x * rows
        uj, un = U(j), U(n)                         # unsigned indices: fast/antisym.py says why
        zero = hs.dtype.type(0)
        smem = cuda.shared.array(0, hs.dtype)
        hbuf = smem[:2 * rows * stride]
        sW = smem[2 * rows * stride:]
        D_r = cuda.local.array(cap, hs.dtype)
        D_z = cuda.local.array(cap, hs.dtype)
        D_n = cuda.local.array(n_size, hs.dtype)
        load_values(D_r, D_z, D_n, sW, W_hh, j, lane, True)
        c_r = b_hh[j] if j < n else zero
        c_z = b_hh[n + j] if j < n else zero
        c_n = b_hh[2 * n + j] if j < n else zero
        load_padded_rows(hbuf, hs[0], b0, rows, stride)
        for t in range(T):
            ut = U(t)
            cur = (ut & U(1)) * U(rows * stride)
            nxt = ((ut + U(1)) & U(1)) * U(rows * stride)
            for r in range(rows):
                b = b0 + r
                start = cur + U(r * stride + lane)
                # gh = W_hh h_{t-1} + b_hh, one gate at a time
                s_r, s_z, s_n = gate_dots(D_r, D_z, D_n, sW, hbuf, hbuf, hbuf, start)
                s_r = lane_sum(s_r, lanes)
                s_z = lane_sum(s_z, lanes)
                s_n = lane_sum(s_n, lanes)
                if leader and b < B:
                    ub = U(b)
                    here = cur + U(r * stride) + uj
                    gh_n = s_n + c_n
                    g_r, g_z, n_t, h = gru_unit(u[ut, ub, uj], u[ut, ub, uj + un],
                                                u[ut, ub, uj + U(2) * un], s_r + c_r, s_z + c_z,
                                                gh_n, hbuf[here])
                    gates[ut, ub, uj] = g_r
                    gates[ut, ub, uj + un] = g_z
                    gates[ut, ub, uj + U(2) * un] = n_t
                    hn[ut, ub, uj] = gh_n
                    hs[ut + U(1), ub, uj] = h
                    hbuf[nxt + U(r * stride) + uj] = h
            cuda.syncthreads()

    @split_kernel(split_bound(cap, lanes))
    def gru_backward_split_kernel(dh0, dgi, dgh, dh_T, hs, gates, hn, W_hh):
        """BPTT through all T steps: gru_unit_backward, then
        dh_{t-1} = dh_t z + W_hr^T da_r + W_hz^T da_z + W_hn^T dgh_n (the row form's dgh_t W_hh).
        Written (=): dh0 (B, n), dgi, dgh (T, B, 3n). Read: dh_T (B, n), hs, gates, hn, W_hh.
        The leader keeps dL/dh of its unit in a register; shared memory holds two copies of the
        rows' (da_r, da_z, dgh_n), then the lanes' matrix values that registers do not hold."""
        T, B, n = hn.shape
        tid = cuda.threadIdx.x
        j, lane = tid // lanes, tid % lanes
        leader = j < n and lane == 0
        b0 = cuda.blockIdx.x * rows
        uj, un = U(j), U(n)
        smem = cuda.shared.array(0, dh0.dtype)
        dbuf = smem[:2 * rows * 3 * stride]
        sW = smem[2 * rows * 3 * stride:]
        D_r = cuda.local.array(cap, dh0.dtype)
        D_z = cuda.local.array(cap, dh0.dtype)
        D_n = cuda.local.array(n_size, dh0.dtype)
        load_values(D_r, D_z, D_n, sW, W_hh, j, lane, False)
        dh = cuda.local.array(rows, dh0.dtype)      # the leader's dL/dh_t[b, j] of each row
        zero_shared(dbuf, 2 * rows * 3 * stride)
        for r in range(rows):
            if leader and b0 + r < B:
                dh[r] = dh_T[b0 + r, j]
        for t in range(T - 1, -1, -1):
            ut = U(t)
            cur = (ut & U(1)) * U(rows * 3 * stride)
            for r in range(rows):
                b = b0 + r
                if leader and b < B:
                    ub = U(b)
                    # forward was: (r, z, n_t, h_t) = gru_unit(gi, gh, h_{t-1})
                    # so:          the gates' gradients and dh_t z by gru_unit_backward
                    d_r, d_z, d_n, dgh_n, carry = gru_unit_backward(
                        dh[r], gates[ut, ub, uj], gates[ut, ub, uj + un],
                        gates[ut, ub, uj + U(2) * un], hn[ut, ub, uj], hs[ut, ub, uj])
                    dgi[ut, ub, uj] = d_r
                    dgi[ut, ub, uj + un] = d_z
                    dgi[ut, ub, uj + U(2) * un] = d_n
                    dgh[ut, ub, uj] = d_r
                    dgh[ut, ub, uj + un] = d_z
                    dgh[ut, ub, uj + U(2) * un] = dgh_n
                    here = cur + U(r * 3 * stride) + uj
                    dbuf[here] = d_r
                    dbuf[here + U(stride)] = d_z
                    dbuf[here + U(2 * stride)] = dgh_n
                    dh[r] = carry
            cuda.syncthreads()
            for r in range(rows):
                # forward was: gh = W_hh h_{t-1} + b_hh
                # so:          dh_{t-1}[j] += sum over the gates g of (W_hg^T dgh_g)_j
                at = cur + U(r * 3 * stride)
                d_r = dbuf[at:at + U(stride)]
                d_z = dbuf[at + U(stride):at + U(2 * stride)]
                d_n = dbuf[at + U(2 * stride):at + U(3 * stride)]
                s_r, s_z, s_n = gate_dots(D_r, D_z, D_n, sW, d_r, d_z, d_n, lane)
                s = lane_sum((s_r + s_z) + s_n, lanes)
                if leader and b0 + r < B:
                    dh[r] += s
        for r in range(rows):
            if leader and b0 + r < B:
                dh0[b0 + r, j] = dh[r]

    return gru_forward_split_kernel, gru_backward_split_kernel


def _split_pass(n, lanes, rows, dtype):
    """(SplitPlan, kernels) of a split pass; ValueError where it cannot run."""
    plan = gru_split_plan(n, lanes, dtype, rows)
    if plan is None:
        raise ValueError(f"a split GRU pass cannot run n={n} units with lanes={lanes} and "
                         f"rows={rows} in {np.dtype(dtype).name}: lanes must be one of "
                         f"{gru_split_lanes(n, dtype)} at rows=1 (threads, registers and shared "
                         f"memory within a block's)")
    return plan, gru_split_kernels(plan.cap, lanes, rows, plan.n_held)


def gru_forward_gpu_split(hs, gates, hn, x, W_ih, W_hh, b_ih, b_hh, *, lanes, rows=1):
    """Version 3 twin of gru_forward_cpu: u = x W_ih^T + b_ih for every step into a scratch
    buffer, then one launch of the split forward kernel. Written (=): hs[1:], gates, hn."""
    T, B, _ = x.shape
    n = W_hh.shape[1]
    plan, (forward, _) = _split_pass(n, lanes, rows, hs.dtype)
    u = scratch("gru_u", (T, B, 3 * n), hs.dtype)
    input_projection_gpu(u, x, W_ih, b_ih)
    forward[cdiv(B, rows), split_threads(n, lanes), 0, plan.forward_shared](hs, gates, hn, u,
                                                                           W_hh, b_hh)


def gru_backward_gpu_split(dW_ih, dW_hh, db_ih, db_hh, dh0, dgi, dgh, dh_T, hs, gates, hn, x,
                           W_hh, *, lanes, rows=1, tile=TILE):
    """Version 3 twin of gru_backward_cpu: one launch of the split BPTT kernel, then the weight
    gradients. Written (=): dW_ih, dW_hh, db_ih, db_hh, dh0, dgi, dgh."""
    B, n = dh0.shape
    plan, (_, backward) = _split_pass(n, lanes, rows, dh0.dtype)
    backward[cdiv(B, rows), split_threads(n, lanes), 0, plan.backward_shared](
        dh0, dgi, dgh, dh_T, hs, gates, hn, W_hh)
    stacked_param_grads_gpu(dW_ih, dW_hh, db_ih, db_hh, dgi, dgh, hs, x, tile=tile)


# the twins, as nprnn/core/backends.py runs them: the teaching file's, with versions 2 and 3
gru_forward = teaching.gru_forward._replace(gpu_persistent=gru_forward_gpu_persistent,
                                            gpu_split=gru_forward_gpu_split)
gru_backward = teaching.gru_backward._replace(gpu_persistent=gru_backward_gpu_persistent,
                                              gpu_split=gru_backward_gpu_split)

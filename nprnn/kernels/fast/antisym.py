"""The Euler family's fast GPU versions: 2 (persistent, one launch per pass) and 3 (split, the
matrix in registers), beside the teaching file kernels/antisym.py, as llm.c keeps its kernel
versions in dev/cuda/ beside the one a reader learns from.

Every version here computes a unit's step and its derivative with the teaching file's functions
(`euler_unit`, `euler_gated_unit` and their `_backward`s), takes the CPU twin's arguments, and is
held to the CPU twin by tests/gpu/test_gpu_euler.py. The twins at the bottom are the teaching
file's with these versions added; nprnn/core/cells.py runs them. Timings: docs/gpu.md.
"""
import functools
from typing import NamedTuple

import numpy as np
from numpy import uint32 as U

from ..gpu_common import (SHARED_BYTES_MAX, TILE, cuda, input_projection_gpu, lane_dot,
                          lane_sum, load_block_rows, load_lane_values, load_padded_rows,
                          persistent_grid, persistent_kernel, split_bound, split_kernel,
                          split_pass, transposed, zero_shared)
from .. import antisym as teaching
from ..antisym import (euler_gated_unit, euler_gated_unit_backward,
                       euler_input_grads_gpu, euler_param_grads_gpu, euler_unit,
                       euler_unit_backward)


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
# fit a pass, global first (the faster on the one GPU measured: docs/gpu.md);
# nprnn/core/autotune.py times them on the user's own GPU.

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
    ui, un = U(i), U(n)             # unsigned: no test for negative indices (see below)
    up = U(0)                       # diag_start(k, n) at k = 1
    down = U(n * (n - 1) // 2 - 1)  # diag_start(n - k, n) at k = 1: the last diagonal, one value
    for k in range(1, n):
        uk = U(k)
        j = ui + uk
        if j < un:                                  # above the diagonal: S[i, j]
            acc += P[up + ui] * v[j]
        else:                                       # below: S[i, j] = -S[j, i], j = i + k - n
            j -= un
            acc -= P[down + j] * v[j]
        up += un - uk               # diagonal k holds n - k values
        down -= uk + U(1)           # diagonal n - k - 1 holds k + 1 values (wraps after the last)
    return acc


@cuda.jit(device=True)
def dense_dot(M, v, i, n):
    """sum_j D[j, i] v[j] for the n x n matrix D held row by row in the flat array M."""
    acc = v.dtype.type(0)
    e, un = U(i), U(n)              # e = j n + i
    for j in range(n):
        acc += M[e] * v[U(j)]
        e += un
    return acc


@cuda.jit(device=True)
def column_dot(D, v, i, n):
    """sum_j D[j, i] v[j] for D (n, n) in global memory."""
    acc = v.dtype.type(0)
    ui = U(i)
    for j in range(n):
        uj = U(j)
        acc += D[uj, ui] * v[uj]
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
# multiply-adds, each waiting for a load: a step is a chain of about n latencies (measured:
# docs/gpu.md). Version 3 gives each unit
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
# (`euler_split_kernels`), so that loops over them unroll and their arrays live in registers.
# Indices inside the time loop are unsigned (U, numpy's uint32): for a signed index numba adds a
# test and a select for Python's negative indices to every access, which made 57-70% of a step's
# instructions integer work (tests/test_sass.py counts them; docs/gpu.md has the table);
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
        ui = U(i)                                   # unsigned indices: module comment
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
            ut = U(t)
            cur = (ut & U(1)) * U(rows * stride)
            nxt = ((ut + U(1)) & U(1)) * U(rows * stride)
            for r in range(rows):
                b = b0 + r
                ub = U(b)
                u_next = th[ut + U(1), ub, ui] if leader and b < B and t + 1 < T else zero
                s = lane_sum(lane_dot(D, hbuf, cur + U(r * stride + lane), cap, lanes), lanes)
                if leader and b < B:
                    y, h_new = euler_unit(s + u[r], h[r], eps)      # s = (A h_{t-1})_i
                    th[ut, ub, ui] = y
                    hs[ut + U(1), ub, ui] = h_new
                    hbuf[nxt + U(r * stride) + ui] = h_new
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
        ui = U(i)
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
            ut = U(t)
            cur = (ut & U(1)) * U(rows * stride)
            nxt = ((ut + U(1)) & U(1)) * U(rows * stride)
            for r in range(rows):
                b = b0 + r
                ub = U(b)
                ahead = leader and b < B and t + 1 < T
                u_next = th[ut + U(1), ub, ui] if ahead else zero
                w_next = z[ut + U(1), ub, ui] if ahead else zero
                s = lane_sum(lane_dot(D, hbuf, cur + U(r * stride + lane), cap, lanes), lanes)
                if leader and b < B:
                    y, zt, h_new = euler_gated_unit(s + u[r], kz * s + w[r], h[r], eps)
                    z[ut, ub, ui] = zt
                    th[ut, ub, ui] = y
                    hs[ut + U(1), ub, ui] = h_new
                    hbuf[nxt + U(r * stride) + ui] = h_new
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
        ui = U(i)                                   # unsigned indices: module comment
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
            ut = U(t)
            cur = (ut & U(1)) * U(rows * stride)
            for r in range(rows):
                b = b0 + r
                if leader and b < B:
                    ub = U(b)
                    g = euler_unit_backward(dh[r], y[r], eps)
                    da[ut, ub, ui] = g
                    dbuf[cur + U(r * stride) + ui] = g
                    if t > 0:
                        y[r] = th[ut - U(1), ub, ui]
            cuda.syncthreads()                  # da_t of the block's rows complete
            for r in range(rows):
                s = lane_sum(lane_dot(D, dbuf, cur + U(r * stride + lane), cap, lanes), lanes)
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
        ui = U(i)
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
            ut = U(t)
            cur = (ut & U(1)) * U(rows * stride)
            for r in range(rows):
                b = b0 + r
                if leader and b < B:
                    ub = U(b)
                    da_i, dzp_i = euler_gated_unit_backward(dh[r], y[r], zt[r], eps)
                    da[ut, ub, ui] = da_i
                    dzp[ut, ub, ui] = dzp_i
                    ds[ut, ub, ui] = da_i + kz * dzp_i
                    dbuf[cur + U(r * stride) + ui] = da_i + kz * dzp_i
                    if t > 0:
                        y[r] = th[ut - U(1), ub, ui]
                        zt[r] = z[ut - U(1), ub, ui]
            cuda.syncthreads()
            for r in range(rows):
                s = lane_sum(lane_dot(D, dbuf, cur + U(r * stride + lane), cap, lanes), lanes)
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
# The twins, as nprnn/core/backends.py runs them: the teaching file's, with versions 2 and 3
# ----------------------------------------------------------------------------------------------
antisym_matrix, shifted_matrix, antisym_dW = (
    teaching.antisym_matrix, teaching.shifted_matrix, teaching.antisym_dW)
euler_forward = teaching.euler_forward._replace(
    gpu_persistent=euler_forward_gpu_persistent, gpu_split=euler_forward_gpu_split)
euler_backward = teaching.euler_backward._replace(
    gpu_persistent=euler_backward_gpu_persistent, gpu_split=euler_backward_gpu_split)
euler_gated_forward = teaching.euler_gated_forward._replace(
    gpu_persistent=euler_gated_forward_gpu_persistent, gpu_split=euler_gated_forward_gpu_split)
euler_gated_backward = teaching.euler_gated_backward._replace(
    gpu_persistent=euler_gated_backward_gpu_persistent,
    gpu_split=euler_gated_backward_gpu_split)

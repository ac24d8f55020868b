"""GPU twins of the successors (nprnn/kernels/cornn.py and lem.py, version 1: one thread per
(row, unit), one launch per step and phase) against their CPU twins, as test_gpu_baselines.py
holds the baselines': the CPU twin runs first, the GPU twin on the same inputs, and every output
is compared; BPTT starts from the CPU's forward results. Each runs plain (all rows T steps long,
dL/dy_T and dL/dz_T the only gradients) and ragged (rows of lengths T, 1 and between, and a
gradient at every step: test_gpu_euler.sequence), both initial states non-zero.
"""
import numpy as np
import pytest

from gpu_testing import (B, DTYPES, M, N, STEP_BLOCK, T, TILE, assert_close, dev, empty_like,
                         rand, requires_cuda)
from test_gpu_euler import sequence

from nprnn.kernels import cornn, lem

pytestmark = requires_cuda

# large enough steps that every path (gates, damping, the new z in y's step) moves the result
DT, GAMMA, EPSILON = 0.3, 1.5, 2.0


def initial_states(rng, dtype, names):
    """Forward state arrays (T+1, B, N), each with a non-zero state 0."""
    states = {}
    for name in names:
        states[name] = np.zeros((T + 1, B, N), dtype)
        states[name][0] = rand(rng, (B, N), dtype, 0.5)
    return states


def run_twins(forward, backward, fw, bw, forward_args, backward_args, p, dtype):
    """Run the CPU twins on (fw, bw), then the GPU twins on copies, and compare every output."""
    forward.cpu(*forward_args(fw), p["lengths"])
    backward.cpu(*backward_args(bw, fw), p["dhs"], p["lengths"])
    d = {k: dev(v) for k, v in p.items()}
    fw_gpu = {}
    for k, v in fw.items():
        start = np.zeros_like(v)
        if k in ("hs", "zs"):
            start[0] = v[0]                    # the initial states given, the rest written
        fw_gpu[k] = dev(start)
    forward.gpu(*forward_args(fw_gpu, d), d["lengths"], block=STEP_BLOCK)
    for k, want in fw.items():
        assert_close(fw_gpu[k], want, dtype, k)
    fw_dev = {k: dev(v) for k, v in fw.items()}
    bw_gpu = {k: empty_like(v) for k, v in bw.items()}
    bw_gpu["dz"] = dev(p["dz_T"])              # dL/dz_T in, dL/dz_0 out
    backward.gpu(*backward_args(bw_gpu, fw_dev, d), d["dhs"], d["lengths"], block=STEP_BLOCK,
                 tile=TILE)
    for k, want in bw.items():
        assert_close(bw_gpu[k], want, dtype, k)


@pytest.mark.parametrize("ragged", [False, True], ids=["plain", "ragged"])
@pytest.mark.parametrize("imex", [False, True], ids=["code", "imex"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_cornn_step_kernels_match_the_cpu_twins(dtype, imex, ragged):
    rng = np.random.default_rng(0)
    p = dict(x=rand(rng, (T, B, M), dtype), W=rand(rng, (N, N), dtype, 0.5),
             W_z=rand(rng, (N, N), dtype, 0.5), V=rand(rng, (N, M), dtype, 0.7),
             b=rand(rng, (N,), dtype, 0.2), dh_T=rand(rng, (B, N), dtype),
             dz_T=rand(rng, (B, N), dtype))
    p["lengths"], p["dhs"] = sequence(rng, dtype, T, ragged)
    dt_z = DT / (1 + DT * EPSILON) if imex else DT
    scalars = tuple(np.dtype(dtype).type(v) for v in (DT, dt_z, GAMMA, EPSILON))
    fw = initial_states(rng, dtype, ("hs", "zs"))
    fw["th"] = np.empty((T, B, N), dtype)
    bw = dict(dW=np.empty((N, N), dtype), dW_z=np.empty((N, N), dtype),
              dV=np.empty((N, M), dtype), db=np.empty(N, dtype), dh0=np.empty((B, N), dtype),
              dz=p["dz_T"].copy(), da=np.empty((T, B, N), dtype))

    def forward_args(fw, q=p):
        return (fw["hs"], fw["zs"], fw["th"], q["x"], q["W"], q["W_z"], q["V"], q["b"]) + scalars

    def backward_args(bw, fw, q=p):
        return (bw["dW"], bw["dW_z"], bw["dV"], bw["db"], bw["dh0"], bw["dz"], bw["da"], q["dh_T"],
                fw["hs"], fw["zs"], fw["th"], q["x"], q["W"], q["W_z"]) + scalars
    run_twins(cornn.cornn_forward, cornn.cornn_backward, fw, bw, forward_args, backward_args, p,
              dtype)


@pytest.mark.parametrize("ragged", [False, True], ids=["plain", "ragged"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_lem_step_kernels_match_the_cpu_twins(dtype, ragged):
    rng = np.random.default_rng(1)
    p = dict(x=rand(rng, (T, B, M), dtype), W_ih=rand(rng, (4 * N, M), dtype, 0.7),
             W_hh=rand(rng, (3 * N, N), dtype, 0.5), W_z=rand(rng, (N, N), dtype, 0.5),
             b_ih=rand(rng, (4 * N,), dtype, 0.2), b_hh=rand(rng, (3 * N,), dtype, 0.2),
             b_z=rand(rng, (N,), dtype, 0.2), dh_T=rand(rng, (B, N), dtype),
             dz_T=rand(rng, (B, N), dtype))
    p["lengths"], p["dhs"] = sequence(rng, dtype, T, ragged)
    dt = np.dtype(dtype).type(DT)
    fw = initial_states(rng, dtype, ("hs", "zs"))
    fw["gates"] = np.empty((T, B, 4 * N), dtype)
    bw = dict(dW_ih=np.empty((4 * N, M), dtype), dW_hh=np.empty((3 * N, N), dtype),
              dW_z=np.empty((N, N), dtype), db_ih=np.empty(4 * N, dtype),
              db_hh=np.empty(3 * N, dtype), db_z=np.empty(N, dtype),
              dh0=np.empty((B, N), dtype), dz=p["dz_T"].copy(), da=np.empty((T, B, 4 * N), dtype),
              dgh=np.empty((T, B, 3 * N), dtype), dq=np.empty((T, B, N), dtype))

    def forward_args(fw, q=p):
        return (fw["hs"], fw["zs"], fw["gates"], q["x"], q["W_ih"], q["W_hh"], q["W_z"],
                q["b_ih"], q["b_hh"], q["b_z"], dt)

    def backward_args(bw, fw, q=p):
        return (bw["dW_ih"], bw["dW_hh"], bw["dW_z"], bw["db_ih"], bw["db_hh"], bw["db_z"],
                bw["dh0"], bw["dz"], bw["da"], bw["dgh"], bw["dq"], q["dh_T"], fw["hs"], fw["zs"],
                fw["gates"], q["x"], q["W_hh"], q["W_z"], dt)
    run_twins(lem.lem_forward, lem.lem_backward, fw, bw, forward_args, backward_args, p, dtype)

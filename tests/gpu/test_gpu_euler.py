"""GPU twins of nprnn/kernels/antisym.py and gpu_common.py against their CPU twins.

Each test runs the CPU twin, then the GPU twin on the same inputs, and compares every output. The
backward tests feed the GPU the CPU's forward results, so a forward error cannot hide or cause a
backward one. "skew" is an antisymmetric A = W - W^T - gamma I (antisym, antisym-gated; the
persistent kernels keep only its upper triangle); "dense" an unstructured A (ablation, feedback).
Version "persistent" keeps the matrix in shared memory, "persistent-global" reads it from global
memory (kernels/antisym.py's layouts; the simulator does not limit shared memory, so both run at
any size here). Version "split" gives each unit LANES threads, which hold the matrix in
registers and add their partial sums by warp shuffles (the simulator's stand-in for them:
gpu_common.shfl_down).
"""
import numpy as np
import pytest

from gpu_testing import (B, DTYPES, M, N, ROWS, STEP_BLOCK, T, THREADS, TILE, assert_close, dev,
                         empty_like, rand, requires_cuda)
from nprnn.kernels import antisym as K
from nprnn.kernels.fast import antisym as F
from nprnn.kernels import gpu_common

pytestmark = requires_cuda

EPS, GAMMA = 0.5, 0.1            # a large eps so that h moves visibly in T = 4 steps


def matrix(rng, structure, dtype):
    if structure == "skew":
        W = np.triu(rand(rng, (N, N), dtype), k=1)
        A = np.empty_like(W)
        K.antisym_matrix_cpu(A, W, GAMMA)
        return A
    return (rand(rng, (N, N), dtype, 0.5) - GAMMA * np.eye(N)).astype(dtype)


def sequence(rng, dtype, T, ragged):
    """lengths (B,) and dhs (T, B, N) (kernels/common.py, "Sequences"): with `ragged`, rows of
    lengths T, 1 and in between and a gradient at every step; else all T and none."""
    if not ragged:
        return np.full(B, T, np.int64), np.zeros((0, B, N), dtype)
    lengths = rng.integers(1, T + 1, B)
    lengths[:2] = T, 1
    return lengths, rand(rng, (T, B, N), dtype)


def problem(dtype, gated, structure, seed=0, T=T, kz=1.0, ragged=False):
    """Random inputs, and the CPU twins' forward and backward outputs on them (kz: the gate's
    share of A h_{t-1}, 1 in eq. 13, 0 in antisym-xgate; ragged: rows of their own lengths and
    a gradient at every step)."""
    rng = np.random.default_rng(seed)
    eps = np.dtype(dtype).type(EPS)
    p = dict(x=rand(rng, (T, B, M), dtype), A=matrix(rng, structure, dtype),
             V_h=rand(rng, (N, M), dtype), b_h=rand(rng, (N,), dtype, 0.1),
             V_z=rand(rng, (N, M), dtype), b_z=rand(rng, (N,), dtype, 0.1),
             dh_T=rand(rng, (B, N), dtype))
    p["lengths"], p["dhs"] = sequence(rng, dtype, T, ragged)
    hs = np.zeros((T + 1, B, N), dtype)
    hs[0] = rand(rng, (B, N), dtype, 0.5)
    fw = dict(hs=hs, th=np.empty((T, B, N), dtype), z=np.empty((T, B, N), dtype))
    if gated:
        K.euler_gated_forward_cpu(fw["hs"], fw["th"], fw["z"], p["x"], p["A"], p["V_h"],
                                  p["b_h"], p["V_z"], p["b_z"], eps, np.dtype(dtype).type(kz),
                                  p["lengths"])
    else:
        K.euler_forward_cpu(fw["hs"], fw["th"], p["x"], p["A"], p["V_h"], p["b_h"], eps,
                            p["lengths"])
    bw = dict(dA=np.empty((N, N), dtype), dV_h=np.empty((N, M), dtype),
              db_h=np.empty(N, dtype), dV_z=np.empty((N, M), dtype), db_z=np.empty(N, dtype),
              dh0=np.empty((B, N), dtype), da=np.empty((T, B, N), dtype),
              dzp=np.empty((T, B, N), dtype), ds=np.empty((T, B, N), dtype))
    if gated:
        K.euler_gated_backward_cpu(bw["dA"], bw["dV_h"], bw["db_h"], bw["dV_z"], bw["db_z"],
                                   bw["dh0"], bw["da"], bw["dzp"], bw["ds"], p["dh_T"],
                                   fw["hs"], fw["th"], fw["z"], p["x"], p["A"], eps,
                                   np.dtype(dtype).type(kz), p["dhs"], p["lengths"])
    else:
        K.euler_backward_cpu(bw["dA"], bw["dV_h"], bw["db_h"], bw["dh0"], bw["da"], p["dh_T"],
                             fw["hs"], fw["th"], p["x"], p["A"], eps, p["dhs"], p["lengths"])
    return p, fw, bw, eps


LANES = 2         # n = 6 units: 12 threads in a block of 32, 3 matrix values per lane


def launch_options(version, structure, backward, rows=ROWS, lanes=LANES):
    if version == "step":
        return dict(block=STEP_BLOCK, tile=TILE) if backward else dict(block=STEP_BLOCK)
    if version == "split":
        return dict(lanes=lanes, rows=rows, tile=TILE) if backward else dict(lanes=lanes,
                                                                             rows=rows)
    layout = "global" if version == "persistent-global" else structure    # skew or dense
    opts = dict(layout=layout, rows=rows, threads=THREADS)
    return dict(opts, tile=TILE) if backward else opts


# the global layout and the split kernels read any matrix as a dense one: an unstructured A
# tests them
CASES = [(dtype, gated, structure, version) for dtype in DTYPES for gated in (False, True)
         for structure in ("skew", "dense") for version in ("step", "persistent")] + [
    (dtype, gated, "dense", version) for dtype in DTYPES for gated in (False, True)
    for version in ("persistent-global", "split")]


@pytest.mark.parametrize("dtype, gated, structure, version", CASES)
def test_euler_forward_and_backward_match_cpu(dtype, gated, structure, version):
    check(dtype, gated, structure, version, T)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("gated", [False, True])
def test_step_kernels_take_lengths_and_gradients_at_every_step(dtype, gated):
    """Rows of lengths T, 1 and in between, and dL/dh_t entering at every step: version 1 as the
    CPU twin (the persistent and split kernels take neither; a model runs version 1 then)."""
    check(dtype, gated, "skew", "step", T, ragged=True)


@pytest.mark.parametrize("steps", [1, 2])
def test_step_version_for_any_number_of_steps(steps):
    """Version 1's BPTT alternates dL/dh between two buffers and must end in dh0 for odd and
    even T alike."""
    check("float64", True, "skew", "step", steps)


@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("rows, version", [(1, "persistent"), (3, "persistent"),
                                           (3, "persistent-global")])
def test_persistent_kernels_at_other_rows_per_block(rows, version, gated):
    """rows = 1 is what `backends.LAUNCH` uses; 3 rows per block leave a block with one row of 3.
    (The state copies in shared memory are placed by rows: ROWS = 2 alone hid a wrong offset.)"""
    check("float64", gated, "skew", version, T, rows=rows)


@pytest.mark.parametrize("lanes, rows, gated", [(4, 1, True), (8, 3, False), (8, 3, True),
                                               (16, 1, False)])
def test_split_kernels_at_other_lanes_and_rows(lanes, rows, gated):
    """4 lanes: 24 threads of a warp serve the 6 units, 2 matrix values each; 8 lanes: one value
    each (an odd count for lane_dot), two warps, a block with one row of 3; 16 lanes: two units
    per warp, lanes past n's 6 holding zeros."""
    check("float64", gated, "dense", "split", T, rows=rows, lanes=lanes)


@pytest.mark.parametrize("structure, version", [("skew", "step"), ("skew", "persistent"),
                                                ("dense", "persistent-global"),
                                                ("dense", "split")])
def test_gated_kernels_with_a_gate_of_x_alone(structure, version):
    """kz = 0 (antisym-xgate): the gate reads no A h_{t-1}, and no gradient reaches A through
    it."""
    check("float64", True, structure, version, T, kz=0.0)


@pytest.mark.parametrize("gated", [False, True])
def test_split_kernels_at_zero_steps(gated):
    """T = 0 (a cell's pass called directly; models refuse it): h_T = h_0 and dh_0 = dh_T, the
    kernels' loads a step ahead not made."""
    check("float64", gated, "dense", "split", 0)


def test_split_launch_refuses_what_cannot_run():
    with pytest.raises(ValueError, match=r"cannot run n=128 units with lanes=8 in float64"):
        gpu_common.split_launch(4, 128, 8, 1, "float64", 2)
    with pytest.raises(ValueError, match=r"lanes must be one of \(2, 4, 8, 16\)"):
        gpu_common.split_launch(4, 8, 3, 1, "float32", 2)
    with pytest.raises(ValueError, match="at least one batch row"):
        gpu_common.split_launch(4, 8, 2, 0, "float32", 2)
    assert gpu_common.split_launch(5, 100, 8, 2, "float32", 2) == (3, 800, 2 * 2 * 104 * 4)


def check(dtype, gated, structure, version, T, rows=ROWS, lanes=LANES, kz=1.0, ragged=False):
    p, fw, bw, eps = problem(dtype, gated, structure, T=T, kz=kz, ragged=ragged)
    d = {k: dev(v) for k, v in p.items()}
    # the sequence's arguments, which version 1 takes last and the fast versions do not take
    fw_seq = (d["lengths"],) if version == "step" else ()
    bw_seq = (d["dhs"], d["lengths"]) if version == "step" else ()
    suffix = {"step": "", "split": "_split"}.get(version, "_persistent")
    module = K if version == "step" else F        # the teaching file's version 1, or the fast
    # forward: hs[0] given, the rest written
    hs = dev(np.concatenate([fw["hs"][:1], np.zeros_like(fw["hs"][1:])]))
    th, z = empty_like(fw["th"]), empty_like(fw["z"])
    opts = launch_options(version, structure, backward=False, rows=rows, lanes=lanes)
    if gated:
        getattr(module, "euler_gated_forward_gpu" + suffix)(hs, th, z, d["x"], d["A"], d["V_h"],
                                                       d["b_h"], d["V_z"], d["b_z"], eps, kz,
                                                       *fw_seq, **opts)
        assert_close(z, fw["z"], dtype, "z")
    else:
        getattr(module, "euler_forward_gpu" + suffix)(hs, th, d["x"], d["A"], d["V_h"], d["b_h"],
                                                 eps, *fw_seq, **opts)
    assert_close(hs, fw["hs"], dtype, "hs")
    assert_close(th, fw["th"], dtype, "th")
    # backward, from the CPU's forward results
    hs, th, z = dev(fw["hs"]), dev(fw["th"]), dev(fw["z"])
    g = {k: empty_like(v) for k, v in bw.items()}
    opts = launch_options(version, structure, backward=True, rows=rows, lanes=lanes)
    if gated:
        getattr(module, "euler_gated_backward_gpu" + suffix)(
            g["dA"], g["dV_h"], g["db_h"], g["dV_z"], g["db_z"], g["dh0"], g["da"], g["dzp"],
            g["ds"], d["dh_T"], hs, th, z, d["x"], d["A"], eps, kz, *bw_seq, **opts)
        names = bw
    else:
        getattr(module, "euler_backward_gpu" + suffix)(g["dA"], g["dV_h"], g["db_h"], g["dh0"],
                                                  g["da"], d["dh_T"], hs, th, d["x"], d["A"],
                                                  eps, *bw_seq, **opts)
        names = ("dA", "dV_h", "db_h", "dh0", "da")
    for k in names:
        assert_close(g[k], bw[k], dtype, k)


@pytest.mark.parametrize("dtype", DTYPES)
def test_matrix_kernels_match_cpu(dtype):
    rng = np.random.default_rng(1)
    W = rand(rng, (N, N), dtype)
    Wu = np.triu(W, k=1)
    A, A_gpu = np.empty_like(W), empty_like(W)
    K.antisym_matrix_cpu(A, Wu, GAMMA)
    K.antisym_matrix_gpu(A_gpu, dev(Wu), GAMMA, block=(4, 4))
    assert_close(A_gpu, A, dtype, "A = W - W^T - gamma I")
    K.shifted_matrix_cpu(A, W, GAMMA)
    assert_close(A, (W - GAMMA * np.eye(N)).astype(dtype), dtype, "A = W - gamma I (CPU)")
    K.shifted_matrix_gpu(A_gpu, dev(W), GAMMA, block=(4, 4))
    assert_close(A_gpu, A, dtype, "A = W - gamma I")
    K.antisym_matrix_cpu(A, W, GAMMA)                      # a full W (w_form "full")
    K.antisym_matrix_gpu(A_gpu, dev(W), GAMMA, block=(4, 4))
    assert_close(A_gpu, (W - W.T - GAMMA * np.eye(N)).astype(dtype), dtype, "A of a full W")
    for triangle, expected in ((True, np.triu(W - W.T, k=1)), (False, W - W.T)):
        dW = np.empty_like(W)
        K.antisym_dW_cpu(dW, W, triangle)
        assert_close(dW, expected.astype(dtype), dtype, f"dW from dA (CPU), {triangle=}")
        dW_gpu = empty_like(W)
        K.antisym_dW_gpu(dW_gpu, dev(W), triangle, block=(4, 4))
        assert_close(dW_gpu, dW, dtype, f"dW from dA, {triangle=}")


@pytest.mark.parametrize("dtype", DTYPES)
def test_matmul_tn_and_column_sums(dtype):
    """C = A^T B with ragged tiles (P = 6, Q = 5 over 4 x 4 tiles) and a ragged split of the
    N = 11 rows into 3 chunks; column sums through the same product."""
    rng = np.random.default_rng(2)
    A, Bm = rand(rng, (11, 6), dtype), rand(rng, (11, 5), dtype)
    C = gpu_common.cuda.device_array((6, 5), dtype=dtype)
    for splits in (3, 2):                   # chunks of 4 rows (one tile), of 6 (1.5 tiles)
        gpu_common.matmul_tn_gpu(C, dev(A), dev(Bm), tile=4, splits=splits)
        assert_close(C, A.T @ Bm, dtype, f"A^T B, {splits} splits")
    db = gpu_common.cuda.device_array(6, dtype=dtype)
    gpu_common.column_sums_gpu(db, dev(A), tile=4)
    assert_close(db, A.sum(axis=0), dtype, "column sums")
    other = "float32" if dtype == "float64" else "float64"       # one dtype sizes the tiles
    with pytest.raises(TypeError, match="must share one dtype"):
        gpu_common.matmul_tn_gpu(C, dev(A.astype(other)), dev(Bm), tile=4, splits=3)

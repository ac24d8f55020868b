"""No shared-memory races and no misplaced barriers in the GPU kernels (tests/gpu/racecheck.py
says what this adds to the tests against the CPU twins).

The kernels that share memory between threads (the persistent kernels, the tiled A^T B product,
the block sums of the gradient norm) are run at the ragged sizes of the other GPU tests, n = 6
units over 4 threads and B = 3 rows over blocks of 2, under the race checker; the checker first
shows that it catches each kind of mistake it looks for, on small kernels written wrong on
purpose. It instruments Numba's CUDA simulator, so these tests run there only; on a GPU,
compute-sanitizer's racecheck and synccheck tools do the same.
"""
import numpy as np
import pytest
from numba import cuda

import test_gpu_baselines
import test_gpu_euler
import test_gpu_optim
from gpu_testing import T, dev, requires_cuda
from nprnn.core.device import simulator_enabled
from racecheck import RaceCheck

pytestmark = [requires_cuda, pytest.mark.skipif(
    not simulator_enabled(), reason="the race checker instruments the CUDA simulator; on a GPU "
                                    "use compute-sanitizer --tool racecheck / synccheck")]


# -- the checker catches what it looks for ---------------------------------------------------

@cuda.jit
def shift_kernel(out, x, barrier):
    """out[i] = x[i + 1] through shared memory; without the barrier thread i reads its
    neighbour's slot before (or while) the neighbour writes it."""
    buf = cuda.shared.array(0, dtype=x.dtype)
    i = cuda.threadIdx.x
    buf[i] = x[i]
    if barrier:
        cuda.syncthreads()
    out[i] = buf[(i + 1) % cuda.blockDim.x]


@cuda.jit
def branch_barrier_kernel(out):
    """A barrier that only even threads reach: undefined behaviour on a GPU."""
    i = cuda.threadIdx.x
    if i % 2 == 0:
        cuda.syncthreads()
    out[i] = i


@cuda.jit
def every_block_writes_kernel(out):
    """Each block writes out[0]: blocks never wait for each other, so the result is whichever
    came last."""
    if cuda.threadIdx.x == 0:
        out[0] = cuda.blockIdx.x


@cuda.jit
def early_exit_kernel(out, exit_early):
    """Threads 2 and 3 return before the barrier (and before touching anything), when asked."""
    i = cuda.threadIdx.x
    if exit_early and i >= 2:
        return
    cuda.syncthreads()
    out[i] = i


@cuda.jit
def slice_write_kernel(out, rows):
    """Thread i writes the whole row rows[i] of out by a slice assignment."""
    i = cuda.threadIdx.x
    out[rows[i], :] = i


def run_checked(launch):
    with RaceCheck() as check:
        launch()
    return check


def test_the_checker_finds_a_missing_barrier_and_passes_the_fixed_kernel():
    x = np.arange(4.0)
    out = dev(np.zeros(4))
    racy = run_checked(lambda: shift_kernel[1, 4, 0, 32](out, dev(x), False))
    [(name, problems, shared, _)] = racy.launches
    assert name == "shift_kernel" and shared == 8
    assert problems and all("shared" in p and "between barriers 0 and 1" in p for p in problems)
    with pytest.raises(AssertionError, match="shift_kernel: 4 problem"):
        racy.assert_clean()
    fixed = run_checked(lambda: shift_kernel[1, 4, 0, 32](out, dev(x), True))
    fixed.assert_clean()
    np.testing.assert_array_equal(out.copy_to_host(), np.roll(x, -1))


def test_the_checker_finds_a_barrier_that_some_threads_skip():
    check = run_checked(lambda: branch_barrier_kernel[1, 4](dev(np.zeros(4))))
    [problem] = check.launches[0].problems
    assert "pass different barriers ([0, 1] barriers per thread)" in problem


def test_the_checker_counts_threads_that_return_before_a_barrier():
    check = run_checked(lambda: early_exit_kernel[1, 4](dev(np.zeros(4)), True))
    [problem] = check.launches[0].problems
    assert "pass different barriers ([0, 1] barriers per thread)" in problem
    run_checked(lambda: early_exit_kernel[1, 4](dev(np.zeros(4)), False)).assert_clean()


def test_the_checker_sees_each_element_of_a_slice_assignment():
    out = dev(np.zeros((3, 2)))
    shared_row = run_checked(lambda: slice_write_kernel[1, 2](out, dev(np.array([1, 1]))))
    [launch] = shared_row.launches
    assert launch.global_ == 2 + 2 * 2                     # rows[i] read, two elements written
    assert len(launch.problems) == 2 and all("written by threads [(0, 0, 0), (1, 0, 0)]" in p
                                             for p in launch.problems)
    out = dev(np.zeros((3, 2)))
    run_checked(lambda: slice_write_kernel[1, 2](out, dev(np.array([0, 2])))).assert_clean()
    np.testing.assert_array_equal(out.copy_to_host(), [[0, 0], [0, 0], [1, 1]])


def test_the_checker_finds_blocks_writing_one_address():
    check = run_checked(lambda: every_block_writes_kernel[3, 2](dev(np.zeros(1))))
    [problem] = check.launches[0].problems
    assert "written and touched by blocks [(0, 0, 0), (1, 0, 0), (2, 0, 0)]" in problem


def test_the_checker_leaves_the_simulator_as_it_found_it():
    before = run_checked(lambda: None)
    assert before.launches == []
    out = dev(np.zeros(4))
    shift_kernel[1, 4, 0, 32](out, dev(np.arange(4.0)), False)      # not watched
    assert before.launches == []


# -- the kernels -----------------------------------------------------------------------------

def assert_race_free(check, expect_shared):
    """No problems in any launch, and the kernels that share memory were seen doing so (so a
    hook that stopped seeing shared arrays cannot pass for a clean run)."""
    check.assert_clean()
    seen = {launch.kernel for launch in check.launches if launch.shared > 0}
    missing = set(expect_shared) - seen
    assert not missing, f"no shared-memory accesses seen in {sorted(missing)}"


@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("structure, versions", [
    ("skew", ("step", "persistent")),
    ("dense", ("step", "persistent", "persistent-global", "split"))])
def test_euler_kernels_are_race_free(gated, structure, versions):
    with RaceCheck() as check:
        for version in versions:
            test_gpu_euler.check("float64", gated, structure, version, T)
    kind = "euler_gated" if gated else "euler"
    split = ([f"{kind}_forward_split_kernel", f"{kind}_backward_split_kernel"]
             if "split" in versions else [])
    assert_race_free(check, [f"{kind}_forward_persistent_kernel",
                             f"{kind}_backward_persistent_kernel",
                             "matmul_tn_partial_kernel"] + split)


@pytest.mark.parametrize("cell", list(test_gpu_baselines.CELLS))
def test_baseline_kernels_are_race_free(cell):
    split = cell in ("rnn", "gru")
    with RaceCheck() as check:
        for version in ("step", "persistent") + (("split",) if split else ()):
            test_gpu_baselines.test_baseline_forward_and_backward_match_cpu(cell, "float64",
                                                                            version)
    name = "lstm" if cell == "peephole-lstm" else cell
    assert_race_free(check, [f"{name}_forward_persistent_kernel",
                             f"{name}_backward_persistent_kernel", "matmul_tn_partial_kernel"]
                     + ([f"{cell}_forward_split_kernel", f"{cell}_backward_split_kernel"]
                        if split else []))


def test_gru_split_kernels_with_values_in_shared_memory_are_race_free(monkeypatch):
    """The split GRU with gate n's values in shared memory, each thread's own (fast/gru.py): at
    4 lanes, one of a lane's two in registers, the other in shared memory, and a block of 3
    rows of which one exists."""
    with RaceCheck() as check:
        test_gpu_baselines.test_gru_split_kernels_with_the_matrix_partly_in_shared_memory(
            1, 4, 3, monkeypatch)
    assert_race_free(check, ["gru_forward_split_kernel", "gru_backward_split_kernel"])


def test_gradient_norm_block_sums_are_race_free():
    with RaceCheck() as check:
        test_gpu_optim.test_sum_squares_matches_cpu("float64", 301)
    assert_race_free(check, ["sum_squares_block_kernel"])


# -- warp shuffles order one warp only -------------------------------------------------------

def single_buffer_split_kernels():
    """A mutant of the split kernels' factory whose BPTT keeps one da_t buffer where it needs
    two: step t - 1's leaders overwrite the buffer while other warps may still read step t's
    values, ordered by nothing but the warp shuffles of lane_sum."""
    import inspect
    from nprnn.kernels.fast import antisym as fast
    source = inspect.getsource(fast.euler_split_kernels.__wrapped__)
    start = source.index("def euler_backward_split_kernel")
    end = source.index("@split_kernel", start)
    double = "cur = (ut & U(1)) * U(rows * stride)"
    assert source[start:end].count(double) == 1, "the kernel changed: update this mutant"
    source = source[:start] + source[start:end].replace(double, "cur = U(0)") + source[end:]
    scope = dict(vars(fast))
    exec(compile(source, fast.__file__, "exec"), scope)
    return scope["euler_split_kernels"]


@pytest.mark.parametrize("mutant", [False, True])
def test_split_bptt_with_one_buffer_races_across_warps(mutant, monkeypatch):
    """With 8 lanes the 6 units fill two warps (test_gpu_euler.py): the split kernels are race
    free, while their single-buffer mutant races, though the simulator runs it to the right
    numbers (its shuffle stand-in's barriers are block-wide; the checker counts them as the
    warp's alone)."""
    from nprnn.kernels.fast import antisym as fast
    if mutant:
        monkeypatch.setattr(fast, "euler_split_kernels", single_buffer_split_kernels())
    with RaceCheck() as check:
        test_gpu_euler.check("float64", False, "dense", "split", T, rows=3, lanes=8)
    races = [launch for launch in check.launches if launch.problems]
    if mutant:
        assert [launch.kernel for launch in races] == ["euler_backward_split_kernel"], races
    else:
        assert_race_free(check, ["euler_forward_split_kernel", "euler_backward_split_kernel"])

"""The GPU path without a GPU: device selection and its errors, the persistent kernels' shared
memory arithmetic, and a run of the GPU tests (tests/gpu) under Numba's CUDA simulator.

Why subprocesses: numba chooses between the real CUDA target and the simulator once, when
`numba.cuda` is first imported, from NUMBA_ENABLE_CUDASIM. This pytest process has imported the
real target already (the CPU tests and tests/test_ptx.py need it), so the simulator runs are
further pytest processes started with NUMBA_ENABLE_CUDASIM=1, over the same test files that run
directly on a GPU when one is present. On a machine with a GPU they are skipped: the same tests
then run in this process, on the GPU.
"""
import importlib.metadata
import importlib.util
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

import nprnn
from nprnn.core import device
from nprnn.core.backends import Kernels, options, resolve
from nprnn.kernels.fast import antisym as F

ROOT = Path(__file__).resolve().parents[1]
HAS_GPU = device.cuda_available()[0] and not device.simulator_enabled()


def simulator_workers():
    """How many simulator processes run at once in a pytest process without pytest-xdist: one
    per CPU this process may use, at most 4 (each holds its own numba and test data)."""
    return min(4, device.usable_cpus())


def run_under_the_simulator(path, shard="1/1"):
    """pytest on one file of tests/gpu, or on its `shard` ("i/n": the i-th of every n tests),
    under the simulator: (its return code, its output, the counts of its summary line, e.g.
    {"passed": 12, "deselected": 1}; {} when it printed none)."""
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1", NPRNN_TEST_SHARD=shard)
    cmd = [sys.executable, "-m", "pytest", str(path.relative_to(ROOT)), "-q", "-p",
           "no:cacheprovider", "--no-header", "-rfE", "-m", "not real_gpu"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
    # the summary line, e.g. "15 passed, 1 deselected in 30.2s", whatever stderr printed after it
    summary = re.findall(r"^=*\s*(\d+ \w+(?:, \d+ \w+)*) in [\d.]+s", proc.stdout, re.M)
    counts = ({word: int(k) for k, word in re.findall(r"(\d+) (\w+)", summary[-1])}
              if summary else {})
    return proc.returncode, proc.stdout + proc.stderr, counts


# The files of tests/gpu, the longest in shards of their tests that run in processes of their
# own (on one core of CI's machine test_gpu_model.py alone takes 6 minutes under the simulator,
# test_gpu_batches.py and test_gpu_euler.py 2 to 3), largest first: the order the runs start in.
GPU_TEST_FILES = sorted((ROOT / "tests" / "gpu").glob("test_*.py"),
                        key=lambda p: -p.stat().st_size)
SHARDS = {"test_gpu_model.py": 4, "test_gpu_batches.py": 2, "test_gpu_euler.py": 2}
SIMULATOR_RUNS = [(path, f"{i}/{SHARDS.get(path.name, 1)}") for path in GPU_TEST_FILES
                  for i in range(1, SHARDS.get(path.name, 1) + 1)]


def why_no_simulator_run(path):
    """Why `path` is not run under the simulator here, or None."""
    if HAS_GPU:
        return "a GPU is present: tests/gpu run on it in this process"
    if device.simulator_enabled():
        return "already running under the simulator"
    if importlib.util.find_spec("numba_cuda") is None:
        return "numba-cuda is not installed (pip install -e '.[cuda]'): no CUDA target to simulate"
    if path.name == "test_gpu_sweep.py" and not all(
            importlib.util.find_spec(m) for m in ("optuna", "distributed")):
        return "the sweep extra is not installed (pip install -e '.[sweep]')"
    return None


@pytest.fixture(scope="session")
def simulator_runs():
    """(file, shard) -> the future of its simulator run, all started at the first request,
    `simulator_workers()` at a time (the simulator runs every GPU thread as a Python thread, on
    one core). Under pytest-xdist, whose workers already share the cores, None: each test runs
    its own."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        yield None
        return
    pool = ThreadPoolExecutor(simulator_workers())
    yield {(path.name, shard): pool.submit(run_under_the_simulator, path, shard)
           for path, shard in SIMULATOR_RUNS if why_no_simulator_run(path) is None}
    pool.shutdown(cancel_futures=True)


def test_every_gpu_test_file_is_run_under_the_simulator():
    assert len(GPU_TEST_FILES) >= 10, GPU_TEST_FILES
    assert set(SHARDS) <= {path.name for path in GPU_TEST_FILES}, SHARDS


@pytest.mark.slow
@pytest.mark.simulator
@pytest.mark.parametrize("path, shard", SIMULATOR_RUNS,
                         ids=[f"{path.name}-{shard.replace('/', 'of')}"
                              for path, shard in SIMULATOR_RUNS])
def test_gpu_tests_pass_under_the_cuda_simulator(simulator_runs, path, shard):
    """Every test of a tests/gpu file (or of its shard) but those marked real_gpu runs and
    passes under the simulator, in a pytest process of its own."""
    why_not = why_no_simulator_run(path)
    if why_not:
        pytest.skip(why_not)
    returncode, out, counts = (simulator_runs[path.name, shard].result() if simulator_runs
                               else run_under_the_simulator(path, shard))
    where = (f"{path.relative_to(ROOT)} (tests {shard}) under the CUDA simulator "
             f"(NUMBA_ENABLE_CUDASIM=1)")
    # every test selected ran and passed: nothing skipped, failed or missing
    assert returncode == 0, f"{where} failed:\n{out[-8000:]}"
    allowed = {"passed", "deselected", "warning", "warnings"}
    assert counts.get("passed", 0) > 0 and set(counts) <= allowed, (
        f"{where}: {counts or 'no pytest summary line'}\n{out[-2000:]}")


# -- device selection -----------------------------------------------------------------------

def test_cuda_available_gives_a_one_line_reason():
    ok, why = device.cuda_available()
    assert isinstance(ok, bool) and why and "\n" not in why


@pytest.fixture
def fresh_detection():
    """cuda_available run afresh (it is cached per process) against numba-cuda's real target,
    whose pieces a test replaces; cleared again afterwards, so that the next caller sees the
    real machine."""
    if importlib.util.find_spec("numba_cuda") is None or device.simulator_enabled():
        pytest.skip("needs numba-cuda's real CUDA target")
    device.cuda_available.cache_clear()
    yield device.cuda_available
    device.cuda_available.cache_clear()


@pytest.mark.parametrize("error, visible, says", [
    ("Error at driver init: Call to cuInit results in CUDA_ERROR_NO_DEVICE (100)", "",
     "the CUDA driver reports no GPU (CUDA_VISIBLE_DEVICES='')"),
    ("Error at driver init: Call to cuInit results in CUDA_ERROR_NO_DEVICE (100)", None,
     "the CUDA driver reports no GPU"),
    ("CUDA driver library cannot be found", None,
     "no usable CUDA driver (CUDA driver library cannot be found)"),
])
def test_a_driver_without_a_gpu_is_told_from_no_driver(monkeypatch, fresh_detection, error,
                                                      visible, says):
    """cuInit fails with CUDA_ERROR_NO_DEVICE where the driver loads but sees no GPU (none
    there, or CUDA_VISIBLE_DEVICES hides them all): that is not "no usable CUDA driver"."""
    from numba import cuda
    monkeypatch.setattr(cuda, "is_available", lambda: False)
    monkeypatch.setattr(cuda, "cuda_error", lambda: RuntimeError(error))
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert fresh_detection() == (False, says)


def test_a_driver_that_lists_no_gpu_names_cuda_visible_devices(monkeypatch, fresh_detection):
    """cuInit may succeed and still list no GPU; the reason is the same as for
    CUDA_ERROR_NO_DEVICE, with the variable that can cause it."""
    from numba import cuda
    monkeypatch.setattr(cuda, "is_available", lambda: True)
    monkeypatch.setattr(cuda, "gpus", [])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "7")
    assert fresh_detection() == (False, "the CUDA driver reports no GPU (CUDA_VISIBLE_DEVICES='7')")


@pytest.mark.parametrize("launch_error, says", [
    (None, (True, "Fake GPU, compute capability 9.0")),
    ("NvvmSupportError: libNVVM cannot be found",
     (False, "Fake GPU (compute capability 9.0) is there, but a kernel cannot be compiled and "
             "run on it (NvvmSupportError: libNVVM cannot be found)")),
])
def test_a_gpu_is_usable_only_if_a_kernel_compiles_and_runs(monkeypatch, fresh_detection,
                                                           launch_error, says):
    """A driver that finds a GPU is not enough: a broken NVVM or nvJitLink only shows when a
    kernel is compiled, which used to be the first launch of a training run, as a traceback."""
    import types

    from numba import cuda

    def launch_check():
        if launch_error:
            raise RuntimeError(launch_error)
    monkeypatch.setattr(cuda, "is_available", lambda: True)
    monkeypatch.setattr(cuda, "gpus", [object()])
    monkeypatch.setattr(cuda, "get_current_device", lambda: types.SimpleNamespace(
        name=b"Fake GPU", compute_capability=(9, 0)))
    monkeypatch.setattr(device, "launch_check", launch_check)
    assert fresh_detection() == says


def test_a_numpy_too_new_for_numba_cuda_is_named_with_its_fix(monkeypatch, fresh_detection):
    """numba-cuda 0.30.4 beside numpy 2.5 (what pip chose on Python 3.12+ before setup.cfg capped
    numpy) failed with only "module 'numpy' has no attribute 'row_stack'": the reason now names
    both versions and the command that mends the install."""
    import types

    from numba import cuda

    def launch_check():
        raise AttributeError("module 'numpy' has no attribute 'row_stack'")
    monkeypatch.setattr(cuda, "is_available", lambda: True)
    monkeypatch.setattr(cuda, "gpus", [object()])
    monkeypatch.setattr(cuda, "get_current_device", lambda: types.SimpleNamespace(
        name=b"Fake GPU", compute_capability=(9, 0)))
    monkeypatch.setattr(device, "launch_check", launch_check)
    monkeypatch.setattr(np, "__version__", "2.5.5")
    ok, why = fresh_detection()
    numba_cuda = importlib.metadata.version("numba-cuda")
    assert not ok and why == (
        f"Fake GPU (compute capability 9.0) is there, but a kernel cannot be compiled and run "
        f"on it: numba-cuda {numba_cuda} does not work with numpy 2.5.5 (module 'numpy' has no "
        f"attribute 'row_stack'); install the numpy nprnn's cuda extra asks for: "
        f"pip install 'numpy<2.5'")
    # a NumPy inside the range is not blamed
    assert device.version_clash(RuntimeError("x"), "2.4.6") is None


def test_the_cuda_extra_caps_numpy_as_the_device_check_says():
    """setup.cfg's cuda extra and nprnn.core.device.CUDA_NUMPY name the same cap."""
    import configparser
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    cuda_extra = cfg["options.extras_require"]["cuda"].split()
    assert device.CUDA_NUMPY in cuda_extra
    below = ".".join(map(str, device.CUDA_NUMPY_BELOW))
    assert device.CUDA_NUMPY == f"numpy<{below}"


def test_auto_resolves_to_cuda_exactly_when_a_gpu_is_usable():
    usable = device.cuda_available()[0] and not device.simulator_enabled()
    assert device.resolve_device("auto") == ("cuda" if usable else "cpu")
    assert device.resolve_device("cpu") == "cpu"


@pytest.mark.parametrize("gpu, simulator, auto", [(True, False, "cuda"), (True, True, "cpu"),
                                                   (False, False, "cpu")])
def test_auto_takes_a_real_gpu_and_only_that(monkeypatch, gpu, simulator, auto):
    """What resolve_device answers for each state of the machine, the GPU's faked."""
    monkeypatch.setattr(device, "cuda_available",
                        lambda: (gpu, "a test GPU" if gpu else "no driver (a test)"))
    monkeypatch.setattr(device, "simulator_enabled", lambda: simulator)
    assert device.resolve_device("auto") == auto
    if gpu:
        assert device.resolve_device("cuda") == "cuda"
    else:
        with pytest.raises(device.DeviceUnavailable, match=r"no driver \(a test\)"):
            device.resolve_device("cuda")


def test_usable_cpus_counts_the_affinity_mask_else_the_machine(monkeypatch):
    """A container or `taskset` may allow fewer CPUs than the machine has: -n auto, the
    simulator's pool and a sweep's local cluster size to those."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 3}, raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    assert device.usable_cpus() == 2
    monkeypatch.delattr(os, "sched_getaffinity")
    assert device.usable_cpus() == 64
    monkeypatch.setattr(os, "cpu_count", lambda: None)
    assert device.usable_cpus() == 1


def test_unknown_device_is_refused():
    with pytest.raises(ValueError, match="device must be one of"):
        device.resolve_device("gpu")
    with pytest.raises(ValueError, match="device must be one of"):
        nprnn.make_model("antisym", 1, 4, 3, device="tpu")


@pytest.mark.skipif(device.cuda_available()[0], reason="a CUDA target is usable here")
def test_cuda_without_a_gpu_is_a_clear_error_not_a_driver_traceback():
    why = device.cuda_available()[1]
    with pytest.raises(device.DeviceUnavailable) as err:
        nprnn.make_model("antisym", 1, 4, 3, device="cuda")
    msg = str(err.value)
    assert "no GPU is usable" in msg and why in msg and "'cpu'" in msg
    assert err.value.__cause__ is None and err.value.__context__ is None
    model = nprnn.make_model("antisym", 1, 4, 3, device="auto")
    assert model.device == "cpu"


# -- persistent kernels: what fits in a block's shared memory ------------------------------

def test_persistent_kernels_fit_the_paper_sizes():
    # antisym at n = 128 in float32: the upper triangle is 8128 values = 31.75 KiB
    assert F.persistent_shared_bytes(128, 1, 4, "skew", 3) == (8128 + 3 * 128) * 4
    assert F.persistent_fits(128, "float32", "skew", backward=True)
    assert F.persistent_layouts(128, "float32", antisymmetric=True) == ["global", "skew"]
    # the dense matrix (ablation, feedback) at n = 128 is 64 KiB: it stays in global memory
    assert not F.persistent_fits(128, "float32", "dense", backward=False)
    assert F.persistent_shared_bytes(128, 1, 4, "global", 3) == 3 * 128 * 4
    assert F.persistent_layouts(128, "float32", antisymmetric=False, backward=False) == ["global"]
    assert F.persistent_layouts(96, "float32", antisymmetric=False) == ["global", "dense"]
    # antisym in float64 at n = 128 (63.5 KiB), and at Table 2's n = 256 in float32 (127.5 KiB)
    assert F.persistent_layouts(128, "float64", antisymmetric=True, backward=False) == ["global"]
    assert F.persistent_layouts(256, "float32", antisymmetric=True) == ["global"]
    assert F.persistent_layouts(4097, "float32", antisymmetric=True) == []
    with pytest.raises(ValueError, match=r"layout is one of \('skew', 'dense', 'global'\), "
                                         r"got layout='shared'"):
        F.persistent_fits(8, "float32", "shared")


# README.md's tables: the largest n whose persistent (forward, backward) passes fit, one row per
# block, in float32 and float64; and for the Euler family, the largest n whose matrix is kept in
# shared memory (above it, in global memory)
LARGEST_PERSISTENT_N = {
    ("antisym", "antisym-gated", "ablation", "feedback", "antisym-xgate", "rnn"):
        {"float32": (6144, 4096), "float64": (3072, 2048)},
    ("lstm", "peephole-lstm"): {"float32": (6144, 1228), "float64": (3072, 614)},
    ("gru",): {"float32": (6144, 1755), "float64": (3072, 877)},
}
LARGEST_SHARED_MATRIX_N = {
    ("antisym", "antisym-gated", "antisym-xgate"): {"float32": (155, 154), "float64": (109, 108)},
    ("ablation", "feedback"): {"float32": (109, 109), "float64": (77, 76)},
}


@pytest.mark.parametrize("names", list(LARGEST_PERSISTENT_N))
def test_auto_runs_the_persistent_kernels_up_to_the_readmes_sizes_then_the_step_ones(names):
    """Untimed, "auto" runs the first option: persistent (for the Euler cells with the matrix in
    global memory, which an H100 showed fastest) while the rows' state fits, else step."""
    for name in names:
        cell = nprnn.CELLS[name]
        first = Kernels("persistent", "global") if name in EULER else Kernels("persistent")
        for dtype, largest in LARGEST_PERSISTENT_N[names].items():
            for backward, n in zip((False, True), largest):
                assert resolve(cell, "auto", n, dtype, backward) == first, (name, dtype, n)
                assert resolve(cell, "persistent", n, dtype, backward) == first
                assert resolve(cell, "auto", n + 1, dtype, backward) == Kernels("step")
                assert resolve(cell, "step", n, dtype, backward) == Kernels("step")
                assert options(cell, n + 1, dtype, backward) == [Kernels("step")]
    with pytest.raises(ValueError, match="version must be one of"):
        resolve(cell, "fast", 8, "float32", False)


EULER = ("antisym", "antisym-gated", "ablation", "feedback", "antisym-xgate")


@pytest.mark.parametrize("names", list(LARGEST_SHARED_MATRIX_N))
def test_euler_cells_offer_the_matrix_in_shared_memory_up_to_the_readmes_sizes(names):
    for name in names:
        cell = nprnn.CELLS[name]
        shared = Kernels("persistent", "skew" if cell.antisymmetric else "dense")
        for dtype, largest in LARGEST_SHARED_MATRIX_N[names].items():
            for backward, n in zip((False, True), largest):
                persistent = [k for k in options(cell, n, dtype, backward)
                              if k.version != "split"]
                assert persistent == [Kernels("persistent", "global"), shared, Kernels("step")]
                assert shared not in options(cell, n + 1, dtype, backward), (name, dtype, n + 1)


# the largest n at which each number of lanes per unit fits the split kernels' registers
LARGEST_SPLIT_N = {"float32": {2: 192, 4: 160, 8: 128, 16: 64},
                   "float64": {2: 128, 4: 128, 8: 112, 16: 64}}


@pytest.mark.parametrize("name", EULER)
def test_euler_cells_offer_split_kernels_up_to_the_readmes_sizes(name):
    """Between the persistent and the step options, a split option for each number of lanes
    whose share of the matrix fits the registers at n (docs/gpu.md's table) and is two values
    or more; of the baselines only rnn, whose W_hh is n x n too. At n = 128 in float32: 2, 4
    and 8 lanes (256, 512 and 1,024 threads)."""
    cell = nprnn.CELLS[name]
    for dtype, largest in LARGEST_SPLIT_N.items():
        for lanes, n in largest.items():
            for backward in (False, True):
                split = Kernels("split", lanes=lanes)
                assert split in options(cell, n, dtype, backward), (dtype, lanes, n)
                assert split not in options(cell, n + 1, dtype, backward), (dtype, lanes, n + 1)
                # offered from two matrix values per lane on (2 lanes: from n = 1)
                assert Kernels("split", lanes=2) in options(cell, 1, dtype, backward)
                if lanes > 2:
                    assert split in options(cell, lanes + 1, dtype, backward), (dtype, lanes)
                    assert split not in options(cell, lanes, dtype, backward), (dtype, lanes)
    assert [k.lanes for k in options(cell, 128, "float32", True) if k.version == "split"] == [
        2, 4, 8]
    assert resolve(cell, "split", 128, "float32", False) == Kernels("split", lanes=2)
    assert str(Kernels("split", lanes=8)) == "split, 8 lanes per unit, matrix in registers"
    assert Kernels("split", lanes=8).token == "split/8"
    with pytest.raises(ValueError, match=f"{name} has no split kernels that fit n=300 in "
                                         f"float32; it can run: persistent"):
        resolve(cell, "split", 300, "float32", True)
    assert Kernels("split", lanes=8) in options(nprnn.CELLS["rnn"], 128, "float32", True)
    for baseline in ("lstm", "peephole-lstm"):
        assert not [k for k in options(nprnn.CELLS[baseline], 128, "float32", True)
                    if k.version == "split"]
    # the GRU's split kernels keep part of W_hh in shared memory: at 128, within 48 KiB at 2 lanes
    assert [k.lanes for k in options(nprnn.CELLS["gru"], 128, "float32", True)
            if k.version == "split"] == [2]


def test_a_kernels_value_runs_only_where_it_fits():
    """A Kernels value (what the autotuner passes) is checked against the options at that size:
    the skew layout of a matrix that is not antisymmetric would give wrong numbers."""
    skew = Kernels("persistent", "skew")
    assert resolve(nprnn.CELLS["antisym"], skew, 8, "float32", backward=True) == skew
    with pytest.raises(ValueError, match=r"ablation cannot run 'persistent, matrix in shared "
                                         r"memory \(skew\)' forward at n=8, float32; it can run: "
                                         r"persistent, matrix in global memory, persistent, "
                                         r"matrix in shared memory \(dense\), split, 2 lanes "
                                         r"per unit, matrix in registers, .*, step"):
        resolve(nprnn.CELLS["ablation"], skew, 8, "float32", backward=False)


def test_persistent_launch_refuses_what_does_not_fit_and_says_why():
    with pytest.raises(ValueError, match=r"needs 67072 bytes of shared memory at n=128.*skew "
                                         r"layout.*use layout='global', or the step kernels"):
        F.persistent_launch(B=4, n=128, dtype=np.float64, layout="skew", buffers=2, rows=1,
                            threads=None)
    grid, threads, shared = F.persistent_launch(B=5, n=100, dtype=np.float32, layout="skew",
                                                buffers=2, rows=2, threads=None)
    assert (grid, threads) == (3, 128) and shared == (4950 + 2 * 2 * 100) * 4
    grid, threads, shared = F.persistent_launch(B=5, n=100, dtype=np.float32, layout="global",
                                                buffers=2, rows=2, threads=None)
    assert (grid, threads) == (3, 128) and shared == 2 * 2 * 100 * 4
    with pytest.raises(ValueError, match=r"needs 49164 bytes.*global layout.*fewer rows"):
        F.persistent_launch(B=4, n=4097, dtype=np.float32, layout="global", buffers=3, rows=1,
                            threads=None)
    with pytest.raises(ValueError, match="threads"):
        F.persistent_launch(B=4, n=8, dtype=np.float32, layout="skew", buffers=2, rows=1,
                            threads=2048)


def test_persistent_kernels_launch_within_their_bound():
    """The persistent kernels are compiled for at most PERSISTENT_THREADS threads per block (see
    gpu_common); a larger block would not launch on a GPU, so no launcher may ask for one."""
    from nprnn.kernels.gpu_common import PERSISTENT_THREADS, persistent_threads, state_launch
    assert persistent_threads(100) == 128
    assert persistent_threads(6144) == PERSISTENT_THREADS
    assert state_launch(B=3, n=4096, dtype=np.float32, values_per_row=2 * 4096, rows=1,
                        threads=None)[1] == PERSISTENT_THREADS
    assert persistent_threads(64, threads=PERSISTENT_THREADS) == PERSISTENT_THREADS
    for bad in (0, PERSISTENT_THREADS + 32):
        with pytest.raises(ValueError, match=f"threads per block.*got threads={bad}"):
            persistent_threads(64, threads=bad)
    with pytest.raises(ValueError, match="rows=0"):
        state_launch(B=3, n=64, dtype=np.float32, values_per_row=128, rows=0, threads=None)


def test_step_grids_stay_within_a_gpus_grid():
    """A grid's second dimension stops at 65,535 blocks on a GPU (not in the simulator): a
    launch with more batch rows than that many blocks hold is refused, saying how many fit."""
    from nprnn.kernels.gpu_common import MAX_GRID_Y, step_grid
    assert step_grid(B=5, n=130, block=(64, 2)) == ((3, 3), (64, 2))
    assert step_grid(B=MAX_GRID_Y, n=128, block=(128, 1))[0] == (1, MAX_GRID_Y)
    with pytest.raises(ValueError, match=f"B={MAX_GRID_Y + 1} .* at most {MAX_GRID_Y} rows"):
        step_grid(B=MAX_GRID_Y + 1, n=128, block=(128, 1))
    assert step_grid(B=MAX_GRID_Y + 1, n=128, block=(64, 2))[0] == (2, MAX_GRID_Y // 2 + 1)
    # the readout's kernels put the batch on the grid's second dimension too (their grids were
    # built without the check)
    from nprnn.kernels import readout
    B, K, n, rows = MAX_GRID_Y * 16 + 1, 10, 4, MAX_GRID_Y * 16

    class Shape:                          # nothing is allocated or launched: refused before
        def __init__(self, *shape):
            self.shape = shape
    with pytest.raises(ValueError, match=f"B={B} .* at most {rows} rows"):
        readout.readout_forward_gpu(Shape(B, K), Shape(B, n), None, None)
    with pytest.raises(ValueError, match=f"B={B} .* at most {MAX_GRID_Y * 8} rows"):
        readout.readout_backward_gpu(None, None, None, Shape(B, K), Shape(B, n), None)


class StrictDeviceArray:
    """A numba device array as it behaves on a real GPU, in host memory: copy_to_host and
    copy_to_device, and no `[...] =` (TypeError on a GPU; the simulator's stand-in allows it, so
    the simulator run cannot catch such a write)."""

    def __init__(self, a):
        self._a = np.array(a)
        self.shape, self.dtype, self.size = self._a.shape, self._a.dtype, self._a.size

    def copy_to_host(self):
        return self._a.copy()

    def copy_to_device(self, a):
        assert a.shape == self.shape and a.dtype == self.dtype and a.flags.c_contiguous
        self._a[...] = a

    def __setitem__(self, key, value):
        raise TypeError("a device array takes no item assignment here")


def test_saved_state_is_copied_into_device_arrays_with_copy_to_device():
    from nprnn.runs.checkpoint import load_params_into
    from nprnn.core.optim import make_optimizer
    model = nprnn.make_model("antisym", 1, 4, 3, seed=0)
    saved = {k: p * 2 for k, p in model.params.items()}
    opt = make_optimizer("adagrad", model.params, lr=0.1)
    state = dict(opt.state_dict(), slots={"accumulator": {k: p + 1 for k, p in saved.items()}})
    model.params = {k: StrictDeviceArray(p) for k, p in model.params.items()}
    opt.slots = {s: {k: StrictDeviceArray(a) for k, a in slot.items()}
                 for s, slot in opt.slots.items()}
    load_params_into(model, saved)
    opt.load_state_dict(state)
    for k, p in model.params.items():
        assert np.array_equal(p.copy_to_host(), saved[k])
        assert np.array_equal(opt.slots["accumulator"][k].copy_to_host(), saved[k] + 1)


# -- out of GPU memory ----------------------------------------------------------------------

def _failing(driver, code):
    def allocate(*args, **kwargs):
        raise driver.CudaAPIError(code, "Call to cuMemAlloc results in an error")
    return allocate


def test_out_of_gpu_memory_is_a_memory_error(monkeypatch):
    """numba-cuda reports a failed cuMemAlloc as CudaAPIError, which is no MemoryError: the CLI
    showed a driver traceback where a too-large size on the CPU gets "not enough memory for this
    size; lower --hidden, ...". Every allocation of nprnn now raises MemoryError for it (the
    simulator allocates with NumPy, so only a stand-in driver error can show this)."""
    if importlib.util.find_spec("numba_cuda") is None:
        pytest.skip("numba-cuda is not installed (pip install -e '.[cuda]'): numba's old built-in "
                    "numba.cuda has another driver module, and nprnn allocates nothing on a GPU")
    from numba.cuda.cudadrv import driver

    from nprnn.core import memory, optim
    from nprnn.kernels import gpu_common as G
    oom = driver.binding.CUresult.CUDA_ERROR_OUT_OF_MEMORY
    other = driver.binding.CUresult.CUDA_ERROR_INVALID_VALUE
    allocations = [
        ("device_array", lambda: G.device_array((1024, 3), np.float32), "GPU"),
        ("device_array", lambda: memory.DeviceWorkspace().get("hs", (5, 2, 3), np.float64), "GPU"),
        ("device_array", lambda: G.scratch("test_oom", (2, 2), np.float32), "GPU"),
        ("device_array", lambda: memory.Staging().buffer("x", (2, 3), np.float32), "GPU"),
        ("to_device", lambda: memory.to_device(np.zeros((2, 3))), "GPU"),
        ("pinned_array", lambda: memory.Staging().upload("y", np.zeros(3)), "page-locked host"),
    ]
    for name, allocate, where in allocations:
        monkeypatch.setattr(G.cuda, name, _failing(driver, oom))
        with pytest.raises(MemoryError, match=rf"^out of {where} memory: [\d,.]+ (bytes|MiB) "
                                              rf"more, for an array of shape \(.*\) and dtype"):
            allocate()
        monkeypatch.setattr(G.cuda, name, _failing(driver, other))   # other errors pass as they are
        with pytest.raises(driver.CudaAPIError):
            allocate()
        monkeypatch.undo()
    monkeypatch.setattr(G.cuda, "device_array", _failing(driver, oom))
    with pytest.raises(MemoryError, match=r"12 bytes more, for an array of shape \(3,\) and "
                                          r"dtype float32, could not"):
        optim._full_like(StrictDeviceArray(np.zeros(3, np.float32)), 0.1)
    with pytest.raises(MemoryError, match=r": 8\.0 MiB more, for an array of shape \(1048576,\) "):
        G.device_array(2**20, np.float64)


def test_allocations_go_through_the_out_of_memory_wrappers():
    """The wrappers help only if nothing allocates around them: no call of numba's allocators
    anywhere in nprnn but inside gpu_common's device_array, device_copy and pinned_array."""
    import ast
    allocators = {"device_array", "to_device", "pinned_array", "device_array_like",
                  "mapped_array", "managed_array"}
    wrappers = {"device_array", "device_copy", "pinned_array"}
    found = []
    for path in sorted((ROOT / "nprnn").rglob("*.py")):
        tree = ast.parse(path.read_text())
        allowed = set()
        if path.name == "gpu_common.py":
            allowed = {id(node) for f in ast.walk(tree)
                       if isinstance(f, ast.FunctionDef) and f.name in wrappers
                       for node in ast.walk(f)}
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in allocators and id(node) not in allowed):
                owner = node.func.value
                if (owner.attr if isinstance(owner, ast.Attribute)
                        else getattr(owner, "id", "")) == "cuda":
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not found, "allocations that bypass gpu_common's wrappers: " + ", ".join(found)

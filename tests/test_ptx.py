"""Every GPU kernel of nprnn compiles to PTX for sm_90 (H100/H200), in float32 and float64.

This runs without a GPU: `numba.cuda.compile_ptx` needs only NVVM, which the numba-cuda[cu12]
wheels bring. The simulator accepts some Python that the real compiler rejects (and the other
way round), so this catches a kernel that passes the simulator tests but could not run on a GPU.

Kernels are found by scanning every module of nprnn.kernels, and the kernel modules of every
registered cell's twins, for @cuda.jit kernels (device functions are compiled inside the kernels
that call them), so a new kernel is compiled here without being listed; their number is checked
against the kernel decorators in the source. Argument types follow from the argument names, which
the kernels use consistently (ARG_KINDS); a module whose kernels take a name that the others do
not declares its kind in its own ARG_KINDS (tests/extra_family/kernels.py does), and a kernel
with an argument name declared nowhere fails here.

One numba-cuda detail: while compiling a kernel, numba-cuda compiles the functions it calls
(our `common.py` scalar math, `@overload`s, `@cuda.jit(device=True)` helpers) as device functions
and asks the *current GPU* for its compute capability to do so, which fails without a GPU. The
`ptx_target` fixture answers that question with the target's compute capability (9, 0), the
same one the kernel itself is compiled for; with a real GPU present nothing is replaced.

PTX is not yet machine code: `ptxas` (from the nvidia-cuda-nvcc wheel that numba-cuda[cu12]
brings) assembles it for sm_90 and reports each kernel's registers, spills and static shared
memory. A block whose threads need more than the 65,536 registers an SM gives it does not launch
("too many resources requested for launch"), and the simulator cannot show that either, so every
kernel's registers are checked against the most threads per block it may be launched with.
"""
import functools
import importlib
import os
import pkgutil
import re
import shutil
import subprocess
import types
from pathlib import Path

import numba
import numpy as np
import pytest

# PTX comes from numba-cuda's NVVM (the cuda extra); numba's deprecated built-in numba.cuda
# cannot compile our kernels, so without numba-cuda there is nothing to check here.
pytest.importorskip("numba_cuda", reason="compiling to PTX needs numba-cuda: "
                                         "pip install -e '.[cuda]'")
from numba import cuda  # noqa: E402

import nprnn  # noqa: E402
from nprnn.core.device import cuda_available, simulator_enabled
from nprnn.kernels.gpu_common import MAX_THREADS_PER_BLOCK

CC = (9, 0)
NPRNN = Path(nprnn.__file__).parent


def kernel_modules(cell):
    """The modules of `cell`'s GPU twins (its teaching file, its fast versions' file)."""
    return list(dict.fromkeys(run.__module__ for twins in (cell.forward_kernels,
                                                            cell.backward_kernels)
                              for run in (twins.gpu, twins.gpu_persistent, twins.gpu_split)
                              if run is not None))


MODULES = list(dict.fromkeys(
    [m.name for m in pkgutil.walk_packages([str(NPRNN / "kernels")], "nprnn.kernels.")
     if not m.ispkg] + [m for cell in nprnn.CELLS.values() for m in kernel_modules(cell)]))

# argument name -> kind, for nprnn's kernels (a module may add its own ARG_KINDS): "1", "2", "3"
# a C-contiguous array of the model dtype with that many dimensions; "f" a scalar of the model
# dtype; "f64" a Python float; "i" a Python int; "b" a bool; "i64_1" int64 labels (B,); "f64_1"
# a float64 (1,) accumulator; "u64_1" uint64 (B,) noise streams' starting states.
ARG_KINDS = {
    **{k: "3" for k in ("hs", "cs", "th", "z", "x", "da", "dzp", "ds", "gates", "hn", "dgi",
                        "dgh", "partial", "D", "head", "u")},
    **{k: "2" for k in ("A", "W", "dA", "dW", "V", "V_h", "V_z", "W_out", "dW_out", "W_ih", "W_hh",
                        "WT", "AT", "logits", "dlogits", "dout", "h", "dh", "dh0", "dh_T",
                        "dh_prev", "dc", "dc0", "C")},
    **{k: "1" for k in ("b", "b_h", "b_z", "b_out", "db_out", "b_ih", "b_hh", "w_ci", "w_cf",
                        "w_co", "dw_ci", "dw_cf", "dw_co", "losses", "a", "p", "v", "g", "G")},
    "eps": "f", "kz": "f", "value": "f", "gamma": "f64", "lr": "f64", "momentum": "f64",
    "clip": "f64",
    "scale": "f64_1", "total": "f64_1", "stats": "f64_1",
    "delta": "f64", "t": "i", "t0": "i", "rows": "i", "layout": "i", "peephole": "b",
    "accumulate": "b", "triangle": "b",
    "y": "i64_1", "out": "f64_1", "block_sums": "f64_1", "starts": "u64_1",
    "dhs": "3", "lengths": "i64_1", "w": "f64_1",
}
# where one name means another kind in one kernel: (kernel, argument) -> kind
OVERRIDES = {("matmul_tn_partial_kernel", "A"): "2", ("matmul_tn_partial_kernel", "B"): "2",
             ("transpose_kernel", "out"): "2", ("transpose_kernel", "a"): "2",
             ("time_major_kernel", "out"): "3",
             # the readout's outputs and the regression targets y (B, K) of the mean squared error
             ("mse_kernel", "out"): "2", ("mse_kernel", "y"): "2",
             # Adam's moments and its float64 scalars (its eps is not the Euler cells' step)
             **{("adam_kernel", a): "f64" for a in ("beta1", "beta2", "eps", "c1", "c2")},
             ("adam_kernel", "m"): "1"}


def kernels(modules=MODULES):
    """(module name, kernel name, dispatcher) of every @cuda.jit kernel in `modules` (a module
    that fails to import fails here: its kernels must not drop out of the checks unseen)."""
    found = []
    for mod_name in modules:
        mod = importlib.import_module(mod_name)
        for name, obj in vars(mod).items():
            if (isinstance(obj, numba.cuda.dispatcher.CUDADispatcher)
                    and not obj.targetoptions.get("device") and obj.py_func.__module__ == mod_name):
                found.append((mod_name, name, obj))
    return found


def arg_types(kernel_name, py_func, dtype):
    float_t = numba.from_dtype(np.dtype(dtype))
    kinds = {"1": float_t[::1], "2": float_t[:, ::1], "3": float_t[:, :, ::1], "f": float_t,
             "f64": numba.float64, "i": numba.int64, "b": numba.boolean,
             "i64_1": numba.int64[::1], "f64_1": numba.float64[::1], "u64_1": numba.uint64[::1]}
    names = py_func.__code__.co_varnames[:py_func.__code__.co_argcount]
    module = importlib.import_module(py_func.__module__)
    known = {**ARG_KINDS, **getattr(module, "ARG_KINDS", {})}      # the module's names too
    out = []
    for a in names:
        kind = OVERRIDES.get((kernel_name, a), known.get(a))
        if kind is None:
            raise AssertionError(f"kernel {kernel_name}: argument {a!r} has no entry in ARG_KINDS "
                                 f"of tests/test_ptx.py nor of {module.__name__}; add its kind "
                                 f"to one of them")
        out.append(kinds[kind])
    return tuple(out)


KERNELS = [] if simulator_enabled() else kernels()


@pytest.fixture
def ptx_target(monkeypatch):
    """Let numba-cuda compile device functions for CC without asking a GPU (see the module
    docstring); untouched when a real GPU is present."""
    target_without_a_gpu(monkeypatch)


def target_without_a_gpu(monkeypatch):
    """What ptx_target does, for a test of another module (tests/test_extra_family.py)."""
    if not cuda_available()[0]:
        import numba.cuda.dispatcher as dispatcher
        monkeypatch.setattr(dispatcher, "get_current_device",
                            lambda: types.SimpleNamespace(compute_capability=CC))


def test_kernels_were_found():
    if simulator_enabled():
        pytest.skip("the CUDA simulator has no PTX compiler")
    names = {name for _, name, _ in KERNELS}
    # a kernel is a function under @cuda.jit(cache=True) (not device=True), @persistent_kernel
    # or @bounded_kernel(...) at module level
    decorated = sum(len(re.findall(r"^@(?:cuda\.jit\(cache=True\)|persistent_kernel"
                                   r"|bounded_kernel\(\w+\))$",
                                   path.read_text(), re.M))
                    for path in NPRNN.rglob("*.py"))
    assert len(KERNELS) == decorated, (f"the scan found {len(KERNELS)} kernels, the source "
                                       f"decorates {decorated}: {sorted(names)}")
    for expected in ("euler_forward_persistent_kernel", "euler_backward_step_kernel",
                     "readout_backward_kernel", "mse_kernel", "matmul_tn_partial_kernel",
                     "lstm_backward_persistent_kernel", "gru_forward_step_kernel",
                     "rnn_backward_unit_kernel", "sum_squares_block_kernel", "adagrad_kernel",
                     "gaussian_fill_kernel"):
        assert expected in names, f"kernel scan missed {expected}: found {sorted(names)}"


# The float32 version of a kernel does no float64 arithmetic (see tests/test_precision.py for why
# it happens and what it costs; on a GPU float64 runs at a fraction of float32's rate), except
# where it is meant: kernel -> why.
FLOAT64_ON_PURPOSE = {
    "softmax_xent_kernel": "the softmax and loss of K = 10 logits per row, as the CPU twin",
    "mse_kernel": "each row's gradient scale 2 w[r] / K, from its float64 weight, as the CPU twin",
    "sum_squares_block_kernel": "the squared gradient norm is summed in float64",
    "sum_block_sums_kernel": "the squared gradient norm is summed in float64",
    "sgd_momentum_kernel": "lr, momentum and scale are float64 scalars, as on the CPU",
    "adagrad_kernel": "lr, delta and scale are float64 scalars, as on the CPU",
    "adam_kernel": "lr, the betas, eps, the bias corrections and scale are float64 scalars, as "
                   "on the CPU",
    "record_step_kernel": "a step's totals are float64, as on the CPU",
    "antisym_matrix_kernel": "gamma is a float64 scalar; n values per call",
    "shifted_matrix_kernel": "gamma is a float64 scalar; n values per call",
}
F64_ARITHMETIC = re.compile(r"^\s*(?:@!?%p\d+\s+)?((?:add|sub|mul|div|fma|rcp|sqrt|neg|abs|min|max)"
                            r"(?:\.[a-z0-9]+)*\.f64)\b", re.M)


@functools.lru_cache(maxsize=None)
def compile_to_ptx(kernel, dtype):
    """The PTX of `kernel` for CC, with the launch bound it declares (if any)."""
    name = kernel.py_func.__name__
    ptx, _ = cuda.compile_ptx(kernel.py_func, arg_types(name, kernel.py_func, dtype), cc=CC,
                              launch_bounds=kernel.targetoptions.get("launch_bounds"))
    return ptx


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("module, name, kernel", KERNELS, ids=[k[1] for k in KERNELS])
def test_kernel_compiles_to_ptx_for_sm90(ptx_target, module, name, kernel, dtype):
    ptx = compile_to_ptx(kernel, dtype)
    assert f".target sm_{CC[0]}{CC[1]}" in ptx
    assert ".entry" in ptx, f"{module}.{name}: no kernel entry point in the PTX"
    if dtype == "float32":
        f64 = sorted(set(F64_ARITHMETIC.findall(ptx)))
        if name in FLOAT64_ON_PURPOSE:
            assert f64, f"{name} no longer uses float64: take it out of FLOAT64_ON_PURPOSE"
        else:
            assert not f64, (f"{module}.{name} does float64 arithmetic in float32 ({f64}): a "
                             f"float literal or an int mixed with float32?")


def test_float32_tanh_and_sigmoid_keep_nan_on_the_gpu(ptx_target):
    """PTX's min.f32/max.f32 return the other operand for a NaN (fminf/fmaxf): a clamp written
    with min/max made tanh(NaN) = -1 and sigmoid(NaN) = 0 on the GPU alone, where a NaN state went
    on as a finite one. The clamps must be comparisons (selp), which keep the NaN."""
    from nprnn.kernels.common import sigmoid, tanh

    def kernel(out, a):
        out[0] = tanh(a[0])
        out[1] = sigmoid(a[0])

    if simulator_enabled():
        pytest.skip("the CUDA simulator has no PTX compiler")
    ptx, _ = cuda.compile_ptx(kernel, (numba.float32[:], numba.float32[:]), cc=CC)
    dropping = sorted(set(re.findall(r"\b(?:min|max)(?:\.ftz)?\.f32\b", ptx)))
    assert not dropping, f"float32 tanh/sigmoid clamp with {dropping}, which drop a NaN:\n{ptx}"


@pytest.mark.parametrize("out_dtype, x_dtype", [("float64", "float32"), ("float32", "float64")])
def test_time_major_converts_between_dtypes_in_ptx(ptx_target, out_dtype, x_dtype):
    """The one kernel launched with two dtypes (Model.forward of a float64 model on float32
    batches, and the other way round): the names-to-types scan above gives all arrays one."""
    if simulator_enabled():
        pytest.skip("the CUDA simulator has no PTX compiler")
    from nprnn.kernels.layout import time_major_kernel
    out_t, x_t = (numba.from_dtype(np.dtype(d))[:, :, ::1] for d in (out_dtype, x_dtype))
    ptx, _ = cuda.compile_ptx(time_major_kernel.py_func, (out_t, x_t), cc=CC)
    convert = "cvt.f64.f32" if out_dtype == "float64" else "cvt.rn.f32.f64"
    assert convert in ptx, f"no {convert} in the PTX of time_major_kernel({out_dtype}, {x_dtype})"


def find_ptxas():
    """The ptxas of the nvidia-cuda-nvcc wheel, else one on PATH, else None."""
    try:
        import nvidia.cuda_nvcc
        path = os.path.join(list(nvidia.cuda_nvcc.__path__)[0], "bin", "ptxas")
        if os.access(path, os.X_OK):
            return path
    except ImportError:
        pass
    return shutil.which("ptxas")


REGISTERS_PER_BLOCK = 65536     # sm_90 (and every GPU since Kepler)
REGISTER_UNIT = 256             # a warp's registers are allocated in units of 256


def block_registers(regs_per_thread, threads):
    """Registers a block of `threads` threads takes on an SM."""
    per_warp = -(-regs_per_thread * 32 // REGISTER_UNIT) * REGISTER_UNIT
    return per_warp * -(-threads // 32)


def test_block_registers():
    assert block_registers(64, 1024) == REGISTERS_PER_BLOCK
    assert block_registers(72, 1024) > REGISTERS_PER_BLOCK     # 73,728: does not launch
    assert block_registers(72, 512) <= REGISTERS_PER_BLOCK
    assert block_registers(1, 1) == REGISTER_UNIT


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("module, name, kernel", KERNELS, ids=[k[1] for k in KERNELS])
def test_kernel_fits_its_largest_block_on_sm90(ptx_target, tmp_path, ptxas_report, module, name,
                                               kernel, dtype):
    """Assembled for sm_90, the kernel's registers for its largest block (its launch bound, else
    1,024 threads) fit in an SM's 65,536, it spills nothing to local memory (no stack frame
    either: its only local arrays are the split kernels', which must stay in registers), and it
    has no static shared memory (the launchers budget SHARED_BYTES_MAX for the dynamic shared
    memory alone). What ptxas reported goes to the session's summary (tests/conftest.py prints
    it as a table)."""
    assemble(f"{module}.{name}", name, compile_to_ptx(kernel, dtype), dtype, tmp_path,
             ptxas_report)


def assemble(where, name, ptx, dtype, tmp_path, ptxas_report):
    """ptxas on `ptx` for sm_90, its report checked as test_kernel_fits_its_largest_block_on_sm90
    says and appended to ptxas_report under `name`."""
    ptxas = find_ptxas()
    if ptxas is None:
        pytest.skip("ptxas not found: pip install nvidia-cuda-nvcc-cu12 (numba-cuda[cu12] "
                    "brings it)")
    bound = re.search(r"\.maxntid\s+(\d+)\s*,\s*(\d+)\s*,\s*(\d+)", ptx)
    threads = (int(bound[1]) * int(bound[2]) * int(bound[3]) if bound
               else MAX_THREADS_PER_BLOCK)
    (tmp_path / "k.ptx").write_text(ptx)
    run = subprocess.run([ptxas, f"-arch=sm_{CC[0]}{CC[1]}", "-v", "-o", str(tmp_path / "k.cubin"),
                          str(tmp_path / "k.ptx")], capture_output=True, text=True)
    assert run.returncode == 0, f"ptxas rejects {name} ({dtype}):\n{run.stderr}"
    report = run.stderr
    regs = int(re.search(r"Used (\d+) registers", report)[1])
    spills = [int(v) for v in re.findall(r"(\d+) bytes spill (?:stores|loads)", report)]
    smem = re.search(r"(\d+) bytes smem", report)
    stack = re.search(r"(\d+) bytes stack frame", report)
    local = int(stack[1]) if stack else 0
    ptxas_report.append(dict(kernel=name, dtype=dtype, registers=regs, threads=threads,
                             block=block_registers(regs, threads),
                             shared=int(smem[1]) if smem else 0, local=local,
                             spills=sum(spills)))
    where = f"{where} ({dtype}): {report.strip()}"
    assert block_registers(regs, threads) <= REGISTERS_PER_BLOCK, (
        f"{regs} registers per thread do not fit a block of {threads} threads: give the kernel a "
        f"launch bound (gpu_common.persistent_kernel) and launch it within it. {where}")
    assert not any(spills) and local == 0, f"spills registers to local memory: {where}"
    assert smem is None or int(smem[1]) == 0, f"static shared memory: {where}"


def split_cases():
    """(lanes, dtype, n) of the split kernels whose registers are tightest: for each lanes and
    dtype, the largest n that gpu_common.split_fits offers them at (the most matrix values per
    lane, the most threads), and n = 128 with 2 and 4 lanes (8 is its largest already)."""
    from nprnn.kernels.gpu_common import SPLIT_LANES, split_fits
    cases = []
    for dtype in ("float32", "float64"):
        for lanes in SPLIT_LANES:
            largest = max(n for n in range(1, 1025) if split_fits(n, lanes, dtype))
            cases.append((lanes, dtype, largest))
        cases += [(lanes, dtype, 128) for lanes in (2, 4) if split_fits(128, lanes, dtype)]
    return list(dict.fromkeys(cases))


@pytest.mark.parametrize("lanes, dtype, n", split_cases())
def test_split_kernels_keep_the_matrix_in_registers_on_sm90(ptx_target, tmp_path, ptxas_report,
                                                            lanes, dtype, n):
    """The split kernels (of the Euler cells and rnn) are compiled per (values per lane, lanes,
    rows), so the scan above does not see them: each that backends.options offers, at its
    tightest n, assembles with no local memory (the matrix's share and the rows' states stay in
    registers) and no float64 arithmetic in float32, under its launch bound."""
    from nprnn.kernels.fast import antisym, rnn
    from nprnn.kernels.gpu_common import split_capacity
    cap = split_capacity(n, lanes)
    kernels = antisym.euler_split_kernels(cap, lanes, 1) + rnn.rnn_split_kernels(cap, lanes, 1)
    assemble_split(kernels, n, lanes, dtype, tmp_path, ptxas_report)


def assemble_split(kernels, n, lanes, dtype, tmp_path, ptxas_report):
    """Each split kernel compiled for n units and `lanes` lanes under its launch bound: no float64
    arithmetic in float32, then `assemble`."""
    for kernel in kernels:
        name = kernel.py_func.__name__
        ptx, _ = cuda.compile_ptx(kernel.py_func, arg_types(name, kernel.py_func, dtype), cc=CC,
                                  launch_bounds=kernel.targetoptions.get("launch_bounds"))
        if dtype == "float32":
            assert not F64_ARITHMETIC.findall(ptx), f"{name}: float64 arithmetic in float32"
        assemble(f"{name} at n={n}, {lanes} lanes", f"{name}[n={n},lanes={lanes}]", ptx, dtype,
                 tmp_path, ptxas_report)


def test_every_kernel_is_cached_on_disk():
    """Issue 55: kernels compiled in every process. Each module-level kernel has numba's file
    cache (compiled once per signature, loaded by later processes; a real GPU is what writes
    it); the split kernels, made by factories for their sizes, have none."""
    if simulator_enabled():
        pytest.skip("the CUDA simulator compiles nothing")
    from numba.cuda.dispatcher import CUDACache
    uncached = [name for _, name, kernel in KERNELS if not isinstance(kernel._cache, CUDACache)]
    assert not uncached, uncached
    from nprnn.kernels.fast.rnn import rnn_split_kernels
    assert not any(isinstance(k._cache, CUDACache) for k in rnn_split_kernels(2, 2, 1))


def gru_split_cases():
    """(lanes, dtype, n) of the split GRU kernels (fast/gru.py) to assemble: for each lanes and
    dtype, the largest n its plan offers (the most values per lane), and n = 128 where offered."""
    from nprnn.kernels.fast.gru import gru_split_lanes
    from nprnn.kernels.gpu_common import SPLIT_LANES
    cases = []
    for dtype in ("float32", "float64"):
        for lanes in SPLIT_LANES:
            offered = [n for n in range(1, 1025) if lanes in gru_split_lanes(n, dtype)]
            cases += [(lanes, dtype, n) for n in offered[-1:] + [128] if n in offered]
    return list(dict.fromkeys(cases))


@pytest.mark.parametrize("lanes, dtype, n", gru_split_cases())
def test_gru_split_kernels_keep_their_values_on_chip_on_sm90(ptx_target, tmp_path, ptxas_report,
                                                             lanes, dtype, n):
    """The split GRU's kernels, compiled per plan (gates r's and z's values and n_held of gate
    n's in registers, the rest in shared memory), assemble with no local memory under their
    launch bound. ptxas gives these kernels every register the bound allows and is not monotonic
    in them: GRU_OTHER_REGISTERS is set so that these cases, the tightest, do not spill."""
    from nprnn.kernels.fast.gru import gru_split_kernels, gru_split_plan
    plan = gru_split_plan(n, lanes, dtype)
    assemble_split(gru_split_kernels(plan.cap, lanes, 1, plan.n_held), n, lanes, dtype, tmp_path,
                   ptxas_report)


@pytest.mark.real_gpu
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("module, name, kernel", KERNELS, ids=[k[1] for k in KERNELS])
def test_kernel_as_built_for_this_gpu_takes_its_largest_block(module, name, kernel, dtype):
    """On a GPU: the kernel as numba-cuda builds it to launch, which may be linked by nvJitLink
    with link-time optimisation rather than assembled by ptxas as above (so its registers can
    differ), still takes its largest block, as the driver reports, and keeps nothing in local
    memory (no kernel has a local array, so local memory would be spills)."""
    check_as_built(f"{module}.{name}", kernel, arg_types(name, kernel.py_func, dtype))


@pytest.mark.real_gpu
@pytest.mark.parametrize("lanes, dtype, n", split_cases())
def test_split_kernels_as_built_for_this_gpu_keep_the_matrix_in_registers(lanes, dtype, n):
    """The same for the split kernels at the sizes test_split_kernels_keep_the_matrix_in_
    registers_on_sm90 assembles."""
    from nprnn.kernels.fast import antisym, rnn
    from nprnn.kernels.gpu_common import split_capacity
    cap = split_capacity(n, lanes)
    for kernel in antisym.euler_split_kernels(cap, lanes, 1) + rnn.rnn_split_kernels(cap, lanes, 1):
        name = kernel.py_func.__name__
        check_as_built(f"{name} at n={n}, {lanes} lanes", kernel,
                       arg_types(name, kernel.py_func, dtype))


def check_as_built(where, kernel, types_):
    if not cuda_available()[0]:
        pytest.skip(f"needs a GPU: {cuda_available()[1]}")
    bound = kernel.targetoptions.get("launch_bounds")
    threads = bound[0] if bound else MAX_THREADS_PER_BLOCK
    built = kernel.compile(types_)
    where = (f"{where}: {built.regs_per_thread} registers per thread, "
             f"{built.local_mem_per_thread} bytes of local memory")
    assert built.max_threads_per_block >= threads, (
        f"the driver allows {built.max_threads_per_block} threads per block, the launchers use up "
        f"to {threads}. {where}")
    assert built.local_mem_per_thread == 0, f"spills registers to local memory: {where}"

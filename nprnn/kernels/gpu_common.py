"""What the GPU twins of every kernel file share: the `cuda` module, launch arithmetic, cached
scratch buffers, and the one tiled matrix product that forms every parameter gradient.

Parameter gradients as one product over all stored steps
--------------------------------------------------------
The CPU twins end BPTT with products over all T*B stored rows, e.g. for the recurrent matrix

    dA = sum_t da_t^T h_{t-1} = DA^T H          DA (T*B, n), H (T*B, n)  ->  dA (n, n)

and the GPU twins do the same with `matmul_tn_gpu`, C = A^T B for A (N, P), B (N, Q). The
reduction dimension N = T*B is long (100 352 for sequential MNIST at B = 128) and the output is
small (n x n, or n x m with m = 1), so output tiles alone would give too few blocks to fill a GPU.
The product is therefore "split-K": block (bx, by, s) forms the (tile x tile) output tile (by, bx)
over rows chunk s of N, through shared-memory tiles of A and B, and writes it to its own slice
partial[s]; a second kernel sums the S slices. No atomics, so every run gives the same bits.
A bias gradient is the same product with a column of ones: db = DA^T 1_N.

Why not accumulate dA inside the persistent BPTT kernel, block by block? Each block would need a
private n x n accumulator (64 KiB at n = 128 in float32, more than a block's shared memory, even
before the recurrent matrix it may keep there), and a reduction over blocks at the end; the
stored-states product costs one extra read of DA and H (which BPTT keeps anyway) and is a
textbook, well-tiled kernel.

Compiling without a GPU
-----------------------
`numba.cuda.compile_ptx` turns a kernel into PTX with the NVVM from the `numba-cuda[cu12]` wheels.
Kernels call the scalar math of `common.py` (`@numba.njit` functions and `@overload`s): numba-cuda
compiles them as device functions and asks the *current device* for its compute capability while
doing so, which fails on a machine without a GPU. `tests/test_ptx.py` answers that question with
the target's compute capability (see `ptx_target` there); on a GPU nothing special is needed.
"""
from contextlib import contextmanager

import numpy as np
from numpy import uint32 as U


def simulator_enabled():
    """Whether numba.cuda is Numba's CUDA simulator (NUMBA_ENABLE_CUDASIM=1 at import)."""
    try:
        from numba.cuda.core import config
    except ImportError:
        from numba.core import config
    return bool(getattr(config, "ENABLE_CUDASIM", False))

try:
    from numba import cuda
    CUDA_IMPORT_ERROR = None
except ImportError as exc:                 # numba-cuda (or its CUDA bindings) is not installed
    CUDA_IMPORT_ERROR = f"numba.cuda cannot be imported ({exc}); pip install -e '.[cuda]'"

    class _UnavailableKernel:
        """What `cuda.jit` returns when numba.cuda is missing: launching it explains why."""

        def __init__(self, func):
            self.py_func = func

        def __getitem__(self, launch_config):
            raise RuntimeError(f"GPU kernel {self.py_func.__name__} cannot run: "
                               f"{CUDA_IMPORT_ERROR}")

        __call__ = __getitem__

    class _NoCuda:
        """Stands in for `numba.cuda` so that the kernel files still import on a CPU-only
        install (the CPU twins do not need it)."""

        def jit(self, func=None, **options):
            return _UnavailableKernel(func) if callable(func) else _UnavailableKernel

    cuda = _NoCuda()

# Shared memory a block may use without opting in to more (all GPUs since Kepler). H100 allows
# up to 227 KiB per block after cuFuncSetAttribute; numba-cuda 0.30 has no public call for that
# (only its private function handles, through cuda.bindings), so nprnn stays within 48 KiB.
SHARED_BYTES_MAX = 48 * 1024
MAX_THREADS_PER_BLOCK = 1024
WARP = 32
# A block may use 65,536 registers. The persistent kernels carry a whole pass's loop and, left
# to themselves, use up to 80 registers per thread (ptxas for sm_90, float64 gated BPTT), so a
# block of 1,024 threads (64 each) would not launch: "too many resources requested for launch", a
# failure the simulator never shows. They are compiled for at most PERSISTENT_THREADS threads per
# block and launched with at most that many (beyond it a block's threads loop over the units);
# see `persistent_kernel`. tests/test_ptx.py checks every kernel's registers with ptxas.
PERSISTENT_THREADS = 512
MAX_GRID_Y = 65535              # blocks in a grid's second dimension (the first: 2**31 - 1)
TILE = 16                       # matmul_tn_gpu: (TILE x TILE) threads per block
TARGET_BLOCKS = 512             # matmul_tn_gpu, peephole_grads_gpu: ~132 SMs filled a few times
# line_launch: a 1-d element-wise launch's blocks at most (x 256 threads: 1M, several waves of an
# H100; larger arrays loop). The GPU tests set 2, so that every loop takes several rounds, and
# the simulator, which runs each GPU thread in Python, runs few threads.
LINE_BLOCKS = 4096


def persistent_kernel(func):
    """@cuda.jit for a persistent kernel, with launch bounds: at most PERSISTENT_THREADS threads
    per block, and one block per SM is enough. The second half matters: told only the first,
    ptxas aims for several blocks per SM and squeezes the gated BPTT into 64 registers with
    spills, though a persistent launch has about one block (B / rows) per SM; told both, it
    uses up to 128 and spills nothing. The simulator takes no launch bounds. Cached on disk
    (`cache=True`, as every module-level kernel here): a process compiles a kernel once per
    signature, later ones load it."""
    if CUDA_IMPORT_ERROR is not None or simulator_enabled():
        return cuda.jit(func)
    return cuda.jit(launch_bounds=(PERSISTENT_THREADS, 1), cache=True)(func)


def persistent_threads(n, threads=None):
    """Threads per block of a persistent kernel over n units: `threads` if given, else one per
    unit rounded up to a warp; at most PERSISTENT_THREADS (ValueError beyond it)."""
    if threads is None:
        return min(PERSISTENT_THREADS, round_up(n, WARP))
    if not 1 <= threads <= PERSISTENT_THREADS:
        raise ValueError(f"a persistent kernel runs 1 to {PERSISTENT_THREADS} threads per block "
                         f"(its launch bound), got threads={threads}")
    return threads


def persistent_grid(B, n, rows, threads, shared, too_big):
    """(grid, threads, shared bytes) of a persistent kernel over n units whose blocks own `rows`
    batch rows each and use `shared` bytes of shared memory: ValueError for threads beyond the
    launch bound, rows < 1, or shared memory beyond SHARED_BYTES_MAX (then with the message
    `too_big`, which says what to do instead)."""
    threads = persistent_threads(n, threads)
    if rows < 1:
        raise ValueError(f"a block owns at least one batch row, got rows={rows}")
    if shared > SHARED_BYTES_MAX:
        raise ValueError(too_big)
    return cdiv(B, rows), threads, shared


def step_grid(B, n, block):
    """(grid, block) of a kernel with one thread per (batch row b, unit i): block = (units,
    rows), grid (ceil(n / units), ceil(B / rows)). A GPU refuses a grid whose second dimension
    is over MAX_GRID_Y blocks (the simulator does not), so that is a ValueError here."""
    grid = (cdiv(n, block[0]), cdiv(B, block[1]))
    if grid[1] > MAX_GRID_Y:
        raise ValueError(f"B={B} batch rows in blocks of {block[1]} rows need {grid[1]} blocks "
                         f"in the grid's second dimension, and a GPU allows {MAX_GRID_Y}: pass "
                         f"at most {MAX_GRID_Y * block[1]} rows per call")
    return grid, block


def splits_for(blocks, N, min_rows):
    """How many slices to split a sum over N rows into, when each slice runs `blocks` blocks:
    enough for about TARGET_BLOCKS blocks in all, and at most ceil(N / min_rows), so that a slice
    has about min_rows rows or more (ceil(N / S) each: fewer when N is small, e.g. 9 and 8 of
    N = 17 at min_rows = 16)."""
    return max(1, min(cdiv(TARGET_BLOCKS, blocks), cdiv(N, min_rows)))


def cdiv(a, b):
    """ceil(a / b) for positive integers."""
    return -(-a // b)


def round_up(a, multiple):
    return cdiv(a, multiple) * multiple


# ------------------------------------------------------------------------------------------
# Allocation: the driver's out-of-memory error as a MemoryError
# ------------------------------------------------------------------------------------------
# numba-cuda reports a cuMemAlloc that fails twice (it frees what it had deferred and retries
# once) as CudaAPIError, which is neither a MemoryError nor a RuntimeError; NumPy on the CPU
# path raises MemoryError. Every device and page-locked allocation of nprnn goes through the
# three functions below, so that a size too large for the GPU is reported as one too large for
# the host is (cli.py: "not enough memory for this size ...; lower --hidden, ...").

CUDA_ERROR_OUT_OF_MEMORY = 2               # the CUresult of a failed cuMemAlloc / cuMemHostAlloc


@contextmanager
def _allocating(shape, dtype, memory):
    try:
        yield
    except Exception as exc:
        if not (type(exc).__name__ == "CudaAPIError"
                and getattr(exc, "code", None) == CUDA_ERROR_OUT_OF_MEMORY):
            raise
        shape = tuple(int(s) for s in np.atleast_1d(shape))
        nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
        size = f"{nbytes / 2**20:,.1f} MiB" if nbytes >= 2**20 else f"{nbytes:,} bytes"
        raise MemoryError(f"out of {memory} memory: {size} more, for an array of shape {shape} "
                          f"and dtype {np.dtype(dtype)}, could not be allocated") from None


def device_array(shape, dtype):
    """cuda.device_array, out of memory raising MemoryError."""
    with _allocating(shape, dtype, "GPU"):
        return cuda.device_array(shape, dtype=dtype)


def device_copy(a):
    """cuda.to_device(a) (a NumPy array), out of memory raising MemoryError."""
    with _allocating(a.shape, a.dtype, "GPU"):
        return cuda.to_device(a)


def pinned_array(shape, dtype):
    """cuda.pinned_array (page-locked host memory), out of memory raising MemoryError."""
    with _allocating(shape, dtype, "page-locked host"):
        return cuda.pinned_array(shape, dtype=dtype)


# ------------------------------------------------------------------------------------------
# Scratch buffers: allocated once per (purpose, shape, dtype), reused by every later call
# ------------------------------------------------------------------------------------------

_SCRATCH = {}


def scratch(purpose, shape, dtype):
    """A device array for temporary results, cached so that a training loop does not call
    cudaMalloc every step. The contents are garbage on return; `purpose` names the user so that
    two temporaries of one shape alive at the same time do not alias."""
    key = (purpose, tuple(shape), np.dtype(dtype).str)
    a = _SCRATCH.get(key)
    if a is None:
        a = device_array(shape, dtype)
        _SCRATCH[key] = a
    return a


def ones(N, dtype):
    """A cached device vector of N ones, shape (N, 1): the right factor of db = DA^T 1_N."""
    key = ("ones", (N, 1), np.dtype(dtype).str)
    a = _SCRATCH.get(key)
    if a is None:
        a = device_copy(np.ones((N, 1), dtype=dtype))
        _SCRATCH[key] = a
    return a


@cuda.jit(cache=True)
def fill_kernel(a, value):
    """a[i] = value for every i of the flat view a (written, =). Grid-stride loop."""
    for i in range(cuda.grid(1), a.shape[0], cuda.gridsize(1)):
        a[i] = value


def line_launch(size, most=256):
    """(blocks, threads) of a 1-d launch over `size` elements, for a kernel that visits them in a
    grid-stride loop, `for i in range(cuda.grid(1), size, cuda.gridsize(1))`: blocks of `most`
    threads, or of whole warps enough for a small array, and at most LINE_BLOCKS blocks, each
    thread taking every (blocks * threads)-th element beyond them."""
    threads = min(most, round_up(max(size, 1), WARP))
    return max(1, min(LINE_BLOCKS, cdiv(size, threads))), threads


def matrix_launch(rows, cols, most=(16, 16)):
    """(grid, block) of a 2-d launch with one thread per element (c, r) of a rows x cols matrix:
    (columns, rows) blocks of `most`, or of sides of 8 enough for a small matrix."""
    block = (min(most[0], round_up(max(cols, 1), 8)), min(most[1], round_up(max(rows, 1), 8)))
    return (cdiv(cols, block[0]), cdiv(rows, block[1])), block


def fill(a, value):
    """Set every element of the C-contiguous device array `a` to `value`, on the GPU."""
    fill_kernel[line_launch(a.size)](a.reshape(a.size), a.dtype.type(value))


# ------------------------------------------------------------------------------------------
# C = A^T B, split over the long dimension (see the module docstring)
# ------------------------------------------------------------------------------------------

@cuda.jit(cache=True)
def matmul_tn_partial_kernel(partial, A, B):
    """partial[s] = A[rows of chunk s]^T B[rows of chunk s]   (written, =)

    partial (S, P, Q); A (N, P); B (N, Q). Chunk s is rows [s*c, min(N, (s+1)*c)) with
    c = ceil(N / S). One thread per output element (p, q) of a (tile x tile) tile, tile =
    blockDim.x = blockDim.y; grid (ceil(Q / tile), ceil(P / tile), S). Dynamic shared memory:
    2 * tile * tile values, the current tiles of A and B.
    """
    S, P, Q = partial.shape
    N = A.shape[0]
    tile = cuda.blockDim.x
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    p0, q0, s = cuda.blockIdx.y * tile, cuda.blockIdx.x * tile, cuda.blockIdx.z
    chunk = (N + S - 1) // S
    k_begin, k_end = s * chunk, min(N, (s + 1) * chunk)
    smem = cuda.shared.array(0, dtype=A.dtype)
    At = smem[:tile * tile]                     # At[kk*tile + c] = A[k0+kk, p0+c]
    Bt = smem[tile * tile:2 * tile * tile]      # Bt[kk*tile + c] = B[k0+kk, q0+c]
    zero = A.dtype.type(0)
    acc = zero
    for k0 in range(k_begin, k_end, tile):
        # thread (ty, tx) loads row k0+ty, column tx of both tiles (zero outside the matrices)
        k = k0 + ty
        inside = k < k_end
        At[ty * tile + tx] = A[k, p0 + tx] if inside and p0 + tx < P else zero
        Bt[ty * tile + tx] = B[k, q0 + tx] if inside and q0 + tx < Q else zero
        cuda.syncthreads()
        a_e, b_e, step = U(ty), U(tx), U(tile)  # unsigned: no wraparound test (fast/antisym.py)
        for kk in range(tile):
            acc += At[a_e] * Bt[b_e]                            # C[p0+ty, q0+tx]
            a_e += step                         # At[kk*tile + ty], Bt[kk*tile + tx]
            b_e += step
        cuda.syncthreads()
    if p0 + ty < P and q0 + tx < Q:
        partial[s, p0 + ty, q0 + tx] = acc


@cuda.jit(cache=True)
def sum_partials_kernel(C, partial):
    """C[p, q] = sum_s partial[s, p, q]   (written, =). C's elements in its memory order, in a
    grid-stride loop (line_launch)."""
    S, P, Q = partial.shape
    for e in range(cuda.grid(1), P * Q, cuda.gridsize(1)):
        p, q = e // Q, e % Q
        acc = C.dtype.type(0)
        for s in range(S):
            acc += partial[s, p, q]
        C[p, q] = acc


def matmul_tn_gpu(C, A, B, tile=TILE, splits=None, purpose="matmul_tn"):
    """C = A^T B (written, =): C (P, Q), A (N, P), B (N, Q), all C-contiguous device arrays.

    Twin of `np.dot(A.T, B, C)` in the CPU kernels. `splits` (S) defaults to enough chunks of N
    for about TARGET_BLOCKS blocks, at most one per `tile` rows (`splits_for`)."""
    if not C.dtype == A.dtype == B.dtype:    # one dtype sizes and reads the shared tiles
        raise TypeError(f"{purpose}: C, A and B must share one dtype, got {C.dtype}, {A.dtype} "
                        f"and {B.dtype}")
    N, P = A.shape
    Q = B.shape[1]
    tiles = cdiv(P, tile) * cdiv(Q, tile)
    if splits is None:
        splits = splits_for(tiles, N, tile)
    partial = scratch(purpose, (splits, P, Q), C.dtype)
    shared = 2 * tile * tile * C.dtype.itemsize
    matmul_tn_partial_kernel[(cdiv(Q, tile), cdiv(P, tile), splits), (tile, tile), 0, shared](
        partial, A, B)
    sum_partials_kernel[line_launch(P * Q)](C, partial)


def column_sums_gpu(db, D, tile=TILE, purpose="column_sums"):
    """db = sum over rows of D = D^T 1_N (written, =): db (P,), D (N, P)."""
    matmul_tn_gpu(db.reshape(db.shape[0], 1), D, ones(D.shape[0], D.dtype), tile=tile,
                  purpose=purpose)


# ------------------------------------------------------------------------------------------
# Shared by the baselines (rnn.py, lstm.py, gru.py): the recurrent matrix is stacked gates,
# W_hh (G n, n) with G = 1 (rnn), 4 (lstm), 3 (gru)
# ------------------------------------------------------------------------------------------

@cuda.jit(cache=True)
def transpose_kernel(out, a):
    """out = a^T (written, =): a (R, C), out (C, R). One thread per element; 2-d grid (c, r)."""
    c, r = cuda.grid(2)
    if r < a.shape[0] and c < a.shape[1]:
        out[c, r] = a[r, c]


def transpose_gpu(out, a, *, block=(16, 16)):
    """out = a^T (written, =) for device arrays a (R, C), out (C, R)."""
    R, C = a.shape
    transpose_kernel[matrix_launch(R, C, block)](out, a)


def transposed(a, purpose="transposed"):
    """a^T (C, R) for a device array a (R, C), in a scratch buffer (see `scratch`: valid until
    the next call with the same purpose and shape). Kernels whose thread i reads row i of a
    matrix, element by element, read its transpose instead: then at each step of their loop the
    threads of a warp read consecutive addresses."""
    out = scratch(purpose, tuple(a.shape)[::-1], a.dtype)
    transpose_gpu(out, a)
    return out


@cuda.jit(cache=True)
def rows_times_matrix_kernel(dh, D, W, t, accumulate):
    """dh[b, j] (+)= sum_k D[t, b, k] W[k, j]: dL/dh_{t-1} from the pre-activation gradients of
    step t, dh_{t-1} = D_t W_hh (row form). D (T, B, G n), W (G n, n), dh (B, n); written (=),
    or accumulated (+=) onto what dh holds when `accumulate`. One thread per (b, j); 2-d grid
    (j, b); for a given k consecutive threads read consecutive W[k, j]."""
    j, b = cuda.grid(2)
    B, n = dh.shape
    if b < B and j < n:
        acc = dh[b, j] if accumulate else dh.dtype.type(0)
        for k in range(W.shape[0]):
            acc += D[t, b, k] * W[k, j]
        dh[b, j] = acc


def rows_times_matrix_gpu(dh, D, W, t, accumulate, *, block=(128, 1)):
    """dh (+)= D[t] W, see rows_times_matrix_kernel."""
    grid, block = step_grid(*dh.shape, block)
    rows_times_matrix_kernel[grid, block](dh, D, W, t, accumulate)


@cuda.jit(device=True)
def hold_unit(hs, kept, t, b, i, lengths):
    """The step kernels' twin of common.hold_state for unit i: past row b's end (t >=
    lengths[b]) writes h_t = h_{t-1} (hs[t+1, b, i] = hs[t, b, i]) and kept[t, b, i] = 0, and
    returns True; else False, writing nothing."""
    if t < lengths[b]:
        return False
    hs[t + 1, b, i] = hs[t, b, i]
    kept[t, b, i] = 0
    return True


@cuda.jit(device=True)
def upstream(dh, dhs, t, b, i):
    """dL/dh_t[b, i] in BPTT's step t: dh[b, i] from the later steps, plus dhs[t, b, i] from
    outside the recurrence when dhs has steps (common.add_upstream's twin)."""
    g = dh[b, i]
    if dhs.shape[0] > 0:
        g += dhs[t, b, i]
    return g


@cuda.jit(device=True)
def load_block_rows(buf, src, b0, rows):
    """Copy this block's batch rows of src (B, n) into the flat shared array buf (rows * n):
    buf[r * n + i] = src[b0 + r, i] for the rows that exist (b0 + r < B), the block's threads
    sharing the units i (thread tid copies units tid, tid + blockDim.x, ...). The persistent
    kernels start their passes with it (h_0, or dL/dh_T). A thread may read back its own units at
    once; before any thread reads another's units the caller synchronises the block."""
    B, n = src.shape
    tid, nthreads = cuda.threadIdx.x, cuda.blockDim.x
    for r in range(rows):
        b = b0 + r
        if b < B:
            for i in range(tid, n, nthreads):
                buf[r * n + i] = src[b, i]


# ------------------------------------------------------------------------------------------
# Version 3, "split": several lanes of a warp per hidden unit (kernels/antisym.py explains it)
# ------------------------------------------------------------------------------------------

# lanes per unit a split kernel may use: powers of two below WARP (32 lanes would leave each
# lane at most one matrix value within 1,024 threads per block: see split_lanes)
SPLIT_LANES = (2, 4, 8, 16)
FULL_MASK = 0xFFFFFFFF              # every lane of the warp takes part in a shuffle
# Registers a split kernel needs beside the matrix values it holds (indices, the rows' states,
# loop counters), as `split_fits` budgets them. Under a launch bound of t threads, ptxas for
# sm_90 gives each thread at most 65,536 / (t rounded up to 128), in multiples of 8 (64 at
# 1,024 threads, 80 at 736), and spills beyond it; with room to spare it takes more (147 for 64
# float32 values at 256 threads). tests/test_ptx.py assembles the tightest case of each lanes
# and dtype, and n = 128, and holds them to no spills.
SPLIT_OTHER_REGISTERS = 40
REGISTERS_PER_THREAD_MAX = 255


def split_threads(n, lanes):
    """Threads per block of a split kernel: `lanes` per unit, rounded up to a warp."""
    return round_up(n * lanes, WARP)


def split_capacity(n, lanes):
    """Matrix values each lane holds in registers: ceil(n / lanes)."""
    return cdiv(n, lanes)


def split_fits(n, lanes, dtype):
    """Whether a split kernel at n units and `lanes` lanes per unit can launch: at most
    MAX_THREADS_PER_BLOCK threads, and its registers (the matrix values, 1 or 2 registers each,
    plus SPLIT_OTHER_REGISTERS) within what an SM gives each of them."""
    threads = split_threads(n, lanes)
    if lanes not in SPLIT_LANES or threads > MAX_THREADS_PER_BLOCK:
        return False
    per_value = np.dtype(dtype).itemsize // 4
    needed = split_capacity(n, lanes) * per_value + SPLIT_OTHER_REGISTERS
    available = 65536 // round_up(threads, 128) // 8 * 8
    return needed <= min(REGISTERS_PER_THREAD_MAX, available)


def bounded_kernel(max_threads, cache=True):
    """@cuda.jit for a kernel launched with at most `max_threads` threads per block (a launch
    bound: ptxas may then give each thread 65,536 / max_threads registers; see persistent_kernel;
    the simulator takes no launch bounds), cached on disk unless `cache` is False."""
    def decorate(func):
        if CUDA_IMPORT_ERROR is not None or simulator_enabled():
            return cuda.jit(func)
        return cuda.jit(launch_bounds=(max_threads, 1), cache=cache)(func)
    return decorate


def split_kernel(max_threads):
    """@cuda.jit for a split kernel launched with at most `max_threads` threads per block, one
    block per SM. Not cached on disk: a split kernel is made by a factory for its sizes, and
    numba's cache keys a function by its source, not by the values it closes over."""
    return bounded_kernel(max_threads, cache=False)


def split_launch(B, n, lanes, rows, dtype, values_per_row):
    """(grid, threads, shared bytes) of a split kernel whose blocks own `rows` batch rows and
    keep `values_per_row` vectors of n (padded to capacity * lanes) per row in shared memory;
    ValueError where it cannot launch."""
    if not split_fits(n, lanes, dtype):
        raise ValueError(f"a split kernel cannot run n={n} units with lanes={lanes} in "
                         f"{np.dtype(dtype).name}: lanes must be one of {SPLIT_LANES}, with at "
                         f"most {MAX_THREADS_PER_BLOCK} threads per block (n * lanes) and the "
                         f"matrix's share of each thread within its registers")
    if rows < 1:
        raise ValueError(f"a block owns at least one batch row, got rows={rows}")
    stride = split_capacity(n, lanes) * lanes
    shared = values_per_row * rows * stride * np.dtype(dtype).itemsize
    if shared > SHARED_BYTES_MAX:
        raise ValueError(f"{rows} rows per block need {shared} bytes of shared memory, at most "
                         f"{SHARED_BYTES_MAX}: use fewer rows per block")
    return cdiv(B, rows), split_threads(n, lanes), shared


def split_pass(kernels_for, B, n, lanes, rows, dtype):
    """(kernels, grid, threads, shared bytes) of a split pass: `kernels_for(cap, lanes, rows)`
    (a kernel file's factory) compiled for n units, and its launch (`split_launch`, two state
    copies per row); ValueError where it cannot run."""
    grid, threads, shared = split_launch(B, n, lanes, rows, dtype, 2)
    return kernels_for(split_capacity(n, lanes), lanes, rows), grid, threads, shared


if CUDA_IMPORT_ERROR is None and simulator_enabled():
    @cuda.jit(device=True)
    def shfl_down(value, delta):
        """The simulator's stand-in for cuda.shfl_down_sync(FULL_MASK, value, delta), which it
        lacks: lane l gets lane l + delta's value, or keeps its own where l + delta is past the
        warp. Exchanged through a block-wide array between two barriers, so every thread of
        the block must call it together (the split kernels do: all call lane_sum alike). Those
        barriers order the whole block, where a real shuffle orders its warp alone: the race
        checker of tests/gpu counts them as the warp's only, so a kernel cannot lean on them."""
        box = cuda.shared.array(MAX_THREADS_PER_BLOCK, np.float64)
        tid = cuda.threadIdx.x
        box[tid] = value
        cuda.syncthreads()
        src = tid + delta
        got = box[src] if tid % WARP + delta < WARP and src < cuda.blockDim.x else value
        cuda.syncthreads()
        return type(value)(got)
else:
    @cuda.jit(device=True)
    def shfl_down(value, delta):
        """Lane l gets lane l + delta's value (its own past the warp's end); all 32 lanes take
        part."""
        return cuda.shfl_down_sync(FULL_MASK, value, delta)


@cuda.jit(device=True)
def lane_sum(partial, lanes):
    """The sum of `partial` over each group of `lanes` consecutive lanes (a power of two that
    divides the warp), in the group's first lane, by log2(lanes) shuffles: after the shuffle by
    delta, lane l holds the sum of lanes l .. l + 2 delta - 1 of its group. Every lane of the
    warp must call it (the other lanes end with partial sums)."""
    delta = lanes // 2
    while delta > 0:
        partial += shfl_down(partial, delta)
        delta //= 2
    return partial


def split_bound(cap, lanes):
    """The launch bound of a split kernel compiled for `cap` values per lane: its most threads,
    over the largest n with that cap (n = cap * lanes)."""
    return min(MAX_THREADS_PER_BLOCK, round_up(cap * lanes * lanes, WARP))


def split_lanes(n, dtype):
    """The lanes per unit worth offering at n units: those that fit (`split_fits`) and leave
    each lane two matrix values or more. A lane with one value does one multiply-add and then
    a shuffle more than half as many lanes with two would, on twice the threads."""
    return [lanes for lanes in SPLIT_LANES
            if split_fits(n, lanes, dtype) and (split_capacity(n, lanes) >= 2
                                                or lanes == SPLIT_LANES[0])]


@cuda.jit(device=True)
def load_lane_values(D, M, i, lane, cap, lanes):
    """D[k] = M[lane + k lanes, i] for k < cap: lane `lane`'s share of column i of M (n, n),
    zero past n and for a thread past the last unit (i >= n)."""
    n = M.shape[0]
    for k in range(cap):
        j = lane + k * lanes
        D[k] = M[j, i] if i < n and j < n else M.dtype.type(0)


@cuda.jit(device=True)
def lane_dot(D, v, start, cap, lanes):
    """This lane's share of a dot product: sum_k D[k] v[start + k lanes], over two accumulators
    so that consecutive multiply-adds do not wait for each other."""
    acc0 = v.dtype.type(0)
    acc1 = v.dtype.type(0)
    base = np.uint32(start)
    for k in range(0, cap - 1, 2):
        acc0 += D[k] * v[base + np.uint32(k * lanes)]
        acc1 += D[k + 1] * v[base + np.uint32((k + 1) * lanes)]
    if cap % 2 == 1:
        acc0 += D[cap - 1] * v[base + np.uint32((cap - 1) * lanes)]
    return acc0 + acc1


@cuda.jit(device=True)
def zero_shared(buf, size):
    """buf[:size] = 0, the block's threads sharing it; ends with a barrier."""
    for e in range(cuda.threadIdx.x, size, cuda.blockDim.x):
        buf[e] = 0
    cuda.syncthreads()


@cuda.jit(device=True)
def load_padded_rows(buf, src, b0, rows, stride):
    """The two state copies of a split kernel's block: buf (2 rows stride) zeroed, then
    buf[r stride + j] = src[b0 + r, j] for its rows that exist. Ends with a barrier."""
    zero_shared(buf, 2 * rows * stride)
    B, n = src.shape
    tid, nthreads = cuda.threadIdx.x, cuda.blockDim.x
    for r in range(rows):
        if b0 + r < B:
            for j in range(tid, n, nthreads):
                buf[r * stride + j] = src[b0 + r, j]
    cuda.syncthreads()


@cuda.jit(cache=True)
def input_projection_kernel(u, x, V, b):
    """u[t, r, i] = sum_k V[i, k] x[t, r, k] + b[i] (written, =): the input part of every
    step's pre-activations at once, u (T, B, N), x (T, B, m), V (N, m), b (N,); the elements of
    u in their memory order, in a grid-stride loop (line_launch)."""
    T, B, N = u.shape
    for e in range(cuda.grid(1), T * B * N, cuda.gridsize(1)):
        t, rest = e // (B * N), e % (B * N)
        r, i = rest // N, rest % N
        acc = b[i]
        for k in range(x.shape[2]):
            acc += V[i, k] * x[t, r, k]
        u[t, r, i] = acc


def input_projection_gpu(u, x, V, b, *, threads=256):
    """u = x V^T + b for every step (written, =); see input_projection_kernel."""
    input_projection_kernel[line_launch(u.size, threads)](u, x, V, b)


def stacked_param_grads_gpu(dW_ih, dW_hh, db_ih, db_hh, dgi, dgh, hs, x, *, tile=TILE):
    """The products that end BPTT of the baselines, as in their CPU twins (all written, =):
    dW_hh = DGH^T H ; dW_ih = DGI^T X ; db_hh = DGH^T 1 ; db_ih = DGI^T 1, where dgi, dgh
    (T, B, G n) are dL/d(W_ih x_t + b_ih) and dL/d(W_hh h_{t-1} + b_hh); they are the same array
    for rnn and lstm (then db_hh is a copy of db_ih), and differ for gru. hs (T+1, B, n),
    x (T, B, m)."""
    T, B, m = x.shape
    n, Gn = hs.shape[2], dgh.shape[2]
    DGH = dgh.reshape(T * B, Gn)
    DGI = dgi.reshape(T * B, Gn)
    matmul_tn_gpu(dW_hh, DGH, hs[:T].reshape(T * B, n), tile=tile)
    matmul_tn_gpu(dW_ih, DGI, x.reshape(T * B, m), tile=tile)
    column_sums_gpu(db_ih, DGI, tile=tile)
    if dgi is dgh:
        db_hh.copy_to_device(db_ih)
    else:
        column_sums_gpu(db_hh, DGH, tile=tile)


def state_launch(B, n, dtype, values_per_row, rows, threads):
    """(grid, threads, shared bytes) of a baseline's persistent kernel: block k owns batch rows
    [k rows, (k+1) rows) and keeps `values_per_row` state values per row in shared memory
    (the matrix stays in global memory). ValueError if that does not fit."""
    shared = values_per_row * rows * np.dtype(dtype).itemsize
    return persistent_grid(B, n, rows, threads, shared,
                           f"{rows} rows of {values_per_row} state values need {shared} bytes of "
                           f"shared memory; at most {SHARED_BYTES_MAX}: use fewer rows per block")

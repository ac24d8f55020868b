"""Which device runs the kernels: "cpu", "cuda", or "auto" (cuda when a GPU is usable, else cpu).

    ok, why = cuda_available()     # (True, "NVIDIA H100 80GB HBM3, compute capability 9.0")
                                   # or (False, "no CUDA driver: libcuda.so cannot be found ...")
    resolve_device("auto")         # "cuda" or "cpu"
    resolve_device("cuda")         # "cuda", or DeviceUnavailable carrying the reason

Nothing here lets a driver error escape as a traceback: `cuda_available` turns every failure
(numba-cuda missing, no driver, no device, NVVM missing, a kernel that cannot be compiled and
run: `launch_check`) into a one-line reason, and
`resolve_device("cuda")` raises DeviceUnavailable with that reason and what to do instead. The
command line turns DeviceUnavailable into its usual error message.

Numba's CUDA simulator counts as usable for an explicit "cuda": with NUMBA_ENABLE_CUDASIM=1 in
the environment before numba is first imported, `numba.cuda` runs kernels as Python threads on
the CPU (correct, and thousands of times slower). That is how the GPU tests run on machines
without a GPU. "auto" never picks it: it stands for speed.
"""
import functools
import importlib.metadata
import importlib.util
import os
import platform
import re

import numpy as np

from ..kernels.gpu_common import simulator_enabled
from .memory import device_array, fill

DEVICES = ("cpu", "cuda", "auto")

# The NumPy that the cuda extra asks for (setup.cfg says why: numba-cuda 0.30 calls np.row_stack,
# which numpy 2.5 removed). A kernel that fails to build beside a newer NumPy is reported as this
# clash, with the command that mends it.
CUDA_NUMPY = "numpy<2.5"
CUDA_NUMPY_BELOW = (2, 5)


class DeviceUnavailable(RuntimeError):
    """device="cuda" was asked for, and no usable GPU is present."""


def _one_line(exc):
    return " ".join(str(exc).split()).rstrip(".") or type(exc).__name__


def _no_gpu():
    """Why cuda is unusable when the driver works but lists no GPU, with CUDA_VISIBLE_DEVICES if
    set (an empty value hides every GPU)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return "the CUDA driver reports no GPU" + (
        f" (CUDA_VISIBLE_DEVICES={visible!r})" if visible is not None else "")


@functools.lru_cache(maxsize=1)
def cuda_available():
    """(True, a description of the GPU) when CUDA kernels can run, else (False, the reason).
    Checked once per process: numba fixes its CUDA target when it is first imported."""
    if importlib.util.find_spec("numba_cuda") is None:
        # numba still ships a deprecated built-in numba.cuda, but it cannot compile our kernels
        # (it does not resolve the @overload-ed scalar math they share with the CPU twins)
        return False, "numba-cuda is not installed; pip install -e '.[cuda]'"
    try:
        from numba import cuda
    except Exception as exc:               # ImportError, or CUDA bindings that fail to load
        return False, f"numba.cuda cannot be imported ({_one_line(exc)}); pip install -e '.[cuda]'"
    if simulator_enabled():
        return True, "Numba CUDA simulator (NUMBA_ENABLE_CUDASIM=1): correct but very slow"
    try:
        if not cuda.is_available():
            err = cuda.cuda_error()
            if err is not None and "CUDA_ERROR_NO_DEVICE" in str(err):   # the driver loads
                return False, _no_gpu()
            if err is not None:
                return False, f"no usable CUDA driver ({_one_line(err)})"
            return False, ("the CUDA driver works but libNVVM was not found; "
                           "pip install 'numba-cuda[cu12]'")
        if len(cuda.gpus) == 0:
            return False, _no_gpu()
        device = cuda.get_current_device()
        name = device.name.decode() if isinstance(device.name, bytes) else str(device.name)
        major, minor = device.compute_capability
    except Exception as exc:               # a driver that loads but fails on first use
        return False, f"CUDA initialisation failed ({_one_line(exc)})"
    try:
        launch_check()
    except Exception as exc:               # NVVM, nvJitLink or the driver cannot build or run code
        clash = version_clash(exc)
        why = f" ({_one_line(exc)})" if clash is None else f": {clash}"
        return False, (f"{name} (compute capability {major}.{minor}) is there, but a kernel "
                       f"cannot be compiled and run on it{why}")
    return True, f"{name}, compute capability {major}.{minor}"


def version_clash(exc, numpy_version=None):
    """Where a kernel failed to build (`exc`) beside a NumPy newer than CUDA_NUMPY allows: the
    versions that clash and the command that mends it, in one line; else None."""
    if numpy_version is None:
        numpy_version = np.__version__
    if tuple(int(v) for v in re.findall(r"\d+", numpy_version)[:2]) < CUDA_NUMPY_BELOW:
        return None
    try:
        numba_cuda = "numba-cuda " + importlib.metadata.version("numba-cuda")
    except importlib.metadata.PackageNotFoundError:
        numba_cuda = "numba-cuda"
    return (f"{numba_cuda} does not work with numpy {numpy_version} ({_one_line(exc)}); "
            f"install the numpy nprnn's cuda extra asks for: pip install '{CUDA_NUMPY}'")


def launch_check():
    """Compile one of nprnn's kernels (gpu_common.fill), run it on one element and read the
    element back. A GPU whose compiler libraries (NVVM, nvJitLink) or driver cannot build or
    launch code is not usable: this finds out before any work starts, not at the first launch
    of a training run. Raises what the failure raised."""
    a = device_array(1, np.float32)
    fill(a, 1.0)
    if a.copy_to_host()[0] != 1.0:
        raise RuntimeError("a kernel that writes 1.0 left another value")


def resolve_device(device):
    """"cpu" or "cuda" for a requested device in DEVICES: "auto" picks cuda when a real GPU is
    usable (not the simulator); "cuda" without one raises DeviceUnavailable naming the
    reason."""
    if device not in DEVICES:
        raise ValueError(f"device must be one of {DEVICES}, got {device!r}")
    if device == "cpu":
        return "cpu"
    ok, why = cuda_available()
    if device == "auto":
        return "cuda" if ok and not simulator_enabled() else "cpu"
    if not ok:
        raise DeviceUnavailable(f"device 'cuda' was requested but no GPU is usable: {why}. "
                                f"Use device 'cpu', or 'auto' to take a GPU only when one is "
                                f"usable.")
    return "cuda"


def cpu_model():
    """The CPU's model name ("Intel(R) Xeon(R) Processor"), from /proc/cpuinfo where there is
    one, else what the platform module knows."""
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f
                        if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def usable_cpus():
    """How many CPUs this process may run on: its affinity mask where the system has one (a
    container or `taskset` may allow fewer than the machine has), else the machine's count."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def describe(device):
    """One line for logs and `--help` output: the resolved device and, for cuda, the GPU."""
    if device == "cuda":
        return f"cuda ({cuda_available()[1]})"
    return device

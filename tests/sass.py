"""The machine code of a GPU kernel, read without a GPU: what tests/test_sass.py counts and what
docs/gpu.md's table of instructions comes from.

    PTX (numba-cuda, for sm_90, as tests/test_ptx.py compiles it) -> ptxas -> cubin
        -> nvdisasm -> SASS, the instructions an H100/H200 runs

A kernel's time loop is its largest loop (the span from a label to the last branch back to it);
its body, counted statically, is the cost of a step that the tables give: every instruction once,
also those of a branch that a given thread skips, so it is an upper bound on one thread's step.
Integer instructions (I*, U*, LEA, SEL, SHF, LOP3, MOV, PRMT, S2R, ...) are index arithmetic here;
FFMA, the multiply-adds, the work.

    python tests/sass.py        prints docs/gpu.md's table (needs ptxas and nvdisasm)
"""
import collections
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
import types

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
INTEGER = re.compile(r"^(?:I\w*|U\w*|LEA|SEL|SHF|LOP3|MOV|PRMT|S2R|S2UR|CS2R|P2R|R2P|R2UR|"
                     r"PLOP3|BMSK|SGXT|FLO|POPC|VIADD)$")


def find_nvdisasm():
    """NVIDIA's nvdisasm: from the nvidia-cuda-nvdisasm wheel, another wheel that bundles it
    (Triton's), or PATH; None where there is none."""
    try:
        import nvidia
        for root in nvidia.__path__:
            for path in glob.glob(os.path.join(root, "*", "bin", "nvdisasm")):
                return path
    except ImportError:
        pass
    try:
        import triton
        path = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin",
                            "nvdisasm")
        if os.path.exists(path):
            return path
    except ImportError:
        pass
    return shutil.which("nvdisasm")


def compile_sass(kernel, dtype):
    """The SASS text of a numba-cuda kernel (a dispatcher) for sm_90 in `dtype`, with its launch
    bound; None where ptxas or nvdisasm is missing."""
    import numba.cuda.dispatcher as dispatcher
    from numba import cuda
    from test_ptx import CC, arg_types, find_ptxas
    ptxas, nvdisasm = find_ptxas(), find_nvdisasm()
    if ptxas is None or nvdisasm is None:
        return None
    saved = dispatcher.get_current_device
    if not _has_gpu():
        dispatcher.get_current_device = lambda: types.SimpleNamespace(compute_capability=CC)
    try:
        name = kernel.py_func.__name__
        ptx, _ = cuda.compile_ptx(kernel.py_func, arg_types(name, kernel.py_func, dtype), cc=CC,
                                  launch_bounds=kernel.targetoptions.get("launch_bounds"))
    finally:
        dispatcher.get_current_device = saved
    with tempfile.TemporaryDirectory() as tmp:
        ptx_path, cubin = os.path.join(tmp, "k.ptx"), os.path.join(tmp, "k.cubin")
        with open(ptx_path, "w") as f:
            f.write(ptx)
        subprocess.run([ptxas, f"-arch=sm_{CC[0]}{CC[1]}", "-o", cubin, ptx_path], check=True,
                       capture_output=True)
        return subprocess.run([nvdisasm, cubin], check=True, capture_output=True,
                              text=True).stdout


def _has_gpu():
    from nprnn.core.device import cuda_available
    return cuda_available()[0]


def instructions(sass):
    """(instructions, labels): the opcodes-with-operands in order, and label -> position."""
    instrs, labels = [], {}
    for line in sass.splitlines():
        label = re.match(r"\s*(\.L_\w+):", line)
        if label:
            labels[label[1]] = len(instrs)
            continue
        ins = re.match(r"\s*/\*[0-9a-f]{4,}\*/\s+(.*?)\s*;", line)
        if ins:
            instrs.append(ins[1])
    return instrs, labels


def opcode(ins):
    """The opcode without its predicate and modifiers: '@!P0 IMAD.WIDE.U32 R2, ...' -> 'IMAD'."""
    return re.sub(r"^@!?U?P\w+\s+", "", ins).split()[0].split(".")[0]


def time_loop(sass):
    """The instructions of the kernel's largest loop (its time loop), or [] if it has none."""
    instrs, labels = instructions(sass)
    best = (0, -1)
    for end, ins in enumerate(instrs):
        target = re.search(r"BRA\s+`?\(?(\.L_\w+)", ins)
        if target and labels.get(target[1], end + 1) <= end:
            start = labels[target[1]]
            if end - start > best[1] - best[0]:
                best = (start, end)
    return instrs[best[0]:best[1] + 1]


def product_loops(sass):
    """The loops with multiply-adds whose body holds no other loop (the innermost products),
    each as its instructions."""
    instrs, labels = instructions(sass)
    spans = []
    for end, ins in enumerate(instrs):
        target = re.search(r"BRA\s+`?\(?(\.L_\w+)", ins)
        if target and labels.get(target[1], end + 1) <= end:
            spans.append((labels[target[1]], end))
    inner = [(a, b) for a, b in spans
             if not any(a <= c and d <= b and (c, d) != (a, b) for c, d in spans)]
    return [instrs[a:b + 1] for a, b in inner
            if any(opcode(i) == "FFMA" for i in instrs[a:b + 1])]


def counts(instrs):
    """{"total", "integer", "FFMA"} of a list of instructions."""
    ops = collections.Counter(opcode(i) for i in instrs)
    return dict(total=sum(ops.values()),
                integer=sum(v for k, v in ops.items() if INTEGER.match(k)), FFMA=ops["FFMA"])


def table_rows(n=128, lanes=8, dtype="float32"):
    """(kernel, version, counts of the time loop's body) of the kernels in docs/gpu.md's table;
    the step kernels, one launch per step, have no time loop: their whole body."""
    from nprnn.kernels import antisym, gru, lstm, rnn
    from nprnn.kernels.fast import antisym as fast_antisym
    from nprnn.kernels.fast import gru as fast_gru
    from nprnn.kernels.fast import lstm as fast_lstm
    from nprnn.kernels.fast import rnn as fast_rnn
    from nprnn.kernels.gpu_common import split_capacity
    cap = split_capacity(n, lanes)
    split_euler = fast_antisym.euler_split_kernels(cap, lanes, 1)
    split_rnn = fast_rnn.rnn_split_kernels(cap, lanes, 1)
    kernels = [
        ("antisym forward", "step", antisym.euler_forward_step_kernel),
        ("antisym BPTT", "step", antisym.euler_backward_step_kernel),
        ("antisym forward", "persistent", fast_antisym.euler_forward_persistent_kernel),
        ("antisym BPTT", "persistent", fast_antisym.euler_backward_persistent_kernel),
        ("antisym forward", f"split, {lanes} lanes", split_euler.forward),
        ("antisym BPTT", f"split, {lanes} lanes", split_euler.backward),
        ("rnn forward", f"split, {lanes} lanes", split_rnn[0]),
        ("rnn BPTT", f"split, {lanes} lanes", split_rnn[1]),
        ("lstm forward", "persistent", fast_lstm.lstm_forward_persistent_kernel),
        ("lstm BPTT", "persistent", fast_lstm.lstm_backward_persistent_kernel),
        ("gru forward", "persistent", fast_gru.gru_forward_persistent_kernel),
        ("gru BPTT", "persistent", fast_gru.gru_backward_persistent_kernel),
    ]
    gru_lanes = max(fast_gru.gru_split_lanes(n, dtype))      # the GRU's split: 2 lanes at 128
    plan = fast_gru.gru_split_plan(n, gru_lanes, dtype)
    split_gru = fast_gru.gru_split_kernels(plan.cap, gru_lanes, 1, plan.n_held)
    kernels += [("gru forward", f"split, {gru_lanes} lanes", split_gru[0]),
                ("gru BPTT", f"split, {gru_lanes} lanes", split_gru[1])]
    del lstm, gru, rnn                      # the step kernels of the baselines: not tabled
    rows = []
    for what, version, kernel in kernels:
        sass = compile_sass(kernel, dtype)
        if sass is None:
            raise SystemExit("ptxas or nvdisasm not found: pip install nvidia-cuda-nvcc-cu12 "
                             "nvidia-cuda-nvdisasm")
        body = time_loop(sass) if version != "step" else instructions(sass)[0]
        rows.append((what, version, counts(body)))
    from nprnn.kernels.gpu_common import matmul_tn_partial_kernel
    (inner,) = product_loops(compile_sass(matmul_tn_partial_kernel, dtype))
    rows.append(("weight gradients (dA = DA^T H, ...)", "tiled product, inner loop", counts(inner)))
    return rows


if __name__ == "__main__":
    print("| kernel | version | instructions | integer | FFMA |")
    print("|---|---|---|---|---|")
    for what, version, c in table_rows():
        print(f"| {what} | {version} | {c['total']} | {c['integer']} | {c['FFMA']} |")

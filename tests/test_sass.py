"""The split kernels' static cost, read from their machine code for sm_90 (tests/sass.py): the
instructions of the time loop's body at n = 128 units, 8 lanes, float32, held under ceilings.

Before the indices of the loop became unsigned, numba's wraparound for negative indices made most
of a step integer work: 478 instructions in the forward loop (301 integer) and 218 in BPTT (158).
The ceilings are about half of those; the weight-gradient product's inner loop is held too. Skipped where ptxas or nvdisasm is missing (the cuda extra
brings both on Linux x86-64) and under the CUDA simulator, which compiles no machine code.
"""
import pytest

from nprnn.core.device import simulator_enabled

if simulator_enabled():
    pytest.skip("the CUDA simulator has no PTX compiler", allow_module_level=True)

import sass  # noqa: E402

# (kernel, its factory's index) -> (most instructions, most integer ones) in the time loop
CEILINGS = {("euler_split_kernels", 0): (250, 90), ("euler_split_kernels", 2): (130, 70),
            ("rnn_split_kernels", 0): (245, 80), ("rnn_split_kernels", 1): (95, 45)}


@pytest.mark.parametrize("factory, index", list(CEILINGS))
def test_split_kernels_time_loop_stays_within_its_instruction_ceiling(factory, index):
    from nprnn.kernels.fast import antisym, rnn
    from nprnn.kernels.gpu_common import split_capacity
    make = getattr(antisym if factory.startswith("euler") else rnn, factory)
    kernel = make(split_capacity(128, 8), 8, 1)[index]
    code = sass.compile_sass(kernel, "float32")
    if code is None:
        pytest.skip("ptxas or nvdisasm not found: pip install -e '.[cuda]' (Linux x86-64)")
    c = sass.counts(sass.time_loop(code))
    most, most_integer = CEILINGS[factory, index]
    name = kernel.py_func.__name__
    assert c["FFMA"] >= 16, f"{name}: the loop found is not the time loop ({c})"
    assert c["total"] <= most and c["integer"] <= most_integer, (
        f"{name}: {c['total']} instructions ({c['integer']} integer) per step, over the ceiling "
        f"of {most} ({most_integer}): index arithmetic back in the loop?")


def test_the_weight_gradient_product_spends_few_instructions_per_multiply_add():
    """matmul_tn_partial_kernel (dA = DA^T H and every weight gradient on the GPU): its inner
    loop took 106 instructions per 4 multiply-adds with signed indices, 50 with unsigned ones;
    the ceiling is 14 per multiply-add."""
    from nprnn.kernels.gpu_common import matmul_tn_partial_kernel
    code = sass.compile_sass(matmul_tn_partial_kernel, "float32")
    if code is None:
        pytest.skip("ptxas or nvdisasm not found: pip install -e '.[cuda]' (Linux x86-64)")
    (loop,) = sass.product_loops(code)
    c = sass.counts(loop)
    assert c["total"] <= 14 * c["FFMA"], c

"""nprnn.torch.Recurrent on CUDA (device="cuda"): the GPU twins run the layer, against the same
layer on the CPU.

On a GPU the tensors are CUDA tensors, shared with numba's device arrays through
__cuda_array_interface__; under Numba's CUDA simulator, which runs the GPU twins on the CPU, CPU
tensors stand in for them (nprnn/torch.py, `_Device`). Skipped where PyTorch is not installed.
"""
import numpy as np
import pytest
from gpu_testing import B, M, N, T, requires_cuda, small_launch

import nprnn
from nprnn.kernels.gpu_common import simulator_enabled

torch = pytest.importorskip("torch", reason="PyTorch is the optional torch extra")
from nprnn.torch import Recurrent  # noqa: E402

pytestmark = requires_cuda
# a family each: the Euler cells, the stacked-gate baselines with c_0, the successors' two states
HYPER = {"antisym-gated": dict(eps=0.5, gamma=0.1), "lstm": {}, "cornn": {}}


def run(layer, x, h0, s0, lengths):
    """(out, h_n[, s_n]) and the gradients of x, h_0, s_0 (the second state's, where the cell
    has one) and every parameter, on the CPU."""
    x, h0, s0 = (v.clone().to(layer.W_device()).requires_grad_() for v in (x, h0, s0))
    two = layer.cell.second_state is not None
    out, state = layer(x, (h0, s0) if two else h0, lengths=lengths)
    h_n, s_n = state if two else (state, None)
    loss = (out ** 2).sum() + out.sum() + (h_n ** 3).sum()
    if two:
        loss = loss + (s_n ** 2).sum()
    loss.backward()
    got = dict(out=out, h_n=h_n, s_n=s_n, dx=x.grad, dh0=h0.grad, ds0=s0.grad if two else None,
               **{k: p.grad for k, p in layer.named_parameters()})
    return {k: None if v is None else v.detach().cpu().numpy() for k, v in got.items()}


@pytest.mark.parametrize("name, layers", [(name, 2) for name in HYPER]
                         + [(name, 1) for name in nprnn.CELLS if name not in HYPER])
def test_the_layer_on_cuda_is_the_layer_on_the_cpu(name, layers, monkeypatch):
    """Every cell (two layers for one of each family), h_0 (and c_0 or z_0), rows of lengths
    T, 1 and between, float64: the outputs, the last states and every gradient equal the CPU
    layer's."""
    small_launch(monkeypatch)
    hyper = HYPER.get(name, {k: v for k, v in dict(eps=0.5, gamma=0.1).items()
                             if k in nprnn.CELLS[name].hyper})
    layers = [Recurrent(name, M, N, num_layers=layers, dtype=torch.float64, sigma_w=2.0, seed=1,
                        device=device, **hyper) for device in ("cpu", "cuda")]
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(B, T, M, dtype=torch.float64, generator=gen)
    h0, c0 = (torch.randn(layers[0].num_layers, B, N, dtype=torch.float64, generator=gen)
              for _ in range(2))
    want, got = (run(layer, x, h0, c0, [T, 1, 3]) for layer in layers)
    for k, v in want.items():
        if v is not None:
            np.testing.assert_allclose(got[k], v, rtol=1e-10, atol=1e-12, err_msg=k)


def test_the_gpu_kernels_read_and_write_the_tensors_own_memory(monkeypatch, forward_spy):
    """No copies: the device arrays the kernels read are the parameters' memory, and the
    outputs are the memory of the states array the kernels wrote."""
    small_launch(monkeypatch)
    rnn = Recurrent("gru", M, N, dtype=torch.float64, device="cuda")
    seen = forward_spy(rnn.cell)
    out, h_n = rnn(torch.randn(B, T, M, dtype=torch.float64, device=rnn.W_device()))
    for k, v in rnn.named_parameters():
        assert address(seen["p"][k]) == v.data_ptr(), k
    hs = seen["hs"]
    # out (B, T, n) is the batch-first view of hs[1:] (T, B, n): it starts at hs[1, 0, 0]
    assert out.data_ptr() == address(hs) + B * N * hs.dtype.itemsize


def address(a):
    """Where a numba device array (or the simulator's stand-in) starts in memory."""
    if hasattr(a, "_ary"):                                   # the simulator's: a NumPy array
        return a._ary.ctypes.data
    return a.device_ctypes_pointer.value or 0


@pytest.mark.real_gpu
@pytest.mark.skipif(simulator_enabled(), reason="the CUDA simulator has no streams to order")
def test_under_a_side_stream_the_layer_is_ordered_with_it():
    """On a GPU, under `torch.cuda.stream(s)`: x made on s just before, the layer, and a loss
    and its backward on s after it give the default stream's numbers (the kernels wait for s's
    work, and s for theirs). The simulator has no streams."""
    rnn = Recurrent("antisym", M, N, dtype=torch.float64, device="cuda", eps=0.5, gamma=0.1)
    base = torch.randn(B, T, M, dtype=torch.float64, device="cuda")

    def step():
        x = (base * 2.0).requires_grad_()            # queued on the current stream
        out, h_n = rnn(x)
        ((out ** 2).sum() + h_n.sum()).backward()
        return out.detach().clone(), x.grad.clone(), rnn.W.grad.clone()
    want = step()
    rnn.zero_grad()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        got = step()
    side.synchronize()
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)

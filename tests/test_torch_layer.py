"""nprnn.torch.Recurrent, the cells as a PyTorch layer run by nprnn's kernels (issue 54).

    torch.autograd.gradcheck in float64 -> the layer's gradients of x, h_0 and every parameter,
        on every cell, with h_0, lengths and 2 layers
    nprnn's own loss_and_grad, and nn.LSTM / nn.GRU loaded with the same weights -> the same
        numbers; a short torch.optim.SGD training -> the losses nprnn's own SGD gives
Skipped where PyTorch is not installed (pip install -e '.[torch]'); CI installs it.
"""
import numpy as np
import pytest

import nprnn
from nprnn.core.cells import variants
from nprnn.core.optim import make_optimizer

torch = pytest.importorskip("torch", reason="PyTorch is the optional torch extra")
from nprnn.torch import Recurrent  # noqa: E402

B, T, M, N = 3, 4, 2, 3
VARIANTS = variants()
HYPER = {"eps": 0.5, "gamma": 0.1}


def layer_for(name, options, layers=2, dtype=torch.float64):
    hyper = {k: v for k, v in HYPER.items() if k in nprnn.CELLS[name].hyper}
    return Recurrent(name, M, N, num_layers=layers, dtype=dtype, sigma_w=2.0, seed=1, **hyper,
                     **options)


@pytest.mark.parametrize("label, name, options", VARIANTS, ids=[v[0] for v in VARIANTS])
def test_gradcheck_on_x_h0_and_every_parameter(label, name, options):
    """Two layers, a given h_0 (and the second state's s_0 of the LSTMs, coRNN and LEM, with
    s_n in the loss), rows of lengths T, 1 and between; W of the antisymmetric cells enters
    through its strict upper triangle (the lower one is not a parameter: its gradient is held at
    0, as make_model's)."""
    rnn = layer_for(name, options)
    names = [k for k, _ in rnn.named_parameters()]
    two = rnn.cell.second_state is not None
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(B, T, M, dtype=torch.float64, generator=gen, requires_grad=True)
    h0, c0 = (torch.randn(2, B, N, dtype=torch.float64, generator=gen, requires_grad=True)
              for _ in range(2))
    params = [p.detach().clone().requires_grad_() for p in rnn.parameters()]

    def loss(x, h0, s0, *values):
        mask = {k: rnn.cell.grad_mask(k.rsplit("_l", 1)[0], N) for k in names}
        held = {k: v if mask[k] is None else v * torch.from_numpy(mask[k])
                for k, v in zip(names, values)}
        out, h_n = torch.func.functional_call(rnn, held, (x, (h0, s0) if two else h0),
                                              dict(lengths=[T, 1, 3]))
        h_n, s_n = h_n if two else (h_n, x.new_zeros(()))
        return (out ** 2).sum() + out.sum() + (h_n ** 3).sum() + (s_n ** 2).sum()
    assert torch.autograd.gradcheck(loss, (x, h0, c0, *params), eps=1e-6, atol=1e-7, rtol=1e-6,
                                    fast_mode=True)


@pytest.mark.parametrize("name", ["antisym-gated", "lstm", "gru"])
def test_the_layer_is_nprnns_model(name):
    """With nprnn's readout on top, the loss and every gradient are make_model's (same seed,
    layers=2, readout at every step, lengths)."""
    rnn = layer_for(name, {})
    hyper = {k: v for k, v in HYPER.items() if k in nprnn.CELLS[name].hyper}
    model = nprnn.make_model(name, M, N, 4, dtype="float64", layers=2, readout="every",
                             sigma_w=2.0, seed=1, **hyper)
    for k, p in rnn.named_parameters():
        np.testing.assert_array_equal(p.detach().numpy(), model.params[k])
    rng = np.random.default_rng(2)
    x, y, lengths = rng.standard_normal((B, T, M)), rng.integers(-1, 4, (B, T)), [T, 2, 1]
    out, _ = rnn(torch.from_numpy(x), lengths=lengths)
    logits = out @ torch.from_numpy(model.params["W_out"]).T + torch.from_numpy(
        model.params["b_out"])
    target = torch.from_numpy(np.where(np.arange(T)[None] < np.array(lengths)[:, None], y, -1))
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 4), target.reshape(-1),
                                             ignore_index=-1)
    loss.backward()
    ours, grads = model.loss_and_grad(x, y, lengths=lengths)
    assert loss.item() == pytest.approx(ours, rel=1e-12)
    for k, p in rnn.named_parameters():
        np.testing.assert_allclose(p.grad.numpy(), grads[k], rtol=1e-10, atol=1e-13, err_msg=k)


@pytest.mark.parametrize("name", ["lstm", "gru"])
def test_the_layer_is_pytorchs_module_with_a_packed_sequence(name):
    """A 2-layer nn.LSTM / nn.GRU with the layer's weights, fed the same PackedSequence and h_0
    (and c_0): the same packed outputs, h_n (and c_n), and gradients of x, h_0 (c_0) and every
    weight."""
    rnn = layer_for(name, {})
    module = getattr(torch.nn, name.upper())(M, N, num_layers=2, batch_first=True,
                                             dtype=torch.float64)
    module.load_state_dict({k: v.detach() for k, v in rnn.named_parameters()})
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(B, T, M, dtype=torch.float64, generator=gen)
    h0, c0 = (torch.randn(2, B, N, dtype=torch.float64, generator=gen) for _ in range(2))
    lengths = torch.tensor([2, T, 1])
    results = []
    for layer in (rnn, module):
        xs, h, c = (v.clone().requires_grad_() for v in (x, h0, c0))
        packed = torch.nn.utils.rnn.pack_padded_sequence(xs, lengths, batch_first=True,
                                                         enforce_sorted=False)
        out, h_n = layer(packed, (h, c) if name == "lstm" else h)
        out, _ = torch.nn.utils.rnn.pad_packed_sequence(out, batch_first=True, total_length=T)
        h_n, c_n = h_n if name == "lstm" else (h_n, torch.zeros(()))
        ((out ** 2).sum() + (h_n * out[:, 0]).sum() + (c_n ** 3).sum()).backward()
        dc0 = c.grad if name == "lstm" else torch.zeros(())
        results.append((out, h_n, c_n, xs.grad, h.grad, dc0, {k: p.grad for k, p in
                                                              layer.named_parameters()}))
    ours, theirs = results
    for a, b, what in zip(ours[:6], theirs[:6], ("out", "h_n", "c_n", "dx", "dh0", "dc0")):
        np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), rtol=1e-10,
                                   atol=1e-13, err_msg=what)
    for k in theirs[6]:
        np.testing.assert_allclose(ours[6][k].numpy(), theirs[6][k].numpy(), rtol=1e-10,
                                   atol=1e-13, err_msg=k)


def test_a_short_sgd_training_is_nprnns():
    """Three steps of torch.optim.SGD (momentum 0.9) on the layer with a readout give the losses
    of three steps of nprnn's own SGD on the same model."""
    rnn = layer_for("antisym", {}, layers=1)
    model = nprnn.make_model("antisym", M, N, 4, dtype="float64", sigma_w=2.0, seed=1, **HYPER)
    readout = torch.nn.Linear(N, 4, dtype=torch.float64)
    with torch.no_grad():
        readout.weight.copy_(torch.from_numpy(model.params["W_out"]))
        readout.bias.copy_(torch.from_numpy(model.params["b_out"]))
    rng = np.random.default_rng(4)
    x, y = rng.standard_normal((B, T, M)), rng.integers(0, 4, B)
    opt = torch.optim.SGD([*rnn.parameters(), *readout.parameters()], lr=0.5, momentum=0.9)
    ours = make_optimizer("sgd", model.params, 0.5)
    for _ in range(3):
        opt.zero_grad()
        out, h_n = rnn(torch.from_numpy(x))
        loss = torch.nn.functional.cross_entropy(readout(h_n[-1]), torch.from_numpy(y))
        loss.backward()
        opt.step()
        theirs, grads = model.loss_and_grad(x, y)
        ours.step(model.params, grads)
        assert loss.item() == pytest.approx(theirs, rel=1e-12)


def test_parameters_and_outputs_share_memory_with_the_kernels(forward_spy):
    """No copies: the arrays the kernels read are the nn.Parameters' memory, and the outputs
    are views of the array the kernels wrote (h_n stacks the layers' last states: B n values
    each)."""
    rnn = layer_for("gru", {}, layers=1)
    seen = forward_spy(rnn.cell)
    out, h_n = rnn(torch.randn(B, T, M, dtype=torch.float64))
    for k, v in rnn.named_parameters():
        assert np.shares_memory(seen["p"][k], v.detach().numpy()), k
    assert np.shares_memory(out.detach().numpy(), seen["hs"])


@pytest.mark.parametrize("make, call, error, match", [
    (dict(dtype=torch.float16), None, TypeError, r"dtype must be one of torch.float32, "
                                                 r"torch.float64, got torch.float16"),
    (dict(device="meta"), None, NotImplementedError, "runs on devices cpu and cuda, got meta"),
    ({}, lambda r: r(torch.zeros(B, T, M)), TypeError, "x is torch.float32; this layer's "
                                                       "parameters are torch.float64"),
    ({}, lambda r: r(torch.zeros(B, T, M, dtype=torch.float64), lengths=[T, 0, 1]), ValueError,
     r"lengths must be \(B,\) = \(3,\) ints in \[1, 4\], got \[4, 0, 1\]"),
    ({}, lambda r: r(torch.zeros(B, T, M, dtype=torch.float64), torch.zeros(1, B, N,
                                                                            dtype=torch.float64)),
     ValueError, r"hx must be torch.float64 of shape \(layers, B, n\) = \(2, 3, 3\)"),
])
def test_what_it_cannot_run_is_refused_saying_so(make, call, error, match):
    with pytest.raises(error, match=match):
        rnn = Recurrent("gru", M, N, num_layers=2, **dict(dict(dtype=torch.float64), **make))
        call(rnn)


def test_cuda_without_a_gpu_is_refused_saying_why():
    from nprnn.core.device import cuda_available
    if cuda_available()[0]:
        pytest.skip("numba can run CUDA kernels here: tests/gpu/test_gpu_torch_layer.py runs it")
    with pytest.raises(RuntimeError, match="device cuda: numba cannot run CUDA kernels here"):
        Recurrent("antisym", M, N, device="cuda")


def test_the_second_states_as_documented():
    """The LSTMs take (h_0, c_0) and coRNN and LEM (y_0, z_0), either None, and return a
    differentiable c_n or z_n (gradcheck above proves their gradients); a tuple hx for a
    one-state cell, one of another length, or a c_0 of the wrong shape, is refused, naming it."""
    f64 = dict(dtype=torch.float64)
    x = torch.randn(B, T, M, **f64)
    lstm = Recurrent("lstm", M, N, **f64)
    out, (h_n, c_n) = lstm(x, (None, torch.ones(1, B, N, **f64)))
    assert c_n.shape == (1, B, N) and c_n.requires_grad
    torch.testing.assert_close(lstm(x, (torch.zeros(1, B, N, **f64), None))[0], lstm(x)[0])
    with pytest.raises(ValueError, match=r"c_0 must be torch.float64 of shape \(layers, B, n\) = "
                                         r"\(1, 3, 3\), got torch.float64 \(3, 3\)"):
        lstm(x, (None, torch.ones(B, N, **f64)))
    for name in ("cornn", "lem"):
        cell = Recurrent(name, M, N, **f64)
        out, (y_n, z_n) = cell(x)
        assert y_n.shape == z_n.shape == (1, B, N) and z_n.requires_grad
        torch.testing.assert_close(y_n[0], out[:, -1])
        torch.testing.assert_close(cell(x, (None, torch.zeros(1, B, N, **f64)))[0], out)
        assert not torch.allclose(cell(x, (None, torch.ones(1, B, N, **f64)))[0], out)
        with pytest.raises(ValueError, match=rf"hx for {name} is \(h_0, z_0\), got a tuple of 3"):
            cell(x, (None,) * 3)
    with pytest.raises(ValueError, match="hx for gru is h_0 alone"):
        Recurrent("gru", M, N, **f64)(x, (torch.zeros(1, B, N, **f64),) * 2)


def test_the_readmes_python_blocks_run():
    """Every ```python block of README.md runs as written (the PyTorch layer's example among
    them), and the layer's example fills every parameter's gradient."""
    import re
    from pathlib import Path
    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert any("nprnn.torch" in b for b in blocks)
    for block in blocks:
        scope = {}
        exec(compile(block, "README.md", "exec"), scope)
        if "rnn" in scope:
            assert all(p.grad is not None for p in scope["rnn"].parameters())

"""The baselines against PyTorch (optional; skipped when torch is not installed).

rnn, lstm and gru use PyTorch's parameter names and layouts, so the same float64 numbers go into
nn.RNN / nn.LSTM / nn.GRU and into our CPU kernels; h_T, dL/dh_0 and every parameter gradient of
L = sum(w o h_T) (w random) must agree to rounding. peephole-lstm with zero peepholes is the LSTM.
"""
import numpy as np
import pytest

import nprnn

torch = pytest.importorskip("torch", reason="PyTorch is an optional comparison, not a dependency")

B, T, M, N = 3, 6, 3, 4
TORCH_MODULES = {"rnn": "RNN", "lstm": "LSTM", "gru": "GRU", "peephole-lstm": "LSTM"}


def torch_run(name, p, x, h0, w):
    """h_T, dL/dh_0 and {our name: gradient} from PyTorch's module, L = sum(w * h_T)."""
    module = getattr(torch.nn, TORCH_MODULES[name])(M, N, batch_first=True, dtype=torch.float64)
    with torch.no_grad():
        for key in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
            getattr(module, key + "_l0").copy_(torch.from_numpy(p[key]))
    h0_t = torch.tensor(h0[None], requires_grad=True)                 # (layers=1, B, n)
    state = (h0_t, torch.zeros(1, B, N, dtype=torch.float64)) if "lstm" in name else h0_t
    _, last = module(torch.from_numpy(x), state)
    h_T = (last[0] if "lstm" in name else last)[0]
    (h_T * torch.from_numpy(w)).sum().backward()
    grads = {key: getattr(module, key + "_l0").grad.numpy() for key in
             ("weight_ih", "weight_hh", "bias_ih", "bias_hh")}
    return h_T.detach().numpy(), h0_t.grad[0].numpy(), grads


@pytest.mark.parametrize("name", ["rnn", "lstm", "gru", "peephole-lstm"])
def test_kernels_match_pytorch(name):
    cell = nprnn.CELLS[name]
    rng = np.random.default_rng(0)
    p = {key: 0.5 * rng.standard_normal(shape) for key, shape in cell.shapes(M, N).items()}
    for key in ("w_ci", "w_cf", "w_co"):
        if key in p:
            p[key][:] = 0.0                      # without peepholes it is nn.LSTM
    x = rng.standard_normal((B, T, M))
    h0 = rng.standard_normal((B, N))
    w = rng.standard_normal((B, N))

    h_T, cache = cell.forward(p, np.ascontiguousarray(x.transpose(1, 0, 2)), h0)
    grads, dh0 = cell.backward(p, cache, w)
    t_h_T, t_dh0, t_grads = torch_run(name, p, x, h0, w)

    np.testing.assert_allclose(h_T, t_h_T, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(dh0, t_dh0, rtol=1e-10, atol=1e-13)
    for key, g in t_grads.items():
        np.testing.assert_allclose(grads[key], g, rtol=1e-10, atol=1e-13, err_msg=key)


@pytest.mark.parametrize("name", ["rnn", "lstm", "gru"])
def test_parameter_shapes_and_count_match_pytorch(name):
    module = getattr(torch.nn, TORCH_MODULES[name])(M, N)
    shapes = nprnn.CELLS[name].shapes(M, N)
    assert {key + "_l0": shape for key, shape in shapes.items()} == \
        {key: tuple(v.shape) for key, v in module.named_parameters()}
    assert nprnn.CELLS[name].num_params(M, N) == sum(v.numel() for v in module.parameters())


@pytest.mark.parametrize("name", ["rnn", "lstm", "gru"])
@pytest.mark.parametrize("readout", ["every", "last"])
def test_a_two_layer_pytorch_model_loads_and_matches(name, readout):
    """A 2-layer nn.RNN/LSTM/GRU's state_dict loads into `layers=2` by name (weight_ih_l0, ...);
    with the same readout, pack_padded_sequence lengths and a cross-entropy at every step
    (ignore_index=-1) or from each row's last state, the loss, the outputs and every gradient
    agree to rounding."""
    module = getattr(torch.nn, TORCH_MODULES[name])(M, N, num_layers=2, batch_first=True,
                                                      dtype=torch.float64)
    readout_t = torch.nn.Linear(N, 5, dtype=torch.float64)
    model = nprnn.make_model(name, M, N, 5, dtype="float64", layers=2, readout=readout)
    state = {k: v.detach().numpy() for k, v in module.state_dict().items()}
    assert set(state) == set(model.params) - {"W_out", "b_out"}
    for k, v in state.items():
        model.params[k][...] = v
    model.params["W_out"][...] = readout_t.weight.detach().numpy()
    model.params["b_out"][...] = readout_t.bias.detach().numpy()

    rng = np.random.default_rng(1)
    x, lengths = rng.standard_normal((B, T, M)), np.array([T, 2, 4])
    y = rng.integers(-1, 5, (B, T)) if readout == "every" else rng.integers(0, 5, B)
    packed = torch.nn.utils.rnn.pack_padded_sequence(torch.from_numpy(x), torch.from_numpy(
        lengths), batch_first=True, enforce_sorted=False)
    out, last = module(packed)
    if readout == "every":
        h, _ = torch.nn.utils.rnn.pad_packed_sequence(out, batch_first=True, total_length=T)
        logits = readout_t(h)
        mask = torch.from_numpy(np.arange(T)[None, :] < lengths[:, None])
        logits = logits * mask[..., None]                        # 0 past a row's length
        target = torch.from_numpy(np.where(mask.numpy(), y, -1))
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 5), target.reshape(-1),
                                                 ignore_index=-1)
    else:
        h_T = (last[0] if name == "lstm" else last)[-1]           # the top layer, at each end
        logits = readout_t(h_T)
        loss = torch.nn.functional.cross_entropy(logits, torch.from_numpy(y))
    loss.backward()

    np.testing.assert_allclose(model.forward(x, lengths=lengths), logits.detach().numpy(),
                               rtol=1e-12, atol=1e-13)
    ours, grads = model.loss_and_grad(x, y, lengths=lengths)
    assert ours == pytest.approx(loss.item(), rel=1e-12)
    theirs = dict(module.named_parameters(), W_out=readout_t.weight, b_out=readout_t.bias)
    for k, p in theirs.items():
        np.testing.assert_allclose(grads[k], p.grad.numpy(), rtol=1e-9, atol=1e-12, err_msg=k)

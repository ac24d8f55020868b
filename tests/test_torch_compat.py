"""The baselines against PyTorch (optional; skipped when torch is not installed).

rnn, lstm and gru use PyTorch's parameter names and layouts, so the same float64 numbers go into
nn.RNN / nn.LSTM / nn.GRU and into our CPU kernels; h_T, dL/dh_0 and every parameter gradient of
L = sum(w o h_T) (w random) must agree to rounding. peephole-lstm with zero peepholes is the LSTM.
coRNN and LEM are held to their official formulas, written below in PyTorch, their weights moved
through the cells' converters of the official state_dicts.
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


# ----------------------------------------------------------------------------------------------
# coRNN and LEM against their official formulas (successors.md 1.1 and 2.1), written here in
# PyTorch under autograd with the official modules' parameter names, the weights moved through
# the cells' converters (from_official / to_official): outputs, dL/dy_0 and every gradient agree
# in float64.
# ----------------------------------------------------------------------------------------------

class OfficialCoRNN(torch.nn.Module):
    """coRNN as its official code computes it: one Linear over cat(u, z, y); damping with
    z_{t-1} (or, with imex, the paper's eq. 3: with z_t)."""

    def __init__(self, m, n, dt, gamma, epsilon, imex=False):
        super().__init__()
        self.i2h = torch.nn.Linear(m + 2 * n, n, dtype=torch.float64)
        self.dt, self.gamma, self.epsilon, self.imex = dt, gamma, epsilon, imex

    def forward(self, x, y, z):
        for t in range(x.shape[1]):
            s = torch.tanh(self.i2h(torch.cat((x[:, t], z, y), 1)))
            if self.imex:
                z = (z + self.dt * (s - self.gamma * y)) / (1 + self.dt * self.epsilon)
            else:
                z = z + self.dt * (s - self.gamma * y - self.epsilon * z)
            y = y + self.dt * z
        return y


class OfficialLEM(torch.nn.Module):
    """LEM as its official code computes it: inp2hid's four chunks, hid2hid's three on y,
    transform_z on the new z."""

    def __init__(self, m, n, dt):
        super().__init__()
        self.inp2hid = torch.nn.Linear(m, 4 * n, dtype=torch.float64)
        self.hid2hid = torch.nn.Linear(n, 3 * n, dtype=torch.float64)
        self.transform_z = torch.nn.Linear(n, n, dtype=torch.float64)
        self.dt = dt

    def forward(self, x, y, z):
        for t in range(x.shape[1]):
            i_dt1, i_dt2, i_z, i_y = self.inp2hid(x[:, t]).chunk(4, 1)
            h_dt1, h_dt2, h_y = self.hid2hid(y).chunk(3, 1)
            dt_bar = self.dt * torch.sigmoid(i_dt1 + h_dt1)
            dt_z = self.dt * torch.sigmoid(i_dt2 + h_dt2)
            z = (1 - dt_z) * z + dt_z * torch.tanh(i_y + h_y)
            y = (1 - dt_bar) * y + dt_bar * torch.tanh(self.transform_z(z) + i_z)
        return y


SUCCESSORS = {"cornn": lambda m, n: OfficialCoRNN(m, n, 0.2, 1.5, 2.0),
              "cornn-imex": lambda m, n: OfficialCoRNN(m, n, 0.2, 1.5, 2.0, imex=True),
              "lem": lambda m, n: OfficialLEM(m, n, 0.3)}
SUCCESSOR_HYPER = {"cornn": dict(dt=0.2, gamma=1.5, epsilon=2.0), "lem": dict(dt=0.3)}


@pytest.mark.parametrize("name", list(SUCCESSORS))
def test_successors_match_their_official_formulas_through_the_converters(name):
    """The official module's state_dict (PyTorch's own initialisation, a model's "cell."
    prefix) loads through from_official; y_T, dL/dy_0 and the gradients of L = sum(w o y_T),
    taken back to our names, agree to 1e-10 over T = 40 steps (where the discriminators of
    successors.md section 5, the other form of coRNN or LEM's old z, move them by far more)."""
    T_long = 40
    torch.manual_seed(0)
    official = SUCCESSORS[name](M, N)
    cell = nprnn.CELLS[name]
    hyper = SUCCESSOR_HYPER[name.split("-")[0]]
    p = cell.from_official({f"cell.{k}": v.detach().numpy()
                            for k, v in official.state_dict().items()})
    rng = np.random.default_rng(1)
    x, y0, w = (rng.standard_normal((B, T_long, M)), rng.standard_normal((B, N)),
                rng.standard_normal((B, N)))

    y0_t = torch.tensor(y0, requires_grad=True)
    y_T_t = official(torch.from_numpy(x), y0_t, torch.zeros(B, N, dtype=torch.float64))
    (y_T_t * torch.from_numpy(w)).sum().backward()
    t_grads = cell.from_official({k: v.grad.numpy() for k, v in official.named_parameters()})

    y_T, cache = cell.forward(p, np.ascontiguousarray(x.transpose(1, 0, 2)), y0, **hyper)
    grads, dy0 = cell.backward(p, cache, w, **hyper)
    np.testing.assert_allclose(y_T, y_T_t.detach().numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(dy0, y0_t.grad.numpy(), rtol=1e-10, atol=1e-12)
    for key, g in t_grads.items():
        np.testing.assert_allclose(grads[key], g, rtol=1e-10, atol=1e-12, err_msg=key)
    # and back: our parameters give the official module's state_dict
    for k, v in cell.to_official(p).items():
        np.testing.assert_array_equal(v, official.state_dict()[k].numpy())


@pytest.mark.parametrize("name", ["cornn", "lem"])
def test_successor_parameter_counts_match_the_official_modules(name):
    module = SUCCESSORS[name](M, N)
    assert nprnn.CELLS[name].num_params(M, N) == sum(v.numel() for v in module.parameters())
    assert {k: tuple(v.shape) for k, v in nprnn.CELLS[name].to_official(
        {k: np.zeros(s) for k, s in nprnn.CELLS[name].shapes(M, N).items()}).items()} == \
        {k: tuple(v.shape) for k, v in module.state_dict().items()}

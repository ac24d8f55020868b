"""Models on device="cuda" against the same models on the CPU: every cell with GPU kernels, both
kernel versions, through the public API (make_model, forward, hidden, loss_and_grad).

The two models are built from one seed and then given the same random values in every
parameter (biases and peepholes start at zero, where swapping two of them changes nothing); the
GPU one keeps them as device arrays. This checks the GPU path's plumbing (matrix construction,
which array goes to which kernel argument, buffer reuse between calls, the readout and loss, dW
from dA, a given h_0 and dh_0) on top of the kernel tests.
"""
import json

import numpy as np
import pytest

import gpu_testing as gt
import nprnn
from nprnn.core import autotune, backends, memory
from nprnn.core.backends import CUDA, Kernels
from nprnn.study.bench import bench_inputs
from nprnn.core.cells import variants

pytestmark = gt.requires_cuda


@pytest.fixture(autouse=True)
def small_blocks(monkeypatch):
    gt.small_launch(monkeypatch)


# every cell, and each other form of its W ("antisym[w_form=full]"): label -> (name, options)
VARIANTS = {label: (name, options) for label, name, options in variants()}


def pair(label, dtype):
    """The same model on the CPU and on cuda, every parameter non-zero (as test_cells.py's
    random_model; the strict upper triangle of an antisymmetric W respected)."""
    name, options = VARIANTS.get(label, (label, {}))     # (a cell a test registers: as it is)
    kw = dict(seed=3, dtype=dtype, **options)
    if "eps" in nprnn.CELLS[name].hyper:
        kw["eps"] = 0.5
    cpu = nprnn.make_model(name, gt.M, gt.N, 4, **kw)
    dev = nprnn.make_model(name, gt.M, gt.N, 4, device="cuda", **kw)
    rng = np.random.default_rng(100)
    for k, v in cpu.params.items():
        mask = cpu.cell.grad_mask(k, gt.N)
        noise = 0.3 * rng.standard_normal(v.shape) * (1 if mask is None else mask)
        v += noise.astype(v.dtype)
        dev.params[k].copy_to_device(v)
    return cpu, dev


def data(seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((gt.B, gt.T, gt.M)), np.array([3, 0, 1])


EULER = ("antisym", "antisym-gated", "ablation", "feedback", "antisym-xgate")


def shared_layouts(cell):
    """The layouts in which `cell`'s persistent passes keep the matrix in shared memory, at the
    tests' sizes (the Euler cells' "skew" or "dense"; not "global", nor the baselines' None)."""
    return [layout for layout in cell.persistent_layouts(gt.N, "float64", True, gt.ROWS)
            if layout not in (None, "global")]


def gpu_versions(cell):
    """The GPU versions its spec gives `cell`: step; persistent, where its twins have persistent
    kernels ("shared" too, where they keep its matrix in shared memory); split, where they have
    split kernels."""
    twins = cell.forward_kernels
    persistent = twins.gpu_persistent is not None
    return (("step",) + (("persistent",) if persistent else ())
            + (("shared",) if persistent and shared_layouts(cell) else ())
            + (("split",) if twins.gpu_split is not None else ()))


# every cell in each version it has (for the Euler cells: step, persistent, the matrix in shared
# memory, and split; for rnn: step, persistent, split; ...)
# (another form of W changes only the initialisation and dW from dA, which run after any version:
# its step version is enough)
VERSIONS = [(label, version) for label, (name, options) in sorted(VARIANTS.items())
            for version in ("step",) if options] + [
    (name, version) for name in sorted(nprnn.CELLS) for version in gpu_versions(nprnn.CELLS[name])]
# h_0 and dh_0 in the shared layouts and the split kernels: tests/gpu/test_gpu_euler.py
H0_VERSIONS = [(name, version) for name, version in VERSIONS if version not in ("shared", "split")]


def kernels(name, version):
    """The gpu_version for `version`: "step", "persistent" (for the Euler cells the matrix in
    global memory), or "shared" (their matrix in shared memory: a Kernels value)."""
    if version != "shared":
        return version
    return Kernels("persistent", shared_layouts(nprnn.CELLS[VARIANTS.get(name, (name, {}))[0]])[0])


@pytest.mark.parametrize("name, version", VERSIONS)
def test_model_on_cuda_matches_cpu(name, version):
    cpu, dev = pair(name, "float64")
    dev.gpu_version = kernels(name, version)
    assert dev.device == "cuda" and all(memory.is_device_array(p) for p in dev.params.values())
    for k, v in dev.host_params().items():
        np.testing.assert_array_equal(v, cpu.params[k], err_msg=f"initial {k}")
    x, y = data()
    loss_c, g_c, logits_c = cpu.loss_and_grad(x, y, return_logits=True)
    # persistent: a second call, which reuses the device buffers of the first; step: forward, hidden
    for call in range(1 if version == "step" else 2):
        loss_d, g_d, logits_d = dev.loss_and_grad(x, y, return_logits=True)
        assert abs(loss_d - loss_c) <= 1e-12 * max(1.0, abs(loss_c))
        gt.assert_close(logits_d, logits_c, "float64", "logits")
        assert set(g_d) == set(g_c)
        for k in g_c:
            gt.assert_close(g_d[k], g_c[k], "float64", f"grad {k} (call {call})")
    if version == "step":
        gt.assert_close(dev.forward(x), cpu.forward(x), "float64", "forward")
        gt.assert_close(dev.hidden(x), cpu.hidden(x), "float64", "hidden")


@pytest.mark.parametrize("name, version", H0_VERSIONS)
def test_a_given_h0_and_its_gradient_dh0_match_the_cpu(name, version):
    """The cells' forward(p, x, h0) and backward(p, cache, dh_T) -> (grads, dh_0), on each
    device, from a random h_0 and dh_T (the models start from h_0 = 0 and pass no dh_T)."""
    cpu, dev = pair(name, "float64")
    rng = np.random.default_rng(7)
    xt = rng.standard_normal((gt.T, gt.B, gt.M))                     # time-major
    h0, dh_T = rng.standard_normal((2, gt.B, gt.N))
    h_T, cache = cpu.cell.forward(cpu.cell_params(), xt, h0, **cpu.hyper)
    g, dh0 = cpu.cell.backward(cpu.cell_params(), cache, dh_T, **cpu.hyper)
    cell, ws = dev.cell, memory.DeviceWorkspace()
    be = CUDA.for_cell(cell, gt.N, "float64", kernels(name, version), gt.SMALL_LAUNCH)
    h_T_d, cache_d = cell.forward(dev.cell_params(), memory.to_device(xt), h0, ws, backend=be,
                                  **dev.hyper)
    g_d, dh0_d = cell.backward(dev.cell_params(), cache_d, dh_T, ws, backend=be, **dev.hyper)
    gt.assert_close(h_T_d, h_T, "float64", "h_T")
    gt.assert_close(dh0_d, dh0, "float64", "dh_0")
    assert set(g_d) == set(g)
    for k in g:
        gt.assert_close(g_d[k], g[k], "float64", f"grad {k}")


@pytest.mark.parametrize("name", EULER)
def test_a_matrix_too_big_for_shared_memory_is_read_from_global_memory(name, monkeypatch):
    """Shared memory shrunk so that a block holds its rows' state but not the matrix: 'auto'
    still runs the persistent passes, with the matrix in global memory, and they match the CPU."""
    from nprnn.kernels.fast import antisym as K_euler
    monkeypatch.setattr(K_euler, "SHARED_BYTES_MAX", 300)   # state <= 288 B; matrix >= 120 B
    cell = nprnn.CELLS[name]
    for backward in (False, True):
        assert [k for k in backends.options(cell, gt.N, "float64", backward, gt.SMALL_LAUNCH)
                if k.version != "split"] == [Kernels("persistent", "global"), Kernels("step")]
    launched = gt.record_launches(monkeypatch, cell)
    cpu, dev = pair(name, "float64")
    x, y = data()
    loss_c, g_c = cpu.loss_and_grad(x, y)
    loss_d, g_d = dev.loss_and_grad(x, y)
    assert launched == [("forward", "persistent", "global"), ("backward", "persistent", "global")]
    assert abs(loss_d - loss_c) <= 1e-12 * max(1.0, abs(loss_c))
    for k in g_c:
        gt.assert_close(g_d[k], g_c[k], "float64", f"grad {k}")


@pytest.mark.parametrize("name", ["antisym", "antisym-gated", "cornn", "lem"])
def test_float32_model_on_cuda_matches_cpu(name):
    cpu, dev = pair(name, "float32")
    x, y = data(1)
    loss_c, g_c = cpu.loss_and_grad(x, y)
    loss_d, g_d = dev.loss_and_grad(x, y)
    assert abs(loss_d - loss_c) <= 1e-5 * max(1.0, abs(loss_c))
    for k in g_c:
        gt.assert_close(g_d[k], g_c[k], "float32", f"grad {k}")


@pytest.mark.parametrize("name", ["antisym", "peephole-lstm"])
def test_training_steps_reuse_their_gradient_buffers(name):
    """step_arrays (the training loop's call) writes its gradients into the same device arrays
    every step, so that a step allocates none; loss_and_grad's gradients are the caller's own
    and survive later steps."""
    cpu, dev = pair(name, "float64")
    (x1, y1), (x2, y2) = data(0), data(1)
    _, kept = dev.loss_and_grad(x1, y1)
    first = dev.step_arrays(x1, y1)[1]
    second = dev.step_arrays(x2, y2)[1]
    _, want1 = cpu.loss_and_grad(x1, y1)
    _, want2 = cpu.loss_and_grad(x2, y2)
    for k in want1:
        assert second[k] is first[k], f"grad {k}: a new device array every step"
        assert kept[k] is not second[k], f"grad {k}: loss_and_grad handed out a step buffer"
        gt.assert_close(second[k], want2[k], "float64", f"grad {k} of the second step")
        gt.assert_close(kept[k], want1[k], "float64", f"grad {k} kept from loss_and_grad")


@pytest.mark.parametrize("version", ["step", "persistent"])
@pytest.mark.parametrize("name", ["antisym-gated", "gru"])
def test_training_and_evaluation_batch_sizes_alternate_without_allocating(name, version):
    """Training at one B and evaluating at a larger one with a short last batch allocate nothing
    on the GPU once each size has been seen (each allocation and its batched free make the host
    wait for the GPU), and what runs in the smaller views matches the CPU."""
    cpu, dev = pair(name, "float64")
    dev.gpu_version = version
    x, y = data(0)
    x_eval = np.random.default_rng(2).standard_normal((2 * gt.B + 1, gt.T, gt.M))

    def train_then_evaluate():
        dev.step_arrays(x, y)
        dev.forward(x_eval)
        dev.forward(x_eval[:2])
    train_then_evaluate()
    workspaces = (dev._workspace, dev._step_grads)
    allocated = [ws.allocations for ws in workspaces]
    train_then_evaluate()
    assert [ws.allocations for ws in workspaces] == allocated
    loss_d, g_d = dev.loss_and_grad(x, y)
    loss_c, g_c = cpu.loss_and_grad(x, y)
    assert abs(loss_d - loss_c) <= 1e-12 * max(1.0, abs(loss_c))
    for k in g_c:
        gt.assert_close(g_d[k], g_c[k], "float64", f"grad {k}")
    gt.assert_close(dev.forward(x_eval[:2]), cpu.forward(x_eval[:2]), "float64", "forward")


def test_unknown_kernel_version_is_refused():
    _, dev = pair("antisym", "float64")
    dev.gpu_version = "fastest"
    with pytest.raises(ValueError, match="version must be one of"):
        dev.loss_and_grad(*data())


def cuda_model(name, n=4, K=3, tuner=None):
    """A model on cuda whose "auto" is untimed (or chosen by `tuner`)."""
    model = nprnn.make_model(name, 1, n, K, device="cuda")
    model.tuner = tuner or autotune.Tuner()
    return model


SPLIT_ROWS = ["split, 2 lanes per unit, matrix in registers"]     # at n = 4: 2 values per lane


def test_time_model_reports_every_option(monkeypatch):
    """antisym's persistent passes can read the matrix from global memory or keep its triangle
    in shared memory at this size, and its split passes run with 2 lanes per unit: a row each,
    beside step; the row 'auto' runs says so. rnn has no matrix layouts to choose."""
    from nprnn.kernels.fast import antisym as K_euler
    launched = gt.record_launches(monkeypatch, nprnn.CELLS["antisym"])
    rows = autotune.time_model(cuda_model("antisym"), *bench_inputs(2, 2, 1, "float32", K=3),
                               repeats=1, warmup=0)
    assert [r["version"] for r in rows] == [
        "step", "persistent, matrix in global memory",
        "persistent, matrix in shared memory (skew)"] + SPLIT_ROWS
    # each row: the forward pass timed, then forward and backward
    layouts = [layout for _, version, layout in launched if version == "persistent"]
    assert layouts == ["global"] * 3 + ["skew"] * 3, layouts
    lanes = [lanes for _, version, lanes in launched if version == "split"]
    assert lanes == [2] * 3, lanes
    assert rows[1]["note"].startswith("auto runs this, untimed")
    assert "auto" not in rows[0]["note"] and "auto" not in rows[2]["note"]
    rnn_rows = autotune.time_model(cuda_model("rnn"), *bench_inputs(2, 2, 1, "float32", K=3),
                                   repeats=1, warmup=0)
    assert [r["version"] for r in rnn_rows] == ["step", "persistent"] + SPLIT_ROWS
    # a matrix that shared memory cannot hold is read from global memory only: no shared row
    monkeypatch.setattr(K_euler, "SHARED_BYTES_MAX", 100)    # ablation's 4 x 4 needs 64 + 96 B
    global_rows = autotune.time_model(cuda_model("ablation"),
                                      *bench_inputs(2, 2, 1, "float32", K=3), repeats=1, warmup=0)
    assert [r["version"] for r in global_rows] == [
        "step", "persistent, matrix in global memory"] + SPLIT_ROWS
    for r in rows + rnn_rows + global_rows:
        assert set(r) >= {"forward_ms", "forward_backward_ms", "note", "B", "n", "T", "dtype"}
        if gt.CUDA_WHY.startswith("Numba CUDA simulator"):
            assert np.isnan(r["forward_ms"]) and "simulator" in r["note"]
        else:        # the times themselves are not tested: they are the GPU's to give
            assert r["forward_ms"] > 0 and r["forward_backward_ms"] > 0


def test_time_model_times_the_persistent_pass_that_fits(monkeypatch):
    """A persistent forward that fits is timed even when its BPTT does not; the note says so,
    and which option 'auto' runs in each pass."""
    fits = {False: [None], True: []}                   # the layouts that fit each pass
    monkeypatch.setattr(nprnn.CELLS["rnn"], "persistent_layouts",
                        lambda n, dtype, backward, rows=1: fits[backward])
    monkeypatch.setattr(nprnn.CELLS["rnn"], "split_lanes", lambda n, dtype: [])
    ran = []
    monkeypatch.setattr(autotune, "elapsed_ms", lambda fn, repeats, warmup: fn() or 1.0)
    monkeypatch.setattr(nprnn.Model, "logits_on", lambda *a: ran.append("forward"))
    monkeypatch.setattr(nprnn.Model, "step_on", lambda *a: ran.append("forward+backward"))
    x, y = bench_inputs(2, 2, 1, "float32", K=3)
    step, persistent = autotune.time_model(cuda_model("rnn"), x, y, repeats=1, warmup=0)
    assert persistent["note"].startswith("persistent BPTT does not fit in shared memory at n=4")
    assert "auto runs this (forward), untimed" in persistent["note"]
    assert step["note"].startswith("auto runs this (BPTT), untimed")
    assert ran == ["forward", "forward+backward", "forward"]   # step's two, then persistent's
    ran.clear()
    fits[False] = []                                          # nothing persistent fits: no row
    rows = autotune.time_model(cuda_model("rnn"), x, y, repeats=1, warmup=0)
    assert [r["version"] for r in rows] == ["step"] and ran == ["forward", "forward+backward"]


def test_time_model_times_the_change_to_time_major_layout(monkeypatch):
    """A training step gets its batch batch-first and makes it time-major on the GPU: each timed
    call does that too, as PyTorch's timed call does its own layout change."""
    calls, inside = [], []
    real = autotune.time_major
    monkeypatch.setattr(autotune, "time_major",
                        lambda *a, **kw: calls.append(1) or real(*a, **kw))

    def elapsed(fn, repeats, warmup):
        before = len(calls)
        fn()
        inside.append(len(calls) - before)
        return 1.0
    monkeypatch.setattr(autotune, "elapsed_ms", elapsed)
    autotune.time_model(cuda_model("rnn"), *bench_inputs(2, 2, 1, "float32", K=3),
                        versions=("step",), repeats=1, warmup=0)
    assert inside == [1, 1]                                 # forward, forward + backward


def test_finite_differences_perturb_a_cuda_parameter_in_place():
    """gradcheck's numerical_gradient takes a device parameter as it takes a host one (one
    tensor of a tiny model: the simulator runs every thread in Python)."""
    from nprnn.core.gradcheck import numerical_gradient, relative_error
    model = nprnn.make_model("antisym", 1, 2, 2, eps=0.5, dtype="float64", device="cuda")
    x, y = np.random.default_rng(0).standard_normal((1, 1, 1)), np.array([1])
    _, grads = model.loss_and_grad(x, y)
    numeric = numerical_gradient(lambda: model.loss_and_grad(x, y)[0], model.params["b_h"])
    assert relative_error(grads["b_h"].copy_to_host(), numeric) < 1e-6


def test_every_cell_has_gpu_kernels():
    """Every cell has its CPU twin and GPU version 1; persistent kernels where its spec offers
    persistent layouts (coRNN and LEM have version 1 only, as issue 53 allows)."""
    for cell in nprnn.CELLS.values():
        for backward, twins in ((False, cell.forward_kernels), (True, cell.backward_kernels)):
            assert twins.cpu and twins.gpu, cell.name
            if cell.persistent_layouts(128, "float32", backward):
                assert twins.gpu_persistent, cell.name


def test_training_steps_stay_on_the_gpu_and_follow_the_cpu():
    """Three SGD-with-momentum steps: parameters, velocities and gradients never leave the GPU
    (the updates are kernels/optim.py's GPU twins), and land where the CPU's steps land."""
    from nprnn.kernels import optim as K_optim
    cpu, dev = pair("antisym-gated", "float64")
    v_cpu = {k: np.zeros_like(p) for k, p in cpu.params.items()}
    v_dev = {k: memory.to_device(np.zeros_like(p)) for k, p in cpu.params.items()}
    one = memory.to_device(np.ones(1))                          # the clipping factor
    rng = np.random.default_rng(7)
    for _ in range(3):
        x, y = rng.standard_normal((gt.B, gt.T, gt.M)), rng.integers(0, 4, gt.B)
        _, g_cpu = cpu.loss_and_grad(x, y)
        _, g_dev = dev.loss_and_grad(x, y)
        for k in cpu.params:
            K_optim.sgd_momentum_cpu(cpu.params[k].reshape(-1), v_cpu[k].reshape(-1),
                                     g_cpu[k].reshape(-1), 0.5, 0.9, np.ones(1))
            p = dev.params[k]
            K_optim.sgd_momentum_gpu(p.reshape(p.size), v_dev[k].reshape(p.size),
                                     g_dev[k].reshape(p.size), 0.5, 0.9, one, threads=8)
            assert memory.is_device_array(p) and memory.is_device_array(g_dev[k])
    for k, p in dev.host_params().items():
        gt.assert_close(p, cpu.params[k], "float64", f"{k} after 3 steps")


@pytest.mark.parametrize("opt", ["sgd", "adagrad"])
def test_optimizer_classes_train_device_parameters_like_the_cpu(opt):
    """nprnn.core.optim on a cuda model: state made on the device, the clipped global norm taken there,
    updates by the GPU twins, and a state round trip through state_dict; all as on the CPU."""
    from nprnn.core.optim import clip_scale, global_norm, make_optimizer
    cpu, dev = pair("antisym-gated", "float64")
    x, y = data()
    opt_cpu = make_optimizer(opt, cpu.params, lr=0.1)
    opt_dev = make_optimizer(opt, dev.params, lr=0.1)
    for _ in range(2):
        for model, o in ((cpu, opt_cpu), (dev, opt_dev)):
            _, grads = model.loss_and_grad(x, y)
            o.step(model.params, grads, scale=clip_scale(global_norm(grads), 0.5))
    host = dev.host_params()
    for k in cpu.params:
        np.testing.assert_allclose(host[k], cpu.params[k], rtol=1e-12, atol=1e-12, err_msg=k)
    assert np.all(np.tril(host["W"]) == 0)
    state = {k: v for k, v in opt_dev.state_dict().items() if k != "slots"}
    state["slots"] = {s: {k: a.copy_to_host() for k, a in slot.items()}      # as a checkpoint
                      for s, slot in opt_dev.slots.items()}
    fresh = make_optimizer(opt, dev.params, lr=0.1)
    fresh.load_state_dict(state)
    for s, slot in fresh.slots.items():
        for k, a in slot.items():
            np.testing.assert_allclose(a.copy_to_host(), opt_cpu.slots[s][k], rtol=1e-12,
                                       atol=1e-12, err_msg=f"{s}/{k}")


def test_a_cuda_run_resumes_bit_for_bit_and_evaluates(tmp_path):
    """train on device="cuda", stop, resume, evaluate: the checkpoint's parameters and optimizer
    state go back into device arrays (by copy_to_device: a GPU's arrays take no [...] writes).
    With a full W, and an lr that decays after iteration 2, where the run is stopped."""
    from nprnn.data.datasets import ArrayTask
    from nprnn.runs.train import evaluate_checkpoint, train
    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, gt.T, gt.M)).astype(np.float32)
    task = ArrayTask("toy", x, np.arange(8) % 3, x[:4], np.arange(4) % 3, num_classes=3)
    config = dict(model="antisym", hidden=gt.N, eps=0.5, lr=0.1, batch_size=4, dtype="float64",
                  device="cuda", eval_every=100, log_every=1, checkpoint_every=100,
                  w_form="full", lr_decay_at=[2])
    quiet = dict(task=task, echo=lambda *a: None, progress=False)
    whole = train(dict(config, iterations=3), out=tmp_path / "whole", **quiet)
    train(dict(config, iterations=2), out=tmp_path / "split", **quiet)
    split = train(out=tmp_path / "split", resume=True, given=dict(iterations=3), **quiet)
    same = ("loss", "accuracy", "count", "iteration")
    assert [whole["final"][k] for k in same] == [split["final"][k] for k in same]
    on_gpu = evaluate_checkpoint(tmp_path / "split", task=task, device="cuda")
    assert (on_gpu["loss"], on_gpu["accuracy"]) == (whole["final"]["loss"],
                                                    whole["final"]["accuracy"])
    on_cpu = evaluate_checkpoint(tmp_path / "split", task=task, device="cpu")
    assert on_cpu["accuracy"] == on_gpu["accuracy"]
    np.testing.assert_allclose(on_cpu["loss"], on_gpu["loss"], rtol=1e-10)
    # the same three steps on the CPU: the schedule and dW of a full W reach the GPU's optimizer
    train(dict(config, iterations=3, device="cpu"), out=tmp_path / "cpu", **quiet)
    lrs = [json.loads(line)["lr"] for line in open(tmp_path / "whole" / "metrics.jsonl")
           if json.loads(line)["split"] == "train"]
    assert lrs == pytest.approx([0.1, 0.1, 0.01])
    from nprnn.runs.checkpoint import load_checkpoint
    W_gpu, W_cpu = (load_checkpoint(tmp_path / r)["params"]["W"] for r in ("whole", "cpu"))
    assert np.count_nonzero(np.tril(W_gpu, k=-1)) > 0
    np.testing.assert_allclose(W_gpu, W_cpu, rtol=1e-10, atol=1e-12)


def test_auto_never_picks_the_simulator():
    from nprnn.core.device import resolve_device, simulator_enabled
    assert resolve_device("auto") == ("cpu" if simulator_enabled() else "cuda")


def test_a_diverging_cuda_run_is_stopped_at_its_first_bad_step(tmp_path):
    """On cuda the loop reads the step totals only when it reports or saves; a non-finite step
    between two readings is still named, and neither it nor any later step is applied."""
    from nprnn.runs.checkpoint import load_checkpoint
    from nprnn.data.datasets import ArrayTask
    from nprnn.runs.train import TrainingDiverged, train
    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, gt.T, gt.M)).astype(np.float32)
    x_train = x.copy()
    x_train[5, 1, 0] = np.nan         # device batches are not scanned: step 1 or 2 goes bad
    task = ArrayTask("toy", x_train, np.arange(8) % 3, x[:4], np.arange(4) % 3, num_classes=3)
    config = dict(model="antisym", hidden=gt.N, batch_size=4, device="cuda", iterations=4,
                  eval_every=100, log_every=100, checkpoint_every=100)
    with pytest.raises(TrainingDiverged) as e:
        train(config, out=tmp_path, task=task, echo=lambda *a: None, progress=False)
    bad = int(str(e.value).split("finite at iteration ")[1].split()[0])
    order = task.order("train", seed=0, epoch=0)
    assert bad == 1 + list(order).index(5) // 4
    assert "last good checkpoint (iteration 0)" in str(e.value)
    ckpt = load_checkpoint(tmp_path)
    assert ckpt["progress"]["iteration"] == 0
    assert all(np.isfinite(v).all() for v in ckpt["params"].values())


def test_training_and_evaluation_on_cuda_take_batches_in_reused_buffers(tmp_path, monkeypatch):
    """The loop's batches go through one nprnn.core.memory.Staging (no wait for the GPU per batch),
    kept for the whole run: every epoch and evaluation fills the same buffers."""
    from nprnn.data.datasets import ArrayTask
    from nprnn.runs.train import train
    asked = []
    batches = ArrayTask.batches

    def recording(self, *args, **kwargs):
        asked.append((args[0], kwargs.get("device"), kwargs.get("reuse")))
        return batches(self, *args, **kwargs)

    monkeypatch.setattr(ArrayTask, "batches", recording)
    x = np.random.default_rng(0).standard_normal((8, gt.T, gt.M)).astype(np.float32)
    task = ArrayTask("toy", x, np.arange(8) % 3, x[:4], np.arange(4) % 3, num_classes=3)
    config = dict(model="antisym", hidden=gt.N, batch_size=4, device="cuda", iterations=5,
                  eval_every=2)                         # two batches an epoch: three epochs
    train(config, out=tmp_path, task=task, echo=lambda *a: None, progress=False)
    assert [(split, device) for split, device, _ in asked] == [
        ("train", "cuda"), ("test", "cuda"), ("train", "cuda"), ("test", "cuda"),
        ("train", "cuda"), ("test", "cuda")]
    staging = asked[0][2]
    assert isinstance(staging, memory.Staging) and all(r is staging for _, _, r in asked)


@pytest.mark.parametrize("name", ["antisym", "lstm"])
def test_h0_and_dh_T_must_hold_one_state_per_batch_row_on_the_gpu_too(name):
    """As on the CPU (tests/test_cells.py): an (n,) vector is refused, not broadcast."""
    model = nprnn.make_model(name, 3, 5, 4, dtype="float64", device="cuda")
    xt = memory.to_device(np.zeros((2, 3, 3)))                         # (T, B, m)
    cell, ws = nprnn.CELLS[name], memory.DeviceWorkspace()
    be = CUDA.for_cell(cell, 5, "float64", "step")
    with pytest.raises(ValueError, match=r"h0 must have shape \(B, n\) = \(3, 5\), got \(5,\)"):
        cell.forward(model.cell_params(), xt, np.ones(5), ws, backend=be, **model.hyper)
    _, cache = cell.forward(model.cell_params(), xt, None, ws, backend=be, **model.hyper)
    with pytest.raises(ValueError, match=r"dh_T must have shape \(B, n\) = \(3, 5\), got \(2, 5\)"):
        cell.backward(model.cell_params(), cache, np.ones((2, 5)), ws, backend=be, **model.hyper)


SEQUENCE_CELLS = ["antisym-gated", "rnn", "peephole-lstm", "gru", "cornn-imex", "lem"]


@pytest.mark.parametrize("name", SEQUENCE_CELLS)
def test_lengths_every_step_and_layers_on_cuda_match_the_cpu(name):
    """Two layers, a readout at every step and rows of lengths T, 1 and between: the same loss,
    outputs and gradients as on the CPU. Asked for the persistent kernels, the model runs the
    step ones for the passes they cannot run, and warns once, naming why."""
    kw = dict(seed=3, dtype="float64", layers=2, readout="every")
    if "eps" in nprnn.CELLS[name].hyper:
        kw["eps"] = 0.5
    cpu = nprnn.make_model(name, gt.M, gt.N, 4, **kw)
    dev = nprnn.make_model(name, gt.M, gt.N, 4, device="cuda", **kw)
    dev.gpu_version = "persistent"
    rng = np.random.default_rng(5)
    x = rng.standard_normal((gt.B, gt.T, gt.M))
    y = rng.integers(-1, 4, (gt.B, gt.T))
    lengths = np.array([gt.T, 1, 2])[:gt.B]
    with pytest.warns(UserWarning, match="lengths, a readout at every step, 2 layers: BPTT "
                                         "runs the step kernels"):
        loss_d, g_d, out_d = dev.loss_and_grad(x, y, lengths=lengths, return_logits=True)
    loss_c, g_c, out_c = cpu.loss_and_grad(x, y, lengths=lengths, return_logits=True)
    assert abs(loss_d - loss_c) <= 1e-12 * max(1.0, abs(loss_c))
    gt.assert_close(out_d, out_c, "float64", "outputs")
    for k in g_c:
        gt.assert_close(g_d[k], g_c[k], "float64", f"grad {k}")
    gt.assert_close(dev.forward(x, lengths=lengths), cpu.forward(x, lengths=lengths),
                    "float64", "forward")

"""`cli.py bench`: the table it prints and its errors (timings themselves are never asserted)."""
import os
import sys
import warnings

import numpy as np
import pytest
from click.testing import CliRunner

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import cli  # noqa: E402
import nprnn  # noqa: E402
from nprnn.study import bench  # noqa: E402
from nprnn.core.device import cuda_available  # noqa: E402


def test_flop_counts_follow_the_products():
    """antisym at B=2, T=3, m=1, n=4: forward 2*T*B*n*(n + m); backward two n x n products and
    the input one per step."""
    fwd, total = bench.flops("antisym", 2, 3, 1, 4)
    assert fwd == 2 * 3 * 2 * 4 * (4 + 1)
    assert total - fwd == 2 * 3 * 2 * 4 * (2 * 4 + 1)
    assert bench.flops("lstm", 2, 3, 1, 4)[0] == 4 * bench.flops("rnn", 2, 3, 1, 4)[0]


def test_flop_counts_add_up_over_the_layers():
    """Layer 0 reads m inputs, each layer above it n."""
    one = bench.flops("lstm", 2, 3, 1, 4)
    above = bench.flops("lstm", 2, 3, 4, 4)
    assert bench.flops("lstm", 2, 3, 1, 4, layers=3) == tuple(a + 2 * b for a, b in
                                                              zip(one, above))


def test_bench_times_stacked_layers_read_at_every_step():
    result = CliRunner().invoke(cli.cli, ["bench", "--model", "antisym,lstm", "--batch", "3",
                                          "--T", "4", "--hidden", "5", "--repeat", "1",
                                          "--layers", "2", "--readout", "every", "--no-torch"])
    assert result.exit_code == 0, result.output
    assert "layers=2 readout=every" in result.output.splitlines()[0]
    assert [line.split()[0] for line in result.output.splitlines()[2:]] == ["antisym", "lstm"]


@pytest.mark.skipif(not bench.torch_available(), reason="PyTorch is not installed (optional)")
@pytest.mark.parametrize("name", ["antisym-gated", "gru"])
def test_torch_yardstick_stacks_layers_and_reads_every_step(name):
    x, y = bench.bench_inputs(2, 3, 1, "float32", readout="every")
    assert y.shape == (2, 3)
    r = bench.bench_torch(name, x, y, 4, repeat=1, layers=2)
    assert r["forward"] > 0 and np.isfinite(r["fwd_bwd"])


def test_bench_prints_a_row_per_model():
    result = CliRunner().invoke(cli.cli, ["bench", "--model", "antisym,gru", "--batch", "3",
                                          "--T", "4", "--hidden", "5", "--repeat", "2",
                                          "--no-torch"])
    assert result.exit_code == 0, result.output
    lines = result.output.strip().splitlines()
    assert lines[0].startswith("B=3 T=4 m=1 n=5 layers=1 readout=last float32, median of 2")
    threads = nprnn.study.bench.threads(nprnn.study.bench.numba.get_num_threads())   # "1 thread", ...
    rows = [line for line in lines if f"nprnn (numba, {threads})" in line]
    assert [r.split()[0] for r in rows] == ["antisym", "gru"]
    assert all(float(r.split()[-3]) > 0 for r in rows)          # GFLOP/s


def test_table_columns_line_up_and_notes_follow_their_rows():
    rows = [dict(model="antisym", impl="nprnn (numba, CPU)", forward=0.0262, fwd_bwd=0.078,
                 gflops=127.2, ratio=0.45),
            dict(model="antisym", impl="PyTorch 2.13.0+cpu (2 threads and then some)",
                 forward=0.0574, fwd_bwd=0.173, gflops=57.3, ratio=1.0),
            dict(model="peephole-lstm", impl="nprnn (numba, CPU)", forward=0.1424,
                 fwd_bwd=0.3273, gflops=121.2, note="(PyTorch has no such cell)")]
    header, *lines = bench.format_table(rows).splitlines()
    end = header.index("forward ms") + len("forward ms")
    for line, value in zip(lines, ("26.2", "57.4", "142.4")):
        assert line[end - len(value):end] == value, (header, line)
    assert lines[2].endswith("-  (PyTorch has no such cell)")


def test_a_row_shows_what_was_measured_and_dashes_the_rest():
    """A persistent version whose forward fits but whose BPTT does not: its forward time, then
    dashes."""
    row = dict(model="lstm", impl="nprnn cuda, persistent", forward=0.0123, fwd_bwd=float("nan"),
               gflops=float("nan"), ratio=float("nan"), note="persistent BPTT does not fit")
    line = bench.format_table([row]).splitlines()[1]
    assert line.split()[4:9] == ["12.3", "-", "-", "-", "persistent"]


def test_gpu_table_rows_ratios_and_yardsticks(monkeypatch):
    """run_gpu's assembly of the GPU table, with the timings faked (CI has no GPU): a row per
    kernel version, ratios against the same model's PyTorch row, a note where PyTorch has no such
    cell, and cuDNN nn.RNN / nn.LSTM added as yardsticks when not asked for."""
    pytest.importorskip("numba_cuda", reason="the GPU path needs numba-cuda (the cuda extra)")
    from nprnn.core import autotune

    def time_model(model, x, y, **kw):
        assert model == ("model", x.shape[2], 4, "cuda")
        return [dict(version=v, forward_ms=1.0, forward_backward_ms=3.0, note="") for v in
                ("step", "persistent")]

    def bench_torch(name, *args, **kw):
        return (None if name == "peephole-lstm" else
                dict(forward=2e-3, fwd_bwd=6e-3, version="9.9", threads=1))
    monkeypatch.setattr(autotune, "time_model", time_model)
    monkeypatch.setattr(bench, "make_model", lambda name, m, n, K, device, **kw: (
        "model", m, n, device))
    monkeypatch.setattr(bench, "bench_torch", bench_torch)
    rows = bench.run_gpu(["antisym", "peephole-lstm"], 2, 3, 1, 4, repeat=1)
    assert [(r["model"], r["impl"]) for r in rows] == [
        ("antisym", "nprnn cuda, step"), ("antisym", "nprnn cuda, persistent"),
        ("antisym", "PyTorch 9.9 eager"),
        ("peephole-lstm", "nprnn cuda, step"), ("peephole-lstm", "nprnn cuda, persistent"),
        ("rnn", "PyTorch 9.9 cuDNN"), ("lstm", "PyTorch 9.9 cuDNN")]
    assert rows[0]["ratio"] == pytest.approx(0.5) and rows[2]["ratio"] == 1.0
    assert "ratio" not in rows[3] and rows[3]["note"] == "(PyTorch has no such cell)"
    table = bench.format_table(rows).splitlines()
    assert table[1].split()[-1] == "0.50x" and table[4].endswith("(PyTorch has no such cell)")


def test_bench_on_auto_times_the_cpu_without_a_gpu(monkeypatch):
    import nprnn.core.device
    monkeypatch.setattr(nprnn.core.device, "cuda_available", lambda: (False, "no driver (a test)"))
    result = CliRunner().invoke(cli.cli, ["bench", "--device", "auto", "--model", "rnn",
                                          "--batch", "2", "--T", "3", "--hidden", "4",
                                          "--repeat", "1", "--no-torch"])
    assert result.exit_code == 0, result.output
    assert "nprnn (numba, " in result.output


def test_every_contender_gets_the_same_batch(monkeypatch):
    """nprnn and PyTorch are timed on one x (B, T, m), uniform on [0, 1), and one y: before,
    each side drew its own."""
    seen = []

    def record(side):
        def bench_side(name, x, y, n, repeat, seed=0, **kw):
            seen.append((side, name, x, y))
            return dict(forward=1.0, fwd_bwd=2.0, threads=1, version="9.9")
        return bench_side
    monkeypatch.setattr(bench, "bench_nprnn", record("nprnn"))
    monkeypatch.setattr(bench, "bench_torch", record("torch"))
    rows = bench.run(["antisym", "gru"], 3, 4, 2, 5, dtype="float64", repeat=1)
    assert [(side, name) for side, name, _, _ in seen] == [
        ("nprnn", "antisym"), ("torch", "antisym"), ("nprnn", "gru"), ("torch", "gru")]
    x, y = seen[0][2], seen[0][3]
    assert x.shape == (3, 4, 2) and x.dtype == np.float64 and 0 <= x.min() and x.max() < 1
    assert all(a is x and b is y for _, _, a, b in seen)
    assert rows[0]["ratio"] == 1.0 and rows[0]["impl"].startswith("nprnn (numba, ")


def test_bench_names_an_unknown_model():
    result = CliRunner().invoke(cli.cli, ["bench", "--model", "antisym,lstmm", "--no-torch"])
    assert result.exit_code != 0
    assert "unknown model(s) lstmm" in result.output and "peephole-lstm" in result.output


def test_bench_times_a_model_named_twice_once_and_all_stands_alone(monkeypatch):
    args = ["--batch", "2", "--T", "3", "--hidden", "4", "--repeat", "1", "--no-torch"]
    result = CliRunner().invoke(cli.cli, ["bench", "--model", "rnn,rnn", *args])
    assert result.exit_code == 0, result.output
    assert sum(line.startswith("rnn ") for line in result.output.splitlines()) == 1
    result = CliRunner().invoke(cli.cli, ["bench", "--model", "all,rnn", *args])
    assert result.exit_code == 2 and "'all' stands alone, got 'all,rnn'" in result.output
    timed = []
    monkeypatch.setattr(bench, "run", lambda names, *a, **kw: timed.append(names) or [])
    result = CliRunner().invoke(cli.cli, ["bench", "--model", "all,all", *args])
    assert result.exit_code == 0 and timed == [list(nprnn.CELLS)]      # all, once: as all


@pytest.mark.parametrize("size", [["--hidden", "10000000000"], ["--T", "9" * 25]])
def test_bench_says_a_size_does_not_fit_in_memory(size):
    """numpy refuses these shapes with a ValueError ("array is too big", "Maximum allowed
    dimension exceeded"): the memory message, not a traceback."""
    result = CliRunner().invoke(cli.cli, ["bench", "--model", "rnn", "--no-torch", *size])
    assert result.exit_code == 1, result.output
    assert "\nError: not enough memory for this size (" in result.output
    assert "lower --batch, --T, --input-size, --hidden or --layers" in result.output


def test_a_torch_out_of_memory_error_is_the_memory_message(monkeypatch):
    """PyTorch's allocators raise RuntimeError (torch.OutOfMemoryError on the GPU)."""
    def bench_torch(*args, **kw):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:127] DefaultCPUAllocator: can't "
                           "allocate memory: you tried to allocate 123 bytes")
    monkeypatch.setattr(bench, "torch_available", lambda device=None: True)
    monkeypatch.setattr(bench, "bench_torch", bench_torch)
    result = CliRunner().invoke(cli.cli, ["bench", "--model", "rnn", "--batch", "2", "--T", "3",
                                          "--hidden", "4", "--repeat", "1"])
    assert result.exit_code == 1 and "not enough memory for this size" in result.output
    assert "Traceback" not in result.output


def test_a_runtime_error_about_something_else_is_not_called_memory(monkeypatch):
    monkeypatch.setattr(bench, "run", lambda *a, **kw: (_ for _ in ()).throw(RuntimeError("x")))
    result = CliRunner().invoke(cli.cli, ["bench", "--model", "rnn", "--no-torch"])
    assert isinstance(result.exception, RuntimeError) and str(result.exception) == "x"


@pytest.mark.skipif(cuda_available()[0], reason="a GPU is present: the error path cannot be hit")
def test_bench_on_cuda_without_a_gpu_says_why():
    result = CliRunner().invoke(cli.cli, ["bench", "--device", "cuda", "--no-torch"])
    assert result.exit_code == 1
    assert "no GPU is usable" in result.output and "Traceback" not in result.output


@pytest.mark.skipif(not bench.torch_available(), reason="PyTorch is not installed (optional)")
def test_torch_yardstick_runs_the_same_cell():
    x, y = bench.bench_inputs(2, 3, 1, "float32")
    r = bench.bench_torch("antisym-gated", x, y, 4, repeat=1)
    assert r["forward"] > 0 and r["fwd_bwd"] > 0 and np.isfinite(r["fwd_bwd"])
    assert bench.bench_torch("peephole-lstm", x, y, 4, repeat=1) is None


@pytest.mark.skipif(not bench.torch_available(), reason="PyTorch is not installed (optional)")
@pytest.mark.parametrize("name", ["cornn", "cornn-imex", "lem"])
def test_the_successors_torch_loops_are_nprnns_cells(name):
    """The PyTorch rows of coRNN and LEM time the same recurrence as nprnn's cell at its
    default settings: given the model's parameters, the loop's last state is the model's."""
    import torch
    model = nprnn.make_model(name, 2, 5, 3, dtype="float64", seed=2)
    gen = torch.Generator().manual_seed(0)
    if name == "lem":
        loop = bench._torch_lem(torch, 5, 2, torch.float64, gen)
        keys = ["weight_ih", "bias_ih", "weight_hh", "bias_hh", "weight_z", "bias_z"]
    else:
        loop = bench._torch_cornn(model.cell, torch, 5, 2, torch.float64, gen)
        keys = ["W", "W_z", "V", "b"]
    with torch.no_grad():
        for param, key in zip(loop.params, keys):
            param.copy_(torch.from_numpy(model.params[key]))
    x = np.random.default_rng(3).standard_normal((4, 6, 2))
    h_T = loop(torch.from_numpy(x))[:, -1].detach().numpy()
    np.testing.assert_allclose(h_T, model.hidden(x), rtol=1e-12, atol=1e-14)
    r = bench.bench_torch(name, *bench.bench_inputs(2, 3, 1, "float32"), 4, repeat=1)
    assert r["forward"] > 0 and np.isfinite(r["fwd_bwd"])


@pytest.mark.skipif(not bench.torch_available(), reason="PyTorch is not installed (optional)")
def test_the_torch_yardstick_gives_back_the_floating_point_mode():
    """PyTorch is timed with subnormals flushed (float32); nprnn's rows timed after it must not
    run in that mode, nor compute float64 results in it."""
    subnormal = np.array([1e-310])
    for dtype in ("float32", "float64"):
        bench.bench_torch("rnn", *bench.bench_inputs(2, 3, 1, dtype), 4, repeat=1)
        assert (subnormal * 1.0)[0] == 1e-310, dtype


def test_data_benchmark_runs_at_tiny_sizes(monkeypatch, capsys):
    """benchmarks/bench_data.py end to end on the synthetic CIFAR-10 rows (no raw files needed):
    one row per task with the shapes of the task, and the noise line."""
    import runpy
    monkeypatch.setattr(sys, "argv", ["bench_data.py", "--tasks", "", "--synthetic",
                                      "cifar10,cifar10-noise", "--batch-size", "2", "--hidden",
                                      "3", "--batches", "1", "--steps", "1", "--T", "40"])
    runpy.run_path(os.path.join(os.path.dirname(__file__), "..", "benchmarks", "bench_data.py"),
                   run_name="__main__")
    out = capsys.readouterr().out.splitlines()
    rows = {line.split()[0]: line.split() for line in out if line.startswith("cifar10")}
    assert rows["cifar10*"][1:3] == ["1024", "3"]
    assert rows["cifar10-noise*"][1:3] == ["40", "96"]
    assert all(float(row[-1].rstrip("%")) > -100 for row in rows.values())      # in loop
    assert any(line.startswith("N(0, 1) float32 draws: nprnn.data.noise") for line in out)


def test_data_benchmark_goes_past_an_epoch_and_skips_a_task_without_files(monkeypatch, capsys):
    """A split shorter than the batches timed is read epoch after epoch (it ended in
    StopIteration at B >= 400 on MNIST's test set); a task whose raw files cannot be had is
    reported as skipped and the others are still timed."""
    import runpy

    from nprnn.data import datasets, sources
    rng = np.random.default_rng(0)
    x = rng.random((6, 5, 1)).astype(np.float32)
    small = datasets.ArrayTask("small", x, np.arange(6) % 2, x[:3], np.arange(3) % 2, 2)

    def get_task(name, **kwargs):
        if name == "mnist":
            raise sources.DataUnavailable("MNIST: files not found in nowhere/mnist\nplace them")
        return small

    monkeypatch.setattr(datasets, "get_task", get_task)
    monkeypatch.setattr(sys, "argv", ["bench_data.py", "--tasks", "mnist,pmnist", "--synthetic",
                                      "", "--batch-size", "2", "--hidden", "3", "--batches", "2",
                                      "--steps", "2", "--T", "40"])
    runpy.run_path(os.path.join(os.path.dirname(__file__), "..", "benchmarks", "bench_data.py"),
                   run_name="__main__")
    out = capsys.readouterr().out.splitlines()
    skipped = out.index("mnist          skipped: MNIST: files not found in nowhere/mnist")
    assert out[skipped + 1] == " " * 15 + "place them"        # the whole reason, indented
    assert "numba threads" in out[0] and nprnn.study.bench.machine() in out[0]
    assert [line.split()[:3] for line in out if line.startswith("pmnist")] == [["pmnist", "5",
                                                                               "1"]]
    # a batch larger than the 3 test examples: said, not an endless wait for a whole batch
    monkeypatch.setattr(sys, "argv", ["bench_data.py", "--tasks", "pmnist", "--synthetic", "",
                                      "--batch-size", "4", "--hidden", "3", "--batches", "1",
                                      "--steps", "1"])
    runpy.run_path(os.path.join(os.path.dirname(__file__), "..", "benchmarks", "bench_data.py"),
                   run_name="__main__")
    out = capsys.readouterr().out.splitlines()
    assert ("pmnist         skipped: --batch-size 4 is more than the 3 examples of pmnist's "
            "smaller split") in out


@pytest.mark.parametrize("args, message", [
    (["--synthetic", "cifar10-noise", "--T", "30"], "needs an integer T >= 32"),
    (["--tasks", "mnist,mnsit"], "unknown task 'mnsit'"),
    (["--batches", "0"], "--batches: must be at least 1, got 0"),
    (["--T", "-5"], "--T: must be at least 1, got -5"),
])
def test_data_benchmark_refuses_bad_arguments_before_timing(monkeypatch, capsys, args, message):
    """A T too short for a noise task, or a misspelt task, stopped the table with a traceback
    after the rows before it had been timed; now it is an argparse error, before any timing."""
    import runpy
    monkeypatch.setattr(sys, "argv", ["bench_data.py", "--tasks", "", "--synthetic", ""] + args)
    with pytest.raises(SystemExit) as exc:
        runpy.run_path(os.path.join(os.path.dirname(__file__), "..", "benchmarks",
                                    "bench_data.py"), run_name="__main__")
    out, err = capsys.readouterr()
    assert exc.value.code == 2 and message in err and out == ""


def test_a_pytorch_without_cuda_is_no_gpu_yardstick(monkeypatch):
    import types
    fake = types.SimpleNamespace(cuda=types.SimpleNamespace(is_available=lambda: False))
    monkeypatch.setitem(sys.modules, "torch", fake)
    assert bench.torch_available("cpu") and not bench.torch_available("cuda")
    monkeypatch.setitem(sys.modules, "torch", None)              # not installed
    assert not bench.torch_available("cpu") and not bench.torch_available("cuda")


def test_the_command_line_silences_numbas_small_grid_warnings_only():
    """numba warns of every launch under 128 blocks on a real GPU (the simulator never does, so
    the warning is raised by hand here); the command line keeps those out of its output."""
    from numba.core.errors import NumbaPerformanceWarning
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert CliRunner().invoke(cli.cli, ["params"]).exit_code == 0
        warnings.warn(NumbaPerformanceWarning("Grid size 1 will likely result in GPU "
                                              "under-utilization due to low occupancy."))
        warnings.warn(NumbaPerformanceWarning("something else"))
    assert [str(w.message) for w in caught] == ["something else"]


@pytest.mark.skipif(not bench.torch_available(), reason="PyTorch is not installed (optional)")
def test_torch_layer_rows_time_training_steps_beside_plain_pytorch():
    result = CliRunner().invoke(cli.cli, ["bench", "--model", "antisym,gru,peephole-lstm",
                                          "--batch", "3", "--T", "4", "--hidden", "5",
                                          "--repeat", "1", "--torch-layer", "--layers", "2"])
    assert result.exit_code == 0, result.output
    rows = result.output.splitlines()[2:]
    assert [r.split()[0] for r in rows] == ["antisym", "antisym", "gru", "gru", "peephole-lstm"]
    assert "nprnn.torch in PyTorch" in rows[0] and rows[1].split()[1] == "PyTorch"
    assert rows[-1].endswith("(PyTorch has no such cell)")


def test_torch_layer_rows_need_pytorch(monkeypatch):
    monkeypatch.setattr(bench, "torch_available", lambda device="cpu": False)
    result = CliRunner().invoke(cli.cli, ["bench", "--torch-layer", "--repeat", "1"])
    assert result.exit_code == 2 and "--torch-layer times nprnn.torch and needs PyTorch" in (
        result.output)

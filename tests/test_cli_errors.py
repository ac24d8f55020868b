"""cli.py's answers to bad input: one line (click's "Error: ..."), no traceback, the bad value and
what is allowed; exit status 2 for a bad option, 1 for anything else. Also the exit status of a
`train` that a signal stopped, and jacobian's progress lines.

Sizes that cannot fit are asked for in hundreds of TiB (TOO_LONG), so that the allocation is
refused at once: some tens of GB may be granted lazily and then fill memory; never ask for that.
"""
import io
import json
import os
import re
import signal
import sys

import numpy as np
import pytest
from click.testing import CliRunner

import nprnn
import nprnn.data.datasets
import nprnn.core.device
from nprnn.data.datasets import ArrayTask

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import cli  # noqa: E402  (cli.py lives at the repository root)

# A length no machine holds: every array below made with it is over 128 TiB, beyond the address
# space of a process, so numpy's request is refused at once even where the kernel overcommits.
TOO_LONG = 10**13


def invoke(args):
    return CliRunner().invoke(cli.cli, [str(a) for a in args])


def assert_one_line_error(result, status, *expected):
    """Exit `status` with click's one-line "Error: ..." containing each of `expected`."""
    assert result.exit_code == status, result.output + repr(result.exception)
    assert result.exc_info[0] is SystemExit, result.exc_info          # not a traceback
    error = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert len(error) == 1, result.output
    for text in expected:
        assert text in error[0], error[0]


@pytest.fixture
def no_matplotlib(monkeypatch):
    """Every `import matplotlib...` fails: the commands write only their numbers (faster)."""
    for mod in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, mod)
    monkeypatch.setitem(sys.modules, "matplotlib", None)


def make_run(root, name="run"):
    """A run folder as `plot` reads it: config.json and two metrics records."""
    d = root / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps(dict(model="antisym", task="mnist")))
    (d / "metrics.jsonl").write_text(
        json.dumps(dict(iteration=0, split="train", loss=2.3, accuracy=0.1)) + "\n"
        + json.dumps(dict(iteration=0, split="test", loss=2.3, accuracy=0.1)) + "\n")
    return d


def toy_arrays():
    """16 training and 8 test sequences (T=3, m=2), label x_0[0] > 0."""
    x = np.random.default_rng(0).standard_normal((16, 3, 2)).astype(np.float32)
    y = (x[:, 0, 0] > 0).astype(np.int64)
    return x, y, x[:8], y[:8]


def toy_task(name="toy"):
    return ArrayTask(name, *toy_arrays(), num_classes=2)


class HugeBatches(ArrayTask):
    """Batches of an impossible length, like a noise-padded task at --T 10**11: numpy refuses
    the first one, after train has written the checkpoint of iteration 0."""

    def batches(self, split, batch_size, **kwargs):
        yield np.empty((batch_size, TOO_LONG, self.m), np.float32), None


@pytest.fixture
def toy_get_task(monkeypatch):
    """get_task answering every task name with toy_task (or what `use` holds)."""
    use = {"task": toy_task}
    monkeypatch.setattr(nprnn.data.datasets, "get_task",
                        lambda name, **kw: use["task"](name), raising=False)
    return use


TRAIN = ["train", "--hidden", "3", "--batch-size", "4", "--iterations", "6", "--eps", "0.5",
         "--gamma", "0.1", "--no-progress"]


# ----------------------------------------------------------------------------------------------
# 1. --out that cannot be a folder; 2. plot --name
# ----------------------------------------------------------------------------------------------

def command_with_out(kind, tmp_path, out):
    return {"simulate": ["simulate", "--steps", "2", "--figures", "4"],
            "jacobian": ["jacobian", "--models", "lstm", "--lengths", "2", "--hidden-size", "2",
                         "--input-size", "1", "--sequences", "1"],
            "plot": ["plot", make_run(tmp_path)]}[kind] + ["--out", out]


@pytest.mark.parametrize("kind", ["simulate", "jacobian", "plot"])
@pytest.mark.parametrize("where, reason", [
    ("under-a-file", "is a file"),
    ("/dev/null", "/dev/null is not a folder"),
    ("too-long", "File name too long"),
])
def test_an_out_folder_that_cannot_be_made_is_one_line(tmp_path, kind, where, reason):
    afile = tmp_path / "afile"
    afile.write_text("")
    out = {"under-a-file": afile / "sub", "/dev/null": "/dev/null",
           "too-long": tmp_path / ("x" * 300) / "y"}[where]
    if where == "/dev/null" and not os.path.exists("/dev/null"):
        pytest.skip("no /dev/null here")
    result = invoke(command_with_out(kind, tmp_path, out))
    assert_one_line_error(result, 2, "--out", f"cannot create folder {out}", reason)
    if where == "under-a-file":
        assert f"{afile} is a file" in result.output


@pytest.mark.parametrize("name", ["", ".", "..", "a/b", "/tmp/curves", "../curves"])
def test_plot_name_is_a_bare_file_name(tmp_path, name):
    result = invoke(["plot", make_run(tmp_path), "--out", tmp_path / "figs", "--name", name])
    assert_one_line_error(result, 2, "--name", "expected a file name without a folder",
                          repr(name))
    assert not (tmp_path / "figs").exists()


def test_plot_name_with_a_dot_keeps_it(tmp_path, no_matplotlib):
    result = invoke(["plot", make_run(tmp_path), "--out", tmp_path / "figs", "--name",
                     "curves.v2"])
    assert result.exit_code == 0, result.output
    assert [p.name for p in (tmp_path / "figs").iterdir()] == ["curves.v2.csv"]


# ----------------------------------------------------------------------------------------------
# 3. params --classes; 4. nan and inf
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("K", [-5, 0, 1])
def test_params_needs_two_classes(K):
    assert_one_line_error(invoke(["params", "--classes", K]), 2, "--classes", f"{K} is not in "
                          "the range x>=2")


def test_params_with_two_classes():
    result = invoke(["params", "--classes", "2"])
    assert result.exit_code == 0 and "antisym" in result.output, result.output


FLOAT_OPTIONS = [(["simulate", "--out", "OUT"], "--eps"),
                 (["simulate", "--out", "OUT", "--figures", "3"], "--eps"),
                 (["jacobian", "--out", "OUT"], "--eps"),
                 (["jacobian", "--out", "OUT"], "--sigma-w"),
                 *[(["train", "--out", "OUT"], o) for o in
                   ("--eps", "--gamma", "--dt", "--epsilon", "--sigma-w", "--gate-bias", "--lr",
                    "--momentum", "--clip")]]


@pytest.mark.parametrize("args, option", FLOAT_OPTIONS)
@pytest.mark.parametrize("value", ["nan", "inf", "NaN", "1e400"])
def test_float_options_refuse_nan_and_inf(tmp_path, toy_get_task, args, option, value):
    args = [str(tmp_path / "out") if a == "OUT" else a for a in args]
    result = invoke(args + [option, value])
    shown = "nan" if value.lower() == "nan" else "inf"
    # "inf is not in the range 0<=x<1." where FloatRange has a max (--momentum); an option
    # without bounds (--gate-bias) says "inf is not a finite number."
    bounded = ["in the range"] if option != "--gate-bias" else [f"{shown} is not a finite number."]
    assert_one_line_error(result, 2, f"'{option}': {shown} is not", *bounded)
    assert not (tmp_path / "out").exists()


def test_every_float_option_is_finite():
    """Any float option a command has, now or later, is a FiniteFloat (nan and inf refused)."""
    import click

    def commands(group):
        for c in group.commands.values():
            yield from commands(c) if isinstance(c, click.Group) else [c]
    floats = [(c.name, p.name, type(p.type).__name__) for c in commands(cli.cli)
              for p in c.params if isinstance(p.type, (click.types.FloatParamType))]
    assert floats and all(t == "FiniteFloat" for _, _, t in floats), floats


@pytest.mark.parametrize("value", ["nan", "inf", "1,-inf"])
def test_jacobian_gammas_are_finite(tmp_path, value):
    result = invoke(["jacobian", "--out", tmp_path, "--gammas", value])
    assert_one_line_error(result, 2, "--gammas", "expected finite numbers")


# ----------------------------------------------------------------------------------------------
# 5. comma-separated lists: empty items are ignored, and at least one must be left
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("args, option, what", [
    (["jacobian", "--out", "OUT"], "--models", "model name"),
    (["bench", "--no-torch"], "--model", "model name"),
    (["jacobian", "--out", "OUT"], "--lengths", "int value"),
    (["jacobian", "--out", "OUT"], "--gammas", "float value"),
    (["simulate", "--out", "OUT"], "--figures", "int value"),
])
@pytest.mark.parametrize("value", ["", ",", " , ,"])
def test_an_empty_list_is_refused(tmp_path, args, option, what, value):
    args = [str(tmp_path / "out") if a == "OUT" else a for a in args]
    result = invoke(args + [option, value])
    assert_one_line_error(result, 2, option, f"expected at least one {what}, got {value!r}")


def test_empty_items_are_ignored(tmp_path, no_matplotlib):
    result = invoke(["jacobian", "--out", tmp_path, "--models", "antisym,,lstm,",
                     "--gammas", ",1,", "--lengths", "2,", "--hidden-size", "2",
                     "--input-size", "1", "--sequences", "1"])
    assert result.exit_code == 0, result.output
    rows = json.loads((tmp_path / "figure2_jacobian.json").read_text())["rows"]
    assert [(r["label"], r["T"]) for r in rows] == [("antisym gamma=1", 2), ("lstm", 2)]
    result = invoke(["simulate", "--out", tmp_path, "--figures", "4,", "--steps", "2"])
    assert result.exit_code == 0 and (tmp_path / "figure4.csv").is_file(), result.output
    result = invoke(["bench", "--model", ",antisym,", "--batch", "1", "--T", "2", "--hidden",
                     "2", "--repeat", "1", "--no-torch"])
    assert result.exit_code == 0, result.output
    assert [ln.split()[0] for ln in result.output.splitlines() if "nprnn" in ln] == ["antisym"]


@pytest.mark.parametrize("args, option, message", [
    (["--models", "nosuch,lstm"], "--models", "unknown model(s) nosuch; choose from antisym, "
                                              "antisym-gated, ablation, feedback, antisym-xgate, "
                                              "rnn, lstm"),
    (["--models", "rnn,lstm,rnn"], "'--models'", "rnn is given twice in 'rnn,lstm,rnn'; give "
                                                 "each once"),
    (["--lengths", "3,5,3"], "'--lengths'", "3 is given twice in '3,5,3'"),
    (["--gammas", "0.1,1,0.10"], "'--gammas'", "0.1 is given twice in '0.1,1,0.10'"),
])
def test_jacobian_refuses_unknown_and_repeated_items(tmp_path, args, option, message):
    """A model name not in the registry is a bad --models (exit 2), as in bench; a model, length
    or gamma given twice would give the same rows twice."""
    result = invoke(["jacobian", "--out", tmp_path / "out"] + args)
    assert_one_line_error(result, 2, option, message)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("args, message", [
    (["--task", "mnist"], "Error: task 'mnist' has a fixed length T = 784, and the default "
                          "--lengths 100,200,400,800 are for noise: give --lengths 784"),
    (["--task", "mnist", "--lengths", "784,100"], "Invalid value for --lengths: task 'mnist' "
                                                  "has a fixed length T = 784; got T=100"),
    (["--task", "mnist-noise", "--lengths", "10"], "Invalid value for --lengths: task "
                                                   "'mnist-noise' needs an integer T >= 28"),
])
def test_jacobian_says_which_lengths_a_task_takes(tmp_path, monkeypatch, args, message):
    """Before any data is read: a task of fixed length with the default --lengths (for noise)
    is told to give its length, and a length a task cannot have is a bad --lengths."""
    def get_task(*args, **kwargs):
        raise AssertionError("get_task was called")
    monkeypatch.setattr(nprnn.data.datasets, "get_task", get_task)
    result = invoke(["jacobian", "--out", tmp_path / "out"] + args)
    assert_one_line_error(result, 2, message)
    assert not (tmp_path / "out").exists()


# ----------------------------------------------------------------------------------------------
# 6. sizes beyond memory
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("args, lower", [
    (["simulate", "--out", "OUT", "--steps", 10 * TOO_LONG, "--figures", "4"], "lower --steps"),
    (["jacobian", "--out", "OUT", "--models", "lstm", "--lengths", TOO_LONG, "--hidden-size",
      "2", "--input-size", "1"], "lower --lengths, --hidden-size"),
    (["jacobian", "--out", "OUT", "--models", "antisym", "--gammas", "1", "--lengths", "2",
      "--hidden-size", "10000000"], "--hidden-size"),      # W is n x n: 728 TiB of float64
    (["bench", "--model", "antisym", "--T", TOO_LONG, "--no-torch"], "lower --batch, --T"),
])
def test_a_size_beyond_memory_is_one_line(tmp_path, args, lower):
    args = [tmp_path / "out" if a == "OUT" else a for a in args]
    result = invoke(args)
    assert_one_line_error(result, 1, "not enough memory for this size (Unable to allocate",
                          lower)


def test_eval_beyond_memory_is_one_line(monkeypatch):
    import nprnn.runs.train

    def evaluate_checkpoint(*args, **kwargs):
        return np.empty((TOO_LONG, 1000), np.float32)
    monkeypatch.setattr(nprnn.runs.train, "evaluate_checkpoint", evaluate_checkpoint)
    assert_one_line_error(invoke(["eval", "somewhere"]), 1, "not enough memory",
                          "lower --batch-size or --seq-len")


def test_train_beyond_memory_before_the_run_folder(tmp_path, toy_get_task):
    """--hidden 10**7: W cannot be made, nothing is written."""
    out = tmp_path / "run"
    result = invoke(TRAIN + ["--hidden", "10000000", "--out", out])
    assert_one_line_error(result, 1, "not enough memory", "lower --hidden")
    assert "checkpoint" not in result.output and not out.exists()


def test_train_beyond_memory_at_the_first_step_leaves_nothing(tmp_path, toy_get_task):
    """A batch too large for memory fails at the first step, after train wrote config.json and
    the checkpoint of iteration 0: a run that never trained leaves nothing, so the same --out
    takes the next try at once (the checkpoint used to block it)."""
    toy_get_task["task"] = lambda name: HugeBatches(name, *toy_arrays(), num_classes=2)
    out = tmp_path / "run"
    result = invoke(TRAIN + ["--out", out])
    assert_one_line_error(result, 1, "not enough memory", "lower --hidden, --batch-size")
    assert "checkpoint" not in result.output.splitlines()[-1] and not out.exists()
    toy_get_task["task"] = toy_task
    assert invoke(TRAIN + ["--out", out]).exit_code == 0
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "notes.txt").write_text("mine")            # a folder the user made is kept, and
    toy_get_task["task"] = lambda name: HugeBatches(name, *toy_arrays(), num_classes=2)
    invoke(TRAIN + ["--out", kept])                     # what was in it
    assert sorted(p.name for p in kept.iterdir()) == [".lock", "notes.txt"]


# ----------------------------------------------------------------------------------------------
# 7. bench --device cuda without a GPU; 8. train's exit status after a signal; 9. progress
# ----------------------------------------------------------------------------------------------

def test_bench_on_cuda_says_no_gpu_before_anything_about_pytorch(monkeypatch):
    import nprnn.study.bench

    monkeypatch.setattr(nprnn.core.device, "cuda_available", lambda: (False, "no GPU in this test"))
    monkeypatch.setattr(nprnn.study.bench, "torch_available", lambda device="cpu": device == "cpu")
    result = invoke(["bench", "--device", "cuda"])
    assert_one_line_error(result, 1, "no GPU is usable", "no GPU in this test")
    assert "PyTorch" not in result.output


@pytest.mark.parametrize("sig, status", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_train_stopped_by_a_signal_exits_with_128_plus_its_number(tmp_path, monkeypatch,
                                                                 toy_get_task, sig, status):
    import nprnn.runs.train

    real = nprnn.runs.train.train

    def train_then_signal(*args, **kwargs):
        def send(it, loss):
            if it == 2:
                os.kill(os.getpid(), sig)
        return real(*args, callback=send, **kwargs)
    monkeypatch.setattr(nprnn.runs.train, "train", train_then_signal)
    out = tmp_path / "run"
    result = invoke(TRAIN + ["--out", out])
    assert result.exit_code == status, result.output + repr(result.exception)
    assert f"stopped by {sig.name} at iteration 2" in result.output
    monkeypatch.setattr(nprnn.runs.train, "train", real)
    result = invoke(["train", "--out", out, "--resume", "--no-progress"])
    assert result.exit_code == 0 and "final test accuracy after 6" in result.output, \
        result.output


def test_train_aborted_by_a_second_signal_names_the_checkpoint_kept(tmp_path, monkeypatch,
                                                                    toy_get_task):
    """A second SIGTERM while the first is being honoured aborts at once: 143 as for one, not
    click's 'Aborted!' and 1, with the checkpoint that stands named; it resumes."""
    import nprnn.runs.train

    real = nprnn.runs.train.train

    def train_then_signal_twice(*args, **kwargs):
        def send(it, loss):
            if it == 2:
                os.kill(os.getpid(), signal.SIGTERM)
                os.kill(os.getpid(), signal.SIGTERM)
        return real(*args, callback=send, **kwargs)
    monkeypatch.setattr(nprnn.runs.train, "train", train_then_signal_twice)
    out = tmp_path / "run"
    result = invoke(TRAIN + ["--out", out])
    assert result.exit_code == 143, result.output + repr(result.exception)
    assert "Aborted!" not in result.output
    assert (f"SIGTERM received again: aborted. The checkpoint of iteration 0 is kept: continue "
            f"with `python cli.py train --out {out} --resume`") in result.stderr
    monkeypatch.setattr(nprnn.runs.train, "train", real)
    result = invoke(["train", "--out", out, "--resume", "--no-progress"])
    assert result.exit_code == 0 and "final test accuracy after 6" in result.output, \
        result.output


def test_eval_says_what_it_scored_where(tmp_path, toy_get_task):
    """eval's line names the task's length and the device with the numbers, so that the lines
    of two evaluations at different T, or on two devices, cannot be confused."""
    out = tmp_path / "run"
    assert invoke(TRAIN + ["--out", out]).exit_code == 0
    result = invoke(["eval", out, "--device", "cpu"])
    assert result.exit_code == 0, result.output
    T = toy_get_task["task"]("mnist").T
    assert re.fullmatch(rf"antisym from {re.escape(str(out / 'checkpoint.h5'))} \(iteration 6\) "
                        rf"on mnist \(T={T}\) test, cpu: accuracy 0\.\d{{4}} \(\d+/\d+\), loss "
                        rf"\d+\.\d{{4}}\n", result.output), result.output


def test_jacobian_names_each_model_and_length_as_it_starts(tmp_path, no_matplotlib):
    result = invoke(["jacobian", "--out", tmp_path, "--models", "antisym,lstm", "--gammas", "1",
                     "--lengths", "2,3", "--hidden-size", "2", "--input-size", "1",
                     "--sequences", "1"])
    assert result.exit_code == 0, result.output
    assert result.stderr.splitlines() == ["[1/4] antisym gamma=1, T=2", "[2/4] lstm, T=2",
                                          "[3/4] antisym gamma=1, T=3", "[4/4] lstm, T=3"]
    assert "[1/4]" not in result.stdout


def test_eval_progress_is_drawn_in_place_on_a_terminal_only():
    import io

    from nprnn.util.progress import CountBar

    class Terminal(io.StringIO):
        def isatty(self):
            return True
    shown = CountBar("evaluating test", stream=Terminal())
    shown(256, 1000)
    shown(1000, 1000)
    shown.close()
    text = shown.stream.getvalue()
    assert "\revaluating test: 1,000/1,000" in text and text.endswith("\n")
    quiet = CountBar("evaluating test", stream=io.StringIO())
    quiet(256, 1000)
    quiet.close()
    assert quiet.stream.getvalue() == ""


@pytest.mark.parametrize("args, option", [
    (["train", "--out", ""], "--out"), (["train", "--data-dir", " "], "--data-dir"),
    (["simulate", "--out", ""], "--out"), (["data", "info", "--data-dir", ""], "--data-dir")])
def test_an_empty_folder_is_refused_naming_the_option(args, option, tmp_path, monkeypatch):
    """`--out ""` trained silently into the current folder (the repository's root, among the
    sources), and `--data-dir ""` meant it too."""
    monkeypatch.chdir(tmp_path)
    result = invoke(args)
    assert_one_line_error(result, 2, f"Invalid value for '{option}': is empty, which would "
                                     f"mean the current folder")
    assert list(tmp_path.iterdir()) == []


def test_a_data_folder_that_cannot_be_made_is_named_with_the_reason(tmp_path):
    """--data-dir under a file, with downloads on: a bare '[Errno 20] Not a directory' before."""
    (tmp_path / "a-file").write_text("")
    result = invoke(["data", "prepare", "--task", "mnist", "--data-dir", tmp_path / "a-file" / "x"])
    assert_one_line_error(result, 1, f"cannot make the folder {tmp_path / 'a-file' / 'x'}/mnist "
                                     f"to download train-images-idx3-ubyte.gz into: "
                                     f"{tmp_path / 'a-file'} is a file")


def test_the_top_level_help_gives_each_command_whole():
    """`cli.py --help` on an 80-column terminal: each command's line is a whole sentence, not
    a first few words cut with "..."."""
    out = CliRunner().invoke(cli.cli, ["--help"], terminal_width=80).output
    listed = out.split("Commands:")[1].splitlines()[1:]
    assert len(listed) == len(cli.cli.commands)
    for line in listed:
        assert line.rstrip().endswith(".") and "..." not in line, line


def test_sweep_run_shows_the_validation_size_it_uses():
    """`sweep run --help` gives --valid-size's default as the 5,000 that a sweep holds out."""
    out = CliRunner().invoke(cli.cli, ["sweep", "run", "--help"], terminal_width=200).output
    line = next(line for line in out.splitlines() if line.lstrip().startswith("--valid-size"))
    assert "[default: 5000;" in line


def test_no_download_into_a_folder_that_cannot_be_made_says_so(tmp_path):
    """`data prepare --no-download` where a file stands in the data folder's path: the message
    says the folder cannot be made, not to put the files there."""
    (tmp_path / "afile").write_text("")
    r = invoke(["data", "prepare", "--task", "mnist", "--no-download", "--data-dir",
                tmp_path / "afile" / "sub"])
    assert r.exit_code == 1
    assert f"{tmp_path / 'afile'} is a file" in r.output and "Place these" not in r.output


@pytest.mark.parametrize("dtype, hint", [("int64", "scale integer pixels"),
                                         ("complex128", "the cells take real inputs")])
def test_a_batch_that_is_not_floats_gets_the_hint_of_its_kind(dtype, hint):
    model = nprnn.make_model("antisym", 1, 4)
    with pytest.raises(TypeError, match=f"got dtype {dtype}; {hint}"):
        model.forward(np.zeros((1, 2, 1), dtype=dtype))


def test_a_sweep_says_where_it_stands_in_a_log_at_most_once_a_minute(monkeypatch):
    """SweepBar off a terminal: a status line when it has changed, at most once in `every`."""
    from nprnn.util import progress
    log = io.StringIO()
    clock = iter([0.0, 10.0, 70.0, 200.0])
    monkeypatch.setattr(progress.time, "monotonic", lambda: next(clock))
    bar = progress.SweepBar(stream=log, every=60.0)
    status = dict(done=0, total=12, running=2, pruned=0, failed=0, best=None)
    bar(status)                                        # t = 0: said
    bar(dict(status, best=0.5))                        # t = 10: too soon
    bar(dict(status, done=1, pruned=1, best=0.9312))   # t = 70: said
    bar(dict(status, done=1, pruned=1, best=0.9312))   # t = 200: unchanged
    assert log.getvalue().splitlines() == [
        "trials: 0/12 done (0 pruned, 0 failed), 2 running, best valid -",
        "trials: 1/12 done (1 pruned, 0 failed), 2 running, best valid 0.9312"]


def test_data_prepare_all_tries_every_task_and_names_those_it_could_not(tmp_path):
    """--task all without downloads into an empty folder: each task is tried and said, and the
    command fails naming the tasks left unprepared."""
    from nprnn.data.tasks import TASKS
    result = invoke(["data", "prepare", "--task", "all", "--no-download", "--data-dir", tmp_path])
    assert result.exit_code == 1, result.output
    assert "not prepared: mnist, pmnist" in result.output
    for name in TASKS:
        assert f"{name}: " in result.output

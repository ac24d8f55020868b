"""The synthetic tasks (nprnn/data/synthetic.py): adding, adding-varlen and copy. Their
definitions and baselines (successors.md sections 3 and 4), batches that follow from the seed and
the iteration alone, the cache of their fixed sets, the one-line errors of bad settings, and the
run plumbing of a task that declares its readout, loss and metric (train, eval, results).

The tests of the last section train a model: they need make_model's layers and readout, and
lengths in step_arrays and forward."""
import json
import math
import os
import re
import sys
import zlib
from types import SimpleNamespace

import h5py
import numpy as np
import pytest
from click.testing import CliRunner

from nprnn.data import cache, synthetic
from nprnn.data.datasets import get_task
from nprnn.data.tasks import TASKS, cache_path
from nprnn.runs import train as training
from nprnn.runs.checkpoint import load_checkpoint
from nprnn.shell import output
from nprnn.study import analysis

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import cli  # noqa: E402  (cli.py lives at the repository root)

ADDING, VARLEN, COPY = (synthetic.SPECS[n] for n in ("adding", "adding-varlen", "copy"))


def invoke(*args):
    return CliRunner().invoke(cli.cli, [str(a) for a in args])


def one_line_error(result, status, *expected):
    """click's one "Error: ..." line, with each of `expected` in it, and exit `status`."""
    assert result.exit_code == status, result.output + repr(result.exception)
    assert result.exc_info[0] is SystemExit, result.exc_info           # not a traceback
    errors = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, result.output
    for text in expected:
        assert text in errors[0], errors[0]


def training_rows(spec, T, B, seed=0):
    """synthetic.draw of the first training batch of B rows, and its sequences."""
    drawn = synthetic.draw(spec, T, synthetic.training_keys(spec, T, seed, 0, 0, B))
    return drawn, synthetic.sequences(spec, T, drawn)


# ----------------------------------------------------------------------------------------------
# the definitions
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("T", [2, 3, 20, 21])
def test_adding_has_one_marker_in_each_half_and_the_sum_as_target(T):
    drawn, (x, y, lengths) = training_rows(ADDING, T, 500)
    assert x.shape == (500, T, 2) and x.dtype == np.float32 and x.flags.c_contiguous
    assert y.shape == (500, 1) and y.dtype == np.float32 and lengths is None
    a = x[:, :, 1]
    assert np.all(a.sum(axis=1) == 2) and set(np.unique(a)) <= {0.0, 1.0}
    assert np.all(a[:, :T // 2].sum(axis=1) == 1) and np.all(a[:, T // 2:].sum(axis=1) == 1)
    u = x[:, :, 0]
    assert np.all(u >= 0) and np.all(u < 1)
    assert np.array_equal(y[:, 0], (u * a).sum(axis=1, dtype=np.float32))
    if T == 20:                     # every marker position of each half is drawn
        assert set(drawn["markers"][:, 0]) == set(range(10))
        assert set(drawn["markers"][:, 1]) == set(range(10, 20))


def test_adding_varlen_rows_have_their_own_length_and_nothing_after_it():
    T = 21
    drawn, (x, y, lengths) = training_rows(VARLEN, T, 2000)
    assert lengths.dtype == np.int64 and lengths.shape == (2000,)
    assert set(lengths) == set(range(11, 22))                 # uniform{ceil(T/2) .. T}
    after = np.arange(T) >= lengths[:, None]
    assert np.all(x[after] == 0)
    for b in range(len(x)):
        L, a = lengths[b], x[b, :, 1]
        assert a[:L // 2].sum() == 1 and a[L // 2:L].sum() == 1
        assert y[b, 0] == x[b, a == 1, 0].sum(dtype=np.float32)


@pytest.mark.parametrize("T", [1, 2, 30])
def test_the_copy_layout(T):
    drawn, (x, y, lengths) = training_rows(COPY, T, 300)
    steps = T + 20
    assert x.shape == (300, steps, 10) and y.shape == (300, steps) and lengths is None
    assert y.dtype == np.int64 and np.all(x.sum(axis=2) == 1)          # one-hot
    codes = x.argmax(axis=2)
    symbols = drawn["symbols"].astype(np.int64)
    assert set(np.unique(symbols)) == set(range(1, 9))
    assert np.array_equal(codes[:, :10], symbols)                       # the data symbols
    assert np.all(codes[:, 10:T + 9] == 0)                              # T - 1 blanks
    assert np.all(codes[:, T + 9] == 9)                                 # the delimiter
    assert np.all(codes[:, T + 10:] == 0)                               # 10 blanks
    assert np.all(y[:, :T + 10] == 0) and np.array_equal(y[:, T + 10:], symbols)
    assert y.max() <= 8 < COPY.num_classes + 1                          # 9 classes


def test_what_each_task_declares():
    got = {n: (s.m, s.num_classes, s.readout, s.loss, s.metric) for n, s in TASKS.items()
           if s.synthetic}
    assert got == {"adding": (2, 1, "last", "mse", "mse"),
                   "adding-varlen": (2, 1, "last", "mse", "mse"),
                   "copy": (10, 9, "every", "xent", "accuracy")}
    assert ADDING.shape(50) == (50, 2) and COPY.shape(50) == (70, 10)
    assert (TASKS["mnist"].readout, TASKS["mnist"].loss, TASKS["mnist"].metric) == (
        "last", "xent", "accuracy")


# ----------------------------------------------------------------------------------------------
# the baselines, from the generator
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("spec", [ADDING, VARLEN])
def test_predicting_1_scores_a_sixth(spec):
    _, (x, y, _) = training_rows(spec, 40, 20_000, seed=7)
    e = (y[:, 0].astype(np.float64) - 1) ** 2
    assert abs(e.mean() - 1 / 6) < 4 * e.std() / math.sqrt(len(e))
    assert spec.baseline(40) == dict(loss=1 / 6)


def test_a_memoryless_copy_model_scores_10_ln_8_over_T_plus_20():
    T, N = 30, 20_000
    _, (x, y, _) = training_rows(COPY, T, N, seed=7)
    # the best model without memory predicts each step's marginal distribution of targets
    p = np.stack([np.bincount(y[:, t], minlength=9) / N for t in range(T + 20)])
    xent = -np.mean(np.log(p[np.arange(T + 20), y]))
    want = 10 * math.log(8) / (T + 20)
    assert abs(xent - want) < 1e-3 * want * 10
    assert COPY.baseline(T)["loss"] == pytest.approx(want)


def test_the_copy_baselines_are_the_papers_table():
    table = {100: 0.1733, 200: 0.0945, 300: 0.0650, 500: 0.0400, 1000: 0.0204, 2000: 0.0103}
    for T, loss in table.items():
        assert round(COPY.baseline(T)["loss"], 4) == loss
    assert COPY.baseline(100)["accuracy"] == pytest.approx((110 + 10 / 8) / 120)


# ----------------------------------------------------------------------------------------------
# batches from the seed and the iteration
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name, T", [("adding", 12), ("adding-varlen", 12), ("copy", 4)])
def test_a_training_batch_follows_from_seed_epoch_and_batch_alone(tmp_path, name, T):
    with get_task(name, data_dir=tmp_path, T=T) as a, get_task(name, data_dir=tmp_path, T=T) as b:
        first = list(a.batches("train", 8, seed=3, epoch=1, with_lengths=True))[:5]
        resumed = next(b.batches("train", 8, seed=3, epoch=1, start=4, with_lengths=True))
        again = next(b.batches("train", 8, seed=3, epoch=1, with_lengths=True))
        other = next(b.batches("train", 8, seed=4, epoch=1, with_lengths=True))
    for got, want in ((resumed, first[4]), (again, first[0])):
        for u, v in zip(got, want):
            assert (u is None and v is None) or (u.tobytes() == v.tobytes() and
                                                 u.dtype == v.dtype)
    assert not np.array_equal(other[0], first[0][0])
    assert not np.array_equal(first[1][0], first[0][0])      # every batch is fresh


def test_the_generator_is_pinned():
    """The rows are the same on every machine and NumPy version: a change here changes every
    cached set and every resumed run."""
    crcs = []
    for spec, T in ((ADDING, 16), (VARLEN, 16), (COPY, 3)):
        drawn = synthetic.draw(spec, T, synthetic.training_keys(spec, T, 5, 2, 9, 4))
        crcs.append(zlib.crc32(b"".join(drawn[k].tobytes() for k in sorted(drawn))))
    assert crcs == [1213969431, 2577332624, 2849256960]


def test_scored_splits_are_fixed_and_batches_of_any_size_agree(tmp_path):
    with get_task("adding-varlen", data_dir=tmp_path, T=10, valid_size=30) as t:
        assert (t.size("valid"), t.size("test"), t.size("train")) == (
            30, synthetic.EVAL_SIZE, synthetic.TRAIN_SIZE)
        whole = [np.concatenate(parts) for parts in
                 zip(*t.batches("valid", 30, with_lengths=True))]
        pieces = [np.concatenate(parts) for parts in
                  zip(*t.batches("valid", 7, with_lengths=True))]
        train = [np.concatenate(parts) for parts in
                 zip(*(t._make_batch("train", np.arange(k, k + 3), None) for k in (0, 3)))]
    for u, v in zip(whole, pieces):
        assert np.array_equal(u, v)
    # training rows taken in file order (to be scored) are keyed by their row
    rows = synthetic.draw(VARLEN, 10, synthetic.scored_keys(VARLEN, 10, "train", range(6)))
    assert np.array_equal(train[0], synthetic.sequences(VARLEN, 10, rows)[0])


# ----------------------------------------------------------------------------------------------
# the cache
# ----------------------------------------------------------------------------------------------

def test_the_cache_is_built_on_first_use_and_holds_the_keyed_rows(tmp_path, capsys):
    path = cache_path("adding", tmp_path, T=20)
    assert path == tmp_path / "adding-T20.h5" and not path.exists()
    with get_task("adding", data_dir=tmp_path, T=20) as t:
        x, y = next(t.batches("test", 50))
    assert "building" in capsys.readouterr().err and path.exists()
    stamp = path.stat().st_mtime_ns
    with get_task("adding", data_dir=tmp_path, T=20) as t:
        x2, y2 = next(t.batches("test", 50))
    assert path.stat().st_mtime_ns == stamp and "building" not in capsys.readouterr().err
    assert np.array_equal(x, x2) and np.array_equal(y, y2)
    keyed = synthetic.draw(ADDING, 20, synthetic.scored_keys(ADDING, 20, "test", range(50)))
    assert np.array_equal(x, synthetic.sequences(ADDING, 20, keyed)[0])
    with h5py.File(path) as f:
        assert (f.attrs["task"], f.attrs["T"], f["test/values"].shape) == (
            "adding", 20, (synthetic.EVAL_SIZE, 20))
    # another T is another file
    with get_task("adding", data_dir=tmp_path, T=21):
        pass
    assert (tmp_path / "adding-T21.h5").exists()


def _rewrite(path, name, change, fix_crc=True):
    with h5py.File(path, "r+") as f:
        data = f[name][:]
        change(data)
        f[name][...] = data
        if fix_crc:
            f[name].attrs["crc32"] = zlib.crc32(np.ascontiguousarray(data).tobytes())


@pytest.mark.parametrize("damage, reason", [
    (lambda p: _rewrite(p, "test/values", lambda v: v.__setitem__((0, 0), 0.5), False),
     "the contents of /test/values do not match their stored CRC-32"),
    (lambda p: _rewrite(p, "valid/markers", lambda m: m.__setitem__((0, 1), 0)),
     "/valid holds markers that are not one in each half"),
    (lambda p: _rewrite(p, "test/values", lambda v: v.__setitem__((3, 2), 1.5)),
     "/test holds values outside [0, 1)"),
    (lambda p: p.write_bytes(p.read_bytes()[:1000]), "truncated or corrupt"),
    (lambda p: h5py.File(p, "r+").attrs.__setitem__("T", 19), "its T is 19, expected 20"),
])
def test_a_damaged_cache_is_named_and_rebuilt_to_the_same_rows(tmp_path, capsys, damage, reason):
    with get_task("adding", data_dir=tmp_path, T=20) as t:
        before = next(t.batches("test", 1000))
    path = tmp_path / "adding-T20.h5"
    damage(path)
    assert reason in cache.check_cache(path, "adding", T=20)
    with get_task("adding", data_dir=tmp_path, T=20) as t:
        after = next(t.batches("test", 1000))
    assert "is not usable" in capsys.readouterr().err
    assert cache.check_cache(path, "adding", T=20) is None
    assert np.array_equal(before[0], after[0]) and np.array_equal(before[1], after[1])


def test_copy_and_varlen_caches_check_their_rows(tmp_path):
    for name, T, key, change, reason in (
            ("copy", 4, "test/symbols", lambda s: s.__setitem__((0, 0), 9), "symbols outside"),
            ("adding-varlen", 10, "valid/lengths", lambda n: n.__setitem__(0, 2), "lengths")):
        with get_task(name, data_dir=tmp_path, T=T):
            pass
        path = cache_path(name, tmp_path, T=T)
        assert cache.check_cache(path, name, T=T) is None
        _rewrite(path, key, change)
        assert reason in cache.check_cache(path, name, T=T)


# ----------------------------------------------------------------------------------------------
# bad settings: one line, naming what is allowed
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name, T, message", [
    ("adding", None, "task 'adding' needs T (--seq-len, the sequence length), an integer >= 2; "
                     "none was given"),
    ("adding", 1, "an integer >= 2; got T=1"),
    ("adding-varlen", 3, "task 'adding-varlen' needs T (--seq-len, the sequence length), an "
                         "integer >= 4; got T=3"),
    ("copy", 0, "task 'copy' needs T (--seq-len, the delay), an integer >= 1; got T=0"),
    ("mnist", 5, "only the tasks cifar10-noise, padded-mnist, mnist-noise, adding, "
                 "adding-varlen, copy take T"),
])
def test_a_bad_T_is_refused_before_any_work(tmp_path, name, T, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        get_task(name, data_dir=tmp_path, T=T)
    assert not list(tmp_path.iterdir())


def test_other_bad_settings_of_a_synthetic_task(tmp_path):
    with pytest.raises(ValueError, match=re.escape("valid_size=1001: task 'copy' has a "
                                                   "validation set of 1000 rows; choose "
                                                   "valid_size in [0, 1000]")):
        get_task("copy", data_dir=tmp_path, T=3, valid_size=1001)
    with pytest.raises(ValueError, match="task 'copy' has none: leave pixels at 'unit'"):
        get_task("copy", data_dir=tmp_path, T=3, pixels="standardised")


@pytest.mark.parametrize("args, status, expected", [
    (["train", "--task", "adding"], 1, ["task 'adding' needs T (--seq-len, the sequence "
                                        "length), an integer >= 2; none was given"]),
    (["train", "--task", "adding", "--T", "1"], 1, ["an integer >= 2; got T=1"]),
    (["train", "--task", "copy", "--seq-len", "0"], 2, ["--seq-len", "x>=1"]),
    (["train", "--task", "mnist", "--seq-len", "5"], 1, ["fixed length T = 784", "adding"]),
    (["data", "info", "--task", "copy"], 1, ["task 'copy' needs T (--seq-len, the delay)"]),
    (["data", "prepare", "--task", "mnist", "--seq-len", "5"], 2,
     ["--seq-len", "is for the synthetic tasks (adding, adding-varlen, copy)"]),
])
def test_bad_settings_on_the_command_line_are_one_line(tmp_path, args, status, expected):
    where = ["--data-dir", tmp_path]
    if args[0] == "train":
        where += ["--out", tmp_path / "run", "--no-progress"]
    one_line_error(invoke(*args, *where), status, *expected)
    assert not (tmp_path / "run").exists()


def test_data_info_describes_a_synthetic_task_and_builds_nothing(tmp_path):
    r = invoke("data", "info", "--task", "copy", "--seq-len", "100", "--data-dir", tmp_path)
    assert r.exit_code == 0, r.output
    assert "x float32 (B, T=120, m=10)" in r.output and "(the delay 100)" in r.output
    assert "readout every, loss xent, K=9" in r.output and "loss 0.1733" in r.output
    assert "build it with: python cli.py data prepare --task copy --seq-len 100" in r.output
    assert not list(tmp_path.iterdir())
    r = invoke("data", "prepare", "--task", "copy", "--seq-len", "100", "--data-dir", tmp_path)
    assert r.exit_code == 0 and (tmp_path / "copy-T100.h5").exists(), r.output
    r = invoke("data", "info", "--task", "copy", "--T", "100", "--data-dir", tmp_path, "--json")
    facts = json.loads(r.output)
    assert (facts["T"], facts["task_T"], facts["readout"], facts["cache"]["usable"]) == (
        120, 100, "every", True)


# ----------------------------------------------------------------------------------------------
# the run plumbing that needs no model: scoring, the results table, old run folders
# ----------------------------------------------------------------------------------------------

def test_score_counts_what_the_loss_counts():
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((3, 4, 5))
    y = np.array([[0, 1, -1, 2], [3, 3, 3, 3], [4, -1, -1, -1]])
    loss_sum, correct, count = training.score(logits, y, "xent", lengths=np.array([4, 2, 1]))
    kept = [(0, 0), (0, 1), (0, 3), (1, 0), (1, 1), (2, 0)]
    z = np.array([logits[b, t] for b, t in kept])
    labels = np.array([y[b, t] for b, t in kept])
    want = np.log(np.exp(z).sum(axis=1)) - z[np.arange(6), labels]
    assert count == 6 and loss_sum == pytest.approx(want.sum())
    assert correct == int((z.argmax(axis=1) == labels).sum())
    out, target = rng.standard_normal((5, 1)), rng.standard_normal((5, 1))
    assert training.score(out, target, "mse") == (
        pytest.approx(((out - target) ** 2).sum()), 0, 5)
    assert training.better(dict(loss=0.1), dict(loss=0.2), "mse")
    assert not training.better(dict(accuracy=0.5), dict(accuracy=0.6), "accuracy")
    assert training.zero_targets(dict(readout="every"), 3, 9).shape == (1, 3)
    assert training.zero_targets(dict(loss="mse"), 3, 1).shape == (1, 1)


def test_a_model_for_another_readout_or_loss_is_refused(tmp_path):
    model = SimpleNamespace(input_size=10, num_classes=9)
    with get_task("copy", data_dir=tmp_path, T=2) as task:
        training.check_task_fits(model, dict(readout="every"), task, "here")
        with pytest.raises(training.TrainError, match=re.escape(
                "task 'copy' (readout 'every') does not fit the model in here (readout "
                "'last')")):
            training.check_task_fits(model, {}, task, "here")


def _old_run(root, task, config=None, records=()):
    """A run folder as `results` reads it: config.json and metrics.jsonl (no checkpoint)."""
    d = root / f"{task}-run"
    d.mkdir(exist_ok=True)
    (d / "config.json").write_text(json.dumps(dict(model="antisym", task=task, **(config or {}))))
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return d


def test_results_report_each_task_by_its_metric(tmp_path):
    old = _old_run(tmp_path, "mnist", records=[
        dict(iteration=10, split="test", loss=2.0, accuracy=0.5)])
    adding = _old_run(tmp_path, "adding", dict(T=20, metric="mse", baseline=dict(loss=1 / 6)), [
        dict(iteration=10, split="test", loss=0.05, accuracy=None),
        dict(iteration=20, split="test", loss=0.01, accuracy=None),
        dict(iteration=30, split="test", loss=0.02, accuracy=None)])
    copy = _old_run(tmp_path, "copy", dict(T=100, metric="accuracy",
                                           baseline=COPY.baseline(100)), [
        dict(iteration=10, split="test", loss=0.17, accuracy=0.93)])
    rows = [analysis.run_summary(r) for r in analysis.read_runs([old, adding, copy])]
    assert (rows[0]["metric"], rows[0]["best"]) == ("accuracy", (10, 0.5))
    assert (rows[1]["last"], rows[1]["best"]) == ((30, 0.02), (20, 0.01))   # the lowest MSE
    table = output.results_table(rows)
    assert table[0][-1] == "baseline"
    assert table[1][-3:] == ("50.00% at 10", "50.00% at 10", "-")
    assert table[2][-3:] == ("MSE 0.02 at 30", "MSE 0.01 at 20", "MSE 0.1667")
    assert table[3][-1] == "92.71% (loss 0.1733)"
    r = invoke("results", old)                         # no baseline, no column
    assert r.exit_code == 0 and "baseline" not in r.output, r.output


def test_the_learning_curves_of_an_mse_run_have_no_accuracy_panel(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    from nprnn.study import plotting
    made = []
    figure = plotting._figure
    monkeypatch.setattr(plotting, "_figure", lambda **kw: made.append(figure(**kw)) or made[-1])
    run = _old_run(tmp_path, "adding", dict(T=20, loss="mse", metric="mse",
                                            baseline=dict(loss=1 / 6)),
                   [dict(iteration=10, split="train", loss=0.3, accuracy=None),
                    dict(iteration=10, split="test", loss=0.2, accuracy=None)])
    plotting.plot_learning_curves(analysis.read_runs([run]), tmp_path / "c.png")
    (ax,) = made[0].axes
    assert ax.get_ylabel() == "mean squared error"
    assert {ln.get_label(): list(ln.get_ydata()) for ln in ax.get_lines()} == {
        "train": [0.3], "test": [0.2], "without memory": [1 / 6, 1 / 6]}


def test_eval_words_follow_the_metric():
    r = dict(loss=0.0123, accuracy=None, count=1000, baseline=dict(loss=1 / 6))
    assert output.evaluation(r) == "MSE 0.0123 over 1,000 outputs; without memory: MSE 0.1667"
    r = dict(loss=0.05, accuracy=0.95, count=1200, readout="every",
             baseline=COPY.baseline(100))
    assert output.evaluation(r) == ("accuracy 0.9500 (1140/1200 steps), loss 0.0500; without "
                                    "memory: loss 0.1733, accuracy 0.9271")
    assert output.evaluation(dict(loss=0.3, accuracy=0.9, count=10)) == (
        "accuracy 0.9000 (9/10), loss 0.3000")


# ----------------------------------------------------------------------------------------------
# training on the synthetic tasks (the model's layers, readout and lengths)
# ----------------------------------------------------------------------------------------------

SMALL = ["--hidden", "8", "--batch-size", "4", "--eval-every", "3", "--log-every", "1",
         "--eps", "0.5", "--gamma", "0.1", "--no-progress"]


def test_train_eval_and_results_on_adding(tmp_path):
    out = tmp_path / "run"
    r = invoke("train", "--task", "adding", "--seq-len", "20", "--iterations", "3", *SMALL,
               "--data-dir", tmp_path, "--out", out)
    assert r.exit_code == 0, r.output + repr(r.exception)
    assert "final test MSE" in r.output
    config = json.loads((out / "config.json").read_text())
    assert {k: config[k] for k in ("T", "seq_len", "readout", "loss", "metric", "layers",
                                   "num_classes", "input_size")} == dict(
        T=20, seq_len=20, readout="last", loss="mse", metric="mse", layers=1, num_classes=1,
        input_size=2)
    assert config["baseline"] == dict(loss=1 / 6)
    assert load_checkpoint(out)["config"]["metric"] == "mse"
    test = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()
            if json.loads(line)["split"] == "test"]
    assert test[-1]["accuracy"] is None and test[-1]["count"] == synthetic.EVAL_SIZE
    r = invoke("eval", out)
    assert r.exit_code == 0, r.output
    assert re.search(r"MSE [0-9.e-]+ over 1,000 outputs; without memory: MSE 0.1667", r.output)
    r = invoke("results", out)
    assert r.exit_code == 0 and "MSE" in r.output and "baseline" in r.output, r.output


@pytest.mark.parametrize("task, T, layers", [("copy", 5, 1), ("adding-varlen", 12, 2)])
def test_train_on_copy_and_on_rows_of_their_own_length(tmp_path, task, T, layers):
    out = tmp_path / "run"
    r = invoke("train", "--task", task, "--seq-len", T, "--iterations", "3", "--layers", layers,
               *SMALL, "--data-dir", tmp_path, "--out", out, "--valid-size", "20")
    assert r.exit_code == 0, r.output + repr(r.exception)
    config = json.loads((out / "config.json").read_text())
    assert (config["readout"], config["layers"]) == (TASKS[task].readout, layers)
    r = invoke("eval", out, "--split", "valid")
    assert r.exit_code == 0, r.output
    if task == "copy":
        assert "/500 steps)" in r.output and "without memory: loss 0.8318" in r.output


def test_a_resumed_adding_run_is_bit_identical(tmp_path):
    config = dict(model="antisym", task="adding", T=10, hidden=8, eps=0.5, gamma=0.1,
                  batch_size=4, iterations=6, eval_every=100, checkpoint_every=2,
                  data_dir=str(tmp_path))
    quiet = dict(echo=lambda *a: None, progress=False)
    training.train(config, tmp_path / "whole", **quiet)
    training.train(dict(config, iterations=3), tmp_path / "half", **quiet)
    training.train(out=tmp_path / "half", resume=True, given=dict(iterations=6), **quiet)
    whole, half = (load_checkpoint(tmp_path / d)["params"] for d in ("whole", "half"))
    assert all(whole[k].tobytes() == half[k].tobytes() for k in whole)

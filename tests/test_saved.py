"""open_run, the one door to a saved run: what it reads of a folder, the model it rebuilds, and
the task it says a run was fed (nprnn/runs/saved.py). The commands that use it (eval, plot,
results, gates, jacobian, criticality, sweep report) are tested through the CLI elsewhere."""
import json

import numpy as np
import pytest

import nprnn
from nprnn.runs.checkpoint import CheckpointError, save_checkpoint
from nprnn.runs.saved import common_feed, open_run


def saved_run(folder, **config):
    """A run folder with a checkpoint of an antisym model (m = 1, n = 3, K = 10) whose config
    says it trained on pmnist, plus what `config` changes, and a config.json and log."""
    model = nprnn.make_model("antisym", 1, 3, 10, seed=1)
    config = dict(dict(model="antisym", task="pmnist", input_size=1, num_classes=10, hidden=3,
                       eps=0.01, gamma=0.01, sigma_w=1.0, init="paper", seed=1,
                       dtype="float32", device="cpu", T=None, perm_seed=3,
                       data_dir=str(folder / "data"), pixels="unit"), **config)
    folder.mkdir(parents=True)
    save_checkpoint(folder / "checkpoint.h5", model.params, dict(slots={}), config,
                    dict(iteration=7))
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "metrics.jsonl").write_text(
        '{"iteration": 5, "split": "train", "loss": 2.0, "accuracy": 0.1, "time": 1.5}\n'
        '{"iteration": 7, "split": "test", "loss": 1.0, "accuracy": 0.5}\n')
    return folder, model


def test_a_run_is_read_once_and_its_model_rebuilt(tmp_path):
    folder, model = saved_run(tmp_path / "r")
    run = open_run(folder)
    assert run.iteration == 7 and run.config["task"] == "pmnist"
    assert run.model.dtype == np.float64 and run.model is run.model        # read once
    for k, v in model.params.items():
        np.testing.assert_array_equal(run.model.params[k], v.astype(np.float64))
    assert open_run(folder, dtype=None).model.dtype == np.float32          # as trained
    assert [r["iteration"] for r in run.records] == [5, 7] and run.log[1] == 1.5


def test_what_a_run_was_fed_comes_from_its_checkpoint(tmp_path):
    folder, _ = saved_run(tmp_path / "r")
    run = open_run(folder)
    own = run.feed()
    assert (own.name, own.T, own.perm_seed, own.data_dir, own.pixels, own.own) == (
        "pmnist", None, 3, str(folder / "data"), "unit", True)
    other = run.feed("mnist", data_dir="elsewhere")      # another task: the default permutation
    assert (other.name, other.perm_seed, other.data_dir, other.own) == (
        "mnist", 0, "elsewhere", False)
    with pytest.raises(ValueError, match="task 'mnist-noise' has input size m=28, but .* input "
                                         "size m=1"):
        run.feed("mnist-noise")


def test_runs_compared_on_one_task_must_agree_on_its_permutation_and_pixels(tmp_path):
    a = open_run(saved_run(tmp_path / "a")[0])
    b = open_run(saved_run(tmp_path / "b", perm_seed=4)[0])
    c = open_run(saved_run(tmp_path / "c", pixels="standardised")[0])
    assert common_feed("pmnist", [a]).perm_seed == 3
    assert common_feed("mnist", [a]).perm_seed is None               # no permutation to choose
    assert common_feed("pmnist", [a], data_dir="d").data_dir == "d"
    with pytest.raises(ValueError, match="different permutations"):
        common_feed("pmnist", [a, b])
    with pytest.raises(ValueError, match="differently scaled pixels"):
        common_feed("mnist", [a, c])


def test_a_folder_that_mixes_two_runs_is_refused(tmp_path):
    folder, _ = saved_run(tmp_path / "r")
    (folder / "config.json").write_text(json.dumps(dict(model="lstm", task="pmnist")))
    with pytest.raises(CheckpointError, match="the folder mixes two runs"):
        open_run(folder).model


def test_a_log_cut_by_a_kill_is_refused_whole_and_read_so_far(tmp_path):
    folder, _ = saved_run(tmp_path / "r")
    with open(folder / "metrics.jsonl", "a") as f:
        f.write('{"iteration": 8, "spl')
    assert [r["iteration"] for r in open_run(folder).records_so_far()] == [5, 7]
    with pytest.raises(ValueError, match="line 3 is not valid JSON"):
        open_run(folder).records
    assert open_run(tmp_path / "none").records_so_far() == []

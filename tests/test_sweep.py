"""`sweep`: a grid or sampled search as an Optuna study, trials trained on Dask workers
(nprnn/sweep.py, cli.py's sweep commands). Local clusters of two workers on a toy task whose
label is the sign of the first input (a vanilla RNN learns it in a few dozen steps at lr 0.1,
not at all at lr 1e-6), and one end-to-end run of the CLI on fake MNIST."""
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("optuna", reason="the sweep extra is not installed (pip install -e "
                                     "'.[sweep]')")
pytest.importorskip("distributed", reason="the sweep extra is not installed (pip install -e "
                                          "'.[sweep]')")

import optuna                                                         # noqa: E402
from optuna.trial import TrialState                                   # noqa: E402

import fake_data as fd                                                # noqa: E402
from nprnn import sweep                                               # noqa: E402
from nprnn.data import sources  # noqa: E402
from nprnn.runs.checkpoint import load_checkpoint  # noqa: E402
from nprnn.data.datasets import ArrayTask, get_task  # noqa: E402
from nprnn.core.device import cuda_available  # noqa: E402
from nprnn.runs.train import RunLock, resolve_config  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
GOOD, BAD = 0.1, 1e-6                        # learning rates that learn the toy task, and not


def toy_task(T=4, n=400):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, T, 2))
    y = (x[:, 0, 0] > 0).astype(int)
    return ArrayTask("toy", x[:300], y[:300], x[300:], y[300:], num_classes=2, valid_size=100)


def toy_config(**kw):
    return resolve_config(**dict(dict(model="rnn", task="toy", hidden=8, batch_size=20,
                                      iterations=30, eval_every=10, log_every=10,
                                      checkpoint_every=10, valid_size=100), **kw))


def grid(*params):
    return sweep.make_space(params=[sweep.parse_param(p) for p in params])


def recorded(folder):
    """{trial number: (state, params)} of the study in `folder`."""
    spec, _, study = sweep.open_sweep(folder)
    return {t.number: (t.state, t.params) for t in study.get_trials()}


def lines(folder, number):
    return (sweep.trial_folder(folder, number) / "train.log").read_text()


@pytest.fixture
def one_worker():
    """The address of a Dask cluster of one worker thread in this process: for tests that run
    several sweeps in a row, each of which would otherwise start a cluster of its own (seconds
    for each worker process)."""
    from distributed import LocalCluster
    with LocalCluster(processes=False, n_workers=1, threads_per_worker=1,
                      dashboard_address=None) as cluster:
        yield cluster.scheduler_address


# ----------------------------------------------------------------------------------------------
# the space and bad input, before any trial
# ----------------------------------------------------------------------------------------------

def test_params_are_lists_or_ranges_of_the_options_kind():
    assert sweep.parse_param("lr=0.1,0.2, 0.1") == sweep.Param("lr", values=(0.1, 0.2))
    assert sweep.parse_param("optimizer=sgd,adagrad").values == ("sgd", "adagrad")
    assert sweep.parse_param("hidden=8,16").values == (8, 16)
    assert sweep.parse_param("pixels=unit,standardised").values == ("unit", "standardised")
    assert sweep.parse_param("sigma-w=0:16") == sweep.Param("sigma_w", low=0.0, high=16.0)
    assert sweep.parse_param("lr=0.01:1:log").log
    space = sweep.make_space("appendix-c", [sweep.parse_param("lr=0.5")])
    assert space["lr"].values == (0.5,) and space["gamma"].values == (0.001, 0.01, 0.1, 1.0)
    points = sweep.grid_points(sweep.make_space("appendix-c"), seed=0)
    assert len(points) == 1008 and len({tuple(sorted(p.items())) for p in points}) == 1008
    assert points != sweep.grid_points(sweep.make_space("appendix-c"), seed=1)


@pytest.mark.parametrize("text, match", [
    ("lr", "write NAME=v1,v2"),
    ("iterations=10,20", "'iterations' cannot be searched; searchable: lr"),
    ("lr=", "no values"),
    ("lr=0.1,fast", "'fast' is not a number"),
    ("hidden=8.5", "'8.5' is not an integer"),
    ("lr=1:0.1", "the range is empty"),
    ("lr=0:1:log", "a log range needs LOW > 0"),
    ("optimizer=a:b", "a range is LOW:HIGH or LOW:HIGH:log, and only for the number options"),
])
def test_a_bad_param_is_named(text, match):
    with pytest.raises(sweep.SweepError, match=match):
        sweep.parse_param(text)


@pytest.mark.parametrize("fixed, space, sampler, trials, match", [
    (dict(model="lstm"), "eps=0.1,1", "grid", None,
     "eps = 0.1 would be refused by every trial that runs it: model 'lstm' has no "
     "hyperparameter 'eps'"),
    ({}, "lr=0.1,-1", "grid", None, "lr = -1.0 would be refused .* lr must be a finite number > 0"),
    ({}, "gate_bias=0,1", "grid", None, "gate_bias = 1.0 would be refused .* model 'rnn' has "
                                        "none: leave gate_bias at 0"),
    ({}, "pixels=unit,z", "grid", None, "pixels = 'z' would be refused .* pixels must be one of "
                                        "unit, standardised"),
    ({}, "lr=0.1:1", "grid", None, "the grid sampler needs lists of values; lr is a range"),
    ({}, "lr=0.1:1", "tpe", None, "--sampler tpe needs --trials"),
    (dict(valid_size=0), "lr=0.1", "grid", None, "--valid-size must be > 0"),
    (dict(iterations=0), "lr=0.1", "grid", None, "--iterations must be at least 1"),
    ({}, "momentum=0.5,0.9", "grid", None, None),
])
def test_a_space_that_runs_would_refuse_is_refused_before_any_trial(tmp_path, fixed, space,
                                                                    sampler, trials, match):
    params = [sweep.parse_param(space)]
    if match is None:                    # momentum with adagrad in the space: refused
        params.append(sweep.parse_param("optimizer=sgd,adagrad"))
        match = "momentum is SGD's alone"
    with pytest.raises(sweep.SweepError, match=match):
        sweep.open_sweep(tmp_path / "s", toy_config(**fixed), sweep.make_space(params=params),
                         sampler, trials, task=toy_task())
    assert not (tmp_path / "s").exists()


def test_a_param_given_twice_is_refused():
    with pytest.raises(sweep.SweepError, match=r"--param lr is given more than once: give all "
                                               r"its values in one, --param lr=v1,v2,..."):
        sweep.make_space("appendix-c", [sweep.parse_param("lr=0.1"),
                                        sweep.parse_param("lr=0.2,0.3")])


def test_a_task_scored_by_its_mse_is_refused_before_any_trial(tmp_path):
    """A sweep ranks trials by validation accuracy; the adding problem has none."""
    with pytest.raises(sweep.SweepError, match=r"^task adding is scored by its MSE, and a sweep "
                                               r"chooses trials by validation accuracy"):
        sweep.open_sweep(tmp_path / "s", toy_config(task="adding", T=4, data_dir=str(tmp_path),
                                                    valid_size=50), grid("lr=0.1"), "grid")
    assert not (tmp_path / "s").exists()


def test_a_named_task_that_trials_could_not_load_is_refused_before_any_trial(tmp_path,
                                                                           fake_mnist_dir):
    """The task a sweep names is loaded (its cache built if need be) when the sweep is made:
    a validation split as large as the training set, or data that is not there, is one error
    then, not a failure of every trial."""
    fixed = dict(task="mnist-noise", T=28, data_dir=str(fake_mnist_dir))
    with pytest.raises(sweep.SweepError, match=r"^task mnist-noise: valid_size=300 leaves no "
                                               r"training examples: the training set has 300"):
        sweep.open_sweep(tmp_path / "s", toy_config(**fixed, valid_size=300), grid("lr=0.1"),
                         "grid")
    with pytest.raises(sweep.SweepError, match=r"^task mnist-noise: fake MNIST: .* not found in "):
        sweep.open_sweep(tmp_path / "s", toy_config(**dict(fixed, data_dir=str(tmp_path / "no")),
                                                    valid_size=50),
                         grid("lr=0.1"), "grid")
    assert not (tmp_path / "s").exists()
    spec, _, _ = sweep.open_sweep(tmp_path / "s", toy_config(**fixed, valid_size=50),
                                  grid("lr=0.1"), "grid")
    assert spec["fixed"]["task"] == "mnist-noise"


def test_a_folder_holding_another_study_or_none_is_refused(tmp_path):
    folder, task = tmp_path / "s", toy_task()
    sweep.open_sweep(folder, toy_config(), grid("lr=0.1,0.2"), "grid", task=task)
    with pytest.raises(sweep.SweepError, match=r"holds another study \(lr: 0.1,0.2 there, "
                                               r"0.1,0.3 given\): continue it with `sweep run "
                                               r"--out .*` alone"):
        sweep.open_sweep(folder, toy_config(), grid("lr=0.1,0.3"), "grid", task=task)
    spec, _, study = sweep.open_sweep(folder, toy_config(), grid("lr=0.1,0.2"), "grid",
                                      task=task)              # the same definition: continued
    assert len(study.get_trials(states=(TrialState.WAITING,))) == 2
    with pytest.raises(sweep.SweepError, match="is not a sweep folder: it has no sweep.json"):
        sweep.open_sweep(tmp_path)
    (folder / "study.journal").rename(tmp_path / "moved")
    with pytest.raises(sweep.SweepError, match="has sweep.json but no study.journal, the record "
                                               "of its trials"):
        sweep.open_sweep(folder)
    assert not (folder / "study.journal").exists()


def test_a_storage_or_scheduler_that_cannot_be_reached_is_named(tmp_path, monkeypatch):
    monkeypatch.setattr(sweep.workers, "CONNECT_SECONDS", 1)
    with pytest.raises(sweep.SweepError, match="cannot open the study storage "
                                               "sqlite:////no/such/folder/x.db"):
        sweep.open_sweep(tmp_path / "s", toy_config(), grid("lr=0.1"), "grid",
                         storage="sqlite:////no/such/folder/x.db", task=toy_task())
    for address, says in [("foo", "'foo' is not an address of the form tcp://HOST:PORT"),
                          ("tcp://:", "'tcp://:' is not an address of the form"),
                          ("abc://h:1", "unknown address scheme 'abc'")]:
        with pytest.raises(sweep.SweepError, match=f"cannot reach the Dask scheduler at "
                                                   f"{re.escape(address)}: {re.escape(says)}"):
            sweep.run(tmp_path / "t", toy_config(), grid("lr=0.1"), "grid", scheduler=address,
                      task=toy_task())
    with pytest.raises(sweep.SweepError, match="cannot reach the Dask scheduler at "
                                               "tcp://127.0.0.1:9"):
        sweep.run(tmp_path / "t", toy_config(), grid("lr=0.1"), "grid",
                  scheduler="tcp://127.0.0.1:9", task=toy_task())
    if not cuda_available()[0]:
        with pytest.raises(sweep.SweepError, match="device 'cuda' was requested but no GPU"):
            sweep.run(tmp_path / "u", toy_config(device="cuda"), grid("lr=0.1"), "grid",
                      task=toy_task())
        assert not (tmp_path / "u").exists()


# ----------------------------------------------------------------------------------------------
# sweeps on local clusters
# ----------------------------------------------------------------------------------------------

def test_a_grid_on_two_workers_records_every_point_once_and_reports_it(tmp_path, capsys):
    folder = tmp_path / "s"
    said, statuses = [], []
    result = sweep.run(folder, toy_config(), grid(f"lr={GOOD},{BAD}", "hidden=4,8"), "grid",
                       workers=2, task=toy_task(), echo=said.append, progress=statuses.append)
    assert result == dict(done=4, total=4, complete=True, stopped=False)
    # the status after each trial (and every few seconds): done, running, the best so far
    assert [s["done"] for s in statuses] == sorted(s["done"] for s in statuses)
    assert statuses[-1]["done"] == 4 and statuses[-1]["total"] == 4
    assert (statuses[-1]["pruned"], statuses[-1]["failed"]) == (0, 0)
    assert all(0 <= s["running"] <= 2 for s in statuses)
    trials = recorded(folder)
    assert len(trials) == 4 and all(state == TrialState.COMPLETE for state, _ in trials.values())
    assert {tuple(sorted(p.items())) for _, p in trials.values()} == {
        (("hidden", h), ("lr", lr)) for h in (4, 8) for lr in (GOOD, BAD)}
    assert sum("complete, iteration 30, best valid" in line for line in said) == 4
    for number, (_, params) in trials.items():         # each an ordinary run folder
        run = sweep.trial_folder(folder, number)
        config = json.loads((run / "config.json").read_text())
        assert config["lr"] == params["lr"] and config["hidden"] == params["hidden"]
        assert load_checkpoint(run / "best.h5")["progress"]["iteration"] in (10, 20, 30)

    said.clear()
    rows = sweep.report(folder, echo=said.append)
    table = said[1:]
    assert table[0].split() == ["trial", "hidden", "lr", "state", "iteration", "best", "valid",
                                "test"]
    assert len(rows) == 4 and sum(r["chosen"] for r in rows) == 1
    chosen = next(r for r in rows if r["chosen"])
    assert chosen["params"]["lr"] == GOOD and chosen["valid"] > 0.8
    assert statuses[-1]["best"] == chosen["valid"]
    assert chosen["test"] is not None and table[1].lstrip().startswith("*")
    assert any(s.startswith(f"chosen on validation: trial {chosen['number']}") for s in said)
    full = said.index("to train it to 50,000 iterations on the whole training set, one run per "
                      "seed:")
    for seed, line in enumerate(said[full + 1:full + 3]):  # the chosen point, no validation split
        assert line == ("  python cli.py train --model rnn --task toy --hidden "
                        f"{chosen['params']['hidden']} --lr {GOOD} --batch-size 20 --iterations "
                        f"50000 --seed {seed} --out runs/s-s{seed}")   # the sweep's cadence: no
    assert said[said.index("started, by value (of the points queued with it), best validation "
                           "accuracy:") + 1].startswith("  hidden: 4: 2 of 2, best ")
    assert f"  lr: {GOOD:g}: 2 of 2, best {chosen['valid']:.4f}; {BAD:g}: 2 of 2, best " in said[-2]
    png = folder / "sweep.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_report_says_what_each_value_covered_and_groups_failures_by_cause():
    spec = dict(sampler="grid", trials=6, sampler_seed=0, space=dict(
        eps=dict(values=[0.01, 1.0]), lr=dict(values=[0.1, 0.2, 0.3])))
    grad = ("the gradient is not finite at iteration 1 (loss {}, gradient norm nan); training "
            "stopped before applying that step. Try a lower learning rate")

    def row(number, eps, lr, state, valid=None, error=None):
        return dict(number=number, params=dict(eps=eps, lr=lr), state=state, valid=valid,
                    error=error)

    rows = [row(0, 0.01, 0.1, "complete", 0.9), row(1, 0.01, 0.2, "pruned", 0.5),
            row(3, 1.0, 0.3, "fail", error=grad.format(222.3)),
            row(2, 1.0, 0.1, "fail", error=grad.format(19.8)),
            row(4, 1.0, 0.2, "fail", error="the loss is not finite at iteration 7")]
    assert sweep.coverage(spec, rows) == [
        "started, by value (of the points queued with it), best validation accuracy:",
        "  eps: 0.01: 2 of 3, best 0.9000; 1: 3 of 3, all failed",
        "  lr: 0.1: 2 of 2, best 0.9000; 0.2: 2 of 2, best 0.5000; 0.3: 1 of 2, all failed"]
    # --trials 2 of the grid: the values of the first two points of its order are all there is
    first = sweep.grid_points({n: sweep.Param.from_json(n, d) for n, d in spec["space"].items()},
                              0)[:2]
    queued = [sum(p["eps"] == v for p in first) for v in (0.01, 1.0)]
    assert sweep.coverage(dict(spec, trials=2), rows)[1] == (
        f"  eps: 0.01: 2 of {queued[0]}, best 0.9000; 1: 3 of {queued[1]}, all failed")
    assert [(cause, [r["number"] for r in group]) for cause, group in sweep._failures(rows)] == [
        ("the gradient is not finite at iteration 1", [2, 3]),
        ("the loss is not finite at iteration 7", [4])]
    sampled = dict(spec, sampler="tpe", space=dict(spec["space"], lr=dict(low=0.1, high=1.0,
                                                                          log=True)))
    assert sweep.coverage(sampled, rows) == [
        "started, by value, best validation accuracy:",
        "  eps: 0.01: 2, best 0.9000; 1: 3, all failed"]


@pytest.mark.parametrize("sampler", ["random", "tpe"])
def test_sampled_points_of_a_range_run_as_many_trials_as_asked(tmp_path, sampler, one_worker):
    folder = tmp_path / "s"
    result = sweep.run(folder, toy_config(iterations=10), grid("lr=0.01:0.5:log", "hidden=4,8"),
                       sampler, trials=3, scheduler=one_worker, task=toy_task(),
                       echo=lambda s: None)
    assert result == dict(done=3, total=3, complete=True, stopped=False)
    trials = recorded(folder)
    assert len(trials) == 3 and all(s == TrialState.COMPLETE for s, _ in trials.values())
    lrs = [p["lr"] for _, p in trials.values()]
    assert all(0.01 <= lr <= 0.5 for lr in lrs) and len(set(lrs)) == 3
    assert all(p["hidden"] in (4, 8) for _, p in trials.values())
    rows = sweep.report(folder, echo=lambda s: None)
    assert sorted(r["params"]["lr"] for r in rows) == sorted(lrs)
    assert (folder / "sweep.png").is_file()
    again = sweep.run(folder, scheduler=one_worker, task=toy_task(), echo=lambda s: None)
    assert again["done"] == 3 and len(recorded(folder)) == 3      # nothing more to run


def test_a_sampled_sweep_continued_draws_new_points(tmp_path, one_worker):
    """The sampler is seeded by the sampler seed and the trials drawn so far, so a sweep stopped
    after one trial and continued does not draw its first point again."""
    folder, said = tmp_path / "s", []
    space = grid("lr=0.01:0.5:log")
    first = sweep.run(folder, toy_config(iterations=10), space, "random", trials=2,
                      scheduler=one_worker, task=toy_task(), echo=said.append,
                      stop=lambda: len(said) > 1)
    assert first["done"] == 1 and first["stopped"]
    sweep.run(folder, scheduler=one_worker, task=toy_task(), echo=lambda s: None)
    lrs = [p["lr"] for _, p in recorded(folder).values()]
    assert len(lrs) == 2 and lrs[0] != lrs[1]


def test_enqueued_points_run_first_and_count_among_the_trials(tmp_path, one_worker):
    """--enqueue: the points given run before any the sampler draws, once each (a point the
    study has already is not enqueued again, on a new study or a continued one), within
    --trials."""
    folder, said = tmp_path / "s", []
    space = grid("lr=0.01:0.5:log", "optimizer=sgd,adagrad")
    result = sweep.run(folder, toy_config(iterations=10), space, "tpe", trials=3,
                       scheduler=one_worker, task=toy_task(), echo=said.append,
                       enqueue_points=["lr=0.3,optimizer=adagrad", "optimizer=sgd, lr=0.02",
                                       "lr=0.3,optimizer=adagrad"])
    assert result["complete"] and result["done"] == 3
    trials = recorded(folder)
    assert [trials[0][1], trials[1][1]] == [dict(lr=0.3, optimizer="adagrad"),
                                           dict(lr=0.02, optimizer="sgd")]
    assert trials[2][1] not in (trials[0][1], trials[1][1])        # drawn by TPE
    assert said[:3] == ["trial 0 enqueued: lr 0.3, optimizer adagrad",
                         "trial 1 enqueued: optimizer sgd, lr 0.02",
                         "not enqueued, the study has this point already: lr 0.3, optimizer "
                         "adagrad"]
    with pytest.raises(sweep.SweepError, match="the study has room for 0 more of its 3 trials"):
        sweep.run(folder, scheduler=one_worker, task=toy_task(), echo=lambda s: None,
                  enqueue_points=["lr=0.1,optimizer=sgd"])


@pytest.mark.parametrize("text, match", [
    ("lr=0.3", "give optimizer too"),
    ("lr=0.3,optimizer=adam", "optimizer=adam is not one of the searched values sgd, adagrad"),
    ("lr=0.9,optimizer=sgd", r"lr=0.9 is outside the searched range \[0.01, 0.5\]"),
    ("lr=0.3,optimizer=sgd,hidden=4", "'hidden' is not searched by this sweep; it searches lr, "
                                      "optimizer"),
    ("lr=0.3,lr=0.2,optimizer=sgd", "lr is given twice"),
    ("lr=fast,optimizer=sgd", "--enqueue lr: 'fast' is not a number"),
    ("lr 0.3", "write NAME=VALUE,NAME=VALUE,... for lr, optimizer"),
])
def test_a_bad_enqueued_point_is_refused_before_the_sweep_is_made(tmp_path, text, match):
    with pytest.raises(sweep.SweepError, match=match):
        sweep.run(tmp_path / "s", toy_config(), grid("lr=0.01:0.5:log", "optimizer=sgd,adagrad"),
                  "tpe", trials=3, task=toy_task(), enqueue_points=[text])
    assert not (tmp_path / "s").exists()


def test_enqueue_is_refused_for_a_grid_and_beyond_the_trials(tmp_path):
    with pytest.raises(sweep.SweepError, match="--enqueue is for the random and tpe samplers"):
        sweep.run(tmp_path / "s", toy_config(), grid("lr=0.1,0.2"), "grid", task=toy_task(),
                  enqueue_points=["lr=0.1"])
    with pytest.raises(sweep.SweepError, match="--enqueue gives 2 points, more than --trials 1"):
        sweep.run(tmp_path / "s", toy_config(), grid("lr=0.1,0.2"), "random", trials=1,
                  task=toy_task(), enqueue_points=["lr=0.1", "lr=0.2"])
    assert not (tmp_path / "s").exists()


def test_a_point_drawn_again_takes_its_twins_result_without_training(tmp_path):
    """Four random draws from two points: each point drawn again is recorded as the trial that
    ran it was (state, validation accuracies, test accuracy), and gets no run folder."""
    folder, said = tmp_path / "s", []
    sweep.run(folder, toy_config(iterations=20), grid(f"lr={GOOD},{BAD}"), "random", trials=4,
              workers=1, task=toy_task(), echo=said.append)
    _, _, study = sweep.open_sweep(folder)
    trials = study.get_trials()
    assert len(trials) == 4 and all(t.state == TrialState.COMPLETE for t in trials)
    ran = {}
    for t in trials:
        twin = ran.setdefault(t.params["lr"], t)
        assert sweep.trial_folder(folder, t.number).is_dir() == (twin is t)
        if twin is not t:
            assert (t.value, t.intermediate_values, t.user_attrs["test_accuracy"]) == (
                twin.value, twin.intermediate_values, twin.user_attrs["test_accuracy"])
            assert any(line.startswith(f"trial {t.number} ") and
                       f"the point of trial {twin.number} again" in line for line in said)
    assert len(ran) < 4
    rows = sweep.trial_rows(folder)[1]
    assert all(r["iteration"] == 20 for r in rows)
    twins = sorted((t.number, ran[t.params["lr"]].number) for t in trials
                   if ran[t.params["lr"]] is not t)
    report = []
    sweep.report(folder, echo=report.append)
    assert ("points drawn again, given the result of the trial that ran them (not trained "
            "again): " + ", ".join(f"trial {n} = trial {m}" for n, m in twins)) in report


class Scripted(optuna.samplers.BaseSampler):
    """A sampler that draws the given points in turn, and keeps what each draw saw of the study:
    {trial number: (state, intermediate values)}."""

    def __init__(self, *points):
        self.points, self.seen = list(points), []

    def before_trial(self, study, trial):
        self.seen.append({t.number: (t.state, t.intermediate_values)
                          for t in study.get_trials(deepcopy=False) if t.number != trial.number})

    def infer_relative_search_space(self, study, trial):
        return {}

    def sample_relative(self, study, trial, search_space):
        return {}

    def sample_independent(self, study, trial, name, distribution):
        return self.points[len(self.seen) - 1][name]


def test_tpe_draws_seeing_unfinished_evaluated_trials_as_pruned_there(monkeypatch):
    """A trial paused at a rung (RUNNING, evaluated) counts as pruned at its last evaluation,
    as TPE ranks pruned trials, not as a running one (Optuna's constant liar would count it among
    the worst); one not yet evaluated stays running. A point the study holds, finished or not,
    is drawn again."""
    space = {"lr": optuna.distributions.CategoricalDistribution((0.1, 0.2, 0.3, 0.4))}
    study = optuna.create_study(direction="maximize")
    study.add_trial(optuna.trial.create_trial(state=TrialState.PRUNED, params={"lr": 0.1},
                                              distributions=space, intermediate_values={10: .5}))
    for lr, values in ((0.2, {10: 0.8, 30: 0.9}), (0.3, {})):          # paused; training
        study.add_trial(optuna.trial.create_trial(state=TrialState.RUNNING, params={"lr": lr},
                                                  distributions=space, intermediate_values=values))
    scripted = Scripted({"lr": 0.2}, {"lr": 0.1}, {"lr": 0.3}, {"lr": 0.4})
    monkeypatch.setattr(sweep.study, "make_sampler", lambda spec, drawn: scripted)
    kept = study.sampler
    trial = sweep.draw(study, dict(sampler="tpe"), space)
    assert scripted.seen[0] == {0: (TrialState.PRUNED, {10: 0.5}),
                                1: (TrialState.PRUNED, {10: 0.8, 30: 0.9}),
                                2: (TrialState.RUNNING, {})}
    # each point drawn in vain stays in the view, running (the view's trials 3, 4 and 5)
    assert [len(seen) for seen in scripted.seen[:4]] == [3, 4, 5, 6]
    assert all(seen[n][0] == TrialState.RUNNING for seen in scripted.seen[1:4] for n in seen
               if n >= 3)
    assert trial.params == {"lr": 0.4} and trial.number == 3
    assert study.get_trials()[1].state == TrialState.RUNNING       # the study is not changed
    assert study.sampler is kept                                   # nor its sampler


def test_a_trial_that_has_trained_goes_on_though_its_twin_finished(tmp_path, one_worker):
    """Trial 0 stopped with a checkpoint (paused at the first rung, alone there while trial 1
    is to be drawn) and held by a driver elsewhere; trial 1, drawn at its point meanwhile,
    trains and completes. Trial 0, taken over then, resumes from its checkpoint and trains to
    the end: it does not take trial 1's result."""
    folder, task, said = tmp_path / "s", toy_task(), []
    first = sweep.run(folder, toy_config(iterations=20), grid(f"lr={GOOD}"), "random",
                      trials=2, prune=True, scheduler=one_worker, task=task, echo=said.append,
                      stop=lambda: any(": paused" in line for line in said))
    assert first["stopped"] and list(recorded(folder)) == [0] and _saved_iteration(
        sweep.trial_folder(folder, 0)) == 10
    spec, store, _ = sweep.open_sweep(folder)
    tid = store.get_trial_id_from_study_id_trial_number(
        store.get_study_id_from_name(spec["study"]), 0)
    store.set_trial_user_attr(tid, "driver", "elsewhere:1:x")          # alive, not this host's
    store.set_trial_user_attr(tid, "heartbeat", time.time())
    sweep.run(folder, scheduler=one_worker, task=task, echo=lambda s: None)
    assert {n: s for n, (s, _) in recorded(folder).items()} == {0: TrialState.RUNNING,
                                                               1: TrialState.COMPLETE}
    store.set_trial_user_attr(tid, "driver", "")                        # released
    said = []
    assert sweep.run(folder, scheduler=one_worker, task=task, echo=said.append)["complete"]
    _, _, study = sweep.open_sweep(folder)
    t0, t1 = study.get_trials()
    assert t0.state == TrialState.COMPLETE and "twin_of" not in t0.user_attrs
    assert "resuming rnn on toy" in lines(folder, 0)
    assert "final test accuracy after 20 iterations" in lines(folder, 0)
    assert not any("the point of trial" in line for line in said)


def test_pruning_stops_a_trial_that_trails_at_the_first_evaluation(tmp_path):
    """Successive halving, one worker: the good learning rate runs first (the grid's order for
    sampler seed 0 is checked), so the bad one is below it at the first rung and is stopped
    there, with its checkpoint; the study records it as pruned."""
    space = grid(f"lr={GOOD},{BAD}")
    order = [p["lr"] for p in sweep.grid_points(space, seed=0)]
    assert order == [GOOD, BAD]
    folder = tmp_path / "s"
    said = []
    sweep.run(folder, toy_config(iterations=40), space, "grid", prune=True, workers=1,
              task=toy_task(), echo=said.append)
    trials = recorded(folder)
    assert [(s, p["lr"]) for s, p in trials.values()] == [(TrialState.COMPLETE, GOOD),
                                                           (TrialState.PRUNED, BAD)]
    assert "stopped by the sweep's pruner at iteration 10" in lines(folder, 1)
    assert any(line.startswith(f"trial 1 (lr={BAD:g}): pruned, iteration 10") for line in said)


def test_a_trial_alone_at_a_rung_pauses_until_it_can_be_judged(tmp_path):
    """One worker, the bad learning rate first: it reaches the first rung alone and pauses
    there while the good one runs (a verdict then would let it go on to the end); judged once
    no other trial can reach the rung, it is pruned there. The good one, alone at the second
    rung while the bad one is below it, pauses too, then goes on and completes."""
    space = grid(f"lr={GOOD},{BAD}")
    seed = next(s for s in range(50)
                if [p["lr"] for p in sweep.grid_points(space, seed=s)] == [BAD, GOOD])
    folder, said, reported = tmp_path / "s", [], []

    def echo(line):
        said.append(line)
        if line.startswith("trial 0") and "paused" in line:          # what the report says then
            reported.extend((r["number"], r["state"]) for r in sweep.trial_rows(folder)[1])
    sweep.run(folder, toy_config(iterations=40), space, "grid", prune=True, seed=seed,
              workers=1, task=toy_task(), echo=echo)
    assert reported == [(0, "paused")]
    trials = recorded(folder)
    assert [(s, p["lr"]) for s, p in trials.values()] == [(TrialState.PRUNED, BAD),
                                                           (TrialState.COMPLETE, GOOD)]
    pause = "stopped by the sweep (waiting for other trials at this rung) at iteration"
    assert f"{pause} 10" in lines(folder, 0) and f"{pause} 30" in lines(folder, 1)
    assert [line.split(",")[0:2] for line in said[1:]] == [             # after the header
        [f"trial 0 (lr={BAD:g}): paused", " iteration 10"],
        [f"trial 1 (lr={GOOD:g}): paused", " iteration 30"],
        [f"trial 0 (lr={BAD:g}): pruned", " iteration 10"],
        [f"trial 1 (lr={GOOD:g}): complete", " iteration 40"]]


def test_a_trial_folder_left_without_a_checkpoint_starts_afresh(tmp_path):
    """A trial killed while its kernels compiled left config.json and metrics.jsonl but no
    checkpoint: its rerun starts the run afresh (train would refuse the folder)."""
    folder, task = tmp_path / "s", toy_task()
    sweep.open_sweep(folder, toy_config(), grid(f"lr={GOOD}"), "grid", task=task)
    run = sweep.trial_folder(folder, 0)
    run.mkdir(parents=True)
    (run / "config.json").write_text("{}")
    (run / "metrics.jsonl").write_text('{"iteration": 0}\n')
    assert sweep.run(folder, workers=1, task=task, echo=lambda s: None)["complete"]
    assert [s for s, _ in recorded(folder).values()] == [TrialState.COMPLETE]
    assert json.loads((run / "config.json").read_text())["lr"] == GOOD


def test_a_trial_whose_folder_another_process_holds_is_tried_again(tmp_path, monkeypatch):
    """The trial's run folder locked by another process (a driver elsewhere still training it):
    the worker says busy, the driver tries it again later, and it is recorded once."""
    monkeypatch.setattr(sweep.workers, "RETRY_SECONDS", 1)
    folder, task = tmp_path / "s", toy_task()
    sweep.open_sweep(folder, toy_config(), grid(f"lr={GOOD}"), "grid", task=task)
    lock = RunLock(sweep.trial_folder(folder, 0))
    lock.__enter__()
    said = []

    def echo(line):              # the other process lets go once the worker has found it busy
        said.append(line)
        if ": busy" in line and not any(": busy" in s for s in said[:-1]):
            lock.__exit__(None, None, None)
    assert sweep.run(folder, workers=1, task=task, echo=echo)["complete"]
    states = [line.split(": ")[1].split(",")[0] for line in said[1:]]
    assert states[0] == "busy" and states[-1] == "complete" and set(states) == {"busy",
                                                                               "complete"}
    assert [s for s, _ in recorded(folder).values()] == [TrialState.COMPLETE]


def _wait_for(condition, timeout=120, what="the condition"):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _saved_iteration(run):
    try:
        return load_checkpoint(run / "checkpoint.h5")["progress"]["iteration"]
    except Exception:
        return 0


PROBE_WORKER = """
import json
import numba, numpy as np                    # imported by the main module, as cli.py does:
from distributed import Client               # the workers import it again before their nanny
from nprnn import sweep                      # sets their environment

def trial_like(threads):
    sweep.share_cores(threads)                                  # as run_trial starts

    @numba.njit(parallel=True)              # new: compiled on the worker, not read from a cache
    def total(a):
        s = 0.0
        for i in numba.prange(a.size):
            s += a[i]
        return s

    return total(np.ones(100)), numba.get_num_threads()

if __name__ == "__main__":
    cluster, threads = sweep.local_cluster("cpu", workers=2)
    with cluster, Client(cluster) as client:
        total, used = client.submit(trial_like, threads, pure=False).result(timeout=120)
        print(json.dumps(dict(total=total, used=used, share=threads)))
"""


def test_a_local_workers_trial_compiles_kernels_with_its_share_of_the_cores(tmp_path):
    """A kernel compiled on a local cluster's worker, after its numba threads started, compiles
    and runs on the worker's share of the cores. (Workers given NUMBA_NUM_THREADS by the nanny,
    which sets it after their Python has imported numba through cli.py, failed every trial
    whose kernels were not yet in numba's cache: numba refused to compile.)"""
    script = tmp_path / "probe.py"
    script.write_text(PROBE_WORKER)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("NUMBA_NUM_THREADS", None)
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout)
    assert got["total"] == 100.0 and got["used"] == got["share"] >= 1


@pytest.mark.slow
def test_a_worker_killed_mid_trial_is_resumed_and_recorded_once(tmp_path):
    """kill -9 of the worker training a trial: Dask runs the trial again on a worker (the
    nanny's new one, or the other), which resumes it from its checkpoint. (About 1,200
    iterations a second here: trial 0 is still running when the kill comes, on a loaded machine
    too.)"""
    from distributed import Client
    folder, task = tmp_path / "s", toy_task(T=30)
    cluster, _ = sweep.local_cluster("cpu", workers=2)
    client = Client(cluster)
    try:
        result = {}
        driver = threading.Thread(target=lambda: result.update(sweep.run(
            folder, toy_config(iterations=10000, hidden=32, checkpoint_every=500, eval_every=2500),
            grid(f"lr={GOOD},0.05"), "grid", scheduler=cluster.scheduler_address, task=task,
            echo=lambda s: None)))
        driver.start()
        run = sweep.trial_folder(folder, 0)
        _wait_for(lambda: _saved_iteration(run) >= 500, what="trial 0's checkpoint")
        processing = client.processing()
        worker = next(w for w, keys in processing.items()          # keys: trial-STUDY-0-ID
                      if any(re.search(r"-0-[0-9a-f]{8}$", k) for k in keys))
        pid = client.run(os.getpid, workers=[worker])[worker]
        os.kill(pid, signal.SIGKILL)
        driver.join(timeout=400)
        assert not driver.is_alive() and result["complete"]
    finally:
        client.close()
        cluster.close()
    trials = recorded(folder)
    assert len(trials) == 2 and all(s == TrialState.COMPLETE for s, _ in trials.values())
    log = lines(folder, 0)
    assert "resuming rnn on toy" in log and "final test accuracy after 10000 iterations" in log


@pytest.mark.slow
def test_a_stopped_sweep_continues_where_it_stopped(tmp_path):
    """A driver asked to stop once trial 0 has a checkpoint: the trials in flight checkpoint
    and stop, and are released; `run` again (with the folder alone: the study as recorded)
    takes them over, resumes them, runs the rest, and every point is recorded once."""
    folder, task = tmp_path / "s", toy_task(T=30)
    config = toy_config(iterations=10000, hidden=32, checkpoint_every=500, eval_every=2500)
    first = sweep.run(folder, config, grid(f"lr={GOOD},0.05,0.02"), "grid", workers=2,
                      task=task, echo=lambda s: None,
                      stop=lambda: _saved_iteration(sweep.trial_folder(folder, 0)) >= 500)
    assert first["stopped"] and not first["complete"]
    running = [n for n, (s, _) in recorded(folder).items() if s == TrialState.RUNNING]
    assert 0 in running
    said = []
    rows = sweep.report(folder, echo=said.append)       # released by their driver: stopped
    assert sorted(r["number"] for r in rows if r["state"] == "stopped") == running
    assert (f"{'trials' if len(running) > 1 else 'trial'} {', '.join(map(str, running))} left "
            f"unfinished: `sweep run --out {folder}` resumes") in "\n".join(said)
    said = []
    second = sweep.run(folder, workers=2, task=task, echo=said.append)
    assert second == dict(done=3, total=3, complete=True, stopped=False)
    trials = recorded(folder)
    assert len(trials) == 3 and all(s == TrialState.COMPLETE for s, _ in trials.values())
    assert said[1] == (f"taking over trials {', '.join(map(str, running))}, left unfinished: "
                       f"they resume from their checkpoints")
    for n in running:
        assert "stopped by the sweep's stop" in lines(folder, n)
        assert "resuming rnn on toy" in lines(folder, n)


def test_a_study_continued_elsewhere_takes_its_trials_there(tmp_path, fake_mnist_dir,
                                                           one_worker):
    """Where trials run (device, data folder) is not what a study is: continued with another
    --data-dir, its trials, resumed or new, run with it; continued again without, a trial
    resumes where the study began. A device or data folder they could not use, or another
    option, is refused before any trial."""
    folder, task, said = tmp_path / "s", toy_task(), []
    run0, run1 = sweep.trial_folder(folder, 0), sweep.trial_folder(folder, 1)

    def paused(times):               # trials pause at the first rung while others are to come
        return lambda: sum(": paused" in line for line in said) >= times
    first = sweep.run(folder, toy_config(), grid(f"lr={GOOD},0.05,0.02"), "grid", prune=True,
                      scheduler=one_worker, task=task, echo=said.append, stop=paused(1))
    assert first["stopped"] and recorded(folder)[1][0] == TrialState.WAITING
    elsewhere = str(tmp_path / "data-elsewhere")
    said.clear()
    seen = []

    def echo(line):                  # trial 0, paused when its driver stopped, taken over
        said.append(line)
        if line.startswith("taking over"):
            seen.extend(r["state"] for r in sweep.trial_rows(folder)[1] if r["number"] == 0)
    second = sweep.run(folder, scheduler=one_worker, task=task, echo=echo,
                       where=dict(data_dir=elsewhere), stop=paused(2))
    assert seen == ["running"]
    assert second["stopped"] and (f"trials run with data_dir {elsewhere} (the study began "
                                  f"with data_dir the default)") in said
    for run in (run0, run1):
        assert json.loads((run / "config.json").read_text())["data_dir"] == elsewhere
    assert f"resume: data_dir: None -> {elsewhere!r}" in (run0 / "train.log").read_text()
    assert sweep.run(folder, scheduler=one_worker, task=task, echo=lambda s: None)["complete"]
    assert json.loads((run1 / "config.json").read_text())["data_dir"] is None
    assert f"resume: data_dir: {elsewhere!r} -> None" in (run1 / "train.log").read_text()
    with pytest.raises(sweep.SweepError, match="only device, data_dir may change where a "
                                               "study's trials run; got lr"):
        sweep.run(folder, task=task, where=dict(lr=0.1))
    if not cuda_available()[0]:
        with pytest.raises(sweep.SweepError, match="device 'cuda' was requested but no GPU"):
            sweep.run(folder, task=task, where=dict(device="cuda"))
    named = tmp_path / "named"                 # a named task: it must load from the new folder
    sweep.open_sweep(named, toy_config(task="mnist-noise", T=28, data_dir=str(fake_mnist_dir),
                                       valid_size=50), grid("lr=0.1"), "grid")
    with pytest.raises(sweep.SweepError, match=r"^task mnist-noise: fake MNIST: .* not found in "
                                               + re.escape(str(tmp_path / "no"))):
        sweep.run(named, where=dict(data_dir=str(tmp_path / "no")))


def test_two_drivers_on_one_study_split_the_points(tmp_path):
    """Two drivers on one sweep folder (as on two machines sharing it), one cluster: each point
    runs once."""
    from distributed import Client
    folder, task = tmp_path / "s", toy_task()
    sweep.open_sweep(folder, toy_config(), grid("lr=0.1,0.2,0.3,0.05", "hidden=4,8"), "grid",
                     task=task)
    cluster, _ = sweep.local_cluster("cpu", workers=2)
    client = Client(cluster)
    ran = [[], []]
    try:
        drivers = [threading.Thread(target=sweep.run, args=(folder,), kwargs=dict(
            scheduler=cluster.scheduler_address, task=task, echo=ran[k].append))
            for k in range(2)]
        for d in drivers:
            d.start()
        for d in drivers:
            d.join(timeout=400)
    finally:
        client.close()
        cluster.close()
    trials = recorded(folder)
    assert len(trials) == 8 and all(s == TrialState.COMPLETE for s, _ in trials.values())
    numbers = [line.split()[1] for said in ran for line in said if "complete" in line]
    assert sorted(numbers, key=int) == [str(n) for n in range(8)]      # each run by one


# ----------------------------------------------------------------------------------------------
# the command line
# ----------------------------------------------------------------------------------------------

@pytest.fixture
def fake_mnist_dir(tmp_path, monkeypatch):
    """A data folder whose mnist-noise cache was built from fake MNIST (300 + 60 digits): the
    CLI's processes find the cache and need no raw files."""
    arrays = fd.fake_mnist_arrays(n_train=300, n_test=60)
    fd.write_fake_mnist(tmp_path / "data" / "mnist", arrays)
    monkeypatch.setitem(sources.SOURCES, "mnist",
                        fd.fake_idx_source(tmp_path / "data", arrays=arrays))
    with get_task("mnist-noise", data_dir=tmp_path / "data", T=28, progress=False):
        pass
    return tmp_path / "data"


def _cli(*args, **kw):
    return subprocess.run([sys.executable, "cli.py", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, **kw)


SWEEP_ARGS = ("--model", "rnn", "--task", "mnist-noise", "--T", "28", "--hidden", "16",
              "--batch-size", "20", "--valid-size", "50", "--workers", "2")


@pytest.mark.slow
def test_the_cli_runs_is_interrupted_continues_and_reports(tmp_path, fake_mnist_dir):
    """`sweep run` stopped by Ctrl-C (SIGINT to its process group, as a terminal sends it: the
    workers leave it to the driver) exits 130 with its trials checkpointed; run again with
    --out alone it continues; `sweep report` prints the table and draws the PNG. (A trial runs
    about 700 iterations a second here: long enough that Ctrl-C finds trial 0 unfinished on a
    loaded machine.)"""
    out = tmp_path / "sweeps" / "toy"
    proc = subprocess.Popen([sys.executable, "cli.py", "sweep", "run", "--out", str(out),
                             "--data-dir", str(fake_mnist_dir), *SWEEP_ARGS,
                             "--iterations", "6000", "--eval-every", "2000",
                             "--checkpoint-every", "500", "--param", "lr=0.1,0.05"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        _wait_for(lambda: _saved_iteration(out / "trials" / "0000") >= 500 or proc.poll()
                  is not None, what="a checkpoint of trial 0")
        os.killpg(proc.pid, signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, stdout + stderr
    assert "stopping: the trials in flight write a checkpoint and stop" in stdout
    assert f"continue with: python cli.py sweep run --out {out}" in stdout
    assert "Traceback" not in stderr, stderr

    running = [n for n, (s, _) in recorded(out).items() if s == TrialState.RUNNING]
    assert 0 in running, stdout

    r = _cli("sweep", "run", "--out", str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    assert (f"taking over trials {', '.join(map(str, running))}, left unfinished" in r.stdout
            and "all 2 trials recorded" in r.stdout), r.stdout
    for n in running:
        assert "resuming rnn on mnist-noise" in lines(out, n)

    r = _cli("sweep", "report", str(out))
    assert r.returncode == 0, r.stderr
    assert "rnn on mnist-noise, 6000 iterations, chosen on 50 validation examples" in r.stdout
    assert sum(line.split()[2:3] == ["complete"] for line in r.stdout.splitlines()) == 2
    assert "chosen on validation: trial" in r.stdout and (out / "sweep.png").is_file()
    # `sweep report | head`, with a reader gone before the first line: the figure is drawn,
    # nothing is said of the pipe, and the exit is SIGPIPE's 141
    (out / "sweep.png").unlink()
    proc = subprocess.Popen([sys.executable, "cli.py", "sweep", "report", str(out)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc.stdout.close()
    stderr = proc.stderr.read()
    assert proc.wait(timeout=120) == 141 and stderr == "", stderr
    assert (out / "sweep.png").is_file()

    r = _cli("sweep", "run", "--out", str(out), *SWEEP_ARGS, "--param", "lr=0.3")
    assert r.returncode == 1 and "holds another study" in r.stderr
    assert r.stderr.count("\n") == 1                                  # one line
    r = _cli("sweep", "run", "--out", str(out), "--enqueue", "lr=0.1")    # continued: a grid
    assert r.returncode == 1 and "--enqueue is for the random and tpe samplers" in r.stderr
    r = _cli("sweep", "run", "--out", str(tmp_path / "x"), "--lr", "0.1", "--param", "lr=0.2")
    assert r.returncode == 1 and "--lr is both searched and held fixed" in r.stderr


def test_the_sweep_figure_draws_every_state_that_has_an_accuracy(tmp_path, monkeypatch):
    """Trials left stopped by a Ctrl-C are drawn (they were `running` before the report told
    them apart); failed ones, with no accuracy, are counted in the title."""
    pytest.importorskip("matplotlib")
    from nprnn.study import plotting
    made = []
    figure = plotting._figure
    monkeypatch.setattr(plotting, "_figure", lambda **kw: made.append(figure(**kw)) or made[-1])
    states = ["complete", "pruned", "running", "paused", "stopped"]
    rows = [dict(number=k, params=dict(lr=0.1 * (k + 1)), state=s, valid=0.5 + 0.1 * k,
                 chosen=s == "complete") for k, s in enumerate(states)]
    rows.append(dict(number=5, params=dict(lr=0.6), state="fail", valid=None, chosen=False))
    plotting.plot_sweep(rows, dict(lr=[0.1, 0.2, 0.3, 0.4, 0.5, 0.6]), tmp_path / "s.png",
                        title="t")
    (ax,) = [a for a in made[-1].axes if a.get_visible()]
    labels = ax.get_legend_handles_labels()[1] if ax.get_legend() else [
        t.get_text() for a in made[-1].legends for t in a.get_texts()]
    assert [label for label in labels if "chosen" not in label] == [
        plotting.SWEEP_STYLES[s]["label"] for s in states]
    assert "(1 not drawn: failed, or not yet evaluated)" in made[-1]._suptitle.get_text()

"""The autotuner (nprnn/core/autotune.py) with a fake timer: it times every option of each pass, keeps
the fastest, writes the choice where a later process finds it, and the model runs what it chose.
The kernels themselves run (under the simulator, at tiny sizes); only their times are made up.
"""
import json

import numpy as np
import pytest

import gpu_testing as gt
import nprnn
from nprnn.core import autotune
from nprnn.core.backends import Kernels
from nprnn.runs.train import format_config

pytestmark = gt.requires_cuda

GLOBAL, SKEW = Kernels("persistent", "global"), Kernels("persistent", "skew")
STEP, SPLIT4 = Kernels("step"), Kernels("split", lanes=4)


@pytest.fixture(autouse=True)
def small_blocks(monkeypatch):
    gt.small_launch(monkeypatch)


class FakeTimer:
    """A Tuner's `measure`: runs the call once (so a kernel that cannot run still fails; with
    run=False not even that, where a test is about the choices' file, not the kernels) and
    returns the milliseconds `times` gives for (option token, backward)."""

    def __init__(self, times, run=True):
        self.times, self.timed, self.run = times, [], run

    def __call__(self, run, kernels, backward):
        if self.run:
            run()
        self.timed.append((kernels.token, backward))
        return self.times[kernels.token, backward]


# at n = 6 antisym runs persistent (global, skew), split (2 and 4 lanes) and step: skew the
# fastest forward, split with 4 lanes the fastest BPTT
TIMES = {("persistent/global", False): 2.0, ("persistent/skew", False): 1.0,
         ("split/2", False): 7.0, ("split/4", False): 8.0, ("step", False): 5.0,
         ("persistent/global", True): 4.0, ("persistent/skew", True): 6.0,
         ("split/2", True): 3.5, ("split/4", True): 2.5, ("step", True): 3.0}
OPTIONS = 10


def model(name="antisym", dtype="float64", tuner=None):
    m = nprnn.make_model(name, gt.M, gt.N, 4, seed=3, dtype=dtype, device="cuda", eps=0.5)
    if tuner is not None:
        m.tuner = tuner
    return m


def test_the_fastest_option_of_each_pass_is_chosen_and_kept(tmp_path):
    path = tmp_path / "choices.json"
    timer = FakeTimer(TIMES)
    tuner = autotune.Tuner(path, timer, gpu="Fake GPU (sm_90)")
    choice = tuner.choose(model(), gt.B, gt.T)
    assert (choice.forward, choice.backward, choice.how) == (SKEW, SPLIT4, "timed")
    assert str(choice) == ("forward persistent, matrix in shared memory (skew); BPTT split, 4 "
                           "lanes per unit, matrix in registers, timed")
    # every option of each pass was timed, the forward ones first, in the options' order
    assert timer.timed == [(token, backward) for backward in (False, True)
                           for token in ("persistent/global", "persistent/skew", "split/2",
                                         "split/4", "step")]
    saved = json.loads(path.read_text())
    assert saved["kernels"] == autotune.kernels_digest()
    entry = saved["choices"]["Fake GPU (sm_90) | antisym | n=6 | B=3 | T=4 | float64"]
    assert entry["T"] == gt.T                        # timed at the run's own length
    assert (entry["forward"], entry["backward"]) == ("persistent/skew", "split/4")
    assert entry["backward_ms"] == {"persistent/global": 4.0, "persistent/skew": 6.0,
                                    "split/2": 3.5, "split/4": 2.5, "step": 3.0}
    # another process (a new Tuner on the same file) takes the choice without timing anything
    again = FakeTimer(TIMES)
    choice = autotune.Tuner(path, again, gpu="Fake GPU (sm_90)").choose(model(), gt.B, gt.T)
    assert (choice.forward, choice.backward, choice.how) == (SKEW, SPLIT4, "cached")
    assert again.timed == []
    # another batch size, dtype, cell or GPU is timed afresh
    for args, gpu_name in (((model(), 2 * gt.B, gt.T), "Fake GPU (sm_90)"),
                           ((model(dtype="float32"), gt.B, gt.T), "Fake GPU (sm_90)"),
                           ((model(), gt.B, gt.T), "Other GPU (sm_80)")):
        timer = FakeTimer(TIMES, run=False)
        assert autotune.Tuner(path, timer, gpu=gpu_name).choose(*args).how == "timed"
        assert len(timer.timed) == OPTIONS
    assert len(json.loads(path.read_text())["choices"]) == 4


def test_choices_of_other_kernels_or_a_damaged_file_are_timed_again(tmp_path, monkeypatch):
    path = tmp_path / "choices.json"

    def how_a_new_tuner_chooses():
        return autotune.Tuner(path, FakeTimer(TIMES, run=False), gpu="G").choose(
            model(), gt.B, gt.T).how

    assert how_a_new_tuner_chooses() == "timed"
    assert how_a_new_tuner_chooses() == "cached"
    monkeypatch.setattr(autotune, "kernels_digest", lambda: "kernels-changed")
    assert how_a_new_tuner_chooses() == "timed"
    for damaged in ("{", "[]", '{"format": 1, "kernels": "kernels-changed", "choices": 3}'):
        path.write_text(damaged)
        assert how_a_new_tuner_chooses() == "timed"
    # a cached option that no longer fits (here: a token no kernel has) is timed again
    saved = json.loads(path.read_text())
    saved["choices"]["G | antisym | n=6 | B=3 | T=4 | float64"]["forward"] = "persistent/tiled"
    path.write_text(json.dumps(saved))
    assert how_a_new_tuner_chooses() == "timed"


def test_timing_runs_the_real_length_up_to_a_cap_which_the_key_names(tmp_path):
    """A run of T steps is timed on T steps, and a longer one on TUNE_STEPS (here 2): T is part
    of the key, so a run at another length is timed again."""
    path = tmp_path / "choices.json"
    tuner = autotune.Tuner(path, FakeTimer(TIMES, run=False), steps=2, gpu="G")
    tuner.choose(model(), gt.B, gt.T)
    tuner.choose(model(), gt.B, 1)
    choices = json.loads(path.read_text())["choices"]
    assert {k: v["T"] for k, v in choices.items()} == {"G | antisym | n=6 | B=3 | T=2 | float64": 2,
                                                       "G | antisym | n=6 | B=3 | T=1 | float64": 1}


def test_processes_sharing_the_file_time_one_at_a_time(tmp_path):
    """While another process holds the choices' lock (here a thread, with a lock of its own on
    the same file) a tuner waits; when that one has written its choice, the tuner takes it and
    times nothing."""
    import fcntl
    import threading
    import time
    path, elsewhere = tmp_path / "choices.json", tmp_path / "theirs.json"
    # what the other process will write: its timing, made beforehand in a file of its own
    autotune.Tuner(elsewhere, FakeTimer(TIMES, run=False), gpu="G").choose(model(), gt.B, gt.T)
    held, done = threading.Event(), []

    def other_process():
        with open(tmp_path / "choices.json.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            held.set()
            time.sleep(0.5)                          # the waiting tuner is blocked meanwhile
            path.write_text(elsewhere.read_text())   # the other process's choice, written
            done.append(time.monotonic())
            fcntl.flock(lock, fcntl.LOCK_UN)
    thread = threading.Thread(target=other_process)
    thread.start()
    held.wait()
    timer = FakeTimer(TIMES, run=False)
    choice = autotune.Tuner(path, timer, gpu="G").choose(model(), gt.B, gt.T)
    after = time.monotonic()
    thread.join()
    assert choice.how == "cached" and timer.timed == [] and done and after >= done[0]


def test_a_folder_that_cannot_be_written_keeps_the_choice_in_memory(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    timer = FakeTimer(TIMES, run=False)
    tuner = autotune.Tuner(blocker / "choices.json", timer, gpu="G")
    first = tuner.choose(model(), gt.B, gt.T)
    assert first.how == "timed" and not blocker.is_dir()
    assert tuner.choose(model(), gt.B, gt.T) == first and len(timer.timed) == OPTIONS


def test_untimed_the_persistent_kernels_read_the_matrix_from_global_memory():
    """Under the simulator (timings mean nothing there) or without a measure, 'auto' runs what
    an H100 showed fastest: the persistent kernels with the matrix in global memory."""
    choice = autotune.Tuner().choose(model(), gt.B, gt.T)
    assert (choice.forward, choice.backward, choice.how) == (GLOBAL, GLOBAL, "untimed")
    if gt.CUDA_WHY.startswith("Numba CUDA simulator"):
        assert autotune.Tuner.for_this_gpu().measure is None
    step = autotune.Tuner().choose(model(), gt.B, gt.T, version="step")
    assert (step.forward, step.backward, step.how) == (STEP, STEP, "asked for")


def test_the_model_runs_the_kernels_it_chose_and_matches_the_cpu(tmp_path, monkeypatch):
    """With a timer that makes skew fastest forward and split with 4 lanes fastest in BPTT,
    loss_and_grad launches exactly those, and its numbers match the CPU's."""
    launched = gt.record_launches(monkeypatch, nprnn.CELLS["antisym"])
    tuner = autotune.Tuner(tmp_path / "c.json", FakeTimer(TIMES), gpu="G")
    dev = model(tuner=tuner)
    cpu = nprnn.make_model("antisym", gt.M, gt.N, 4, seed=3, dtype="float64", eps=0.5)
    x = np.random.default_rng(0).standard_normal((gt.B, gt.T, gt.M))
    y = np.array([3, 0, 1])
    dev.kernels_for(gt.B, gt.T)                          # the timing runs launch every option
    launched.clear()
    loss_d, g_d = dev.loss_and_grad(x, y)
    assert launched == [("forward", "persistent", "skew"), ("backward", "split", 4)]
    loss_c, g_c = cpu.loss_and_grad(x, y)
    assert abs(loss_d - loss_c) <= 1e-12 * max(1.0, abs(loss_c))
    for k in g_c:
        gt.assert_close(g_d[k], g_c[k], "float64", f"grad {k}")


def test_trainings_configuration_says_which_kernels_run():
    dev = model(tuner=autotune.Tuner())
    config = dict(model="antisym", task="mnist", optimizer="adagrad", batch_size=gt.B,
                  seq_len=gt.T)
    lines = format_config(config, dev).splitlines()
    assert lines[-1].split(None, 1) == [
        "kernels", "persistent, matrix in global memory (forward and BPTT), untimed"]

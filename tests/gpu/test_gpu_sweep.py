"""`sweep run` on cuda: a local cluster of one worker per GPU, and a study begun on the CPU
continued on the GPU, its trials trained and judged there by a Dask worker (in a worker thread,
as every trial runs).

The trials run on an in-process cluster (`processes=False`), so that the tests' small launch
settings reach their kernels: the simulator runs each GPU thread in Python."""
import json

import numpy as np
import pytest

import gpu_testing as gt

pytest.importorskip("optuna", reason="the sweep extra is not installed (pip install -e "
                                     "'.[sweep]')")
distributed = pytest.importorskip("distributed", reason="the sweep extra is not installed "
                                                        "(pip install -e '.[sweep]')")

import dask                                                          # noqa: E402
from numba import cuda                                                # noqa: E402
from optuna.trial import TrialState                                   # noqa: E402

from nprnn import sweep                                               # noqa: E402
from nprnn.data.datasets import ArrayTask  # noqa: E402
from nprnn.runs.train import resolve_config  # noqa: E402

pytestmark = gt.requires_cuda


@pytest.fixture(autouse=True)
def no_profiler():
    """The in-process cluster's workers without Dask's profiler. Every 10 ms it calls
    sys._current_frames(), which holds the interpreter's lock on its list of threads while it
    builds a dict: a garbage collection there ran Dask's GC callback, which gave up the GIL
    with that lock held, while the simulator, starting a block's threads, waited for the lock
    with the GIL. The trial hung in Thread.start (most runs of 4 at once, at 0.2 ms turns)."""
    with dask.config.set({"distributed.worker.profile.enabled": False}):
        yield


def test_the_local_cluster_gives_each_gpu_a_worker():
    cluster, threads = sweep.local_cluster("cuda", workers=len(cuda.gpus) + 1)
    try:
        seen = [spec["options"]["env"]["CUDA_VISIBLE_DEVICES"]
                for spec in cluster.worker_spec.values()]
    finally:
        cluster.close()
    assert threads is None
    assert seen == [str(i % len(cuda.gpus)) for i in range(len(cuda.gpus) + 1)]


def test_a_study_begun_on_the_cpu_goes_on_on_the_gpu(tmp_path, monkeypatch):
    """Trial 0 pauses at the first rung on the CPU (alone there, trial 1 to come), and the sweep
    is stopped. Continued with device cuda, trial 0 resumes from its checkpoint on the GPU and
    trial 1 trains there; at the rung one is pruned, the other completes and is judged on the
    test set, on the GPU."""
    gt.small_launch(monkeypatch)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((40, gt.T, gt.M)).astype(np.float32)
    y = (x[:, 0, 0] > 0).astype(int)
    task = ArrayTask("toy", x[:30], y[:30], x[30:], y[30:], num_classes=2, valid_size=10)
    fixed = resolve_config(model="antisym", task="toy", hidden=gt.N, eps=0.5, batch_size=10,
                           iterations=4, eval_every=2, log_every=2, checkpoint_every=2,
                           valid_size=10, device="cpu", dtype="float64")
    space = sweep.make_space(params=[sweep.parse_param("lr=0.1,0.2")])
    folder, said = tmp_path / "s", []
    with distributed.LocalCluster(processes=False, n_workers=1, threads_per_worker=1,
                                  dashboard_address=None) as cluster:
        first = sweep.run(folder, fixed, space, "grid", prune=True, task=task,
                          scheduler=cluster.scheduler_address, echo=said.append,
                          stop=lambda: any(": paused" in line for line in said))
        assert first["stopped"] and [line.split(",")[0] for line in said[1:-1]] == [
            "trial 0 (lr=0.1): paused"]
        said.clear()
        second = sweep.run(folder, where=dict(device="cuda"), task=task,
                           scheduler=cluster.scheduler_address, echo=said.append)
    assert second == dict(done=2, total=2, complete=True, stopped=False)
    assert "trials run with device cuda (the study began with device cpu)" in said
    _, _, study = sweep.open_sweep(folder)
    trials = study.get_trials()
    assert sorted(t.state for t in trials) == [TrialState.COMPLETE, TrialState.PRUNED]
    for t in trials:
        run = sweep.trial_folder(folder, t.number)
        assert json.loads((run / "config.json").read_text())["device"] == "cuda"
        if t.state == TrialState.COMPLETE:
            assert 0 <= t.user_attrs["test_accuracy"] <= 1 and (run / "best.h5").is_file()
            assert "final test accuracy after 4 iterations" in (run / "train.log").read_text()
    log = (sweep.trial_folder(folder, 0) / "train.log").read_text()
    assert "  device            cpu" in log and "resume: device: 'cpu' -> 'cuda'" in log

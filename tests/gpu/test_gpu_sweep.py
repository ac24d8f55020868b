"""`sweep run --device cuda`: a local cluster of one worker per GPU, and a trial trained and
evaluated on the GPU by a Dask worker (in a worker thread, as every trial runs).

The trial runs on an in-process cluster (`processes=False`), so that the tests' small launch
settings reach its kernels: the simulator runs each GPU thread in Python."""
import numpy as np
import pytest

import gpu_testing as gt

pytest.importorskip("optuna", reason="the sweep extra is not installed (pip install -e "
                                     "'.[sweep]')")
distributed = pytest.importorskip("distributed", reason="the sweep extra is not installed "
                                                        "(pip install -e '.[sweep]')")

from numba import cuda                                                # noqa: E402

from nprnn import sweep                                               # noqa: E402
from nprnn.checkpoint import load_checkpoint                          # noqa: E402
from nprnn.datasets import ArrayTask                                  # noqa: E402
from nprnn.train import resolve_config                                # noqa: E402

pytestmark = gt.requires_cuda


def test_the_local_cluster_gives_each_gpu_a_worker():
    cluster, threads = sweep.local_cluster("cuda", workers=len(cuda.gpus) + 1)
    try:
        seen = [spec["options"]["env"]["CUDA_VISIBLE_DEVICES"]
                for spec in cluster.worker_spec.values()]
    finally:
        cluster.close()
    assert threads is None
    assert seen == [str(i % len(cuda.gpus)) for i in range(len(cuda.gpus) + 1)]


def test_a_trial_on_cuda_trains_and_is_judged_on_the_gpu(tmp_path, monkeypatch):
    gt.small_launch(monkeypatch)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((40, gt.T, gt.M)).astype(np.float32)
    y = (x[:, 0, 0] > 0).astype(int)
    task = ArrayTask("toy", x[:30], y[:30], x[30:], y[30:], num_classes=2, valid_size=10)
    fixed = resolve_config(model="antisym", task="toy", hidden=gt.N, eps=0.5, batch_size=10,
                           iterations=2, eval_every=2, log_every=2, checkpoint_every=2,
                           valid_size=10, device="cuda", dtype="float64")
    with distributed.LocalCluster(processes=False, n_workers=1, threads_per_worker=1,
                                  dashboard_address=None) as cluster:
        result = sweep.run(tmp_path / "s", fixed, sweep.make_space(params=[
            sweep.parse_param("lr=0.1")]), "grid", scheduler=cluster.scheduler_address,
            task=task, echo=lambda s: None)
    assert result == dict(done=1, total=1, complete=True, stopped=False)
    _, _, study = sweep.open_sweep(tmp_path / "s")
    (trial,) = study.get_trials()
    assert trial.value == trial.intermediate_values[2] and 0 <= trial.value <= 1
    assert 0 <= trial.user_attrs["test_accuracy"] <= 1
    run = sweep.trial_folder(tmp_path / "s", 0)
    assert load_checkpoint(run / "best.h5")["progress"]["iteration"] == 2
    log = (run / "train.log").read_text()
    assert "  device            cuda" in log and "final test accuracy after 2 iterations" in log

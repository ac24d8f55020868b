"""The many-machine sweep of docs/sweeps.md, with real parts: a study shared through a PostgreSQL
server, a Dask scheduler and two workers started by the `dask` command as on a cluster (each
worker a process of its own, under its nanny), and two `sweep run` drivers, the real CLI, on one
study. A worker is killed (SIGKILL) while it trains a trial; every grid point is recorded exactly
once, and both drivers exit 0.

The server is the one NPRNN_TEST_POSTGRES names (postgresql://USER:PASSWORD@HOST:PORT/DB), which
.ci/run starts; without it, or where it cannot be reached, or without the `dask` command, the
test skips and says why. To run it locally, start a PostgreSQL server, create a database, and:

    NPRNN_TEST_POSTGRES=postgresql://USER:PASSWORD@localhost:5432/DB \\
        python -m pytest tests/test_sweep_cluster.py
"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("optuna", reason="the sweep extra is not installed (pip install -e "
                                     "'.[sweep]')")
pytest.importorskip("distributed", reason="the sweep extra is not installed (pip install -e "
                                          "'.[sweep]')")

import optuna                                                         # noqa: E402
from optuna.trial import TrialState                                   # noqa: E402

import fake_data as fd                                                # noqa: E402
from nprnn import sweep                                               # noqa: E402
from nprnn.data import sources                                        # noqa: E402
from nprnn.data.datasets import get_task                              # noqa: E402
from test_sweep import _saved_iteration, _wait_for                      # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
ENV = "NPRNN_TEST_POSTGRES"
# a trial: 2,000 iterations (about 8 s on a loaded core); one killed after a checkpoint in its
# first half has most of them to go
ITERATIONS, CHECKPOINT_EVERY, EVAL_EVERY = 2000, 200, 500
GRID = ("lr=0.1,0.05", "hidden=8,16")


@pytest.fixture
def postgres_url():
    """The URL of NPRNN_TEST_POSTGRES, once a connection to it has been made; else a skip that
    says why."""
    url = os.environ.get(ENV)
    if not url:
        pytest.skip(f"{ENV} is not set: no PostgreSQL server to share a study through "
                    f"(.ci/run starts one)")
    import sqlalchemy
    try:
        engine = sqlalchemy.create_engine(url, connect_args=dict(connect_timeout=5))
    except Exception as e:              # no driver: psycopg (the sweep extra brings it)
        pytest.skip(f"{ENV} cannot be used: {type(e).__name__}: {str(e).splitlines()[0]}")
    try:
        with engine.connect():
            pass
    except Exception as e:
        reason = str(getattr(e, "orig", None) or e).strip().splitlines()
        pytest.skip(f"the PostgreSQL server of {ENV} cannot be reached: "
                    f"{reason[0] if reason else type(e).__name__}")
    finally:
        engine.dispose()
    return url


@pytest.fixture
def dask_command():
    """The `dask` command of this Python's environment (or of PATH), or a skip."""
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    found = shutil.which("dask", path=path)
    if found is None:
        pytest.skip("the `dask` command is not installed (the sweep extra brings it)")
    return found


@pytest.fixture
def fake_mnist_dir(tmp_path, monkeypatch):
    """A data folder whose mnist-noise cache was built from fake MNIST: the drivers and the
    workers, other processes, find the cache and need no raw files."""
    arrays = fd.fake_mnist_arrays(n_train=300, n_test=60)
    fd.write_fake_mnist(tmp_path / "data" / "mnist", arrays)
    monkeypatch.setitem(sources.SOURCES, "mnist",
                        fd.fake_idx_source(tmp_path / "data", arrays=arrays))
    with get_task("mnist-noise", data_dir=tmp_path / "data", T=28, progress=False):
        pass
    return tmp_path / "data"


def _stop(procs, grace=10):
    """End these processes and their children (each leads a process group of its own): SIGTERM
    to each (a `dask worker` closes its worker process, as on a cluster), then SIGKILL to the
    groups for anything still there after `grace` seconds."""
    live = [p for p in procs if p.poll() is None]
    for p in live:
        p.terminate()
    end = time.monotonic() + grace
    for p in live:
        try:
            p.wait(timeout=max(0.1, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    for p in procs:
        try:
            os.killpg(p.pid, signal.SIGKILL)       # the group: a nanny's worker too
        except ProcessLookupError:
            pass
        p.wait()


@pytest.fixture
def cluster(tmp_path, dask_command):
    """A Dask scheduler and two workers, each started by the `dask` command in a process group
    of its own, as on a cluster (one worker process under its nanny, one task thread, one numba
    thread: two on two cores); yields (scheduler address, scheduler file). Every process ends
    with the test."""
    here = tmp_path / "cluster"
    here.mkdir()
    file = here / "scheduler.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p]),
        NUMBA_NUM_THREADS="1", OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
        MKL_NUM_THREADS="1")
    procs = []

    def start(name, *args):
        log = open(here / f"{name}.log", "w")
        procs.append(subprocess.Popen([dask_command, *args], cwd=here, env=env, stdout=log,
                                      stderr=subprocess.STDOUT, start_new_session=True))
        log.close()

    try:
        start("scheduler", "scheduler", "--host", "127.0.0.1", "--port", "0",
              "--scheduler-file", str(file), "--no-dashboard")
        _wait_for(lambda: file.is_file() and file.stat().st_size > 0 or procs[0].poll()
                  is not None, timeout=60, what="the scheduler file")
        assert procs[0].poll() is None, (here / "scheduler.log").read_text()
        for k in range(2):
            start(f"worker-{k}", "worker", "--scheduler-file", str(file), "--nworkers", "1",
                  "--nthreads", "1", "--memory-limit", "0", "--no-dashboard",
                  "--name", f"worker-{k}", "--host", "127.0.0.1", "--local-directory", str(here))
        yield json.loads(file.read_text())["address"], file
    finally:
        _stop(procs[1:], grace=5)         # the workers, then the scheduler
        _stop(procs[:1])


def _training(client, folder):
    """(trial number, worker address) of a trial a worker is training that has written a
    checkpoint and has at least half its iterations to go, or None."""
    for worker, keys in client.processing().items():
        for key in keys:                                   # trial-STUDY-NUMBER-ID
            m = re.search(r"-(\d+)-[0-9a-f]{8}$", str(key))
            if m and CHECKPOINT_EVERY <= _saved_iteration(
                    sweep.trial_folder(folder, int(m.group(1)))) <= ITERATIONS // 2:
                return int(m.group(1)), worker
    return None


@pytest.mark.slow
def test_two_drivers_share_a_study_in_postgresql_on_a_cluster_that_loses_a_worker(
        tmp_path, postgres_url, cluster, fake_mnist_dir):
    from distributed import Client
    address, scheduler_file = cluster
    out = tmp_path / "sweeps" / "shared"
    command = [sys.executable, "cli.py", "sweep", "run", "--out", str(out),
               "--data-dir", str(fake_mnist_dir), "--model", "rnn", "--task", "mnist-noise",
               "--T", "28", "--batch-size", "20", "--valid-size", "50",
               "--iterations", str(ITERATIONS), "--eval-every", str(EVAL_EVERY),
               "--checkpoint-every", str(CHECKPOINT_EVERY),
               *[a for p in GRID for a in ("--param", p)],
               "--storage", postgres_url, "--scheduler", address]
    drivers, outputs = [], []
    client = Client(scheduler_file=str(scheduler_file), timeout=30, set_as_default=False)
    try:
        client.wait_for_workers(2, timeout=90)

        def start_driver():
            drivers.append(subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE,
                                            stderr=subprocess.PIPE, text=True,
                                            start_new_session=True))
        start_driver()             # makes the study; the second joins it, as on a 2nd machine
        _wait_for(lambda: (out / sweep.SWEEP).is_file() or drivers[0].poll() is not None,
                  what="sweep.json")
        start_driver()
        found = []
        _wait_for(lambda: found.append(_training(client, out)) or found[-1] is not None
                  or all(d.poll() is not None for d in drivers),
                  what="a trial with a checkpoint on a worker")
        assert found[-1] is not None, "the drivers ended before a trial could be killed"
        killed, worker = found[-1]
        pid = client.run(os.getpid, workers=[worker])[worker]
        os.kill(pid, signal.SIGKILL)                # the worker process, under its nanny
        for d in drivers:
            outputs.append(d.communicate(timeout=240))
    finally:
        client.close()
        _stop(drivers)
    for k, (d, (stdout, stderr)) in enumerate(zip(drivers, outputs)):
        (tmp_path / f"driver-{k}.log").write_text(stdout + stderr)
        assert d.returncode == 0, stdout + stderr
        assert "Traceback" not in stderr, stderr

    spec = json.loads((out / sweep.SWEEP).read_text())
    assert spec["storage"] == postgres_url
    for stdout, _ in outputs:                          # one study, both drivers
        assert stdout.startswith(f"sweep {spec['study']} in {out}: 4 trials"), stdout
    # the study, read back from the database by Optuna alone
    study = optuna.load_study(study_name=spec["study"], storage=postgres_url)
    trials = study.get_trials()
    points = sorted(tuple(sorted(t.params.items())) for t in trials)
    assert points == sorted((("hidden", h), ("lr", lr)) for h in (8, 16) for lr in (0.1, 0.05))
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 4
    # each trial run to its end by one driver, the killed one resumed from its checkpoint
    said = [line.split()[1] for stdout, _ in outputs for line in stdout.splitlines()
            if re.match(r"trial \d+ \(.*\): complete", line)]
    assert sorted(said, key=int) == ["0", "1", "2", "3"], outputs
    log = (sweep.trial_folder(out, killed) / "train.log").read_text()
    assert "resuming rnn on mnist-noise" in log, log
    assert f"final test accuracy after {ITERATIONS} iterations" in log, log
    # and by the sweep's own report, through sweep.json
    _, rows, waiting = sweep.trial_rows(out)
    assert waiting == 0 and sorted(r["number"] for r in rows) == [0, 1, 2, 3]
    assert all(r["state"] == "complete" and r["iteration"] == ITERATIONS for r in rows)
    assert sum(r["chosen"] for r in rows) == 1
    optuna.delete_study(study_name=spec["study"], storage=postgres_url)

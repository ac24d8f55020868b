"""How a sweep runs: a trial trained on a Dask worker (`run_trial`), the local cluster, and the
driver (`run`) that claims trials, hands them to workers, takes over the abandoned ones and stops
them on Ctrl-C."""
import logging
import os
import signal
import socket
import threading
import time
import uuid
from concurrent.futures import CancelledError
from pathlib import Path

import numba
import optuna
from tqdm import tqdm
from numba import cuda
from distributed import Client, Event, Nanny, Scheduler, SpecCluster, TimeoutError, WorkerPlugin
from distributed.comm.addressing import parse_address, parse_host_port
from distributed.comm.registry import get_backend
from optuna.trial import TrialState

from ..runs.checkpoint import FILENAME, load_checkpoint
from ..runs.saved import open_run
from ..core.device import DeviceUnavailable, resolve_device, usable_cpus
from ..util.files import pid_alive
from ..runs.train import (BEST, CONFIG, METRICS, RunInUse, RunLock, TrainingDiverged,
                     evaluate_checkpoint, train)
from .study import (CONNECT_SECONDS, HEARTBEAT_SECONDS, RETRY_SECONDS, STALE_SECONDS, SweepError,
                    TRIALS, WHERE, draw, enqueue, load_study, open_storage, open_sweep,
                    parse_points, read_sweep, space_of, task_shape, waits_at_rung)


# ----------------------------------------------------------------------------------------------
# A trial, on a worker
# ----------------------------------------------------------------------------------------------

def trial_folder(folder, number):
    return Path(folder) / TRIALS / f"{number:04d}"


def _valid_records(out):
    """(iteration, accuracy) of every validation line that run folder `out` has logged so far,
    in order."""
    return [(r["iteration"], r["accuracy"]) for r in open_run(out).records_so_far()
            if r.get("split") == "valid"]


def _clear_unstarted(out):
    """What a trial killed before its first checkpoint (while its kernels compiled, say) left:
    config.json and metrics.jsonl without checkpoint.h5, which `train` would refuse as another
    run's. Removed under the folder's lock (RunInUse if a process trains there)."""
    if not out.is_dir():
        return
    with RunLock(out):
        if not (out / FILENAME).exists():
            for name in (CONFIG, METRICS):
                (out / name).unlink(missing_ok=True)


def share_cores(threads):
    """Let this thread's numba kernels use `threads` threads (None: as the process started).
    numba counts them per calling thread; its pool has one thread per core (NUMBA_NUM_THREADS
    is left alone: a Dask nanny sets its workers' environment after their Python has imported
    numba, and numba refuses to compile once the two disagree and its threads have started)."""
    if threads is not None:
        numba.set_num_threads(max(1, min(threads, numba.config.NUMBA_NUM_THREADS)))


def run_trial(folder, number, driver, task=None, threads=None, where=None):
    """Train trial `number` of the sweep in `folder` (a fresh run, or its checkpoint resumed),
    report each validation accuracy to the study, and record the result there. Called on a
    Dask worker; `threads`: numba threads for it (a local cluster's share of the cores; numba
    counts them per calling thread, and this is the worker's task thread); `where`: WHERE
    options that replace the study's. Returns
    dict(number, params, state, value, iteration, test_accuracy, message)."""
    share_cores(threads)
    # tqdm's default lock is a multiprocessing one: a named semaphore, which a worker killed
    # while it holds a bar cannot release ("leaked semaphore objects" at exit). A worker's bars
    # are drawn by its own threads alone.
    tqdm.set_lock(threading.RLock())
    folder = Path(folder)
    spec = read_sweep(folder)
    store = open_storage(folder, spec["storage"])
    study = load_study(spec, store)
    study_id = store.get_study_id_from_name(spec["study"])
    trial_id = store.get_trial_id_from_study_id_trial_number(study_id, number)
    frozen = store.get_trial(trial_id)
    result = dict(number=number, params=frozen.params, state=frozen.state.name.lower(),
                  value=frozen.value,
                  iteration=None, test_accuracy=frozen.user_attrs.get("test_accuracy"),
                  message="")
    if frozen.state != TrialState.RUNNING:       # recorded already (a rerun after a kill)
        return result
    trial = optuna.Trial(study, trial_id)
    # the point: an enqueued one's values (a grid's, --enqueue's), or those study.ask drew
    # (suggesting again returns them)
    params = {name: p.suggest(trial) for name, p in space_of(spec).items()}
    result["params"] = params
    out = trial_folder(folder, number)
    resume = (out / FILENAME).is_file()
    # a point drawn again takes its twin's result, unless it has trained already (drawn while
    # its twin ran, and resumed now): then it goes on by itself
    twin = None if resume else _finished_twin(study, number, params)
    if twin is not None:
        return _take_result_of(twin, study, store, trial, trial_id, result)
    if not resume:
        try:
            _clear_unstarted(out)
        except RunInUse as e:
            return dict(result, state="busy", message=str(e))
    where = where or {}
    config = dict(spec["fixed"], **params, **where, keep_best=True)
    stop_event = Event(f"nprnn-stop-{driver}")
    pruned, paused, last_look = [], [], [0.0]

    def report(iteration, accuracy, judge=True):
        if iteration not in trial.storage.get_trial(trial_id).intermediate_values:
            trial.report(accuracy, iteration)
        if not judge or pruned or paused:
            return
        if (spec["prune"] and study.pruner.is_rung(iteration)
                and waits_at_rung(study, spec, number, iteration)):
            paused.append(iteration)
        elif trial.should_prune():
            pruned.append(iteration)

    def on_evaluation(iteration, split, metrics):
        if split == "valid":
            report(iteration, metrics["accuracy"])

    def should_stop():
        if pruned:
            return "the sweep's pruner"
        if paused:
            return "the sweep (waiting for other trials at this rung)"
        now = time.monotonic()
        if now - last_look[0] >= 0.5:            # a round trip to the scheduler
            last_look[0] = now
            if stop_event.is_set():
                return "the sweep's stop"
        return None

    if resume:         # what the checkpoint holds was reported before, unless a kill lost it;
        # an evaluation at the checkpoint (where a trial waits at its rung) is judged again
        saved_at = load_checkpoint(out / FILENAME)["progress"]["iteration"]
        for iteration, accuracy in _valid_records(out):
            if iteration <= saved_at:
                report(iteration, accuracy, judge=iteration == saved_at)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "train.log", "a") as log:
        def echo(message):
            log.write(f"{message}\n")
            log.flush()
        try:
            summary = train(None if resume else config, out, resume=resume, given=where,
                            task=task, echo=echo, progress=False, should_stop=should_stop,
                            on_evaluation=on_evaluation)
        except TrainingDiverged as e:
            store.set_trial_user_attr(trial_id, "error", str(e))    # while it can take one
            study.tell(number, state=TrialState.FAIL, skip_if_finished=True)
            return dict(result, state="fail", message=str(e))
        except RunInUse as e:
            return dict(result, state="busy", message=str(e))
    valid = _valid_records(out)
    best = max((a for _, a in valid), default=None)
    result.update(iteration=summary["iteration"], value=best)
    store.set_trial_user_attr(trial_id, "iteration", summary["iteration"])
    if pruned:
        study.tell(number, state=TrialState.PRUNED, skip_if_finished=True)
        return dict(result, state="pruned")
    if paused:
        return dict(result, state="paused", message="judged at this rung once three trials "
                    "have reached it, or no other trial can")
    if not summary["completed"]:                 # stopped by the driver: resumed later
        return dict(result, state="stopped")
    test = _test_of_best(out, valid, summary, task, config["device"])
    result["test_accuracy"] = test
    store.set_trial_user_attr(trial_id, "test_accuracy", test)
    study.tell(number, best, skip_if_finished=True)
    return dict(result, state="complete")


def _finished_twin(study, number, params):
    """A finished trial (complete, pruned or failed) at the same point as trial `number`, or None.
    A sampler may draw a point again (random sampling over a grid's values; TPE once all its
    draws are points the study holds, as in a grid smaller than --trials); all else is held
    fixed and training is deterministic, so running it again would repeat that trial exactly."""
    return next((t for t in study.get_trials(deepcopy=False, states=(
        TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL))
        if t.number != number and t.params == params), None)


def _take_result_of(twin, study, store, trial, trial_id, result):
    """Record `trial` as its twin was recorded, without training: its validation accuracies,
    iteration, test accuracy or error, and state. Returns run_trial's dict."""
    for step, value in sorted(twin.intermediate_values.items()):
        trial.report(value, step)
    for key in ("iteration", "test_accuracy", "error"):
        if key in twin.user_attrs:
            store.set_trial_user_attr(trial_id, key, twin.user_attrs[key])
    store.set_trial_user_attr(trial_id, "twin_of", twin.number)
    complete = twin.state == TrialState.COMPLETE
    study.tell(trial.number, twin.value if complete else None, state=twin.state,
               skip_if_finished=True)
    best = twin.value if complete else max(twin.intermediate_values.values(), default=None)
    return dict(result, state=twin.state.name.lower(), value=best,
                iteration=twin.user_attrs.get("iteration"),
                test_accuracy=twin.user_attrs.get("test_accuracy"),
                message=f"the point of trial {twin.number} again: its result, not trained again")


def _test_of_best(out, valid, summary, task, device):
    """The test accuracy of best.h5: train's final test evaluation where the best validation
    accuracy was the last one (the same parameters), else an evaluation of best.h5."""
    best_it = max(valid, key=lambda r: r[1])[0]
    if summary["final"] is not None and best_it == summary["iteration"]:
        return summary["final"]["accuracy"]
    return evaluate_checkpoint(out / BEST, "test", task=task, device=device)["accuracy"]


# ----------------------------------------------------------------------------------------------
# The driver
# ----------------------------------------------------------------------------------------------

def local_cluster(device, workers=None):
    """(a Dask cluster on this machine, numba threads per trial): one worker per GPU for cuda
    (each seeing its own; threads None), or `workers` on the CPU (default: one per two cores)
    sharing the cores, each trial with its share (`share_cores`; the environment says it to
    the BLAS and OpenMP libraries a trial loads)."""
    cores = usable_cpus()
    threads = None
    if device == "cuda":
        gpus = len(cuda.gpus)
        workers = workers or gpus
        envs = [dict(CUDA_VISIBLE_DEVICES=str(i % gpus)) for i in range(workers)]
    else:
        workers = workers or max(1, cores // 2)
        threads = max(1, cores // workers)
        envs = [dict(OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads),
                     MKL_NUM_THREADS=str(threads))] * workers
    specs = {f"trainer-{i}": dict(cls=Nanny, options=dict(
        nthreads=1, env=env, memory_limit=0, dashboard=False, silence_logs=logging.ERROR))
             for i, env in enumerate(envs)}
    scheduler = dict(cls=Scheduler, options=dict(dashboard=False, dashboard_address=":0"))
    return SpecCluster(workers=specs, scheduler=scheduler, silence_logs=logging.ERROR), threads


class LeaveInterruptsToTheDriver(WorkerPlugin):
    """Ctrl-C in a terminal reaches a local cluster's workers too (they share the driver's
    process group): they ignore it, and the driver asks their trials to checkpoint and stop.
    (A plugin, so that a worker the nanny restarts after a kill gets it too.)"""

    def setup(self, worker):
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, signal.SIG_IGN)


def _free(trial, now):
    """Whether a RUNNING trial has no live driver: released (driver ""), its driver's process
    gone (this host), or not renewed for STALE_SECONDS. (A trial just claimed has no driver yet:
    its claimer writes it next.)"""
    owner = trial.user_attrs.get("driver")
    if owner == "":
        return True
    if owner is not None:
        host, _, rest = owner.partition(":")
        pid = rest.partition(":")[0]
        if host == socket.gethostname() and pid.isdigit() and not pid_alive(int(pid)):
            return True
    since = trial.user_attrs.get("heartbeat", trial.datetime_start.timestamp()
                                 if trial.datetime_start else now)
    return now - since > STALE_SECONDS


class Driver:
    """Claims the study's trials and keeps the workers busy with them (see the module)."""

    def __init__(self, folder, spec, store, study, client, task, threads, where):
        self.folder, self.spec, self.store, self.study = folder, spec, store, study
        self.client, self.task, self.threads, self.where = client, task, threads, where
        self.id = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.study_id = store.get_study_id_from_name(spec["study"])
        self.stop_event = Event(f"nprnn-stop-{self.id}", client=client)
        self.running = {}                  # future -> trial number
        self.later = []                    # (time, number): busy elsewhere, tried again then
        self.paused = []                   # (number, rung): waiting for other trials there
        self.adopted = []                  # taken over, not yet submitted
        self.beat = self.looked = 0.0
        self.distributions = {n: p.distribution() for n, p in space_of(spec).items()}

    def held(self):
        """The numbers of the trials this driver holds, in flight or not."""
        return (list(self.running.values()) + [n for _, n in self.later] + self.adopted
                + [n for n, _ in self.paused])

    def _set(self, number, key, value):
        """A user attribute of a trial, unless it has finished meanwhile (its worker told)."""
        tid = self.store.get_trial_id_from_study_id_trial_number(self.study_id, number)
        try:
            self.store.set_trial_user_attr(tid, key, value)
        except optuna.exceptions.UpdateFinishedTrialError:
            pass

    def _own(self, number):
        self._set(number, "driver", self.id)
        self._set(number, "heartbeat", time.time())

    def _claim(self):
        """The number of the next trial this driver runs, or None when there is none."""
        now = time.time()
        for i, (when, number) in enumerate(self.later):
            if when <= now:
                del self.later[i]
                return number
        for i, (number, rung) in enumerate(self.paused):
            if not waits_at_rung(self.study, self.spec, number, rung):
                del self.paused[i]
                self._set(number, "paused_at", None)
                return number
        if self.adopted:
            return self.adopted.pop(0)
        for t in self.study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
            tid = self.store.get_trial_id_from_study_id_trial_number(self.study_id, t.number)
            try:
                claimed = self.store.set_trial_state_values(tid, TrialState.RUNNING)
            except optuna.exceptions.UpdateFinishedTrialError:
                claimed = False                  # another driver claimed and finished it
            if claimed:
                self._own(t.number)
                return t.number
        if self.spec["sampler"] != "grid":
            if len(self.study.get_trials(deepcopy=False)) < self.spec["trials"]:
                number = draw(self.study, self.spec, self.distributions).number
                self._own(number)
                return number
        return None

    def take_over(self):
        """Claim the RUNNING trials that no live driver holds; returns their numbers."""
        now, taken = time.time(), []
        held = set(self.held())
        for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            if t.number not in held and _free(t, now):
                self._own(t.number)
                self._set(t.number, "paused_at", None)    # resumed: judged again at its rung
                taken.append(t.number)
        self.adopted += taken
        return taken

    def submit(self, number):
        # a key of its own per submission: Dask hands back the old future for a key it still
        # holds, whose result would be read again
        key = f"trial-{self.spec['study']}-{number}-{uuid.uuid4().hex[:8]}"
        future = self.client.submit(run_trial, str(self.folder), number, self.id, self.task,
                                    self.threads, self.where, key=key, pure=False)
        self.running[future] = number

    def tend(self):
        """Every HEARTBEAT_SECONDS: renew the held trials' heartbeat, and take over trials that
        have lost their driver since."""
        if time.time() - self.beat < HEARTBEAT_SECONDS:
            return []
        self.beat = time.time()
        for number in self.held():
            self._set(number, "heartbeat", self.beat)
        return self.take_over()

    def release(self, numbers):
        """Leave these trials, where unfinished, to the next `sweep run` (driver "")."""
        for number in numbers:
            self._set(number, "driver", "")

    def loop(self, slots, stop, on_result, echo, on_tick=None):
        """Run trials until this driver finds none to run (or `stop()` is true); on_result(result)
        for each that ends, and on_tick() about once a second while they run."""
        while not stop():
            if on_tick is not None:
                on_tick()
            taken = self.tend()
            if taken:
                echo(f"taking over trials {', '.join(map(str, taken))}, left unfinished: they "
                     f"resume from their checkpoints")
            while len(self.running) < slots:
                number = self._claim()
                if number is None:
                    break
                self.submit(number)
            if not self.running and not self.later and not self.paused:
                return True
            if not self.running:
                time.sleep(1.0)
                continue
            for future in self._wait(1.0, any):
                on_result(self._result(future, self.running.pop(future)))
        return False

    def _wait(self, seconds, until):
        """The futures in flight that are done, once `until` (any, all) of them are, or after
        `seconds`. (Polled: distributed.wait would take the process's default client, which
        another driver in this process may have closed.)"""
        end = time.monotonic() + seconds
        while True:
            done = [f for f in self.running if f.done()]
            if (not self.running or until(f.done() for f in self.running)
                    or time.monotonic() >= end):
                return done
            time.sleep(0.05)

    def _result(self, future, number):
        """A finished future's result; a trial that could not run now is tried again later."""
        try:
            result = future.result()
        except CancelledError:       # its task was cancelled (a restarted scheduler): again
            self.later.append((time.time() + RETRY_SECONDS, number))
            return dict(number=number, state="cancelled", message="tried again later")
        except Exception as e:       # the trial raised, or its workers kept dying (KilledWorker)
            message = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            self._set(number, "error", message)
            self.study.tell(number, state=TrialState.FAIL, skip_if_finished=True)
            return dict(number=number, state="fail", message=message)
        if result["state"] in ("busy", "stopped"):   # held elsewhere; or stopped by another
            self.later.append((time.time() + RETRY_SECONDS, number))   # driver's stop
        elif result["state"] == "paused":
            self.paused.append((number, result["iteration"]))
            self._set(number, "paused_at", result["iteration"])
        return result

    def stop(self, wait_seconds):
        """Ask the trials in flight to checkpoint and stop, wait for them up to wait_seconds,
        and release every trial this driver holds."""
        self.stop_event.set()
        self._wait(wait_seconds, all)
        self.release(self.held())


def status(study, total, running):
    """Where a sweep stands: dict(done, total, running (trials in flight here), pruned, failed,
    best (the best validation accuracy any trial has reported so far, or None))."""
    trials = study.get_trials(deepcopy=False)
    states = [t.state for t in trials]
    seen = [v for t in trials for v in ([t.value] if t.value is not None else
                                        list(t.intermediate_values.values()))]
    return dict(done=sum(s in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
                         for s in states),
                total=total, running=running, pruned=states.count(TrialState.PRUNED),
                failed=states.count(TrialState.FAIL), best=max(seen, default=None))


def _point(params):
    return " ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}"
                    for k, v in sorted(params.items()))


def describe(result):
    """A trial's line as the driver prints it."""
    value = result.get("value")
    point = f" ({_point(result['params'])})" if result.get("params") else ""
    parts = [f"trial {result['number']}{point}: {result['state']}"]
    if result.get("iteration") is not None:
        parts.append(f"iteration {result['iteration']}")
    if value is not None:
        parts.append(f"best valid {value:.4f}")
    if result.get("message"):
        parts.append(result["message"])
    return ", ".join(parts)


def _check_address(address):
    """Raise ValueError unless `address` is one Dask can dial (SCHEME://HOST:PORT, HOST:PORT, or
    inproc://...). Said before Client is made: given an address without a port, it sometimes
    waits for ever instead of raising (distributed 2026.8)."""
    scheme, location = parse_address(address)
    get_backend(scheme)
    if scheme != "inproc":
        try:
            parse_host_port(location)
        except ValueError:
            raise ValueError(f"{address!r} is not an address of the form tcp://HOST:PORT") from None


def _device(fixed):
    try:
        return resolve_device(fixed["device"])
    except DeviceUnavailable as e:
        raise SweepError(str(e)) from None


def run(folder, fixed=None, space=None, sampler=None, trials=None, prune=False, seed=0,
        storage=None, workers=None, scheduler=None, task=None, echo=print, stop=None,
        progress=None, where=None, enqueue_points=()):
    """Run the sweep in `folder` (created from the definition given, or continued), until every
    trial is recorded or `stop()` says to stop. `task`: an in-memory task shipped to the
    workers instead of the named one (tests). `progress(status)` (`status`'s dict) after each
    trial and every few seconds while trials run.
    `where`: {WHERE option: value} for the trials from now on, in place of the study's (e.g.
    device "cuda" for a study begun on the CPU). `enqueue_points`: --enqueue values, their
    points run first. Returns dict(done, total, complete (bool), stopped (bool))."""
    folder = Path(folder)
    stop = stop or (lambda: False)
    where = dict(where or {})
    if set(where) - set(WHERE):
        raise SweepError(f"only {', '.join(WHERE)} may change where a study's trials run; got "
                         f"{', '.join(sorted(set(where) - set(WHERE)))}")
    if fixed is not None:                # no GPU for --device cuda, bad points: said before
        _device(dict(fixed, **where))    # the folder is made
        points = parse_points(sampler, space, enqueue_points, trials)
    spec, store, study = open_sweep(folder, fixed, space, sampler, trials, prune, seed, storage,
                                    task)
    if fixed is None:
        points = parse_points(spec["sampler"], space_of(spec), enqueue_points)
    here = dict(spec["fixed"], **where)
    device = _device(here)
    changed = {k: v for k, v in where.items() if v != spec["fixed"][k]}
    if changed:                          # the task must load from there too
        task_shape(here, task)
    enqueue(study, spec, points, echo)
    threads = None                       # another cluster's workers: as they were started
    if scheduler is not None:
        try:
            _check_address(scheduler)
            client = Client(scheduler, timeout=CONNECT_SECONDS, set_as_default=False)
        except (OSError, TimeoutError, ValueError) as e:
            raise SweepError(f"cannot reach the Dask scheduler at {scheduler}: {e}") from None
        cluster = None
    else:
        cluster, threads = local_cluster(device, workers)
        client = Client(cluster, set_as_default=False)
        client.register_plugin(LeaveInterruptsToTheDriver(), name="nprnn-interrupts")
    try:
        slots = sum(client.nthreads().values()) or 1
        echo(f"sweep {spec['study']} in {folder}: {spec['trials']} trials, {spec['sampler']} "
             f"sampler{', pruned by successive halving' if spec['prune'] else ''}; "
             f"{len(client.nthreads())} workers ({client.scheduler.address})")
        if changed:
            def said(k, v):            # data_dir None: $NPRNN_DATA_DIR, else ./data
                return f"{k} {'the default' if v is None else v}"
            echo("trials run with " + ", ".join(said(k, v) for k, v in changed.items())
                 + " (the study began with "
                 + ", ".join(said(k, spec["fixed"][k]) for k in changed) + ")")
        # every trial this driver runs, new or resumed, runs here: a trial that another
        # driver ran on its GPU resumes on this one's CPU unless this one says cuda too
        driver = Driver(folder, spec, store, study, client, task, threads,
                        {k: here[k] for k in WHERE})

        def counted():
            return len(study.get_trials(deepcopy=False, states=(
                TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)))

        last = [0.0]

        def report_status(every=0.0):
            """progress(status), at most once in `every` seconds."""
            if progress is None or time.monotonic() - last[0] < every:
                return
            last[0] = time.monotonic()
            progress(status(study, spec["trials"], len(driver.running)))

        def on_result(result):
            echo(describe(result))
            report_status()

        try:
            finished = driver.loop(slots, stop, on_result, echo,
                                   on_tick=lambda: report_status(every=5.0))
        except KeyboardInterrupt:
            finished = False
        if not finished:
            echo("stopping: the trials in flight write a checkpoint and stop ...")
            driver.stop(wait_seconds=120)
        done = counted()
        return dict(done=done, total=spec["trials"], complete=done >= spec["trials"],
                    stopped=not finished)
    finally:
        client.close()
        if cluster is not None:
            cluster.close()

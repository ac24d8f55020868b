""".ci/gpu, the checks a GPU session runs in one call of the device tool, without a GPU: its
plan fits its budget (a dry run), its settings are checked, it stops at once where there is no
GPU, a run against a stand-in GPU ends with its summary table, and that table reads the logs.

The stand-in: a `python3` that answers the device check and the steps' commands with canned
output and passes everything else to this interpreter, and a `compute-sanitizer` that refuses
the device as gVisor hosts do. It exercises the script's own logic: the plan, the limits, the
results, what counts as a failure, the summary.
"""
import importlib.util
import io
import os
import re
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nprnn.core import device
from nprnn.study import bench
from nprnn.util.progress import TrainingBar

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / ".ci" / "gpu"
HAS_GPU = device.cuda_available()[0] and not device.simulator_enabled()
MNIST = ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte.gz",
         "t10k-labels-idx1-ubyte.gz")
DEFAULT_STEPS = ["setup", "tests", "bench", "train", "memcheck", "racecheck"]


def gpu_script_env(**settings):
    """The environment for .ci/gpu in a test: this one without the script's own settings (a
    caller of .ci/gpu may have set them) or a data directory, plus `settings`."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("GPU_STEPS", "GPU_STEP_TIMEOUT", "GPU_DRY_RUN", "GPU_BUDGET",
                        "GPU_SANITIZE_ALL", "GPU_WHEELS", "NPRNN_DATA_DIR", "PYTHON")}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return dict(env, **settings)


def run_script(*args, timeout=120, **settings):
    return subprocess.run(["bash", str(SCRIPT), *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, env=gpu_script_env(**settings))


def data_dir(tmp_path, mnist=True):
    """A data directory, with MNIST's four files (empty: a dry run only looks for them)."""
    data = tmp_path / ("data" if mnist else "no-data")
    (data / "mnist").mkdir(parents=True, exist_ok=True)
    for name in MNIST if mnist else ():
        (data / "mnist" / name).touch()
    return data


def plan(proc):
    """A dry run's plan: {step: (limit, what it runs)} in order, {step: why} left out, and
    the last line's (S, B)."""
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    planned = {m[1]: (int(m[2]), m[3]) for m in
               (re.match(r"== (\S+) \[(\d+) s\]: (.*)", line) for line in lines) if m}
    left = {m[1]: (int(m[2]), m[3]) for m in
            (re.match(r"-- left out: (\S+) \[(\d+) s\]: (.*)", line) for line in lines) if m}
    last = re.fullmatch(r"plan: (\d+) s of (\d+) s", lines[-1])
    assert last, f"the dry run's last line is not 'plan: S s of B s': {lines[-1]!r}"
    return planned, left, (int(last[1]), int(last[2]))


def test_the_dry_run_plan_fits_the_budget_and_names_every_limit(tmp_path):
    """The default plan: setup, the GPU tests, the kernel timings against PyTorch, the training
    run, memcheck and racecheck, each with its limit, adding up to at most GPU_BUDGET (540 s
    by default); what it leaves out is listed with the reason, and nothing runs."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    wheel = wheels / "numpy-2.4.6-cp312-cp312-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl"
    wheel.touch()
    data = data_dir(tmp_path)
    planned, left, (S, B) = plan(run_script(tmp_path / "logs", data, wheels, GPU_DRY_RUN="1"))
    assert list(planned) == DEFAULT_STEPS
    assert S == sum(limit for limit, _ in planned.values()) and B == 540 and S <= B
    assert all(limit > 0 for limit, _ in planned.values())
    assert str(wheel) in planned["setup"][1] and "PYTHONPATH" in planned["setup"][1]
    assert planned["bench"][1].split()[:7] == ["python3", "cli.py", "bench", "--device", "cuda",
                                               "--model", "all"]
    train = planned["train"][1].split()
    assert train[:4] == ["python3", "cli.py", "train", "--model"] and "--iterations" in train
    assert train[train.index("--data-dir") + 1] == str(data)
    for tool in ("memcheck", "racecheck"):
        assert planned[tool][1].startswith(f"compute-sanitizer --tool {tool} ")
        assert planned[tool][1].split()[-3:] == ["split", "tests/gpu/test_gpu_euler.py",
                                                 "tests/gpu/test_gpu_baselines.py"]
    assert set(left) == {"batches", "synccheck", "cpu-batches"}
    assert all("GPU_STEPS" in why for _, why in left.values())
    assert not (tmp_path / "logs").exists()


def test_the_plan_leaves_out_what_does_not_fit_or_cannot_run(tmp_path):
    """A smaller budget leaves steps out and says so; without MNIST the training run is left
    out (a failure when a data directory was named); GPU_STEPS picks steps and their order,
    GPU_STEP_TIMEOUT replaces their limits, GPU_SANITIZE_ALL gives a sanitizer all of
    tests/gpu."""
    data = data_dir(tmp_path)
    planned, left, (S, B) = plan(run_script(tmp_path / "logs", data, GPU_DRY_RUN="1",
                                            GPU_BUDGET="300"))
    assert (B, list(planned)[:2]) == (300, ["setup", "tests"]) and S <= 300
    assert S == sum(limit for limit, _ in planned.values())
    assert "bench" in left and "does not fit in the" in left["bench"][1]
    assert "GPU_BUDGET=300 s" in left["bench"][1]
    assert "no WHEEL_DIR" in planned["setup"][1]

    planned, left, (S, B) = plan(run_script(tmp_path / "logs", data_dir(tmp_path, mnist=False),
                                            GPU_DRY_RUN="1"))
    assert "train" not in planned and S <= B
    assert left["train"][1].startswith("no MNIST in ") and "(a failure" in left["train"][1]
    assert "--tasks ''" not in planned["tests"][1]

    planned, left, (S, B) = plan(run_script(
        tmp_path / "logs", data, GPU_DRY_RUN="1", GPU_STEPS="bench tests synccheck",
        GPU_STEP_TIMEOUT="100", GPU_SANITIZE_ALL="1"))
    assert list(planned) == ["setup", "bench", "tests", "synccheck"]
    assert [limit for limit, _ in planned.values()][1:] == [100, 100, 100]
    assert planned["synccheck"][1].split()[-1] == "tests/gpu"
    assert left["train"][1] == "not in GPU_STEPS" and S == planned["setup"][0] + 300

    planned, left, _ = plan(run_script(tmp_path / "logs", data, GPU_DRY_RUN="1",
                                       GPU_STEPS="batches"))
    assert planned["batches"][1].split()[-2:] == ["--data-dir", str(data)]
    planned, left, _ = plan(run_script(tmp_path / "logs", data_dir(tmp_path, mnist=False),
                                       GPU_DRY_RUN="1", GPU_STEPS="batches"))
    # without MNIST the batch timings take the synthetic tasks only
    assert planned["batches"][1].split()[-2:] == ["--tasks", "''"]


@pytest.mark.parametrize("settings, says", [
    (dict(GPU_STEPS="tests,bench"), "unknown step 'tests,bench' in GPU_STEPS"),
    (dict(GPU_STEPS="tests tests"), "step 'tests' is named twice in GPU_STEPS"),
    (dict(GPU_STEP_TIMEOUT="5m"), "GPU_STEP_TIMEOUT is a whole number of seconds, got '5m'"),
    (dict(GPU_BUDGET="9m"), "GPU_BUDGET is a whole number of seconds, got '9m'"),
    (dict(GPU_BUDGET="30"), "GPU_BUDGET=30 s leaves no time after setup"),
    (dict(GPU_DRY_RUN="yes"), "GPU_DRY_RUN is 0 or 1, got 'yes'"),
    (dict(GPU_WHEELS="no-such-folder"), "no-such-folder holds 0 numpy wheels, not one"),
])
def test_a_bad_setting_stops_it_before_anything_runs(tmp_path, settings, says):
    """A typo used to run nothing and exit 0; now it exits 100, naming the setting."""
    proc = run_script(tmp_path / "logs", GPU_DRY_RUN=settings.pop("GPU_DRY_RUN", "1"),
                      **settings)
    assert proc.returncode == 100
    assert proc.stderr.startswith(".ci/gpu: ") and says in proc.stderr, proc.stderr
    assert not (tmp_path / "logs").exists()


def test_the_gpu_checks_stop_at_once_without_a_gpu(tmp_path):
    """.ci/gpu says why it cannot run, and runs nothing. On a GPU machine
    CUDA_VISIBLE_DEVICES='' hides the GPU (there the test ran every check, and its time ran
    out)."""
    proc = run_script(tmp_path / "logs", CUDA_VISIBLE_DEVICES="")
    assert proc.returncode == 100                    # not a count of failed steps
    assert ".ci/gpu: no GPU to check: " in proc.stderr
    hidden = "the CUDA driver reports no GPU (CUDA_VISIBLE_DEVICES='')"
    assert hidden in proc.stderr if HAS_GPU else (
        device.cuda_available()[1] in proc.stderr or hidden in proc.stderr)
    assert not (tmp_path / "logs").exists()                # nothing made either


# -- a run against a stand-in GPU -----------------------------------------------------------

BENCH_ROWS = [
    dict(model="antisym", impl="nprnn cuda, persistent, matrix in global memory",
         forward=4.8e-3, fwd_bwd=11.3e-3, gflops=876.4, ratio=0.0758, note=""),
    dict(model="antisym", impl="nprnn cuda, split, 8 lanes", forward=0.4e-3, fwd_bwd=0.9e-3,
         gflops=11000.0, ratio=0.00604, note="auto runs this"),
    dict(model="antisym", impl="PyTorch 2.11.0+cu130 eager", forward=36.2e-3, fwd_bwd=149.1e-3,
         gflops=66.5, ratio=1.0),
    dict(model="lstm", impl="nprnn cuda, persistent", forward=9.3e-3, fwd_bwd=45.0e-3,
         gflops=881.5, ratio=8.30, note="auto runs this"),
    dict(model="lstm", impl="PyTorch 2.11.0+cu130 cuDNN", forward=2.3e-3, fwd_bwd=5.4e-3,
         gflops=7318.0, ratio=1.0),
    dict(model="peephole-lstm", impl="nprnn cuda, persistent", forward=9.2e-3, fwd_bwd=45.2e-3,
         gflops=876.8, note="(PyTorch has no such cell)"),
]
TRAIN = """training antisym on mnist in runs/gpu-first
compiling kernels ... 12.3 s (loaded from numba's cache once compiled; not counted as training time)
 10%|###4                              | 100/1000 [00:06<00:55, 16.14it/s, loss 3.7829  acc 0.317]
100%|#################################| 1000/1000 [00:24<00:00, 41.23it/s, loss 0.5928  acc 0.822]
iteration 1000: test loss 0.5016  accuracy 0.8605
final test accuracy after 1000 iterations: 0.8605 (loss 0.5016, 25 s of training)
"""


def stand_in(tmp_path, slow_step=""):
    """A bin/ folder with the stand-in python3 (canned answers for the device check and each
    step; `slow_step` sleeps instead, to be stopped), compute-sanitizer (it refuses the device,
    as on gVisor) and nvidia-smi."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (tmp_path / "bench.txt").write_text("B=128 T=784 m=1 n=128 layers=1 readout=last float32, "
                                        "median of 7; Stand-in GPU\n"
                                        + bench.format_table(BENCH_ROWS) + "\n")
    (tmp_path / "train.txt").write_text(TRAIN)
    scripts = {
        "python3": f"""#!/usr/bin/env bash
case "$*" in
    *cuda_available*) echo "Stand-in GPU, compute capability 9.0" ;;
    *"-m pytest"*)    echo "3 passed, 1 skipped, 2 warnings in 1.00s" ;;
    "cli.py bench"*)  {'sleep 30' if slow_step == 'bench' else f'cat {tmp_path}/bench.txt'} ;;
    "cli.py train"*)  cat {tmp_path}/train.txt ;;
    *)                exec {sys.executable} "$@" ;;
esac
""",
        "compute-sanitizer": """#!/usr/bin/env bash
echo "========= COMPUTE-SANITIZER"
echo "========= Error: Device not supported"
shift 4
"$@"
""",
        "nvidia-smi": "#!/usr/bin/env bash\necho 'Stand-in GPU, 580.00, 1 MiB'\n",
    }
    for name, text in scripts.items():
        path = bin_dir / name
        path.write_text(text)
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return bin_dir


def stand_in_run(tmp_path, **settings):
    bin_dir = stand_in(tmp_path, settings.pop("slow_step", ""))
    env = dict(PATH=os.pathsep.join([str(bin_dir), os.environ["PATH"]]),
               PYTHON=str(bin_dir / "python3"), **settings)
    proc = subprocess.run(["bash", str(SCRIPT), str(tmp_path / "logs"), str(data_dir(tmp_path))],
                          capture_output=True, text=True, timeout=120,
                          env=dict(gpu_script_env(), **env))
    return proc, proc.stdout[proc.stdout.index("== summary"):]


def summary_rows(summary):
    """{step, or model under bench: its row} from the summary table, in its order."""
    return {line.split()[0]: line for line in summary.splitlines()[2:] if line.strip()}


def step_names(summary):
    """The table's steps, in order (the rows under bench, indented, are its models)."""
    return [line.split()[0] for line in summary.splitlines()[2:] if line[:1].strip()]


def test_a_run_ends_with_one_summary_table(tmp_path):
    """Against the stand-in: every planned step runs, each log lands in LOG_DIR, and the
    table gives the tests' counts, the kernel timings beside PyTorch, the training speed,
    and the sanitizers as not available here (the host refused them), which is no failure."""
    proc, summary = stand_in_run(tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = summary_rows(summary)
    assert step_names(summary) == DEFAULT_STEPS + ["batches", "synccheck", "cpu-batches"]
    assert summary.splitlines()[0].startswith("== summary: 0 step(s) failed; ")
    assert "Stand-in GPU" in rows["setup"]
    assert re.search(r"tests +ok +\d+ s +200 s +3 passed, 1 skipped$", rows["tests"])
    assert "fwd+bwd ms, B=128 T=784" in rows["bench"]
    # auto's choice is the fastest here, so no "fastest" part; the ratio is bench's own
    assert rows["antisym"].split(None, 1)[1] == ("auto split, 8 lanes 0.9; PyTorch eager 149.1; "
                                                 "0.01x PyTorch's time")
    assert rows["lstm"].endswith("auto persistent 45.0; PyTorch cuDNN 5.4; 8.30x PyTorch's time")
    assert rows["peephole-lstm"].endswith("fastest persistent 45.2")     # auto unmarked
    assert rows["train"].endswith("41.2 it/s, 49.8 it/s after iteration 100; compiling 12.3 s; "
                                  "test accuracy 0.8605")
    assert "not available here" in rows["memcheck"] and "Device not supported" in rows["memcheck"]
    assert "not available here" in rows["racecheck"]
    assert "racecheck [" not in proc.stdout.split("\nplan: ")[1]    # not run once refused
    assert re.search(r"batches +left out +- +45 s +not a default step", rows["batches"])
    logs = sorted(p.name for p in (tmp_path / "logs").iterdir())
    assert logs == ["bench.txt", "gpu.txt", "memcheck.log", "pytest.log", "train.txt"]
    assert (tmp_path / "logs" / "gpu.txt").read_text().endswith(summary)


def test_a_step_past_its_limit_is_stopped_and_counted(tmp_path):
    """A step still running at its limit is stopped (SIGINT, then SIGKILL 20 s on), counted as
    a failure, and the steps after it run."""
    proc, summary = stand_in_run(tmp_path, slow_step="bench", GPU_STEP_TIMEOUT="2",
                                 GPU_STEPS="bench train")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    rows = summary_rows(summary)
    assert re.search(r"bench +STOPPED +\d+ s +2 s +stopped at 2 s; log bench.txt", rows["bench"])
    assert rows["train"].split()[1] == "ok"


def test_the_summary_reads_what_the_tools_print():
    """pytest's summary line, compute-sanitizer's, train's progress lines, bench's table."""
    spec = importlib.util.spec_from_file_location("gpu_summary", ROOT / ".ci" / "gpu_summary.py")
    summary = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(summary)
    assert summary.pytest_counts("...\n2 failed, 348 passed, 17 skipped, 417 warnings in "
                                 "169.80s (0:02:49)\n") == "2 failed, 348 passed, 17 skipped"
    assert summary.pytest_counts("no summary") == ""
    assert summary.sanitizer_summary(
        "========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)\n") == (
        "RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)")
    assert summary.sanitizer_summary("========= ERROR SUMMARY: 3 errors\n") == (
        "ERROR SUMMARY: 3 errors")
    assert summary.training(TRAIN) == ("41.2 it/s, 49.8 it/s after iteration 100; "
                                       "compiling 12.3 s; test accuracy 0.8605")
    # the lines train's progress bar writes to a log, and the older form of .ci/gpu's H100 run
    log = io.StringIO()
    bar = TrainingBar(1000, 0, stream=log)
    for it, loss, acc in ((100, 3.7829, 0.317), (1000, 0.5928, 0.822)):
        time.sleep(0.01)                                  # a rate, not "?it/s"
        bar.update(it, loss, acc, interval_end=True)
    assert re.fullmatch(r"[\d.]+ it/s, [\d.]+ it/s after iteration 100",
                        summary.training(log.getvalue()))
    assert summary.training("[##-----] 100/1000 16.14 it/s  loss 3.7829\n"
                            "[#######] 1000/1000 41.23 it/s  loss 0.5928\n") == (
        "41.2 it/s, 49.8 it/s after iteration 100")
    rows, shape = summary.bench_rows("shape line\n" + bench.format_table(BENCH_ROWS) +
                                     "\nsomething else\n")
    assert shape == "shape line" and len(rows) == len(BENCH_ROWS)
    assert rows[1] == ("antisym", "nprnn cuda, split, 8 lanes", 0.9, "0.01x", "auto runs this")
    assert rows[-1][3:] == ("-", "(PyTorch has no such cell)")


def test_the_scripts_are_well_formed_bash():
    for script in (SCRIPT, ROOT / ".ci" / "gpu-carry"):
        proc = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        if shutil.which("shellcheck"):
            proc = subprocess.run(["shellcheck", str(script)], capture_output=True, text=True)
            assert proc.returncode == 0, proc.stdout

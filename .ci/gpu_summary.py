"""The table that ends a run of .ci/gpu: one row per step (what ran, its result, its time against
its limit, what it found), read from the step results .ci/gpu records and from the steps' logs.

    python3 .ci/gpu_summary.py RESULTS LOG_DIR

RESULTS holds a line per step, tab-separated: step, result (ok, FAILED, STOPPED, SKIPPED, not
available here, left out), seconds ("-": it did not run), limit in seconds, a note. What each
row found comes from the step's log:

    tests                       pytest's counts                       (pytest.log)
    bench                       a row per model: the kernels 'auto' runs, the fastest
                                option, PyTorch (cuDNN or an eager loop), fwd+bwd ms  (bench.txt)
    train                       it/s over the run and after the first logging interval, the
                                kernels' compile time, the test accuracy  (train.txt)
    memcheck, racecheck, synccheck   pytest's counts and the sanitizer's summary line
                                                                      (<tool>.log)

Standard library only: it runs with whatever python3 ran the steps.
"""
import re
import sys
from pathlib import Path

LOGS = {"tests": "pytest.log", "bench": "bench.txt", "train": "train.txt",
        "batches": "bench_data.txt", "cpu-batches": "bench_data_cpu.txt",
        "memcheck": "memcheck.log", "racecheck": "racecheck.log", "synccheck": "synccheck.log"}


def read(path):
    """The text of a log, '' if there is none (a step that did not run)."""
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def pytest_counts(text):
    """pytest's last summary line, its counts only: "348 passed, 2 failed, 17 skipped"; ''."""
    found = re.findall(r"^=*\s*(\d+ \w+(?:, \d+ \w+)*) in [\d.]+s", text, re.M)
    if not found:
        return ""
    counts = [c for c in found[-1].split(", ") if not c.split()[1].startswith("warning")]
    return ", ".join(counts)


def sanitizer_summary(text):
    """compute-sanitizer's last summary line: "ERROR SUMMARY: 0 errors", "RACECHECK SUMMARY:
    0 hazards displayed (0 errors, 0 warnings)"; ''."""
    found = re.findall(r"^=+ *((?:\w+ )?SUMMARY: .*)$", text, re.M)
    return found[-1].strip() if found else ""


def training(text):
    """"41.2 it/s, 49.8 it/s after iteration 100; compiling 12.3 s; test accuracy 0.8605" from
    train's log: its progress lines, one per logging interval (tqdm's "| 100/1000 [00:06<00:55,
    16.14it/s, loss ...]"; each rate is over the run so far), the compile time it reports
    (kept out of the rates) and its last line; '' if it printed none of them."""
    rates = [(int(i), float(r)) for i, r in
             re.findall(r"\b(\d+)/\d+\b[^\n]*?([\d.]+) ?it/s", text.replace("\r", "\n"))]
    parts = []
    if rates:
        (i1, r1), (i2, r2) = rates[0], rates[-1]
        parts.append(f"{r2:.1f} it/s")
        if i2 > i1 and r1 > 0 and r2 > 0 and i2 / r2 > i1 / r1:
            parts[0] += f", {(i2 - i1) / (i2 / r2 - i1 / r1):.1f} it/s after iteration {i1}"
    compiling = re.findall(r"^compiling kernels \.\.\. ([\d.]+ s)", text, re.M)
    if compiling:
        parts.append(f"compiling {compiling[-1]}")
    accuracy = re.findall(r"final test accuracy after \d+ iterations: ([\d.]+)", text)
    if accuracy:
        parts.append(f"test accuracy {accuracy[-1]}")
    return "; ".join(parts)


def bench_rows(text):
    """bench.txt's table as (model, implementation, fwd+bwd ms or None, ratio, note) tuples
    (ratio: the row's time over PyTorch's, as printed, "-" where there is none), and its
    first line (the shape and the GPU). The table is fixed-width (nprnn/study/bench.py
    format_table): the model, the implementation, then forward ms, fwd+bwd ms, GFLOP/s, the
    ratio, the note."""
    lines = text.splitlines()
    heads = [k for k, line in enumerate(lines)
             if line.startswith("model") and "implementation" in line and "fwd+bwd ms" in line]
    if not heads:
        return [], ""
    head = lines[heads[-1]]
    impl, nums = head.index("implementation"), head.index("forward ms")
    shape = lines[heads[-1] - 1].strip() if heads[-1] > 0 else ""
    rows = []
    for line in lines[heads[-1] + 1:]:
        fields = line[nums:].split(None, 4)
        if len(line) <= nums or len(fields) < 4 or not line[:impl].strip():
            break                                   # the table ends at its first other line
        try:
            ms = float(fields[1])
        except ValueError:
            ms = None                               # "-": not measured
        rows.append((line[:impl].strip(), line[impl:nums].strip(), ms, fields[3],
                     fields[4] if len(fields) > 4 else ""))
    return rows, shape


def bench(text):
    """A line per model: what 'auto' runs and its fwd+bwd time, the fastest option, PyTorch's
    time, and auto's time over PyTorch's (below 1x: nprnn is faster; bench's own ratio, from
    the unrounded times)."""
    rows, shape = bench_rows(text)
    models = list(dict.fromkeys(r[0] for r in rows))
    lines = []
    for model in models:
        ours = [r for r in rows if r[0] == model and r[1].startswith("nprnn") and r[2]]
        theirs = [r for r in rows if r[0] == model and r[1].startswith("PyTorch") and r[2]]
        parts = []
        auto = next((r for r in ours if "auto runs this" in r[4]), None)
        if auto:
            parts.append(f"auto {auto[1].removeprefix('nprnn cuda, ')} {auto[2]:.1f}")
        if ours:
            best = min(ours, key=lambda r: r[2])
            if best is not auto:
                parts.append(f"fastest {best[1].removeprefix('nprnn cuda, ')} {best[2]:.1f}")
        if theirs:
            parts.append(f"PyTorch {theirs[0][1].split()[-1]} {theirs[0][2]:.1f}")
            mine = auto or (min(ours, key=lambda r: r[2]) if ours else None)
            if mine and mine[3] != "-":
                parts.append(f"{mine[3]} PyTorch's time")
        lines.append((model, "; ".join(parts) or "not timed"))
    return lines, shape


def found(step, logs):
    """What a step's log says, for the table: a string, or for bench a list of sub-rows."""
    text = read(logs / LOGS[step]) if step in LOGS else ""
    if step == "tests":
        return pytest_counts(text)
    if step == "train":
        return training(text)
    if step.endswith("check"):
        return "; ".join(p for p in (pytest_counts(text), sanitizer_summary(text)) if p)
    return ""


def table(results, logs):
    """The summary table's lines."""
    rows = [("step", "result", "time", "limit", "found")]
    for line in results.splitlines():
        step, result, seconds, limit, note = (line.split("\t") + [""] * 5)[:5]
        took = f"{seconds} s" if seconds not in ("", "-") else "-"
        what = found(step, logs) if result in ("ok", "FAILED", "STOPPED") else ""
        rows.append((step, result, took, f"{limit} s", "; ".join(p for p in (what, note) if p)))
        if step == "bench" and result in ("ok", "FAILED", "STOPPED"):
            models, shape = bench(read(logs / LOGS["bench"]))
            if models:
                rows[-1] = rows[-1][:4] + (f"fwd+bwd ms, {shape}".rstrip(", "),)
                rows += [(f"  {model}", "", "", "", what) for model, what in models]
    widths = [max(len(r[k]) for r in rows) for k in range(4)]
    return [f"{r[0]:<{widths[0]}}  {r[1]:<{widths[1]}}  {r[2]:>{widths[2]}}  "
            f"{r[3]:>{widths[3]}}  {r[4]}".rstrip() for r in rows]


def main(argv):
    if len(argv) != 3:
        sys.exit(f"usage: {argv[0]} RESULTS LOG_DIR")
    print("\n".join(table(Path(argv[1]).read_text(), Path(argv[2]))))


if __name__ == "__main__":
    main(sys.argv)

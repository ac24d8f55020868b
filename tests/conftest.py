"""Settings every test shares, and the session's summary (with or without pytest-xdist)."""

import pytest


@pytest.fixture(autouse=True, scope="session")
def private_kernel_choices(tmp_path_factory):
    """The GPU autotuner's choices (nprnn/core/autotune.py) go to a folder of the test session, not
    to the user's ~/.cache/nprnn, where timings of the tests' tiny models would sit beside real
    ones."""
    mp = pytest.MonkeyPatch()
    mp.setenv("NPRNN_CACHE_DIR", str(tmp_path_factory.mktemp("nprnn-cache")))
    yield
    mp.undo()


def pytest_collection_modifyitems(items):
    """The modules that hold slow tests spread evenly through the collection, each whole (its
    module fixtures set up once) with its slow tests first, so that pytest-xdist's workers
    (worksteal hands out contiguous shares) each start on some rather than one ending on them;
    the simulator's runs last: by then the CPU tests have compiled the CPU kernels into numba's
    cache, which a run started at once would compile again, as would each one beside it (2
    minutes a run on a fresh clone)."""
    def marked(item, name):
        return item.get_closest_marker(name) is not None

    sims = [item for item in items if marked(item, "simulator")]
    rest = [item for item in items if not marked(item, "simulator")]
    slow_paths = list(dict.fromkeys(item.path for item in rest if marked(item, "slow")))
    blocks = [sorted((item for item in rest if item.path == path),
                     key=lambda item: not marked(item, "slow")) for path in slow_paths]
    others = [item for item in rest if item.path not in slow_paths] + sims
    spread, done = [], 0
    for k, block in enumerate(blocks):      # block k starts at k/len(blocks) of the collection
        upto = min(max(done, round(k * len(items) / len(blocks)) - len(spread) + done),
                   len(others))
        spread += others[done:upto] + block
        done = upto
    items[:] = spread + others[done:]


def pytest_terminal_summary(terminalreporter, config):
    """The skipped tests, one line per reason with its count (pytest's -rs gives a line per
    place, 191 on a machine without a GPU, most of them saying the same); and what ptxas said of
    each kernel for sm_90 (tests/test_ptx.py), a table to read kernel changes by."""
    _ptxas_table(terminalreporter, config)
    reasons = {}
    for report in terminalreporter.stats.get("skipped", []):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        reason = reason.removeprefix("Skipped: ")
        reasons[reason] = reasons.get(reason, 0) + 1
    if reasons:
        terminalreporter.section("skipped, by reason")
        for reason, count in sorted(reasons.items(), key=lambda item: -item[1]):
            terminalreporter.line(f"{count:5d}  {reason}")


@pytest.fixture
def forward_spy(monkeypatch):
    """spy(cell) -> a dict that each later cell.forward call fills with the parameters p it was
    given and the states array hs it wrote (nprnn.torch's tests: what the kernels touched)."""
    def spy(cell):
        seen = {}
        forward = cell.forward

        def recording(p, x, *args, **kwargs):
            h_T, cache = forward(p, x, *args, **kwargs)
            seen.update(p=p, hs=cache["hs"])
            return h_T, cache
        monkeypatch.setattr(cell, "forward", recording)
        return seen
    return spy


PTXAS_REPORT = pytest.StashKey[list]()


@pytest.fixture
def ptxas_report(request):
    """The list a test appends what ptxas said of a kernel to (tests/test_ptx.py)."""
    return request.config.stash.setdefault(PTXAS_REPORT, [])


def pytest_sessionfinish(session):
    """An xdist worker sends its rows of the ptxas table to the controlling process."""
    if hasattr(session.config, "workeroutput"):
        session.config.workeroutput["ptxas_report"] = session.config.stash.get(PTXAS_REPORT, [])


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """The controlling process gathers the workers' rows."""
    rows = getattr(node, "workeroutput", {}).get("ptxas_report", [])
    node.config.stash.setdefault(PTXAS_REPORT, []).extend(rows)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config):
    """`-n auto`: one worker per CPU this process may use, at most 8 (each imports numba and
    compiles its own kernels; past 8, the longest tests, not the workers, set the time)."""
    from nprnn.core.device import usable_cpus   # here, not at the top: nprnn imports numba
    return min(8, usable_cpus())


def _ptxas_table(terminalreporter, config):
    rows = config.stash.get(PTXAS_REPORT, [])
    if not rows:
        return
    terminalreporter.section("kernels assembled for sm_90 by ptxas: registers per thread, at "
                             "the largest block; static shared memory, local memory and spills "
                             "(bytes; dynamic shared memory is the launchers', docs/gpu.md)")
    terminalreporter.line(f"{'kernel':<50} {'dtype':<8} {'regs':>5} {'threads':>8} "
                          f"{'block regs':>11} {'shared':>7} {'local':>6} {'spills':>7}")
    for r in sorted(rows, key=lambda r: (r["kernel"], r["dtype"])):
        terminalreporter.line(f"{r['kernel']:<50} {r['dtype']:<8} {r['registers']:>5} "
                              f"{r['threads']:>8} {r['block']:>11,} {r['shared']:>7} "
                              f"{r['local']:>6} {r['spills']:>7}")

"""Settings every test shares."""
import pytest


@pytest.fixture(autouse=True, scope="session")
def private_kernel_choices(tmp_path_factory):
    """The GPU autotuner's choices (nprnn/autotune.py) go to a folder of the test session, not
    to the user's ~/.cache/nprnn, where timings of the tests' tiny models would sit beside real
    ones."""
    mp = pytest.MonkeyPatch()
    mp.setenv("NPRNN_CACHE_DIR", str(tmp_path_factory.mktemp("nprnn-cache")))
    yield
    mp.undo()


def pytest_terminal_summary(terminalreporter):
    """The skipped tests, one line per reason with its count (pytest's -rs gives a line per
    place, 191 on a machine without a GPU, most of them saying the same)."""
    reasons = {}
    for report in terminalreporter.stats.get("skipped", []):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        reason = reason.removeprefix("Skipped: ")
        reasons[reason] = reasons.get(reason, 0) + 1
    if reasons:
        terminalreporter.section("skipped, by reason")
        for reason, count in sorted(reasons.items(), key=lambda item: -item[1]):
            terminalreporter.line(f"{count:5d}  {reason}")

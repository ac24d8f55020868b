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

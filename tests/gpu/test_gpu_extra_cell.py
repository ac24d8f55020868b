"""The GPU half of tests/test_extra_cell.py: a cell added from one spec (tests/extra_cell.py)
gets the GPU twin checks of every registered cell (test_gpu_model.py's, over the registry: the
model on cuda against the CPU in each kernel version, a given h_0 and dh_0), with no other file
touched."""
import pytest

import extra_cell
import gpu_testing as gt
import test_gpu_model

pytestmark = gt.requires_cuda

# each registry check of test_gpu_model, in each kernel version it runs the registered cells in
CHECKS = [(check, version)
          for values in (test_gpu_model.VERSIONS, test_gpu_model.H0_VERSIONS)
          for check in extra_cell.registry_checks(test_gpu_model, "name, version", values)
          for version in dict.fromkeys(version for _, version in values)]


@pytest.fixture(autouse=True)
def registered(monkeypatch):
    extra_cell.register(monkeypatch)
    gt.small_launch(monkeypatch)


def test_the_registry_checks_were_found():
    assert {check.__name__ for check, _ in CHECKS} >= {
        "test_model_on_cuda_matches_cpu", "test_a_given_h0_and_its_gradient_dh0_match_the_cpu"}


@pytest.mark.parametrize("check, version", CHECKS,
                         ids=[f"{check.__name__}-{version}" for check, version in CHECKS])
def test_a_cell_from_one_spec_gets_every_gpu_twin_check(check, version):
    check(extra_cell.NAME, version)

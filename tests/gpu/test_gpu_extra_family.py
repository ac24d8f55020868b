"""The GPU half of tests/test_extra_family.py: a family added in three files (tests/extra_family/)
gets the GPU twin checks of every registered cell (test_gpu_model.py's, over the registry: the
model on cuda against the CPU, a given h_0 and dh_0), in each GPU version its spec gives it
(`test_gpu_model.gpu_versions`: here version 1, "step", alone), and float32 beside float64."""
import pytest

import extra_cell
import gpu_testing as gt
import test_gpu_model
from extra_family import kernels as K
from extra_family import spec

pytestmark = gt.requires_cuda

VERSIONS = test_gpu_model.gpu_versions(spec.SPEC)
CHECKS = [(check, version)
          for values in (test_gpu_model.VERSIONS, test_gpu_model.H0_VERSIONS)
          for check in extra_cell.registry_checks(test_gpu_model, "name, version", values)
          for version in VERSIONS]


@pytest.fixture(autouse=True)
def registered(monkeypatch):
    spec.register(monkeypatch)
    gt.small_launch(monkeypatch)


def test_the_registry_checks_were_found():
    assert VERSIONS == ("step",)
    assert {check.__name__ for check, _ in CHECKS} >= {
        "test_model_on_cuda_matches_cpu", "test_a_given_h0_and_its_gradient_dh0_match_the_cpu"}


@pytest.mark.parametrize("check, version", CHECKS,
                         ids=[f"{check.__name__}-{version}" for check, version in CHECKS])
def test_a_family_from_three_files_gets_every_gpu_twin_check(check, version):
    check(spec.NAME, version)


def test_its_float32_model_on_cuda_matches_the_cpu():
    test_gpu_model.test_float32_model_on_cuda_matches_cpu(spec.NAME)


def test_a_gpu_twin_that_is_not_the_cpus_fails(monkeypatch):
    """A GPU forward pass with another leak (alpha = 1: the vanilla RNN) than its CPU twin's."""
    def other_leak(hs, th, x, W, V_h, b_h, alpha, lengths, **launch):
        K.leaky_forward_gpu(hs, th, x, W, V_h, b_h, 2 * alpha, lengths, **launch)
    monkeypatch.setattr(spec.SPEC, "forward_kernels", K.leaky_forward._replace(gpu=other_leak))
    with pytest.raises(AssertionError):
        test_gpu_model.test_model_on_cuda_matches_cpu(spec.NAME, "step")

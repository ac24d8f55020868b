"""A cell added from one spec (tests/extra_cell.py) gets the checks every registered cell gets,
with no file of nprnn or of the tests touched: the registry-driven tests of test_cells.py
(central finite differences against the reference and the kernels, the kernels against the
reference, float32 against float64, workspaces, the parameter count its spec declares), its
kernels' PTX and a row of `bench`.
"""
import numpy as np
import pytest

import extra_cell
import test_cells
from nprnn.study import bench

CELL_CHECKS = extra_cell.registry_checks(test_cells, "name", test_cells.CELL_NAMES)


@pytest.fixture(autouse=True)
def registered(monkeypatch):
    extra_cell.register(monkeypatch)


def test_the_registry_checks_were_found():
    names = {check.__name__ for check in CELL_CHECKS}
    assert {"test_reference_bptt_matches_finite_differences",
            "test_kernel_bptt_matches_finite_differences",
            "test_initial_state_gradient_matches_finite_differences",
            "test_kernels_match_reference_float64",
            "test_float32_kernels_agree_with_float64",
            "test_exact_parameter_counts_and_the_params_command"} <= names, names


@pytest.mark.parametrize("check", CELL_CHECKS, ids=lambda check: check.__name__)
def test_a_cell_from_one_spec_gets_every_cell_check(check):
    extra_cell.run_check(check, extra_cell.NAME)


def test_a_wrong_spec_fails_the_checks(monkeypatch):
    """The checks bite: the same spec with the antisymmetric models' reference (another cell's
    equations) fails the kernel-against-reference check."""
    from nprnn.core import reference
    monkeypatch.setattr(extra_cell.SPEC, "reference", (
        lambda p, x, eps, h0=None: reference.ablation_forward(p, x, eps, 0.5, h0=h0),
        lambda p, cache, dh_T, eps: reference.ablation_backward(p, cache, dh_T, eps, 0.5)))
    with pytest.raises(AssertionError):
        extra_cell.run_check(test_cells.test_kernels_match_reference_float64, extra_cell.NAME)


def test_its_kernels_are_compiled_to_ptx():
    """test_ptx.py compiles every kernel of the modules it scans; the spec's GPU twins are
    there."""
    test_ptx = pytest.importorskip("test_ptx")
    spec = extra_cell.SPEC
    for twins in (spec.forward_kernels, spec.backward_kernels):
        for host_function in (twins.gpu, twins.gpu_persistent):
            assert host_function.__module__ in test_ptx.MODULES


def test_bench_times_it_and_counts_its_flops():
    (row,) = bench.run([extra_cell.NAME], B=2, T=3, m=1, n=4, repeat=1, with_torch=False)
    assert row["model"] == extra_cell.NAME and row["fwd_bwd"] > 0
    # one recurrent product and two input products (h and z) of 4 units per step and row
    assert bench.flops(extra_cell.NAME, 2, 3, 1, 4) == (2 * 3 * 2 * 4 * (4 + 2),
                                                        2 * 3 * 2 * 4 * (4 + 2)
                                                        + 2 * 3 * 2 * 4 * (8 + 2))
    assert np.isfinite(row["gflops"])

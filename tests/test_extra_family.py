"""A cell family added in three files (tests/extra_family/: its kernels, its reference, its spec)
gets the checks every registered cell gets, with no test table edited for it: the registry-driven
tests of test_cells.py (central finite differences against the reference and the kernels, the
kernels against the reference, float32 against float64, workspaces, the parameter count its spec
declares) and of test_analysis.py (Jacobians), its kernels' PTX and registers on sm_90, a row of
`bench`, and the layers of its imports. tests/gpu/test_gpu_extra_family.py checks its GPU twins.
Each kind of mistake in a family's files is shown to fail a check.
"""
from pathlib import Path

import numpy as np
import pytest

import extra_cell
from extra_cell import run_check
import test_analysis
import test_cells
import test_layers
from extra_family import kernels as K
from extra_family import reference, spec
from nprnn.study import bench

CHECKS = (extra_cell.registry_checks(test_cells, "name", test_cells.CELL_NAMES)
          + extra_cell.registry_checks(test_analysis, "name", sorted(spec.CELLS))
          + extra_cell.registry_checks(test_analysis, "name", list(spec.CELLS)))


@pytest.fixture(autouse=True)
def registered(monkeypatch):
    spec.register(monkeypatch)


def test_the_registry_checks_were_found():
    names = {check.__name__ for check in CHECKS}
    assert {"test_reference_bptt_matches_finite_differences",
            "test_kernel_bptt_matches_finite_differences",
            "test_initial_state_gradient_matches_finite_differences",
            "test_kernels_match_reference_float64",
            "test_float32_kernels_agree_with_float64",
            "test_exact_parameter_counts_and_the_params_command",
            "test_jacobian_matches_finite_differences"} <= names, names


@pytest.mark.parametrize("check", CHECKS, ids=lambda check: check.__name__)
def test_a_family_from_three_files_gets_every_cell_check(check):
    run_check(check, spec.NAME)


def wrong_backward(p, cache, dh_T, alpha):
    """leaky_backward without the leak's path, dh_{t-1} = da_t W only (a slip in the oracle)."""
    grads, _ = reference.leaky_backward(p, cache, dh_T, alpha)
    x, ys = cache["x"], cache["ys"]
    dh = np.array(dh_T, dtype=np.float64)
    for t in reversed(range(x.shape[1])):
        dh = (dh * alpha * (1.0 - ys[t] ** 2)) @ p["W"]
    return grads, dh


@pytest.mark.parametrize("mistake, check", [
    # the formula forgets b_h: the model's arrays and num_params count n more
    (("count", lambda m, n: n * n + n * m),
     test_cells.test_exact_parameter_counts_and_the_params_command),
    # the reference is another cell's (alpha = 1, the vanilla RNN): the kernels disagree with it
    (("reference", (lambda p, x, alpha, h0=None: reference.leaky_forward(p, x, 1.0, h0=h0),
                    lambda p, cache, dh_T, alpha: reference.leaky_backward(p, cache, dh_T, 1.0))),
     test_cells.test_kernels_match_reference_float64),
    # the reference's BPTT drops the leak's path to dh_0: finite differences disagree with it
    (("reference", (reference.leaky_forward, wrong_backward)),
     test_cells.test_initial_state_gradient_matches_finite_differences),
], ids=["count", "kernels-vs-reference", "reference-vs-finite-differences"])
def test_a_wrong_spec_fails_the_checks(monkeypatch, mistake, check):
    monkeypatch.setattr(spec.SPEC, *mistake)
    with pytest.raises(AssertionError):
        run_check(check, spec.NAME)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_its_kernels_compile_to_ptx_and_fit_a_block_on_sm90(monkeypatch, tmp_path, ptxas_report,
                                                            dtype):
    """test_ptx.py's two checks of each kernel, on the kernel modules of the spec's twins."""
    test_ptx = pytest.importorskip("test_ptx")
    if test_ptx.simulator_enabled():
        pytest.skip("the CUDA simulator has no PTX compiler")
    found = test_ptx.kernels(test_ptx.kernel_modules(spec.SPEC))
    assert sorted(name for _, name, _ in found) == ["leaky_backward_unit_kernel",
                                                    "leaky_forward_step_kernel"]
    test_ptx.target_without_a_gpu(monkeypatch)
    for module, name, kernel in found:
        test_ptx.test_kernel_compiles_to_ptx_for_sm90(None, module, name, kernel, dtype)
        test_ptx.test_kernel_fits_its_largest_block_on_sm90(None, tmp_path, ptxas_report, module,
                                                            name, kernel, dtype)


def test_a_kernel_argument_of_no_declared_kind_fails(monkeypatch):
    """alpha is declared in the kernels file's ARG_KINDS; without it the PTX check cannot type
    the kernel, and says so."""
    test_ptx = pytest.importorskip("test_ptx")
    monkeypatch.setattr(K, "ARG_KINDS", {})
    step = K.leaky_forward_step_kernel
    with pytest.raises(AssertionError, match="argument 'alpha' has no entry in ARG_KINDS"):
        test_ptx.arg_types(step.py_func.__name__, step.py_func, "float32")


def test_bench_times_it_and_counts_its_flops():
    (row,) = bench.run([spec.NAME], B=2, T=3, m=1, n=4, repeat=1, with_torch=False)
    assert row["model"] == spec.NAME and row["fwd_bwd"] > 0 and np.isfinite(row["gflops"])
    # per step and row: one recurrent product (4 x 4) and one input product (4 x 1)
    assert bench.flops(spec.NAME, 2, 3, 1, 4) == (2 * 3 * 2 * 4 * (4 + 1),
                                                  2 * 3 * 2 * 4 * (4 + 1)
                                                  + 2 * 3 * 2 * 4 * (8 + 1))


# each file of the family in the layer of what it stands for: a family's file of kernels/, the
# reference, and a spec just above cells.py (whose Cell it extends)
LAYERS = {"kernels.py": test_layers.LAYER["nprnn.kernels.rnn"],
          "reference.py": test_layers.LAYER["nprnn.core.reference"],
          "spec.py": test_layers.LAYER["nprnn.core.cells"] - 0.5}
FAMILY = Path(spec.__file__).parent


@pytest.mark.parametrize("file, layer", LAYERS.items())
def test_its_files_import_down_the_layers(file, layer):
    assert test_layers.upward_imports(FAMILY / file, f"extra_family.{file[:-3]}",
                                      test_layers.modules(), layer) == []


def test_a_file_in_the_wrong_layer_fails():
    """The spec's imports (the model's backends and cells) run up from the kernels' layer."""
    wrong = test_layers.upward_imports(FAMILY / "spec.py", "extra_family.spec",
                                       test_layers.modules(), LAYERS["kernels.py"])
    assert any("imports nprnn.core.cells" in w for w in wrong), wrong

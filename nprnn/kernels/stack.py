"""Stacked layers: layer l + 1 reads layer l's hidden sequence h_1 .. h_T as its input x, so BPTT
hands each layer below the gradient of its outputs, dL/dx of the layer above.

Every cell reads x_t only through products with input matrices W (V_h and V_z of the Euler
cells, weight_ih of the baselines): pre-activation u_t = W x_t + ... So once a layer's BPTT has
stored dL/du_t for every step (its `da`, which the weight gradient dW = sum_t du_t^T x_t reads
as well),

    dL/dx_t = sum over the cell's input products of du_t W          (row form: (B, P) @ (P, m))

one product over all T*B rows, with no recurrence. `cells.Cell.input_grads` calls it once per
input product, accumulating from the second on.

    input_grad_cpu(dx, D, W, accumulate)    dx (T, B, m) (+)= D (T, B, P) @ W (P, m)
    input_grad_gpu(...)                     the same on the device: one launch per step of
                                            gpu_common.rows_times_matrix_kernel
"""
from .common import Twins, matmul_nn_rows, njit
from .gpu_common import rows_times_matrix_gpu


@njit
def input_grad_cpu(dx, D, W, accumulate):
    """dx (+)= D W over every step: dx (T, B, m) written (=), or added to (+=) when
    `accumulate`; D (T, B, P) the pre-activation gradients of one input product, W (P, m) its
    matrix. One (T*B, P) @ (P, m) product, its rows split across threads."""
    T, B, m = dx.shape
    matmul_nn_rows(dx.reshape(T * B, m), D.reshape(T * B, D.shape[2]), W, accumulate)


def input_grad_gpu(dx, D, W, accumulate, *, block=(128, 1)):
    """Twin of input_grad_cpu (device arrays): per step t, dx[t] (+)= D[t] W."""
    for t in range(dx.shape[0]):
        rows_times_matrix_gpu(dx[t], D, W, t, accumulate, block=block)


input_grad = Twins(input_grad_cpu, input_grad_gpu,
                   gpu_options=lambda launch: dict(block=launch.step_block))

"""ONNX node tests through tvm_hetero.build: whatever the Relax VM gets right, we get right too.

A fixed sample of the ONNX backend node test cases (single-op models with inputs and expected
outputs; see tvm_hetero.testing.onnx_node_cases), each run through the Relax VM and, when the VM
passes it, built by tvm_hetero.build for two CPU devices twice: every op on device 0, and a seeded
random split of the ops over both devices. Ours must match the expected outputs in both.

The sample: up to two single-op cases for each common op (Conv, Gemm, MatMul, Relu, ...), plus
every 16th case of those the VM passed in a full sweep (bench/onnx_node_sweep.py), sorted by name.
Cases ours is known to fail are marked xfail(strict=True), by cause, so that a fix shows up as a
failure here until its mark is removed.
"""

from __future__ import annotations

import collections
import functools

import pytest
from tvm_hetero.testing.onnx_node_cases import (
    NodeCase,
    iter_cases,
    random_placement,
    run_case_ours,
    run_case_vm,
)

pytest.importorskip("onnx")

# fmt: off
SAMPLE = [
    "test_abs", "test_add", "test_add_uint16", "test_and_bcast3v1d", "test_argmax_default_axis_example",
    "test_argmax_negative_axis_keepdims_example",
    "test_argmax_negative_axis_keepdims_random_select_last_index",
    "test_argmin_negative_axis_keepdims_random_select_last_index", "test_averagepool_1d_default",
    "test_averagepool_2d_default", "test_averagepool_2d_precomputed_strides",
    "test_averagepool_3d_dilations_small", "test_basic_conv_with_padding", "test_batchnorm_epsilon",
    "test_batchnorm_example", "test_bitshift_left_uint8", "test_bitwise_and_ui8_bcast_4v3d",
    "test_cast_BFLOAT16_to_FLOAT", "test_cast_FLOAT16_to_FLOAT", "test_cast_e8m0_FLOAT8E8M0_to_FLOAT16",
    "test_castlike_FLOAT_to_BFLOAT16", "test_clip", "test_clip_default_int8_min_expanded",
    "test_clip_default_min", "test_compress_0", "test_concat_1d_axis_0", "test_concat_3d_axis_0",
    "test_concat_3d_axis_negative_3", "test_conv_with_strides_and_asymmetric_padding",
    "test_convtranspose", "test_convtranspose_group_2", "test_cos", "test_depthtospace_crd_mode_example",
    "test_depthtospace_example", "test_div", "test_div_int32_trunc", "test_div_int8",
    "test_einsum_batch_diagonal", "test_einsum_scalar", "test_equal", "test_equal_uint16", "test_erf",
    "test_exp", "test_exp_example", "test_expand_dim_unchanged", "test_flatten_axis0",
    "test_flatten_default_axis", "test_flatten_negative_axis3", "test_gather_0", "test_gather_2d_indices",
    "test_gelu_default_1", "test_gelu_default_2", "test_gelu_tanh_1", "test_gemm_all_attributes",
    "test_gemm_default_scalar_bias", "test_gemm_transposeB", "test_globalaveragepool",
    "test_globalaveragepool_precomputed", "test_greater", "test_greater_equal_uint16_expanded",
    "test_greater_uint16", "test_gridsample_bicubic_align_corners_0_additional_1",
    "test_group_normalization_example", "test_hardsigmoid", "test_hardsigmoid_default",
    "test_instancenorm_epsilon", "test_instancenorm_example", "test_leakyrelu", "test_leakyrelu_default",
    "test_less_equal_int8", "test_log", "test_log_example", "test_logsoftmax_example_1_expanded_ver18",
    "test_lrn_default", "test_matmul_1d_1d", "test_matmul_3d", "test_max_int8", "test_maxpool_1d_default",
    "test_maxpool_2d_precomputed_strides", "test_maxpool_2d_same_lower", "test_min_int16",
    "test_mod_int64_fmod", "test_mul", "test_mul_int8",
    "test_nllloss_NCd1d2_no_weight_reduction_mean_ii_expanded", "test_not_2d", "test_not_3d",
    "test_optional_get_element_tensor", "test_pow", "test_pow_bcast_scalar", "test_pow_example",
    "test_reduce_max_default_axes_keepdim_example", "test_reduce_max_default_axes_keepdims_random",
    "test_relu", "test_rms_normalization_4d_axis_negative_1", "test_scatternd", "test_sigmoid",
    "test_sigmoid_example", "test_sin_example", "test_slice", "test_slice_neg", "test_softmax_axis_0",
    "test_softmax_axis_1", "test_softmax_default_axis", "test_softmax_negative_axis_expanded",
    "test_spacetodepth_expanded", "test_split_1d_uneven_split_opset18", "test_split_equal_parts_2d",
    "test_sqrt", "test_sqrt_example", "test_sub", "test_sub_int16", "test_sub_int8", "test_tanh",
    "test_tanh_example", "test_tile", "test_transpose_all_permutations_0",
    "test_transpose_all_permutations_3", "test_tril_square", "test_unique_sorted_with_axis_3d",
    "test_where_example", "test_where_long_example", "test_xor_bcast3v2d",
]
# fmt: on

# Known failures, by cause (see the module docstring of onnx_node_cases for the harness).
DYNAMIC_SHAPE = (
    "static shapes only (by design): a shape depends on an input's values, or the frontend gives a "
    "0-sized dimension a symbolic size"
)
SHAPE_BUILTIN = "the frontend emits vm.builtin.tensor_to_shape (a function call), which lowering rejects"
KNOWN_FAILURES = {
    "test_castlike_FLOAT_to_BFLOAT16": DYNAMIC_SHAPE,
    "test_compress_0": DYNAMIC_SHAPE,
    "test_expand_dim_unchanged": SHAPE_BUILTIN,
    "test_slice": DYNAMIC_SHAPE,
    "test_slice_neg": DYNAMIC_SHAPE,
    "test_tile": DYNAMIC_SHAPE,
    "test_unique_sorted_with_axis_3d": DYNAMIC_SHAPE,
}
COMMON_OPS = (
    "Conv", "Gemm", "MatMul", "Relu", "Add", "Mul", "Concat", "Transpose", "Softmax", "BatchNormalization",
    "MaxPool", "AveragePool", "Gather", "Slice", "Split", "Where", "Cast", "Clip", "Sigmoid", "Tanh",
)  # fmt: skip
PLACEMENTS = ("device0", "random_split")

counts: collections.Counter = collections.Counter()


@pytest.fixture(scope="module", autouse=True)
def print_counts():
    yield
    print(
        f"\nONNX node parity sample: {len(SAMPLE)} cases; VM passes {counts['vm']}; ours passes "
        f"{counts['device0']} all on device 0, {counts['random_split']} with a random split"
    )


@functools.cache
def sample_cases() -> dict[str, NodeCase]:
    return {case.name: case for case in iter_cases(SAMPLE)}


@functools.cache
def vm_result(name: str):
    result = run_case_vm(sample_cases()[name])
    counts["vm"] += result.passed
    return result


def test_sample_covers_the_common_ops() -> None:
    ops = {op for case in sample_cases().values() for op in case.ops}
    assert not set(COMMON_OPS) - ops
    assert len(ops) >= 60, sorted(ops)


@pytest.mark.parametrize("placement", PLACEMENTS)
@pytest.mark.parametrize(
    "name",
    [
        pytest.param(name, marks=pytest.mark.xfail(strict=True, reason=KNOWN_FAILURES[name]))
        if name in KNOWN_FAILURES
        else name
        for name in SAMPLE
    ],
)
def test_ours_matches_expected_where_the_vm_does(name: str, placement: str) -> None:
    vm = vm_result(name)
    # The sample holds only cases the pinned Relax VM passes; if it stops passing, the sample is stale.
    assert vm.passed, f"sample is stale: the Relax VM now fails {name}: {vm.reason}"
    case = sample_cases()[name]
    result = run_case_ours(case, None if placement == "device0" else random_placement(name))
    counts[placement] += result.passed
    assert result.passed, f"{name} [{placement}]: {result.reason}"

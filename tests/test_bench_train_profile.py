"""benchmarks.train_profile's kernel table: kernel names as an H100 trace of the 1B training step shows them."""

import pytest

from benchmarks.train_profile import device_kernels, kernel_kind


@pytest.mark.parametrize("name, kind", [
    ("sm90_xmma_gemm_f32f32_tf32f32_f32_nt_n_tilesize128x256x32_warpgroupsize2x1x1_execute_segment", "matmul"),
    ("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_TNT", "matmul"),
    ("gemm_fusion_dot_15", "matmul"),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_26_64x64x64_1x4x1", "attention"),
    ("void cudnn::fusion::convert_dq_to_16bits<true>(void const*, void*, unsigned int)", "attention"),
    ("memcpy128", "copy"),
    ("loop_dynamic_update_slice_fusion_8", "copy"),
    ("input_scatter_fusion_1", "scatter/gather"),
    ("input_reduce_fusion_23", "reduce"),
    ("loop_add_fusion_6", "fusion"),
    ("wrapped_convert_1", "fusion"),
    ("some_custom_kernel", "other"),
])
def test_kernel_kind_by_name(name, kind):
    assert kernel_kind(name) == kind


def test_a_folder_without_a_trace_gives_empty_tables(tmp_path):
    assert device_kernels(str(tmp_path), 3) == ([], [])

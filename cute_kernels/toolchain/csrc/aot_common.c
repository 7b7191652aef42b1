/* Entry points shared by every exported variant: ABI checks and error names for the Python loader.
 * A family whose launch takes an args struct adds its cute_aot_<family>_args_size() here. */
#include <cuda_runtime.h>
#include "fp8_gemm_aot.h"
#include "prefill_aot.h"
#include "fused_ops_aot.h"
#include "decode_aot.h"

#define EXPORT __attribute__((visibility("default")))

EXPORT int32_t cute_aot_abi_version(void) { return CUTE_AOT_ABI; }

EXPORT int32_t cute_aot_prefill_args_size(void) { return (int32_t)sizeof(cute_aot_prefill_args_t); }

EXPORT int32_t cute_aot_fused_ops_args_size(void) { return (int32_t)sizeof(cute_aot_fused_ops_args_t); }

EXPORT int32_t cute_aot_decode_args_size(void) { return (int32_t)sizeof(cute_aot_decode_args_t); }

EXPORT int32_t cute_aot_decode_merge_args_size(void) { return (int32_t)sizeof(cute_aot_decode_merge_args_t); }

EXPORT int32_t cute_aot_fp8_gemm_args_size(void) { return (int32_t)sizeof(cute_aot_fp8_gemm_args_t); }

EXPORT int32_t cute_aot_fp8_quant_args_size(void) { return (int32_t)sizeof(cute_aot_fp8_quant_args_t); }

EXPORT const char *cute_aot_error_name(int32_t err) {
    if (err == CUTE_AOT_NOT_LOADED) return "cute_aot: kernel variant launched before it was loaded";
    return cudaGetErrorName((cudaError_t)err);
}

EXPORT const char *cute_aot_error_string(int32_t err) {
    if (err == CUTE_AOT_NOT_LOADED) return "call cute_aot_<variant>_load() first";
    return cudaGetErrorString((cudaError_t)err);
}

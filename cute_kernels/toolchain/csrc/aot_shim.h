/* The part of every family's C shim that does not depend on the kernel's arguments: naming macros and
 * cute_aot_<variant>_load(). A shim is compiled once per variant:
 *     cc -DCUTE_AOT_PREFIX=<variant> -include <variant>.h -c <family>_aot_shim.c
 * includes this header, and defines cute_aot_<variant>_launch(args, stream), which starts with
 * CUTE_AOT_REQUIRE_LOADED() and returns a cudaError_t value (0 = success).
 */
#pragma once
#include <stdint.h>
#include <cuda_runtime.h>
#include "aot_common.h"

#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)
#define DSL(suffix) CAT(CUTE_AOT_PREFIX, suffix)              /* names from the DSL header */
#define API(suffix) CAT(CAT(cute_aot_, CUTE_AOT_PREFIX), suffix) /* names we export */
#define EXPORT __attribute__((visibility("default")))
#define CUTE_AOT_REQUIRE_LOADED() do { if (!loaded_) return CUTE_AOT_NOT_LOADED; } while (0)

static DSL(_Kernel_Module_t) module_;
static int loaded_;

/* Like the header's <variant>_Kernel_Module_Load, but returns the first error instead of printing. */
EXPORT int32_t API(_load)(void) {
    if (loaded_) return cudaSuccess;
    cudaLibrary_t *library = &module_.module;
    cudaError_t ret = cudaSuccess;
    struct { cudaLibrary_t **library; cudaError_t *ret; } init_args = {&library, &ret};
    CAT(CAT(_mlir_, CUTE_AOT_PREFIX), _cuda_init)((void **)&init_args);
    if (ret != cudaSuccess) return ret;
    int32_t count = 0, device = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess) return err;
    struct { cudaLibrary_t **library; int32_t *device; cudaError_t *ret; } load_args = {&library, &device, &ret};
    for (device = 0; device < count; device++) {
        CAT(CAT(_mlir_, CUTE_AOT_PREFIX), _cuda_load_to_device)((void **)&load_args);
        if (ret != cudaSuccess) return ret;
    }
    loaded_ = 1;
    return cudaSuccess;
}

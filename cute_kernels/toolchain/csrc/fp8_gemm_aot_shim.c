/* Plain C entry point for ONE exported FP8 GEMM variant, around the DSL-generated header (see
 * aot_shim.h). Every tensor descriptor carries two runtime sizes and the row stride; the initializers
 * fail to compile (-Werror) if the kernel's signature changes shape. */
#include "aot_shim.h"
#include "fp8_gemm_aot.h"

_Static_assert(sizeof(DSL(_Tensor_a_t)) == 24, "a descriptor: 2 dynamic shapes, 1 dynamic stride");
_Static_assert(sizeof(DSL(_Tensor_scale_b_t)) == 24, "scale_b descriptor: 2 shapes, 1 stride");
#ifdef FP8_GEMM_SPLIT_K /* fp8_gemm_splitk_aot_shim.c: C is the fp32 workspace [splits, m, n] */
_Static_assert(sizeof(DSL(_Tensor_c_t)) == 40, "workspace descriptor: 3 dynamic shapes, 2 dynamic strides");
#define C_DESCRIPTOR {g->c, {g->splits, g->m, g->n}, {g->c_split_stride, g->c_stride}}
#else
_Static_assert(sizeof(DSL(_Tensor_c_t)) == 24, "c descriptor: 2 dynamic shapes, 1 dynamic stride");
#define C_DESCRIPTOR {g->c, {g->m, g->n}, {g->c_stride}}
#endif

EXPORT int32_t API(_launch)(const cute_aot_fp8_gemm_args_t *g, void *stream) {
    CUTE_AOT_REQUIRE_LOADED();
    DSL(_Tensor_a_t) a = {g->a, {g->m, g->k}, {g->a_stride}};
    DSL(_Tensor_b_t) b = {g->b, {g->n, g->k}, {g->b_stride}};
    DSL(_Tensor_c_t) c = C_DESCRIPTOR;
    DSL(_Tensor_scale_a_t) sa = {g->scale_a, {g->m, g->scale_cols}, {g->scale_a_stride}};
    DSL(_Tensor_scale_b_t) sb = {g->scale_b, {g->scale_b_rows, g->scale_cols}, {g->scale_b_stride}};
    return CAT(CAT(cute_dsl_, CUTE_AOT_PREFIX), _wrapper)(&module_, &a, &b, &c, &sa, &sb, (cudaStream_t)stream);
}

/* Plain C entry point for the exported per-token FP8 quantizer (see aot_shim.h): x and q carry two
 * runtime sizes and the row stride, scale [m, 1] only its rows. */
#include "aot_shim.h"
#include "fp8_gemm_aot.h"

_Static_assert(sizeof(DSL(_Tensor_x_t)) == 24, "x descriptor: 2 dynamic shapes, 1 dynamic stride");
_Static_assert(sizeof(DSL(_Tensor_scale_t)) == 16, "scale descriptor: 1 shape, no stride");

EXPORT int32_t API(_launch)(const cute_aot_fp8_quant_args_t *g, void *stream) {
    CUTE_AOT_REQUIRE_LOADED();
    DSL(_Tensor_x_t) x = {g->x, {g->m, g->k}, {g->x_stride}};
    DSL(_Tensor_q_t) q = {g->q, {g->m, g->k}, {g->q_stride}};
    DSL(_Tensor_scale_t) scale = {g->scale, {g->m}};
    return CAT(CAT(cute_dsl_, CUTE_AOT_PREFIX), _wrapper)(&module_, &x, &q, &scale, (cudaStream_t)stream);
}

/* Plain C entry point for ONE exported split-KV merge variant (see decode_aot_shim.c and aot_shim.h). */
#include "aot_shim.h"
#include "decode_aot.h"

_Static_assert(sizeof(DSL(_Tensor_mOPartial_t)) == 40, "partial output: 3 shapes, 2 strides");
_Static_assert(sizeof(DSL(_Tensor_mO_t)) == 24, "out: 2 shapes, 1 stride");

EXPORT int32_t API(_launch)(const cute_aot_decode_merge_args_t *a, void *stream) {
    CUTE_AOT_REQUIRE_LOADED();
    DSL(_Tensor_mOPartial_t) op = {a->out_partial, {a->splits, a->total_q, a->heads},
                                   {a->out_partial_strides[0], a->out_partial_strides[1]}};
    DSL(_Tensor_mLSEPartial_t) lp = {a->lse_partial, {a->splits, a->total_q, a->heads},
                                     {a->lse_partial_strides[0], a->lse_partial_strides[1]}};
    DSL(_Tensor_mO_t) o = {a->out, {a->total_q, a->heads}, {a->out_stride}};
    DSL(_Tensor_mLSE_t) lse = {a->lse, {a->total_q, a->heads}, {a->lse_stride}};
    return CAT(CAT(cute_dsl_, CUTE_AOT_PREFIX), _wrapper)(&module_, &op, &lp, &o, &lse, (cudaStream_t)stream);
}

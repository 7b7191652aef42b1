/* Plain C entry point for ONE exported decode-attention variant, around the DSL-generated header.
 * Compiled once per variant (see aot_shim.h, which defines cute_aot_<variant>_load()); exports
 * cute_aot_<variant>_launch(args, stream), returning a cudaError_t value (0 = success) or
 * CUTE_AOT_NOT_LOADED. The initializers fail to compile (-Werror) if the kernel's signature changes
 * shape, and the size guards if a descriptor gains or loses a dynamic mode.
 */
#include "aot_shim.h"
#include "decode_aot.h"

/* Layout guards: data pointer + int32 shapes + int64 strides (x86-64 padding included). */
_Static_assert(sizeof(DSL(_Tensor_mQ_t)) == 24, "q descriptor: 2 dynamic shapes, 1 dynamic stride");
_Static_assert(sizeof(DSL(_Tensor_mKCache_t)) == 32, "cache descriptor: 2 shapes, 2 strides");
_Static_assert(sizeof(DSL(_Tensor_mContextLens_t)) == 16, "context lens: 1 shape, no stride");
_Static_assert(sizeof(DSL(_Tensor_mKScale_t)) == 16, "k scale: 1 shape, no stride");
_Static_assert(sizeof(DSL(_Tensor_mOPartial_t)) == 40, "partial output: 3 shapes, 2 strides");
_Static_assert(sizeof(DSL(_Tensor_mLSEPartial_t)) == 40, "partial lse: 3 shapes, 2 strides");

EXPORT int32_t API(_launch)(const cute_aot_decode_args_t *a, void *stream) {
    CUTE_AOT_REQUIRE_LOADED();
    DSL(_Tensor_mQ_t) q = {a->q, {a->total_q, a->heads}, {a->q_stride}};
    DSL(_Tensor_mKCache_t) kc = {a->k_cache, {a->num_blocks, a->kv_heads},
                                 {a->k_cache_strides[0], a->k_cache_strides[1]}};
    DSL(_Tensor_mVCache_t) vc = {a->v_cache, {a->num_blocks, a->kv_heads},
                                 {a->v_cache_strides[0], a->v_cache_strides[1]}};
    DSL(_Tensor_mBlockTables_t) bt = {a->block_tables, {a->batch, a->max_blocks}, {a->block_tables_stride}};
    DSL(_Tensor_mContextLens_t) cl = {a->context_lens, {a->batch}};
    DSL(_Tensor_mCuSeqlensQ_t) cq = {a->cu_seqlens_q, {a->batch + 1}};
    DSL(_Tensor_mO_t) o = {a->out, {a->total_q, a->heads}, {a->out_stride}};
    DSL(_Tensor_mLSE_t) lse = {a->lse, {a->total_q, a->heads}, {a->lse_stride}};
    DSL(_Tensor_mOPartial_t) op = {a->out_partial, {a->partial_splits, a->partial_rows, a->heads},
                                   {a->out_partial_strides[0], a->out_partial_strides[1]}};
    DSL(_Tensor_mLSEPartial_t) lp = {a->lse_partial, {a->partial_splits, a->partial_rows, a->heads},
                                     {a->lse_partial_strides[0], a->lse_partial_strides[1]}};
    DSL(_Tensor_mKScale_t) ks = {a->k_scale, {a->kv_heads}};
    DSL(_Tensor_mVScale_t) vs = {a->v_scale, {a->kv_heads}};
    return CAT(CAT(cute_dsl_, CUTE_AOT_PREFIX), _wrapper)(&module_, &q, &kc, &vc, &bt, &cl, &cq, &o, &lse, &op, &lp,
                                                          &ks, &vs, a->softmax_scale_log2, a->num_splits, (cudaStream_t)stream);
}

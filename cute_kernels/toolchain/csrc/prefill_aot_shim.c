/* Plain C entry points for ONE exported prefill variant, around the DSL-generated header.
 *
 * Compiled once per variant (see aot_shim.h, which defines cute_aot_<variant>_load()); exports
 * cute_aot_<variant>_launch(args, stream), returning a cudaError_t value (0 = success) or CUTE_AOT_NOT_LOADED.
 * The DSL's tensor descriptors carry only the runtime-sized modes and the strides that are not
 * compile-time constants; the initializers below fail to compile (-Werror) if the kernel's
 * signature changes shape, so a stale shim can never mis-pack arguments silently.
 */
#include "aot_shim.h"
#include "prefill_aot.h"

/* Layout guards: data pointer + int32 shapes + int64 strides (x86-64 padding included). */
_Static_assert(sizeof(DSL(_Tensor_mQ_t)) == 24, "q descriptor: 2 dynamic shapes, 1 dynamic stride");
_Static_assert(sizeof(DSL(_Tensor_mKCache_t)) == 32, "cache descriptor: 2 shapes, 2 strides");
_Static_assert(sizeof(DSL(_Tensor_mBlockTables_t)) == 24, "block tables: 2 shapes, 1 stride");
_Static_assert(sizeof(DSL(_Tensor_mPrefixLens_t)) == 16, "prefix lens: 1 shape, no stride");
_Static_assert(sizeof(DSL(_Tensor_mLSE_t)) == 24, "lse: 2 shapes, 1 stride");
_Static_assert(sizeof(DSL(_Tensor_mTileOrder_t)) == 16, "tile order: 1 shape, no stride");
_Static_assert(sizeof(DSL(_Tensor_mKScale_t)) == 16, "k scale: 1 shape, no stride");

EXPORT int32_t API(_launch)(const cute_aot_prefill_args_t *a, void *stream) {
    CUTE_AOT_REQUIRE_LOADED();
    DSL(_Tensor_mQ_t) q = {a->q, {a->total_q, a->heads}, {a->q_stride}};
    DSL(_Tensor_mK_t) k = {a->k, {a->total_k, a->kv_heads}, {a->k_stride}};
    DSL(_Tensor_mV_t) v = {a->v, {a->total_k, a->kv_heads}, {a->v_stride}};
    DSL(_Tensor_mKCache_t) kc = {a->k_cache, {a->num_blocks, a->kv_heads},
                                 {a->k_cache_strides[0], a->k_cache_strides[1]}};
    DSL(_Tensor_mVCache_t) vc = {a->v_cache, {a->num_blocks, a->kv_heads},
                                 {a->v_cache_strides[0], a->v_cache_strides[1]}};
    DSL(_Tensor_mBlockTables_t) bt = {a->block_tables, {a->batch, a->max_blocks}, {a->block_tables_stride}};
    DSL(_Tensor_mPrefixLens_t) pl = {a->prefix_lens, {a->batch}};
    DSL(_Tensor_mCuSeqlensQ_t) cq = {a->cu_seqlens_q, {a->batch + 1}};
    DSL(_Tensor_mCuSeqlensK_t) ck = {a->cu_seqlens_k, {a->batch + 1}};
    DSL(_Tensor_mO_t) o = {a->out, {a->total_q, a->heads}, {a->out_stride}};
    DSL(_Tensor_mLSE_t) lse = {a->lse, {a->total_q, a->heads}, {a->lse_stride}};
    DSL(_Tensor_mTileOrder_t) tiles = {a->tile_order, {a->num_tiles}};
    DSL(_Tensor_mKScale_t) ks = {a->k_scale, {a->kv_heads}};
    DSL(_Tensor_mVScale_t) vs = {a->v_scale, {a->kv_heads}};
    return CAT(CAT(cute_dsl_, CUTE_AOT_PREFIX), _wrapper)(&module_, &q, &k, &v, &kc, &vc, &bt, &pl, &cq, &ck, &o,
                                                          &lse, &tiles, &ks, &vs, a->softmax_scale_log2, a->max_seqlen_q,
                                                          a->num_ctas, (cudaStream_t)stream);
}

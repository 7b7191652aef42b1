/* Plain C entry point for ONE exported fused-op variant, around the DSL-generated header: see
 * aot_shim.h (which defines cute_aot_<variant>_load()) and fused_ops_aot.h (the args struct).
 * The initializers fail to compile (-Werror) if the kernel signature changes shape.
 */
#include "aot_shim.h"
#include "fused_ops_aot.h"

_Static_assert(sizeof(DSL(_Tensor_mA_t)) == 24, "matrix descriptor: 2 dynamic shapes, 1 dynamic stride");
_Static_assert(sizeof(DSL(_Tensor_mSlots_t)) == 16, "slots: 1 shape, no stride");

#define MATRIX(type, i) type CAT(t, i) = {a->m[i].data, {a->m[i].rows, a->m[i].cols}, {a->m[i].row_stride}}

EXPORT int32_t API(_launch)(const cute_aot_fused_ops_args_t *a, void *stream) {
    CUTE_AOT_REQUIRE_LOADED();
    MATRIX(DSL(_Tensor_mA_t), 0);
    MATRIX(DSL(_Tensor_mB_t), 1);
    MATRIX(DSL(_Tensor_mC_t), 2);
    MATRIX(DSL(_Tensor_mD_t), 3);
    MATRIX(DSL(_Tensor_mE_t), 4);
    DSL(_Tensor_mSlots_t) slots = {a->slots, {a->num_slots}};
    return CAT(CAT(cute_dsl_, CUTE_AOT_PREFIX), _wrapper)(&module_, &t0, &t1, &t2, &t3, &t4, &slots, a->scalar,
                                                          (cudaStream_t)stream);
}

// The float softmax row kernels of model/softmax_rows.hpp, one build per instruction-set level.
#include "model/softmax_rows.hpp"

#include "model/simd.hpp"

namespace moe {
namespace {

MOE_SIMD_KERNEL(masked_f32, softmax_row_masked_impl, (float* pr, int first, int last, int n),
                (pr, first, last, n))
MOE_SIMD_KERNEL(backward_f32, softmax_row_backward_impl, (float* dr, const float* pr, int n),
                (dr, pr, n))

}  // namespace

void softmax_row_masked(float* pr, int first, int last, int n) {
  masked_f32(pr, first, last, n);
}

void softmax_row_backward(float* dr, const float* pr, int n) {
  backward_f32(dr, pr, n);
}

}  // namespace moe

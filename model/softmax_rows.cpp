// The float softmax row kernels of model/softmax_rows.hpp, one build per instruction-set level.
#include "model/softmax_rows.hpp"

#include "model/simd.hpp"

namespace moe {
namespace {

MOE_SIMD_KERNEL(masked_f32, softmax_rows_masked_groups,
                (float* p, int64_t ld, int rows, int first, int last, int n),
                (p, ld, rows, first, last, n))
MOE_SIMD_KERNEL(backward_f32, softmax_rows_backward_groups,
                (float* d, const float* p, int64_t ld, int rows, int n), (d, p, ld, rows, n))

}  // namespace

void softmax_rows_masked(float* p, int64_t ld, int rows, int first, int last, int n) {
  masked_f32(p, ld, rows, first, last, n);
}

void softmax_rows_backward(float* d, const float* p, int64_t ld, int rows, int n) {
  backward_f32(d, p, ld, rows, n);
}

}  // namespace moe

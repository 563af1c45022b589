// Linear layer forward and backward as GEMMs through the checked wrapper in model/blas.hpp.
// Legend: N rows/tokens, I input width, O output width.
#include "model/linear.hpp"

#include "model/blas.hpp"

namespace moe {

template <class T>
void linear_forward(T* out, const T* in, const T* weight, int N, int I, int O,
                    std::source_location where) {
  // out[N,O] = in[N,I]·weight[I,O]
  gemm<T>(false, false, N, O, I, T(1), in, weight, T(0), out, where);
}

template <class T>
void linear_backward_input(T* d_in, const T* d_out, const T* weight, int N, int I, int O,
                           std::source_location where) {
  // out = in·weight  ->  d_in[N,I] += d_out[N,O]·weightᵀ[O,I]
  gemm<T>(false, true, N, I, O, T(1), d_out, weight, T(1), d_in, where);
}

template <class T>
void linear_backward_input_overwrite(T* d_in, const T* d_out, const T* weight, int N, int I, int O,
                                     std::source_location where) {
  gemm<T>(false, true, N, I, O, T(1), d_out, weight, T(0), d_in, where);
}

template <class T>
void linear_backward(T* d_in, T* d_weight, const T* d_out, const T* in, const T* weight, int N,
                     int I, int O, std::source_location where) {
  if (d_in != nullptr) linear_backward_input(d_in, d_out, weight, N, I, O, where);
  // out = in·weight  ->  d_weight[I,O] += inᵀ[I,N]·d_out[N,O]
  gemm<T>(true, false, I, O, N, T(1), in, d_out, T(1), d_weight, where);
}

template void linear_forward<float>(float*, const float*, const float*, int, int, int,
                                    std::source_location);
template void linear_forward<double>(double*, const double*, const double*, int, int, int,
                                     std::source_location);
template void linear_backward_input<float>(float*, const float*, const float*, int, int, int,
                                           std::source_location);
template void linear_backward_input<double>(double*, const double*, const double*, int, int, int,
                                            std::source_location);
template void linear_backward_input_overwrite<float>(float*, const float*, const float*, int, int,
                                                     int, std::source_location);
template void linear_backward_input_overwrite<double>(double*, const double*, const double*, int,
                                                      int, int, std::source_location);
template void linear_backward<float>(float*, float*, const float*, const float*, const float*, int,
                                     int, int, std::source_location);
template void linear_backward<double>(double*, double*, const double*, const double*, const double*,
                                      int, int, int, std::source_location);

}  // namespace moe

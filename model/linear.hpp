// A bias-free linear layer out = in·W over the model's GEMM (model/blas.hpp), forward and backward.
// Used for the router's backward, the experts' projections, attention projections and the LM head.
// Legend: N rows/tokens, I input width, O output width (e.g. I = D model width, O = F expert
// width, E experts or V vocab); D, F, E, K top-k, V as in the rest of model/.
#pragma once

namespace moe {

// out = in·weight (overwrites out).
template <class T>
void linear_forward(T* out,           // [N,O]
                    const T* in,      // [N,I]
                    const T* weight,  // [I,O]
                    int N, int I, int O);

// d_in += d_out·weightᵀ: the input's half of linear_backward, for callers that run the two halves
// as separate tasks.
template <class T>
void linear_backward_input(T* d_in,          // [N,I]
                           const T* d_out,   // [N,O]
                           const T* weight,  // [I,O]
                           int N, int I, int O);

// d_in += d_out·weightᵀ (skipped when d_in is nullptr: then only the weight's half);
// d_weight += inᵀ·d_out.
template <class T>
void linear_backward(T* d_in,          // [N,I], may be nullptr
                     T* d_weight,      // [I,O]
                     const T* d_out,   // [N,O]
                     const T* in,      // [N,I]
                     const T* weight,  // [I,O]
                     int N, int I, int O);

}  // namespace moe

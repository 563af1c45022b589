// A bias-free linear layer out = in·W over the model's GEMM (model/blas.hpp), forward and backward.
// Used for the router's backward, the experts' projections, attention projections and the LM head.
// Each passes its caller's source location on to the GEMM, so that a GEMM observer
// (gemm_observe, model/blas.hpp; bench_step --gemm-sites) names the layer's line, not this file's.
// Legend: N rows/tokens, I input width, O output width (e.g. I = D model width, O = F expert
// width, E experts or V vocab); D, F, E, K top-k, V as in the rest of model/.
#pragma once

#include <source_location>

namespace moe {

// out = in·weight (overwrites out).
template <class T>
void linear_forward(T* out,           // [N,O]
                    const T* in,      // [N,I]
                    const T* weight,  // [I,O]
                    int N, int I, int O,
                    std::source_location where = std::source_location::current());

// d_in += d_out·weightᵀ: the input's half of linear_backward, for callers that run the two halves
// as separate tasks.
template <class T>
void linear_backward_input(T* d_in,          // [N,I]
                           const T* d_out,   // [N,O]
                           const T* weight,  // [I,O]
                           int N, int I, int O,
                           std::source_location where = std::source_location::current());

// d_in = d_out·weightᵀ, overwriting d_in (a GEMM with beta 0): the bits of linear_backward_input
// into zeros, except that an element whose k-chain underflowed to −0 stays −0 where adding it to
// +0 gives +0. A reader that takes each element as x + 0 gets exactly those bits (−0 + 0 = +0, and
// x + 0 = x for every other x).
template <class T>
void linear_backward_input_overwrite(T* d_in,          // [N,I]
                                     const T* d_out,   // [N,O]
                                     const T* weight,  // [I,O]
                                     int N, int I, int O,
                                     std::source_location where = std::source_location::current());

// d_in += d_out·weightᵀ (skipped when d_in is nullptr: then only the weight's half);
// d_weight += inᵀ·d_out.
template <class T>
void linear_backward(T* d_in,          // [N,I], may be nullptr
                     T* d_weight,      // [I,O]
                     const T* d_out,   // [N,O]
                     const T* in,      // [N,I]
                     const T* weight,  // [I,O]
                     int N, int I, int O,
                     std::source_location where = std::source_location::current());

}  // namespace moe

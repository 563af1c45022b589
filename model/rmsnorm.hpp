// RMSNorm with a learned gain, forward and backward: out = in·rstd·weight per row, where
// rstd = 1/sqrt(mean(in²) + eps) is saved by the forward for the backward.
// Legend: N rows/tokens, D model width (F expert width, E experts, K top-k, V vocab unused here).
#pragma once

namespace moe {

// Overwrites out and rstd. The mean of squares is accumulated in double, so a float row of any
// width loses no more than the final rounding.
template <class T>
void rmsnorm_forward(T* out,           // [N,D]
                     T* rstd,          // [N] saved for the backward
                     const T* in,      // [N,D]
                     const T* weight,  // [D]
                     int N, int D, float eps);

// d_in += ∂L/∂in, d_weight += ∂L/∂weight, using the forward's saved rstd.
template <class T>
void rmsnorm_backward(T* d_in,          // [N,D]
                      T* d_weight,      // [D]
                      const T* d_out,   // [N,D]
                      const T* in,      // [N,D]
                      const T* weight,  // [D]
                      const T* rstd,    // [N] from rmsnorm_forward
                      int N, int D);

// rmsnorm_backward of B sequences of S rows in one pass: d_in as there; leaves[b] (overwritten) =
// sequence b's ∂L/∂weight, each column adding the sequence's rows in order from zero.
template <class T>
void rmsnorm_backward_sequences(T* d_in,          // [B·S, D]
                                T* leaves,        // [B, D]
                                const T* d_out,   // [B·S, D]
                                const T* in,      // [B·S, D]
                                const T* weight,  // [D]
                                const T* rstd,    // [B·S] from rmsnorm_forward
                                int B, int S, int D);

}  // namespace moe

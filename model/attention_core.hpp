// The masked softmax core of attention, one sequence at a time, by tiles of query rows (see
// attention_core.cpp). Legend as in model/attention.hpp: S sequence length, H heads, KVH kv heads,
// hd head dim, HD = H·hd, KD = KVH·hd, Tq query rows per tile, Kt keys a tile sees.
#pragma once

#include "model/attention.hpp"

namespace moe {

// concat[S, HD] = softmax(q·kᵀ/sqrt(hd) + mask)·v for one sequence, its probabilities kept in
// probs[S, H, Kt] for the backward; q [S, HD] after RoPE, k_t [KD, S] (k transposed), v [S, KD].
template <class T>
void attn_core_forward(T* concat, T* probs, const T* q, const T* k_t, const T* v,
                       const AttnDims& dims);

// The backward of attn_core_forward: d_q [S, HD] written, d_k and d_v [S, KD] added into, from
// d_concat [S, HD], the forward's probs, q, k [S, KD] and v_t [KD, S] (v transposed). Scratch:
// d_p [Tq, H, Kt], d_k_heads and d_v_heads [H, S, hd].
template <class T>
void attn_core_backward(T* d_q, T* d_k, T* d_v, T* d_p, T* d_k_heads, T* d_v_heads,
                        const T* d_concat, const T* probs, const T* q, const T* k, const T* v_t,
                        const AttnDims& dims);

}  // namespace moe

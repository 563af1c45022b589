// Causal grouped-query self-attention with RoPE and an optional sliding window, forward
// and backward on the CPU, as in llama/DeepSeek decoders. Per sequence of S tokens:
//
//   q = rope(in·Wq), k = rope(in·Wk), v = in·Wv        (position p = token index in its sequence)
//   P_h = softmax_row(q_h·k_gᵀ/sqrt(hd) + mask),       g = h / (H/KVH), the kv head of query head h
//   out = concat_h(P_h·v_g)·Wo
//
// mask: query position s sees key position j iff j <= s and j > s − W (W = 0: every j <= s), so a
// query sees at most W keys, itself included.
// RoPE rotates consecutive pairs (llama's "rotate pairs" / complex convention, not GPT-NeoX's
// "rotate halves"): with ω_i = theta^(-2i/hd), i in [0, hd/2), at position p
//   x'[2i]   = x[2i]·cos(p·ω_i) − x[2i+1]·sin(p·ω_i)
//   x'[2i+1] = x[2i]·sin(p·ω_i) + x[2i+1]·cos(p·ω_i)
//
// Legend: B sequences, S sequence length, D model width, H heads, KVH kv heads, hd head dim,
// W sliding window (0 = full causal), Wk = keys a query row sees at most (min(W, S), or S when
// W = 0), Tq query rows per tile of the GEMM core, Kt = keys a tile sees (min(S, Tq + Wk − 1)).
#pragma once

#include <vector>

#include "model/config.hpp"
#include "model/tree_sum.hpp"

namespace moe {

struct AttnDims {
  int D = 0, H = 0, KVH = 0, hd = 0, S = 0;
  int window = 0;  // W; 0 = full causal
  float rope_theta = 10000.0f;
};
AttnDims attn_dims_from(const ModelConfig& cfg);

// Wk: the longest row of visible keys.
int attn_keys_per_row(const AttnDims& dims);

// Kt: the keys a tile of Tq query rows sees, the row length of AttnSaved::probs.
int attn_keys_per_tile(const AttnDims& dims);

// Tq: the query rows of a tile of the core (a sequence's last tile may hold fewer).
int attn_query_tile_rows();

// Element counts of AttnSaved's buffers for up to max_B sequences, the one source of both
// attn_saved_reserve and model_memory_estimate. Doubles, so that sizes that are then refused are
// counted without overflow.
struct AttnSavedSizes {
  // q and concat [B, S, HD]; k, v [B, S, KD]; probs [B, S, H, Kt].
  double q = 0, kv = 0, probs = 0;
  // Scratch of one sequence, one set per thread when there are several sequences (one set for
  // one sequence, whose tasks share it): d_q, d_concat, d_k_heads, d_v_heads [S, HD]; d_k, d_v
  // [S, KD]; kv_t [KD, S] (k transposed in the forward, v in the backward: d_kv values too);
  // d_probs [min(S, query tile), H, Kt].
  double d_q = 0, d_kv = 0, d_probs = 0;
  int threads = 1;
  // The weight gradients' per-sequence leaves, [Wq, Wk, Wv, Wo] one after the other: Wq and Wo
  // [D, HD], Wk and Wv [D, KD]; one set per sequence when there are several (one sequence adds
  // into the gradients directly).
  double tree_q = 0, tree_kv = 0;
  int leaf_sets = 0;
  // A layer's own buffers (AttnSaved less its scratch); the scratch (AttnScratch) less its
  // leaves; the leaves, which are scratch too.
  double activations() const { return 2 * q + 2 * kv + probs; }
  double scratch() const { return threads * (4 * d_q + 3 * d_kv + d_probs); }
  double trees() const { return leaf_sets * (2 * tree_q + 2 * tree_kv); }
};
AttnSavedSizes attn_saved_sizes(int max_B, const AttnDims& dims, int threads);

// Pointers to one layer's attention weights (parameters or, with the same layout, gradients).
template <class T> struct AttnWeights {
  T* wq;  // [D, H·hd]
  T* wk;  // [D, KVH·hd]
  T* wv;  // [D, KVH·hd]
  T* wo;  // [H·hd, D]
};

// RoPE's angles, computed once (in double) per (S, hd, theta) and shared by every layer and step.
struct RopeTable {
  int S = 0, hd = 0;
  float theta = 0.0f;
  std::vector<double> cos, sin;  // [S, hd/2] cos(p·ω_i), sin(p·ω_i)
};
RopeTable rope_table_make(int S, int hd, float theta);

// Rotates x in place: row s of x holds num_heads vectors of hd at position s (rows = rope.S).
template <class T>
void rope_forward(T* x,  // [S, num_heads·hd]
                  const RopeTable& rope, int num_heads);

// x' = R_s·x  ->  d_x = R_sᵀ·d_x': rotates d_x in place by the opposite angles.
template <class T>
void rope_backward(T* d_x,  // [S, num_heads·hd]
                   const RopeTable& rope, int num_heads);

// The temporaries of one layer's forward or backward, which nothing keeps from one call to the
// next: a model's layers share one set, each borrowing it for its calls (as MoeScratch,
// model/moe_layer.hpp). Those of one sequence come one set per thread ([threads, …]) when
// max_B > 1: a task per sequence uses its thread's set.
template <class T> struct AttnScratch {
  int max_B = 0;  // sequences reserved for (the leaves'; 0: not reserved)
  int threads = 0;
  std::vector<T> d_concat;  // [S, H·hd]
  std::vector<T> d_q;       // [S, H·hd]
  std::vector<T> d_k, d_v;  // [S, KVH·hd]
  std::vector<T> d_probs;   // [Tq, H, Kt] one tile of ∂L/∂P, then of ∂L/∂scores
  std::vector<T> kv_t;      // [KD, S] k (forward) or v (backward) transposed, kv_t[c·S + s]
  std::vector<T> d_k_heads, d_v_heads;  // [H, S, hd] each head's share of d_k, d_v, summed
                                        //   over the heads of a group in head order
  // With several sequences, each one's weight-gradient leaves [max_B, Wq | Wk | Wv | Wo], added
  // along the tree over sequences (model/tree_sum.hpp) once all are in.
  std::vector<T> leaves;
};

// Activations kept from forward for backward, and the temporaries of a call. Sized once for max_B
// sequences by attn_saved_reserve; forward and backward allocate nothing.
template <class T> struct AttnSaved {
  int max_B = 0;          // sequences reserved for
  int B = 0;              // sequences of the last forward
  std::vector<T> q;       // [max_B·S, H·hd] after RoPE
  std::vector<T> k;       // [max_B·S, KVH·hd] after RoPE
  std::vector<T> v;       // [max_B·S, KVH·hd]
  std::vector<T> probs;   // [max_B, S, H, Kt] row (s, h) of a query tile: the tile's keys lo ..
                          //   in columns 0 .. n−1 (see attention.cpp), 0 where s does not
                          //   see the key; columns >= n unused
  std::vector<T> concat;  // [max_B·S, H·hd] heads' outputs P_h·v_g side by side

  // The temporaries of a call (own, or a model's shared set lent for the call: AttnScratch).
  AttnScratch<T> scratch;
};

// Checks dims (positive sizes, KVH divides H, hd even, W >= 0) and sizes saved for max_B sequences
// and the OpenMP threads a parallel region gets now (a forward or backward with more threads adds
// scratch). Without own_scratch, saved.scratch is left empty: a model's layers borrow one set
// (attn_scratch_reserve) for each call.
template <class T>
void attn_saved_reserve(AttnSaved<T>& saved, int max_B, const AttnDims& dims,
                        bool own_scratch = true);
template <class T>
void attn_scratch_reserve(AttnScratch<T>& scratch, int max_B, const AttnDims& dims);

// out[B·S, D] = Attn(in) for B independent sequences (B <= saved.max_B and saved.scratch.max_B;
// rope made for dims' S, hd, rope_theta; else std::invalid_argument, as attention_backward). A
// token's output is bitwise independent of B: see attention.cpp.
template <class T>
void attention_forward(T* out,  // [B·S, D]
                       AttnSaved<T>& saved,
                       const T* in,  // [B·S, D] RMS-normalised by the caller
                       const AttnWeights<T>& w, const AttnDims& dims, const RopeTable& rope, int B);

// d_in += ∂L/∂in, grads += ∂L/∂weights, for the last forward (same B, same in and w).
template <class T>
void attention_backward(T* d_in,  // [B·S, D]
                        const AttnWeights<T>& grads,
                        const T* d_out,  // [B·S, D]
                        AttnSaved<T>& saved,
                        const T* in,  // [B·S, D] the forward's input
                        const AttnWeights<T>& w, const AttnDims& dims, const RopeTable& rope,
                        int B);

}  // namespace moe

// Attention forward and backward: projections through linear_forward/linear_backward (model/gemm/),
// RoPE as plain loops, the masked softmax core by query tiles (model/attention_core.cpp).
// Legend: B sequences, S sequence length, D model width, H heads, KVH kv heads, hd head dim,
// W sliding window, Wk keys a query row sees at most, Tq query rows per tile, Kt keys a tile sees;
// HD = H·hd, KD = KVH·hd row widths of q and k/v.
//
// Every sequence is processed on its own, projections included (linear_forward with M = S rows),
// rather than as one [B·S, D] GEMM (which BLAS libraries round by their M; model/gemm/ does not,
// but the weight gradients go by sequence anyway). Per sequence, a token's result depends only on
// its sequence, bitwise, whatever number of sequences a rank holds (B = 1 or 4 per rank, 8 or 2
// ranks for the same global batch): the activations of a sequence do not depend on how the batch
// was split.
#include "model/attention.hpp"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "model/attention_core.hpp"
#include "model/blas.hpp"
#include "model/linear.hpp"
#include "model/parallel.hpp"
#include "model/prefetch.hpp"
#include "numeric/det_math.hpp"

namespace moe {

// Tq, query rows per tile of the core. Smaller tiles score fewer masked keys (a tile scores
// Tq + Wk − 1 keys per row, Wk of them visible at most), larger ones make larger GEMMs; at
// deepseek4-tiny's S = 256, W = 128, hd = 32, tiles of 16 to 64 rows measured within noise of
// each other on one core, 32 the best of them in bench_step.
constexpr int kQueryTile = 32;

AttnDims attn_dims_from(const ModelConfig& c) {
  return AttnDims{c.d_model, c.heads,          c.kv_heads,  c.head_dim,
                  c.seq_len, c.sliding_window, c.rope_theta};
}

int attn_keys_per_row(const AttnDims& d) {
  return (d.window > 0 && d.window < d.S) ? d.window : d.S;
}

int attn_query_tile_rows() {
  return kQueryTile;
}

int attn_keys_per_tile(const AttnDims& d) {
  // In 64 bits: S near 2^31 is counted (and then refused) by model_memory_estimate.
  return static_cast<int>(std::min<int64_t>(d.S, int64_t{kQueryTile} + attn_keys_per_row(d) - 1));
}

RopeTable rope_table_make(int S, int hd, float theta) {
  if (S <= 0 || hd <= 0 || hd % 2 != 0 || !(theta > 0.0f)) {
    throw std::invalid_argument(
        "rope_table_make: need S > 0, even hd > 0, theta > 0; got S=" + std::to_string(S) +
        " hd=" + std::to_string(hd) + " theta=" + std::to_string(theta));
  }
  RopeTable r{S, hd, theta, {}, {}};
  const int half = hd / 2;
  r.cos.resize(size_t(S) * half);
  r.sin.resize(size_t(S) * half);
  for (int p = 0; p < S; ++p) {
    for (int i = 0; i < half; ++i) {
      // ω_i = theta^(-2i/hd); numeric/det_math.hpp: the same angles on every machine.
      const double omega = det::pow(double(theta), -2.0 * i / hd);
      r.cos[size_t(p) * half + i] = det::cos(p * omega);
      r.sin[size_t(p) * half + i] = det::sin(p * omega);
    }
  }
  return r;
}

// Rotates every pair (x[2i], x[2i+1]) of every head of row s by sign·s·ω_i.
template <class T> static void rope_rotate(T* x, const RopeTable& rope, int num_heads, T sign) {
  const int half = rope.hd / 2, width = num_heads * rope.hd;
#pragma omp parallel for schedule(static) if (rope.S >= kParallelRows)
  for (int s = 0; s < rope.S; ++s) {
    const double* cs = rope.cos.data() + int64_t{s} * half;
    const double* sn = rope.sin.data() + int64_t{s} * half;
    for (int h = 0; h < num_heads; ++h) {
      T* xh = x + int64_t{s} * width + h * rope.hd;
      for (int i = 0; i < half; ++i) {
        const T c = T(cs[i]), si = sign * T(sn[i]);
        const T a = xh[2 * i], b = xh[2 * i + 1];
        xh[2 * i] = a * c - b * si;
        xh[2 * i + 1] = a * si + b * c;
      }
    }
  }
}

template <class T> void rope_forward(T* x, const RopeTable& rope, int num_heads) {
  rope_rotate(x, rope, num_heads, T(1));
}

template <class T> void rope_backward(T* d_x, const RopeTable& rope, int num_heads) {
  // x' = R(s·ω)·x  ->  d_x = R(s·ω)ᵀ·d_x' = R(−s·ω)·d_x'
  rope_rotate(d_x, rope, num_heads, T(-1));
}

AttnSavedSizes attn_saved_sizes(int max_B, const AttnDims& d, int threads) {
  const double B = max_B, S = d.S, H = d.H, HD = H * d.hd, KD = static_cast<double>(d.KVH) * d.hd;
  const double Kt = attn_keys_per_tile(d);
  AttnSavedSizes z;
  z.q = B * S * HD;
  z.kv = B * S * KD;
  z.probs = B * H * S * Kt;
  z.d_q = S * HD;  // d_k_heads, d_v_heads: [H, S, hd], as many
  z.d_kv = S * KD;
  z.d_probs = H * std::min(d.S, kQueryTile) * Kt;
  z.threads = max_B > 1 ? std::max(threads, 1) : 1;  // one sequence runs on the caller's set
  z.tree_q = static_cast<double>(d.D) * HD;
  z.tree_kv = static_cast<double>(d.D) * KD;
  z.leaf_sets = max_B > 1 ? max_B : 0;
  return z;
}

namespace {

// One sequence's scratch, the forward's kv_t and the backward's (AttnSavedSizes), for `threads`
// threads.
template <class T> void thread_scratch_reserve(AttnScratch<T>& s, const AttnDims& d, int threads) {
  const AttnSavedSizes z = attn_saved_sizes(1, d, 1);
  auto n = [&](double elements) { return static_cast<size_t>(elements) * threads; };
  for (std::vector<T>* v : {&s.d_concat, &s.d_q, &s.d_k_heads, &s.d_v_heads}) {
    v->assign(n(z.d_q), T(0));
  }
  for (std::vector<T>* v : {&s.d_k, &s.d_v, &s.kv_t}) v->assign(n(z.d_kv), T(0));
  s.d_probs.assign(n(z.d_probs), T(0));
  s.threads = threads;
}

// A call on B sequences runs one task per sequence, each with its thread's scratch: grown here
// when the region has more threads than were reserved for (one sequence uses set 0).
template <class T> void scratch_for_threads(AttnScratch<T>& s, const AttnDims& d, int B) {
  if (B > 1 && omp_get_max_threads() > s.threads) {
    thread_scratch_reserve(s, d, omp_get_max_threads());
  }
}

void check_dims(const char* fn, int max_B, const AttnDims& d) {
  if (max_B < 0 || d.D <= 0 || d.H <= 0 || d.KVH <= 0 || d.H % d.KVH != 0 || d.hd <= 0 ||
      d.hd % 2 != 0 || d.S <= 0 || d.window < 0) {
    throw std::invalid_argument(
        std::string(fn) + ": need B >= 0, D, H, KVH, hd, S > 0, KVH | H, hd even, W >= 0; got B=" +
        std::to_string(max_B) + " D=" + std::to_string(d.D) + " H=" + std::to_string(d.H) +
        " KVH=" + std::to_string(d.KVH) + " hd=" + std::to_string(d.hd) +
        " S=" + std::to_string(d.S) + " W=" + std::to_string(d.window));
  }
}

}  // namespace

template <class T>
void attn_scratch_reserve(AttnScratch<T>& scratch, int max_B, const AttnDims& d) {
  check_dims("attn_scratch_reserve", max_B, d);
  const AttnSavedSizes z = attn_saved_sizes(max_B, d, omp_get_max_threads());
  thread_scratch_reserve(scratch, d, z.threads);
  scratch.leaves.assign(static_cast<size_t>(z.trees()), T(0));
  scratch.max_B = max_B;
}

template <class T>
void attn_saved_reserve(AttnSaved<T>& saved, int max_B, const AttnDims& d, bool own_scratch) {
  check_dims("attn_saved_reserve", max_B, d);
  const AttnSavedSizes z = attn_saved_sizes(max_B, d, omp_get_max_threads());
  auto n = [](double elements) { return static_cast<size_t>(elements); };
  saved.max_B = max_B;
  saved.B = 0;
  for (std::vector<T>* v : {&saved.q, &saved.concat}) v->assign(n(z.q), T(0));
  for (std::vector<T>* v : {&saved.k, &saved.v}) v->assign(n(z.kv), T(0));
  saved.probs.assign(n(z.probs), T(0));
  if (own_scratch) {
    attn_scratch_reserve(saved.scratch, max_B, d);
  } else {
    saved.scratch = AttnScratch<T>{};
  }
}

// kv_t[c·S + s] = kv[s·KD + c]: a sequence's keys (or values) transposed once, so that the
// query tiles' GEMMs read kᵀ's columns in place instead of each packing its window of k anew (four
// heads and about five overlapping tiles per key). The same values reach the same FMA chains.
template <class T> static void transpose_kv(T* kv_t, const T* kv, int S, int KD) {
  for (int s = 0; s < S; ++s) {
    const T* row = kv + int64_t{s} * KD;
    for (int c = 0; c < KD; ++c) kv_t[int64_t{c} * S + s] = row[c];
  }
}

template <class T>
static void check_call(const char* fn, int B, const AttnSaved<T>& saved, const AttnDims& d,
                       const RopeTable& r) {
  if (B < 0 || B > saved.max_B) {
    throw std::invalid_argument(std::string(fn) + ": B=" + std::to_string(B) +
                                " outside [0, reserved " + std::to_string(saved.max_B) + "]");
  }
  if (B > saved.scratch.max_B) {
    throw std::invalid_argument(std::string(fn) + ": B=" + std::to_string(B) +
                                " but the scratch is reserved for " +
                                std::to_string(saved.scratch.max_B) +
                                " (attn_scratch_reserve, or a model's lent for the call)");
  }
  if (r.S != d.S || r.hd != d.hd || r.theta != d.rope_theta) {
    throw std::invalid_argument(std::string(fn) + ": RoPE table made for S=" + std::to_string(r.S) +
                                " hd=" + std::to_string(r.hd) +
                                ", dims have S=" + std::to_string(d.S) +
                                " hd=" + std::to_string(d.hd) + " (or theta differs)");
  }
}

template <class T>
void attention_forward(T* out, AttnSaved<T>& saved, const T* in, const AttnWeights<T>& w,
                       const AttnDims& d, const RopeTable& rope, int B) {
  check_call("attention_forward", B, saved, d, rope);
  saved.B = B;
  const int S = d.S, D = d.D, HD = d.H * d.hd, KD = d.KVH * d.hd, Kt = attn_keys_per_tile(d);
  AttnScratch<T>& scratch = saved.scratch;
  scratch_for_threads(scratch, d, B);
  // Each sequence on its own, projections included (see top): a task per sequence when there are
  // several (the work inside then runs on the task's thread), else the sequence's own tasks.
  auto sequence = [&](int64_t b) {
    const size_t t = B > 1 ? static_cast<size_t>(omp_get_thread_num()) : 0;
    const int64_t row0 = b * S;
    const T* x = in + row0 * D;
    T* q = saved.q.data() + row0 * HD;
    T* k = saved.k.data() + row0 * KD;
    T* v = saved.v.data() + row0 * KD;
    T* concat = saved.concat.data() + row0 * HD;
    linear_forward(q, x, w.wq, S, D, HD);
    linear_forward(k, x, w.wk, S, D, KD);
    linear_forward(v, x, w.wv, S, D, KD);
    rope_forward(q, rope, d.H);
    rope_forward(k, rope, d.KVH);
    T* k_t = scratch.kv_t.data() + t * S * KD;
    transpose_kv(k_t, k, S, KD);
    attn_core_forward(concat, saved.probs.data() + b * d.H * S * Kt, q, k_t, v, d);
    linear_forward(out + row0 * D, concat, w.wo, S, HD, D);
  };
  if (B > 1) {
    parallel_tasks(B, sequence);
  } else if (B == 1) {
    sequence(0);
  }
}

template <class T>
void attention_backward(T* d_in, const AttnWeights<T>& grads, const T* d_out, AttnSaved<T>& saved,
                        const T* in, const AttnWeights<T>& w, const AttnDims& d,
                        const RopeTable& rope, int B) {
  check_call("attention_backward", B, saved, d, rope);
  if (B != saved.B) {
    throw std::invalid_argument("attention_backward: B=" + std::to_string(B) +
                                " but the last forward had B=" + std::to_string(saved.B));
  }
  const int S = d.S, D = d.D, HD = d.H * d.hd, KD = d.KVH * d.hd, Kt = attn_keys_per_tile(d);
  AttnScratch<T>& scratch = saved.scratch;
  scratch_for_threads(scratch, d, B);
  // Weight gradients by sequence, added along the fixed tree (model/tree_sum.hpp): with several
  // sequences each one's leaves go to its set in scratch.leaves, [Wq | Wk | Wv | Wo], summed once
  // all are in; one sequence adds into the gradients directly (beta 1: the bits of 0 + its sum).
  const size_t nq = size_t(D) * HD, nk = size_t(D) * KD, leaf_set = 2 * nq + 2 * nk;
  const T beta = B > 1 ? T(0) : T(1);
  // Each sequence on its own (see attention_forward), with its thread's scratch.
  auto sequence = [&](int64_t b) {
    const size_t t = B > 1 ? static_cast<size_t>(omp_get_thread_num()) : 0;
    const int64_t row0 = b * S;
    const T* x = in + row0 * D;
    const T* q = saved.q.data() + row0 * HD;
    const T* k = saved.k.data() + row0 * KD;
    const T* v = saved.v.data() + row0 * KD;
    T* dx = d_in + row0 * D;
    T* d_concat = scratch.d_concat.data() + t * S * HD;
    T* d_q = scratch.d_q.data() + t * S * HD;
    T* d_k = scratch.d_k.data() + t * S * KD;
    T* d_v = scratch.d_v.data() + t * S * KD;
    T* leaf = B > 1 ? scratch.leaves.data() + b * leaf_set : nullptr;
    T* leaf_q = B > 1 ? leaf : grads.wq;
    T* leaf_k = B > 1 ? leaf + nq : grads.wk;
    T* leaf_v = B > 1 ? leaf + nq + nk : grads.wv;
    T* leaf_o = B > 1 ? leaf + nq + 2 * nk : grads.wo;
    // The forward's concat, read by Wo's weight gradient below, is long out of the caches: asked
    // for at once, its rows arrive together rather than one at a time as the GEMM reaches them.
    prefetch_values(saved.concat.data() + row0 * HD, static_cast<size_t>(S) * HD);
    // out = concat·Wo  ->  d_concat = d_out·Woᵀ, d_Wo_b = concat_bᵀ·d_out_b: independent tasks
    std::fill(d_concat, d_concat + int64_t{S} * HD, T(0));
    parallel_tasks(2, [&](int64_t task) {
      if (task == 0) {
        linear_backward_input(d_concat, d_out + row0 * D, w.wo, S, HD, D);
      } else {
        gemm<T>(true, false, HD, D, S, T(1), saved.concat.data() + row0 * HD, d_out + row0 * D,
                beta, leaf_o);
      }
    });
    // concat = softmax(q·kᵀ/sqrt(hd) + mask)·v  ->  d_q, d_k, d_v
    std::fill(d_k, d_k + int64_t{S} * KD, T(0));
    std::fill(d_v, d_v + int64_t{S} * KD, T(0));
    T* v_t = scratch.kv_t.data() + t * S * KD;
    transpose_kv(v_t, v, S, KD);
    attn_core_backward(d_q, d_k, d_v,
                       scratch.d_probs.data() + t * std::min(S, kQueryTile) * d.H * Kt,
                       scratch.d_k_heads.data() + t * S * HD, scratch.d_v_heads.data() + t * S * HD,
                       d_concat, saved.probs.data() + b * d.H * S * Kt, q, k, v_t, d);
    // x, read by the weight gradients below, likewise: asked for after the core, whose own rows
    // would push it out again, so that it comes in while RoPE's backward runs.
    prefetch_values(x, static_cast<size_t>(S) * D);
    // q = rope(in·Wq), k = rope(in·Wk)  ->  gradients of the unrotated projections
    rope_backward(d_q, rope, d.H);
    rope_backward(d_k, rope, d.KVH);
    // q = in·Wq, k = in·Wk, v = in·Wv  ->  d_in += d_q·Wqᵀ + d_k·Wkᵀ + d_v·Wvᵀ (one task, in
    // that order), d_W·_b = inᵀ·d_· (a task each; the largest tasks first)
    parallel_tasks(4, [&](int64_t task) {
      switch (task) {
        case 0:
          linear_backward_input(dx, d_q, w.wq, S, D, HD);
          linear_backward_input(dx, d_k, w.wk, S, D, KD);
          linear_backward_input(dx, d_v, w.wv, S, D, KD);
          break;
        case 1:
          gemm<T>(true, false, D, HD, S, T(1), x, d_q, beta, leaf_q);
          break;
        case 2:
          gemm<T>(true, false, D, KD, S, T(1), x, d_k, beta, leaf_k);
          break;
        default:
          gemm<T>(true, false, D, KD, S, T(1), x, d_v, beta, leaf_v);
          break;
      }
    });
  };
  if (B > 1) {
    parallel_tasks(B, sequence);
    T* leaves = scratch.leaves.data();
    tree_sum_leaves(grads.wq, leaves, B, leaf_set, nq);
    tree_sum_leaves(grads.wk, leaves + nq, B, leaf_set, nk);
    tree_sum_leaves(grads.wv, leaves + nq + nk, B, leaf_set, nk);
    tree_sum_leaves(grads.wo, leaves + nq + 2 * nk, B, leaf_set, nq);
  } else if (B == 1) {
    sequence(0);
  }
}

template void rope_forward<float>(float*, const RopeTable&, int);
template void rope_forward<double>(double*, const RopeTable&, int);
template void rope_backward<float>(float*, const RopeTable&, int);
template void rope_backward<double>(double*, const RopeTable&, int);
template void attn_saved_reserve<float>(AttnSaved<float>&, int, const AttnDims&, bool);
template void attn_saved_reserve<double>(AttnSaved<double>&, int, const AttnDims&, bool);
template void attn_scratch_reserve<float>(AttnScratch<float>&, int, const AttnDims&);
template void attn_scratch_reserve<double>(AttnScratch<double>&, int, const AttnDims&);
template void attention_forward<float>(float*, AttnSaved<float>&, const float*,
                                       const AttnWeights<float>&, const AttnDims&, const RopeTable&,
                                       int);
template void attention_forward<double>(double*, AttnSaved<double>&, const double*,
                                        const AttnWeights<double>&, const AttnDims&,
                                        const RopeTable&, int);
template void attention_backward<float>(float*, const AttnWeights<float>&, const float*,
                                        AttnSaved<float>&, const float*, const AttnWeights<float>&,
                                        const AttnDims&, const RopeTable&, int);
template void attention_backward<double>(double*, const AttnWeights<double>&, const double*,
                                         AttnSaved<double>&, const double*,
                                         const AttnWeights<double>&, const AttnDims&,
                                         const RopeTable&, int);

}  // namespace moe

// Attention forward and backward: projections through linear_forward/linear_backward (OpenBLAS),
// RoPE and the masked softmax core as plain loops over the visible keys only.
// Legend: B sequences, S sequence length, D model width, H heads, KVH kv heads, hd head dim,
// W sliding window, Wk keys kept per query row; HD = H·hd, KD = KVH·hd row widths of q and k/v.
//
// Every sequence is processed on its own, projections included (linear_forward with M = S rows),
// rather than as one [B·S, D] GEMM: OpenBLAS blocks a GEMM by its M, so one big call could round a
// row differently for different B. Per sequence, a token's result depends only on its sequence,
// bitwise, whatever number of sequences a rank holds (B = 1 or 4 per rank, 8 or 2 ranks for the
// same global batch): the activations of a sequence do not depend on how the batch was split.
//
// Only the visible keys of a query row are computed and kept (probs rows of Wk, not S). The
// scores q_s·k_j (and, in backward, d_o·v_j) run over a per-sequence transposed copy of k (v), so
// that the loop over keys is innermost and vectorises (dot_rows).
#include "model/attention.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>

#include "model/linear.hpp"

namespace moe {

// Keys per register block in dot_rows: 16 floats = 4 SSE registers of accumulators.
constexpr int kKeyBlock = 16;

AttnDims attn_dims_from(const ModelConfig& c) {
  return AttnDims{c.d_model, c.heads, c.kv_heads, c.head_dim, c.seq_len, c.sliding_window,
                  c.rope_theta};
}

int attn_keys_per_row(const AttnDims& d) {
  return (d.window > 0 && d.window < d.S) ? d.window : d.S;
}

RopeTable rope_table_make(int S, int hd, float theta) {
  if (S <= 0 || hd <= 0 || hd % 2 != 0 || !(theta > 0.0f)) {
    throw std::invalid_argument("rope_table_make: need S > 0, even hd > 0, theta > 0; got S=" +
                                std::to_string(S) + " hd=" + std::to_string(hd) +
                                " theta=" + std::to_string(theta));
  }
  RopeTable r{S, hd, theta, {}, {}};
  const int half = hd / 2;
  r.cos.resize(size_t(S) * half);
  r.sin.resize(size_t(S) * half);
  for (int p = 0; p < S; ++p) {
    for (int i = 0; i < half; ++i) {
      const double omega = std::pow(double(theta), -2.0 * i / hd);  // ω_i = theta^(-2i/hd)
      r.cos[size_t(p) * half + i] = std::cos(p * omega);
      r.sin[size_t(p) * half + i] = std::sin(p * omega);
    }
  }
  return r;
}

// Rotates every pair (x[2i], x[2i+1]) of every head of row s by sign·s·ω_i.
template <class T>
static void rope_rotate(T* x, const RopeTable& rope, int num_heads, T sign) {
  const int half = rope.hd / 2, width = num_heads * rope.hd;
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

template <class T>
void rope_forward(T* x, const RopeTable& rope, int num_heads) {
  rope_rotate(x, rope, num_heads, T(1));
}

template <class T>
void rope_backward(T* d_x, const RopeTable& rope, int num_heads) {
  // x' = R(s·ω)·x  ->  d_x = R(s·ω)ᵀ·d_x' = R(−s·ω)·d_x'
  rope_rotate(d_x, rope, num_heads, T(-1));
}

template <class T>
void attn_saved_reserve(AttnSaved<T>& saved, int max_B, const AttnDims& d) {
  if (max_B < 0 || d.D <= 0 || d.H <= 0 || d.KVH <= 0 || d.H % d.KVH != 0 || d.hd <= 0 ||
      d.hd % 2 != 0 || d.S <= 0 || d.window < 0) {
    throw std::invalid_argument(
        "attn_saved_reserve: need B >= 0, D, H, KVH, hd, S > 0, KVH | H, hd even, W >= 0; got B=" +
        std::to_string(max_B) + " D=" + std::to_string(d.D) + " H=" + std::to_string(d.H) +
        " KVH=" + std::to_string(d.KVH) + " hd=" + std::to_string(d.hd) + " S=" +
        std::to_string(d.S) + " W=" + std::to_string(d.window));
  }
  const size_t S = d.S, HD = size_t(d.H) * d.hd, KD = size_t(d.KVH) * d.hd;
  const size_t Wk = attn_keys_per_row(d), B = max_B;
  saved.max_B = max_B;
  saved.B = 0;
  saved.q.assign(B * S * HD, T(0));
  saved.k.assign(B * S * KD, T(0));
  saved.v.assign(B * S * KD, T(0));
  saved.probs.assign(B * d.H * S * Wk, T(0));
  saved.concat.assign(B * S * HD, T(0));
  saved.kv_t.assign(KD * S, T(0));
  saved.d_concat.assign(S * HD, T(0));
  saved.d_q.assign(S * HD, T(0));
  saved.d_k.assign(S * KD, T(0));
  saved.d_v.assign(S * KD, T(0));
  saved.d_probs.assign(Wk, T(0));
}

// kv_t[g, i, j] = x[j, g·hd + i]: one kv tensor of a sequence, transposed per kv head.
template <class T>
static void transpose_kv(T* kv_t, const T* x, const AttnDims& d) {
  const int KD = d.KVH * d.hd;
  for (int j = 0; j < d.S; ++j) {
    for (int c = 0; c < KD; ++c) kv_t[int64_t{c} * d.S + j] = x[int64_t{j} * KD + c];
  }
}

// out[c] = x·y_c for c < n, where y_c[i] = y_t[i·S + c] (a transposed kv head, see transpose_kv).
// Keys are innermost so the loop vectorises, in blocks of kKeyBlock summed in registers; each dot
// product still adds its hd terms in the plain order i = 0 .. hd−1.
template <class T>
static void dot_rows(T* out, const T* x, const T* y_t, int n, int hd, int S) {
  int c0 = 0;
  for (; c0 + kKeyBlock <= n; c0 += kKeyBlock) {
    T acc[kKeyBlock] = {};
    for (int i = 0; i < hd; ++i) {
      const T* yi = y_t + int64_t{i} * S + c0;
      for (int c = 0; c < kKeyBlock; ++c) acc[c] += x[i] * yi[c];
    }
    std::copy(acc, acc + kKeyBlock, out + c0);
  }
  for (int c = c0; c < n; ++c) {
    T acc = T(0);
    for (int i = 0; i < hd; ++i) acc += x[i] * y_t[int64_t{i} * S + c];
    out[c] = acc;
  }
}

// Masked softmax attention of one sequence: probs[H, S, Wk] and concat[S, HD] from q, k, v.
template <class T>
static void core_forward(T* concat, T* probs, T* k_t, const T* q, const T* k, const T* v,
                         const AttnDims& d) {
  const int S = d.S, hd = d.hd, HD = d.H * hd, KD = d.KVH * hd, Wk = attn_keys_per_row(d);
  const int group = d.H / d.KVH;
  const T scale = T(1) / std::sqrt(T(hd));
  transpose_kv(k_t, k, d);
  for (int h = 0; h < d.H; ++h) {
    const int g = h / group;
    for (int s = 0; s < S; ++s) {
      const int lo = std::max(0, s - Wk + 1), n = s - lo + 1;  // visible keys lo .. s
      const T* qs = q + int64_t{s} * HD + h * hd;
      T* p = probs + (int64_t{h} * S + s) * Wk;
      dot_rows(p, qs, k_t + int64_t{g} * hd * S + lo, n, hd, S);  // p_c = q_s·k_{lo+c}
      // softmax over the visible keys, the row max subtracted so that exp cannot overflow
      T row_max = -std::numeric_limits<T>::infinity();
      for (int c = 0; c < n; ++c) {
        p[c] *= scale;
        row_max = std::max(row_max, p[c]);
      }
      T sum = T(0);
      for (int c = 0; c < n; ++c) {
        p[c] = std::exp(p[c] - row_max);
        sum += p[c];
      }
      const T inv_sum = T(1) / sum;
      for (int c = 0; c < n; ++c) p[c] *= inv_sum;
      T* o = concat + int64_t{s} * HD + h * hd;  // o = Σ_j p_j·v_j
      std::fill(o, o + hd, T(0));
      for (int c = 0; c < n; ++c) {
        const T* vj = v + int64_t{lo + c} * KD + g * hd;
        for (int i = 0; i < hd; ++i) o[i] += p[c] * vj[i];
      }
    }
  }
}

// Backward of core_forward for one sequence: d_q, d_k, d_v += from d_concat.
template <class T>
static void core_backward(T* d_q, T* d_k, T* d_v, T* d_p, T* v_t, const T* d_concat,
                          const T* probs, const T* q, const T* k, const T* v, const AttnDims& d) {
  const int S = d.S, hd = d.hd, HD = d.H * hd, KD = d.KVH * hd, Wk = attn_keys_per_row(d);
  const int group = d.H / d.KVH;
  const T scale = T(1) / std::sqrt(T(hd));
  transpose_kv(v_t, v, d);
  for (int h = 0; h < d.H; ++h) {
    const int g = h / group;
    for (int s = 0; s < S; ++s) {
      const int lo = std::max(0, s - Wk + 1), n = s - lo + 1;
      const T* p = probs + (int64_t{h} * S + s) * Wk;
      const T* d_o = d_concat + int64_t{s} * HD + h * hd;
      // o = Σ_j p_j·v_j  ->  d_p_j = d_o·v_j
      dot_rows(d_p, d_o, v_t + int64_t{g} * hd * S + lo, n, hd, S);
      // o = Σ_j p_j·v_j  ->  d_v_j += p_j·d_o
      for (int c = 0; c < n; ++c) {
        T* dvj = d_v + int64_t{lo + c} * KD + g * hd;
        for (int i = 0; i < hd; ++i) dvj[i] += p[c] * d_o[i];
      }
      T p_dot_dp = T(0);
      for (int c = 0; c < n; ++c) p_dot_dp += p[c] * d_p[c];
      const T* qs = q + int64_t{s} * HD + h * hd;
      T* dqs = d_q + int64_t{s} * HD + h * hd;
      for (int c = 0; c < n; ++c) {
        // p = softmax(z), z_j = q_s·k_j/sqrt(hd)
        //   ->  d_qk_j = ∂L/∂(q_s·k_j) = p_j·(d_p_j − Σ_j' p_j'·d_p_j')/sqrt(hd)
        const T d_qk = p[c] * (d_p[c] - p_dot_dp) * scale;
        const int64_t kj = int64_t{lo + c} * KD + g * hd;
        // q_s·k_j  ->  d_q_s += d_qk_j·k_j, d_k_j += d_qk_j·q_s
        for (int i = 0; i < hd; ++i) dqs[i] += d_qk * k[kj + i];
        for (int i = 0; i < hd; ++i) d_k[kj + i] += d_qk * qs[i];
      }
    }
  }
}

static void check_call(const char* fn, int B, int max_B, const AttnDims& d, const RopeTable& r) {
  if (B < 0 || B > max_B) {
    throw std::invalid_argument(std::string(fn) + ": B=" + std::to_string(B) +
                                " outside [0, reserved " + std::to_string(max_B) + "]");
  }
  if (r.S != d.S || r.hd != d.hd || r.theta != d.rope_theta) {
    throw std::invalid_argument(std::string(fn) + ": RoPE table made for S=" +
                                std::to_string(r.S) + " hd=" + std::to_string(r.hd) +
                                ", dims have S=" + std::to_string(d.S) +
                                " hd=" + std::to_string(d.hd) + " (or theta differs)");
  }
}

template <class T>
void attention_forward(T* out, AttnSaved<T>& saved, const T* in, const AttnWeights<T>& w,
                       const AttnDims& d, const RopeTable& rope, int B) {
  check_call("attention_forward", B, saved.max_B, d, rope);
  saved.B = B;
  const int S = d.S, D = d.D, HD = d.H * d.hd, KD = d.KVH * d.hd, Wk = attn_keys_per_row(d);
  for (int b = 0; b < B; ++b) {  // one sequence at a time, projections included (see top)
    const int64_t row0 = int64_t{b} * S;
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
    core_forward(concat, saved.probs.data() + int64_t{b} * d.H * S * Wk, saved.kv_t.data(), q, k,
                 v, d);
    linear_forward(out + row0 * D, concat, w.wo, S, HD, D);
  }
}

template <class T>
void attention_backward(T* d_in, const AttnWeights<T>& grads, const T* d_out, AttnSaved<T>& saved,
                        const T* in, const AttnWeights<T>& w, const AttnDims& d,
                        const RopeTable& rope, int B) {
  check_call("attention_backward", B, saved.max_B, d, rope);
  if (B != saved.B) {
    throw std::invalid_argument("attention_backward: B=" + std::to_string(B) +
                                " but the last forward had B=" + std::to_string(saved.B));
  }
  const int S = d.S, D = d.D, HD = d.H * d.hd, KD = d.KVH * d.hd, Wk = attn_keys_per_row(d);
  T* d_concat = saved.d_concat.data();
  T* d_q = saved.d_q.data();
  T* d_k = saved.d_k.data();
  T* d_v = saved.d_v.data();
  for (int b = 0; b < B; ++b) {
    const int64_t row0 = int64_t{b} * S;
    const T* x = in + row0 * D;
    const T* q = saved.q.data() + row0 * HD;
    const T* k = saved.k.data() + row0 * KD;
    const T* v = saved.v.data() + row0 * KD;
    T* dx = d_in + row0 * D;
    // out = concat·Wo  ->  d_concat = d_out·Woᵀ, d_Wo += concatᵀ·d_out
    std::fill(saved.d_concat.begin(), saved.d_concat.end(), T(0));
    linear_backward(d_concat, grads.wo, d_out + row0 * D, saved.concat.data() + row0 * HD, w.wo,
                    S, HD, D);
    // concat = softmax(q·kᵀ/sqrt(hd) + mask)·v  ->  d_q, d_k, d_v
    std::fill(saved.d_q.begin(), saved.d_q.end(), T(0));
    std::fill(saved.d_k.begin(), saved.d_k.end(), T(0));
    std::fill(saved.d_v.begin(), saved.d_v.end(), T(0));
    core_backward(d_q, d_k, d_v, saved.d_probs.data(), saved.kv_t.data(), d_concat,
                  saved.probs.data() + int64_t{b} * d.H * S * Wk, q, k, v, d);
    // q = rope(in·Wq), k = rope(in·Wk)  ->  gradients of the unrotated projections
    rope_backward(d_q, rope, d.H);
    rope_backward(d_k, rope, d.KVH);
    // q = in·Wq, k = in·Wk, v = in·Wv  ->  d_in += d_q·Wqᵀ + d_k·Wkᵀ + d_v·Wvᵀ, d_W· += inᵀ·d_·
    linear_backward(dx, grads.wq, d_q, x, w.wq, S, D, HD);
    linear_backward(dx, grads.wk, d_k, x, w.wk, S, D, KD);
    linear_backward(dx, grads.wv, d_v, x, w.wv, S, D, KD);
  }
}

template void rope_forward<float>(float*, const RopeTable&, int);
template void rope_forward<double>(double*, const RopeTable&, int);
template void rope_backward<float>(float*, const RopeTable&, int);
template void rope_backward<double>(double*, const RopeTable&, int);
template void attn_saved_reserve<float>(AttnSaved<float>&, int, const AttnDims&);
template void attn_saved_reserve<double>(AttnSaved<double>&, int, const AttnDims&);
template void attention_forward<float>(float*, AttnSaved<float>&, const float*,
                                       const AttnWeights<float>&, const AttnDims&,
                                       const RopeTable&, int);
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

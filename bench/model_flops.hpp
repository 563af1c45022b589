// The GEMM side of bench_step's MFU (docs/performance.md): the list of GEMMs one rank issues in
// one training step, and a replay of that list through plain cblas_sgemm (the "sgemm rate for the
// same shapes"). The MFU numerator, the model FLOPs per token, is the model's own count:
// 3 × model_forward_flops_per_token (model/model.hpp), forward + backward.
//
// Legend: D model width, H heads, KVH kv heads, hd head dim, E experts, K experts per token,
// F expert width, Fs shared width, V vocab, L layers, S sequence length, B sequences per rank,
// N = B·S tokens per rank, W ranks, P EP group size; a GEMM is C[M,N] = op(A)[M,K]·op(B)[K,N].
#pragma once

#include <algorithm>
#include <vector>

#include "bench/bench_common.hpp"
#include "model/config.hpp"

namespace moe::bench {

struct GemmCall {
  bool trans_a, trans_b;
  int M, N, K;
  int count;  // how many times per step
};

// linear_forward and linear_backward of out[rows,O] = in[rows,I]·W[I,O], `count` times.
inline void add_linear(std::vector<GemmCall>& list, int rows, int I, int O, int count) {
  list.push_back({false, false, rows, O, I, count});  // out = in·W
  list.push_back({false, true, rows, I, O, count});   // d_in += d_out·Wᵀ
  list.push_back({true, false, I, O, rows, count});   // d_W += inᵀ·d_out
}

// The GEMMs one rank issues in one step on W ranks (EP group P), with each expert receiving its
// balanced share W·N·K/E of the rows. Attention runs per sequence (M = S); the router's forward
// is a fixed-order loop in the model, listed here as the GEMM it computes.
inline std::vector<GemmCall> step_gemms(const ModelConfig& c, int W, int P) {
  const int S = c.seq_len, B = c.batch_per_rank, N = B * S, D = c.d_model;
  const int Hd = c.heads * c.head_dim, KVd = c.kv_heads * c.head_dim;
  const int Fs = c.shared_experts * c.ffn_dim, L = c.layers;
  const int local = (c.experts + P - 1) / P;  // the busiest rank's experts
  const int rows = static_cast<int>(static_cast<long long>(W) * N * c.top_k / c.experts);
  std::vector<GemmCall> list;
  add_linear(list, S, D, Hd, L * B);                    // q
  add_linear(list, S, D, KVd, 2 * L * B);               // k, v
  add_linear(list, S, Hd, D, L * B);                    // o
  add_linear(list, N, D, c.experts, L);                 // router
  add_linear(list, rows, D, c.ffn_dim, 2 * L * local);  // W1, W3 of each local expert
  add_linear(list, rows, c.ffn_dim, D, L * local);      // W2
  if (Fs > 0) {
    add_linear(list, N, D, Fs, 2 * L);
    add_linear(list, N, Fs, D, L);
  }
  add_linear(list, N, D, c.vocab, 1);  // LM head
  return list;
}

inline double gemm_flops(const std::vector<GemmCall>& list) {
  double f = 0;
  for (const GemmCall& g : list) f += 2.0 * g.M * g.N * g.K * g.count;
  return f;
}

// Median seconds of `reps` replays of `list` through cblas_sgemm (after one warm-up replay).
inline double gemm_replay_seconds(const std::vector<GemmCall>& list, int reps) {
  size_t a = 0, b = 0, c = 0;
  for (const GemmCall& g : list) {
    a = std::max(a, size_t{1} * g.M * g.K);
    b = std::max(b, size_t{1} * g.K * g.N);
    c = std::max(c, size_t{1} * g.M * g.N);
  }
  std::vector<float> A(a, 0.5f), Bm(b, 0.25f), C(c, 0.0f);
  auto replay = [&] {
    for (const GemmCall& g : list) {
      for (int i = 0; i < g.count; ++i) {
        reference_sgemm(g.trans_a, g.trans_b, g.M, g.N, g.K, A.data(), Bm.data(), 1.0f, C.data());
      }
    }
  };
  replay();
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    const double t0 = MPI_Wtime();
    replay();
    t.push_back(MPI_Wtime() - t0);
  }
  return spread_of(t).median;
}

// Median rate (FLOP/s) of C[M,N] = A[M,K]·B[K,N] over `reps` calls after one warm-up.
inline double sgemm_rate(int M, int K, int N, int reps) {
  std::vector<float> A(size_t{1} * M * K, 0.5f), Bm(size_t{1} * K * N, 0.25f), C(size_t{1} * M * N);
  std::vector<double> t;
  for (int r = 0; r <= reps; ++r) {
    const double t0 = MPI_Wtime();
    reference_sgemm(false, false, M, N, K, A.data(), Bm.data(), 0.0f, C.data());
    if (r > 0) t.push_back(MPI_Wtime() - t0);
  }
  return 2.0 * M * N * K / spread_of(t).median;
}

}  // namespace moe::bench

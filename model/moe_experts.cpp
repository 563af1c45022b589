// The experts of one MoE layer on a rank's threads (model/moe_experts.hpp).
// Legend: N tokens, R rows received, D model width, F expert width, Fs shared expert width,
// B sequences of S tokens.
#include "model/moe_experts.hpp"

#include <omp.h>

#include <algorithm>
#include <span>
#include <type_traits>
#include <vector>

#include "model/expert_grads.hpp"
#include "model/linear.hpp"
#include "model/optimizer.hpp"
#include "model/parallel.hpp"
#include "model/per_sequence.hpp"
#include "model/prefetch.hpp"
#include "model/softmax_rows.hpp"
#include "model/swiglu.hpp"

namespace moe {

namespace {

// With several threads, an expert's rows go to them in chunks of at most this many rows (one
// thread takes each expert whole: fewer, larger GEMMs). A row's results do not depend on how its
// expert's rows are split: every GEMM element is one chain of FMAs in k order (model/gemm/), and
// SwiGLU is elementwise.
constexpr int kExpertChunkRows = 256;

// Token-row tasks: the shared expert's `sequences` sequences of S rows first
// (`shared_rows(first row, rows)`), then every local expert's rows (`expert(i, rows, first row)`),
// in chunks of at most kExpertChunkRows with several threads. `chunk_offsets` is scratch: each
// expert's first task.
template <class Shared, class Expert>
void expert_row_tasks(std::vector<int>& chunk_offsets, const std::vector<int>& offsets,
                      int sequences, int S, Shared&& shared_rows, Expert&& expert) {
  const int experts = static_cast<int>(offsets.size()) - 1;
  const int chunk =
      omp_get_max_threads() > 1 ? kExpertChunkRows : std::max(1, offsets[experts] - offsets[0]);
  chunk_offsets.resize(static_cast<size_t>(experts) + 1);
  chunk_offsets[0] = 0;
  for (int i = 0; i < experts; ++i) {
    const int rows = offsets[i + 1] - offsets[i];
    chunk_offsets[i + 1] = chunk_offsets[i] + (rows + chunk - 1) / chunk;
  }
  parallel_tasks(int64_t{sequences} + chunk_offsets[experts], [&](int64_t task) {
    if (task < sequences) return shared_rows(static_cast<int>(task) * S, S);
    const int c = static_cast<int>(task - sequences);
    const int i = static_cast<int>(std::upper_bound(chunk_offsets.begin(), chunk_offsets.end(), c) -
                                   chunk_offsets.begin() - 1);
    const int first = offsets[i] + (c - chunk_offsets[i]) * chunk;
    expert(i, std::min(chunk, offsets[i + 1] - first), first);
  });
}

// The leaf-tree scratch of the calling thread's weight-gradient task: one per thread, added here
// when a region has more threads than moe_saved_reserve saw.
template <class T> std::span<T> thread_scratch(MoeSaved<T>& s) {
  return s.scratch.leaf_scratch[static_cast<size_t>(omp_get_thread_num())];
}
template <class T> void scratch_for_threads(MoeSaved<T>& s) {
  const size_t threads = static_cast<size_t>(std::max(omp_get_max_threads(), 1));
  while (s.scratch.leaf_scratch.size() < threads)
    s.scratch.leaf_scratch.emplace_back(s.scratch.leaf_scratch_values);
}

// ExpertRows::kInPlace: x's rows [row, row + rows), each its assignment's token row.
template <class T>
void gather_token_rows(MoeSaved<T>& s, const T* in, int row, int rows, const MoeDims& d) {
  const size_t D = d.D;
  for (int p = row; p < row + rows; ++p) {
    std::copy_n(in + static_cast<size_t>(s.plan.send_assignment[p] / d.K) * D, D, &s.x[p * D]);
  }
}

// The shared expert on rows [row, row + rows) of one sequence: out = swiglu(in·S1, in·S3)·S2.
template <class T>
void shared_rows_forward(T* out, MoeSaved<T>& s, const T* in, const MoeWeights<T>& w,
                         const MoeDims& d, int row, int rows) {
  const size_t rd = static_cast<size_t>(row) * d.D, rf = static_cast<size_t>(row) * d.Fs;
  linear_forward(&s.sg[rf], in + rd, w.shared_w1, rows, d.D, d.Fs);
  linear_forward(&s.sv[rf], in + rd, w.shared_w3, rows, d.D, d.Fs);
  T* const h = &s.scratch.sh[rf];
  swiglu_forward(h, &s.sg[rf], &s.sv[rf], static_cast<int64_t>(rows) * d.Fs, 0.0f);
  linear_forward(out + rd, h, w.shared_w2, rows, d.Fs, d.D);
}

// shared_rows_forward reversed for its rows, adding into d_in; the weight gradients come after
// (shared_weight_task).
template <class T>
void shared_rows_backward(T* d_in, MoeSaved<T>& s, const T* d_out, const MoeWeights<T>& w,
                          const MoeDims& d, int row, int rows) {
  const size_t rd = static_cast<size_t>(row) * d.D, rf = static_cast<size_t>(row) * d.Fs;
  const int64_t n = static_cast<int64_t>(rows) * d.Fs;
  // out = h·S2: d_h = d_out·S2ᵀ, into sh; written, not added into zeros: swiglu_backward reads
  // it as x + 0, the same bits, and leaves h there for S2's weight gradient.
  linear_backward_input_overwrite(&s.scratch.sh[rf], d_out + rd, w.shared_w2, rows, d.Fs, d.D);
  swiglu_backward(&s.scratch.sd_g[rf], &s.scratch.sd_v[rf], &s.scratch.sh[rf], &s.sg[rf], &s.sv[rf],
                  n, 0.0f);
  linear_backward_input(d_in + rd, &s.scratch.sd_g[rf], w.shared_w1, rows, d.D, d.Fs);
  linear_backward_input(d_in + rd, &s.scratch.sd_v[rf], w.shared_w3, rows, d.D, d.Fs);
}

// The shared expert's weight gradient m (0: S2, 1: S1, 2: S3) by sequence, in the thread's
// scratch.
template <class T>
void shared_weight_task(MoeSaved<T>& s, const MoeWeights<T>& gr, const T* d_out, const T* in,
                        const MoeDims& d, int m) {
  const auto [B, S] = moe_sequences(s, s.N);
  const std::span<T> scratch = thread_scratch(s);
  if (m == 0) {
    seq_linear_weight_backward(gr.shared_w2, scratch, d_out, s.scratch.sh.data(), B, S, d.Fs, d.D);
  } else {
    seq_linear_weight_backward(m == 1 ? gr.shared_w1 : gr.shared_w3, scratch,
                               m == 1 ? s.scratch.sd_g.data() : s.scratch.sd_v.data(), in, B, S,
                               d.D, d.Fs);
  }
}

// Routed expert i's weight gradient m (0: W2, 1: W1, 2: W3), [D·F] in plane 0.
template <class T>
T* expert_weight_grad_at(const MoeWeights<T>& gr, const MoeDims& d, int i, int m) {
  return (m == 0 ? gr.w2 : m == 1 ? gr.w1 : gr.w3) + static_cast<size_t>(i) * d.D * d.F;
}

// Routed expert i's weight gradient m (at dw: expert_weight_grad_at) by sequence over its rows,
// in the thread's scratch: added to the gradient, or written over it (weight_grads_final).
template <class T> void expert_weight_task(MoeSaved<T>& s, T* dw, const MoeDims& d, int i, int m) {
  const std::span<T> scratch = thread_scratch(s);
  const LeafTreeInto into = s.weight_grads_final ? LeafTreeInto::kOverwrite : LeafTreeInto::kAdd;
  if (m == 0) {
    expert_weight_grad(dw, scratch, s.scratch.h.data(), s.scratch.d_y.data(), d.F, d.D, i, s.plan,
                       s.expert_rows, s.expert_layout, into);
  } else {
    expert_weight_grad(dw, scratch, s.x.data(),
                       m == 1 ? s.scratch.d_g.data() : s.scratch.d_v.data(), d.D, d.F, i, s.plan,
                       s.expert_rows, s.expert_layout, into);
  }
}

// The shared expert's buffers for N tokens (forward: sg, sv, sh; backward: sd_g, sd_v, sh).
template <class T> void shared_resize(MoeSaved<T>& s, const MoeDims& d, int N, bool backward) {
  const size_t NFs = static_cast<size_t>(N) * d.Fs;
  if (backward) {
    for (auto* v : {&s.scratch.sd_g, &s.scratch.sd_v}) v->resize(NFs);
  } else {
    for (auto* v : {&s.sg, &s.sv}) v->resize(NFs);
  }
  s.scratch.sh.resize(NFs);
}

// <g_r, y_r> for R rows of D values: R chains, each the plain loop's sum in order, run side by
// side (one chain alone waits on each add's latency). Scalar: vectorised across the rows, GCC
// transposes each 4 × 4 block with shuffles and runs twice as slow as one chain at a time.
template <class T, int R>
[[gnu::noinline, gnu::optimize("no-tree-vectorize")]] void row_dots(T (&dot)[R],
                                                                    const T* const (&g)[R],
                                                                    const T* const (&y)[R],
                                                                    size_t D) {
  T acc[R];  // not dot itself: g and y might alias it, so its sums would go to memory each time
  for (int r = 0; r < R; ++r) acc[r] = 0;
  for (size_t c = 0; c < D; ++c) {
    for (int r = 0; r < R; ++r) acc[r] += g[r][c] * y[r][c];
  }
  for (int r = 0; r < R; ++r) dot[r] = acc[r];
}

// combine_rows_backward for R positions from p.
template <class T, int R>
void combine_rows_group(MoeSaved<T>& s, const T* d_out, const T* y_rows, T* d_rows, int p,
                        const MoeDims& d) {
  const size_t D = d.D;
  const T* g[R];
  const T* y[R];
  for (int r = 0; r < R; ++r) {
    g[r] = d_out + static_cast<size_t>(s.plan.send_assignment[p + r] / d.K) * D;
    y[r] = y_rows + static_cast<size_t>(p + r) * D;
  }
  T dot[R];
  row_dots(dot, g, y, D);
  for (int r = 0; r < R; ++r) {
    const int a = s.plan.send_assignment[p + r];
    s.scratch.d_weights[a] = dot[r];
    const T wt = s.weights[a];
    T* out = d_rows + static_cast<size_t>(p + r) * D;
    for (size_t c = 0; c < D; ++c) out[c] = wt * g[r][c];
  }
}

}  // namespace

template <class T>
void combine_rows_backward(MoeSaved<T>& s, const T* d_out, const T* y_rows, T* d_rows, int first,
                           int count, const MoeDims& d) {
  const size_t D = d.D;
  for_row_groups(count, [&](auto R, int r) {
    const int p = first + r;
    // The next group's rows, fetched while this one's are summed: d_out's in the tokens' order.
    for (int q = p + R.value; q < p + 2 * R.value && q < first + count; ++q) {
      prefetch_values(d_out + static_cast<size_t>(s.plan.send_assignment[q] / d.K) * D, D);
      prefetch_values(y_rows + static_cast<size_t>(q) * D, D);
    }
    combine_rows_group<T, R.value>(s, d_out, y_rows, d_rows, p, d);
  });
}

template <class T>
void moe_experts_forward(MoeSaved<T>& s, const MoeWeights<T>& w, const MoeDims& d, T* shared_out,
                         const T* in, ExpertRows where) {
  const size_t DF = static_cast<size_t>(d.D) * d.F;
  const auto [B, S] = moe_sequences(s, s.N);
  if (shared_out != nullptr) {
    if (d.Fs == 0) std::fill(shared_out, shared_out + static_cast<size_t>(s.N) * d.D, T(0));
    shared_resize(s, d, s.N, false);
  }
  expert_row_tasks(
      s.chunk_offsets, s.plan.expert_offsets, shared_out != nullptr && d.Fs > 0 ? B : 0, S,
      [&](int row, int rows) { shared_rows_forward(shared_out, s, in, w, d, row, rows); },
      [&](int64_t i, int rows, int row) {
        const size_t rd = static_cast<size_t>(row) * d.D, rf = static_cast<size_t>(row) * d.F;
        if (where == ExpertRows::kInPlace) gather_token_rows(s, in, row, rows, d);
        linear_forward(&s.g[rf], &s.x[rd], w.w1 + i * DF, rows, d.D, d.F);
        linear_forward(&s.v[rf], &s.x[rd], w.w3 + i * DF, rows, d.D, d.F);
        swiglu_forward(&s.scratch.h[rf], &s.g[rf], &s.v[rf], static_cast<int64_t>(rows) * d.F,
                       d.swiglu_limit);
        linear_forward(&s.y[rd], &s.scratch.h[rf], w.w2 + i * DF, rows, d.F, d.D);
      });
}

template <class T>
void moe_shared_forward(T* out, MoeSaved<T>& s, const T* in, const MoeWeights<T>& w,
                        const MoeDims& d, int N) {
  if (d.Fs == 0) {
    std::fill(out, out + static_cast<size_t>(N) * d.D, T(0));
    return;
  }
  const auto [B, S] = moe_sequences(s, N);
  shared_resize(s, d, N, false);
  parallel_tasks(
      B, [&](int64_t b) { shared_rows_forward(out, s, in, w, d, static_cast<int>(b) * S, S); });
}

template <class T>
void moe_shared_backward(T* d_in, const MoeWeights<T>& gr, const T* d_out, MoeSaved<T>& s,
                         const T* in, const MoeWeights<T>& w, const MoeDims& d, int N) {
  if (d.Fs == 0) return;
  const auto [B, S] = moe_sequences(s, N);
  shared_resize(s, d, N, true);
  scratch_for_threads(s);
  parallel_tasks(B, [&](int64_t b) {
    shared_rows_backward(d_in, s, d_out, w, d, static_cast<int>(b) * S, S);
  });
  parallel_tasks(3,
                 [&](int64_t m) { shared_weight_task(s, gr, d_out, in, d, static_cast<int>(m)); });
}

template <class T>
void moe_experts_backward(MoeSaved<T>& s, const MoeWeights<T>& gr, const MoeWeights<T>& w,
                          const MoeDims& d, T* shared_d_in, const T* d_out, const T* in,
                          ExpertRows where) {
  const size_t DF = static_cast<size_t>(d.D) * d.F;
  const int R = s.plan.num_recv;
  const bool shared = shared_d_in != nullptr && d.Fs > 0;
  const auto [B, S] = moe_sequences(s, s.N);
  MoeScratch<T>& t = s.scratch;
  if (shared) shared_resize(s, d, s.N, true);
  t.d_x.resize(static_cast<size_t>(R) * d.D);
  t.h.resize(static_cast<size_t>(R) * d.F);
  t.d_g.resize(t.h.size());
  t.d_v.resize(t.h.size());
  scratch_for_threads(s);
  expert_row_tasks(
      s.chunk_offsets, s.plan.expert_offsets, shared ? B : 0, S,
      [&](int row, int rows) { shared_rows_backward(shared_d_in, s, d_out, w, d, row, rows); },
      [&](int64_t i, int rows, int row) {
        const size_t rd = static_cast<size_t>(row) * d.D, rf = static_cast<size_t>(row) * d.F;
        const int64_t n = static_cast<int64_t>(rows) * d.F;
        if (where == ExpertRows::kInPlace) {
          combine_rows_backward(s, d_out, s.y.data(), t.d_y.data(), row, rows, d);
        }
        // d_h and d_x are written by their first GEMM, not added into zeros: their readers
        // (swiglu_backward; the layer's scatter of d_x, after the combine) take each element
        // as x + 0, which gives the bits of the sums into +0 (linear_backward_input_overwrite).
        // y = h·W2: d_h = d_y·W2ᵀ, into h's place, where swiglu_backward leaves h again (for
        // W2's weight gradient below).
        linear_backward_input_overwrite(&t.h[rf], &t.d_y[rd], w.w2 + i * DF, rows, d.F, d.D);
        swiglu_backward(&t.d_g[rf], &t.d_v[rf], &t.h[rf], &s.g[rf], &s.v[rf], n, d.swiglu_limit);
        // g = x·W1, v = x·W3: d_x = d_g·W1ᵀ + d_v·W3ᵀ
        linear_backward_input_overwrite(&t.d_x[rd], &t.d_g[rf], w.w1 + i * DF, rows, d.D, d.F);
        linear_backward_input(&t.d_x[rd], &t.d_v[rf], w.w3 + i * DF, rows, d.D, d.F);
      });
  // The weight gradients: the shared expert's three first (the largest), then three per routed
  // expert that received rows.
  const int first = shared ? 3 : 0;
  const std::vector<int>& offsets = s.plan.expert_offsets;
  const int experts = static_cast<int>(offsets.size()) - 1;
  const bool sq = std::is_same_v<T, float> && s.weight_grads_final;
  if (sq) s.weight_grad_sq.assign(3 * static_cast<size_t>(experts), 0.0);
  parallel_tasks(first + 3 * int64_t{experts}, [&](int64_t task) {
    if (task < first) return shared_weight_task(s, gr, d_out, in, d, static_cast<int>(task));
    const int i = static_cast<int>((task - first) / 3), m = static_cast<int>((task - first) % 3);
    T* const dw = expert_weight_grad_at(gr, d, i, m);
    if (offsets[i + 1] == offsets[i]) {
      // No rows: its gradient is +0, which a final gradient has to be given.
      if (s.weight_grads_final) std::fill_n(dw, DF, T(0));
      return;
    }
    expert_weight_task(s, dw, d, i, m);
    if constexpr (std::is_same_v<T, float>) {
      if (sq) s.weight_grad_sq[task - first] = sum_squares(std::span<const float>(dw, DF));
    }
  });
}

#define MOE_EXPERTS_INSTANTIATE(T)                                                                 \
  template void combine_rows_backward<T>(MoeSaved<T>&, const T*, const T*, T*, int, int,           \
                                         const MoeDims&);                                          \
  template void moe_experts_forward<T>(MoeSaved<T>&, const MoeWeights<T>&, const MoeDims&, T*,     \
                                       const T*, ExpertRows);                                      \
  template void moe_shared_forward<T>(T*, MoeSaved<T>&, const T*, const MoeWeights<T>&,            \
                                      const MoeDims&, int);                                        \
  template void moe_shared_backward<T>(T*, const MoeWeights<T>&, const T*, MoeSaved<T>&, const T*, \
                                       const MoeWeights<T>&, const MoeDims&, int);                 \
  template void moe_experts_backward<T>(MoeSaved<T>&, const MoeWeights<T>&, const MoeWeights<T>&,  \
                                        const MoeDims&, T*, const T*, const T*, ExpertRows);
MOE_EXPERTS_INSTANTIATE(float)
MOE_EXPERTS_INSTANTIATE(double)
#undef MOE_EXPERTS_INSTANTIATE

}  // namespace moe

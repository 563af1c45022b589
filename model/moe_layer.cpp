// MoE layer forward and backward: router, dispatch, the experts (model/moe_experts.hpp), combine.
#include "model/moe_layer.hpp"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>

#include "model/blas.hpp"
#include "model/capacity.hpp"
#include "model/linear.hpp"
#include "model/moe_experts.hpp"
#include "model/parallel.hpp"
#include "model/phase_timer.hpp"
#include "model/prefetch.hpp"
#include "model/router.hpp"
#include "model/z_loss.hpp"

namespace moe {

MoeDims moe_dims_from(const ModelConfig& c) {
  // Saturated rather than overflowed: such a width is refused by model_memory_estimate's tensor
  // check (the shared expert's weight), which sizes the model before anything is allocated.
  const int Fs = static_cast<int>(
      std::min<int64_t>(int64_t{c.shared_experts} * c.ffn_dim, std::numeric_limits<int>::max()));
  return MoeDims{c.d_model,     c.ffn_dim,     Fs, c.experts, c.top_k, c.score_func,
                 c.route_scale, c.swiglu_limit};
}

MoeOffsets moe_layout(ParamLayout& dense, ParamLayout& experts, const MoeDims& d, int layer,
                      int num_layers, const ExpertPlacement& placement, int ep_rank) {
  constexpr float kStd = 0.02f;
  const float out_std = kStd / std::sqrt(2.0f * static_cast<float>(num_layers));
  const std::string p = "layers." + std::to_string(layer) + ".moe.";
  const size_t DF = static_cast<size_t>(d.D) * d.F, DFs = static_cast<size_t>(d.D) * d.Fs;
  MoeOffsets off;
  off.router = dense.add(p + "router", static_cast<size_t>(d.D) * d.E, ParamInit::kNormal, kStd);
  if (d.Fs > 0) {
    off.shared_w1 = dense.add(p + "shared.w1", DFs, ParamInit::kNormal, kStd);
    off.shared_w3 = dense.add(p + "shared.w3", DFs, ParamInit::kNormal, kStd);
    off.shared_w2 = dense.add(p + "shared.w2", DFs, ParamInit::kNormal, out_std);
  }
  // [E_loc, D, F] per matrix: each local expert in turn, named by its global id.
  const int num_local = placement.num_local(ep_rank);
  const char* names[3] = {"w1", "w3", "w2"};
  size_t* offsets[3] = {&off.w1, &off.w3, &off.w2};
  for (int m = 0; m < 3; ++m) {
    for (int i = 0; i < num_local; ++i) {
      const size_t o = experts.add(
          p + "experts." + std::to_string(placement.expert(ep_rank, i)) + "." + names[m], DF,
          ParamInit::kNormal, m == 2 ? out_std : kStd);
      if (i == 0) *offsets[m] = o;
    }
  }
  return off;
}

template <class T>
MoeWeights<T> moe_weights_at(T* dense, T* experts, const MoeOffsets& off, const MoeDims& d) {
  const bool shared = d.Fs > 0;
  return MoeWeights<T>{dense + off.router,
                       shared ? dense + off.shared_w1 : nullptr,
                       shared ? dense + off.shared_w3 : nullptr,
                       shared ? dense + off.shared_w2 : nullptr,
                       experts + off.w1,
                       experts + off.w3,
                       experts + off.w2};
}

MoeSavedSizes moe_saved_sizes(double N, const MoeDims& d, int ep_size, int max_local,
                              int max_sequences, int threads) {
  const double n = N;  // tokens
  MoeSavedSizes z;
  z.NE = n * d.E;
  z.NK = n * d.K;
  z.R = static_cast<double>(ep_size) * n * std::min(d.K, max_local);
  z.NKD = ep_size > 1 ? z.NK * d.D : 0.0;  // an EP group of one rank moves no rows
  z.RD = z.R * d.D;
  z.RF = z.R * d.F;
  z.NFs = n * d.Fs;
  z.router_leaves = max_sequences > 1 ? static_cast<double>(max_sequences) * d.D * d.E : 0.0;
  // The routed experts' leaves are the EP group's sequences, the shared expert's the rank's own.
  // Counted in floats for MoeSaved<double> too: at every level a double tile is as tall as a
  // float one and at most as wide, so a double leaf tree never needs more elements.
  const int routed = ep_size * std::max(max_sequences, 1), shared = std::max(max_sequences, 1);
  size_t scratch = std::max(gemm_leaf_tree_scratch<float>(d.D, d.F, routed),
                            gemm_leaf_tree_scratch<float>(d.F, d.D, routed));
  if (d.Fs > 0) {
    scratch = std::max({scratch, gemm_leaf_tree_scratch<float>(d.D, d.Fs, shared),
                        gemm_leaf_tree_scratch<float>(d.Fs, d.D, shared)});
  }
  z.leaf_scratch = static_cast<double>(scratch);
  z.leaf_scratches = std::max(threads, 1);
  return z;
}

template <class T>
void moe_scratch_reserve(MoeScratch<T>& s, int N, const MoeDims& d, int ep_size, int max_local,
                         int max_sequences) {
  const MoeSavedSizes z =
      moe_saved_sizes(N, d, ep_size, max_local, max_sequences, omp_get_max_threads());
  auto n = [](double elements) { return static_cast<size_t>(elements); };
  for (auto* v : {&s.d_scores, &s.d_logits}) v->reserve(n(z.NE));
  s.d_weights.reserve(n(z.NK));
  for (auto* v : {&s.send_rows, &s.d_rows}) v->reserve(n(z.NKD));
  for (auto* v : {&s.d_y, &s.d_x}) v->reserve(n(z.RD));
  for (auto* v : {&s.d_g, &s.d_v, &s.h}) v->reserve(n(z.RF));
  for (auto* v : {&s.sd_g, &s.sd_v, &s.sh}) v->reserve(n(z.NFs));
  s.router_leaves.assign(n(z.router_leaves), T(0));
  s.leaf_scratch_values = n(z.leaf_scratch);
  s.leaf_scratch.assign(z.leaf_scratches, std::vector<T>(s.leaf_scratch_values));
  s.max_sequences = std::max(max_sequences, 1);
}

template <class T>
void moe_saved_reserve(MoeSaved<T>& s, int N, const MoeDims& d, int ep_size, int max_local,
                       int max_sequences, bool own_scratch) {
  const MoeSavedSizes z =
      moe_saved_sizes(N, d, ep_size, max_local, max_sequences, omp_get_max_threads());
  auto n = [](double elements) { return static_cast<size_t>(elements); };
  for (auto* v : {&s.logits, &s.scores, &s.d_scores_balance}) v->reserve(n(z.NE));
  for (auto* v : {&s.expert_idx, &s.topk_scratch, &s.dispatched_idx, &s.plan.send_assignment,
                  &s.plan.send_position}) {
    v->reserve(n(z.NK));
  }
  s.dropped.assign(d.E, 0);
  s.capacity_scratch.reserve(3 * static_cast<size_t>(d.E) + 1 + n(z.NK));
  s.weights.reserve(n(z.NK));
  s.y_rows.reserve(n(z.NKD));
  for (auto* v : {&s.x, &s.y}) v->reserve(n(z.RD));
  for (auto* v : {&s.g, &s.v}) v->reserve(n(z.RF));
  for (auto* v : {&s.sg, &s.sv}) v->reserve(n(z.NFs));
  s.max_sequences = max_sequences;
  s.chunk_offsets.reserve(static_cast<size_t>(max_local) + 1);
  s.weight_grad_sq.reserve(3 * static_cast<size_t>(max_local));
  if (own_scratch) {
    moe_scratch_reserve(s.scratch, N, d, ep_size, max_local, max_sequences);
  } else {
    s.scratch = MoeScratch<T>{};
  }
}

namespace {

// A layer's calls use its scratch (its own, or a model's lent for the call), reserved beforehand
// for at least the layer's sequences: the router's leaves are indexed by sequence.
template <class T> void check_scratch(const MoeSaved<T>& s, const char* fn) {
  if (s.scratch.max_sequences < std::max(s.max_sequences, 1)) {
    throw std::invalid_argument(std::string(fn) + ": scratch reserved for " +
                                std::to_string(s.scratch.max_sequences) +
                                " sequences, the layer for " + std::to_string(s.max_sequences) +
                                " (moe_scratch_reserve, or a model's lent for the call)");
  }
}

template <class T>
void select_experts(MoeSaved<T>& s, const MoeRouting& r, const MoeDims& d, int N) {
  switch (r.mode) {
    case RoutingMode::kTopK:
      route_topk_grouped(s.expert_idx.data(), s.scores.data(), r.bias, N, d.E, d.K,
                         r.routing_groups, r.group_topk);
      break;
    case RoutingMode::kHash:
      if (r.hash_table == nullptr || r.token_ids == nullptr) {
        throw std::invalid_argument("moe_forward: hash routing needs a table and token ids");
      }
      route_hash(s.expert_idx.data(), r.token_ids, r.hash_table, N, d.K, r.vocab);
      break;
    case RoutingMode::kRoundRobin:
      route_round_robin(s.expert_idx.data(), r.first_global_token, N, d.E, d.K);
      break;
    case RoutingMode::kRandom:
      route_random(s.expert_idx.data(), r.random_stream, r.first_global_token, N, d.E, d.K, r.skew);
      break;
  }
}

// The layer's share of the sequence-wise balance loss and its ∂/∂scores (top-k layers only).
template <class T>
void balance_loss_forward(MoeSaved<T>& s, const MoeRouting& routing, const MoeDims& d, int N) {
  s.balance_loss = 0.0;
  if (routing.mode != RoutingMode::kTopK || routing.balance_weight <= 0) {
    s.d_scores_balance.clear();
    return;
  }
  if (routing.seq_len <= 0 || N % routing.seq_len != 0) {
    throw std::invalid_argument("moe_forward: the balance loss needs whole sequences");
  }
  s.d_scores_balance.resize(s.scores.size());
  s.topk_scratch.resize(s.expert_idx.size());
  s.balance_loss = balance_loss_forward_backward(
      s.d_scores_balance.data(), s.topk_scratch.data(), s.balance_scratch, s.scores.data(),
      s.expert_idx.data(), routing.bias, N / routing.seq_len, routing.seq_len, d.E, d.K,
      routing.balance_weight, routing.balance_loss_form);
}

// The layer's share of the router z-loss (its gradient is added in backward, from the logits).
template <class T>
void z_loss_forward(MoeSaved<T>& s, const MoeRouting& routing, const MoeDims& d, int N) {
  s.z_loss_weight = routing.z_loss_weight;
  s.z_loss = 0.0;
  if (routing.z_loss_weight <= 0) return;
  const auto [B, S] = moe_sequences(s, N);
  s.z_loss = router_z_loss_forward(s.logits.data(), B, S, d.E, routing.z_loss_weight);
}

// The rows to dispatch: token t's input once per chosen expert, in the plan's send order.
template <class T> void gather_send_rows(MoeSaved<T>& s, const T* in, const MoeDims& d) {
  const size_t D = d.D;
  const int NK = s.plan.num_send();
  s.scratch.send_rows.resize(NK * D);
#pragma omp parallel for schedule(static) if (NK >= kParallelRows)
  for (int p = 0; p < NK; ++p) {
    const T* src = in + static_cast<size_t>(s.plan.send_assignment[p] / d.K) * D;
    std::copy_n(src, D, &s.scratch.send_rows[p * D]);
  }
}

// gather_send_rows reversed: the gradients of token t's K rows (`rows`, in send order), in slot
// order (the same sums whatever the threads), added into d_in[t].
template <class T>
void scatter_rows_backward(T* d_in, const T* rows, const MoeSaved<T>& s, const MoeDims& d) {
  const size_t D = d.D;
  const int N = s.N;
#pragma omp parallel for schedule(static) if (N >= kParallelRows)
  for (int t = 0; t < N; ++t) {
    T* di = d_in + static_cast<size_t>(t) * D;
    // The next token's rows, fetched while this one's are added (as in weighted_sum_forward).
    if (t + 1 < N) {
      for (int j = 0; j < d.K; ++j) {
        const int p = s.plan.send_position[(t + 1) * d.K + j];
        if (p >= 0) prefetch_values(rows + static_cast<size_t>(p) * D, D);
      }
    }
    for (int j = 0; j < d.K; ++j) {
      const int p = s.plan.send_position[t * d.K + j];
      if (p < 0) continue;  // dropped: it never reached an expert
      const T* r = rows + static_cast<size_t>(p) * D;
      // + 0: the experts write d_x without zeroing it first (moe_experts_backward); this is
      // the value their sum into +0 had.
      for (size_t c = 0; c < D; ++c) di[c] += r[c] + T(0);
    }
  }
}

// out[t] += Σ_j w[t,j]·y[t,j], over the combined rows (`rows`, in send order).
template <class T>
void weighted_sum_forward(T* out, const T* rows, const MoeSaved<T>& s, const MoeDims& d) {
  const size_t D = d.D;
  const int N = s.N;
#pragma omp parallel for schedule(static) if (N >= kParallelRows)
  for (int t = 0; t < N; ++t) {
    T* o = out + t * D;
    // The next token's rows, fetched while this one's are added: the combined rows lie in the
    // exchange's order, not the tokens'.
    if (t + 1 < N) {
      for (int j = 0; j < d.K; ++j) {
        const int p = s.plan.send_position[(t + 1) * d.K + j];
        if (p >= 0) prefetch_values(rows + static_cast<size_t>(p) * D, D);
      }
    }
    for (int j = 0; j < d.K; ++j) {
      const int p = s.plan.send_position[t * d.K + j];
      if (p < 0) continue;  // dropped: no expert output, as a combine weight of zero
      const T wt = s.weights[t * d.K + j];
      const T* y = rows + static_cast<size_t>(p) * D;
      for (size_t c = 0; c < D; ++c) o[c] += wt * y[c];
    }
  }
}

// weighted_sum_forward reversed: d_w[t,j] = <d_out[t], y[t,j]> and d_y[t,j] = w[t,j]·d_out[t],
// the rows that travel back to the experts' owners (d_w of the dropped assignments untouched).
template <class T> void weighted_sum_backward(MoeSaved<T>& s, const T* d_out, const MoeDims& d) {
  const int sent = s.plan.num_send();
  s.scratch.d_rows.resize(static_cast<size_t>(sent) * d.D);
  parallel_blocks(sent, kParallelRows, [&](int64_t first, int64_t last) {
    combine_rows_backward(s, d_out, s.y_rows.data(), s.scratch.d_rows.data(),
                          static_cast<int>(first), static_cast<int>(last - first), d);
  });
}

// The router reversed: w = normalise(s[sel])·scale, s = f(logits), logits = in·W_g; the balance
// loss contributes its own ∂/∂s, computed in forward, and the z-loss its ∂/∂logits.
template <class T>
void router_backward(T* d_in, const MoeWeights<T>& gr, MoeSaved<T>& s, const T* in,
                     const MoeWeights<T>& w, const MoeDims& d) {
  const int N = s.N;
  MoeScratch<T>& t = s.scratch;
  const auto [B, S] = moe_sequences(s, N);
  if (s.d_scores_balance.empty()) {
    t.d_scores.assign(static_cast<size_t>(N) * d.E, T(0));
  } else {
    t.d_scores.assign(s.d_scores_balance.begin(), s.d_scores_balance.end());
  }
  t.d_logits.assign(t.d_scores.size(), T(0));
  route_weights_backward(t.d_scores.data(), t.d_weights.data(), s.scores.data(),
                         s.expert_idx.data(), N, d.E, d.K, d.route_scale);
  score_backward(t.d_logits.data(), t.d_scores.data(), s.logits.data(), s.scores.data(), N, d.E,
                 d.score);
  if (s.z_loss_weight > 0) {
    router_z_loss_backward(t.d_logits.data(), s.logits.data(), N, d.E, s.z_loss_weight);
  }
  // logits = in·W_g, a task per sequence: d_in += d_logits·W_gᵀ, and the sequence's d_W_g, added
  // along the tree over sequences once all are in (one sequence adds into the gradient directly).
  const size_t DE = static_cast<size_t>(d.D) * d.E;
  parallel_tasks(B, [&](int64_t b) {
    const int64_t row0 = b * S;
    linear_backward_input(d_in + row0 * d.D, t.d_logits.data() + row0 * d.E, w.router, S, d.D, d.E);
    T* leaf = B > 1 ? t.router_leaves.data() + b * DE : gr.router;
    gemm<T>(true, false, d.D, d.E, S, T(1), in + row0 * d.D, t.d_logits.data() + row0 * d.E,
            B > 1 ? T(0) : T(1), leaf);
  });
  if (B > 1) tree_sum_leaves(gr.router, t.router_leaves.data(), B, DE, DE);
}

// The shared expert overlaps the dispatch's transfer when asked to and when there is one (an EP
// group of more than one rank); otherwise it is one more task next to the routed experts, where
// the rank's other threads can take it.
bool shared_overlaps_dispatch(const MoeDims& d, const EpExchange& ex) {
  return d.overlap_shared && ex.comm().size() > 1;
}

// An EP group of one rank exchanges nothing: its experts read their rows in place
// (moe_experts.hpp).
ExpertRows expert_rows_of(const EpExchange& ex) {
  return ex.comm().size() == 1 ? ExpertRows::kInPlace : ExpertRows::kExchanged;
}

}  // namespace

template <class T>
void moe_forward(T* out, MoeSaved<T>& s, const T* in, const MoeWeights<T>& w,
                 const MoeRouting& routing, const MoeDims& d, const ExpertPlacement& placement,
                 EpExchange& ex, int N) {
  // The shared expert's GEMMs and the weight gradients go sequence by sequence (sequences_of):
  // refused here, before any collective, unless the tokens are whole sequences that fit the
  // reserve. Every rank of the EP group sees the same sizes, so all refuse together.
  if (routing.seq_len < 0 || (routing.seq_len > 0 && N % routing.seq_len != 0)) {
    throw std::invalid_argument("moe_forward: " + std::to_string(N) +
                                " tokens are not whole sequences of seq_len " +
                                std::to_string(routing.seq_len));
  }
  check_scratch(s, "moe_forward");
  const int num_sequences = routing.seq_len > 0 ? N / routing.seq_len : (N > 0 ? 1 : 0);
  if (num_sequences > s.max_sequences) {
    throw std::invalid_argument("moe_forward: " + std::to_string(num_sequences) +
                                " sequences, but moe_saved_reserve reserved " +
                                std::to_string(s.max_sequences));
  }
  const size_t D = d.D;
  const bool overlap = shared_overlaps_dispatch(d, ex);
  const ExpertRows where = expert_rows_of(ex);
  s.N = N;
  s.seq_len = routing.seq_len;
  {
    ScopedPhase timer(s.times, Phase::kRouter);
    s.logits.resize(static_cast<size_t>(N) * d.E);
    s.scores.resize(s.logits.size());
    s.expert_idx.resize(static_cast<size_t>(N) * d.K);
    s.weights.resize(s.expert_idx.size());
    // Router in a fixed-order loop: routing is bitwise independent of N and of the threads.
    router_logits_forward(s.logits.data(), in, w.router, N, d.D, d.E);
    score_forward(s.scores.data(), s.logits.data(), N, d.E, d.score);
    select_experts(s, routing, d, N);
    route_weights_forward(s.weights.data(), s.scores.data(), s.expert_idx.data(), N, d.E, d.K,
                          d.route_scale);
    balance_loss_forward(s, routing, d, N);
    z_loss_forward(s, routing, d, N);
    std::fill(s.dropped.begin(), s.dropped.end(), int64_t{0});
    s.dispatched_idx.clear();
    if (routing.capacity > 0) {
      s.dispatched_idx.resize(s.expert_idx.size());
      capacity_drop<T>(s.dispatched_idx, s.dropped, s.expert_idx, s.weights, N,
                       routing.seq_len > 0 && !routing.capacity_per_rank ? routing.seq_len : N, d.K,
                       d.E, routing.capacity, routing.drop_policy, s.capacity_scratch);
    }
    dispatch_plan_build(s.plan, s.sent_idx(), N, d.K, placement, ex.comm().rank(), routing.seq_len);
  }
  const int NK = s.plan.num_send();
  {
    ScopedPhase timer(s.times, Phase::kDispatch);
    if (where == ExpertRows::kInPlace) {
      ex.dispatch_counted_alone(s.plan, d.D);  // the experts gather their rows themselves
    } else {
      gather_send_rows(s, in, d);
      // The plan's counts first (or with the rows, across hosts); s.x becomes [R, D] once they
      // are in.
      ex.dispatch_counted_begin(s.x, std::span<const T>(s.scratch.send_rows), s.plan, d.D);
      if (!overlap) {
        ex.dispatch_end();
      }
    }
  }
  if (overlap) {
    {
      // The shared expert needs no routed rows: it runs while the dispatched rows are in flight.
      ScopedPhase timer(s.times, Phase::kExperts);
      moe_shared_forward(out, s, in, w, d, N);
    }
    ScopedPhase timer(s.times, Phase::kDispatch);
    ex.dispatch_end();
  }
  const int R = s.plan.num_recv;
  {
    ScopedPhase timer(s.times, Phase::kExperts);
    s.g.resize(static_cast<size_t>(R) * d.F);
    s.v.resize(s.g.size());
    s.scratch.h.resize(s.g.size());
    s.y.resize(R * D);
    if (where == ExpertRows::kInPlace) s.x.resize(R * D);
    moe_experts_forward(s, w, d, overlap ? nullptr : out, in, where);
  }
  ScopedPhase timer(s.times, Phase::kCombine);
  if (where == ExpertRows::kInPlace) {
    weighted_sum_forward(out, s.y.data(), s, d);  // y's rows are in send order already
    return;
  }
  s.y_rows.resize(NK * D);
  ex.combine(std::span<T>(s.y_rows), std::span<const T>(s.y), s.plan, d.D);
  weighted_sum_forward(out, s.y_rows.data(), s, d);
}

template <class T>
void moe_backward(T* d_in, const MoeWeights<T>& gr, const T* d_out, MoeSaved<T>& s, const T* in,
                  const MoeWeights<T>& w, const MoeDims& d, EpExchange& ex) {
  check_scratch(s, "moe_backward");
  const int R = s.plan.num_recv;
  const bool overlap = shared_overlaps_dispatch(d, ex);
  const ExpertRows where = expert_rows_of(ex);
  {
    // The weighted sum reversed (in place: by the experts' row tasks); then combine's backward
    // is a dispatch: output gradients travel to the experts' owners. A dropped assignment's d_w
    // is 0.
    ScopedPhase timer(s.times, Phase::kCombineBackward);
    s.scratch.d_y.resize(static_cast<size_t>(R) * d.D);
    s.scratch.d_weights.assign(static_cast<size_t>(s.N) * d.K, T(0));
    if (where == ExpertRows::kExchanged) {
      weighted_sum_backward(s, d_out, d);
      ex.dispatch_begin(std::span<T>(s.scratch.d_y), std::span<const T>(s.scratch.d_rows), s.plan,
                        d.D);
      if (!overlap) {
        ex.dispatch_end();
      }
    }
  }
  if (overlap) {
    {
      // While the gradients are in flight.
      ScopedPhase timer(s.times, Phase::kExpertsBackward);
      moe_shared_backward(d_in, gr, d_out, s, in, w, d, s.N);
    }
    ScopedPhase timer(s.times, Phase::kCombineBackward);
    ex.dispatch_end();
  }
  {
    ScopedPhase timer(s.times, Phase::kExpertsBackward);
    // The rows of each (source, local expert, sequence): the leaves of the weight gradients.
    expert_seq_rows_exchange(s.expert_rows, s.plan, s.N, s.seq_len, s.expert_layout, ex.comm());
    moe_experts_backward(s, gr, w, d, overlap ? nullptr : d_in, d_out, in, where);
  }
  {
    // Dispatch's backward is a combine: input gradients come back to the tokens' ranks.
    ScopedPhase timer(s.times, Phase::kDispatchBackward);
    if (where == ExpertRows::kInPlace) {
      // d_x's rows are in send order already.
      scatter_rows_backward(d_in, s.scratch.d_x.data(), s, d);
    } else {
      ex.combine(std::span<T>(s.scratch.d_rows), std::span<const T>(s.scratch.d_x), s.plan, d.D);
      scatter_rows_backward(d_in, s.scratch.d_rows.data(), s, d);
    }
  }
  ScopedPhase timer(s.times, Phase::kRouterBackward);
  router_backward(d_in, gr, s, in, w, d);
}

#define MOE_LAYER_INSTANTIATE(T)                                                              \
  template MoeWeights<T> moe_weights_at<T>(T*, T*, const MoeOffsets&, const MoeDims&);        \
  template void moe_saved_reserve<T>(MoeSaved<T>&, int, const MoeDims&, int, int, int, bool); \
  template void moe_scratch_reserve<T>(MoeScratch<T>&, int, const MoeDims&, int, int, int);   \
  template void moe_forward<T>(T*, MoeSaved<T>&, const T*, const MoeWeights<T>&,              \
                               const MoeRouting&, const MoeDims&, const ExpertPlacement&,     \
                               EpExchange&, int);                                             \
  template void moe_backward<T>(T*, const MoeWeights<T>&, const T*, MoeSaved<T>&, const T*,   \
                                const MoeWeights<T>&, const MoeDims&, EpExchange&);
MOE_LAYER_INSTANTIATE(float)
MOE_LAYER_INSTANTIATE(double)
#undef MOE_LAYER_INSTANTIATE

}  // namespace moe

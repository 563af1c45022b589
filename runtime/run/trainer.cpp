// Trainer: one training step as a flat sequence of calls (see trainer.hpp).
#include "runtime/run/trainer.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <utility>

#include "io/synthetic_data.hpp"
#include "model/balance.hpp"
#include "model/parallel.hpp"
#include "model/router.hpp"
#include "runtime/run/stop_signal.hpp"

namespace moe {
namespace {

constexpr float kMinLrRatio = 0.1f;  // cosine decays to 10% of --lr

// The first global sample of the validation sequences: a file's from its start, the synthetic
// source's held-out range.
int64_t val_first_sample(const TokenSource& source) {
  return dynamic_cast<const SyntheticSource*>(&source) != nullptr ? kSyntheticValFirstSample : 0;
}

// The per-layer balance metrics of a step from its global loads.
void fill_metrics(StepRecord& rec, const RoutingState& routing, int L, int E, int W) {
  rec.load_variance.resize(L);
  rec.max_violation.resize(L);
  rec.load_cv.resize(L);
  rec.rank_overload.resize(L);
  rec.worst_violation = 0.0;
  for (int l = 0; l < L; ++l) {
    const BalanceMetrics m =
        balance_metrics(std::span<const int64_t>(&rec.expert_load[static_cast<size_t>(l) * E], E));
    rec.load_variance[l] = m.variance;
    rec.max_violation[l] = m.max_violation;
    rec.load_cv[l] = m.cv;
    rec.rank_overload[l] =
        overload_factor(std::span<const int64_t>(&rec.rank_load[static_cast<size_t>(l) * W], W));
    if (routing.modes[l] != RoutingMode::kHash) {
      rec.worst_violation = std::max(rec.worst_violation, m.max_violation);
    }
  }
  // Each shadow balancer's, in its top-k layers (0 elsewhere, where it routes nothing).
  const size_t R = routing.config.shadows.size();
  rec.shadow_max_violation.assign(R * L, 0.0);
  for (size_t r = 0; r < R; ++r) {
    for (int l = 0; l < L; ++l) {
      if (routing.modes[l] != RoutingMode::kTopK) continue;
      rec.shadow_max_violation[r * L + l] =
          balance_metrics(std::span<const int64_t>(&rec.shadow_load[(r * L + l) * E], E))
              .max_violation;
    }
  }
}

// --check-bias: every rank must hold bitwise the same bias (max and min over ranks agree).
void check_bias_consistent(const Comm& world, const std::vector<float>& bias, int64_t step) {
  std::vector<float> hi = bias, lo(bias.size());
  for (size_t i = 0; i < bias.size(); ++i) lo[i] = -bias[i];
  world.allreduce_max(std::span<float>(hi));
  world.allreduce_max(std::span<float>(lo));
  for (size_t i = 0; i < bias.size(); ++i) {
    if (hi[i] != -lo[i]) {
      throw std::runtime_error("--check-bias: ranks disagree on bias entry " + std::to_string(i) +
                               " at step " + std::to_string(step));
    }
  }
}

}  // namespace

Trainer::Trainer(const RunConfig& cfg, const Comm& world, const HostLayout& hosts, int ep_size,
                 ModelPlacement placement, std::unique_ptr<TokenSource> data,
                 std::unique_ptr<TokenSource> val_data, RoutingState routing, RunStats* stats)
    : cfg_(cfg),
      mc_(cfg.model),
      world_(world),
      data_(std::move(data)),
      val_data_(std::move(val_data)),
      routing_(std::move(routing)),
      stats_(stats),
      P_(ep_size),
      groups_(parallel_groups_make(world, P_, hosts)),
      placement_(std::move(placement)),
      max_local_(model_placement_max_local(placement_)),
      layout_(model_layout(mc_, placement_, groups_.ep.rank())),
      ex_(groups_.ep, EpExchange::counts_for_hosts(groups_.ep_hosts)),
      adam_{0.9f, 0.95f, 1e-8f, static_cast<float>(cfg.weight_decay)} {
  const int W = world.size(), L = mc_.layers, S = mc_.seq_len, B = mc_.batch_per_rank;
  const int N = B * S;
  // Parameters, gradients and optimizer state: two arenas each (the parameters' values come from
  // init_params or a checkpoint).
  dense_.resize(layout_.dense.num_elements);
  experts_.resize(layout_.experts.num_elements);
  d_dense_.resize(dense_.size());
  adamw_state_init(adam_dense_, dense_.size());
  adamw_state_init(adam_experts_, experts_.size());
  // Activations and step buffers, sized once.
  model_acts_reserve(acts_, mc_, B, P_, max_local_);
  // Expert gradients by sequence along the global tree (model/expert_grads.hpp): this EP group's
  // sequences start at g·P·B. With several EP groups, a group sums the nodes of the tree its
  // sequences cover, node n into plane n of d_experts_, and reduce() adds every group's nodes
  // along the rest of the tree; so does each replica of a replicated expert with the nodes of
  // its chunk of the sequences (ExpertInstanceReduce).
  const ExpertGradLayout expert_layout{groups_.ep_group * P_ * B, W * B,
                                       static_cast<int64_t>(experts_.size())};
  const bool replicated = model_placement_has_replicas(placement_);
  expert_nodes_ = expert_grad_group_nodes(W, P_, B);
  for (const std::vector<TreeNode>& nodes : expert_nodes_) {
    expert_planes_ = std::max(expert_planes_, nodes.size());
  }
  if (replicated) expert_planes_ = ExpertInstanceReduce::planes_needed(placement_, W, B);
  // The backward's expert gradients are final (one plane, no replicas or redundant copies to
  // add): each layer's backward writes them rather than adding to them, so step() does not zero
  // them first, and takes their sums of squares (MoeSaved::weight_grad_sq).
  const bool grads_final = !replicated && groups_.num_replicas == 1 && expert_planes_ == 1;
  for (MoeSaved<float>& layer : acts_.moe) {
    layer.expert_layout = expert_layout;
    layer.weight_grads_final = grads_final;
  }
  d_experts_.resize(experts_.size() * expert_planes_);
  if (replicated) {
    instance_reduce_ = std::make_unique<ExpertInstanceReduce>(
        world, hosts, groups_, placement_, layout_, B,
        static_cast<size_t>(mc_.d_model) * mc_.ffn_dim, d_experts_.data(), experts_.size());
  } else if (groups_.num_replicas > 1 && expert_planes_ == 1) {
    expert_scratch_.resize(experts_.size());  // allreduce_sum_tree's
  } else if (groups_.num_replicas > 1) {
    expert_gathered_.resize(d_experts_.size() * groups_.num_replicas);
    expert_tree_scratch_.assign(tree_sum_depth(W * B), std::vector<float>(experts_.size()));
  }
  acts_.times = &times_;  // always on: ~100 scopes of 38 ns per step (docs/performance.md)
  sample_.resize(S + 1);
  tokens_.resize(N);
  targets_.resize(N);
  // The dense arena's shares: whole chunks of the gradient's sums of squares, as evenly as the
  // chunks allow, in rank order.
  dense_chunks_ = sum_squares_chunks(dense_.size());
  share_counts_.resize(W);
  share_displs_.resize(W);
  size_t widest = 0;
  for (int r = 0; r < W; ++r) {
    const size_t c0 = dense_chunks_.count * r / W, c1 = dense_chunks_.count * (r + 1) / W;
    const size_t first = std::min(dense_.size(), c0 * dense_chunks_.size);
    const size_t end = std::min(dense_.size(), c1 * dense_chunks_.size);
    share_displs_[r] = static_cast<int>(first);
    share_counts_[r] = static_cast<int>(end - first);
    widest = std::max(widest, end - first);
    if (r == world.rank()) share_first_chunk_ = c0, share_end_chunk_ = c1;
  }
  sums_.resize(1 + 2 * static_cast<size_t>(L) + dense_chunks_.count);
  sums_scratch_.resize(sums_.size());
  dense_scratch_.resize(W > 1 ? static_cast<size_t>(W) * widest : 0);
  expert_sq_.resize(static_cast<size_t>(L) * max_local_);
  expert_sq_all_.resize(expert_sq_.size() * P_);
  // With a statistics file, the rows each rank sent to each expert ride along (reduce_loads).
  recv_local_.resize(static_cast<size_t>(L) * (stats_ != nullptr ? 1 + mc_.experts : 1));
  if (stats_ != nullptr) slowest_.resize(kSlowestHead + static_cast<size_t>(W) * kNumPhases);
  const size_t R = routing_.config.shadows.size();
  load_sums_.resize(static_cast<size_t>(L) * (2 * mc_.experts + 2) + R * L * mc_.experts);
  if (R > 0) shadow_idx_.resize(static_cast<size_t>(N) * mc_.top_k);
  recv_all_.resize(static_cast<size_t>(W) * recv_local_.size());
  T_ = static_cast<int64_t>(W) * N;
  batch_.tokens = tokens_.data();
  batch_.targets = targets_.data();
  batch_.first_global_token = static_cast<int64_t>(world.rank()) * N;
  batch_.loss_scale = 1.0 / static_cast<double>(T_);
  batch_.num_global_sequences = static_cast<int64_t>(W) * B;
}

StepRecord Trainer::step(int step) {
  const PhaseClock::time_point t0 = PhaseClock::now();
  times_.reset();
  times_[Phase::kStats] = stats_seconds_;
  times_[Phase::kCheckpoint] = std::exchange(checkpoint_seconds_, 0.0);
  load_batch(step);
  StepRecord rec;
  rec.step = step;
  rec.bias = routing_.bias;  // the bias this step routes with, before its update
  rec.shadow_bias = routing_.shadow_bias;
  parallel_zero(d_dense_.data(), d_dense_.size());
  // Where the expert gradients are final (set for every layer alike in the constructor), the one
  // model_backward below writes every value of d_experts_ before anything reads it: a second
  // backward into the same arena (accumulating micro-batches) would need the zeroing back.
  if (acts_.moe.empty() || !acts_.moe.front().weight_grads_final) {
    parallel_zero(d_experts_.data(), d_experts_.size());
  }
  sums_[0] = model_forward(acts_, dense_.data(), experts_.data(), layout_, routing_, batch_, mc_,
                           placement_, ex_);
  std::copy(acts_.layer_balance_loss.begin(), acts_.layer_balance_loss.end(), sums_.begin() + 1);
  std::copy(acts_.layer_z_loss.begin(), acts_.layer_z_loss.end(), sums_.begin() + 1 + mc_.layers);
  model_backward(d_dense_.data(), d_experts_.data(), acts_, dense_.data(), experts_.data(), layout_,
                 batch_, mc_, ex_);
  reduce(rec);
  optimize(rec, step);
  {
    ScopedPhase timer(&times_, Phase::kStats);
    fill_metrics(rec, routing_, mc_.layers, mc_.experts, world_.size());
    if (stats_ && stats_->is_trace_step(step)) {
      stats_->record_trace(world_, step, acts_, tokens_, mc_.seq_len);
    }
  }
  // The step's time includes the previous step's statistics append, which ran after that step's
  // time was taken and is charged to this step's "stats" phase: without it the phases could add
  // up to more than the step (a negative "unaccounted" in the phase table). The stop flag travels
  // with the step time: every rank learns of a signal that any rank received, at the same step
  // boundary, without a collective of its own. So does a statistics row that rank 0 could not
  // write (of an earlier step or evaluation).
  slowest_[0] = phase_seconds_since(t0) + stats_seconds_;
  slowest_[1] = stop_signal_pending();
  slowest_[2] = stats_ && !stats_->failure().empty() ? 1.0 : 0.0;
  if (stats_) {
    const std::span<double> phases = std::span<double>(slowest_).subspan(kSlowestHead);
    std::fill(phases.begin(), phases.end(), 0.0);
    // Durations, never negative (a checkpoint's, from MPI_Wtime, clamped should that clock step
    // back): the max with the other ranks' zeros is exactly this rank's row.
    std::transform(times_.seconds.begin(), times_.seconds.end(),
                   phases.begin() + static_cast<ptrdiff_t>(world_.rank()) * kNumPhases,
                   [](double t) { return std::max(t, 0.0); });
  }
  world_.allreduce_max(std::span<double>(slowest_));
  rec.step_time_s = slowest_[0];
  stop_signal_ = static_cast<int>(slowest_[1]);
  stats_failed_ = slowest_[2] > 0.0;
  rec.tokens_per_s = static_cast<double>(T_) / rec.step_time_s;
  if (stats_) {
    const PhaseClock::time_point s0 = PhaseClock::now();
    stats_->record_step(rec, std::span<const double>(slowest_).subspan(kSlowestHead));
    stats_seconds_ = phase_seconds_since(s0);
  }
  return rec;
}

// Global sample first + i goes to rank ⌊i/B⌋: the global batch does not depend on W.
void Trainer::load_samples(const TokenSource& source, int64_t first) {
  const int B = mc_.batch_per_rank, S = mc_.seq_len;
  for (int b = 0; b < B; ++b) {
    source.sample(first + static_cast<int64_t>(world_.rank()) * B + b, S, sample_.data());
    std::copy_n(sample_.begin(), S, tokens_.begin() + b * S);
    std::copy_n(sample_.begin() + 1, S, targets_.begin() + b * S);
  }
}

void Trainer::load_batch(int step) {
  ScopedPhase timer(&times_, Phase::kOther);
  load_samples(*data_, static_cast<int64_t>(step) * world_.size() * mc_.batch_per_rank);
  batch_.step = step;
}

EvalRecord Trainer::evaluate(int step) {
  const double t0 = MPI_Wtime();
  const int L = mc_.layers, E = mc_.experts;
  const int64_t G = static_cast<int64_t>(world_.size()) * mc_.batch_per_rank;
  EvalRecord rec;
  rec.step = step;
  rec.expert_load.assign(static_cast<size_t>(L) * E, 0);
  rec.dropped.assign(rec.expert_load.size(), 0);
  // Forward only, untimed (the phase table is the steps'); the step's training activations are
  // overwritten, which nothing reads after the step.
  acts_.times = nullptr;
  batch_.step = step;
  double ce_sum = 0.0;
  std::vector<double> ce(1), ce_scratch(1);
  for (int k = 0; k < cfg_.eval_batches; ++k) {
    load_samples(*val_data_, val_first_sample(*val_data_) + k * G);
    ce[0] = model_forward(acts_, dense_.data(), experts_.data(), layout_, routing_, batch_, mc_,
                          placement_, ex_);
    // Batch by batch along the same tree as the training loss, then in batch order: the same
    // bits on any rank count.
    world_.allreduce_sum_tree(std::span<double>(ce), std::span<double>(ce_scratch));
    ce_sum += ce[0];
    for (int l = 0; l < L; ++l) {  // the selection's loads: the kept and the dropped
      const MoeSaved<float>& layer = acts_.moe[l];
      for (int e = 0; e < E; ++e) {
        const size_t at = static_cast<size_t>(l) * E + e;
        rec.expert_load[at] += layer.selected_load(e);
        rec.dropped[at] += layer.dropped[e];
      }
    }
  }
  acts_.times = &times_;
  world_.allreduce_sum(std::span<int64_t>(rec.expert_load));
  world_.allreduce_sum(std::span<int64_t>(rec.dropped));
  rec.tokens = static_cast<int64_t>(cfg_.eval_batches) * T_;
  rec.loss = ce_sum / static_cast<double>(rec.tokens);
  rec.load_variance.resize(L);
  rec.max_violation.resize(L);
  for (int l = 0; l < L; ++l) {
    const BalanceMetrics m =
        balance_metrics(std::span<const int64_t>(&rec.expert_load[static_cast<size_t>(l) * E], E));
    rec.load_variance[l] = m.variance;
    rec.max_violation[l] = m.max_violation;
    if (routing_.modes[l] != RoutingMode::kHash) {
      rec.worst_violation = std::max(rec.worst_violation, m.max_violation);
    }
  }
  std::vector<double> slowest = {MPI_Wtime() - t0};
  world_.allreduce_max(std::span<double>(slowest));
  rec.time_s = slowest[0];
  if (stats_) stats_->record_eval(rec);
  return rec;
}

// Gradients: replicated over all ranks, experts over their replicas; losses; the loads
// (reduce_loads); the experts' share of the gradient norm.
void Trainer::reduce(StepRecord& rec) {
  ScopedPhase timer(&times_, Phase::kAllReduce);
  const int L = mc_.layers;
  // Dense gradients and the losses along the fixed tree over ranks (model/tree_sum.hpp): with
  // power-of-two sequences per rank, the same bits on any rank count.
  // Each rank's share of the dense gradient, summed along the tree over ranks, and that share's
  // sums of squares by chunk, which travel with the losses: every rank then has the norm's every
  // chunk, from the one rank that holds it (the others add +0).
  if (world_.size() > 1) {
    world_.reduce_scatter_tree(std::span<float>(d_dense_), std::span<const int>(share_counts_),
                               std::span<const int>(share_displs_),
                               std::span<float>(dense_scratch_));
  }
  double* parts = dense_norm_parts();
  std::fill(parts, parts + dense_chunks_.count, 0.0);
  const std::span<const float> dense_grads(d_dense_);
#pragma omp parallel for schedule(static)
  for (size_t c = share_first_chunk_; c < share_end_chunk_; ++c) {
    parts[c] = sum_squares_chunk(dense_grads, dense_chunks_, c);
  }
  if (instance_reduce_) {
    instance_reduce_->reduce();
  } else if (groups_.num_replicas > 1) {
    reduce_expert_replicas();
  }
  world_.allreduce_sum_tree(std::span<double>(sums_), std::span<double>(sums_scratch_));
  rec.loss = sums_[0] / static_cast<double>(T_);
  rec.layer_balance_loss.assign(sums_.begin() + 1, sums_.begin() + 1 + L);
  rec.layer_z_loss.assign(sums_.begin() + 1 + L, sums_.begin() + 1 + 2 * L);
  for (double b : rec.layer_balance_loss) rec.balance_loss += b;
  for (double z : rec.layer_z_loss) rec.z_loss += z;
  reduce_loads(rec);
  expert_norm_sq_ = expert_grad_norm_sq();
}

// This rank's loads of each shadow balancer, [R, L, E] at `out`: its top-k layers' scores routed
// as the layer routes them (group limit included) but with the shadow's bias.
void Trainer::shadow_local_loads(int64_t* out) {
  const int L = mc_.layers, E = mc_.experts, K = mc_.top_k;
  const RoutingConfig& rc = routing_.config;
  const size_t R = rc.shadows.size();
  std::fill(out, out + R * L * E, int64_t{0});
  for (size_t r = 0; r < R; ++r) {
    for (int l = 0; l < L; ++l) {
      if (routing_.modes[l] != RoutingMode::kTopK) continue;
      const MoeSaved<float>& layer = acts_.moe[l];
      route_topk_grouped(shadow_idx_.data(), layer.scores.data(),
                         &routing_.shadow_bias[(r * L + l) * E], layer.N, E, K, rc.routing_groups,
                         rc.group_topk);
      int64_t* load = out + (r * L + l) * E;
      for (size_t a = 0; a < static_cast<size_t>(layer.N) * K; ++a) ++load[shadow_idx_[a]];
    }
  }
}

// One all-reduce of the stacked [L, E] loads (the selection's, dropped assignments included),
// [L] rows and [L] tokens sent across hosts, [L, E] assignments a token capacity dropped and the
// shadow balancers' [R, L, E] loads; one all-gather of the rows each rank received.
void Trainer::reduce_loads(StepRecord& rec) {
  const int W = world_.size(), L = mc_.layers, E = mc_.experts;
  const size_t LE = static_cast<size_t>(L) * E;
  // Where each part of load_sums_ starts.
  const size_t rows = LE, tokens = rows + L, dropped = tokens + L, shadows = dropped + LE;
  for (int l = 0; l < L; ++l) {
    const MoeSaved<float>& layer = acts_.moe[l];
    for (int e = 0; e < E; ++e) {
      load_sums_[static_cast<size_t>(l) * E + e] = layer.selected_load(e);
      load_sums_[dropped + static_cast<size_t>(l) * E + e] = layer.dropped[e];
    }
    load_sums_[rows + l] = dispatch_plan_cross_host_rows(layer.plan, groups_.ep_hosts);
    load_sums_[tokens + l] = dispatch_plan_cross_host_tokens(layer.plan, groups_.ep_hosts);
    recv_local_[l] = layer.plan.num_recv;
    if (stats_ != nullptr) {
      std::copy(layer.plan.expert_counts.begin(), layer.plan.expert_counts.end(),
                recv_local_.begin() + L + static_cast<size_t>(l) * E);
    }
  }
  shadow_local_loads(load_sums_.data() + shadows);
  world_.allreduce_sum(std::span<int64_t>(load_sums_));
  const auto at = [&](size_t offset) { return load_sums_.begin() + offset; };
  rec.expert_load.assign(at(0), at(rows));
  rec.cross_host_rows.assign(at(rows), at(tokens));
  rec.cross_host_tokens.assign(at(tokens), at(dropped));
  rec.dropped.assign(at(dropped), at(shadows));
  rec.shadow_load.assign(at(shadows), load_sums_.end());
  // Every assignment a capacity did not drop is dispatched (to its expert's owner, this rank
  // included): Σ_e c_l[e] − dropped_l[e].
  rec.dispatch_rows.assign(L, 0);
  for (int l = 0; l < L; ++l) {
    for (int e = 0; e < E; ++e) {
      const size_t at = static_cast<size_t>(l) * E + e;
      rec.dispatch_rows[l] += rec.expert_load[at] - rec.dropped[at];
    }
  }
  // The rows each rank received and, for the statistics file, sent to each expert, [W, L] or
  // [W, L + L·E]: one all-gather, which the step had anyway (a collective of its own, with the
  // ranks sharing cores, cost 0.3% of the 8-rank default step). W·L·E values a rank: a cost that
  // grows with the rank count, paid only where a file records them.
  world_.allgather(std::span<const int64_t>(recv_local_), std::span<int64_t>(recv_all_));
  const size_t per_rank = recv_local_.size();
  const bool sources = stats_ != nullptr;
  rec.rank_load.resize(static_cast<size_t>(L) * W);
  rec.source_load.resize(sources ? static_cast<size_t>(L) * W * E : 0);
  for (int r = 0; r < W; ++r) {
    const int64_t* from = &recv_all_[r * per_rank];
    for (int l = 0; l < L; ++l) {
      rec.rank_load[static_cast<size_t>(l) * W + r] = from[l];
      for (int e = 0; sources && e < E; ++e) {  // one rank's T·K fits an int32
        rec.source_load[(static_cast<size_t>(l) * W + r) * E + e] =
            static_cast<int32_t>(from[L + static_cast<size_t>(l) * E + e]);
      }
    }
  }
}

// The experts' share of the global norm: dense gradients are identical everywhere (counted once
// in optimize); each expert once, from one EP group, whose members own disjoint experts: every
// expert's sum of squares, gathered and added in (layer, global expert) order, so the norm is
// the same on any EP size and placement. The expert arena holds, per layer, w1 of each local
// expert, then w3, then w2 (model_layout).
double Trainer::expert_grad_norm_sq() {
  const int L = mc_.layers, me = groups_.ep.rank();
  const size_t DF = static_cast<size_t>(mc_.d_model) * mc_.ffn_dim;
  const std::span<const float> grads(d_experts_);
  std::fill(expert_sq_.begin(), expert_sq_.end(), 0.0);
  // Each expert's sum on its own (sum_squares fixes its chunks by size alone): on the rank's
  // threads, the same bits; or, where the backward left the gradients final, its sums of each
  // matrix (taken there while in cache), added in the same order: w1, w3, w2.
#pragma omp parallel for collapse(2) schedule(static)
  for (int l = 0; l < L; ++l) {
    for (int i = 0; i < max_local_; ++i) {
      if (i >= placement_[l].num_local(me)) continue;
      double sq = 0.0;
      if (acts_.moe[l].weight_grads_final) {
        const double* m = &acts_.moe[l].weight_grad_sq[3 * static_cast<size_t>(i)];  // W2, W1, W3
        for (const int w : {1, 2, 0}) sq += m[w];
      } else {
        const MoeOffsets& o = layout_.layers[l].moe;
        for (const size_t w : {o.w1, o.w3, o.w2}) sq += sum_squares(grads.subspan(w + i * DF, DF));
      }
      expert_sq_[static_cast<size_t>(l) * max_local_ + i] = sq;
    }
  }
  groups_.ep.allgather(std::span<const double>(expert_sq_), std::span<double>(expert_sq_all_));
  double norm_sq = 0.0;
  for (int l = 0; l < L; ++l) {
    const ExpertPlacement& pl = placement_[l];
    for (int e = 0; e < mc_.experts; ++e) {
      const int q = pl.owner(e), i = pl.local_index(e);
      norm_sq += expert_sq_all_[(static_cast<size_t>(q) * L + l) * max_local_ + i];
    }
  }
  return norm_sq;
}

namespace {

constexpr uint64_t kFnvOffset = 1469598103934665603ull, kFnvPrime = 1099511628211ull;

// FNV-1a over the values' bytes, from `h`.
uint64_t fnv1a(uint64_t h, std::span<const float> values) {
  const auto* bytes = reinterpret_cast<const unsigned char*>(values.data());
  for (size_t i = 0; i < values.size_bytes(); ++i) h = (h ^ bytes[i]) * kFnvPrime;
  return h;
}

uint64_t fnv1a_word(uint64_t h, uint64_t word) {
  for (int b = 0; b < 8; ++b) h = (h ^ ((word >> (8 * b)) & 0xff)) * kFnvPrime;
  return h;
}

}  // namespace

uint64_t Trainer::param_digest() const {
  const int L = mc_.layers, me = groups_.ep.rank();
  const size_t DF = static_cast<size_t>(mc_.d_model) * mc_.ffn_dim;
  // Each local expert tensor's digest, [L, max_local_, 3], gathered over the EP group (every
  // group holds the same experts' values, so any one will do: each uses its own).
  std::vector<uint64_t> local(static_cast<size_t>(L) * max_local_ * 3, 0);
  std::vector<uint64_t> all(local.size() * P_);
  const std::span<const float> experts(experts_);
  for (int l = 0; l < L; ++l) {
    const MoeOffsets& o = layout_.layers[l].moe;
    for (int i = 0; i < placement_[l].num_local(me); ++i) {
      int m = 0;
      for (const size_t w : {o.w1, o.w3, o.w2}) {
        local[(static_cast<size_t>(l) * max_local_ + i) * 3 + m++] =
            fnv1a(kFnvOffset, experts.subspan(w + i * DF, DF));
      }
    }
  }
  groups_.ep.allgather(std::span<const uint64_t>(local), std::span<uint64_t>(all));
  uint64_t h = fnv1a(kFnvOffset, std::span<const float>(dense_));
  for (int l = 0; l < L; ++l) {
    const ExpertPlacement& pl = placement_[l];
    for (int e = 0; e < mc_.experts; ++e) {  // global expert order, whoever holds the expert
      const int q = pl.owner(e), i = pl.local_index(e);
      for (int m = 0; m < 3; ++m) {
        h = fnv1a_word(h, all[((static_cast<size_t>(q) * L + l) * max_local_ + i) * 3 + m]);
      }
    }
  }
  return h;
}

// The rank's experts, then its share of the dense arena (the optimizer's), whose shares go to
// every rank: the bits of one rank initialising all of it (each value depends on the seed, its
// tensor's name and its index only), each rank drawing about 1/W of it when the arena has many
// chunks.
void Trainer::init_params() {
  param_init(std::span<float>(experts_), layout_.experts, cfg_.seed);
  const size_t own = static_cast<size_t>(share_displs_[world_.rank()]);
  param_init_range(std::span<float>(dense_), layout_.dense, cfg_.seed, own,
                   own + static_cast<size_t>(share_counts_[world_.rank()]));
  if (world_.size() > 1) {
    world_.allgatherv_blocks(std::span<float>(dense_), std::span<const int>(share_counts_),
                             std::span<const int>(share_displs_));
  }
}

// Every EP group's nodes of its experts' gradient trees (plane n of d_experts_: node n of
// expert_nodes_[g]) added along the rest of the tree over all sequences into plane 0: the bits of
// one EP group holding every sequence. When each group's sequences are one subtree (P·B a power
// of two: one node, one plane), the groups' sums are the leaves of that tree's top, which is the
// tree over the replica ranks: allreduce_sum_tree adds them so, moving each arena about twice.
// Otherwise every group's nodes are gathered and the top is added on every rank.
void Trainer::reduce_expert_replicas() {
  const size_t A = experts_.size();
  if (expert_planes_ == 1) {
    groups_.replica.allreduce_sum_tree(std::span<float>(d_experts_),
                                       std::span<float>(expert_scratch_));
    return;
  }
  groups_.replica.allgather(std::span<const float>(d_experts_), std::span<float>(expert_gathered_));
  auto known = [&](TreeNode node) -> const float* {
    for (size_t g = 0; g < expert_nodes_.size(); ++g) {
      for (size_t n = 0; n < expert_nodes_[g].size(); ++n) {
        if (expert_nodes_[g][n] == node) return &expert_gathered_[(g * expert_planes_ + n) * A];
      }
    }
    return nullptr;
  };
  tree_sum_from_nodes(d_experts_.data(), A, world_.size() * mc_.batch_per_rank, known,
                      expert_tree_scratch_);
}

// Clipping, AdamW on both arenas, then the loss-free bias update from the global loads. A
// non-finite loss or norm (the same on every rank: both are global) updates nothing.
void Trainer::optimize(StepRecord& rec, int step) {
  ScopedPhase timer(&times_, Phase::kOptimizer);
  // The dense sum of squares as sum_squares adds it, from the chunks' sums.
  const double dense_sq =
      sum_squares_add_chunks(std::span<const double>(dense_norm_parts(), dense_chunks_.count));
  rec.grad_norm = std::sqrt(dense_sq + expert_norm_sq_);
  const float lr = lr_at_step(step, lr_horizon(cfg_), cfg_.warmup_steps,
                              static_cast<float>(cfg_.lr), kMinLrRatio);
  rec.lr = lr;
  nonfinite_ = !std::isfinite(rec.loss) || !std::isfinite(rec.grad_norm);
  if (nonfinite_) return;
  const float clip_scale = cfg_.grad_clip > 0 && rec.grad_norm > cfg_.grad_clip
                               ? static_cast<float>(cfg_.grad_clip / rec.grad_norm)
                               : 1.0f;
  // This rank's share of the dense arena, then every share to every rank.
  const size_t first = static_cast<size_t>(share_displs_[world_.rank()]);
  adamw_update_range(dense_, d_dense_, adam_dense_, layout_.dense, adam_, lr, clip_scale, step + 1,
                     first, first + static_cast<size_t>(share_counts_[world_.rank()]));
  if (world_.size() > 1) {
    world_.allgatherv_blocks(std::span<float>(dense_), std::span<const int>(share_counts_),
                             std::span<const int>(share_displs_));
  }
  adamw_update(experts_, std::span<const float>(d_experts_).first(experts_.size()), adam_experts_,
               layout_.experts, adam_, lr, clip_scale, step + 1);
  const int E = mc_.experts;
  const RoutingConfig& rc = routing_.config;
  if (rc.bias_update_rate > 0) {
    for (int l = 0; l < mc_.layers; ++l) {
      if (routing_.modes[l] != RoutingMode::kTopK) continue;
      bias_update(std::span<float>(&routing_.bias[static_cast<size_t>(l) * E], E),
                  std::span<const int64_t>(&rec.expert_load[static_cast<size_t>(l) * E], E),
                  rc.bias_update_rate, rc.bias_update_center);
    }
  }
  // The shadow balancers' biases, each by its rule from the loads its own routing gave.
  for (size_t r = 0; r < rc.shadows.size(); ++r) {
    for (int l = 0; l < mc_.layers; ++l) {
      if (routing_.modes[l] != RoutingMode::kTopK) continue;
      const size_t at = (r * mc_.layers + l) * E;
      shadow_bias_update(rc.shadows[r], std::span<float>(&routing_.shadow_bias[at], E),
                         std::span<const int64_t>(&rec.shadow_load[at], E));
    }
  }
  if (cfg_.check_bias) {
    check_bias_consistent(world_, routing_.bias, step);
    if (!rc.shadows.empty()) check_bias_consistent(world_, routing_.shadow_bias, step);
  }
}

std::string Trainer::locate_nonfinite() {
  auto finite = [](const float* p, size_t n) {
    return std::all_of(p, p + n, [](float x) { return std::isfinite(x); });
  };
  // The residual stream before each sub-block and after the last: [2L+1, N, D]; then the logits.
  const int L = mc_.layers;
  const size_t ND = acts_.resid.size() / (2 * static_cast<size_t>(L) + 1);
  int first = 2 * L + 1;  // = the logits
  for (int i = 0; i <= 2 * L; ++i) {
    if (!finite(&acts_.resid[i * ND], ND)) {
      first = i;
      break;
    }
  }
  if (first == 2 * L + 1 && finite(acts_.logits.data(), acts_.logits.size())) first = 2 * L + 2;
  std::vector<int> lowest = {-first};  // the lowest over ranks, as a max of negations
  world_.allreduce_max(std::span<int>(lowest));
  first = -lowest[0];
  std::string where;
  if (first == 0) {
    where = "the embedding";
  } else if (first <= 2 * L) {
    where = "the output of layer " + std::to_string((first - 1) / 2) +
            (first % 2 == 1 ? "'s attention" : "'s MoE block");
  } else if (first == 2 * L + 1) {
    where = "the logits";
  } else {
    where = "the loss or the gradients only";
  }
  std::string text = "first non-finite value in the forward: " + where;
  // Each rank holds the summed gradient of its share of the dense arena: all of it to every rank.
  if (world_.size() > 1) {
    world_.allgatherv_blocks(std::span<float>(d_dense_), std::span<const int>(share_counts_),
                             std::span<const int>(share_displs_));
  }
  for (const ParamEntry& e : layout_.dense.entries) {
    if (!finite(d_dense_.data() + e.offset, e.count)) {
      return text + "; first non-finite gradient: " + e.name;
    }
  }
  return text;
}

void Trainer::gather_optimizer_state() {
  if (world_.size() == 1) return;
  for (std::vector<float>* moment : {&adam_dense_.m, &adam_dense_.v}) {
    world_.allgatherv_blocks(std::span<float>(*moment), std::span<const int>(share_counts_),
                             std::span<const int>(share_displs_));
  }
}

TrainState Trainer::state() {
  TrainState s;
  s.model = &mc_;
  s.layout = &layout_;
  s.placement = placement_;
  s.ep = &groups_.ep;
  s.ep_group = groups_.ep_group;
  s.dense = dense_;
  s.dense_m = adam_dense_.m;
  s.dense_v = adam_dense_.v;
  s.experts = experts_;
  s.experts_m = adam_experts_.m;
  s.experts_v = adam_experts_.v;
  s.routing = &routing_;
  return s;
}

}  // namespace moe

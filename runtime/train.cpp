// The training loop. Set-up validates input and allocates everything (all ranks agree on any
// failure before the first collective); the step loop only computes and communicates.
#include "runtime/train.hpp"

#include <sched.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <memory>
#include <optional>
#include <thread>

#include "comm/ep_exchange.hpp"
#include "io/hash_table_file.hpp"
#include "io/synthetic_data.hpp"
#include "io/token_data.hpp"
#include "model/balance.hpp"
#include "model/blas.hpp"
#include "model/model.hpp"
#include "model/optimizer.hpp"
#include "model/router.hpp"
#include "runtime/report.hpp"
#include "runtime/run_stats.hpp"

namespace moe {
namespace {

constexpr float kMinLrRatio = 0.1f;  // cosine decays to 10% of --lr

// --threads, else the cores this process may run on (mpirun may bind it to fewer than the node
// has) shared among the ranks of its node, at least 1.
int resolve_threads(const RunConfig& cfg, const Comm& world) {
  if (cfg.threads > 0) return cfg.threads;
  const Comm node = world.split_shared();
  int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  cpu_set_t mask;
  if (sched_getaffinity(0, sizeof mask, &mask) == 0) cores = std::max(1, CPU_COUNT(&mask));
  return std::max(1, cores / node.size());
}

RoutingState make_routing(const RunConfig& cfg) {
  const ModelConfig& mc = cfg.model;
  const ForcedRouting forced = forced_routing_from_name(cfg.force_balance);
  const RoutingMode mode = !forced.forced ? RoutingMode::kTopK  // natural routing
                           : forced.round_robin ? RoutingMode::kRoundRobin
                                                : RoutingMode::kRandom;
  RoutingState r = routing_state_make(mc, mode, cfg.seed);
  r.random_skew = forced.skew;
  if (!cfg.hash_table_path.empty() && mc.hash_layers > 0) {
    r.hash_tables = hash_table_file_read(cfg.hash_table_path, mc.hash_layers, mc.vocab, mc.top_k);
    const size_t table = static_cast<size_t>(mc.vocab) * mc.top_k;
    for (int l = 0; l < mc.hash_layers; ++l) {
      try {
        hash_table_validate(&r.hash_tables[l * table], mc.vocab, mc.experts, mc.top_k);
      } catch (const std::exception& e) {
        throw DataError("hash table file '" + cfg.hash_table_path + "', layer " +
                        std::to_string(l) + ": " + e.what());
      }
    }
  }
  r.groups = cfg.routing_groups;
  r.group_topk = cfg.group_topk;
  r.balance_alpha = cfg.seq_aux_loss_weight;
  r.balance_form = balance_loss_form_from_name(cfg.balance_loss_form);
  return r;
}

// The per-layer balance metrics of a step from its global loads.
void fill_metrics(StepRecord& rec, const RoutingState& routing, int L, int E, int W) {
  rec.layer_variance.resize(L);
  rec.layer_violation.resize(L);
  rec.layer_cv.resize(L);
  rec.layer_overload.resize(L);
  rec.max_violation = 0.0;
  for (int l = 0; l < L; ++l) {
    const BalanceMetrics m = balance_metrics(
        std::span<const int64_t>(&rec.expert_load[static_cast<size_t>(l) * E], E));
    rec.layer_variance[l] = m.variance;
    rec.layer_violation[l] = m.max_violation;
    rec.layer_cv[l] = m.cv;
    rec.layer_overload[l] = overload_factor(
        std::span<const int64_t>(&rec.rank_load[static_cast<size_t>(l) * W], W));
    if (routing.modes[l] != RoutingMode::kHash) {
      rec.max_violation = std::max(rec.max_violation, m.max_violation);
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

// Gathers every rank's phase sums to rank 0 as per-step means and slowest-rank figures.
void summarize_phases(TrainSummary& summary, const Comm& world, const std::vector<double>& sums) {
  const size_t n = summary.steps.size() > 1 ? summary.steps.size() - 1 : summary.steps.size();
  if (n == 0) return;
  std::vector<double> all(world.rank() == 0 ? sums.size() * world.size() : 0);
  world.gather(std::span<const double>(sums), std::span<double>(all), 0);
  if (world.rank() != 0) return;
  PhaseSummary& ps = summary.phases;
  ps.mean_ms.assign(kNumPhases, 0.0);
  ps.max_ms.assign(kNumPhases, 0.0);
  for (int r = 0; r < world.size(); ++r) {
    for (int p = 0; p < kNumPhases; ++p) {
      const double ms = all[static_cast<size_t>(r) * kNumPhases + p] * 1e3 / n;
      ps.mean_ms[p] += ms / world.size();
      ps.max_ms[p] = std::max(ps.max_ms[p], ms);
    }
  }
  for (size_t i = summary.steps.size() - n; i < summary.steps.size(); ++i) {
    ps.step_ms += summary.steps[i].seconds * 1e3 / n;
  }
}

double median_tokens_per_s(const TrainSummary& s) {
  std::vector<double> tps;
  for (size_t i = s.steps.size() > 1 ? 1 : 0; i < s.steps.size(); ++i) {
    tps.push_back(s.steps[i].tokens_per_s);
  }
  if (tps.empty()) return 0.0;
  std::sort(tps.begin(), tps.end());
  return tps[tps.size() / 2];
}

// The MFU denominator: one core's sgemm rate on the model's LM-head shape, times the cores the
// job uses on its node(s). Rank 0 measures while the others wait in a barrier (Open MPI yields
// the core when oversubscribed).
void measure_sgemm_peak(TrainSummary& s, const RunConfig& cfg, const Comm& world, int threads) {
  const Comm node = world.split_shared();
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int nodes = std::max(1, world.size() / node.size());
  s.peak_cores = std::min(cores, node.size() * threads) * nodes;
  if (world.rank() == 0) {
    const ModelConfig& m = cfg.model;
    s.peak_gflops = blas_sgemm_gflops(m.seq_len, m.d_model, m.vocab, 0.3) * s.peak_cores;
  }
  world.barrier();
}

}  // namespace

void setup_agree(const Comm& world, const std::string& local_error) {
  // Lowest failing rank, or W when none failed: a MIN all-reduce of (failed ? rank : W), written
  // as the MAX of the negation with the typed helper.
  std::vector<int> flag = {local_error.empty() ? -world.size() : -world.rank()};
  world.allreduce_max(std::span<int>(flag));
  const int reporter = -flag[0];
  if (reporter == world.size()) return;
  if (local_error.empty()) {
    throw SetupError("rank " + std::to_string(reporter) + " failed during set-up", false);
  }
  throw SetupError(local_error, world.rank() == reporter);
}

namespace {

// Everything a run holds between steps, built once after set-up has been agreed; step() is one
// training step (collective over the world), the same flat sequence on every rank.
class Trainer {
 public:
  Trainer(const RunConfig& cfg, const Comm& world, std::unique_ptr<TokenSource> data,
          RoutingState routing, RunStats* stats)
      : cfg_(cfg), mc_(cfg.model), world_(world), data_(std::move(data)),
        routing_(std::move(routing)), stats_(stats),
        P_(cfg.ep > 0 ? cfg.ep : default_ep_size(world.size(), cfg.model.experts)),
        groups_(parallel_groups_make(world, P_)), placement_{mc_.experts, P_},
        layout_(model_layout(mc_, placement_, groups_.ep.rank())), ex_(groups_.ep),
        adam_{0.9f, 0.95f, 1e-8f, static_cast<float>(cfg.weight_decay)} {
    const int W = world.size(), L = mc_.layers, S = mc_.seq_len, B = mc_.batch_per_rank;
    const int N = B * S;
    // Parameters, gradients and optimizer state: two arenas each.
    dense_.resize(layout_.dense.num_elements);
    experts_.resize(layout_.experts.num_elements);
    param_init(std::span<float>(dense_), layout_.dense, cfg.seed);
    param_init(std::span<float>(experts_), layout_.experts, cfg.seed);
    d_dense_.resize(dense_.size());
    d_experts_.resize(experts_.size());
    adamw_state_init(adam_dense_, dense_.size());
    adamw_state_init(adam_experts_, experts_.size());
    // Activations and step buffers, sized once.
    model_acts_reserve(acts_, mc_, B, P_, placement_.max_local());
    acts_.times = &times_;  // always on: ~100 scopes of 38 ns per step (docs/performance.md)
    sample_.resize(S + 1);
    tokens_.resize(N);
    targets_.resize(N);
    sums_.resize(1 + L);
    recv_local_.resize(L);
    recv_all_.resize(static_cast<size_t>(W) * L);
    T_ = static_cast<int64_t>(W) * N;
    batch_.tokens = tokens_.data();
    batch_.targets = targets_.data();
    batch_.first_global_token = static_cast<int64_t>(world.rank()) * N;
    batch_.loss_scale = 1.0 / static_cast<double>(T_);
    batch_.num_global_sequences = static_cast<int64_t>(W) * B;
  }

  int ep_size() const { return P_; }
  size_t num_dense_params() const { return dense_.size(); }
  const PhaseTimes& times() const { return times_; }

  StepRecord step(int step) {
    const double t0 = MPI_Wtime();
    times_.reset();
    times_[Phase::kStats] = stats_seconds_;
    load_batch(step);
    StepRecord rec;
    rec.step = step;
    rec.bias = routing_.bias;  // the bias this step routes with, before its update
    std::fill(d_dense_.begin(), d_dense_.end(), 0.0f);
    std::fill(d_experts_.begin(), d_experts_.end(), 0.0f);
    sums_[0] = model_forward(acts_, dense_.data(), experts_.data(), layout_, routing_, batch_,
                             mc_, placement_, ex_);
    std::copy(acts_.layer_balance_loss.begin(), acts_.layer_balance_loss.end(), sums_.begin() + 1);
    model_backward(d_dense_.data(), d_experts_.data(), acts_, dense_.data(), experts_.data(),
                   layout_, batch_, mc_, ex_);
    reduce(rec);
    optimize(rec, step);
    {
      ScopedPhase timer(&times_, Phase::kStats);
      fill_metrics(rec, routing_, mc_.layers, mc_.experts, world_.size());
      if (stats_ && stats_->is_trace_step(step)) {
        stats_->record_trace(world_, step, acts_, tokens_, mc_.seq_len);
      }
    }
    slowest_[0] = MPI_Wtime() - t0;
    world_.allreduce_max(std::span<double>(slowest_));
    rec.seconds = slowest_[0];
    rec.tokens_per_s = static_cast<double>(T_) / rec.seconds;
    if (stats_) {
      const double s0 = MPI_Wtime();
      stats_->record_step(world_, rec, times_);
      stats_seconds_ = MPI_Wtime() - s0;
    }
    return rec;
  }

 private:
  // Global sample i of this step goes to rank ⌊i/B⌋: the global batch does not depend on W.
  void load_batch(int step) {
    ScopedPhase timer(&times_, Phase::kOther);
    const int W = world_.size(), B = mc_.batch_per_rank, S = mc_.seq_len;
    for (int b = 0; b < B; ++b) {
      const int64_t global =
          static_cast<int64_t>(step) * W * B + static_cast<int64_t>(world_.rank()) * B + b;
      data_->sample(global, S, sample_.data());
      std::copy_n(sample_.begin(), S, tokens_.begin() + b * S);
      std::copy_n(sample_.begin() + 1, S, targets_.begin() + b * S);
    }
    batch_.step = step;
  }

  // Gradients: replicated over all ranks, experts over their replicas; losses; one all-reduce of
  // the stacked [L, E] loads; one all-gather of the rows each rank received.
  void reduce(StepRecord& rec) {
    ScopedPhase timer(&times_, Phase::kAllReduce);
    const int W = world_.size(), L = mc_.layers, E = mc_.experts;
    world_.allreduce_sum(std::span<float>(d_dense_));
    if (groups_.num_replicas > 1) groups_.replica.allreduce_sum(std::span<float>(d_experts_));
    world_.allreduce_sum(std::span<double>(sums_));
    rec.loss = sums_[0] / static_cast<double>(T_);
    rec.layer_balance_loss.assign(sums_.begin() + 1, sums_.end());
    for (double b : rec.layer_balance_loss) rec.balance_loss += b;
    rec.expert_load.resize(static_cast<size_t>(L) * E);
    for (int l = 0; l < L; ++l) {
      std::copy(acts_.moe[l].plan.expert_counts.begin(), acts_.moe[l].plan.expert_counts.end(),
                rec.expert_load.begin() + static_cast<size_t>(l) * E);
      recv_local_[l] = acts_.moe[l].plan.num_recv;
    }
    world_.allreduce_sum(std::span<int64_t>(rec.expert_load));
    world_.allgather(std::span<const int64_t>(recv_local_), std::span<int64_t>(recv_all_));
    rec.rank_load.resize(static_cast<size_t>(L) * W);
    for (int r = 0; r < W; ++r) {
      for (int l = 0; l < L; ++l) {
        rec.rank_load[static_cast<size_t>(l) * W + r] = recv_all_[static_cast<size_t>(r) * L + l];
      }
    }
    // Global norm: dense gradients are identical everywhere (count once); each expert shard is
    // counted once by summing over one EP group, whose members own disjoint experts.
    expert_sq_[0] = sum_squares(d_experts_);
    groups_.ep.allreduce_sum(std::span<double>(expert_sq_));
  }

  // Clipping, AdamW on both arenas, then the loss-free bias update from the global loads.
  void optimize(StepRecord& rec, int step) {
    ScopedPhase timer(&times_, Phase::kOptimizer);
    rec.grad_norm = std::sqrt(sum_squares(d_dense_) + expert_sq_[0]);
    const float clip_scale = cfg_.grad_clip > 0 && rec.grad_norm > cfg_.grad_clip
                                 ? static_cast<float>(cfg_.grad_clip / rec.grad_norm)
                                 : 1.0f;
    const float lr = lr_at_step(step, cfg_.steps, cfg_.warmup_steps, static_cast<float>(cfg_.lr),
                                kMinLrRatio);
    rec.lr = lr;
    adamw_update(dense_, d_dense_, adam_dense_, layout_.dense, adam_, lr, clip_scale, step + 1);
    adamw_update(experts_, d_experts_, adam_experts_, layout_.experts, adam_, lr, clip_scale,
                 step + 1);
    const int E = mc_.experts;
    if (cfg_.bias_update_rate > 0) {
      for (int l = 0; l < mc_.layers; ++l) {
        if (routing_.modes[l] != RoutingMode::kTopK) continue;
        bias_update(std::span<float>(&routing_.bias[static_cast<size_t>(l) * E], E),
                    std::span<const int64_t>(&rec.expert_load[static_cast<size_t>(l) * E], E),
                    cfg_.bias_update_rate, cfg_.bias_update_center);
      }
    }
    if (cfg_.check_bias) check_bias_consistent(world_, routing_.bias, step);
  }

  const RunConfig& cfg_;
  const ModelConfig& mc_;
  const Comm& world_;
  std::unique_ptr<TokenSource> data_;
  RoutingState routing_;
  RunStats* stats_;  // null for --stats none
  int P_;
  ParallelGroups groups_;
  ExpertPlacement placement_;
  ModelLayout layout_;
  EpExchange ex_;  // holds a reference to groups_.ep: a Trainer never moves
  AdamWConfig adam_;
  std::vector<float> dense_, experts_, d_dense_, d_experts_;  // the two arenas and gradients
  AdamWState adam_dense_, adam_experts_;
  ModelActs<float> acts_;
  ModelBatch batch_;
  PhaseTimes times_;
  int64_t T_ = 0;                                  // tokens per step, all ranks
  std::vector<int32_t> sample_, tokens_, targets_;  // [S + 1], [N], [N]
  std::vector<double> sums_;                       // [CE sum, balance loss of each layer]
  std::vector<int64_t> recv_local_, recv_all_;     // [L], [W, L]
  std::vector<double> expert_sq_ = {0.0}, slowest_ = {0.0};
  double stats_seconds_ = 0.0;  // the previous step's HDF5 append, charged to this step's "stats"
};

}  // namespace

TrainSummary train_run(const RunConfig& cfg, const Comm& world, bool quiet, bool measure_peak) {
  const ModelConfig& mc = cfg.model;
  const int W = world.size(), rank = world.rank();
  const int P = cfg.ep > 0 ? cfg.ep : default_ep_size(W, mc.experts);

  // Everything that can fail on bad input, before the first collective; then all ranks agree.
  std::unique_ptr<TokenSource> data;
  RoutingState routing;
  std::unique_ptr<RunStats> stats;
  TrainSummary summary;
  std::string error;
  try {
    parallel_config_validate(mc, W, P);
    data = token_source_open(cfg.data, mc.vocab, mc.seq_len, cfg.seed);
    summary.data_description = data->describe();
    if (const auto* synth = dynamic_cast<const SyntheticSource*>(data.get())) {
      summary.entropy_floor = synth->entropy_floor_nats();
    }
    routing = make_routing(cfg);
    if (cfg.stats_path != kNoStats) {
      stats = std::make_unique<RunStats>(cfg, rank, W, P, routing, summary.data_description,
                                         summary.entropy_floor);
      summary.stats_path = stats->path();
    }
  } catch (const std::exception& e) {
    error = e.what();
  }
  try {
    setup_agree(world, error);
  } catch (const SetupError&) {
    // Another rank failed: no run happened, so leave no header-only statistics file behind.
    if (stats) {
      const std::string path = stats->path();
      stats.reset();
      std::error_code ignored;
      std::filesystem::remove(path, ignored);
    }
    throw;
  }
  const int threads = resolve_threads(cfg, world);
  blas_set_threads(threads);

  Trainer trainer(cfg, world, std::move(data), std::move(routing), stats.get());
  if (rank == 0 && !quiet) {
    report_config(cfg, RunShape{W, P, threads, trainer.num_dense_params(),
                                static_cast<size_t>(mc.layers) * mc.experts * 3 * mc.d_model *
                                    mc.ffn_dim,
                                summary.data_description, summary.stats_path});
  }
  summary.steps.reserve(cfg.steps);
  std::vector<double> phase_sum(kNumPhases, 0.0);  // over the steps after the first
  for (int step = 0; step < cfg.steps; ++step) {
    StepRecord rec = trainer.step(step);
    if (rank == 0 && !quiet) report_step(rec);
    if (step > 0 || cfg.steps == 1) {
      for (int p = 0; p < kNumPhases; ++p) phase_sum[p] += trainer.times().seconds[p];
    }
    summary.steps.push_back(std::move(rec));
  }
  summarize_phases(summary, world, phase_sum);
  summary.model_gflops = 3.0 * model_forward_flops_per_token(mc) * median_tokens_per_s(summary) *
                         1e-9;
  if (measure_peak) measure_sgemm_peak(summary, cfg, world, threads);
  return summary;
}

}  // namespace moe

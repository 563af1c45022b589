// The training loop. Setup allocates everything; the step loop only computes and communicates.
#include "runtime/train.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <numeric>
#include <thread>

#include "comm/ep_exchange.hpp"
#include "io/synthetic_data.hpp"
#include "io/token_data.hpp"
#include "model/blas.hpp"
#include "model/model.hpp"
#include "model/optimizer.hpp"

namespace moe {
namespace {

constexpr float kMinLrRatio = 0.1f;  // cosine decays to 10% of --lr

int resolve_threads(const RunConfig& cfg, const Comm& world) {
  if (cfg.threads > 0) return cfg.threads;
  const Comm node = world.split_shared();
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return std::max(1, cores / node.size());
}

// The loss-free bias update of SPEC §3: b[e] += γ·sign(mean(c) − c[e]), top-k layers only.
void bias_update(RoutingState& routing, std::span<const int64_t> load, const ModelConfig& c,
                 double rate) {
  for (int l = 0; l < c.layers; ++l) {
    if (routing.modes[l] != RoutingMode::kTopK) continue;
    const int64_t* cl = &load[static_cast<size_t>(l) * c.experts];
    double mean = 0.0;
    for (int e = 0; e < c.experts; ++e) mean += static_cast<double>(cl[e]);
    mean /= c.experts;
    float* b = &routing.bias[static_cast<size_t>(l) * c.experts];
    for (int e = 0; e < c.experts; ++e) {
      const double diff = mean - static_cast<double>(cl[e]);
      b[e] += static_cast<float>(rate * ((diff > 0) - (diff < 0)));
    }
  }
}

// Worst (max c − mean c)/mean c over the layers that balance (top-k, or forced).
double worst_violation(std::span<const int64_t> load, const RoutingState& routing,
                       const ModelConfig& c) {
  double worst = 0.0;
  for (int l = 0; l < c.layers; ++l) {
    if (routing.modes[l] == RoutingMode::kHash) continue;
    const int64_t* cl = &load[static_cast<size_t>(l) * c.experts];
    const double mean =
        static_cast<double>(std::accumulate(cl, cl + c.experts, int64_t{0})) / c.experts;
    const double mx = static_cast<double>(*std::max_element(cl, cl + c.experts));
    if (mean > 0) worst = std::max(worst, (mx - mean) / mean);
  }
  return worst;
}

void print_config_table(const RunConfig& cfg, int W, int P, int threads, size_t dense_params,
                        size_t expert_params_total, const TokenSource& data) {
  std::printf("moe_rt: %s on %d ranks (EP group %d, %d replicas), %d BLAS thread(s) per rank\n",
              cfg.model_name.c_str(), W, P, W / P, threads);
  std::printf("  %s\n", blas_info().c_str());
  std::printf("  parameters: %zu replicated + %zu in experts\n", dense_params,
              expert_params_total);
  std::printf("  data: %s\n", data.describe().c_str());
  std::printf("  ------------------------------------------------------------\n");
  const std::string text = run_config_to_text(cfg);
  size_t start = 0;
  while (start < text.size()) {
    const size_t end = text.find('\n', start);
    const std::string line = text.substr(start, end == std::string::npos ? end : end - start);
    const size_t eq = line.find(" = ");
    if (eq != std::string::npos) {
      std::printf("  %-22s %s\n", line.substr(0, eq).c_str(), line.substr(eq + 3).c_str());
    }
    if (end == std::string::npos) break;
    start = end + 1;
  }
  std::printf("  ------------------------------------------------------------\n");
  std::printf("%6s %9s %10s %9s %9s %8s %9s %8s\n", "step", "loss", "bal_loss", "grad_norm", "lr",
              "ms", "tok/s", "max_viol");
  std::fflush(stdout);
}

}  // namespace

void setup_agree(const Comm& world, const std::string& local_error) {
  // Lowest failing rank, or W when none failed: an all-reduce of (failed ? rank : W) with MIN,
  // written as MAX of the negation with the typed helper.
  std::vector<int> flag = {local_error.empty() ? -world.size() : -world.rank()};
  world.allreduce_max(std::span<int>(flag));
  const int reporter = -flag[0];
  if (reporter == world.size()) return;
  if (local_error.empty()) {
    throw SetupError("rank " + std::to_string(reporter) + " failed during set-up", false);
  }
  throw SetupError(local_error, world.rank() == reporter);
}

TrainSummary train_run(const RunConfig& cfg, const Comm& world, bool quiet) {
  const ModelConfig& mc = cfg.model;
  const int W = world.size(), rank = world.rank();
  const int P = cfg.ep > 0 ? cfg.ep : default_ep_size(W, mc.experts);

  // Everything that can fail on bad input, before the first collective; then all ranks agree.
  std::unique_ptr<TokenSource> data;
  std::string error;
  try {
    parallel_config_validate(mc, W, P);
    data = token_source_open(cfg.data, mc.vocab, mc.seq_len, cfg.seed);
  } catch (const std::exception& e) {
    error = e.what();
  }
  setup_agree(world, error);
  const int threads = resolve_threads(cfg, world);
  blas_set_threads(threads);

  TrainSummary summary;
  summary.data_description = data->describe();
  if (const auto* synth = dynamic_cast<const SyntheticSource*>(data.get())) {
    summary.entropy_floor = synth->entropy_floor_nats();
  }

  const ParallelGroups groups = parallel_groups_make(world, P);
  const ExpertPlacement placement{mc.experts, P};
  const ModelLayout layout = model_layout(mc, placement, groups.ep.rank());
  std::vector<float> dense(layout.dense.num_elements), experts(layout.experts.num_elements);
  param_init(std::span<float>(dense), layout.dense, cfg.seed);
  param_init(std::span<float>(experts), layout.experts, cfg.seed);
  std::vector<float> d_dense(dense.size()), d_experts(experts.size());
  AdamWState adam_dense, adam_experts;
  adamw_state_init(adam_dense, dense.size());
  adamw_state_init(adam_experts, experts.size());
  const AdamWConfig adam{0.9f, 0.95f, 1e-8f, static_cast<float>(cfg.weight_decay)};
  RoutingState routing = routing_state_make(mc, cfg.force_balance == "round-robin", cfg.seed);

  const int B = mc.batch_per_rank, S = mc.seq_len, N = B * S;
  const int64_t T = static_cast<int64_t>(W) * N;
  ModelActs<float> acts;
  model_acts_reserve(acts, mc, B, P, placement.max_local());
  EpExchange ex(groups.ep);
  std::vector<int32_t> sample(S + 1), tokens(N), targets(N);
  std::vector<int64_t> load(static_cast<size_t>(mc.layers) * mc.experts);
  summary.steps.reserve(cfg.steps);

  if (rank == 0 && !quiet) {
    const size_t expert_total = static_cast<size_t>(mc.layers) * mc.experts * 3 * mc.d_model *
                                mc.ffn_dim;  // W1, W3, W2 of every expert, once
    print_config_table(cfg, W, P, threads, dense.size(), expert_total, *data);
  }

  ModelBatch batch;
  batch.tokens = tokens.data();
  batch.targets = targets.data();
  batch.first_global_token = static_cast<int64_t>(rank) * N;
  batch.loss_scale = 1.0 / static_cast<double>(T);

  for (int step = 0; step < cfg.steps; ++step) {
    const double t0 = MPI_Wtime();
    // Global sample i of this step goes to rank ⌊i/B⌋.
    for (int b = 0; b < B; ++b) {
      const int64_t global = static_cast<int64_t>(step) * W * B + static_cast<int64_t>(rank) * B + b;
      data->sample(global, S, sample.data());
      std::copy_n(sample.begin(), S, tokens.begin() + b * S);
      std::copy_n(sample.begin() + 1, S, targets.begin() + b * S);
    }
    StepRecord rec;
    rec.step = step;
    rec.bias = routing.bias;

    std::fill(d_dense.begin(), d_dense.end(), 0.0f);
    std::fill(d_experts.begin(), d_experts.end(), 0.0f);
    const double local_loss = model_forward(acts, dense.data(), experts.data(), layout, routing,
                                            batch, mc, placement, ex);
    model_backward(d_dense.data(), d_experts.data(), acts, dense.data(), experts.data(), layout,
                   batch, mc, ex);

    // Gradients: replicated over all ranks, experts over their replicas.
    world.allreduce_sum(std::span<float>(d_dense));
    if (groups.num_replicas > 1) groups.replica.allreduce_sum(std::span<float>(d_experts));
    std::vector<double> sums = {local_loss};
    world.allreduce_sum(std::span<double>(sums));
    rec.loss = sums[0] / static_cast<double>(T);
    for (int l = 0; l < mc.layers; ++l) {
      std::copy(acts.moe[l].plan.expert_counts.begin(), acts.moe[l].plan.expert_counts.end(),
                load.begin() + static_cast<size_t>(l) * mc.experts);
    }
    world.allreduce_sum(std::span<int64_t>(load));  // one all-reduce of the stacked [L, E] counts

    // Global norm: dense gradients are identical everywhere (count once); each expert shard is
    // counted once by summing over one EP group, whose members own disjoint experts.
    std::vector<double> expert_sq = {sum_squares(d_experts)};
    groups.ep.allreduce_sum(std::span<double>(expert_sq));
    rec.grad_norm = std::sqrt(sum_squares(d_dense) + expert_sq[0]);
    const float clip_scale =
        cfg.grad_clip > 0 && rec.grad_norm > cfg.grad_clip
            ? static_cast<float>(cfg.grad_clip / rec.grad_norm) : 1.0f;
    const float lr = lr_at_step(step, cfg.steps, cfg.warmup_steps, static_cast<float>(cfg.lr),
                                kMinLrRatio);
    rec.lr = lr;
    adamw_update(dense, d_dense, adam_dense, layout.dense, adam, lr, clip_scale, step + 1);
    adamw_update(experts, d_experts, adam_experts, layout.experts, adam, lr, clip_scale, step + 1);
    if (cfg.bias_update_rate > 0) bias_update(routing, load, mc, cfg.bias_update_rate);

    rec.expert_load = load;
    rec.max_violation = worst_violation(load, routing, mc);
    rec.seconds = MPI_Wtime() - t0;
    std::vector<double> slowest = {rec.seconds};
    world.allreduce_max(std::span<double>(slowest));
    rec.seconds = slowest[0];
    rec.tokens_per_s = static_cast<double>(T) / rec.seconds;
    if (rank == 0 && !quiet) {
      std::printf("%6lld %9.4f %10.3e %9.4f %9.2e %8.1f %9.0f %8.3f\n",
                  static_cast<long long>(step), rec.loss, rec.balance_loss, rec.grad_norm, rec.lr,
                  rec.seconds * 1e3, rec.tokens_per_s, rec.max_violation);
      std::fflush(stdout);
    }
    summary.steps.push_back(std::move(rec));
  }
  return summary;
}

}  // namespace moe

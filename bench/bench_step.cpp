// bench_step: whole training steps of a preset (deepseek4-tiny by default): tokens/s, model FLOP/s
// and MFU, and where the time goes.
//
//  1. sgemm rates, measured on every rank at once with the BLAS threads training uses, summed over
//     ranks (the machine's aggregate): the peak = the best median over a few of the model's large
//     shapes (bench_gemm sweeps the whole grid), and the rate on this step's own GEMM shapes
//     (model_flops.hpp: the GEMM list of one step, replayed through cblas_sgemm).
//  2. train_run (runtime/train.hpp, quiet) for --steps steps; the first step is discarded; the
//     step time (slowest rank) median [min, max], tokens/s, model FLOP/s (model_flops.hpp) and
//     MFU = model FLOP/s ÷ each of the two sgemm rates.
//  3. A profiled copy of the same step (model_forward / model_backward with the model's phase
//     timers, then the all-reduces, AdamW and the balance statistics timed here), to show where
//     the time goes: per phase, the mean over ranks of the median over steps.
//  4. The balance bookkeeping of a step timed alone (target: < 1% of the step): the loss-free bias
//     update and the balance metrics of every layer (model/balance.hpp), and the two load
//     collectives (all-reduce of the [L, E] counts, all-gather of the rows each rank received).
//
// Run: mpiexec -np 1|2 build/bench/bench_step [--steps 8] [--model deepseek4-tiny]
//      [--threads N] [--seed 1234]
// Legend: W ranks, P EP group size, N tokens per rank, L layers, E experts, T = W·N tokens/step.
#include <mpi.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "bench/bench_common.hpp"
#include "bench/model_flops.hpp"
#include "comm/ep_exchange.hpp"
#include "io/token_data.hpp"
#include "model/balance.hpp"
#include "model/model.hpp"
#include "model/optimizer.hpp"
#include "runtime/options.hpp"
#include "runtime/train.hpp"

namespace moe::bench {
namespace {

// Mean over ranks of each phase's median over the profiled steps, and the median step time.
struct Profile {
  std::vector<double> phase_seconds;  // [kNumPhases]
  double step_seconds = 0;
};

// The training step of runtime/train.cpp with phase timers on; the same layout, data, routing,
// collectives and optimizer, without the statistics file and the step line.
Profile profile_steps(const RunConfig& cfg, const Comm& world, int steps) {
  const ModelConfig& mc = cfg.model;
  const int W = world.size(), L = mc.layers, E = mc.experts;
  const int P = cfg.ep > 0 ? cfg.ep : default_ep_size(W, E);
  const ParallelGroups groups = parallel_groups_make(world, P);
  const ExpertPlacement placement{E, P};
  const ModelLayout layout = model_layout(mc, placement, groups.ep.rank());
  std::vector<float> dense(layout.dense.num_elements), experts(layout.experts.num_elements);
  param_init(std::span<float>(dense), layout.dense, cfg.seed);
  param_init(std::span<float>(experts), layout.experts, cfg.seed);
  std::vector<float> d_dense(dense.size()), d_experts(experts.size());
  AdamWState adam_dense, adam_experts;
  adamw_state_init(adam_dense, dense.size());
  adamw_state_init(adam_experts, experts.size());
  const AdamWConfig adam{0.9f, 0.95f, 1e-8f, static_cast<float>(cfg.weight_decay)};
  RoutingState routing = routing_state_make(mc, RoutingMode::kTopK, cfg.seed);
  routing.balance_alpha = cfg.seq_aux_loss_weight;
  const auto data = token_source_open(cfg.data, mc.vocab, mc.seq_len, cfg.seed);

  const int B = mc.batch_per_rank, S = mc.seq_len, N = B * S;
  ModelActs<float> acts;
  model_acts_reserve(acts, mc, B, P, placement.max_local());
  PhaseTimes times;
  acts.times = &times;
  EpExchange ex(groups.ep);
  std::vector<int32_t> sample(S + 1), tokens(N), targets(N);
  std::vector<double> sums(1 + L), norm(1);
  std::vector<int64_t> load(static_cast<size_t>(L) * E), recv_local(L), recv_all(size_t{1} * W * L);
  ModelBatch batch;
  batch.tokens = tokens.data();
  batch.targets = targets.data();
  batch.first_global_token = static_cast<int64_t>(world.rank()) * N;
  batch.loss_scale = 1.0 / (static_cast<double>(W) * N);
  batch.num_global_sequences = static_cast<int64_t>(W) * B;

  std::vector<std::vector<double>> per_phase(kNumPhases);
  std::vector<double> walls;
  for (int step = 0; step < steps; ++step) {
    times.reset();
    world.barrier();
    const double t0 = MPI_Wtime();
    {
      ScopedPhase timer(&times, Phase::kOther);
      for (int b = 0; b < B; ++b) {
        data->sample(
            static_cast<int64_t>(step) * W * B + static_cast<int64_t>(world.rank()) * B + b, S,
            sample.data());
        std::copy_n(sample.begin(), S, tokens.begin() + b * S);
        std::copy_n(sample.begin() + 1, S, targets.begin() + b * S);
      }
      std::fill(d_dense.begin(), d_dense.end(), 0.0f);
      std::fill(d_experts.begin(), d_experts.end(), 0.0f);
      batch.step = step;
    }
    sums[0] = model_forward(acts, dense.data(), experts.data(), layout, routing, batch, mc,
                            placement, ex);
    model_backward(d_dense.data(), d_experts.data(), acts, dense.data(), experts.data(), layout,
                   batch, mc, ex);
    double grad_norm = 0;
    {
      // Gradients over the world and the replicas, the loss sums, the loads: as train.cpp.
      ScopedPhase timer(&times, Phase::kAllReduce);
      world.allreduce_sum(std::span<float>(d_dense));
      if (groups.num_replicas > 1) groups.replica.allreduce_sum(std::span<float>(d_experts));
      std::copy(acts.layer_balance_loss.begin(), acts.layer_balance_loss.end(), sums.begin() + 1);
      world.allreduce_sum(std::span<double>(sums));
      for (int l = 0; l < L; ++l) {
        std::copy(acts.moe[l].plan.expert_counts.begin(), acts.moe[l].plan.expert_counts.end(),
                  load.begin() + static_cast<size_t>(l) * E);
        recv_local[l] = acts.moe[l].plan.num_recv;
      }
      world.allreduce_sum(std::span<int64_t>(load));
      world.allgather(std::span<const int64_t>(recv_local), std::span<int64_t>(recv_all));
    }
    {
      // Clipping's global norm (two serial sums of squares and one small all-reduce), then AdamW.
      ScopedPhase timer(&times, Phase::kOptimizer);
      norm[0] = sum_squares(d_experts);
      groups.ep.allreduce_sum(std::span<double>(norm));
      grad_norm = std::sqrt(sum_squares(d_dense) + norm[0]);
      const float clip = cfg.grad_clip > 0 && grad_norm > cfg.grad_clip
                             ? static_cast<float>(cfg.grad_clip / grad_norm)
                             : 1.0f;
      const float lr = lr_at_step(step, steps, cfg.warmup_steps, static_cast<float>(cfg.lr), 0.1f);
      adamw_update(dense, d_dense, adam_dense, layout.dense, adam, lr, clip, step + 1);
      adamw_update(experts, d_experts, adam_experts, layout.experts, adam, lr, clip, step + 1);
    }
    {
      ScopedPhase timer(&times, Phase::kStats);
      for (int l = 0; l < L; ++l) {
        const std::span<const int64_t> c(&load[static_cast<size_t>(l) * E], E);
        if (routing.modes[l] == RoutingMode::kTopK && cfg.bias_update_rate > 0) {
          bias_update(std::span<float>(&routing.bias[static_cast<size_t>(l) * E], E), c,
                      cfg.bias_update_rate, cfg.bias_update_center);
        }
        benchmark_keep(balance_metrics(c).variance);
      }
    }
    const double wall = max_over_ranks(world, MPI_Wtime() - t0);
    if (step == 0) continue;  // warm-up
    walls.push_back(wall);
    for (int p = 0; p < kNumPhases; ++p) per_phase[p].push_back(times.seconds[p]);
  }
  Profile prof;
  prof.step_seconds = spread_of(walls).median;
  for (int p = 0; p < kNumPhases; ++p) {
    prof.phase_seconds.push_back(sum_over_ranks(world, spread_of(per_phase[p]).median) / W);
  }
  return prof;
}

// The balance bookkeeping of one step alone: local (bias update + metrics of every layer) and the
// two load collectives; medians over `reps` repetitions, slowest rank.
std::pair<double, double> balance_seconds(const Comm& world, const ModelConfig& mc, int reps) {
  const int L = mc.layers, E = mc.experts, W = world.size();
  std::vector<int64_t> load0(static_cast<size_t>(L) * E), load(load0.size()), recv_local(L),
      recv_all(size_t{1} * W * L);
  for (size_t i = 0; i < load0.size(); ++i) load0[i] = 80 + static_cast<int64_t>((i * 37) % 29);
  for (int l = 0; l < L; ++l) recv_local[l] = 700 + l;
  std::vector<float> bias(load0.size(), 0.0f);
  std::vector<double> local_t, comm_t;
  for (int r = 0; r < reps; ++r) {
    load = load0;
    world.barrier();
    double t0 = MPI_Wtime();
    world.allreduce_sum(std::span<int64_t>(load));
    world.allgather(std::span<const int64_t>(recv_local), std::span<int64_t>(recv_all));
    comm_t.push_back(max_over_ranks(world, MPI_Wtime() - t0));
    t0 = MPI_Wtime();
    for (int l = 0; l < L; ++l) {
      const std::span<const int64_t> c(&load[static_cast<size_t>(l) * E], E);
      bias_update(std::span<float>(&bias[static_cast<size_t>(l) * E], E), c, 0.001, false);
      const BalanceMetrics m = balance_metrics(c);
      benchmark_keep(m.variance + m.max_violation + m.cv);
      benchmark_keep(
          overload_factor(std::span<const int64_t>(&recv_all[static_cast<size_t>(l)], 1)));
    }
    local_t.push_back(max_over_ranks(world, MPI_Wtime() - t0));
  }
  return {spread_of(local_t).median, spread_of(comm_t).median};
}

int run(int argc, char** argv) {
  const Comm world = Comm::world();
  const int W = world.size();
  RunConfig cfg;
  cfg.model_name = arg_text(argc, argv, "--model", "deepseek4-tiny");
  cfg.model = options_preset(cfg.model_name);
  cfg.steps = static_cast<int>(std::max(2LL, arg_int(argc, argv, "--steps", 8)));
  cfg.seed = static_cast<uint64_t>(arg_int(argc, argv, "--seed", 1234));
  cfg.threads = static_cast<int>(arg_int(argc, argv, "--threads", 0));
  run_config_validate(cfg);
  const ModelConfig& mc = cfg.model;
  const int threads = set_blas_threads(world, cfg.threads);
  const int P = default_ep_size(W, mc.experts);
  print_banner(world, "bench_step", cfg.model_name + " training steps: tokens/s, MFU, phases",
               threads);

  // 1. sgemm rates, every rank at once, summed.
  const ModelFlops mf = model_flops(mc);
  const std::vector<GemmCall> gemms = step_gemms(mc, W, P);
  world.barrier();
  double peak = 0;
  for (const auto& [M, K, N] : {std::array{2048, 256, 2048}, std::array{1024, 256, 2048},
                                std::array{256, 256, 2048}, std::array{2048, 2048, 2048}}) {
    peak = std::max(peak, sgemm_rate(M, K, N, 5));
  }
  peak = sum_over_ranks(world, peak);
  world.barrier();
  const double replay_s = max_over_ranks(world, gemm_replay_seconds(gemms, 7));
  const double same_shapes = sum_over_ranks(world, gemm_flops(gemms) / replay_s);

  // 2. The training loop itself.
  const TrainSummary summary = train_run(cfg, world, /*quiet=*/true);
  std::vector<double> secs, tps;
  for (size_t i = 1; i < summary.steps.size(); ++i) {
    secs.push_back(summary.steps[i].seconds);
    tps.push_back(summary.steps[i].tokens_per_s);
  }
  const Spread step = spread_of(secs);
  const double tokens_per_s = spread_of(tps).median;
  const double model_flops_per_s = tokens_per_s * mf.per_token;

  // 3. and 4.
  const Profile prof = profile_steps(cfg, world, cfg.steps);
  const auto [balance_local, balance_comm] = balance_seconds(world, mc, 200);

  if (world.rank() != 0) return 0;
  const int64_t T = static_cast<int64_t>(W) * mc.batch_per_rank * mc.seq_len;
  std::printf(
      "# model FLOPs per token: 6 x %.0f GEMM parameters + attention core %.0f "
      "(12*H*hd*L*mean keys %.2f) = %.3f MFLOP\n",
      mf.gemm_params, mf.attention_core, mf.mean_keys, mf.per_token / 1e6);
  std::printf(
      "# sgemm peak (best median of 4 model shapes, all ranks at once, summed): %.1f "
      "GFLOP/s\n",
      peak / 1e9);
  std::printf(
      "# sgemm on this step's GEMM shapes (%.1f MFLOP per rank, balanced expert rows): "
      "%.1f GFLOP/s summed; %.2f ms per step\n",
      gemm_flops(gemms) / 1e6, same_shapes / 1e9, replay_s * 1e3);
  std::printf("#\n# %5s %4s %7s %9s %9s %9s %10s %10s %8s %8s\n", "ranks", "EP", "tokens",
              "step(ms)", "min(ms)", "max(ms)", "tokens/s", "GFLOP/s", "MFU", "MFU_same");
  std::printf("  %5d %4d %7lld %9.2f %9.2f %9.2f %10.0f %10.2f %7.1f%% %7.1f%%\n", W, P,
              static_cast<long long>(T), step.median * 1e3, step.min * 1e3, step.max * 1e3,
              tokens_per_s, model_flops_per_s / 1e9, 100 * model_flops_per_s / peak,
              100 * model_flops_per_s / same_shapes);
  std::printf(
      "#   (train_run, %d steps, the first discarded; MFU = model FLOP/s / sgemm peak; "
      "MFU_same = / sgemm rate on the step's own shapes)\n#\n",
      cfg.steps);
  std::printf(
      "# where the time goes (profiled copy of the step: mean over ranks of the median "
      "over steps; step median %.2f ms)\n",
      prof.step_seconds * 1e3);
  std::printf("# %-14s %9s %7s\n", "phase", "ms", "share");
  double accounted = 0;
  for (int p = 0; p < kNumPhases; ++p) {
    accounted += prof.phase_seconds[p];
    std::printf("  %-14s %9.3f %6.1f%%\n", kPhaseNames[p], prof.phase_seconds[p] * 1e3,
                100 * prof.phase_seconds[p] / prof.step_seconds);
  }
  std::printf("  %-14s %9.3f %6.1f%%\n", "(untimed)", (prof.step_seconds - accounted) * 1e3,
              100 * (prof.step_seconds - accounted) / prof.step_seconds);
  std::printf("# the step's GEMMs alone at the same-shapes rate: %.2f ms = %.1f%% of the step\n#\n",
              replay_s * 1e3, 100 * replay_s / prof.step_seconds);
  std::printf(
      "# balance bookkeeping per step (median of 200): bias update + metrics of %d layers "
      "%.2f us, load all-reduce + all-gather %.2f us = %.3f%% of the train_run step\n",
      mc.layers, balance_local * 1e6, balance_comm * 1e6,
      100 * (balance_local + balance_comm) / step.median);
  return 0;
}

}  // namespace
}  // namespace moe::bench

int main(int argc, char** argv) {
  moe::MpiSession mpi(&argc, &argv);
  try {
    return moe::bench::run(argc, argv);
  } catch (const std::exception& e) {
    moe::mpi_abort_job(e.what(), 3);
  }
}

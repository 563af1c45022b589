// bench_step: whole training steps of a preset (deepseek4-tiny by default): tokens/s, model FLOP/s
// and MFU, and where the time goes.
//
//  1. sgemm rates, measured on every rank at once, plain cblas_sgemm on as many OpenBLAS threads
//     as training has threads per rank (training itself calls OpenBLAS single-threaded from its
//     own threads), summed over ranks (the machine's aggregate): the peak = the best median over a
//     few of the model's large shapes (bench_gemm sweeps the whole grid), and the rate on this
//     step's own GEMM shapes (model_flops.hpp: the GEMM list of one step, replayed through
//     cblas_sgemm).
//  2. train_run (runtime/run/train.hpp, quiet) for --steps steps; the first step is discarded; the
//     step time (slowest rank) median [min, max], tokens/s, model FLOP/s (3 × the forward FLOPs
//     per token of model_forward_flops_per_token, model/model.hpp) and MFU = model FLOP/s ÷ each
//     of the two sgemm rates.
//  3. Where the time goes, from the same run's phase summary (TrainSummary::phases: the model's
//     phase timers, and the all-reduces, optimizer and statistics timed in
//     runtime/run/trainer.cpp): per phase, the mean over steps and ranks and the slowest rank's
//     mean, as a share of the mean step.
//  4. The balance bookkeeping of a step timed alone (target: < 1% of the step): the loss-free bias
//     update and the balance metrics of every layer (model/balance.hpp), and the two load
//     collectives (all-reduce of the [L, E] counts, all-gather of the rows each rank received).
//  5. With --gemm-sites: every GEMM call of the run on rank 0 timed (gemm_observe, model/blas.hpp)
//     and added up by where it was made (file:line) and its shape, largest first: ms per step
//     (all steps, the first included), calls, GFLOP/s and share of the mean step. The linear
//     layer's functions (model/linear.hpp) pass their callers' lines on; a site inside another
//     helper (the per-sequence weight gradients') stands for all its callers. Times are
//     per calling thread: with several threads, calls inside the model's tasks overlap, and the
//     shares can add up past 100%. The run's other figures are then measured with the timing on
//     (a clock read, a lock and a map update per call).
//
// Run: mpiexec -np 1|2 build/bench/bench_step [--steps 8] [--model deepseek4-tiny]
//      [--threads N] [--seed 1234] [--batch-per-rank 1] [--gemm-sites]
// Legend: W ranks, P EP group size, N tokens per rank, L layers, E experts, T = W·N tokens/step.
#include <mpi.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "bench/bench_common.hpp"
#include "bench/model_flops.hpp"
#include "model/balance.hpp"
#include "model/blas.hpp"
#include "model/model.hpp"
#include "model/phase_timer.hpp"
#include "runtime/options/options.hpp"
#include "runtime/options/presets.hpp"
#include "runtime/run/train.hpp"

namespace moe::bench {
namespace {

// 5.: the GEMM calls by site and shape (an expert's rows vary: M is summed; a leaf tree's rows
// too: K is summed), from gemm_observe on every thread of this rank.
struct GemmSite {
  int64_t calls = 0;
  double seconds = 0, flops = 0, M = 0, K = 0;
};
std::mutex g_sites_mutex;
std::map<std::string, GemmSite> g_sites;

void record_gemm(const GemmTiming& t) {
  std::string file = t.where.file_name();
  file = file.substr(file.find_last_of('/') + 1);
  const std::string key = file + ":" + std::to_string(t.where.line()) + " " +
                          (t.trans_a ? "t" : "n") + (t.trans_b ? "t" : "n") +
                          (t.leaf_tree ? " leaf tree" : "") + " N=" + std::to_string(t.N) +
                          (t.leaf_tree ? "" : " K=" + std::to_string(t.K));
  const std::lock_guard lock(g_sites_mutex);
  GemmSite& site = g_sites[key];
  ++site.calls;
  site.seconds += t.seconds;
  site.flops += 2.0 * t.M * t.N * t.K;
  site.M += t.M;
  site.K += t.K;
}

void print_gemm_sites(int steps, double step_ms) {
  std::vector<std::pair<std::string, GemmSite>> sites(g_sites.begin(), g_sites.end());
  std::sort(sites.begin(), sites.end(),
            [](const auto& a, const auto& b) { return a.second.seconds > b.second.seconds; });
  double seconds = 0, flops = 0;
  for (const auto& [key, site] : sites) {
    seconds += site.seconds;
    flops += site.flops;
  }
  std::printf(
      "#\n# GEMM calls by site and shape, rank 0 (gemm_observe; %d steps, the first included; "
      "time per calling thread, the figures above measured with the timing on): %.2f ms per "
      "step, %.1f%% of the mean step, %.1f GFLOP/s\n",
      steps, seconds * 1e3 / steps, 100 * seconds * 1e3 / steps / step_ms, flops / seconds / 1e9);
  std::printf("# %-44s %8s %8s %9s %9s %8s %7s\n", "site, op, shape", "mean M", "mean K",
              "calls/st", "ms/step", "GFLOP/s", "share");
  for (const auto& [key, site] : sites) {
    const double ms = site.seconds * 1e3 / steps;
    if (ms < 0.005 * step_ms) break;  // the rest under 0.5% of a step each
    std::printf("  %-44s %8.0f %8.0f %9.1f %9.2f %8.1f %6.1f%%\n", key.c_str(), site.M / site.calls,
                site.K / site.calls, static_cast<double>(site.calls) / steps, ms,
                site.flops / site.seconds / 1e9, 100 * ms / step_ms);
  }
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
  preset_apply(cfg.model_name, cfg.model, cfg.routing);
  cfg.steps = static_cast<int>(std::max(2LL, arg_int(argc, argv, "--steps", 8)));
  cfg.seed = static_cast<uint64_t>(arg_int(argc, argv, "--seed", 1234));
  cfg.threads = static_cast<int>(arg_int(argc, argv, "--threads", 0));
  // Sequences per rank: the preset's one, or the global batch of the targets' runs (8 at 1 rank).
  cfg.model.batch_per_rank =
      static_cast<int>(arg_int(argc, argv, "--batch-per-rank", cfg.model.batch_per_rank));
  run_config_validate(cfg);
  const ModelConfig& mc = cfg.model;
  const int threads = set_blas_threads(world, cfg.threads);
  const int P = run_ep_size(cfg, W);
  print_banner(world, "bench_step", cfg.model_name + " training steps: tokens/s, MFU, phases",
               threads);

  // 1. sgemm rates, every rank at once, summed.
  const double flops_per_token = 3 * model_forward_flops_per_token(mc);  // forward + backward
  const std::vector<GemmCall> gemms = step_gemms(mc, W, P);
  double peak = 0, replay_s = 0;
  {
    const LibraryThreads reference(threads);  // plain cblas_sgemm on OpenBLAS's own threads
    world.barrier();
    for (const auto& [M, K, N] : {std::array{2048, 256, 2048}, std::array{1024, 256, 2048},
                                  std::array{256, 256, 2048}, std::array{2048, 2048, 2048}}) {
      peak = std::max(peak, sgemm_rate(M, K, N, 5));
    }
    world.barrier();
    replay_s = gemm_replay_seconds(gemms, 7);
  }
  peak = sum_over_ranks(world, peak);
  replay_s = max_over_ranks(world, replay_s);
  const double same_shapes = sum_over_ranks(world, gemm_flops(gemms) / replay_s);

  // 2. The training loop itself (5.: its GEMMs timed, when asked for).
  const bool gemm_sites = arg_flag(argc, argv, "--gemm-sites");
  if (gemm_sites) gemm_observe(record_gemm);
  const TrainSummary summary = train_run(cfg, world, /*quiet=*/true);
  gemm_observe(nullptr);
  std::vector<double> secs, tps;
  for (size_t i = 1; i < summary.steps.size(); ++i) {
    secs.push_back(summary.steps[i].step_time_s);
    tps.push_back(summary.steps[i].tokens_per_s);
  }
  const Spread step = spread_of(secs);
  const double tokens_per_s = spread_of(tps).median;
  const double model_flops_per_s = tokens_per_s * flops_per_token;

  // 3. is summary.phases (rank 0 only); 4.:
  const auto [balance_local, balance_comm] = balance_seconds(world, mc, 200);

  if (world.rank() != 0) return 0;
  const int64_t T = static_cast<int64_t>(W) * mc.batch_per_rank * mc.seq_len;
  std::printf(
      "# model FLOPs per token: 3 x %.3f forward (model_forward_flops_per_token) = %.3f MFLOP\n",
      flops_per_token / 3e6, flops_per_token / 1e6);
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
  const PhaseSummary& ph = summary.phases;
  std::printf(
      "# where the time goes (train_run's phase timers, the steps after the first: mean over "
      "steps and ranks, and the slowest rank's mean; mean step %.2f ms)\n",
      ph.step_ms);
  std::printf("# %-14s %9s %9s %7s\n", "phase", "ms", "max(ms)", "share");
  double accounted = 0;
  for (int p = 0; p < kNumPhases; ++p) {
    accounted += ph.mean_ms[p];
    std::printf("  %-14s %9.3f %9.3f %6.1f%%\n", kPhaseNames[p], ph.mean_ms[p], ph.max_ms[p],
                100 * ph.mean_ms[p] / ph.step_ms);
  }
  std::printf("  %-14s %9.3f %9s %6.1f%%\n", "(untimed)", ph.step_ms - accounted, "",
              100 * (ph.step_ms - accounted) / ph.step_ms);
  std::printf("# the step's GEMMs alone at the same-shapes rate: %.2f ms = %.1f%% of the step\n#\n",
              replay_s * 1e3, 100 * replay_s * 1e3 / ph.step_ms);
  std::printf(
      "# balance bookkeeping per step (median of 200): bias update + metrics of %d layers "
      "%.2f us, load all-reduce + all-gather %.2f us = %.3f%% of the train_run step\n",
      mc.layers, balance_local * 1e6, balance_comm * 1e6,
      100 * (balance_local + balance_comm) / step.median);
  if (gemm_sites) print_gemm_sites(cfg.steps, ph.step_ms);
  return 0;
}

}  // namespace
}  // namespace moe::bench

int main(int argc, char** argv) {
  return moe::bench::bench_mpi_main(argc, argv, moe::bench::run);
}

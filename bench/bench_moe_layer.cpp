// bench_moe_layer: one MoE layer, forward + backward, over W ranks (one EP group of P = W ranks
// by default), with the shared expert overlapped with the dispatch's transfer (MoeDims::
// overlap_shared = true: it runs between EpExchange's dispatch_begin, which posts the rows'
// messages, and dispatch_end, which waits for them; forward and backward) or not (the transfer
// completes first). The two modes alternate repetition by repetition, so a
// change in the machine's load hits both; each repetition's time is the slowest rank's.
//
// Prints, per mode, the median [min, max] of the layer's time and the phase times (mean over
// ranks of the median over repetitions; model/phase_timer.hpp), then saving = 1 − on/off.
// The most overlap can save is the smaller of the shared expert's time and the transfer's.
//
// Run: mpiexec -np 8 [--oversubscribe] build/bench/bench_moe_layer [--tokens 256] [--reps 40]
//      [--warmup 5] [--routing topk|round-robin] [--threads N]
// Legend: N tokens per rank (deepseek4-tiny: B·S = 256), D, F, Fs, E, K as in model/moe_layer.hpp.
#include <mpi.h>

#include <cstdio>
#include <string>
#include <vector>

#include "bench/bench_common.hpp"
#include "comm/ep_exchange.hpp"
#include "model/moe_layer.hpp"
#include "model/rng.hpp"
#include "runtime/options/options.hpp"
#include "runtime/options/presets.hpp"

namespace moe::bench {
namespace {

std::vector<float> normal_values(size_t n, uint64_t seed, const char* name, double scale) {
  std::vector<float> v(n);
  const uint64_t stream = rng_stream(seed, name);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<float>(scale * rng_normal(stream, i));
  return v;
}

struct ModeResult {
  std::vector<double> seconds;                          // per repetition, slowest rank
  std::vector<std::vector<double>> phases{kNumPhases};  // per repetition, this rank
};

int run(int argc, char** argv) {
  const Comm world = Comm::world();
  const int W = world.size(), rank = world.rank();
  const int N = static_cast<int>(arg_int(argc, argv, "--tokens", 256));
  const int reps = static_cast<int>(std::max(1LL, arg_int(argc, argv, "--reps", 40)));
  const int warmup = static_cast<int>(arg_int(argc, argv, "--warmup", 5));
  const std::string routing_name = arg_text(argc, argv, "--routing", "topk");
  const int threads =
      set_blas_threads(world, static_cast<int>(arg_int(argc, argv, "--threads", 0)));
  const ModelConfig cfg = preset_model("deepseek4-tiny");
  MoeDims dims = moe_dims_from(cfg);
  const int P = default_ep_size(W, dims.E);
  print_banner(world, "bench_moe_layer",
               "deepseek4-tiny MoE layer fwd+bwd, shared expert overlapped with dispatch or not",
               threads);

  const ParallelGroups groups = parallel_groups_make(world, P);
  const ExpertPlacement placement{dims.E, P};
  const int ep_rank = groups.ep.rank();
  ParamLayout dense, experts;
  const MoeOffsets off = moe_layout(dense, experts, dims, 3, cfg.layers, placement, ep_rank);
  std::vector<float> pd(dense.num_elements), pe(experts.num_elements);
  param_init(std::span<float>(pd), dense, 1234);
  param_init(std::span<float>(pe), experts, 1234);
  std::vector<float> gd(pd.size(), 0.0f), ge(pe.size(), 0.0f), bias(dims.E, 0.0f);
  const size_t ND = static_cast<size_t>(N) * dims.D;
  // Each rank its own tokens: element i of rank r's input is element r·N·D + i of one tensor.
  std::vector<float> in = normal_values(ND * W, 7, "bench_moe_layer.in", 1.0);
  in.erase(in.begin(), in.begin() + ND * rank);
  in.resize(ND);
  const std::vector<float> d_out = normal_values(ND, 8 + rank, "bench_moe_layer.d_out", 1e-3);
  std::vector<float> out(ND), d_in(ND);
  MoeSaved<float> saved;
  moe_saved_reserve(saved, N, dims, P, placement.max_local(), N / cfg.seq_len);
  PhaseTimes times;
  MoeRouting routing;
  routing.mode = routing_name == "round-robin" ? RoutingMode::kRoundRobin : RoutingMode::kTopK;
  routing.bias = bias.data();
  routing.first_global_token = static_cast<int64_t>(rank) * N;
  routing.seq_len = cfg.seq_len;
  EpExchange ex(groups.ep);
  const MoeWeights<float> w = moe_weights_at(pd.data(), pe.data(), off, dims);
  const MoeWeights<float> g = moe_weights_at(gd.data(), ge.data(), off, dims);

  auto layer = [&](bool overlap) {
    dims.overlap_shared = overlap;
    moe_forward(out.data(), saved, in.data(), w, routing, dims, placement, ex, N);
    std::fill(d_in.begin(), d_in.end(), 0.0f);
    moe_backward(d_in.data(), g, d_out.data(), saved, in.data(), w, dims, ex);
  };
  for (int i = 0; i < warmup; ++i) {
    layer(true);
    layer(false);
  }
  ModeResult res[2];  // [0] overlap off, [1] overlap on
  saved.times = &times;
  for (int i = 0; i < reps; ++i) {
    for (int k = 0; k < 2; ++k) {
      const bool overlap = (i + k) % 2 == 0;  // alternate which mode goes first
      times.reset();
      world.barrier();
      const double t0 = MPI_Wtime();
      layer(overlap);
      res[overlap].seconds.push_back(max_over_ranks(world, MPI_Wtime() - t0));
      for (int p = 0; p < kNumPhases; ++p) res[overlap].phases[p].push_back(times.seconds[p]);
    }
  }

  // Phase medians, mean over ranks (collective: every rank computes them).
  double phase_ms[2][kNumPhases];
  for (int m = 0; m < 2; ++m) {
    for (int p = 0; p < kNumPhases; ++p) {
      phase_ms[m][p] = sum_over_ranks(world, spread_of(res[m].phases[p]).median) / W * 1e3;
    }
  }
  int64_t recv[1] = {saved.plan.num_recv}, recv_max[1] = {saved.plan.num_recv};
  world.allreduce_sum(std::span<int64_t>(recv));
  world.allreduce_max(std::span<int64_t>(recv_max));
  if (rank != 0) return 0;
  std::printf(
      "# N=%d tokens per rank, D=%d F=%d Fs=%d E=%d K=%d, EP group %d, routing %s "
      "(rows received: max/mean %.2f); warm-up %d, %d repetitions per mode\n#\n",
      N, dims.D, dims.F, dims.Fs, dims.E, dims.K, P, routing_name.c_str(),
      static_cast<double>(recv_max[0]) * W / std::max<int64_t>(1, recv[0]), warmup, reps);
  std::printf("# %-12s %10s %10s %10s\n", "overlap", "time(ms)", "min(ms)", "max(ms)");
  Spread s[2];
  for (int m = 1; m >= 0; --m) {
    s[m] = spread_of(res[m].seconds);
    std::printf("  %-12s %10.3f %10.3f %10.3f\n", m ? "on" : "off", s[m].median * 1e3,
                s[m].min * 1e3, s[m].max * 1e3);
  }
  std::printf("# saving = 1 - on/off = %.1f%% (medians)\n#\n",
              100 * (1 - s[1].median / s[0].median));
  std::printf("# phases (ms, mean over ranks of the median over repetitions)\n");
  std::printf("# %-14s %9s %9s\n", "phase", "on", "off");
  for (int p = 0; p < kNumPhases; ++p) {
    if (phase_ms[0][p] == 0 && phase_ms[1][p] == 0) continue;
    std::printf("  %-14s %9.3f %9.3f\n", kPhaseNames[p], phase_ms[1][p], phase_ms[0][p]);
  }
  return 0;
}

}  // namespace
}  // namespace moe::bench

int main(int argc, char** argv) {
  return moe::bench::bench_mpi_main(argc, argv, moe::bench::run);
}

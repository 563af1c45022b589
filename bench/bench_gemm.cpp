// bench_gemm: the compute of the MoE layer against plain cblas_sgemm on the same shapes, in
// GFLOP/s, and this machine's sgemm rate over the model's shapes (Google Benchmark).
//
//   sgemm/M/K/N           cblas_sgemm row-major, C[M,N] = A[M,K]·B[K,N]: the grid M = 256..2048,
//                         K, N in {128, 256, 2048}; the median of the fastest one is printed at the
//                         end as "sgemm peak over the model's shapes".
//   gemm_checked/...      moe::gemm (model/blas.hpp: argument checks, then cblas_sgemm, split
//                         over the model's threads in fixed blocks when large).
//   linear_fwd/...        model/linear.hpp linear_forward, against sgemm_nn/... on the same shape.
//   linear_bwd/...        linear_backward (d_in += d_out·Wᵀ, d_W += inᵀ·d_out), against
//                         sgemm_bwd_pair/..., the same two cblas_sgemm calls.
//   swiglu_fwd/bwd/n      model/swiglu.hpp on n elements (clamp 10), elements per second.
//   moe_layer/tokens/rr   model/moe_layer.hpp forward + backward on Comm::self() with the
//                         deepseek4-tiny dimensions (D=128, F=128, E=8, K=3, one shared expert),
//                         top-k (rr:0) or forced round-robin (rr:1) routing; FLOP/s counts the
//                         layer's GEMM FLOPs (below), and the phase counters give the share of
//                         time in each phase (model/phase_timer.hpp).
//   moe_layer_gemms/...   exactly the GEMMs of that layer (same per-expert row counts) through
//                         cblas_sgemm, nothing else: the rate the layer would reach if routing,
//                         permutations, SwiGLU and the weighted sum were free.
//
// MoE layer FLOPs per token (forward; backward is twice that):
//   2·D·E (router) + K·3·2·D·F (routed experts) + 3·2·D·Fs (shared expert).
// Every benchmark reports the median, mean, stddev and cv of 5 repetitions, in real time (other
// threads run beside the timed thread). The plain cblas_sgemm references run on N OpenBLAS
// threads, the model's code on N OpenMP threads with OpenBLAS single-threaded inside, as in
// training.
//
// Run: build/bench/bench_gemm [--blas-threads N] [Google Benchmark flags, e.g.
//      --benchmark_filter=moe_layer]. Default: N = cores, about 40 s.
// Legend: M, N, K GEMM dimensions in sgemm/...; rows, in, out of a linear layer; D model width,
// F expert width, Fs shared width, E experts, K experts per token (model legend elsewhere).
#include <benchmark/benchmark.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench_common.hpp"
#include "comm/communicator.hpp"
#include "comm/ep_exchange.hpp"
#include "model/blas.hpp"
#include "model/linear.hpp"
#include "model/moe_layer.hpp"
#include "model/rng.hpp"
#include "model/swiglu.hpp"
#include "runtime/options/options.hpp"
#include "runtime/options/presets.hpp"

namespace moe::bench {
namespace {

constexpr int kRepetitions = 5;
constexpr double kMinTime = 0.05;  // seconds per repetition

std::vector<float> random_matrix(size_t n, uint64_t seed) {
  std::vector<float> v(n);
  const uint64_t stream = rng_stream(seed, "bench_gemm");
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<float>(rng_normal(stream, i));
  return v;
}

void set_flops(benchmark::State& state, double flops_per_iteration) {
  state.counters["FLOP/s"] =
      benchmark::Counter(flops_per_iteration, benchmark::Counter::kIsIterationInvariantRate);
}

// Threads: the plain cblas_sgemm references run on OpenBLAS's own threads; the model's code
// (moe::gemm, linear, SwiGLU, the MoE layer) on its OpenMP threads with OpenBLAS single-threaded
// inside, as in training. Each benchmark sets the one it measures; both counts are --blas-threads.
int g_threads = 1;
void use_cblas_threads() {
  moe::bench::blas_set_library_threads(g_threads);
}
void use_model_threads() {
  moe::blas_set_threads(g_threads);
  moe::bench::blas_set_library_threads(1);
}

// ---- GEMMs: one body, one row of data per case ------------------------------------------------

// Which threads a case runs on (use_cblas_threads / use_model_threads).
enum class Threads { kCblas, kModel };

// Forward: out = in·w. Backward: d_in += d_out·wᵀ and d_w += inᵀ·d_out, twice the FLOPs.
enum class Pass { kForward, kBackward };

// C[M,N] = A[M,K]·B[K,N] in a linear layer's names: A = in, B = w, C = out (M rows, K in, N out).
// Only the pass's buffers are allocated; the outputs start at zero.
struct GemmOperands {
  int M = 0, K = 0, N = 0;
  std::vector<float> in, w;             // in[M,K], w[K,N]
  std::vector<float> out;               // [M,N], forward
  std::vector<float> d_out, d_in, d_w;  // d_out[M,N], d_in[M,K], d_w[K,N], backward
};

GemmOperands gemm_operands(int M, int K, int N, Pass pass) {
  GemmOperands o;
  o.M = M, o.K = K, o.N = N;
  o.in = random_matrix(size_t{1} * M * K, 1);
  o.w = random_matrix(size_t{1} * K * N, 2);
  if (pass == Pass::kForward) {
    o.out.resize(size_t{1} * M * N);
  } else {
    o.d_out = random_matrix(size_t{1} * M * N, 3);
    o.d_in.resize(size_t{1} * M * K);
    o.d_w.resize(size_t{1} * K * N);
  }
  return o;
}

void run_sgemm(GemmOperands& o) {
  reference_sgemm(false, false, o.M, o.N, o.K, o.in.data(), o.w.data(), 0.0f, o.out.data());
}
void run_gemm_checked(GemmOperands& o) {
  gemm<float>(false, false, o.M, o.N, o.K, 1.0f, o.in.data(), o.w.data(), 0.0f, o.out.data());
}
void run_linear_forward(GemmOperands& o) {
  linear_forward(o.out.data(), o.in.data(), o.w.data(), o.M, o.K, o.N);
}
void run_linear_backward(GemmOperands& o) {
  linear_backward(o.d_in.data(), o.d_w.data(), o.d_out.data(), o.in.data(), o.w.data(), o.M, o.K,
                  o.N);
}
// linear_backward's two products as plain cblas_sgemm calls.
void run_sgemm_bwd_pair(GemmOperands& o) {
  reference_sgemm(false, true, o.M, o.K, o.N, o.d_out.data(), o.w.data(), 1.0f, o.d_in.data());
  reference_sgemm(true, false, o.K, o.N, o.M, o.in.data(), o.d_out.data(), 1.0f, o.d_w.data());
}

using Registered = benchmark::internal::Benchmark;

// The sgemm grid: M = 256..2048, K, N in {128, 256, 2048}.
void sgemm_grid(Registered* b) {
  b->ArgNames({"M", "K", "N"})
      ->ArgsProduct({{256, 512, 1024, 2048}, {128, 256, 2048}, {128, 256, 2048}});
}
void gemm_checked_shapes(Registered* b) {
  b->ArgNames({"M", "K", "N"})
      ->Args({256, 128, 128})
      ->Args({256, 128, 2048})
      ->Args({2048, 2048, 2048});
}
// Expert shapes (rows of one expert at 1 and 8 ranks' worth of tokens), attention/shared (256
// rows), and the LM head (128 -> 2048).
void linear_shapes(Registered* b) {
  b->ArgNames({"rows", "in", "out"})
      ->Args({96, 128, 128})
      ->Args({256, 128, 128})
      ->Args({768, 128, 128})
      ->Args({2048, 128, 128})
      ->Args({256, 128, 2048});
}

struct GemmCase {
  const char* name;
  Threads threads;
  Pass pass;
  void (*run)(GemmOperands&);
  void (*shapes)(Registered*);  // its arguments: (M, K, N) or (rows, in, out), the same order
};

// In the benchmark list's order: each linear-layer routine is followed by its cblas_sgemm calls.
const GemmCase kGemmCases[] = {
    {"sgemm", Threads::kCblas, Pass::kForward, run_sgemm, sgemm_grid},
    {"gemm_checked", Threads::kModel, Pass::kForward, run_gemm_checked, gemm_checked_shapes},
    {"linear_fwd", Threads::kModel, Pass::kForward, run_linear_forward, linear_shapes},
    {"sgemm_nn", Threads::kCblas, Pass::kForward, run_sgemm, linear_shapes},
    {"linear_bwd", Threads::kModel, Pass::kBackward, run_linear_backward, linear_shapes},
    {"sgemm_bwd_pair", Threads::kCblas, Pass::kBackward, run_sgemm_bwd_pair, linear_shapes},
};

void BM_gemm(benchmark::State& state, const GemmCase& c) {
  c.threads == Threads::kCblas ? use_cblas_threads() : use_model_threads();
  const int M = static_cast<int>(state.range(0)), K = static_cast<int>(state.range(1)),
            N = static_cast<int>(state.range(2));
  GemmOperands o = gemm_operands(M, K, N, c.pass);
  const float* const result = c.pass == Pass::kForward ? o.out.data() : o.d_w.data();
  for (auto _ : state) {
    c.run(o);
    benchmark::DoNotOptimize(result);
  }
  set_flops(state, (c.pass == Pass::kForward ? 2.0 : 4.0) * M * N * K);
}

// ---- SwiGLU, the elementwise work between the expert GEMMs
// ---------------------------------------

void BM_swiglu_fwd(benchmark::State& state) {
  use_model_threads();
  const int64_t n = state.range(0);
  const auto g = random_matrix(n, 1), v = random_matrix(n, 2);
  std::vector<float> h(n);
  for (auto _ : state) {
    swiglu_forward(h.data(), g.data(), v.data(), n, 10.0f);
    benchmark::DoNotOptimize(h.data());
  }
  state.counters["elem/s"] =
      benchmark::Counter(static_cast<double>(n), benchmark::Counter::kIsIterationInvariantRate);
}

void BM_swiglu_bwd(benchmark::State& state) {
  use_model_threads();
  const int64_t n = state.range(0);
  const auto g = random_matrix(n, 1), v = random_matrix(n, 2);
  auto d_h = random_matrix(n, 3);  // receives h each call, then serves as the next call's d_h
  std::vector<float> d_g(n), d_v(n);
  for (auto _ : state) {
    swiglu_backward(d_g.data(), d_v.data(), d_h.data(), g.data(), v.data(), n, 10.0f);
    benchmark::DoNotOptimize(d_v.data());
  }
  state.counters["elem/s"] =
      benchmark::Counter(static_cast<double>(n), benchmark::Counter::kIsIterationInvariantRate);
}

// ---- the MoE layer ----------------------------------------------------------------------------

// One deepseek4-tiny MoE layer on one rank (all E experts local), inputs and output gradients
// drawn once; forward + backward per iteration, as in a training step.
struct MoeBench {
  MoeDims dims;
  ExpertPlacement placement;
  ParamLayout dense, experts;
  MoeOffsets off;
  std::vector<float> params_dense, params_experts, grads_dense, grads_experts, bias, in, d_out, out,
      d_in;
  MoeSaved<float> saved;
  PhaseTimes times;
  MoeRouting routing;
  int N = 0;

  MoeBench(int tokens, bool round_robin) : N(tokens) {
    const ModelConfig cfg = preset_model("deepseek4-tiny");
    dims = moe_dims_from(cfg);
    placement = ExpertPlacement{dims.E, 1};
    off = moe_layout(dense, experts, dims, /*layer=*/3, cfg.layers, placement, 0);
    params_dense.resize(dense.num_elements);
    params_experts.resize(experts.num_elements);
    param_init(std::span<float>(params_dense), dense, 1234);
    param_init(std::span<float>(params_experts), experts, 1234);
    grads_dense.assign(dense.num_elements, 0.0f);
    grads_experts.assign(experts.num_elements, 0.0f);
    bias.assign(dims.E, 0.0f);
    in = random_matrix(size_t{1} * N * dims.D, 4);  // RMS-normalised inputs are ~unit scale
    d_out = random_matrix(size_t{1} * N * dims.D, 5);
    for (float& g : d_out) g *= 1e-3f;
    out.resize(in.size());
    d_in.resize(in.size());
    moe_saved_reserve(saved, N, dims, 1, placement.max_local(), N / cfg.seq_len);
    routing.mode = round_robin ? RoutingMode::kRoundRobin : RoutingMode::kTopK;
    routing.bias = bias.data();
    routing.seq_len = cfg.seq_len;
    // The sequence-wise balance loss as training runs it (α = 1e-4 over the step's sequences).
    routing.balance_weight = round_robin ? 0.0 : 1e-4 / std::max(1, N / cfg.seq_len);
  }

  void step(EpExchange& ex) {
    const MoeWeights<float> w =
        moe_weights_at(params_dense.data(), params_experts.data(), off, dims);
    const MoeWeights<float> g = moe_weights_at(grads_dense.data(), grads_experts.data(), off, dims);
    moe_forward(out.data(), saved, in.data(), w, routing, dims, placement, ex, N);
    std::fill(d_in.begin(), d_in.end(), 0.0f);
    moe_backward(d_in.data(), g, d_out.data(), saved, in.data(), w, dims, ex);
  }

  // Forward GEMM FLOPs of the layer (router + routed + shared); forward + backward is 3×.
  double forward_flops() const {
    const double D = dims.D, F = dims.F, Fs = dims.Fs, E = dims.E, K = dims.K;
    return N * (2 * D * E + K * 6 * D * F + 6 * D * Fs);
  }
};

const Comm& self_comm() {
  static const Comm self = Comm::self();
  return self;
}

void BM_moe_layer(benchmark::State& state) {
  use_model_threads();
  MoeBench b(static_cast<int>(state.range(0)), state.range(1) != 0);
  EpExchange ex(self_comm());
  b.step(ex);  // warm-up: sizes every buffer
  b.saved.times = &b.times;
  b.times.reset();
  for (auto _ : state) b.step(ex);
  set_flops(state, 3 * b.forward_flops());
  double total = 0;
  for (double s : b.times.seconds) total += s;
  // Share of the layer's time in each phase (forward and backward together).
  const std::pair<const char*, std::vector<Phase>> groups[] = {
      {"router", {Phase::kRouter, Phase::kRouterBackward}},
      {"experts", {Phase::kExperts, Phase::kExpertsBackward}},
      {"dispatch_combine",
       {Phase::kDispatch, Phase::kCombine, Phase::kDispatchBackward, Phase::kCombineBackward}},
  };
  for (const auto& [name, phases] : groups) {
    double s = 0;
    for (Phase p : phases) s += b.times[p];
    state.counters[name] = total > 0 ? s / total : 0.0;
  }
}

// The same GEMMs as BM_moe_layer (per-expert row counts of its routing), cblas_sgemm only.
void BM_moe_layer_gemms(benchmark::State& state) {
  use_cblas_threads();
  MoeBench b(static_cast<int>(state.range(0)), state.range(1) != 0);
  EpExchange ex(self_comm());
  b.step(ex);
  const int N = b.N, D = b.dims.D, F = b.dims.F, Fs = b.dims.Fs, E = b.dims.E;
  std::vector<int> rows(E);
  for (int e = 0; e < E; ++e)
    rows[e] = b.saved.plan.expert_offsets[e + 1] - b.saved.plan.expert_offsets[e];
  const int R = b.saved.plan.num_recv;
  const int width = std::max({D, F, Fs, E});
  const auto X = random_matrix(size_t{1} * std::max(N, R) * width, 6);
  const auto Wt = random_matrix(size_t{1} * width * width, 7);
  std::vector<float> Y(X.size()), G(size_t{1} * width * width);
  // out[m,n] = A[m,k]·B[k,n] and its two backward GEMMs, as linear_forward / linear_backward.
  auto fwd = [&](int m, int k, int n) {
    reference_sgemm(false, false, m, n, k, X.data(), Wt.data(), 0.0f, Y.data());
  };
  auto bwd = [&](int m, int k, int n) {
    reference_sgemm(false, true, m, k, n, X.data(), Wt.data(), 1.0f, Y.data());
    reference_sgemm(true, false, k, n, m, X.data(), X.data(), 1.0f, G.data());
  };
  for (auto _ : state) {
    fwd(N, D, E);  // router (a fixed-order loop in the layer, a GEMM here)
    for (int e = 0; e < E; ++e) {
      if (rows[e] == 0) continue;
      fwd(rows[e], D, F);
      fwd(rows[e], D, F);
      fwd(rows[e], F, D);
    }
    fwd(N, D, Fs);
    fwd(N, D, Fs);
    fwd(N, Fs, D);
    bwd(N, Fs, D);
    bwd(N, D, Fs);
    bwd(N, D, Fs);
    for (int e = 0; e < E; ++e) {
      if (rows[e] == 0) continue;
      bwd(rows[e], F, D);
      bwd(rows[e], D, F);
      bwd(rows[e], D, F);
    }
    bwd(N, D, E);
    benchmark::DoNotOptimize(Y.data());
  }
  set_flops(state, 3 * b.forward_flops());
}

void register_all() {
  auto common = [](Registered* b) {
    b->UseRealTime()->MinTime(kMinTime)->Repetitions(kRepetitions)->ReportAggregatesOnly(true);
  };
  for (const GemmCase& c : kGemmCases) {
    auto* b = benchmark::RegisterBenchmark(c.name, BM_gemm, c);
    c.shapes(b);
    common(b);
  }
  using Fn = void (*)(benchmark::State&);
  // n = R·F: the routed rows of 256 and 2048 tokens (K = 3, F = 128).
  for (const auto& [name, fn] : {std::pair<const char*, Fn>{"swiglu_fwd", BM_swiglu_fwd},
                                 std::pair<const char*, Fn>{"swiglu_bwd", BM_swiglu_bwd}}) {
    auto* b = benchmark::RegisterBenchmark(name, fn);
    b->ArgNames({"n"})->Arg(768 * 128)->Arg(6144 * 128);
    common(b);
  }
  const std::pair<const char*, Fn> layer[] = {{"moe_layer", BM_moe_layer},
                                              {"moe_layer_gemms", BM_moe_layer_gemms}};
  for (const auto& [name, fn] : layer) {
    auto* b = benchmark::RegisterBenchmark(name, fn);
    b->ArgNames({"tokens", "rr"})->ArgsProduct({{256, 2048}, {0, 1}});
    common(b);
  }
}

// The console output, plus the fastest sgemm/ median at the end: this machine's sgemm rate over
// the model's shapes, the denominator of bench_step's MFU.
class PeakReporter : public benchmark::ConsoleReporter {
 public:
  // Colours only on a terminal, so that a redirected run leaves a plain table.
  PeakReporter() : ConsoleReporter(isatty(fileno(stdout)) ? OO_ColorTabular : OO_Tabular) {}

  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const Run& r : runs) {
      if (r.run_type != Run::RT_Aggregate || r.aggregate_name != "median") continue;
      const std::string name = r.benchmark_name();
      if (name.rfind("sgemm/", 0) != 0) continue;
      const auto it = r.counters.find("FLOP/s");
      if (it != r.counters.end() && it->second.value > peak_) {
        peak_ = it->second.value;
        peak_name_ = name;
      }
    }
  }
  void print_peak() const {
    if (peak_ > 0) {
      std::printf("\nsgemm peak over the model's shapes: %.1f GFLOP/s (%s, median of %d)\n",
                  peak_ / 1e9, peak_name_.c_str(), kRepetitions);
    }
  }

 private:
  double peak_ = 0;
  std::string peak_name_;
};

}  // namespace
}  // namespace moe::bench

int main(int argc, char** argv) {
  moe::MpiSession mpi(&argc, &argv);
  // --blas-threads N is ours; everything else goes to Google Benchmark.
  int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    if (std::strcmp(argv[i], "--blas-threads") == 0 && i + 1 < argc) {
      threads = std::atoi(argv[++i]);
      continue;
    }
    args.push_back(argv[i]);
  }
  int n = static_cast<int>(args.size());
  const moe::Comm world = moe::Comm::world();
  moe::bench::g_threads = threads;
  moe::blas_set_threads(threads);
  moe::bench::print_banner(world, "bench_gemm",
                           "expert GEMMs, linear, MoE layer fwd+bwd vs cblas_sgemm (GFLOP/s)",
                           threads);
  std::fflush(stdout);
  benchmark::Initialize(&n, args.data());
  moe::bench::register_all();
  moe::bench::PeakReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  reporter.print_peak();
  benchmark::Shutdown();
  return 0;
}

// bench_row_kernels: the step's row kernels outside the GEMMs, on one thread, at a preset's
// shapes (deepseek4-tiny by default): RMSNorm forward and backward over one layer's rows, the
// attention core's masked softmax rows and their backward over one sequence's heads, the LM
// head's cross-entropy rows, and the router's top-k selection (the preset's own, group-limited
// where it has groups, and plain top-k over all E, as the sequence-wise balance loss runs it). For
// each kernel: nanoseconds per row (median and min over --repeats, each repeat timed for
// --seconds) and a digest of its outputs' bits, so that two builds, or two levels, can be compared
// for speed and for the same bits in one table each. The times include restoring the inputs that
// a kernel overwrites or adds into (the softmax rows, RMSNorm's d_in), so that every call does
// the same work and the digests do not depend on the number of calls.
//
// Rows: RMSNorm N = batch · S rows of width D; the softmax rows are the query tiles' rows of
// model/attention_core.cpp ([S, H, Kt]: Tq query rows a tile, each seeing the keys of its window
// among the tile's Kt columns); cross-entropy batch · S rows of V logits; top-k batch · S rows of E
// scores with a bias.
//
// Run: build/bench/bench_row_kernels [--model deepseek4-tiny] [--batch 8] [--seconds 0.2]
//      [--repeats 7] [--simd sse2|avx2|avx512]   (--simd: the elementwise kernels' level,
//      model/simd.hpp; the best this CPU has by default)
#include <omp.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "bench/bench_common.hpp"
#include "model/attention.hpp"
#include "model/embedding.hpp"
#include "model/rmsnorm.hpp"
#include "model/rng.hpp"
#include "model/router.hpp"
#include "model/simd.hpp"
#include "model/softmax_rows.hpp"
#include "runtime/options/presets.hpp"

namespace moe::bench {
namespace {

// Fixed pseudo-random values in [lo, hi) (model/rng.hpp's counter-based draws): the same inputs
// in every build.
std::vector<float> values(size_t n, uint64_t seed, float lo, float hi) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = lo + (hi - lo) * static_cast<float>(rng_uniform(seed, i));
  return v;
}

// FNV-1a over the values' bits.
template <class T> uint64_t digest(const std::vector<T>& v, uint64_t h = 1469598103934665603ULL) {
  for (const T x : v) {
    const auto bits = std::bit_cast<std::conditional_t<sizeof(T) == 8, uint64_t, uint32_t>>(x);
    for (size_t b = 0; b < sizeof(T); ++b) h = (h ^ ((bits >> (8 * b)) & 0xFF)) * 1099511628211ULL;
  }
  return h;
}

// Calls of `body` (each `rows` rows) timed for `seconds`, `repeats` times: ns per row.
Spread ns_per_row(double seconds, int repeats, int64_t rows, const std::function<void()>& body) {
  std::vector<double> ns;
  for (int r = 0; r < repeats; ++r) {
    int64_t calls = 0;
    const auto t0 = std::chrono::steady_clock::now();
    double elapsed = 0;
    do {
      body();
      ++calls;
      elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    } while (elapsed < seconds);
    ns.push_back(elapsed * 1e9 / static_cast<double>(calls * rows));
  }
  return spread_of(ns);
}

void report(const char* kernel, const std::string& shape, const Spread& s, uint64_t bits) {
  std::printf("%-22s %-26s %10.1f %10.1f   %016llx\n", kernel, shape.c_str(), s.median, s.min,
              static_cast<unsigned long long>(bits));
}

int run(int argc, char** argv) {
  if (arg_flag(argc, argv, "--help")) {
    std::printf(
        "usage: bench_row_kernels [--model NAME] [--batch B] [--seconds S] [--repeats R]\n"
        "                         [--simd sse2|avx2|avx512]\n");
    return 0;
  }
  if (const std::string level = arg_text(argc, argv, "--simd", ""); !level.empty()) {
    const std::optional<SimdLevel> parsed = simd_level_parse(level);
    if (!parsed) throw std::invalid_argument("--simd: unknown level '" + level + "'");
    simd_level_force(*parsed);  // throws where this CPU lacks the level
  }
  ModelConfig mc;
  RoutingConfig routing;
  preset_apply(arg_text(argc, argv, "--model", "deepseek4-tiny"), mc, routing);
  const int batch = static_cast<int>(arg_int(argc, argv, "--batch", 8));
  const double seconds = std::atof(arg_text(argc, argv, "--seconds", "0.2").c_str());
  const int repeats = static_cast<int>(arg_int(argc, argv, "--repeats", 7));
  omp_set_num_threads(1);
  const Comm world = Comm::world();
  print_banner(world, "bench_row_kernels",
               "the step's row kernels on one thread (ns per row, digest of the outputs)", 1);
  std::printf("# elementwise kernels at %s\n", simd_level_name(simd_level()));
  std::printf("%-22s %-26s %10s %10s   %s\n", "# kernel", "shape", "median", "min", "digest");

  const int S = mc.seq_len, D = mc.d_model, N = batch * S, V = mc.vocab;
  // RMSNorm over one layer's rows: out and rstd from in; d_in and the per-sequence leaves back.
  {
    const std::vector<float> in = values(size_t(N) * D, 1, -2.0f, 2.0f);
    const std::vector<float> w = values(size_t(D), 2, 0.5f, 1.5f);
    const std::vector<float> d_out = values(size_t(N) * D, 3, -1.0f, 1.0f);
    std::vector<float> out(in.size()), rstd(static_cast<size_t>(N)), d_in(in.size()),
        leaves(size_t(batch) * D);
    const std::string shape = "N=" + std::to_string(N) + " D=" + std::to_string(D);
    const Spread f = ns_per_row(seconds, repeats, N, [&] {
      rmsnorm_forward(out.data(), rstd.data(), in.data(), w.data(), N, D, 1e-6f);
    });
    report("rmsnorm forward", shape, f, digest(rstd, digest(out)));
    const Spread b = ns_per_row(seconds, repeats, N, [&] {
      std::fill(d_in.begin(), d_in.end(), 0.0f);
      rmsnorm_backward_sequences(d_in.data(), leaves.data(), d_out.data(), in.data(), w.data(),
                                 rstd.data(), batch, S, D);
    });
    report("rmsnorm backward", shape, b, digest(leaves, digest(d_in)));
  }
  // The masked softmax rows of one sequence, [S, H, Kt], tile by tile as attention's core runs
  // them: a query's rows of every head in one call where the heads share one kv head (the core
  // then scores them in one GEMM), else a row per call.
  {
    const AttnDims ad = attn_dims_from(mc);
    const int Wk = attn_keys_per_row(ad), Kt = attn_keys_per_tile(ad);
    const int Tq = std::min(S, attn_query_tile_rows()), H = ad.H;
    const int per_call = ad.KVH == 1 ? H : 1;
    struct Rows {
      int64_t at;
      int first, last, n;
    };
    std::vector<Rows> calls;  // the rows of per_call heads of query s, Kt apart
    for (int s0 = 0; s0 < S; s0 += Tq) {
      const int s1 = std::min(S, s0 + Tq), lo = std::max(0, s0 - Wk + 1);
      for (int s = s0; s < s1; ++s) {
        for (int h = 0; h < H; h += per_call) {
          calls.push_back(
              {(int64_t{s} * H + h) * Kt, std::max(0, s - Wk + 1) - lo, s - lo, s1 - lo});
        }
      }
    }
    const std::vector<float> scores = values(size_t(S) * H * Kt, 4, -6.0f, 6.0f);
    const std::vector<float> d_p0 = values(size_t(S) * H * Kt, 5, -1.0f, 1.0f);
    std::vector<float> p(scores.size()), d_p(d_p0.size());
    const std::string shape = "S=" + std::to_string(S) + " H=" + std::to_string(H) +
                              " Kt=" + std::to_string(Kt) + " W=" + std::to_string(Wk);
    const int64_t rows_n = int64_t{S} * H;
    const Spread f = ns_per_row(seconds, repeats, rows_n, [&] {
      std::copy(scores.begin(), scores.end(), p.begin());
      for (const Rows& r : calls) {
        softmax_rows_masked(p.data() + r.at, Kt, per_call, r.first, r.last, r.n);
      }
    });
    report("softmax masked", shape, f, digest(p));
    const Spread b = ns_per_row(seconds, repeats, rows_n, [&] {
      std::copy(d_p0.begin(), d_p0.end(), d_p.begin());
      for (const Rows& r : calls) {
        softmax_rows_backward(d_p.data() + r.at, p.data() + r.at, Kt, per_call, r.n);
      }
    });
    report("softmax backward", shape, b, digest(d_p));
  }
  // The LM head's cross-entropy rows, fused with their backward.
  {
    const std::vector<float> logits = values(size_t(N) * V, 6, -8.0f, 8.0f);
    std::vector<int32_t> targets(static_cast<size_t>(N));
    for (int t = 0; t < N; ++t) targets[size_t(t)] = static_cast<int32_t>((t * 7919) % V);
    std::vector<float> d_logits(logits.size());
    std::vector<double> row_loss(static_cast<size_t>(N));
    double loss = 0;
    const Spread s = ns_per_row(seconds, repeats, N, [&] {
      loss = cross_entropy_forward_backward(d_logits.data(), row_loss.data(), logits.data(),
                                            targets.data(), N, V, 1.0 / N);
    });
    report("cross-entropy", "N=" + std::to_string(N) + " V=" + std::to_string(V), s,
           digest(std::vector<double>{loss}, digest(d_logits)));
  }
  // The router's top-k over batch · S rows of E scores and a bias: the preset's selection
  // (group-limited where it has groups) and plain top-k over all E.
  {
    const int E = mc.experts, K = mc.top_k;
    const std::vector<float> scores = values(static_cast<size_t>(N) * E, 7, 0.0f, 2.0f);
    const std::vector<float> bias = values(static_cast<size_t>(E), 8, -0.05f, 0.05f);
    std::vector<int32_t> idx(static_cast<size_t>(N) * K);
    const std::string shape =
        "N=" + std::to_string(N) + " E=" + std::to_string(E) + " K=" + std::to_string(K);
    const int G = routing.routing_groups, M = routing.group_topk;
    if (G > 1) {
      const Spread g = ns_per_row(seconds, repeats, N, [&] {
        route_topk_grouped(idx.data(), scores.data(), bias.data(), N, E, K, G, M);
      });
      report("top-k, groups", shape + " G=" + std::to_string(G) + " M=" + std::to_string(M), g,
             digest(idx));
    }
    const Spread t = ns_per_row(
        seconds, repeats, N, [&] { route_topk(idx.data(), scores.data(), bias.data(), N, E, K); });
    report("top-k", shape, t, digest(idx));
  }
  return 0;
}

}  // namespace
}  // namespace moe::bench

int main(int argc, char** argv) {
  return moe::bench::bench_mpi_main(argc, argv, moe::bench::run);
}

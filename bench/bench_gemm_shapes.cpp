// bench_gemm_shapes: moe_rt's fixed-order GEMM (model/gemm/) against OpenBLAS's sgemm on the
// deepseek4-tiny step's own GEMM shapes and deepseek4-fine's expert and router shapes, side by
// side, each call on one thread (as the model runs them inside its tasks), plus one large call
// split over the model's threads.
//
// For each shape: the median over --repeats of calls timed for --seconds each, in GFLOP/s, the
// two libraries alternating repeat by repeat so that both see the same machine; ratio =
// moe_rt / OpenBLAS (above 1: moe_rt faster). The OpenBLAS kernel is the one it chose (or
// OPENBLAS_CORETYPE's), named in the banner.
//
// Legend: M, N, K as in C[M,N] = op(A)[M,K]·op(B)[K,N]; n/t: op transposes (t) or not (n).
// deepseek4-tiny: S = 256 tokens a sequence, D = F = 128, V = 2048, 4 heads of 32 (1 KV head),
// window 128, E = 8 experts, top-3: an expert sees about 96 rows per sequence of the batch.
// deepseek4-fine: E = 64 experts of F = 56, top-8: about 32 rows per sequence.
//
// With --against narrow the second column is moe_rt's GEMM held to its narrow register tiles
// (model/gemm/gemm.cpp: a level's wide tiles, avx512's 6×64, run where a call's columns fill
// them), in place of OpenBLAS: ratio = as it runs / narrow tiles only.
//
// Run: build/bench/bench_gemm_shapes [--seconds 0.1] [--repeats 7] [--threads 2] [--level avx2]
//      [--against openblas|narrow]
#include <omp.h>

#include <chrono>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench/bench_common.hpp"
#include "model/gemm/gemm.hpp"

namespace moe::bench {
namespace {

struct Shape {
  const char* use;
  bool ta, tb;
  int M, N, K;
  float beta;
};

// Every GEMM of a deepseek4-tiny step (model/attention.cpp, model/attention_core.cpp,
// model/moe_layer.cpp, model/model.cpp), per sequence or per expert, with the transpositions the
// model uses; then deepseek4-fine's own.
const std::vector<Shape> kShapes = {
    {"attn q/o proj fwd", false, false, 256, 128, 128, 0},
    {"attn k/v proj fwd", false, false, 256, 32, 128, 0},
    // The query tiles (32 queries of 4 heads sharing one kv head, 159 keys, hd = 32). The model
    // reads kᵀ's columns with a stride of S = 256 and a head's probabilities (d_k, d_v) with one of
    // 4 · 159; here every operand is dense.
    {"attn scores q·kT (tile)", false, false, 128, 159, 32, 0},
    {"attn p·v, d_q (tile)", false, false, 128, 32, 159, 0},
    {"attn d_k, d_v (tile)", true, false, 159, 32, 32, 1},
    {"attn d_in (q/o)", false, true, 256, 128, 128, 1},
    {"attn d_in (k/v)", false, true, 256, 128, 32, 1},
    {"attn d_weight (q/o)", true, false, 128, 128, 256, 0},
    {"attn d_weight (k/v)", true, false, 128, 32, 256, 0},
    {"expert fwd, 96 rows", false, false, 96, 128, 128, 0},
    {"expert fwd, 768 rows", false, false, 768, 128, 128, 0},
    {"expert d_in, 768 rows", false, true, 768, 128, 128, 1},
    {"expert d_weight, 768 rows", true, false, 128, 128, 768, 1},
    {"expert d_weight, 1 seq", true, false, 128, 128, 96, 0},
    {"shared expert fwd", false, false, 256, 128, 128, 0},
    {"router d_in", false, true, 256, 128, 8, 1},
    {"router d_weight", true, false, 128, 8, 256, 0},
    {"LM head fwd", false, false, 256, 2048, 128, 0},
    {"LM head d_in", false, true, 256, 128, 2048, 0},
    {"LM head d_weight", true, false, 128, 2048, 256, 0},
    // The LM head's forward and input gradient take all of a rank's rows in one call: these are
    // 8 sequences' (1 rank × 8); one sequence's (8 ranks × 1) are the rows above.
    {"LM head fwd, 8 seqs", false, false, 2048, 2048, 128, 0},
    {"LM head d_in, 8 seqs", false, true, 2048, 128, 2048, 0},
    // deepseek4-fine's experts (F = 56, 64 experts, top-8: about 256 rows each over 8 sequences,
    // 32 of one sequence) and its router (E = 64).
    {"fine fwd W1/W3, 256 rows", false, false, 256, 56, 128, 0},
    {"fine fwd W2, 256 rows", false, false, 256, 128, 56, 0},
    {"fine d_h, 256 rows", false, true, 256, 56, 128, 0},
    {"fine d_x, 256 rows", false, true, 256, 128, 56, 1},
    {"fine d_weight W1/W3, 1 seq", true, false, 128, 56, 32, 0},
    {"fine d_weight W2, 1 seq", true, false, 56, 128, 32, 0},
    {"fine router d_weight", true, false, 128, 64, 256, 0},
};

double flops(const Shape& s) {
  return 2.0 * s.M * s.N * s.K;
}

// GFLOP/s of `call` over about `seconds` (after one warm-up call).
template <class F> double rate(const Shape& s, double seconds, F&& call) {
  call();
  const auto start = std::chrono::steady_clock::now();
  double elapsed = 0;
  int64_t calls = 0;
  while (elapsed < seconds) {
    call();
    ++calls;
    elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  return flops(s) * static_cast<double>(calls) / elapsed * 1e-9;
}

struct Operands {
  std::vector<float> A, B, C;
  explicit Operands(const Shape& s)
      : A(static_cast<size_t>(s.M) * s.K),
        B(static_cast<size_t>(s.K) * s.N),
        C(static_cast<size_t>(s.M) * s.N, 0.0f) {
    for (size_t i = 0; i < A.size(); ++i) A[i] = 0.001f * static_cast<float>(i % 1000) - 0.5f;
    for (size_t i = 0; i < B.size(); ++i) B[i] = 0.002f * static_cast<float>(i % 500) - 0.5f;
  }
};

void ours(const Shape& s, Operands& o) {
  gemm<float>(s.ta, s.tb, s.M, s.N, s.K, 1.0f, o.A.data(), o.B.data(), s.beta, o.C.data());
}

void openblas(const Shape& s, Operands& o) {
  reference_sgemm(s.ta, s.tb, s.M, s.N, s.K, o.A.data(), o.B.data(), s.beta, o.C.data());
}

// One table row: both libraries (or moe_rt as it runs and with narrow tiles only), alternating,
// `repeats` times.
void measure(const Shape& s, double seconds, int repeats, int threads, bool narrow) {
  Operands o(s);
  std::vector<double> mine, theirs;
  for (int r = 0; r < repeats; ++r) {
    blas_set_threads(threads);
    mine.push_back(rate(s, seconds, [&] { ours(s, o); }));
    if (narrow) {  // moe_rt with its narrow tiles only, then back to the default
      gemm_detail::gemm_wide_tiles_force(gemm_detail::WideTiles::kNever);
      theirs.push_back(rate(s, seconds, [&] { ours(s, o); }));
      gemm_detail::gemm_wide_tiles_force(gemm_detail::WideTiles::kWhereTheyPay);
      continue;
    }
    const LibraryThreads library(threads);
    theirs.push_back(rate(s, seconds, [&] { openblas(s, o); }));
  }
  const Spread a = spread_of(mine), b = spread_of(theirs);
  std::printf("%-26s %c%c %5d %5d %5d %3d %8.1f %8.1f %6.1f %6.1f %6.2f\n", s.use, s.ta ? 't' : 'n',
              s.tb ? 't' : 'n', s.M, s.N, s.K, threads, a.median, b.median, a.min, b.min,
              a.median / b.median);
}

int run(int argc, char** argv) {
  if (arg_flag(argc, argv, "--help")) {
    std::printf(
        "usage: bench_gemm_shapes [--seconds S] [--repeats R] [--threads T] [--level L]\n"
        "                         [--against openblas|narrow]\n");
    return 0;
  }
  const std::string against = arg_text(argc, argv, "--against", "openblas");
  if (against != "openblas" && against != "narrow") {
    throw std::invalid_argument("--against: 'openblas' or 'narrow', not '" + against + "'");
  }
  const bool narrow = against == "narrow";
  const double seconds = std::atof(arg_text(argc, argv, "--seconds", "0.1").c_str());
  const int repeats = static_cast<int>(arg_int(argc, argv, "--repeats", 7));
  const int threads = static_cast<int>(arg_int(argc, argv, "--threads", 2));
  force_gemm_level_arg(argc, argv);
  const Comm world = Comm::world();
  print_banner(world, "bench_gemm_shapes",
               narrow ? "moe_rt's GEMM against its narrow tiles only on the step's shapes (GFLOP/s)"
                      : "moe_rt's GEMM against OpenBLAS sgemm on deepseek4-tiny's shapes (GFLOP/s)",
               1);
  std::printf("%-26s %-2s %5s %5s %5s %3s %8s %8s %6s %6s %6s\n", "# use", "op", "M", "N", "K",
              "thr", "moe_rt", narrow ? "narrow" : "OpenBLAS", "min", "min", "ratio");
  for (const Shape& s : kShapes) measure(s, seconds, repeats, 1, narrow);
  // The LM head's forward called outside the model's tasks (one sequence's rows, and 8
  // sequences' in one call): split over the model's threads (and OpenBLAS over as many of its own).
  if (threads > 1) {
    for (const Shape& s : kShapes) {
      const std::string_view use(s.use);
      if (use == "LM head fwd" || use == "LM head fwd, 8 seqs") {
        measure(s, seconds, repeats, threads, narrow);
      }
    }
  }
  return 0;
}

}  // namespace
}  // namespace moe::bench

int main(int argc, char** argv) {
  return moe::bench::bench_mpi_main(argc, argv, moe::bench::run);
}

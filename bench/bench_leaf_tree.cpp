// bench_leaf_tree: a weight gradient summed over sequences along the fixed tree, two ways with the
// same bits: one GEMM per leaf (sequence) into a TreeSum, which pairs the leaves through beta = 1
// and adds the rest in passes over I×O buffers (model/tree_sum.hpp), against gemm_leaf_tree
// (model/blas.hpp), which keeps each register tile's leaves and partial sums in registers and the
// level-1 cache. Shapes: the weight gradients of deepseek4-tiny's and deepseek4-fine's routed and
// shared experts and of the LM head, over 8 sequences.
//
// For each shape, warm (the operands just used) and cold (a 64 MiB sweep between calls, as in a
// step, where the rows were written long before): the median over --repeats of one call's time,
// the two ways alternating call by call; GFLOP/s of the medians, ratio = leaf tree / TreeSum time
// (below 1: the leaf tree is faster), and whether the two results are the same bits.
//
// Legend: I×O the weight, leaves × rows the sequences' rows of it (an expert's rows of each).
//
// Run: build/bench/bench_leaf_tree [--repeats 41] [--level avx2]
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "bench/bench_common.hpp"
#include "model/gemm/gemm.hpp"
#include "model/tree_sum.hpp"

namespace moe::bench {
namespace {

struct Shape {
  const char* use;
  int I, O, leaves, rows;
};

const std::vector<Shape> kShapes = {
    {"tiny expert d_W (96 rows/seq)", 128, 128, 8, 96},
    {"fine expert d_W1/W3 (32/seq)", 128, 56, 8, 32},
    {"fine expert d_W2 (32/seq)", 56, 128, 8, 32},
    {"tiny shared d_W (256/seq)", 128, 128, 8, 256},
    {"fine shared d_W1/W3 (256/seq)", 128, 56, 8, 256},
    {"fine shared d_W2 (256/seq)", 56, 128, 8, 256},
    {"LM head d_W (256/seq)", 128, 2048, 8, 256},
};

// Writes 64 MiB, so that the next call's operands come from memory, as in a step.
void sweep_caches() {
  static std::vector<float> sweep(size_t{16} << 20);
  for (size_t i = 0; i < sweep.size(); i += 16) sweep[i] += 1.0f;
  benchmark_keep(sweep[sweep.size() / 2]);
}

void measure(const Shape& s, int repeats, bool cold) {
  const int64_t R = int64_t{s.leaves} * s.rows;
  std::vector<float> in(static_cast<size_t>(R) * s.I), d_out(static_cast<size_t>(R) * s.O);
  for (size_t i = 0; i < in.size(); ++i) in[i] = 0.001f * static_cast<float>(i % 1000) - 0.5f;
  for (size_t i = 0; i < d_out.size(); ++i) d_out[i] = 0.002f * static_cast<float>(i % 499) - 0.5f;
  const size_t IO = static_cast<size_t>(s.I) * s.O;
  std::vector<float> by_tree(IO, 0.0f), by_leaves(IO, 0.0f);
  std::vector<int64_t> first(s.leaves);
  const std::vector<int> rows(s.leaves, s.rows);
  for (int q = 0; q < s.leaves; ++q) first[q] = int64_t{q} * s.rows;
  TreeSum<float> tree;
  tree.reserve(IO, s.leaves);
  std::vector<float> scratch(gemm_leaf_tree_scratch<float>(s.I, s.O, s.leaves));
  auto per_leaf = [&] {
    tree.begin_into(IO, s.leaves, by_tree.data());
    for (int q = 0; q < s.leaves; ++q) {
      gemm<float>(true, false, s.I, s.O, s.rows, 1.0f, in.data() + first[q] * s.I,
                  d_out.data() + first[q] * s.O, tree.leaf_beta(), tree.leaf());
      tree.push();
    }
    tree.finish(by_tree.data());
  };
  auto leaf_tree = [&] {
    gemm_leaf_tree<float>(s.I, s.O, in.data(), s.I, d_out.data(), s.O, by_leaves.data(), s.O, first,
                          rows, scratch);
  };
  auto timed = [&](auto&& call) {
    if (cold) sweep_caches();
    const auto start = std::chrono::steady_clock::now();
    call();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  // Both into zeros once: the same bits?
  per_leaf();
  leaf_tree();
  const bool same = std::memcmp(by_tree.data(), by_leaves.data(), IO * sizeof(float)) == 0;
  std::vector<double> a, b;
  for (int r = 0; r < repeats; ++r) {
    a.push_back(timed(per_leaf));
    b.push_back(timed(leaf_tree));
  }
  const double flop = 2.0 * s.I * s.O * static_cast<double>(R);
  const Spread ta = spread_of(a), tb = spread_of(b);
  std::printf("%-30s %5d %5d %3d x %3d %-4s %8.1f %8.1f %8.1f %8.1f %6.3f %s\n", s.use, s.I, s.O,
              s.leaves, s.rows, cold ? "cold" : "warm", ta.median * 1e6, tb.median * 1e6,
              flop / ta.median * 1e-9, flop / tb.median * 1e-9, tb.median / ta.median,
              same ? "yes" : "NO");
}

int run(int argc, char** argv) {
  if (arg_flag(argc, argv, "--help")) {
    std::printf("usage: bench_leaf_tree [--repeats R] [--level L]\n");
    return 0;
  }
  const int repeats = static_cast<int>(arg_int(argc, argv, "--repeats", 41));
  force_gemm_level_arg(argc, argv);
  blas_set_threads(1);
  const Comm world = Comm::world();
  print_banner(world, "bench_leaf_tree",
               "weight gradients over 8 sequences: a GEMM per leaf into a TreeSum against "
               "gemm_leaf_tree (one thread)",
               1);
  std::printf("%-30s %5s %5s %9s %-4s %8s %8s %8s %8s %6s %s\n", "# use", "I", "O", "leaves", "",
              "tree us", "leaf us", "tree GF", "leaf GF", "ratio", "same bits");
  for (const Shape& s : kShapes) {
    for (bool cold : {false, true}) measure(s, repeats, cold);
  }
  return 0;
}

}  // namespace
}  // namespace moe::bench

int main(int argc, char** argv) {
  return moe::bench::bench_mpi_main(argc, argv, moe::bench::run);
}

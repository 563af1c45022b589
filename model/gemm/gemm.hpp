// moe_rt's own GEMM: every element of C is one chain of fused multiply-adds in a fixed order, so
// its bits depend on the operands alone, never on the call's shape, the tiling, the thread count,
// the vector width or the CPU. model/blas.hpp's gemm and gemm_ld validate a call and run it here.
//
// The contract, for C[M,N] = alpha·op(A)[M,K]·op(B)[K,N] + beta·C and each (i, j):
//   s = +0;  for k = 0 … K−1: s = fma(op(A)[i,k], op(B)[k,j], s)     (one rounding each)
//   if alpha != 1: s = s·alpha;   C[i,j] = beta == 0 ? s : s + beta·C[i,j]
// Every level below computes exactly that (tests/model/test_gemm.cpp checks each level the CPU
// has against a plain loop of std::fma, bit for bit). Without an FMA instruction the portable
// level does it with std::fma in software: far slower, the same bits.
// Legend: M, N, K the GEMM's dimensions.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

#include "model/gemm/gemm_call.hpp"

namespace moe {

// The instruction-set levels of the GEMM's kernels, narrowest first.
enum class GemmLevel {
  kPortable = 0,  // scalar std::fma, any CPU
  kFma128 = 1,    // 128-bit registers, FMA3 (CPUs with AVX and FMA)
  kAvx2 = 2,      // 256-bit, x86-64-v3
  kAvx512 = 3,    // 512-bit, x86-64-v4
};

const char* gemm_level_name(GemmLevel level);  // "portable", "fma128", "avx2", "avx512"
std::optional<GemmLevel> gemm_level_parse(std::string_view name);
bool gemm_level_supported(GemmLevel level);  // by this CPU (and this build)
GemmLevel gemm_level();                      // the level GEMMs run at now
// Runs GEMMs at `level` from now on (tests, MOE_RT_GEMM); std::invalid_argument if the CPU lacks
// it, naming the level and the best one it has.
void gemm_level_force(GemmLevel level);
void gemm_level_reset();  // back to the best level the CPU has
// The level in use and its register tile, for the log: e.g. "avx2 (6x16 float tiles)".
std::string_view gemm_level_description();

namespace gemm_detail {
// Where a level's wide tiles (gemm_call.hpp) run: on the blocks whose columns they fill, except a
// transposed A over few columns whose wide panels of B would outgrow the level-1 cache (the
// default, gemm.cpp), never, or on every block (tests and benchmarks, for either tile at every
// shape).
enum class WideTiles { kWhereTheyPay, kNever, kAlways };
void gemm_wide_tiles_force(WideTiles use);
// Blocks run in wide tiles since the program started (tests: that a switch took effect).
int64_t gemm_wide_blocks();
// Runs one validated call: outside the model's parallel regions, a call of at least 4 MFLOP is
// cut into blocks of C that run as tasks on the model's threads; inside one, it runs on the
// calling thread. Either way every element is computed as the contract says.
template <class T> void gemm_run(const GemmCall<T>& g);
// The scratch a leaf tree of M×N over `leaves` leaves needs at any level this CPU has (its partial
// sums: a register tile's worth per tile of C and level of the tree).
template <class T> int64_t gemm_leaf_tree_scratch(int M, int N, int leaves);
// Runs one validated leaf tree (gemm_call.hpp) with gemm_leaf_tree_scratch(M, N, leaves) values
// of scratch, split into tasks as gemm_run splits a call; each element is computed as
// gemm_leaf_tree's contract (model/blas.hpp) says, whoever computes it.
template <class T> void gemm_leaf_tree_run(const LeafTreeCall<T>& g, T* scratch);
}  // namespace gemm_detail

}  // namespace moe

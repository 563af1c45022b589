// The GEMM's level (detected once, forced by tests and MOE_RT_GEMM), its per-thread packing
// space, and the split of a large call into tasks on the model's threads.
// Legend: M, N, K the GEMM's dimensions; MR×NR the level's register tile.
#include "model/gemm/gemm.hpp"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>

#include "model/parallel.hpp"

namespace moe {
namespace {

using gemm_detail::GemmCall;
using gemm_detail::GemmKernels;
using gemm_detail::GemmKernelsOf;

GemmLevel best_level() {
#if defined(MOE_GEMM_X86_LEVELS)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("x86-64-v4")) return GemmLevel::kAvx512;
  if (__builtin_cpu_supports("x86-64-v3")) return GemmLevel::kAvx2;
  if (__builtin_cpu_supports("avx") && __builtin_cpu_supports("fma")) return GemmLevel::kFma128;
#endif
  return GemmLevel::kPortable;
}

const GemmLevel kBest = best_level();
std::atomic<int> g_level{static_cast<int>(kBest)};

const GemmKernels& kernels(GemmLevel level) {
  switch (level) {
#if defined(MOE_GEMM_X86_LEVELS)
    case GemmLevel::kAvx512:
      return gemm_detail::kGemmAvx512;
    case GemmLevel::kAvx2:
      return gemm_detail::kGemmAvx2;
    case GemmLevel::kFma128:
      return gemm_detail::kGemmFma128;
#endif
    default:
      return gemm_detail::kGemmPortable;
  }
}

template <class T> const GemmKernelsOf<T>& kernels_of(GemmLevel level) {
  if constexpr (std::is_same_v<T, float>) {
    return kernels(level).f32;
  } else {
    return kernels(level).f64;
  }
}

// This thread's packing space, grown to the largest call seen (so no allocation once the first
// step has run), 64-byte aligned so that a packed panel's rows start on cache lines.
struct AlignedDelete {
  void operator()(void* p) const { ::operator delete[](p, std::align_val_t{64}); }
};

template <class T> T* pack_space(int64_t elements) {
  struct Space {
    std::unique_ptr<void, AlignedDelete> data;
    int64_t capacity = 0;
  };
  thread_local Space space;
  if (space.capacity < elements) {
    const int64_t capacity = std::max(elements, space.capacity * 2);
    space.data.reset(
        ::operator new[](static_cast<size_t>(capacity) * sizeof(T), std::align_val_t{64}));
    space.capacity = capacity;
  }
  return static_cast<T*>(space.data.get());
}

// A call of at least this many flops, made outside the model's parallel regions, is split into
// tasks: below it a task's packing costs more than the thread saves.
constexpr double kSplitFlops = 4e6;

// Where wide tiles run (gemm_wide_tiles_force): a WideTiles.
std::atomic<int> g_wide_tiles{static_cast<int>(gemm_detail::WideTiles::kWhereTheyPay)};

// Whether a block of n columns runs in a level's wide tiles (mr/2 × 2·nr, gemm_call.hpp): for
// each k a wide tile loads 2·nr values of B and broadcasts mr/2 of A where a narrow one loads nr
// and broadcasts mr, for as many multiply-adds, and A's rows pass once for every 2·nr columns
// rather than every nr. That pays where the columns fill the last wide panel past three quarters
// (or fill whole ones); below that, a narrow tile's half-wide edge wastes fewer lanes. Measured
// at avx512 (bench_gemm_shapes --against narrow, docs/performance.md): most of the model's calls
// over 56, 64, 128 and 2048 columns 4-35% faster in wide tiles (a transposed A over a long K
// excepted: wide_panel_spills); 40, 48 and 159 columns no faster. Which tile computes an element
// changes none of its bits.
bool wide_tiles_pay(int n, int nr) {
  const int rest = n % (2 * nr);
  return rest == 0 || rest > nr + nr / 2;  // n <= nr: rest is n, neither
}

// Bytes of one panel of B (K × its columns) that stay in the level-1 cache while the tiles of A
// pass over it.
constexpr int64_t kL1PanelBytes = 32 * 1024;

// A call with a transposed A over few columns (at most four wide panels in all, which the tiles
// read in place) and a long K: a wide panel of B (K × 2·nr) then outgrows the level-1 cache, and
// every tile of A reads it from the level-2 cache again; a narrow panel is half its size. The
// attention's q/o weight gradients (128 × 128 over K = 256, about 4% of a deepseek4-tiny step)
// and deepseek4-fine's router weight gradient (128 × 64 over K = 256) ran 5-10% faster in narrow
// tiles alone (bench_gemm_shapes --against narrow) and faster still inside a step
// (docs/performance.md); the LM head's weight gradient (2048 columns, both operands packed) stays
// wide, 6% faster so. The call's columns decide, not a block's, so that the choice does not
// depend on how many threads split the call.
template <class T> bool wide_panel_spills(const GemmCall<T>& g, int nr) {
  return g.trans_a && g.N <= 8 * nr && int64_t{g.K} * 2 * nr * int64_t{sizeof(T)} > kL1PanelBytes;
}

// Whether a block of n columns of g at level k runs in wide tiles, as gemm_wide_tiles_force says.
template <class T> bool wide_tiles_for(const GemmKernelsOf<T>& k, const GemmCall<T>& g, int n) {
  using gemm_detail::WideTiles;
  const auto use = static_cast<WideTiles>(g_wide_tiles.load(std::memory_order_relaxed));
  return k.wide_block != nullptr && use != WideTiles::kNever &&
         (use == WideTiles::kAlways || (wide_tiles_pay(n, k.nr) && !wide_panel_spills(g, k.nr)));
}

std::atomic<int64_t> g_wide_blocks{0};  // gemm_wide_blocks

template <class T>
void run_block(const GemmKernelsOf<T>& k, const GemmCall<T>& g, int i0, int m, int j0, int n) {
  if (wide_tiles_for(k, g, n)) {
    g_wide_blocks.fetch_add(1, std::memory_order_relaxed);
    k.wide_block(g, i0, m, j0, n, pack_space<T>(k.wide_pack_elements(m, n, g.K)));
  } else {
    k.block(g, i0, m, j0, n, pack_space<T>(k.pack_elements(m, n, g.K)));
  }
}

}  // namespace

const char* gemm_level_name(GemmLevel level) {
  switch (level) {
    case GemmLevel::kAvx512:
      return "avx512";
    case GemmLevel::kAvx2:
      return "avx2";
    case GemmLevel::kFma128:
      return "fma128";
    default:
      return "portable";
  }
}

std::optional<GemmLevel> gemm_level_parse(std::string_view name) {
  for (GemmLevel level :
       {GemmLevel::kPortable, GemmLevel::kFma128, GemmLevel::kAvx2, GemmLevel::kAvx512}) {
    if (name == gemm_level_name(level)) return level;
  }
  return std::nullopt;
}

bool gemm_level_supported(GemmLevel level) {
  return static_cast<int>(level) <= static_cast<int>(kBest);
}

GemmLevel gemm_level() {
  return static_cast<GemmLevel>(g_level.load(std::memory_order_relaxed));
}

void gemm_level_force(GemmLevel level) {
  if (!gemm_level_supported(level)) {
    throw std::invalid_argument(
        std::string("the GEMM level ") + gemm_level_name(level) +
        " needs instructions this CPU lacks (best here: " + gemm_level_name(kBest) + ")");
  }
  g_level.store(static_cast<int>(level));
}

void gemm_level_reset() {
  g_level.store(static_cast<int>(kBest));
}

std::string_view gemm_level_description() {
  switch (gemm_level()) {
    case GemmLevel::kAvx512:
      return "avx512 (12x32 and 6x64 float tiles)";
    case GemmLevel::kAvx2:
      return "avx2 (6x16 float tiles)";
    case GemmLevel::kFma128:
      return "fma128 (6x8 float tiles)";
    default:
      return "portable (scalar std::fma)";
  }
}

namespace gemm_detail {

namespace {

// block(i0, m, j0, n) over all of an M×N output of `flops` flops: at once on the calling thread
// inside the model's parallel regions, on one thread, or below kSplitFlops; else as one task a
// thread, each packing its own operands. The split is along the dimension whose split repeats the
// smaller packing (column blocks each pack all of A's M×K, row blocks all of B's K×N), in whole
// register panels of mr rows or nr columns. (Four tasks a thread packed the LM head's [2048, 128]
// weight eight times over.) Which task computes an element changes none of its bits.
template <class Block> void run_split(int M, int N, int mr, int nr, double flops, Block&& block) {
  const int threads = omp_get_max_threads();
  if (omp_get_level() > 0 || threads < 2 || flops < kSplitFlops) {
    block(0, M, 0, N);
    return;
  }
  const bool split_cols = M <= N;  // A (M×K) is the smaller to repeat
  const int panel = split_cols ? nr : mr, extent = split_cols ? N : M;
  const int panels = (extent + panel - 1) / panel, tasks = std::min(panels, threads);
  const int width = (panels + tasks - 1) / tasks * panel;
  parallel_tasks((extent + width - 1) / width, [&](int64_t task) {
    const int first = static_cast<int>(task) * width, count = std::min(width, extent - first);
    if (split_cols) {
      block(0, M, first, count);
    } else {
      block(first, count, 0, N);
    }
  });
}

}  // namespace

void gemm_wide_tiles_force(WideTiles use) {
  g_wide_tiles.store(static_cast<int>(use));
}

int64_t gemm_wide_blocks() {
  return g_wide_blocks.load(std::memory_order_relaxed);
}

template <class T> void gemm_run(const GemmCall<T>& g) {
  const GemmKernelsOf<T>& k = kernels_of<T>(gemm_level());
  // A call whose columns go wide is split in wide panels, so that its blocks do too.
  run_split(g.M, g.N, k.mr, wide_tiles_for(k, g, g.N) ? 2 * k.nr : k.nr, 2.0 * g.M * g.N * g.K,
            [&](int i0, int m, int j0, int n) { run_block(k, g, i0, m, j0, n); });
}

template void gemm_run<float>(const GemmCall<float>&);
template void gemm_run<double>(const GemmCall<double>&);

// The partial sums' slots start on a cache line: the caller's scratch (a std::vector's 16-byte
// alignment) is rounded up, for which the scratch counts a line's worth of elements more.
constexpr int64_t kLineBytes = 64;

template <class T> T* line_aligned(T* p) {
  const auto at = reinterpret_cast<uintptr_t>(p);
  return reinterpret_cast<T*>((at + kLineBytes - 1) / kLineBytes * kLineBytes);
}

template <class T> int64_t gemm_leaf_tree_scratch(int M, int N, int leaves) {
  int64_t most = 0;
  for (GemmLevel level :
       {GemmLevel::kPortable, GemmLevel::kFma128, GemmLevel::kAvx2, GemmLevel::kAvx512}) {
    if (gemm_level_supported(level)) {
      most = std::max(most, kernels_of<T>(level).leaf_tree_elements(M, N, leaves));
    }
  }
  return most + kLineBytes / static_cast<int64_t>(sizeof(T)) - 1;
}

template <class T> void gemm_leaf_tree_run(const LeafTreeCall<T>& g, T* scratch) {
  const GemmKernelsOf<T>& k = kernels_of<T>(gemm_level());
  scratch = line_aligned(scratch);
  double flops = 0;
  for (int q = 0; q < g.leaves; ++q) flops += 2.0 * g.M * g.N * g.rows[q];
  // Each task with the scratch of its own tiles: the elements of the block before it (a split is
  // along one dimension, in whole panels).
  run_split(g.M, g.N, k.mr, k.nr, flops, [&](int i0, int m, int j0, int n) {
    const int64_t before =
        j0 > 0 ? k.leaf_tree_elements(g.M, j0, g.leaves) : k.leaf_tree_elements(i0, g.N, g.leaves);
    k.leaf_tree_block(g, i0, m, j0, n, scratch + before);
  });
}

template int64_t gemm_leaf_tree_scratch<float>(int, int, int);
template int64_t gemm_leaf_tree_scratch<double>(int, int, int);
template void gemm_leaf_tree_run<float>(const LeafTreeCall<float>&, float*);
template void gemm_leaf_tree_run<double>(const LeafTreeCall<double>&, double*);

}  // namespace gemm_detail
}  // namespace moe

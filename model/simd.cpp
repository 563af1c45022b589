// The instruction-set level of the float elementwise kernels: detected once, forced by tests.
#include "model/simd.hpp"

#include <atomic>
#include <stdexcept>
#include <string>

namespace moe {
namespace {

SimdLevel best_level() {
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("x86-64-v4")) return SimdLevel::kAvx512;
  if (__builtin_cpu_supports("x86-64-v3")) return SimdLevel::kAvx2;
#endif
  return SimdLevel::kSse2;
}

const SimdLevel kBest = best_level();
std::atomic<int> g_level{static_cast<int>(kBest)};

}  // namespace

const char* simd_level_name(SimdLevel level) {
  switch (level) {
    case SimdLevel::kAvx512:
      return "avx512";
    case SimdLevel::kAvx2:
      return "avx2";
    default:
      return "sse2";
  }
}

std::optional<SimdLevel> simd_level_parse(std::string_view name) {
  for (SimdLevel level : {SimdLevel::kSse2, SimdLevel::kAvx2, SimdLevel::kAvx512}) {
    if (name == simd_level_name(level)) return level;
  }
  return std::nullopt;
}

bool simd_level_supported(SimdLevel level) {
  return static_cast<int>(level) <= static_cast<int>(kBest);
}

SimdLevel simd_level() {
  return static_cast<SimdLevel>(g_level.load(std::memory_order_relaxed));
}

void simd_level_force(SimdLevel level) {
  if (!simd_level_supported(level)) {
    throw std::invalid_argument(std::string("simd_level_force: this CPU has no ") +
                                simd_level_name(level) + " (best: " + simd_level_name(kBest) + ")");
  }
  g_level.store(static_cast<int>(level));
}

void simd_level_reset() {
  g_level.store(static_cast<int>(kBest));
}

}  // namespace moe

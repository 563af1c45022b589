// The float elementwise kernels (SwiGLU, the attention softmax rows, the router's logits and
// sqrt(softplus) scores with their backward, its top-k by ranks, the LM head's cross-entropy rows,
// RMSNorm's backward rows, the parameters' initial draws) are compiled three times: for SSE2 (any
// x86-64), AVX2 (x86-64-v3) and AVX-512 (x86-64-v4), and each call goes to the level simd_level()
// names: the best this CPU has, unless a test forced a lower one. The build needs no -march. Every
// level gives the same bits: the kernels use only IEEE operations that round the same at every
// vector width (top-k's only integer comparisons), and moe_model is built with -ffp-contract=off
// (no a·b + c fused into an FMA in the wider levels). tests/model/test_simd.cpp (top-k:
// tests/model/test_router.cpp) checks each level the CPU has against the plain formula and reports
// the others as skipped. Other compilers and architectures get the SSE2 (plain) build three times.
#pragma once

#include <optional>
#include <string_view>

namespace moe {

enum class SimdLevel { kSse2 = 0, kAvx2 = 1, kAvx512 = 2 };

const char* simd_level_name(SimdLevel level);  // "sse2", "avx2", "avx512"
std::optional<SimdLevel> simd_level_parse(std::string_view name);
bool simd_level_supported(SimdLevel level);  // by this CPU
SimdLevel simd_level();                      // the level kernels run at now
// Runs the kernels at `level` from now on (tests); std::invalid_argument if the CPU lacks it.
void simd_level_force(SimdLevel level);
void simd_level_reset();  // back to the best level the CPU has

}  // namespace moe

// A build whose baseline already has AVX2 (-march=native, -march=x86-64-v3) compiles all three
// at that baseline: a target narrower than the baseline cannot inline the kernels' code.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && !defined(__AVX2__)
#define MOE_SIMD_TARGET_AVX512 [[gnu::target("arch=x86-64-v4")]]
#define MOE_SIMD_TARGET_AVX2 [[gnu::target("arch=x86-64-v3")]]
#else
#define MOE_SIMD_TARGET_AVX512
#define MOE_SIMD_TARGET_AVX2
#endif

// Defines `static void name params` that calls `impl args` compiled at the level simd_level()
// names. `impl` must be [[gnu::always_inline]], and each level's function is [[gnu::flatten]]:
// everything it calls is compiled into it at its level, at any optimisation level, rather than
// called at the default one. Flatten is not a promise: GCC 12 left a large lambda inside `impl`
// out of line, one copy at the baseline that every level called. A lambda there is
// __attribute__((always_inline)) too, and tests/simd_levels_inlined.py (CTest
// simd_levels_inlined) fails on any call from a wide level's function to the baseline's code.
#define MOE_SIMD_KERNEL(name, impl, params, args)                            \
  MOE_SIMD_TARGET_AVX512 [[gnu::flatten]] static void name##_avx512 params { \
    impl args;                                                               \
  }                                                                          \
  MOE_SIMD_TARGET_AVX2 [[gnu::flatten]] static void name##_avx2 params {     \
    impl args;                                                               \
  }                                                                          \
  [[gnu::flatten]] static void name##_sse2 params {                          \
    impl args;                                                               \
  }                                                                          \
  static void name params {                                                  \
    switch (::moe::simd_level()) {                                           \
      case ::moe::SimdLevel::kAvx512:                                        \
        return name##_avx512 args;                                           \
      case ::moe::SimdLevel::kAvx2:                                          \
        return name##_avx2 args;                                             \
      default:                                                               \
        return name##_sse2 args;                                             \
    }                                                                        \
  }

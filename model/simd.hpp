// MOE_SIMD_CLONES: an elementwise kernel compiled for several x86-64 levels (SSE2, AVX2, AVX-512),
// one picked once at load time for the CPU it runs on (GCC's target_clones, an ifunc resolver).
// The kernels use only IEEE operations that give the same bits at every vector width, and
// moe_model is built with -ffp-contract=off (no multiply-add fused into an FMA on the wider
// levels), so every clone computes bitwise the same results: only the speed differs.
// Other compilers and architectures get the plain function.
#pragma once

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define MOE_SIMD_CLONES \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define MOE_SIMD_CLONES
#endif

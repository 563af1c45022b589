// Counter-based random numbers: every value is a pure function of (seed, stream, index), so any
// rank can generate any slice of any parameter or table without generating what comes before it.
// The stream is a hash of a name ("layers.3.moe.router"), which makes initialisation depend only
// on the seed and the parameter's name, never on the rank or on the order of creation.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <string_view>

#include "numeric/det_math.hpp"

namespace moe {

// SplitMix64's finaliser: a bijective 64-bit mixer with full avalanche.
constexpr uint64_t rng_mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// FNV-1a over the bytes of a name: stable across compilers and runs (unlike std::hash).
constexpr uint64_t rng_hash_name(std::string_view name) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (char c : name) {
    h ^= static_cast<uint8_t>(c);
    h *= 0x100000001b3ull;
  }
  return h;
}

constexpr uint64_t rng_stream(uint64_t seed, std::string_view name) {
  return rng_mix64(seed ^ rng_mix64(rng_hash_name(name)));
}

constexpr uint64_t rng_u64(uint64_t stream, uint64_t index) {
  return rng_mix64(stream ^ rng_mix64(index + 0x632be59bd9b4e019ull));
}

// Uniform in [0, 1) with 53 random bits.
inline double rng_uniform(uint64_t stream, uint64_t index) {
  return static_cast<double>(rng_u64(stream, index) >> 11) * 0x1.0p-53;
}

// Uniform integer in [0, n) (n > 0); the modulo bias is below 2^-40 for the n used here.
inline uint64_t rng_below(uint64_t stream, uint64_t index, uint64_t n) {
  return rng_u64(stream, index) % n;
}

// Standard normal by Box-Muller on two counter draws (index 2i and 2i+1).
inline double rng_normal(uint64_t stream, uint64_t index) {
  const double u1 = 1.0 - rng_uniform(stream, 2 * index);  // (0, 1]: log stays finite
  const double u2 = rng_uniform(stream, 2 * index + 1);
  // numeric/det_math.hpp's log and cos: the same initial values on every machine.
  return std::sqrt(-2.0 * det::log(u1)) * det::cos(6.283185307179586 * u2);
}

// The 53-bit integer x >> 11 as a double, without a 64-bit integer conversion (no instruction
// below AVX-512 converts them in a vector): its low 52 bits under 2^52's exponent less 2^52, then
// its top bit added, both exact.
inline double rng_top53_lanes(uint64_t x) {
  const uint64_t v = x >> 11;
  const double low =
      std::bit_cast<double>((v & 0x000fffffffffffffull) | 0x4330000000000000ull) - 0x1p52;
  return low + ((v >> 52) != 0 ? 0x1p52 : 0.0);
}

// rng_normal's bits through det's branch-free lanes, for loops the compiler vectorises
// (model/params.cpp): the same draws and operations.
inline double rng_normal_lanes(uint64_t stream, uint64_t index) {
  const double u1 = 1.0 - rng_top53_lanes(rng_u64(stream, 2 * index)) * 0x1.0p-53;
  const double u2 = rng_top53_lanes(rng_u64(stream, 2 * index + 1)) * 0x1.0p-53;
  return std::sqrt(-2.0 * det::log_unit_lanes(u1)) * det::cos_lanes(6.283185307179586 * u2);
}

}  // namespace moe

// The orders of --data-order (data_order.hpp). The shuffle is a keyed bijection computed per
// sample rather than a stored permutation: a permutation of a file's windows would cost every
// rank 8 bytes per window (80 MB for a file of 10 G tokens at S = 1024), rebuilt at each epoch,
// where the bijection costs no memory, no set-up time, and nothing at an epoch's start, and is
// pure in the sample index by construction.
//
// The bijection is a balanced Feistel network over the smallest even number of bits 2h that
// holds n (each round: left, right ← right, left ⊕ F_r(right), F_r a keyed 64-bit mix cut to h
// bits); a Feistel network is a permutation of [0, 2^2h) whatever its round functions, and with
// random round functions and four rounds or more one indistinguishable from a random permutation
// (Luby and Rackoff, 1988); here six rounds of splitmix64's mixer. Cycle walking
// (Black and Rogaway, "Ciphers with Arbitrary Finite Domains", 2002) restricts it to [0, n):
// apply it again until the value falls below n. That is a permutation of [0, n), and it ends:
// the walk follows idx's cycle of the permutation of [0, 2^2h), which comes back to idx < n at
// the latest. Since 2^2h < 4n, it takes fewer than 4 applications on average.
#include "io/data_order.hpp"

#include <bit>
#include <stdexcept>
#include <string>

namespace moe {
namespace {

constexpr int kFeistelRounds = 6;
constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ull;
// Mixed into --seed so that the shuffle's keys are not those of the weights or the synthetic
// chain, which derive theirs from the same seed.
constexpr uint64_t kShuffleTag = 0x64617461'6f726472ull;  // "dataordr"

uint64_t mix64(uint64_t x) {  // splitmix64's finaliser: a bijection of 64-bit words
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// One application of the Feistel network to x < 2^(2·half), half in [1, 32].
uint64_t feistel(uint64_t x, int half, uint64_t key) {
  const uint64_t mask = (uint64_t{1} << half) - 1;  // half <= 32: no shift by 64
  uint64_t left = x >> half, right = x & mask;
  for (int round = 0; round < kFeistelRounds; ++round) {
    const uint64_t round_key = mix64(key + kGolden * static_cast<uint64_t>(round + 1));
    const uint64_t next = left ^ (mix64(right ^ round_key) & mask);
    left = right;
    right = next;
  }
  return (left << half) | right;
}

}  // namespace

std::optional<DataOrder> data_order_from_name(std::string_view name) {
  if (name == "shuffled") return DataOrder::kShuffled;
  if (name == "sequential") return DataOrder::kSequential;
  return std::nullopt;
}

const char* data_order_name(DataOrder order) {
  return order == DataOrder::kShuffled ? "shuffled" : "sequential";
}

int64_t data_num_windows(int64_t num_tokens, int seq_len) {
  if (seq_len <= 0 || num_tokens <= seq_len) {
    throw std::invalid_argument("a file of " + std::to_string(num_tokens) +
                                " tokens holds no window of " + std::to_string(seq_len) + " + 1");
  }
  return (num_tokens - 1) / seq_len;
}

uint64_t data_window_permute(uint64_t idx, uint64_t n, uint64_t key) {
  if (idx >= n) {
    throw std::invalid_argument("window position " + std::to_string(idx) + " is not below " +
                                std::to_string(n));
  }
  if (n == 1) return 0;
  const int half = (std::bit_width(n - 1) + 1) / 2;  // 2^(2·half) >= n, half in [1, 32]
  uint64_t x = idx;
  do {
    x = feistel(x, half, key);
  } while (x >= n);
  return x;
}

int64_t data_sample_start(int64_t sample_idx, int64_t num_tokens, int seq_len, SampleOrder order) {
  const int64_t num_windows = data_num_windows(num_tokens, seq_len);  // checks the sizes
  if (sample_idx < 0) {
    throw std::invalid_argument("sample index must be >= 0, got " + std::to_string(sample_idx));
  }
  if (order.order == DataOrder::kSequential) {
    // Start offsets 0 .. N−S−1 leave room for S+1 tokens. The product i·S can exceed 64 bits for
    // very long runs on very large files, hence the 128-bit intermediate.
    const auto num_starts = static_cast<uint64_t>(num_tokens - seq_len);
    const auto product = static_cast<unsigned __int128>(sample_idx) * seq_len;
    return static_cast<int64_t>(product % num_starts);
  }
  const auto n = static_cast<uint64_t>(num_windows);
  const uint64_t epoch = static_cast<uint64_t>(sample_idx) / n;
  const uint64_t key = mix64(mix64(order.seed ^ kShuffleTag) ^ epoch);
  const uint64_t window = data_window_permute(static_cast<uint64_t>(sample_idx) % n, n, key);
  return static_cast<int64_t>(window) * seq_len;  // < num_tokens: no overflow
}

}  // namespace moe

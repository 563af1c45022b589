// Tests of --data-order's sample orders (io/data_order.hpp): the shuffle reads every window of a
// file exactly once per epoch, in an order of its own per epoch and per seed, as a pure function
// of the sample index; the sequential order is the stride sampling of earlier versions, offset
// for offset; a file source reads the tokens of the window its order names.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "io/data_order.hpp"
#include "io/synthetic_data.hpp"
#include "io/token_data.hpp"
#include "io/token_source.hpp"
#include "test_tempdir.hpp"

namespace moe {
namespace {

using testing_util::TempDir;

constexpr uint64_t kSeed = 1234;

SampleOrder shuffled(uint64_t seed = kSeed) {
  return {DataOrder::kShuffled, seed};
}

// The windows samples [epoch·n, (epoch+1)·n) start at, for a file of n whole windows of S and a
// tail of `tail` tokens besides the last target.
std::vector<int64_t> epoch_windows(int64_t n, int S, int64_t epoch, SampleOrder order,
                                   int64_t tail = 0) {
  const int64_t num_tokens = n * S + 1 + tail;
  std::vector<int64_t> windows;
  for (int64_t i = epoch * n; i < (epoch + 1) * n; ++i) {
    const int64_t start = data_sample_start(i, num_tokens, S, order);
    EXPECT_EQ(start % S, 0) << "sample " << i << " is not at a window's start";
    EXPECT_LE(start + S, num_tokens - 1 - tail) << "sample " << i << " reads the tail";
    windows.push_back(start / S);
  }
  return windows;
}

TEST(DataOrder, NamesReadBackAndOthersAreNone) {
  for (DataOrder order : {DataOrder::kShuffled, DataOrder::kSequential}) {
    EXPECT_EQ(data_order_from_name(data_order_name(order)), order);
  }
  EXPECT_EQ(data_order_from_name("random"), std::nullopt);
  EXPECT_EQ(data_order_from_name(""), std::nullopt);
}

TEST(DataOrder, WindowsAreTheWholeNonOverlappingOnes) {
  EXPECT_EQ(data_num_windows(17, 16), 1);  // one sample of S + 1 exactly
  EXPECT_EQ(data_num_windows(32, 16), 1);  // 15 tokens of tail
  EXPECT_EQ(data_num_windows(33, 16), 2);  // windows share their edge token
  EXPECT_EQ(data_num_windows(int64_t{1} << 40, 1), (int64_t{1} << 40) - 1);
  EXPECT_THROW(data_num_windows(16, 16), std::invalid_argument);
  EXPECT_THROW(data_num_windows(16, 0), std::invalid_argument);
}

// Every window exactly once in every epoch: small sizes, primes, powers of two and their
// neighbours (where the Feistel network's bit width changes), and 1.
TEST(DataOrder, EachEpochReadsEveryWindowOnce) {
  for (int64_t n : {1, 2, 3, 4, 5, 7, 8, 9, 13, 31, 32, 33, 97, 255, 256, 257, 1000, 4093, 65537}) {
    for (int64_t epoch : {0, 1, 2, 7}) {
      std::vector<int64_t> windows = epoch_windows(n, 4, epoch, shuffled(), /*tail=*/3);
      std::sort(windows.begin(), windows.end());
      for (int64_t w = 0; w < n; ++w) ASSERT_EQ(windows[w], w) << "n " << n << " epoch " << epoch;
    }
  }
}

// The bijection itself, over every position, at each bit width up to 14 and for huge domains.
TEST(DataOrder, PermuteIsABijectionOfItsDomain) {
  for (int bits = 1; bits <= 14; ++bits) {
    for (uint64_t n : {(uint64_t{1} << bits) - 1, uint64_t{1} << bits, (uint64_t{1} << bits) + 1}) {
      std::vector<bool> seen(n, false);
      for (uint64_t idx = 0; idx < n; ++idx) {
        const uint64_t w = data_window_permute(idx, n, 99);
        ASSERT_LT(w, n);
        ASSERT_FALSE(seen[w]) << "n " << n << ": " << w << " twice";
        seen[w] = true;
      }
    }
  }
  // Domains near 2^63 and 2^64: in range and distinct for the positions tried.
  for (uint64_t n : {(uint64_t{1} << 63) + 12345, ~uint64_t{0}}) {
    std::set<uint64_t> images;
    for (uint64_t idx = 0; idx < 2000; ++idx) {
      const uint64_t w = data_window_permute(n - 1 - idx, n, 5);
      EXPECT_LT(w, n);
      images.insert(w);
    }
    EXPECT_EQ(images.size(), 2000u);
  }
  EXPECT_THROW(data_window_permute(5, 5, 0), std::invalid_argument);
}

TEST(DataOrder, EpochsAndSeedsGiveOtherOrders) {
  const int64_t n = 1000;
  const std::vector<int64_t> first = epoch_windows(n, 8, 0, shuffled());
  EXPECT_EQ(epoch_windows(n, 8, 0, shuffled()), first);  // same seed, same order
  EXPECT_NE(epoch_windows(n, 8, 1, shuffled()), first);
  EXPECT_NE(epoch_windows(n, 8, 2, shuffled()), epoch_windows(n, 8, 1, shuffled()));
  EXPECT_NE(epoch_windows(n, 8, 0, shuffled(kSeed + 1)), first);
  // Tiny files have few orders, but the epochs still draw among them.
  for (int64_t small : {2, 3, 5}) {
    std::set<std::vector<int64_t>> orders;
    for (int64_t epoch = 0; epoch < 12; ++epoch) {
      orders.insert(epoch_windows(small, 8, epoch, shuffled()));
    }
    EXPECT_GT(orders.size(), 1u) << small << " windows: every epoch in the same order";
  }
}

// Shuffled, a step's sequences come from all over the file: next samples are seldom next
// windows, and the first tenth of an epoch reaches every tenth of the file.
TEST(DataOrder, ShuffledSamplesAreNotConsecutiveWindows) {
  const int64_t n = 10000;
  const std::vector<int64_t> windows = epoch_windows(n, 16, 0, shuffled());
  int64_t next_windows = 0;
  for (int64_t i = 0; i + 1 < n; ++i) next_windows += windows[i + 1] == windows[i] + 1;
  EXPECT_LT(next_windows, 20);  // about 1 expected
  std::set<int64_t> tenths;
  for (int64_t i = 0; i < n / 10; ++i) tenths.insert(windows[i] * 10 / n);
  EXPECT_EQ(tenths.size(), 10u);
}

// sample(i) depends on i alone: any order of calls, any number of times, gives the same starts.
TEST(DataOrder, StartIsPureInTheSampleIndex) {
  const int64_t num_tokens = 12345;
  std::vector<int64_t> forward, backward;
  for (int64_t i = 0; i < 3000; ++i) {
    forward.push_back(data_sample_start(i, num_tokens, 8, shuffled()));
  }
  for (int64_t i = 2999; i >= 0; --i) {
    backward.push_back(data_sample_start(i, num_tokens, 8, shuffled()));
  }
  std::reverse(backward.begin(), backward.end());
  EXPECT_EQ(forward, backward);
  for (int64_t i : {2999, 0, 1542, 1542}) {
    EXPECT_EQ(data_sample_start(i, num_tokens, 8, shuffled()), forward[i]) << i;
  }
  EXPECT_THROW(data_sample_start(-1, num_tokens, 8, shuffled()), std::invalid_argument);
}

// The sequential order is the sampling of earlier versions: sample i at (i·S) mod (N − S),
// computed without overflow for indices whose product with S passes 2^64.
TEST(DataOrder, SequentialIsTheStrideOfEarlierVersions) {
  const SampleOrder sequential{DataOrder::kSequential, kSeed};
  for (int64_t num_tokens : {17, 100, 3363299}) {
    for (int S : {1, 9, 10, 16}) {
      if (num_tokens <= S) continue;
      for (int64_t i : {int64_t{0}, int64_t{1}, int64_t{13}, int64_t{89}, int64_t{90},
                        int64_t{1000000000000007}, INT64_MAX}) {
        const auto old = static_cast<int64_t>(static_cast<unsigned __int128>(i) * S %
                                              static_cast<uint64_t>(num_tokens - S));
        EXPECT_EQ(data_sample_start(i, num_tokens, S, sequential), old) << num_tokens << " " << i;
      }
    }
  }
}

// A shard whose token at offset p is p: a sample's first token is its start.
std::string position_shard(const TempDir& dir, int num_tokens) {
  std::vector<uint16_t> tokens(num_tokens);
  for (int p = 0; p < num_tokens; ++p) tokens[p] = static_cast<uint16_t>(p);
  const std::string path = dir.file("positions.bin");
  token_shard_write(path, tokens);
  return path;
}

TEST(DataOrder, FileSourcesReadTheWindowTheirOrderNames) {
  TempDir dir;
  const int S = 16, num_tokens = 1000;  // 62 windows and a tail of 7
  const std::string path = position_shard(dir, num_tokens);
  const FileTokenSource source = FileTokenSource::open_shard(path, 1024, S, {}, shuffled());
  const auto opened = token_source_open("tokens:" + path, 1024, S, kSeed, {}, DataOrder::kShuffled);
  EXPECT_EQ(source.private_bytes(), 0);  // no table: the bijection is computed per sample
  std::vector<int32_t> sample(S + 1), again(S + 1);
  std::vector<int32_t> starts;
  for (int64_t i = 0; i < 62; ++i) {
    source.sample(i, S, sample.data());
    const int64_t start = data_sample_start(i, num_tokens, S, shuffled());
    for (int pos = 0; pos <= S; ++pos) ASSERT_EQ(sample[pos], start + pos) << i;
    opened->sample(i, S, again.data());
    EXPECT_EQ(again, sample);
    starts.push_back(sample[0]);
  }
  std::sort(starts.begin(), starts.end());
  for (int w = 0; w < 62; ++w) EXPECT_EQ(starts[w], w * S);
  // The default is the file's order, as before --data-order.
  FileTokenSource::open_shard(path, 1024, S).sample(5, S, sample.data());
  EXPECT_EQ(sample[0], 5 * S);
  // Raw text, the same windows.
  const std::string text = dir.file("a.txt");
  std::string bytes(1000, '\0');
  for (int p = 0; p < 1000; ++p) bytes[p] = static_cast<char>(p % 251);
  std::ofstream(text, std::ios::binary) << bytes;
  const FileTokenSource text_source = FileTokenSource::open_text(text, 256, S, shuffled());
  for (int64_t i : {0, 1, 61, 62, 500}) {
    text_source.sample(i, S, sample.data());
    EXPECT_EQ(sample[0], data_sample_start(i, 1000, S, shuffled()) % 251) << i;
  }
}

// The synthetic source's samples are independent draws: the order leaves them as they are.
TEST(DataOrder, SyntheticDataIgnoresTheOrder) {
  std::vector<int32_t> a(17), b(17);
  token_source_open("synthetic", 64, 16, 7, {}, DataOrder::kShuffled)->sample(3, 16, a.data());
  token_source_open("synthetic", 64, 16, 7, {}, DataOrder::kSequential)->sample(3, 16, b.data());
  EXPECT_EQ(a, b);
}

}  // namespace
}  // namespace moe

// The programs' operator new (runtime/run/cache_line_new.cpp, linked into every test): a block of a
// page or more starts on a 64-byte cache line, whatever was allocated before it; smaller blocks
// keep malloc's alignment; a request no allocator can meet throws std::bad_alloc.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <memory>
#include <new>
#include <vector>

namespace moe {
namespace {

bool on_cache_line(const void* p) {
  return reinterpret_cast<std::uintptr_t>(p) % 64 == 0;
}

TEST(CacheLineNew, BlocksOfAPageOrMoreStartOnACacheLine) {
  std::vector<std::unique_ptr<char[]>> small;  // heap blocks in between, of odd sizes
  for (size_t floats : {1024u, 1025u, 3000u, 65536u, 1u << 22}) {
    for (int i = 0; i < 4; ++i) {
      small.emplace_back(new char[24 + 40 * i]);
      std::vector<float> v(floats);
      EXPECT_TRUE(on_cache_line(v.data())) << floats << " floats, try " << i;
      v.resize(2 * floats + 3);  // a reallocation too
      EXPECT_TRUE(on_cache_line(v.data())) << 2 * floats + 3 << " floats, try " << i;
    }
  }
  std::unique_ptr<char[]> bytes(new char[4096]);
  EXPECT_TRUE(on_cache_line(bytes.get()));
  // Smaller blocks: malloc's own alignment, at least 16 bytes.
  std::vector<double> little(3);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(little.data()) % 16, 0u);
}

TEST(CacheLineNew, AnImpossibleRequestThrowsBadAlloc) {
  const size_t too_many = std::numeric_limits<size_t>::max() / 2;
  EXPECT_THROW((void)std::make_unique<char[]>(too_many), std::bad_alloc);
}

}  // namespace
}  // namespace moe

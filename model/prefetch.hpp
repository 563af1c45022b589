// Cache hints for data the next piece of work reads or writes where the hardware's prefetchers
// would fetch it late: rows in an order of their own, blocks walked column by column. A hint
// changes no value, only when a cache line arrives.
#pragma once

#include <cstddef>

namespace moe {

// Asks for the cache lines of the n values at p, to be read (kWrite = 1: written) soon.
template <int kWrite = 0, class T> inline void prefetch_values(const T* p, size_t n) {
  for (size_t c = 0; c < n; c += 64 / sizeof(T)) __builtin_prefetch(p + c, kWrite, 3);
}

}  // namespace moe

// The programs' operator new: a block of a page (4 KiB) or more starts on a cache line.
//
// malloc returns 16-byte aligned memory, and a large block (one it maps with mmap) starts 16 bytes
// past a page: a 64-byte vector store into such a buffer spans two cache lines, each written in
// part. The model's buffers (activations, scratch, parameters and their gradients and moments,
// the GEMM's packed panels) are std::vectors of a page or more, so every one of the GEMMs' and the
// elementwise kernels' full-width stores did that. Aligned, deepseek4-tiny's step is about 3%
// faster at 1 rank and at 8 (docs/performance.md, "a fifteenth day"). Alignment moves no value: the
// bits are the same.
//
// Linked into the programs (moe_rt, the benchmarks) and the tests, as an object library: a
// replacement operator new must be part of the executable. Smaller blocks come from malloc as
// before; operator delete stays the library's, which frees both kinds (aligned_alloc's blocks are
// freed with free).
#include <cstddef>
#include <cstdlib>
#include <new>

namespace {

constexpr std::size_t kCacheLineBytes = 64;
// Blocks from this size on start on a cache line (rounded up to whole lines).
constexpr std::size_t kLineAlignedFromBytes = 4096;

void* allocate(std::size_t n) {
  if (n >= kLineAlignedFromBytes) {
    return std::aligned_alloc(kCacheLineBytes,
                              (n + kCacheLineBytes - 1) / kCacheLineBytes * kCacheLineBytes);
  }
  return std::malloc(n != 0 ? n : 1);
}

}  // namespace

// As the standard's operator new: on failure the new-handler, if any, then another try; without
// one, std::bad_alloc.
void* operator new(std::size_t n) {
  for (;;) {
    if (void* p = allocate(n)) return p;
    const std::new_handler handler = std::get_new_handler();
    if (handler == nullptr) throw std::bad_alloc();
    handler();
  }
}

void* operator new[](std::size_t n) {
  return ::operator new(n);
}

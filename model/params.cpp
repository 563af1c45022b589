// ParamLayout bookkeeping and name-keyed initialisation.
#include "model/params.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "model/parallel.hpp"
#include "model/rng.hpp"
#include "model/simd.hpp"

namespace moe {

namespace {

// p[i] = init_std · N(0, 1) at counter first + i of `stream`, i < n, rounded to T: rng_normal's
// bits through its branch-free lanes, so that each level's loop vectorises.
template <class T>
[[gnu::always_inline]] inline void normal_fill_impl(T* p, uint64_t stream, uint64_t first,
                                                    int64_t n, float init_std) {
  for (int64_t i = 0; i < n; ++i) {
    p[i] = static_cast<T>(init_std * rng_normal_lanes(stream, first + static_cast<uint64_t>(i)));
  }
}
MOE_SIMD_KERNEL(normal_fill_f32, normal_fill_impl<float>,
                (float* p, uint64_t stream, uint64_t first, int64_t n, float init_std),
                (p, stream, first, n, init_std))
MOE_SIMD_KERNEL(normal_fill_f64, normal_fill_impl<double>,
                (double* p, uint64_t stream, uint64_t first, int64_t n, float init_std),
                (p, stream, first, n, init_std))

void normal_fill(float* p, uint64_t stream, uint64_t first, int64_t n, float init_std) {
  normal_fill_f32(p, stream, first, n, init_std);
}
void normal_fill(double* p, uint64_t stream, uint64_t first, int64_t n, float init_std) {
  normal_fill_f64(p, stream, first, n, init_std);
}

}  // namespace

size_t ParamLayout::add(const std::string& name, size_t count, ParamInit init, float init_std,
                        bool weight_decay) {
  for (const ParamEntry& e : entries) {
    if (e.name == name) throw std::invalid_argument("ParamLayout: duplicate tensor " + name);
  }
  entries.push_back(ParamEntry{name, num_elements, count, init, init_std, weight_decay});
  num_elements += count;
  return entries.back().offset;
}

const ParamEntry& ParamLayout::find(const std::string& name) const {
  for (const ParamEntry& e : entries) {
    if (e.name == name) return e;
  }
  throw std::out_of_range("ParamLayout: no tensor named " + name);
}

template <class T>
void param_init_range(std::span<T> data, const ParamLayout& layout, uint64_t seed, size_t first,
                      size_t end) {
  if (data.size() != layout.num_elements) {
    throw std::invalid_argument("param_init: arena holds " + std::to_string(data.size()) +
                                " elements, layout needs " + std::to_string(layout.num_elements));
  }
  if (first > end || end > data.size()) {
    throw std::invalid_argument("param_init_range: [" + std::to_string(first) + ", " +
                                std::to_string(end) + ") is not inside the arena's " +
                                std::to_string(data.size()) + " elements");
  }
  // Each value a function of (seed, name, index) alone, so the tensors go to the model's threads
  // as tasks with the same bits in any order (a start spends most of its time here: many small
  // tensors, an expert's matrices each its own), and any range of them has the bits the whole
  // arena's initialisation gives there.
  parallel_tasks(static_cast<int64_t>(layout.entries.size()), [&](int64_t task) {
    const ParamEntry& e = layout.entries[static_cast<size_t>(task)];
    const size_t lo = std::max(first, e.offset), hi = std::min(end, e.offset + e.count);
    if (lo >= hi) return;
    T* p = data.data() + e.offset;
    switch (e.init) {
      case ParamInit::kOnes:
        std::fill(p + (lo - e.offset), p + (hi - e.offset), T(1));
        break;
      case ParamInit::kZeros:
        std::fill(p + (lo - e.offset), p + (hi - e.offset), T(0));
        break;
      case ParamInit::kNormal: {
        const size_t at = lo - e.offset;
        normal_fill(p + at, rng_stream(seed, e.name), at, static_cast<int64_t>(hi - lo),
                    e.init_std);
        break;
      }
    }
  });
}

template <class T> void param_init(std::span<T> data, const ParamLayout& layout, uint64_t seed) {
  param_init_range(data, layout, seed, 0, data.size());
}

template void param_init<float>(std::span<float>, const ParamLayout&, uint64_t);
template void param_init<double>(std::span<double>, const ParamLayout&, uint64_t);
template void param_init_range<float>(std::span<float>, const ParamLayout&, uint64_t, size_t,
                                      size_t);
template void param_init_range<double>(std::span<double>, const ParamLayout&, uint64_t, size_t,
                                       size_t);

}  // namespace moe

// ParamLayout bookkeeping and name-keyed initialisation.
#include "model/params.hpp"

#include <algorithm>
#include <stdexcept>

#include "model/parallel.hpp"
#include "model/rng.hpp"

namespace moe {

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

template <class T> void param_init(std::span<T> data, const ParamLayout& layout, uint64_t seed) {
  if (data.size() != layout.num_elements) {
    throw std::invalid_argument("param_init: arena holds " + std::to_string(data.size()) +
                                " elements, layout needs " + std::to_string(layout.num_elements));
  }
  // Each value a function of (seed, name, index) alone, so the tensors go to the model's threads
  // as tasks with the same bits in any order (a start spends most of its time here: many small
  // tensors, an expert's matrices each its own).
  parallel_tasks(static_cast<int64_t>(layout.entries.size()), [&](int64_t task) {
    const ParamEntry& e = layout.entries[static_cast<size_t>(task)];
    T* p = data.data() + e.offset;
    switch (e.init) {
      case ParamInit::kOnes:
        std::fill(p, p + e.count, T(1));
        break;
      case ParamInit::kZeros:
        std::fill(p, p + e.count, T(0));
        break;
      case ParamInit::kNormal: {
        const uint64_t stream = rng_stream(seed, e.name);
        for (size_t i = 0; i < e.count; ++i) {
          p[i] = static_cast<T>(e.init_std * rng_normal(stream, i));
        }
        break;
      }
    }
  });
}

template void param_init<float>(std::span<float>, const ParamLayout&, uint64_t);
template void param_init<double>(std::span<double>, const ParamLayout&, uint64_t);

}  // namespace moe

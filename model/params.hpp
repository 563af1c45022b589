// Parameter arenas (STYLE.md): a layout lists named tensors with their offsets in one flat array;
// the arena's storage, its gradient and its optimizer state all share that layout, so zeroing is
// one fill and AdamW is one flat loop. Replicated (dense) parameters and expert parameters live in
// separate arenas because they are all-reduced over different rank groups.
//
// Initialisation depends only on the seed and the tensor's name: element i of tensor "name" is
// init_std · N(0,1) drawn from rng_stream(seed, name) at counter i. Each expert is its own tensor
// ("layers.3.moe.experts.5.w1"), so a rank owning experts 4..5 generates exactly the values a
// one-rank run generates for those experts.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace moe {

enum class ParamInit { kNormal, kOnes, kZeros };

struct ParamEntry {
  std::string name;
  size_t offset = 0;  // first element in the arena
  size_t count = 0;   // elements
  ParamInit init = ParamInit::kNormal;
  float init_std = 0.0f;     // for kNormal
  bool weight_decay = true;  // false for norms (decoupled decay skips them)
};

// The tensors of one arena, in order.
struct ParamLayout {
  std::vector<ParamEntry> entries;
  size_t num_elements = 0;

  // Appends a tensor and returns its offset. Names must be unique within the layout.
  size_t add(const std::string& name, size_t count, ParamInit init, float init_std = 0.0f,
             bool weight_decay = true);
  const ParamEntry& find(const std::string& name) const;  // throws std::out_of_range
};

// Fills `data` ([layout.num_elements]) with every tensor's initial values.
template <class T> void param_init(std::span<T> data, const ParamLayout& layout, uint64_t seed);
// The same values for the elements [first, end) of the arena only (a rank's share, the others
// gathered after); the rest of `data` is left as it is.
template <class T>
void param_init_range(std::span<T> data, const ParamLayout& layout, uint64_t seed, size_t first,
                      size_t end);

}  // namespace moe

// checkpoint_save and checkpoint_load: a Trainer's state to and from a checkpoint file. Datasets:
// param/<tensor>, adam_m/<tensor>, adam_v/<tensor> for every tensor of both arenas (expert
// tensors "layers.<l>.moe.experts.<global id>.w1|w3|w2"), routing/bias [L·E] (flat) and
// routing/hash_tables [L_h, V, K]. docs/checkpoints.md.
#include "runtime/checkpoint.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <utility>
#include <vector>

#include "model/router.hpp"

namespace moe {
namespace {

constexpr std::array<const char*, 3> kArrays = {"param/", "adam_m/", "adam_v/"};

// Writes the tensors of `layout` from the three arrays at `base` (parameters, m, v).
void write_arena(CheckpointWriter& w, const ParamLayout& layout,
                 const std::array<const float*, 3>& base) {
  for (int a = 0; a < 3; ++a) {
    for (const ParamEntry& e : layout.entries) {
      w.write_floats(kArrays[a] + e.name, std::span<const float>(base[a] + e.offset, e.count));
    }
  }
}

void read_arena(const CheckpointReader& r, const ParamLayout& layout,
                const std::array<std::span<float>, 3>& arrays) {
  for (int a = 0; a < 3; ++a) {
    for (const ParamEntry& e : layout.entries) {
      r.read_floats(kArrays[a] + e.name, arrays[a].subspan(e.offset, e.count));
    }
  }
}

// Rank 0's part: the header, the dense arena, every EP rank's experts from `gathered` (the three
// arrays one after the other, each [all experts of EP group 0] in EP rank order), the routing.
void write_file(const std::string& path, const CheckpointHeader& h, const TrainState& s,
                const std::vector<float>& gathered, const std::vector<int>& displs) {
  const ModelConfig& mc = *s.model;
  CheckpointWriter w(path, h);
  write_arena(w, s.layout->dense, {s.dense.data(), s.dense_m.data(), s.dense_v.data()});
  const size_t total = gathered.size() / 3;
  for (int q = 0; q < s.placement.ep_size; ++q) {
    const ParamLayout experts = model_layout(mc, s.placement, q).experts;
    const float* base = gathered.data() + displs[q];
    write_arena(w, experts, {base, base + total, base + 2 * total});
  }
  const RoutingState& rs = *s.routing;
  w.write_floats("routing/bias", rs.bias);
  w.write_ints("routing/hash_tables",
               {hsize_t(mc.hash_layers), hsize_t(mc.vocab), hsize_t(mc.top_k)}, rs.hash_tables);
  w.commit();
}

}  // namespace

void checkpoint_save(const std::string& path, const CheckpointHeader& h, const TrainState& s,
                     const Comm& world) {
  // EP group 0 (world rank 0 is its EP rank 0): its members own every expert exactly once.
  const int P = s.placement.ep_size;
  std::vector<float> gathered;
  std::vector<int> counts, displs;
  if (s.ep_group == 0) {
    // Sizes per EP rank, from the layouts rank 0 can compute for any EP rank.
    if (world.rank() == 0) {
      counts.resize(P);
      displs.resize(P);
      int offset = 0;
      for (int q = 0; q < P; ++q) {
        counts[q] = static_cast<int>(model_layout(*s.model, s.placement, q).experts.num_elements);
        displs[q] = offset;
        offset += counts[q];
      }
      gathered.resize(3 * static_cast<size_t>(offset));
    }
    const size_t total = gathered.size() / 3;
    const std::span<float> all(gathered);
    for (int a = 0; a < 3; ++a) {
      const std::span<float> local = a == 0 ? s.experts : a == 1 ? s.experts_m : s.experts_v;
      s.ep->gatherv(std::span<const float>(local),
                    world.rank() == 0 ? all.subspan(a * total, total) : std::span<float>(),
                    std::span<const int>(counts), std::span<const int>(displs), 0);
    }
  }
  std::string error;
  if (world.rank() == 0) {
    try {
      write_file(path, h, s, gathered, displs);
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  std::vector<int> failed = {error.empty() ? 0 : 1};
  world.broadcast(std::span<int>(failed), 0);
  if (failed[0] == 0) return;
  throw CheckpointError(world.rank() == 0 ? error
                                          : "rank 0 failed to write checkpoint '" + path + "'");
}

void checkpoint_load(const CheckpointReader& r, const TrainState& s) {
  read_arena(r, s.layout->dense, {s.dense, s.dense_m, s.dense_v});
  read_arena(r, s.layout->experts, {s.experts, s.experts_m, s.experts_v});
  r.read_floats("routing/bias", s.routing->bias);
  r.read_ints("routing/hash_tables", s.routing->hash_tables);
  // The checksums say the bytes are those written; what they say is checked as a file reader
  // checks its input, before the run replaces anything (its statistics file included).
  auto fail = [&](const std::string& problem) {
    throw CheckpointError("checkpoint '" + r.path() + "': " + problem);
  };
  const std::array<const char*, 3> kinds = {"parameter", "AdamW first moment",
                                            "AdamW second moment"};
  for (const auto& [layout, arrays] :
       {std::pair{s.layout->dense, std::array{s.dense, s.dense_m, s.dense_v}},
        std::pair{s.layout->experts, std::array{s.experts, s.experts_m, s.experts_v}}}) {
    for (int a = 0; a < 3; ++a) {
      for (const ParamEntry& e : layout.entries) {
        const std::span<const float> values = arrays[a].subspan(e.offset, e.count);
        const auto bad = std::find_if(values.begin(), values.end(), [a](float v) {
          return !std::isfinite(v) || (a == 2 && v < 0.0f);  // v is a mean of squares
        });
        if (bad != values.end()) {
          fail(std::string(kArrays[a]) + e.name + " holds " +
               (a == 2 && std::isfinite(*bad) ? "a negative" : "a non-finite") + " " + kinds[a] +
               " (" + std::to_string(*bad) + " at element " + std::to_string(bad - values.begin()) +
               ")");
        }
      }
    }
  }
  const std::vector<float>& bias = s.routing->bias;
  if (const auto bad =
          std::find_if(bias.begin(), bias.end(), [](float v) { return !std::isfinite(v); });
      bad != bias.end()) {
    fail("routing/bias holds a non-finite value at element " + std::to_string(bad - bias.begin()));
  }
  const ModelConfig& mc = *s.model;
  const size_t table = static_cast<size_t>(mc.vocab) * mc.top_k;
  for (int l = 0; l < mc.hash_layers; ++l) {
    try {
      hash_table_validate(&s.routing->hash_tables[l * table], mc.vocab, mc.experts, mc.top_k);
    } catch (const std::exception& e) {
      fail("routing/hash_tables, layer " + std::to_string(l) + ": " + e.what());
    }
  }
}

}  // namespace moe

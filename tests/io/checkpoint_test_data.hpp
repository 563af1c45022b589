// The checkpoints of the crash test, without GoogleTest (checkpoint_writer_child.cpp writes them,
// test_checkpoint_crash.cpp checks them): every header field and every tensor value is a pure
// function of the step, so a checkpoint read back after a kill can be checked exactly against the
// step its header claims, and a tensor of one step in the file of another shows.
#pragma once

#include <hdf5.h>

#include <bit>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <string>
#include <vector>

#include "io/checkpoint_file.hpp"

namespace moe::checkpoint_test {

// A few MB a checkpoint, so that a kill at a random moment usually lands inside a write. The
// first tensor spans two chunks (the writer's chunks hold 2^20 floats).
struct FloatTensor {
  const char* name;
  size_t count;
};
inline constexpr FloatTensor kFloatTensors[] = {
    {"param/embed", 1'100'000},
    {"param/layers.0.moe.experts.3.w1", 200'000},
    {"adam_m/layers.0.moe.experts.3.w1", 200'000},
    {"routing/bias", 24},
};
inline constexpr int kNumFloatTensors = static_cast<int>(std::size(kFloatTensors));
inline constexpr const char* kTableName = "routing/hash_tables";
inline const std::vector<hsize_t> kTableDims = {2, 1000, 4};  // [L_h, V, K]
inline constexpr size_t kTableCount = 2 * 1000 * 4;

// splitmix64: a well-mixed 64-bit function of (step, tensor, element).
inline uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
inline uint64_t key(int64_t step, int tensor, size_t i) {
  return mix((static_cast<uint64_t>(step) << 40) ^ (static_cast<uint64_t>(tensor) << 32) ^ i);
}

// Floats in [1, 2) with a random mantissa: finite, and different from step to step.
inline std::vector<float> float_values(int64_t step, int tensor) {
  std::vector<float> v(kFloatTensors[tensor].count);
  for (size_t i = 0; i < v.size(); ++i) {
    v[i] = std::bit_cast<float>(0x3F800000u | static_cast<uint32_t>(key(step, tensor, i) >> 41));
  }
  return v;
}

inline std::vector<int32_t> table_values(int64_t step) {
  std::vector<int32_t> v(kTableCount);
  for (size_t i = 0; i < v.size(); ++i) {
    v[i] = static_cast<int32_t>(static_cast<uint32_t>(key(step, kNumFloatTensors, i)));
  }
  return v;
}

inline constexpr const char* kRunId = "0123456789abcdef";  // header_of_step's run

inline CheckpointHeader header_of_step(int64_t step) {
  CheckpointHeader h;
  h.step = step;
  h.global_batch = 8 + step;
  h.world_size = 2;
  h.ep_size = 2;
  h.seed = 0xFFFFFFFF00000000ull + static_cast<uint64_t>(step);
  h.model = "crash-test";
  h.config_text = "steps = " + std::to_string(step + 1) + "\n";
  h.program_version = "moe_rt test";
  h.created = "2026-01-02T03:04:05+00:00";
  h.stats_path = "/runs/crash-" + std::to_string(step) + ".h5";
  h.data_description = "synthetic: step " + std::to_string(step);
  h.data_checksum = "00112233445566" + std::to_string(10 + step % 90);
  h.run_id = kRunId;
  h.run_started = 1767323045000000001;
  h.lineage = "00000000000000aa@3;00000000000000ab@5";
  return h;
}

// The checkpoint of `step` in `dir`, committed; pruning is the caller's. `h` replaces the header
// of header_of_step when given; the name is checkpoint_path_for's for its run.
inline void write_checkpoint(const std::string& dir, int64_t step,
                             const CheckpointHeader* h = nullptr) {
  const CheckpointHeader header = h != nullptr ? *h : header_of_step(step);
  CheckpointWriter w(checkpoint_path_for(dir, step, header.run_id), header);
  for (int t = 0; t < kNumFloatTensors; ++t) {
    w.write_floats(kFloatTensors[t].name, float_values(step, t));
  }
  w.write_ints(kTableName, kTableDims, table_values(step));
  w.commit();
}

}  // namespace moe::checkpoint_test

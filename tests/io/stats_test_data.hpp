// The data of the HDF5 statistics-file tests, without GoogleTest (stats_writer_child.cpp uses it
// too): a small header, the distinct values of each step's row and trace (RowData, TraceData),
// and write_rows.
// Legend: N rows, L layers, E experts, K top-k, V vocabulary, W ranks, T traced tokens.
#pragma once

#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "io/stats_writer.hpp"

namespace moe::stats_test {

inline constexpr int kL = 3, kLh = 1, kE = 4, kK = 2, kV = 5, kW = 2, kT = 4;

// A valid header for the fixture sizes; trace_tokens = 0 turns tracing off, hash_layers = 0
// leaves every layer on top-k routing.
inline StatsHeader test_header(int trace_tokens = kT, int hash_layers = kLh) {
  StatsHeader h;
  h.model = "deepseek4-tiny";
  h.config_text = "model = \"deepseek4-tiny\"\n\n[architecture]\nlayers = 3\n";
  h.program_version = "moe_rt 0.1.0";
  h.data_description = "synthetic: zipf";
  h.created = "2026-01-02T03:04:05+00:00";
  h.world_size = kW, h.ep_size = 2, h.num_layers = kL, h.num_experts = kE, h.top_k = kK;
  h.vocab = kV, h.hash_layers = hash_layers, h.seq_len = 16, h.batch_per_rank = 1;
  h.seed = 0xFEEDFACECAFEBEEFull;
  h.entropy_floor = std::nan("");
  h.layer_routing = {"hash", "topk", "topk"};
  if (hash_layers == 0) h.layer_routing[0] = "topk";
  for (int i = 0; i < hash_layers * kV * kK; ++i) h.hash_tables.push_back(i % kE);
  h.phase_names = {"attention", "router", "dispatch"};
  h.trace_tokens = trace_tokens;
  return h;
}

inline constexpr int kNumPhases = 3;

// The values of step `s`, each field distinct, and a StepRow viewing them.
struct RowData {
  int64_t s;
  std::vector<int64_t> expert_load, rank_load;  // [L, E], [L, W]
  std::vector<float> bias;                      // [L, E]
  std::vector<double> per_layer;    // [6, L]: variance, violation, cv, overload, loss, z-loss
  std::vector<double> phase_times;  // [W, num_phases]
  std::vector<int64_t> dispatch_rows, cross_host_rows, cross_host_tokens;  // [L] each
  std::vector<int64_t> dropped;                                            // [L, E]
  std::vector<int32_t> source_expert_load;                                 // [L, W, E]
  explicit RowData(int64_t step) : s(step) {
    for (int i = 0; i < kL * kE; ++i) expert_load.push_back(s * 100 + i);
    for (int i = 0; i < kL * kW; ++i) rank_load.push_back(s * 10 + i + 7);
    for (int i = 0; i < kL * kE; ++i) bias.push_back(0.5f * s - 0.25f * i);
    for (int i = 0; i < 6 * kL; ++i) per_layer.push_back(s + 0.125 * i);
    for (int i = 0; i < kW * kNumPhases; ++i) phase_times.push_back(0.001 * (s + 1) * (i + 1));
    for (int i = 0; i < kL; ++i) dispatch_rows.push_back(s * 1000 + 32);
    for (int i = 0; i < kL; ++i) cross_host_rows.push_back(s * 3 + i);
    for (int i = 0; i < kL; ++i) cross_host_tokens.push_back(s * 2 + i);
    for (int i = 0; i < kL * kE; ++i) dropped.push_back(s * 7 + i % 3);
    for (int i = 0; i < kL * kW * kE; ++i) {
      source_expert_load.push_back(static_cast<int32_t>(s * 11 + i));
    }
  }
  std::span<const double> layer_field(int f) const {
    return std::span<const double>(per_layer).subspan(f * kL, kL);
  }
  StepRow row() const {
    return StepRow{s,
                   2.5 + s,
                   0.01 * s,
                   1.0 + s,
                   1e-3,
                   1000.0 * (s + 1),
                   0.25,
                   expert_load,
                   rank_load,
                   bias,
                   layer_field(0),
                   layer_field(1),
                   layer_field(2),
                   layer_field(3),
                   layer_field(4),
                   phase_times,
                   dispatch_rows,
                   cross_host_rows,
                   cross_host_tokens,
                   0.002 * s,
                   layer_field(5),
                   {},
                   {},
                   {},
                   dropped,
                   source_expert_load};
  }
};

// The traced routing of step `s`.
struct TraceData {
  int64_t s;
  std::vector<int32_t> token_id, position, rank, experts;  // [T], [T], [T], [L, T, K]
  std::vector<float> weights;                              // [L, T, K]
  std::vector<int32_t> experts_unbiased;                   // [L, T, K]
  explicit TraceData(int64_t step) : s(step) {
    for (int t = 0; t < kT; ++t) {
      token_id.push_back(static_cast<int32_t>(s + t));
      position.push_back(t);
      rank.push_back(t % kW);
    }
    for (int i = 0; i < kL * kT * kK; ++i) {
      experts.push_back((i + static_cast<int>(s)) % kE);
      weights.push_back(0.5f + 0.01f * i);
      experts_unbiased.push_back((i + 1 + static_cast<int>(s)) % kE);
    }
  }
  TraceRow row() const {
    return TraceRow{s, token_id, position, rank, experts, weights, experts_unbiased};
  }
};

// Appends the rows of steps [first, last).
inline void write_rows(StatsWriter& w, int64_t first, int64_t last) {
  for (int64_t s = first; s < last; ++s) w.append(RowData(s).row());
}

}  // namespace moe::stats_test

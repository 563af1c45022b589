// AdamW with decoupled weight decay over one parameter arena, the learning-rate schedule, and the
// squared gradient norm used by global clipping. The arena's layout says which tensors decay
// (norm weights do not); moments mirror the parameters, so the update is one flat pass per tensor.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "model/params.hpp"

namespace moe {

struct AdamWConfig {
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.1f;
};

struct AdamWState {
  std::vector<float> m, v;  // [arena elements] first and second moments
};

void adamw_state_init(AdamWState& state, size_t num_elements);

// One AdamW update at 1-based `step` with learning rate `lr`; gradients are multiplied by
// `grad_scale` first (global-norm clipping). Decay is lr·weight_decay·param, decoupled from Adam.
void adamw_update(std::span<float> params, std::span<const float> grads, AdamWState& state,
                  const ParamLayout& layout, const AdamWConfig& cfg, float lr, float grad_scale,
                  int64_t step);
// The same update of the arena's elements [begin, end) only (a rank's share of replicated
// parameters): each element's arithmetic is the one adamw_update gives it.
void adamw_update_range(std::span<float> params, std::span<const float> grads, AdamWState& state,
                        const ParamLayout& layout, const AdamWConfig& cfg, float lr,
                        float grad_scale, int64_t step, size_t begin, size_t end);

// Linear warmup over `warmup` steps to lr_max, then cosine decay to lr_max·min_ratio at the last
// step. `step` is 0-based; total is the number of steps of the run.
float lr_at_step(int64_t step, int64_t total, int64_t warmup, float lr_max, float min_ratio);

// Σ g² accumulated in double: over chunks fixed by the size alone (sum_squares_chunks), each
// summed by sum_squares_chunk, the chunks' sums added in order from 0.
double sum_squares(std::span<const float> values);
struct SumSquaresChunks {
  size_t size = 0;   // values per chunk (the last may hold fewer)
  size_t count = 0;  // chunks
};
SumSquaresChunks sum_squares_chunks(size_t num_values);
// Chunk c's sum of squares.
double sum_squares_chunk(std::span<const float> values, const SumSquaresChunks& chunks, size_t c);
// The chunks' sums added as sum_squares adds them: in order, from chunk 0.
double sum_squares_add_chunks(std::span<const double> chunk_sums);

}  // namespace moe

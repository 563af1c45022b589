// One rank's batch of random token ids and next-token targets for a model config, drawn from
// (seed, position), and the ModelBatch that views them: the input of the whole-model tests.
// Legend: N = batch_per_rank·seq_len tokens, V vocabulary.
#pragma once

#include <cstdint>
#include <vector>

#include "model/model.hpp"
#include "model/rng.hpp"

namespace moe::testing_util {

struct RandomBatch {
  std::vector<int32_t> tokens, targets;  // [N] each, ids in [0, V)
  ModelBatch batch;                      // views tokens and targets; loss_scale = 1/N

  RandomBatch(const ModelConfig& c, uint64_t seed) {
    const int N = c.batch_per_rank * c.seq_len;
    const uint64_t stream = rng_stream(seed, "tokens");
    for (int i = 0; i < N; ++i) {
      tokens.push_back(static_cast<int32_t>(rng_below(stream, i, c.vocab)));
      targets.push_back(static_cast<int32_t>(rng_below(stream, N + i, c.vocab)));
    }
    batch.tokens = tokens.data();
    batch.targets = targets.data();
    batch.loss_scale = 1.0 / N;
    batch.num_global_sequences = c.batch_per_rank;
  }
  RandomBatch(const RandomBatch&) = delete;  // batch points into this object's vectors
  RandomBatch& operator=(const RandomBatch&) = delete;
};

}  // namespace moe::testing_util

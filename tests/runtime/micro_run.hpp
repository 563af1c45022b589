// The short micro run the training tests share: `steps` steps of the micro preset, a global
// batch of `global_batch` sequences over `world_size` ranks, one thread, no statistics file.
#pragma once

#include "runtime/options/options.hpp"
#include "runtime/options/presets.hpp"

namespace moe::testing_train {

inline RunConfig micro_run(int steps, int global_batch, int world_size) {
  RunConfig cfg;
  cfg.model_name = "micro";
  cfg.model = preset_model("micro");
  cfg.model.batch_per_rank = global_batch / world_size;
  cfg.steps = steps;
  cfg.lr = 3e-3;
  cfg.warmup_steps = 2;
  cfg.threads = 1;
  cfg.stats_path = kNoStats;
  return cfg;
}

}  // namespace moe::testing_train

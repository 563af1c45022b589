// What rank 0 prints: the configuration table at start, one fixed-column line per step, and the
// summary at the end.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "model/model.hpp"
#include "runtime/options/options.hpp"
#include "runtime/output/records.hpp"

namespace moe {

struct RunShape {
  int world_size = 1, ep_size = 1, threads = 1;
  size_t dense_params = 0, expert_params = 0;  // expert_params: every expert once
  ModelMemory memory;                          // one rank's, model_memory_estimate
  std::string data, val_data, stats_path;      // val_data: "" without --val-data
  int64_t data_private_bytes = 0;              // TokenSource::private_bytes, counted per rank
  int64_t data_mapped_bytes = 0;               // TokenSource::mapped_bytes, page cache
  std::string layout;                          // host_layout_describe: ranks, hosts, EP groups
};

void report_config(const RunConfig& cfg, const RunShape& shape);
// `val_column`: the table has the val_loss column; `eval` (may be null): the validation loss
// measured after this step.
// One line of the step table; `eta_seconds`: the time the run's remaining steps should take.
void report_step(const StepRecord& rec, double eta_seconds, bool val_column = false,
                 const EvalRecord* eval = nullptr);
// A step table's remaining time: "42s", "3m05s", "2h10m" (one word, so the table splits).
std::string eta_text(double seconds);
void report_summary(const TrainSummary& summary, const std::string& stats_path);

// Sizes and times in the unit that fits: "512 B", "3.4 KiB", "130 MiB"; "0.42 ms", "38 ms",
// "74.8 s", "12 min 05 s".
std::string bytes_text(double bytes);
std::string seconds_text(double seconds);
// `text` as one POSIX shell word: as it is when it needs no quoting, else in single quotes.
std::string shell_quoted(const std::string& text);

}  // namespace moe

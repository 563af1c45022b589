// The HDF5 statistics file ("moe_rt.stats", format version 2), written by rank 0 only: a header
// (root attributes, the configuration as typed attributes, routing kinds, hash tables, phase
// names, units, descriptions and dimension scales: io/stats_schema.hpp) created once, then one row
// per step appended to chunked, extendible datasets and flushed, so that every completed step
// survives a crash and a SWMR reader sees rows appear while the run goes on; compressed at close.
// The layout, the guarantees and the measured chunk choice are documented in docs/hdf5-schema.md.
// Dimension legend: N steps written, M traced steps, L layers, L_h hash layers, E experts,
// K top-k, V vocabulary, W ranks, T traced tokens per traced step, num_phases timed phases.
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "io/hdf5_check.hpp"
#include "io/stats_types.hpp"

namespace moe {

// Everything known before the first step; becomes root attributes and the /layers, /perf/phases
// datasets. Invalid sizes throw std::invalid_argument naming the field.
struct StatsHeader {
  std::string model;        // preset name
  std::string config_text;  // full resolved configuration, as --print-config prints it
  std::vector<StatsConfigValue> config_values;  // typed /config; empty: typed by their form
  std::string program_version;                  // e.g. "moe_rt 0.1.0"
  std::string data_description;                 // TokenSource::describe()
  std::string created;             // ISO-8601 local time with offset, see stats_now_iso8601()
  int world_size = 1;              // W
  int ep_size = 1;                 // P (expert-parallel group size)
  std::vector<int32_t> rank_host;  // [W] host of each rank (/hosts/rank_host); empty: all on 0
  std::vector<uint8_t> placement;  // [L, P, E] 1 where EP rank q holds expert e in layer l
                                   // (/layers/placement); empty: not recorded
  int num_layers = 0;              // L
  int num_experts = 0;             // E
  int top_k = 0;                   // K
  int vocab = 0;                   // V
  int hash_layers = 0;             // L_h
  int seq_len = 0;                 // S
  int batch_per_rank = 0;          // B
  uint64_t seed = 0;               // --seed
  double entropy_floor = std::numeric_limits<double>::quiet_NaN();  // nats/token; NaN: unknown
  std::vector<std::string> layer_routing;  // [L] "hash" | "topk" | "forced"
  std::vector<int32_t> hash_tables;        // [L_h, V, K] expert ids
  std::vector<std::string> phase_names;    // [num_phases], at least one
  int trace_tokens = 0;                    // T; 0 = no /trace group
  bool eval = false;                       // validation rows: the /eval group
  std::string val_data_description;        // with eval: root attribute val_data
  // A resumed run: the statistics file of the run it continues (absolute path; "" when that run
  // kept none) and the last step of that file it keeps (its checkpoint's step); rows here start
  // at resumed_from_step + 1. Root attributes: resumed_from when not empty, resumed_from_step
  // when >= 0 (-1: not resumed).
  std::string resumed_from;
  int64_t resumed_from_step = -1;
  // The run that wrote this file (16 hex digits, as its checkpoints record it), and the run whose
  // checkpoint it resumed ("" when that checkpoint had no run id): a reader joining a chain checks
  // that the predecessor file is that run's. run_id is written whenever it is not empty,
  // resumed_from_run with resumed_from.
  std::string run_id;
  std::string resumed_from_run;
  // Shadow balancers' names (R of them, distinct, none containing '/'): a group /shadow/<name>
  // each, with per-step datasets expert_load [L, E], max_violation [L] and bias [L, E].
  std::vector<std::string> shadow_rules;
};

// One step, global values (already reduced over ranks).
struct StepRow {
  int64_t step = 0;
  double loss = 0, balance_loss = 0, grad_norm = 0, lr = 0, tokens_per_s = 0, step_time_s = 0;
  std::span<const int64_t> expert_load;          // [L, E]
  std::span<const int64_t> rank_load;            // [L, W] assignments received by each rank
  std::span<const float> bias;                   // [L, E] bias used for the step's routing
  std::span<const double> load_variance;         // [L]
  std::span<const double> max_violation;         // [L]
  std::span<const double> load_cv;               // [L]
  std::span<const double> rank_overload;         // [L]
  std::span<const double> layer_balance_loss;    // [L]
  std::span<const double> phase_times;           // [W, num_phases] seconds, per rank
  std::span<const int64_t> dispatch_rows;        // [L] assignments dispatched (T·K − dropped)
  std::span<const int64_t> cross_host_rows;      // [L] of them sent to a rank on another host
  std::span<const int64_t> cross_host_tokens;    // [L] (token, other host of its experts) pairs
  double z_loss = 0;                             // router z-loss added, summed over layers
  std::span<const double> layer_z_loss;          // [L]
  std::span<const int64_t> shadow_load;          // [R, L, E] global loads of each shadow's routing
  std::span<const float> shadow_bias;            // [R, L, E] the bias each shadow routed with
  std::span<const double> shadow_max_violation;  // [R, L]
  std::span<const int64_t>
      dropped;  // [L, E] assignments the token capacity dropped (in expert_load)
  std::span<const int32_t> source_expert_load;  // [L, W, E] assignments each rank's tokens sent to
                                                // each expert (dispatched: drops not counted)
};

// The routing of T traced tokens at one step.
struct TraceRow {
  int64_t step = 0;
  std::span<const int32_t> token_id;  // [T]
  std::span<const int32_t> position;  // [T] position within the sequence
  std::span<const int32_t> rank;      // [T] rank holding the token
  std::span<const int32_t> experts;   // [L, T, K] selected expert ids
  std::span<const float> weights;     // [L, T, K] combine weights
  // [L, T, K] the experts the unbiased scores would choose (top-k without the routing bias,
  // group limit included); the selected experts again in hash and forced layers.
  std::span<const int32_t> experts_unbiased;
};

// A validation loss after a training step, global values.
struct EvalRow {
  int64_t step = 0;                       // the training step it followed
  double loss = 0, time_s = 0;            // mean cross-entropy over the tokens; wall time
  int64_t tokens = 0;                     // validation tokens evaluated
  std::span<const int64_t> expert_load;   // [L, E]
  std::span<const double> load_variance;  // [L]
  std::span<const double> max_violation;  // [L]
  std::span<const int64_t> dropped;       // [L, E] of expert_load, dropped by the token capacity
};

// The live file's space is allocated in pages of this size, so that no metadata block smaller than
// a page straddles one: a kill during a flush cannot tear it (docs/hdf5-schema.md, "Crash safety").
inline constexpr int64_t kStatsFilePageBytes = 4096;

// Storage of the per-step datasets. The defaults are the measured choice (docs/hdf5-schema.md);
// tests and benchmarks may change them, the file layout stays the same. The live file stores every
// chunk unfiltered; the copy made at close applies the filters.
struct StatsStorage {
  int64_t chunk_bytes = 32 * 1024;  // target uncompressed bytes per chunk (rows: a power of two)
  int64_t max_chunk_rows = 1024;    // cap on rows per chunk
  int deflate_level = 4;            // 1..9 in the closed file; 0 = no deflate
  bool shuffle = true;              // byte-shuffle filter before deflate, in the closed file
  bool compact_on_close = true;     // rewrite the file compressed at close()
};

// The file's life on disk (docs/hdf5-schema.md, "Paths" and "Locks"): created as "<path>.new" and
// locked; put at <path> by publish(), replacing any file there; compacted and unlocked by close().
// A file a live writer holds is never replaced or removed by another writer, and a writer that
// never publishes leaves <path> as it was.
class StatsWriter {
 public:
  // Checks the output path, creating nothing: missing or non-directory parent, parent not
  // writable, path is a directory or not a regular file, a live writer (another run) holds the
  // file or is creating it, or an existing non-empty file without `overwrite` (the message then
  // names --overwrite). An existing empty file (a name reserved by stats_default_path) is replaced
  // without `overwrite`. A link to a file is followed. Throws StatsPathError.
  static void check_path(const std::string& path, bool overwrite);

  // check_path, then creates "<path>.new" (a killed writer's leftover "<path>.new" or
  // "<path>.compact" is removed first) with every dataset and the root attributes, and starts
  // SWMR write mode. Throws StatsPathError, std::invalid_argument (bad header) or Hdf5Error.
  StatsWriter(const std::string& path, bool overwrite, const StatsHeader& header,
              const StatsStorage& storage = {});
  StatsWriter(StatsWriter&&) noexcept;
  StatsWriter& operator=(StatsWriter&&) noexcept;
  StatsWriter(const StatsWriter&) = delete;
  StatsWriter& operator=(const StatsWriter&) = delete;
  ~StatsWriter();  // close(), reporting a failure on stderr instead of throwing

  // Renames the file to <path>, replacing the file there (which needs `overwrite` unless empty).
  // Call it once the run's set-up has succeeded: until then nothing at <path> changes. Throws
  // StatsPathError when another writer holds <path> (the file stays unpublished). Later calls do
  // nothing.
  void publish();

  // Appends one row to every /steps, /routing and /perf dataset, /steps/step last, flushing
  // before and after /steps/step (docs/hdf5-schema.md, "Crash safety"). Needs publish(). Wrong
  // span sizes throw std::invalid_argument before anything is written. An Hdf5Error (a full
  // disk) ends the writer: the file is closed, or removed when no append had completed, and the
  // error's message says which; further appends throw.
  void append(const StepRow& row);
  // Appends one row to every /trace dataset, /trace/step last. Needs trace_tokens > 0.
  void append_trace(const TraceRow& row);
  // Appends one row to every /eval dataset, /eval/step last. Needs eval in the header.
  void append_eval(const EvalRow& row);

  int64_t num_rows() const;        // N: rows of /steps/step
  int64_t num_trace_rows() const;  // M: rows of /trace/step
  int64_t num_eval_rows() const;   // rows of /eval/step
  const std::string& path() const;

  // Closes the file (ending SWMR write mode), then, with compact_on_close, rewrites it with the
  // per-step datasets compressed: copied to "<path>.compact", renamed over <path>. A failed
  // compaction leaves the complete, uncompacted file and warns on stderr. An unpublished file is
  // removed instead. Throws Hdf5Error if closing fails. The lock is released last. Later calls do
  // nothing; append then throws.
  void close();

  // After close(): true when <path> no longer named the file written (it was removed or replaced
  // during the run), which was then left alone.
  bool removed() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace moe

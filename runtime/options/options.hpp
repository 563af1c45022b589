// The run's configuration (docs/options.md): command-line and config-file parsing with
// Boost.Program_options (the command line) and config_file.hpp (the file), validation, and the
// resolved configuration as re-readable text.
// Precedence: command line > `--config FILE` > the preset chosen by `--model` (from the command
// line, else the file, else deepseek4-tiny). Every problem is a ConfigError naming the option.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "io/data_order.hpp"
#include "model/config.hpp"
#include "model/routing_config.hpp"

namespace moe {

inline constexpr const char* kDefaultModelName = "deepseek4-tiny";
inline constexpr const char* kNoStats = "none";    // --stats none: write no statistics file
inline constexpr const char* kNoValData = "none";  // --val-data none: no validation
inline constexpr int kMaxThreads = 1024;           // --threads above this is refused

// Where a resumed run continues from (options_parse fills it from the checkpoint's header).
struct ResumePoint {
  std::string checkpoint;    // the checkpoint file (a --resume directory resolved to its newest)
  int64_t step = -1;         // the checkpoint's last completed step; the run starts at step + 1
  int64_t global_batch = 0;  // sequences per step over all ranks
  std::string stats_path;    // the statistics file of the run that wrote it, "" for none
  std::string data_description;  // the data it trained on, as TokenSource::describe() said
  bool batch_given = false;      // --batch-per-rank was given for the resumed run
  std::string run_id;            // the run that wrote the checkpoint ("" for an older checkpoint)
  std::string lineage;           // the runs that run continued (CheckpointHeader::lineage)
  std::string note;              // what a --resume folder held besides (checkpoint_resolve)
  std::string data_checksum;     // the checksum of the --data file it trained on, "" unknown
  bool active() const { return step >= 0; }
};

struct RunConfig {
  ModelConfig model;                            // the preset, then any overrides
  std::string model_name = kDefaultModelName;   // --model
  int steps = 200;                              // --steps: 45-75 s at 8 ranks on 2 cores
  uint64_t seed = 1234;                         // --seed: weights, hash tables, data
  std::string data = "synthetic";               // --data: synthetic, tokens:PATH, text:PATH
  DataOrder data_order = DataOrder::kShuffled;  // --data-order: a file's windows, shuffled
  std::string val_data = kNoValData;            // --val-data: validation source, or none
  int eval_every = 0;                           // --eval-every: steps, 0 = after the last only
  int eval_batches = 4;                         // --eval-batches: global batches per evaluation
  std::string stats_path;                       // --stats: "" = runs/<model>-<time>.h5
  double lr = 3e-3;                             // --lr: AdamW learning rate after warmup
  int warmup_steps = 10;                        // --warmup-steps: linear warmup to --lr
  int lr_decay_steps = 0;                       // --lr-decay-steps: cosine horizon, 0 = --steps
  double weight_decay = 0.1;                    // --weight-decay: AdamW's decoupled decay
  double grad_clip = 1.0;                       // --grad-clip: global L2 norm, 0 = off
  RoutingConfig routing;         // the [routing] options, each field named as its option
  bool check_bias = false;       // --check-bias: verify bias equal on all ranks
  bool overwrite = false;        // --overwrite: replace an existing --stats file
  int trace_every = 0;           // --trace-every: routing traces, 0 = off
  int log_every = 1;             // --log-every: print every N-th step line
  int checkpoint_every = 0;      // --checkpoint-every: steps, 0 = off
  std::string checkpoint_dir;    // --checkpoint-dir: "" = beside the stats file
  int keep_checkpoints = 2;      // --keep-checkpoints: the newest K are kept
  std::string resume;            // --resume: a checkpoint or its directory
  int ep = 0;                    // --ep: P, 0 = default_ep_size(W, E)
  int ranks_per_host = 0;        // --ranks-per-host: N, 0 = auto (the launcher)
  std::string expert_placement;  // --expert-placement: a placement file, "" = contiguous
  int threads = 0;               // --threads: per rank, 0 = cores / ranks
#ifdef MOE_RT_OPTION_PROBE
  int probe_option = 0;  // --probe-option: the options' test build only (option_table.cpp)
#endif

  // Actions and provenance; not configuration, so not part of run_config_to_text.
  bool help = false;          // --help: the caller prints options_help_text() and exits
  bool print_config = false;  // --print-config: the caller prints run_config_to_text() and exits
  std::string config_path;    // --config FILE, "" if none
  std::string config_note;    // what rank 0 says of the file (the old format), "" if nothing
  ResumePoint resume_point;   // set by options_parse when --resume is given
};

// Whether the run evaluates a validation loss (--val-data is not none).
inline bool has_val_data(const RunConfig& cfg) {
  return cfg.val_data != kNoValData;
}

// The EP group size P of a run on `world_size` ranks: --ep, else default_ep_size(W, E).
inline int run_ep_size(const RunConfig& cfg, int world_size) {
  return cfg.ep > 0 ? cfg.ep : default_ep_size(world_size, cfg.model.experts);
}

// The learning-rate schedule's horizon: --lr-decay-steps, else --steps.
int lr_horizon(const RunConfig& cfg);

// Fits the batch to the world size when resuming: the global batch (sequences per step over all
// ranks) is the checkpoint's, so --batch-per-rank becomes global / W, or is checked against it
// when given. Throws ConfigError when W does not divide the global batch.
void run_config_fit_world(RunConfig& cfg, int world_size);

// Parses argv (argv[0] is the program name). With --help, returns at once with `help` set and
// nothing else resolved. Otherwise reads --config if given, applies the precedence above and
// validates the result (run_config_validate). Throws ConfigError.
RunConfig options_parse(int argc, const char* const* argv);

// Every option with its default (that of deepseek4-tiny for model fields), and the presets.
std::string options_help_text();

// Throws ConfigError naming the first option whose value cannot run: the model's checks
// (model_config_validate), then the training, balancing and data options.
void run_config_validate(const RunConfig& cfg);

// Every configuration option as TOML (config_toml_text), re-readable by --config: parsing it as a
// config file gives back an equal configuration (floats are written in their shortest exact
// form, text as TOML strings: config_file.hpp).
// The "full resolved config as text" of --print-config and the stats file.
std::string run_config_to_text(const RunConfig& cfg);

// One configuration option's long name (without "--") and value, as run_config_to_text writes
// it before quoting.
struct RunConfigValue {
  std::string name;
  std::string text;
  char kind = 's';  // 'b' bool, 'i' int, 'u' unsigned 64-bit, 'f' real, 's' text
};
// Every configuration option, in --help order.
std::vector<RunConfigValue> run_config_values(const RunConfig& cfg);

}  // namespace moe

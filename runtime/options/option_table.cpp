// The option table (option_table.hpp): one entry per option, its value read and written through
// option_values.hpp by the type of the RunConfig field it names, and its rules: what --resume
// does with it, the values it accepts by itself, whether ranks may differ on it.
#include "runtime/options/option_table.hpp"

#include <cstdint>
#include <limits>
#include <type_traits>
#include <utility>

#include "runtime/options/config_file.hpp"
#include "runtime/options/option_values.hpp"

namespace moe {
namespace {

// The sections of a config file, by topic (option_table.hpp); kTopLevel keys precede them.
constexpr const char* kTopLevel = "";
constexpr const char* kArchitecture = "architecture";
constexpr const char* kRouting = "routing";
constexpr const char* kData = "data";
constexpr const char* kOutput = "output";
constexpr const char* kCheckpoint = "checkpoint";
constexpr const char* kOptimizer = "optimizer";
constexpr const char* kParallel = "parallel";

// The optimizer and the bias update compute in float: a value past its range would become inf.
constexpr double kFloatMax = std::numeric_limits<float>::max();

// `access` is a generic lambda returning a reference to the field, for const and non-const configs.
template <class Access>
OptionField field(const char* section, const char* name, const char* value_name, const char* help,
                  Access access, OptionRules rules) {
  RunConfig probe;
  using Value = std::decay_t<decltype(access(probe))>;
  const bool is_flag = std::is_same_v<Value, bool>;
  const char kind = is_flag                           ? 'b'
                    : std::is_same_v<Value, uint64_t> ? 'u'
                    : std::is_integral_v<Value>       ? 'i'
                    : std::is_floating_point_v<Value> ? 'f'
                                                      : 's';
  std::function<double(const RunConfig&)> number;
  if constexpr (std::is_arithmetic_v<Value> && !std::is_same_v<Value, bool>) {
    number = [access](const RunConfig& c) { return static_cast<double>(access(c)); };
  }
  return {section,
          name,
          value_name,
          help,
          [access](const RunConfig& c) { return option_value_to_text(access(c)); },
          [access, name](RunConfig& c, const std::string& text) {
            option_value_from_text(std::string("--") + name, text, access(c));
          },
          is_flag,
          kind,
          std::move(rules),
          std::move(number)};
}

// --ranks-per-host: "auto" (stored as 0) or a positive count, so an int field of its own text.
OptionField ranks_per_host_field() {
  const char* name = "ranks-per-host";
  return {kParallel,
          name,
          "N|auto",
          "ranks per host, in blocks of consecutive ranks (auto: as the launcher places them); "
          "EP groups and replicas follow the hosts",
          [](const RunConfig& c) {
            return c.ranks_per_host == 0 ? std::string("auto")
                                         : option_value_to_text(c.ranks_per_host);
          },
          [name](RunConfig& c, const std::string& text) {
            if (text == "auto") {
              c.ranks_per_host = 0;
              return;
            }
            int n = 0;
            try {
              option_value_from_text(std::string("--") + name, text, n);
            } catch (const ConfigError&) {
              n = 0;
            }
            if (n < 1) {
              throw ConfigError(std::string("--") + name + ": invalid value '" +
                                text_excerpt(text) + "' (expected auto or a positive integer)");
            }
            c.ranks_per_host = n;
          },
          false,
          's',
          OptionRules(OnResume::kOwn),
          {}};  // its value is no number: "auto" or a count
}

}  // namespace

const std::vector<OptionField>& option_fields() {
  static const std::vector<OptionField> fields = {
      field(
          kTopLevel, "model", "NAME",
          "preset the other options start from: deepseek4-tiny, deepseek4-fine, micro",
          [](auto& c) -> auto& { return c.model_name; }, OptionRules{OnResume::kFromCheckpoint}),
      field(
          kTopLevel, "steps", "N",
          "training steps (200: 45-75 s of deepseek4-tiny on 8 ranks, 2 idle cores)",
          [](auto& c) -> auto& { return c.steps; }, OptionRules{OnResume::kContinued, positive()}),
      field(
          kTopLevel, "seed", "N",
          "seed of weights, hash tables, synthetic data and the data order's shuffle",
          [](auto& c) -> auto& { return c.seed; }, OptionRules{OnResume::kFromCheckpoint}),
      field(
          kArchitecture, "seq-len", "N", "S: tokens per sequence",
          [](auto& c) -> auto& { return c.model.seq_len; }, OptionRules{OnResume::kFromCheckpoint}),
      field(
          kArchitecture, "layers", "N", "L: transformer layers",
          [](auto& c) -> auto& { return c.model.layers; }, OptionRules{OnResume::kFromCheckpoint}),
      field(
          kArchitecture, "hash-layers", "N",
          "L_h: the first L_h layers route by a token hash table",
          [](auto& c) -> auto& { return c.model.hash_layers; },
          OptionRules{OnResume::kFromCheckpoint}),
      field(
          kArchitecture, "experts", "N", "E: routed experts per layer",
          [](auto& c) -> auto& { return c.model.experts; }, OptionRules{OnResume::kFromCheckpoint}),
      field(
          kArchitecture, "top-k", "N", "K: experts per token",
          [](auto& c) -> auto& { return c.model.top_k; }, OptionRules{OnResume::kFromCheckpoint}),
      field(
          kArchitecture, "shared-experts", "N",
          "shared experts per layer, each of width F (0 = none)",
          [](auto& c) -> auto& { return c.model.shared_experts; },
          OptionRules{OnResume::kFromCheckpoint}),
      field(
          kArchitecture, "d-model", "N", "D: model width",
          [](auto& c) -> auto& { return c.model.d_model; }, OptionRules{OnResume::kFromCheckpoint}),
      field(
          kArchitecture, "ffn-dim", "N", "F: expert FFN width",
          [](auto& c) -> auto& { return c.model.ffn_dim; }, OptionRules{OnResume::kFromCheckpoint}),
      field(
          kArchitecture, "heads", "N", "attention query heads",
          [](auto& c) -> auto& { return c.model.heads; }, OptionRules{OnResume::kFromCheckpoint}),
      field(
          kArchitecture, "kv-heads", "N",
          "key/value heads of grouped-query attention (divides --heads)",
          [](auto& c) -> auto& { return c.model.kv_heads; },
          OptionRules{OnResume::kFromCheckpoint}),
      field(
          kArchitecture, "head-dim", "N", "width of one attention head (even, for RoPE)",
          [](auto& c) -> auto& { return c.model.head_dim; },
          OptionRules{OnResume::kFromCheckpoint}),
      field(
          kArchitecture, "vocab", "N", "V: vocabulary size",
          [](auto& c) -> auto& { return c.model.vocab; }, OptionRules{OnResume::kFromCheckpoint}),
      field(
          kArchitecture, "score-func", "NAME",
          "router score function: sqrtsoftplus, sigmoid, softmax",
          [](auto& c) -> auto& { return c.model.score_func; },
          OptionRules{OnResume::kFromCheckpoint}),
      field(
          kArchitecture, "route-scale", "X", "scale of the normalised routing weights",
          [](auto& c) -> auto& { return c.model.route_scale; },
          OptionRules{OnResume::kFromCheckpoint}),
      field(
          kArchitecture, "swiglu-limit", "X",
          "clamp of the routed experts' SwiGLU inputs (<= 0: no clamp)",
          [](auto& c) -> auto& { return c.model.swiglu_limit; },
          OptionRules{OnResume::kFromCheckpoint}),
      field(
          kArchitecture, "sliding-window", "N", "attention window in tokens (0 = full causal)",
          [](auto& c) -> auto& { return c.model.sliding_window; },
          OptionRules{OnResume::kFromCheckpoint}),
      field(
          kArchitecture, "rope-theta", "X", "RoPE base frequency",
          [](auto& c) -> auto& { return c.model.rope_theta; },
          OptionRules{OnResume::kFromCheckpoint}),
      field(
          kArchitecture, "norm-eps", "X", "RMSNorm epsilon",
          [](auto& c) -> auto& { return c.model.norm_eps; },
          OptionRules{OnResume::kFromCheckpoint}),
      field(
          kRouting, "bias-update-rate", "X",
          "loss-free balancing bias step gamma (0 = off; DeepSeek-V3 used 0.001 at lr 2.2e-4)",
          [](auto& c) -> auto& { return c.routing.bias_update_rate; },
          OptionRules{OnResume::kFromCheckpoint, nonnegative_float()}),
      field(
          kRouting, "seq-aux-loss-weight", "X", "sequence-wise balance loss weight alpha (0 = off)",
          [](auto& c) -> auto& { return c.routing.seq_aux_loss_weight; },
          OptionRules{OnResume::kFromCheckpoint, nonnegative_float()}),
      field(
          kRouting, "bias-update-center", "BOOL", "shift each bias update to mean zero",
          [](auto& c) -> auto& { return c.routing.bias_update_center; },
          OptionRules{OnResume::kFromCheckpoint}),
      field(
          kRouting, "balance-loss-form", "NAME",
          "deepseek (DeepSeek's f*P per sequence, summed over layers) or maxtext (MaxText pull "
          "request #4190: extra factor K, softmax of biased scores, layer mean)",
          [](auto& c) -> auto& { return c.routing.balance_loss_form; },
          OptionRules{OnResume::kFromCheckpoint}),
      field(
          kRouting, "z-loss-weight", "X",
          "router z-loss weight: the mean squared log-sum-exp of the router logits, every layer "
          "(0 = off; ST-MoE used 0.001)",
          [](auto& c) -> auto& { return c.routing.z_loss_weight; },
          OptionRules{OnResume::kFromCheckpoint, nonnegative_float()}),
      field(
          kRouting, "routing-groups", "N", "G expert groups for group-limited top-k (1 = off)",
          [](auto& c) -> auto& { return c.routing.routing_groups; },
          OptionRules{OnResume::kFromCheckpoint}),
      field(
          kRouting, "group-topk", "N", "M groups a token may use when --routing-groups > 1",
          [](auto& c) -> auto& { return c.routing.group_topk; },
          OptionRules{OnResume::kFromCheckpoint}),
      field(
          kRouting, "hash-table", "PATH",
          "hash-routing tables file (docs/load-balancing.md); default seeded",
          [](auto& c) -> auto& { return c.routing.hash_table_path; },
          OptionRules{OnResume::kFromCheckpoint}),
      field(
          kRouting, "force-balance", "MODE",
          "none; forced: round-robin (exactly balanced), random (K distinct experts, uniform), "
          "zipf:ALPHA (expert e drawn with weight (e+1)^-ALPHA), hot:FRACTION (that fraction of "
          "tokens take expert 0 in their first slot, the rest draw uniformly, so expert 0 holds "
          "FRACTION + (1 - FRACTION)/E of first slots)",
          [](auto& c) -> auto& { return c.routing.force_balance; },
          OptionRules{OnResume::kFromCheckpoint}),
      field(
          kRouting, "capacity-factor", "C",
          "token capacity: an expert takes at most ceil(C*S*K/E) of a sequence's assignments, "
          "the rest are dropped (0 = dropless; docs/load-balancing.md)",
          [](auto& c) -> auto& { return c.routing.capacity_factor; },
          OptionRules{OnResume::kFromCheckpoint, OptionRange{0.0, false, 1e6, "0 = dropless"}}),
      field(
          kRouting, "drop-policy", "NAME",
          "which assignments over capacity are dropped: probs (the smallest combine weights) or "
          "position (the latest in the sequence)",
          [](auto& c) -> auto& { return c.routing.drop_policy; },
          OptionRules{OnResume::kFromCheckpoint}),
      field(
          kRouting, "capacity-unit", "NAME",
          "the tokens a capacity counts: sequence (each sequence; the same bits on any rank "
          "count) or rank (all of a rank's tokens, as Megatron-Core; depends on the rank count)",
          [](auto& c) -> auto& { return c.routing.capacity_unit; },
          OptionRules{OnResume::kFromCheckpoint}),
      field(
          kRouting, "shadow", "RULE[,RULE...]",
          "shadow balancers beside training, each with its own bias on the same scores: none, "
          "sign:RATE, sign-centered:RATE, proportional:RATE (docs/load-balancing.md); they "
          "change no bit of training",
          [](auto& c) -> auto& { return c.routing.shadows; },
          OptionRules{OnResume::kFromCheckpoint}),
      field(
          kRouting, "check-bias", "BOOL", "verify every step that all ranks hold the same bias",
          [](auto& c) -> auto& { return c.check_bias; }, OptionRules{OnResume::kContinued}),
      field(
          kData, "batch-per-rank", "N", "B: sequences per rank per step",
          [](auto& c) -> auto& { return c.model.batch_per_rank; },
          OptionRules{OnResume::kContinued}),
      field(
          kData, "data", "SOURCE",
          "synthetic, synthetic:zipf=S (its Zipf exponent S instead of 1), tokens:PATH (llm.c "
          ".bin shard), text:PATH (bytes)",
          [](auto& c) -> auto& { return c.data; }, OptionRules{OnResume::kFromCheckpoint}),
      field(
          kData, "data-order", "ORDER",
          "order of a data file's S-token windows: shuffled (each epoch every window once, in an "
          "order drawn from --seed and the epoch, as trainers sample) or sequential (consecutive "
          "windows, llm.c's order; that of checkpoints from before this option); not "
          "--val-data's (file order) nor synthetic data's",
          [](auto& c) -> auto& { return c.data_order; },
          OptionRules{OnResume::kFromCheckpoint}.before_option("sequential")),
      field(
          kData, "val-data", "SOURCE",
          "validation data, as --data (none: no validation); synthetic: held-out samples of "
          "the same chain",
          [](auto& c) -> auto& { return c.val_data; }, OptionRules{OnResume::kContinued}),
      field(
          kData, "eval-every", "N",
          "validation loss after every N-th step and after the last (0: after the last only)",
          [](auto& c) -> auto& { return c.eval_every; },
          OptionRules{OnResume::kContinued, at_least(0, "0 = after the last step only")}),
      field(
          kData, "eval-batches", "K",
          "global batches of validation sequences per evaluation (the same each time)",
          [](auto& c) -> auto& { return c.eval_batches; },
          OptionRules{OnResume::kContinued, at_least(1)}),
      field(
          kOutput, "stats", "PATH",
          "HDF5 statistics file (default: a new runs/<model>-<time>.h5; none: no file)",
          [](auto& c) -> auto& { return c.stats_path; }, OptionRules{OnResume::kOwn}),
      field(
          kOutput, "overwrite", "BOOL", "replace an existing --stats file instead of failing",
          [](auto& c) -> auto& { return c.overwrite; }, OptionRules{OnResume::kOwn}),
      field(
          kOutput, "log-every", "N",
          "print every N-th step's line (the first, the last, evaluated and stopping steps "
          "always); "
          "the statistics file still gets every step",
          [](auto& c) -> auto& { return c.log_every; },
          OptionRules{OnResume::kContinued, at_least(1)}),
      field(
          kOutput, "trace-every", "N",
          "write every N-th step's per-token routing to the file (0 = off)",
          [](auto& c) -> auto& { return c.trace_every; },
          OptionRules{OnResume::kContinued, at_least(0, "0 = off")}),
      field(
          kCheckpoint, "checkpoint-every", "N",
          "write a checkpoint every N steps and at the end (0 = off)",
          [](auto& c) -> auto& { return c.checkpoint_every; },
          OptionRules{OnResume::kContinued, at_least(0, "0 = off")}),
      field(
          kCheckpoint, "checkpoint-dir", "DIR",
          "checkpoint folder (default: beside the --stats file, <stats>-checkpoints)",
          [](auto& c) -> auto& { return c.checkpoint_dir; }, OptionRules{OnResume::kOwn}),
      field(
          kCheckpoint, "keep-checkpoints", "K", "keep the newest K checkpoints, remove older ones",
          [](auto& c) -> auto& { return c.keep_checkpoints; },
          OptionRules{OnResume::kContinued, at_least(1)}),
      field(
          kCheckpoint, "resume", "PATH",
          "continue from a checkpoint file, or a folder's newest (docs/checkpoints.md)",
          [](auto& c) -> auto& { return c.resume; }, OptionRules{OnResume::kOwn}),
      field(
          kOptimizer, "lr", "X", "AdamW learning rate after warmup (small models take 3e-3)",
          [](auto& c) -> auto& { return c.lr; },
          OptionRules{OnResume::kFromCheckpoint, positive_float()}),
      field(
          kOptimizer, "warmup-steps", "N", "steps of linear learning-rate warmup from 0",
          [](auto& c) -> auto& { return c.warmup_steps; },
          OptionRules{OnResume::kFromCheckpoint, at_least(0)}),
      field(
          kOptimizer, "lr-decay-steps", "N",
          "steps of the cosine schedule to 10% of --lr (0: --steps); fixed when resuming",
          [](auto& c) -> auto& { return c.lr_decay_steps; },
          OptionRules{OnResume::kFromCheckpoint, at_least(0, "0 = --steps")}),
      field(
          kOptimizer, "weight-decay", "X", "AdamW decoupled weight decay",
          [](auto& c) -> auto& { return c.weight_decay; },
          OptionRules{OnResume::kFromCheckpoint, nonnegative_float()}),
      field(
          kOptimizer, "grad-clip", "X", "clip of the global gradient L2 norm (0 = off)",
          [](auto& c) -> auto& { return c.grad_clip; },
          OptionRules{OnResume::kFromCheckpoint, nonnegative_float()}),
#ifdef MOE_RT_OPTION_PROBE
      // A new option is one row and its RunConfig field (options.hpp): this one exists only in
      // the options' test build, whose test shows that the row reaches every place.
      field(
          kOptimizer, "probe-option", "N", "an option of the options' test build only (0 to 100)",
          [](auto& c) -> auto& { return c.probe_option; },
          OptionRules{OnResume::kContinued, within(0, 100)}),
#endif
      field(
          kParallel, "ep", "N", "expert-parallel group size P (0: largest divisor of W <= E)",
          [](auto& c) -> auto& { return c.ep; },
          OptionRules{OnResume::kOwn, at_least(0, "0 = default")}),
      ranks_per_host_field(),
      field(
          kParallel, "expert-placement", "PATH",
          "which EP rank holds which experts, per layer (a file of moe_stats.py placement; "
          "docs/load-balancing.md); default contiguous blocks. Changes no bit, only the time",
          [](auto& c) -> auto& { return c.expert_placement; }, OptionRules{OnResume::kOwn}),
      field(
          kParallel, "threads", "N",
          "threads per rank, at most 1024 (0: usable cores / ranks on the node)",
          // Ranks may differ: threads change no bit of the arithmetic (every threaded loop gives
          // bitwise the same result on any thread count, tests/model/test_threads.cpp), and
          // ranks on nodes of different sizes may rightly be given different counts, as the
          // default (0) already resolves to a different count per node.
          [](auto& c) -> auto& { return c.threads; },
          OptionRules{OnResume::kOwn, within(0, kMaxThreads, "0 = default"), /*per_rank=*/true}),
  };
  return fields;
}

OptionRange at_least(double min, const char* meaning) {
  return {min, false, std::nullopt, meaning};
}
OptionRange positive() {
  return {0.0, true, std::nullopt, nullptr};
}
OptionRange within(double min, double max, const char* meaning) {
  return {min, false, max, meaning};
}
OptionRange nonnegative_float() {
  return {0.0, false, kFloatMax, nullptr};
}
OptionRange positive_float() {
  return {0.0, true, kFloatMax, nullptr};
}

void option_range_check(const OptionField& f, const RunConfig& cfg) {
  if (!f.rules.range || !f.number) return;
  const OptionRange& r = *f.rules.range;
  const double v = f.number(cfg);
  const bool low_ok = r.above_min ? v > r.min : v >= r.min;  // false for NaN
  if (low_ok && (!r.max || v <= *r.max)) return;
  const std::string min = option_number_to_text(r.min);
  std::string accepted;
  if (r.max && *r.max == kFloatMax) {
    accepted = (r.above_min ? "positive" : ">= " + min) + " and within float range (<= 3.4e38)";
  } else if (r.max) {
    accepted = (r.above_min ? "in (" : "in [") + min + ", " + option_number_to_text(*r.max) + "]";
  } else {
    accepted = r.above_min ? (r.min == 0.0 ? "positive" : "> " + min) : ">= " + min;
  }
  if (r.meaning != nullptr) accepted += std::string(" (") + r.meaning + ")";
  throw ConfigError(std::string("--") + f.name + " must be " + accepted + ", got " + f.get(cfg));
}

const OptionField* option_find(std::string_view name) {
  for (const OptionField& f : option_fields()) {
    if (name == f.name) return &f;
  }
  return nullptr;
}

}  // namespace moe

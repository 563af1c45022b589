// The option table (option_table.hpp): one entry per option, its value read and written through
// option_values.hpp by the type of the RunConfig field it names.
#include "runtime/option_table.hpp"

#include <cstdint>
#include <type_traits>

#include "runtime/config_file.hpp"
#include "runtime/option_values.hpp"

namespace moe {
namespace {

// `access` is a generic lambda returning a reference to the field, for const and non-const configs.
template <class Access>
OptionField field(const char* name, const char* value_name, const char* help, Access access) {
  RunConfig probe;
  using Value = std::decay_t<decltype(access(probe))>;
  const bool is_flag = std::is_same_v<Value, bool>;
  const char kind = is_flag                           ? 'b'
                    : std::is_same_v<Value, uint64_t> ? 'u'
                    : std::is_integral_v<Value>       ? 'i'
                    : std::is_floating_point_v<Value> ? 'f'
                                                      : 's';
  return {name,
          value_name,
          help,
          [access](const RunConfig& c) { return option_value_to_text(access(c)); },
          [access, name](RunConfig& c, const std::string& text) {
            option_value_from_text(std::string("--") + name, text, access(c));
          },
          is_flag,
          kind};
}

// --ranks-per-host: "auto" (stored as 0) or a positive count, so an int field of its own text.
OptionField ranks_per_host_field() {
  const char* name = "ranks-per-host";
  return {name,
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
          's'};
}

}  // namespace

const std::vector<OptionField>& option_fields() {
  static const std::vector<OptionField> fields = {
      field(
          "model", "NAME", "preset the other options start from: deepseek4-tiny, micro",
          [](auto& c) -> auto& { return c.model_name; }),
      field(
          "steps", "N",
          "training steps (200: about 48 s of deepseek4-tiny on 8 ranks, 2 idle cores)",
          [](auto& c) -> auto& { return c.steps; }),
      field(
          "seed", "N", "seed of weights, hash tables and synthetic data",
          [](auto& c) -> auto& { return c.seed; }),
      field(
          "batch-per-rank", "N", "B: sequences per rank per step",
          [](auto& c) -> auto& { return c.model.batch_per_rank; }),
      field(
          "seq-len", "N", "S: tokens per sequence",
          [](auto& c) -> auto& { return c.model.seq_len; }),
      field(
          "layers", "N", "L: transformer layers", [](auto& c) -> auto& { return c.model.layers; }),
      field(
          "hash-layers", "N", "L_h: the first L_h layers route by a token hash table",
          [](auto& c) -> auto& { return c.model.hash_layers; }),
      field(
          "experts", "N", "E: routed experts per layer",
          [](auto& c) -> auto& { return c.model.experts; }),
      field(
          "top-k", "N", "K: experts per token", [](auto& c) -> auto& { return c.model.top_k; }),
      field(
          "shared-experts", "N", "shared experts per layer, each of width F (0 = none)",
          [](auto& c) -> auto& { return c.model.shared_experts; }),
      field(
          "d-model", "N", "D: model width", [](auto& c) -> auto& { return c.model.d_model; }),
      field(
          "ffn-dim", "N", "F: expert FFN width", [](auto& c) -> auto& { return c.model.ffn_dim; }),
      field(
          "heads", "N", "attention query heads", [](auto& c) -> auto& { return c.model.heads; }),
      field(
          "kv-heads", "N", "key/value heads of grouped-query attention (divides --heads)",
          [](auto& c) -> auto& { return c.model.kv_heads; }),
      field(
          "head-dim", "N", "width of one attention head (even, for RoPE)",
          [](auto& c) -> auto& { return c.model.head_dim; }),
      field(
          "vocab", "N", "V: vocabulary size", [](auto& c) -> auto& { return c.model.vocab; }),
      field(
          "score-func", "NAME", "router score function: sqrtsoftplus, sigmoid, softmax",
          [](auto& c) -> auto& { return c.model.score_func; }),
      field(
          "route-scale", "X", "scale of the normalised routing weights",
          [](auto& c) -> auto& { return c.model.route_scale; }),
      field(
          "swiglu-limit", "X", "clamp of the routed experts' SwiGLU inputs (<= 0: no clamp)",
          [](auto& c) -> auto& { return c.model.swiglu_limit; }),
      field(
          "sliding-window", "N", "attention window in tokens (0 = full causal)",
          [](auto& c) -> auto& { return c.model.sliding_window; }),
      field(
          "rope-theta", "X", "RoPE base frequency",
          [](auto& c) -> auto& { return c.model.rope_theta; }),
      field(
          "norm-eps", "X", "RMSNorm epsilon", [](auto& c) -> auto& { return c.model.norm_eps; }),
      field(
          "bias-update-rate", "X",
          "loss-free balancing bias step gamma (0 = off; DeepSeek-V3 used 0.001 at lr 2.2e-4)",
          [](auto& c) -> auto& { return c.bias_update_rate; }),
      field(
          "seq-aux-loss-weight", "X", "sequence-wise balance loss weight alpha (0 = off)",
          [](auto& c) -> auto& { return c.seq_aux_loss_weight; }),
      field(
          "bias-update-center", "BOOL", "shift each bias update to mean zero",
          [](auto& c) -> auto& { return c.bias_update_center; }),
      field(
          "balance-loss-form", "NAME",
          "deepseek (DeepSeek's f*P per sequence, summed over layers) or maxtext (MaxText pull "
          "request #4190: extra factor K, softmax of biased scores, layer mean)",
          [](auto& c) -> auto& { return c.balance_loss_form; }),
      field(
          "routing-groups", "N", "G expert groups for group-limited top-k (1 = off)",
          [](auto& c) -> auto& { return c.routing_groups; }),
      field(
          "group-topk", "N", "M groups a token may use when --routing-groups > 1",
          [](auto& c) -> auto& { return c.group_topk; }),
      field(
          "hash-table", "PATH", "hash-routing tables file (docs/load-balancing.md); default seeded",
          [](auto& c) -> auto& { return c.hash_table_path; }),
      field(
          "force-balance", "MODE",
          "none; forced: round-robin (exactly balanced), random (K distinct experts, uniform), "
          "zipf:ALPHA (expert e drawn with weight (e+1)^-ALPHA), hot:FRACTION (that fraction of "
          "tokens take expert 0 in their first slot, the rest draw uniformly, so expert 0 holds "
          "FRACTION + (1 - FRACTION)/E of first slots)",
          [](auto& c) -> auto& { return c.force_balance; }),
      field(
          "check-bias", "BOOL", "verify every step that all ranks hold the same bias",
          [](auto& c) -> auto& { return c.check_bias; }),
      field(
          "data", "SOURCE", "synthetic, tokens:PATH (llm.c .bin shard), text:PATH (bytes)",
          [](auto& c) -> auto& { return c.data; }),
      field(
          "val-data", "SOURCE",
          "validation data, as --data (none: no validation); synthetic: held-out samples of "
          "the same chain",
          [](auto& c) -> auto& { return c.val_data; }),
      field(
          "eval-every", "N",
          "validation loss after every N-th step and after the last (0: after the last only)",
          [](auto& c) -> auto& { return c.eval_every; }),
      field(
          "eval-batches", "K",
          "global batches of validation sequences per evaluation (the same each time)",
          [](auto& c) -> auto& { return c.eval_batches; }),
      field(
          "stats", "PATH",
          "HDF5 statistics file (default: a new runs/<model>-<time>.h5; none: no file)",
          [](auto& c) -> auto& { return c.stats_path; }),
      field(
          "overwrite", "BOOL", "replace an existing --stats file instead of failing",
          [](auto& c) -> auto& { return c.overwrite; }),
      field(
          "trace-every", "N", "write every N-th step's per-token routing to the file (0 = off)",
          [](auto& c) -> auto& { return c.trace_every; }),
      field(
          "checkpoint-every", "N", "write a checkpoint every N steps and at the end (0 = off)",
          [](auto& c) -> auto& { return c.checkpoint_every; }),
      field(
          "checkpoint-dir", "DIR",
          "checkpoint folder (default: beside the --stats file, <stats>-checkpoints)",
          [](auto& c) -> auto& { return c.checkpoint_dir; }),
      field(
          "keep-checkpoints", "K", "keep the newest K checkpoints, remove older ones",
          [](auto& c) -> auto& { return c.keep_checkpoints; }),
      field(
          "resume", "PATH",
          "continue from a checkpoint file, or a folder's newest (docs/checkpoints.md)",
          [](auto& c) -> auto& { return c.resume; }),
      field(
          "lr", "X", "AdamW learning rate after warmup (small models take 3e-3)",
          [](auto& c) -> auto& { return c.lr; }),
      field(
          "warmup-steps", "N", "steps of linear learning-rate warmup from 0",
          [](auto& c) -> auto& { return c.warmup_steps; }),
      field(
          "lr-decay-steps", "N",
          "steps of the cosine schedule to 10% of --lr (0: --steps); fixed when resuming",
          [](auto& c) -> auto& { return c.lr_decay_steps; }),
      field(
          "weight-decay", "X", "AdamW decoupled weight decay",
          [](auto& c) -> auto& { return c.weight_decay; }),
      field(
          "grad-clip", "X", "clip of the global gradient L2 norm (0 = off)",
          [](auto& c) -> auto& { return c.grad_clip; }),
      field(
          "ep", "N", "expert-parallel group size P (0: largest divisor of W <= E)",
          [](auto& c) -> auto& { return c.ep; }),
      ranks_per_host_field(),
      field(
          "threads", "N", "threads per rank, at most 1024 (0: usable cores / ranks on the node)",
          [](auto& c) -> auto& { return c.threads; }),
  };
  return fields;
}

const OptionField* option_find(std::string_view name) {
  for (const OptionField& f : option_fields()) {
    if (name == f.name) return &f;
  }
  return nullptr;
}

}  // namespace moe

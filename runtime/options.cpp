// Option parsing and the configuration as text. One table (option_fields) lists every
// configuration option once, with its help and how to read and write its value; --help, the
// config-file keys, parsing and run_config_to_text are all generated from it, so they cannot
// disagree. Boost parses the command line, config_file.cpp the config file; values are converted
// here, strictly (the whole string, finite numbers), so a bad value names its option. A value is
// echoed in an error only as a bounded, escaped excerpt (text_excerpt).
#include "runtime/options.hpp"

#include <boost/program_options.hpp>

#include <algorithm>
#include <limits>
#include <functional>
#include <sstream>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "io/checkpoint_file.hpp"
#include "io/token_data.hpp"
#include "model/balance.hpp"
#include "runtime/config_file.hpp"
#include "runtime/option_values.hpp"
#include "runtime/presets.hpp"

namespace moe {
namespace {

namespace po = boost::program_options;

// ---- the option table ---------------------------------------------------------------------------

struct OptionField {
  const char* name;        // long name without "--"; also the config-file key
  const char* value_name;  // N, X, NAME, PATH, SPEC, MODE
  const char* help;
  std::function<std::string(const RunConfig&)> get;
  std::function<void(RunConfig&, const std::string&)> set;
  bool is_flag = false;    // boolean: `--name` alone means true; `name = false` in a file
};

// `access` is a generic lambda returning a reference to the field, for const and non-const configs.
template <class Access>
OptionField field(const char* name, const char* value_name, const char* help, Access access) {
  RunConfig probe;
  const bool is_flag = std::is_same_v<std::decay_t<decltype(access(probe))>, bool>;
  return {name, value_name, help,
          [access](const RunConfig& c) { return option_value_to_text(access(c)); },
          [access, name](RunConfig& c, const std::string& text) {
            option_value_from_text(std::string("--") + name, text, access(c));
          },
          is_flag};
}

const std::vector<OptionField>& option_fields() {
  static const std::vector<OptionField> fields = {
      field("model", "NAME", "preset the other options start from: deepseek4-tiny, micro",
            [](auto& c) -> auto& { return c.model_name; }),
      field("steps", "N", "training steps (200: about 1.5 minutes of deepseek4-tiny on 8 ranks, 2 cores)",
            [](auto& c) -> auto& { return c.steps; }),
      field("seed", "N", "seed of weights, hash tables and synthetic data",
            [](auto& c) -> auto& { return c.seed; }),
      field("batch-per-rank", "N", "B: sequences per rank per step",
            [](auto& c) -> auto& { return c.model.batch_per_rank; }),
      field("seq-len", "N", "S: tokens per sequence",
            [](auto& c) -> auto& { return c.model.seq_len; }),
      field("layers", "N", "L: transformer layers",
            [](auto& c) -> auto& { return c.model.layers; }),
      field("hash-layers", "N", "L_h: the first L_h layers route by a token hash table",
            [](auto& c) -> auto& { return c.model.hash_layers; }),
      field("experts", "N", "E: routed experts per layer",
            [](auto& c) -> auto& { return c.model.experts; }),
      field("top-k", "N", "K: experts per token",
            [](auto& c) -> auto& { return c.model.top_k; }),
      field("shared-experts", "N", "shared experts per layer, each of width F (0 = none)",
            [](auto& c) -> auto& { return c.model.shared_experts; }),
      field("d-model", "N", "D: model width",
            [](auto& c) -> auto& { return c.model.d_model; }),
      field("ffn-dim", "N", "F: expert FFN width",
            [](auto& c) -> auto& { return c.model.ffn_dim; }),
      field("heads", "N", "attention query heads",
            [](auto& c) -> auto& { return c.model.heads; }),
      field("kv-heads", "N", "key/value heads of grouped-query attention (divides --heads)",
            [](auto& c) -> auto& { return c.model.kv_heads; }),
      field("head-dim", "N", "width of one attention head (even, for RoPE)",
            [](auto& c) -> auto& { return c.model.head_dim; }),
      field("vocab", "N", "V: vocabulary size",
            [](auto& c) -> auto& { return c.model.vocab; }),
      field("score-func", "NAME", "router score function: sqrtsoftplus, sigmoid, softmax",
            [](auto& c) -> auto& { return c.model.score_func; }),
      field("route-scale", "X", "scale of the normalised routing weights",
            [](auto& c) -> auto& { return c.model.route_scale; }),
      field("swiglu-limit", "X", "clamp of the routed experts' SwiGLU inputs (<= 0: no clamp)",
            [](auto& c) -> auto& { return c.model.swiglu_limit; }),
      field("sliding-window", "N", "attention window in tokens (0 = full causal)",
            [](auto& c) -> auto& { return c.model.sliding_window; }),
      field("rope-theta", "X", "RoPE base frequency",
            [](auto& c) -> auto& { return c.model.rope_theta; }),
      field("norm-eps", "X", "RMSNorm epsilon",
            [](auto& c) -> auto& { return c.model.norm_eps; }),
      field("bias-update-rate", "X", "loss-free balancing bias step gamma (0 = off)",
            [](auto& c) -> auto& { return c.bias_update_rate; }),
      field("seq-aux-loss-weight", "X", "sequence-wise balance loss weight alpha (0 = off)",
            [](auto& c) -> auto& { return c.seq_aux_loss_weight; }),
      field("bias-update-center", "BOOL", "shift each bias update to mean zero",
            [](auto& c) -> auto& { return c.bias_update_center; }),
      field("balance-loss-form", "NAME",
            "deepseek (SPEC 3) or maxtext (extra factor K, softmax of biased scores, layer mean)",
            [](auto& c) -> auto& { return c.balance_loss_form; }),
      field("routing-groups", "N", "G expert groups for group-limited top-k (1 = off)",
            [](auto& c) -> auto& { return c.routing_groups; }),
      field("group-topk", "N", "M groups a token may use when --routing-groups > 1",
            [](auto& c) -> auto& { return c.group_topk; }),
      field("hash-table", "PATH", "hash-routing tables file (docs/load-balancing.md); default seeded",
            [](auto& c) -> auto& { return c.hash_table_path; }),
      field("force-balance", "MODE",
            "none; forced: round-robin (exactly balanced), random, zipf:ALPHA, hot:FRACTION",
            [](auto& c) -> auto& { return c.force_balance; }),
      field("check-bias", "BOOL", "verify every step that all ranks hold the same bias",
            [](auto& c) -> auto& { return c.check_bias; }),
      field("data", "SPEC", "synthetic, tokens:PATH (llm.c .bin shard), text:PATH (bytes)",
            [](auto& c) -> auto& { return c.data; }),
      field("stats", "PATH", "HDF5 statistics file (default: a new runs/<model>-<time>.h5; none: no file)",
            [](auto& c) -> auto& { return c.stats_path; }),
      field("overwrite", "BOOL", "replace an existing --stats file instead of failing",
            [](auto& c) -> auto& { return c.overwrite; }),
      field("trace-every", "N", "write every N-th step's per-token routing to the file (0 = off)",
            [](auto& c) -> auto& { return c.trace_every; }),
      field("checkpoint-every", "N", "write a checkpoint every N steps and at the end (0 = off)",
            [](auto& c) -> auto& { return c.checkpoint_every; }),
      field("checkpoint-dir", "DIR",
            "checkpoint folder (default: beside the --stats file, <stats>-checkpoints)",
            [](auto& c) -> auto& { return c.checkpoint_dir; }),
      field("keep-checkpoints", "K", "keep the newest K checkpoints, remove older ones",
            [](auto& c) -> auto& { return c.keep_checkpoints; }),
      field("resume", "PATH",
            "continue from a checkpoint file, or a folder's newest (docs/checkpoints.md)",
            [](auto& c) -> auto& { return c.resume; }),
      field("lr", "X", "AdamW learning rate after warmup (small models take 3e-3)",
            [](auto& c) -> auto& { return c.lr; }),
      field("warmup-steps", "N", "steps of linear learning-rate warmup from 0",
            [](auto& c) -> auto& { return c.warmup_steps; }),
      field("lr-decay-steps", "N",
            "steps of the cosine schedule to 10% of --lr (0: --steps); fixed when resuming",
            [](auto& c) -> auto& { return c.lr_decay_steps; }),
      field("weight-decay", "X", "AdamW decoupled weight decay",
            [](auto& c) -> auto& { return c.weight_decay; }),
      field("grad-clip", "X", "clip of the global gradient L2 norm (0 = off)",
            [](auto& c) -> auto& { return c.grad_clip; }),
      field("ep", "N", "expert-parallel group size P (0: largest divisor of W <= E)",
            [](auto& c) -> auto& { return c.ep; }),
      field("threads", "N", "threads per rank, at most 1024 (0: usable cores / ranks on the node)",
            [](auto& c) -> auto& { return c.threads; }),
  };
  return fields;
}

RunConfig default_run_config() {
  RunConfig cfg;
  cfg.model = preset_model(kDefaultModelName);
  return cfg;
}

// The configuration options as Boost options, all parsed as strings. With `show_defaults` each
// carries its default text for --help; never while parsing, where a stored default would beat
// the preset.
po::options_description config_options(bool show_defaults) {
  const RunConfig defaults = default_run_config();
  po::options_description desc("Configuration (also the keys of a --config file)", 100, 50);
  for (const OptionField& f : option_fields()) {
    auto* value = po::value<std::string>()->value_name(f.value_name);
    if (f.is_flag) value->implicit_value("true");
    const std::string default_text = f.get(defaults);
    if (show_defaults && !default_text.empty()) value->default_value(default_text);
    desc.add_options()(f.name, value, f.help);
  }
  return desc;
}

po::options_description action_options() {
  po::options_description desc("Actions", 100, 50);
  desc.add_options()
      ("config", po::value<std::string>()->value_name("FILE"),
       "read `key = value` lines (syntax below); command line > file > preset")
      ("print-config", po::bool_switch(), "print the resolved configuration and exit")
      ("help", po::bool_switch(), "print this help and exit");
  return desc;
}

void apply_values(RunConfig& cfg, const po::variables_map& values) {
  for (const OptionField& f : option_fields()) {
    if (f.name != std::string_view("model") && values.count(f.name)) {
      f.set(cfg, values[f.name].as<std::string>());
    }
  }
}

po::variables_map parse_command_line(int argc, const char* const* argv) {
  po::options_description desc;
  desc.add(config_options(false)).add(action_options());
  // Exact names only: abbreviations would make a config silently depend on the option list.
  const int style = po::command_line_style::default_style & ~po::command_line_style::allow_guessing;
  po::variables_map values;
  try {
    po::store(po::command_line_parser(argc, argv)
                  .options(desc)
                  .style(style)
                  .positional(po::positional_options_description())
                  .run(),
              values);
  } catch (const po::unknown_option& e) {
    throw ConfigError("unknown option '" + text_excerpt(e.get_option_name()) +
                      "' (see moe_rt --help)");
  } catch (const po::error& e) {
    throw ConfigError(std::string("command line: ") + e.what());
  }
  return values;
}

const OptionField* find_field(std::string_view name) {
  for (const OptionField& f : option_fields()) {
    if (name == f.name) return &f;
  }
  return nullptr;
}

// The file's values over the preset (whose name it may have given), each error naming the line.
void apply_file_values(RunConfig& cfg, const std::vector<ConfigEntry>& entries) {
  for (const ConfigEntry& entry : entries) {
    if (entry.key == "model") continue;
    try {
      find_field(entry.key)->set(cfg, entry.value);  // config_file_read checked the key
    } catch (const ConfigError& e) {
      throw ConfigError(config_file_where(cfg.config_path, entry.line) + e.what());
    }
  }
}

// The optimizer and the bias update compute in float: a value past its range would become inf.
constexpr double kFloatMax = std::numeric_limits<float>::max();

void require_nonnegative(double value, const char* option) {
  if (!(value >= 0.0 && value <= kFloatMax)) {
    throw ConfigError(std::string(option) + " must be >= 0 and within float range " +
                      "(<= 3.4e38), got " + option_number_to_text(value));
  }
}

// ---- resuming ------------------------------------------------------------------------------------

// What --resume does with an option (docs/checkpoints.md, "Options on resume").
enum class OnResume {
  kFromCheckpoint,  // changes the arithmetic: the checkpoint's value; a different one is refused
  kContinued,       // the checkpoint's value unless given again: the run's length and habits
  kOwn,             // this run's own, never inherited: output paths, the layout over the ranks
};

OnResume on_resume(std::string_view name) {
  // --batch-per-rank is continued as the global batch: run_config_fit_world.
  for (std::string_view n : {"steps", "checkpoint-every", "keep-checkpoints", "trace-every",
                             "check-bias", "batch-per-rank"}) {
    if (name == n) return OnResume::kContinued;
  }
  for (std::string_view n : {"stats", "overwrite", "ep", "threads", "checkpoint-dir", "resume"}) {
    if (name == n) return OnResume::kOwn;
  }
  return OnResume::kFromCheckpoint;
}

// The configuration a checkpoint recorded (run_config_to_text's lines).
RunConfig config_from_text(const std::string& text, const std::string& origin) {
  const std::vector<ConfigEntry> entries =
      config_text_parse(text, origin, [](std::string_view key) { return find_field(key); });
  RunConfig cfg;
  for (const ConfigEntry& entry : entries) {
    if (entry.key == "model") cfg.model_name = entry.value;
  }
  cfg.model = preset_model(cfg.model_name);
  for (const ConfigEntry& entry : entries) {
    if (entry.key != "model") find_field(entry.key)->set(cfg, entry.value);
  }
  return cfg;
}

// The configuration of a resumed run: the checkpoint's, with this run's own options and the
// continued ones given again. An option that changes the arithmetic and differs is refused.
RunConfig resume_merge(const RunConfig& requested, const po::variables_map& cli,
                       const std::vector<ConfigEntry>& file) {
  std::string path;
  CheckpointHeader h;
  try {
    path = checkpoint_resolve(requested.resume);
    h = CheckpointReader(path).header();
  } catch (const CheckpointError& e) {
    throw ConfigError(std::string("--resume: ") + e.what());
  }
  RunConfig cfg = config_from_text(h.config_text, "the configuration of checkpoint '" + path + "'");
  auto given = [&](std::string_view name) {
    return cli.count(std::string(name)) > 0 ||
           std::any_of(file.begin(), file.end(),
                       [&](const ConfigEntry& entry) { return entry.key == name; });
  };
  for (const OptionField& f : option_fields()) {
    const std::string name = f.name;
    switch (on_resume(name)) {
      case OnResume::kFromCheckpoint:
        if (given(name) && f.get(requested) != f.get(cfg)) {
          throw ConfigError("--" + name + "=" + text_excerpt(f.get(requested)) +
                            " conflicts with checkpoint '" + path + "', which has " + name +
                            " = " + text_excerpt(f.get(cfg)) +
                            ": a resumed run takes the options that change its arithmetic from "
                            "the checkpoint (drop --" + name + ", or start a new run)");
        }
        break;
      case OnResume::kContinued:
        if (given(name)) f.set(cfg, f.get(requested));
        break;
      case OnResume::kOwn:
        f.set(cfg, f.get(requested));
        break;
    }
  }
  cfg.config_path = requested.config_path;
  cfg.resume_point = {path, h.step, h.global_batch, h.stats_path, h.data_description,
                      given("batch-per-rank")};
  if (cfg.steps <= h.step + 1) {
    throw ConfigError("--steps=" + std::to_string(cfg.steps) + ": checkpoint '" + path +
                      "' has already run " + std::to_string(h.step + 1) +
                      " steps; pass a larger --steps to extend the run");
  }
  return cfg;
}

}  // namespace

int lr_horizon(const RunConfig& cfg) {
  return cfg.lr_decay_steps > 0 ? cfg.lr_decay_steps : cfg.steps;
}

void run_config_fit_world(RunConfig& cfg, int world_size) {
  const ResumePoint& r = cfg.resume_point;
  if (!r.active()) return;
  const int64_t B = cfg.model.batch_per_rank, W = world_size;
  if (r.batch_given) {
    if (B * W != r.global_batch) {
      throw ConfigError("--batch-per-rank=" + std::to_string(B) + " on " + std::to_string(W) +
                        " ranks makes " + std::to_string(B * W) + " sequences per step, but " +
                        "checkpoint '" + r.checkpoint + "' trains " +
                        std::to_string(r.global_batch) + " (drop --batch-per-rank)");
    }
    return;
  }
  if (r.global_batch % W != 0) {
    throw ConfigError("checkpoint '" + r.checkpoint + "' trains " +
                      std::to_string(r.global_batch) + " sequences per step, which " +
                      std::to_string(W) + " ranks cannot share evenly: resume on a rank count " +
                      "that divides " + std::to_string(r.global_batch));
  }
  cfg.model.batch_per_rank = static_cast<int>(r.global_batch / W);
}

RunConfig options_parse(int argc, const char* const* argv) {
  const po::variables_map cli = parse_command_line(argc, argv);
  RunConfig cfg;
  if (cli["help"].as<bool>()) {
    cfg.help = true;
    return cfg;
  }
  std::vector<ConfigEntry> file;
  if (cli.count("config")) {
    cfg.config_path = cli["config"].as<std::string>();
    file = config_file_read(cfg.config_path,
                            [](std::string_view key) { return find_field(key) != nullptr; });
  }
  int model_line = 0;  // the file's line that chose the preset, 0 if none did
  if (cli.count("model")) {
    cfg.model_name = cli["model"].as<std::string>();
  } else {
    for (const ConfigEntry& entry : file) {
      if (entry.key != "model") continue;
      cfg.model_name = entry.value;
      model_line = entry.line;
    }
  }
  try {
    cfg.model = preset_model(cfg.model_name);
  } catch (const ConfigError& e) {
    if (model_line == 0) throw;
    throw ConfigError(config_file_where(cfg.config_path, model_line) + e.what());
  }
  apply_file_values(cfg, file);  // the file over the preset,
  apply_values(cfg, cli);        // the command line over both
  if (!cfg.resume.empty()) cfg = resume_merge(cfg, cli, file);
  cfg.print_config = cli["print-config"].as<bool>();
  run_config_validate(cfg);
  return cfg;
}

std::string options_help_text() {
  std::ostringstream out;
  out << "Usage: moe_rt [options]\n"
      << "Trains a Mixture-of-Experts transformer with expert parallelism over the MPI ranks.\n"
      << "Model options default to the chosen preset; the defaults shown are deepseek4-tiny's.\n"
      << "Every rank must be given the same configuration (--threads may differ).\n\n"
      << config_options(true) << "\n"
      << action_options() << "\n"
      << config_file_syntax_help()
      << "\nPresets (--model):\n";
  for (const ModelPreset& p : preset_table()) out << "  " << p.name << ": " << p.summary << "\n";
  return out.str();
}

void run_config_validate(const RunConfig& cfg) {
  preset_model(cfg.model_name);  // a known preset name, even when every field is overridden
  model_config_validate(cfg.model);
  if (cfg.steps <= 0) {
    throw ConfigError("--steps must be positive, got " + std::to_string(cfg.steps));
  }
  if (!(cfg.lr > 0.0 && cfg.lr <= kFloatMax)) {
    throw ConfigError("--lr must be positive and within float range (<= 3.4e38), got " +
                      option_number_to_text(cfg.lr));
  }
  if (cfg.warmup_steps < 0) {
    throw ConfigError("--warmup-steps must be >= 0, got " + std::to_string(cfg.warmup_steps));
  }
  require_nonnegative(cfg.weight_decay, "--weight-decay");
  require_nonnegative(cfg.grad_clip, "--grad-clip");
  require_nonnegative(cfg.bias_update_rate, "--bias-update-rate");
  require_nonnegative(cfg.seq_aux_loss_weight, "--seq-aux-loss-weight");
  // These name their option and its valid values.
  with_value_excerpt(cfg.force_balance, [](const std::string& t) { forced_routing_from_name(t); });
  with_value_excerpt(cfg.balance_loss_form,
                     [](const std::string& t) { balance_loss_form_from_name(t); });
  const ModelConfig& m = cfg.model;
  if (cfg.routing_groups < 1 || m.experts % cfg.routing_groups != 0) {
    throw ConfigError("--routing-groups=" + std::to_string(cfg.routing_groups) +
                      " must be >= 1 and divide --experts=" + std::to_string(m.experts));
  }
  if (cfg.routing_groups > 1) {
    const int per_group = m.experts / cfg.routing_groups;
    if (cfg.group_topk < 1 || cfg.group_topk > cfg.routing_groups ||
        m.top_k % cfg.group_topk != 0 || m.top_k / cfg.group_topk > per_group) {
      throw ConfigError("--group-topk=" + std::to_string(cfg.group_topk) +
                        " must be in [1, --routing-groups], divide --top-k=" +
                        std::to_string(m.top_k) + ", and leave K/M <= experts per group (" +
                        std::to_string(per_group) + ")");
    }
  }
  if (!cfg.hash_table_path.empty() && m.hash_layers == 0) {
    throw ConfigError("--hash-table '" + text_excerpt(cfg.hash_table_path, kPathExcerptBytes) +
                      "' given, but --hash-layers is 0: no layer would use it");
  }
  if (cfg.trace_every < 0) {
    throw ConfigError("--trace-every must be >= 0 (0 = off), got " +
                      std::to_string(cfg.trace_every));
  }
  if (cfg.lr_decay_steps < 0) {
    throw ConfigError("--lr-decay-steps must be >= 0 (0 = --steps), got " +
                      std::to_string(cfg.lr_decay_steps));
  }
  if (cfg.checkpoint_every < 0) {
    throw ConfigError("--checkpoint-every must be >= 0 (0 = off), got " +
                      std::to_string(cfg.checkpoint_every));
  }
  if (cfg.keep_checkpoints < 1) {
    throw ConfigError("--keep-checkpoints must be >= 1, got " +
                      std::to_string(cfg.keep_checkpoints));
  }
  if (cfg.checkpoint_every > 0 && cfg.stats_path == kNoStats && cfg.checkpoint_dir.empty() &&
      !cfg.resume_point.active()) {
    throw ConfigError("--checkpoint-every needs --checkpoint-dir when --stats is none (the "
                      "default folder is named after the statistics file)");
  }
  if (cfg.ep < 0) {
    throw ConfigError("--ep must be >= 0 (0 = default), got " + std::to_string(cfg.ep));
  }
  if (cfg.threads < 0 || cfg.threads > kMaxThreads) {
    throw ConfigError("--threads must be in [0, " + std::to_string(kMaxThreads) +
                      "] (0 = default), got " + std::to_string(cfg.threads));
  }
  try {
    with_value_excerpt(cfg.data, [](const std::string& t) { token_source_check_spec(t); });
  } catch (const DataSpecError& e) {
    throw ConfigError(e.what());  // already names --data and the valid forms
  }
}

std::string run_config_to_text(const RunConfig& cfg) {
  std::string text = "# moe_rt configuration: re-read with --config FILE\n";
  for (const RunConfigValue& v : run_config_values(cfg)) {
    text += v.name + " = " + config_value_to_text(v.text) + "\n";
  }
  return text;
}

std::vector<RunConfigValue> run_config_values(const RunConfig& cfg) {
  std::vector<RunConfigValue> values;
  for (const OptionField& f : option_fields()) values.push_back({f.name, f.get(cfg)});
  return values;
}

}  // namespace moe

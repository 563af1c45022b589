// Option parsing and the configuration as text. One table (option_table.hpp) lists every
// configuration option once, with its help and how to read and write its value; --help, the
// config-file keys, parsing and run_config_to_text are all generated from it, so they cannot
// disagree. Boost parses the command line, config_file.cpp the config file; values are converted
// here, strictly (the whole string, finite numbers), so a bad value names its option. A value is
// echoed in an error only as a bounded, escaped excerpt (text_excerpt).
#include "runtime/options/options.hpp"

#include <boost/program_options.hpp>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <limits>
#include <sstream>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "io/checkpoint_file.hpp"
#include "io/token_source.hpp"
#include "model/balance.hpp"
#include "model/router.hpp"
#include "runtime/options/config_file.hpp"
#include "runtime/options/option_table.hpp"
#include "runtime/options/option_values.hpp"
#include "runtime/options/presets.hpp"

namespace moe {
namespace {

namespace po = boost::program_options;

RunConfig default_run_config() {
  RunConfig cfg;
  preset_apply(kDefaultModelName, cfg.model, cfg.routing);
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

// The same for --help, by topic: one group per table of the config file, in the table's order.
std::string grouped_config_help() {
  const RunConfig defaults = default_run_config();
  const std::pair<const char*, const char*> titles[] = {
      {"", "Run"},
      {"architecture", "Model [architecture]"},
      {"routing", "Routing and balancing [routing]"},
      {"data", "Data [data]"},
      {"output", "Statistics and output [output]"},
      {"checkpoint", "Checkpoints [checkpoint]"},
      {"optimizer", "Optimizer [optimizer]"},
      {"parallel", "Parallelism [parallel]"}};
  std::ostringstream out;
  out << "Configuration, by topic (also the keys of a --config file, in the [table] shown):\n\n";
  std::vector<bool> shown(option_fields().size(), false);
  auto group = [&](std::string_view section, const std::string& title) {
    po::options_description desc(title, 100, 50);
    for (size_t i = 0; i < option_fields().size(); ++i) {
      const OptionField& f = option_fields()[i];
      if (f.section != section) continue;
      shown[i] = true;
      auto* value = po::value<std::string>()->value_name(f.value_name);
      if (f.is_flag) value->implicit_value("true");
      const std::string default_text = f.get(defaults);
      if (!default_text.empty()) value->default_value(default_text);
      desc.add_options()(f.name, value, f.help);
    }
    if (!desc.options().empty()) out << desc << "\n";
  };
  for (const auto& [section, title] : titles) group(section, title);
  // A table no title names (a new one) still shows, under its own name.
  for (size_t i = 0; i < option_fields().size(); ++i) {
    if (!shown[i])
      group(option_fields()[i].section, std::string("[") + option_fields()[i].section + "]");
  }
  return out.str();
}

po::options_description action_options() {
  po::options_description desc("Actions", 100, 50);
  desc.add_options()("config", po::value<std::string>()->value_name("FILE"),
                     "read a TOML file (syntax below); command line > file > preset")(
      "print-config", po::bool_switch(), "print the resolved configuration and exit")(
      "help", po::bool_switch(), "print this help and exit");
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
    const std::string given = e.get_option_name();
    const std::string near =
        nearest_name(given.substr(std::min(given.find_first_not_of('-'), given.size())),
                     option_names_for_suggestions());
    throw ConfigError("unknown option '" + text_excerpt(given) + "'" +
                      (near.empty() ? "" : " (did you mean --" + near + "?)") +
                      " (see moe_rt --help)");
  } catch (const po::error& e) {
    throw ConfigError(std::string("command line: ") + e.what());
  }
  return values;
}

// The file's values over the preset (whose name it may have given), each error naming the line.
void apply_file_values(RunConfig& cfg, const std::vector<ConfigEntry>& entries) {
  for (const ConfigEntry& entry : entries) {
    if (entry.key == "model") continue;
    try {
      option_find(entry.key)->set(cfg, entry.value);  // config_file_read checked the key
    } catch (const ConfigError& e) {
      throw ConfigError(config_file_where(cfg.config_path, entry.line) + e.what());
    }
  }
}

// ---- resuming
// ------------------------------------------------------------------------------------

// The configuration a checkpoint recorded (run_config_to_text's TOML, or the old format's lines).
RunConfig config_from_text(const std::string& text, const std::string& origin) {
  const std::vector<ConfigEntry> entries = config_text_parse(text, origin).entries;
  RunConfig cfg;
  for (const ConfigEntry& entry : entries) {
    if (entry.key == "model") cfg.model_name = entry.value;
  }
  preset_apply(cfg.model_name, cfg.model, cfg.routing);
  // An option the text lacks is one added since the checkpoint was written: its run ran with the
  // option's older value, where that is not the default (OptionRules::older_value).
  for (const OptionField& f : option_fields()) {
    if (f.rules.older_value != nullptr) f.set(cfg, f.rules.older_value);
  }
  for (const ConfigEntry& entry : entries) {
    if (entry.key != "model") option_find(entry.key)->set(cfg, entry.value);
  }
  return cfg;
}

// The checkpoint --resume names (a file, or a folder's newest: checkpoint_resolve) and its header.
// A folder's newest checkpoint removed since it was chosen (a live run writing there pruned it)
// is chosen again: five choices in all. `note`: what a folder held besides.
std::pair<std::string, CheckpointHeader> resume_header(const std::string& resume,
                                                       std::string& note) {
  try {
    for (int attempt = 1;; ++attempt) {
      const std::string path = checkpoint_resolve(resume, &note);
      try {
        return {path, CheckpointReader(path).header()};
      } catch (const CheckpointError&) {
        std::error_code ec;
        if (attempt < 5 && path != resume && !std::filesystem::exists(path, ec) && !ec) continue;
        throw;
      }
    }
  } catch (const CheckpointError& e) {
    throw ConfigError(std::string("--resume: ") + e.what());
  }
}

// Each option's resume rule (the table's), applied to `cfg`, the checkpoint's configuration:
// this run's own options and the continued ones given again (`given`) come from `requested`; an
// option that changes the arithmetic and is given with another value is refused.
void resume_rules_apply(RunConfig& cfg, const RunConfig& requested, const std::string& path,
                        const std::function<bool(std::string_view)>& given) {
  for (const OptionField& f : option_fields()) {
    const std::string name = f.name;
    switch (f.rules.on_resume) {  // --batch-per-rank: the global batch, run_config_fit_world
      case OnResume::kFromCheckpoint:
        if (given(name) && f.get(requested) != f.get(cfg)) {
          throw ConfigError("--" + name + "=" + text_excerpt(f.get(requested)) +
                            " conflicts with checkpoint '" + path + "', which has " + name + " = " +
                            text_excerpt(f.get(cfg)) +
                            ": a resumed run takes the options that change its arithmetic from "
                            "the checkpoint (drop --" +
                            name + ", or start a new run)");
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
}

// The configuration of a resumed run: the checkpoint's, with this run's own options and the
// continued ones given again. An option that changes the arithmetic and differs is refused.
RunConfig resume_merge(const RunConfig& requested, const po::variables_map& cli,
                       const std::vector<ConfigEntry>& file) {
  std::string note;
  const auto [path, h] = resume_header(requested.resume, note);
  RunConfig cfg = config_from_text(h.config_text, "the configuration of checkpoint '" + path + "'");
  auto given = [&](std::string_view name) {
    return cli.count(std::string(name)) > 0 ||
           std::any_of(file.begin(), file.end(),
                       [&](const ConfigEntry& entry) { return entry.key == name; });
  };
  resume_rules_apply(cfg, requested, path, given);
  cfg.config_path = requested.config_path;
  cfg.resume_point = {path,
                      h.step,
                      h.global_batch,
                      h.stats_path,
                      h.data_description,
                      given("batch-per-rank"),
                      h.run_id,
                      h.lineage,
                      note,
                      h.data_checksum};
  // Checkpoints go to the resumed checkpoint's folder unless --checkpoint-dir says otherwise
  // (checkpoint_plan_make); one live run per folder.
  const std::filesystem::path folder = !cfg.checkpoint_dir.empty()
                                           ? std::filesystem::path(cfg.checkpoint_dir)
                                           : std::filesystem::path(path).parent_path();
  if (cfg.checkpoint_every > 0) {
    try {
      checkpoint_folder_check_free(folder.empty() ? "." : folder.string());
    } catch (const CheckpointError& e) {
      throw ConfigError(std::string("--resume: ") + e.what());
    }
  }
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
    throw ConfigError("checkpoint '" + r.checkpoint + "' trains " + std::to_string(r.global_batch) +
                      " sequences per step, which " + std::to_string(W) +
                      " ranks cannot share evenly: resume on a rank count " + "that divides " +
                      std::to_string(r.global_batch));
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
  bool legacy_file = false;
  if (cli.count("config")) {
    cfg.config_path = cli["config"].as<std::string>();
    ConfigText read = config_file_read(cfg.config_path);
    file = std::move(read.entries);
    legacy_file = read.legacy;
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
    preset_apply(cfg.model_name, cfg.model, cfg.routing);
  } catch (const ConfigError& e) {
    if (model_line == 0) throw;
    throw ConfigError(config_file_where(cfg.config_path, model_line) + e.what());
  }
  apply_file_values(cfg, file);  // the file over the preset,
  apply_values(cfg, cli);        // the command line over both
  if (!cfg.resume.empty()) cfg = resume_merge(cfg, cli, file);
  cfg.print_config = cli["print-config"].as<bool>();
  if (legacy_file) {
    const std::string path = text_excerpt(cfg.config_path, kPathExcerptBytes);
    cfg.config_note = "config file '" + path + "' is in the old `key = value` format, read " +
                      "this once: `moe_rt --config " + path + " --print-config > NEW.toml` " +
                      "writes it as TOML";
  }
  run_config_validate(cfg);
  return cfg;
}

namespace {

// The rules of --resume as the table gives them: the options of `rule`, wrapped after `lead`.
std::string resume_rule_help(OnResume rule, const std::string& lead) {
  std::string text, line = lead;
  bool first = true;
  for (const OptionField& f : option_fields()) {
    if (f.rules.on_resume != rule) continue;
    const std::string name = std::string("--") + f.name;
    if (first) {
      line += name;
    } else if (line.size() + 2 + name.size() > 98) {
      text += line + ",\n";
      line = "    " + name;
    } else {
      line += ", " + name;
    }
    first = false;
  }
  return text + line + "\n";
}

}  // namespace

std::string options_help_text() {
  std::ostringstream out;
  out << "Usage: moe_rt [options]\n"
      << "Trains a Mixture-of-Experts transformer with expert parallelism over the MPI ranks.\n"
      << "Model options (and a preset's --routing-groups, --group-topk) default to the chosen\n"
      << "preset; the defaults shown are deepseek4-tiny's.\n"
      << "Every rank must be given the same configuration (--threads may differ).\n\n"
      << grouped_config_help() << action_options() << "\n"
      << config_file_syntax_help()
      << "\nOn --resume (docs/checkpoints.md), an option not listed here is the checkpoint's, and\n"
         "a different value is refused:\n"
      << resume_rule_help(OnResume::kContinued, "  continued unless given again: ")
      << resume_rule_help(OnResume::kOwn, "  this run's own: ") << "\nPresets (--model):\n";
  for (const ModelPreset& p : preset_table()) out << "  " << p.name << ": " << p.summary << "\n";
  return out.str();
}

void run_config_validate(const RunConfig& cfg) {
  preset_model(cfg.model_name);  // a known preset name, even when every field is overridden
  model_config_validate(cfg.model);
  for (const OptionField& f : option_fields()) {
    option_range_check(f, cfg);  // each by itself
    if (f.kind == 's' && !utf8_valid(f.get(cfg))) {
      throw ConfigError(std::string("--") + f.name + ": '" + text_excerpt(f.get(cfg)) +
                        "' is not valid UTF-8 (the configuration is written as TOML, whose text "
                        "is UTF-8)");
    }
  }
  routing_config_validate(cfg.routing, cfg.model);
  const ModelConfig& m = cfg.model;
  if (!cfg.routing.hash_table_path.empty() && m.hash_layers == 0) {
    throw ConfigError("--hash-table '" +
                      text_excerpt(cfg.routing.hash_table_path, kPathExcerptBytes) +
                      "' given, but --hash-layers is 0: no layer would use it");
  }
  // The cosine runs from the end of the warmup to the horizon (lr_at_step): a horizon at most one
  // step past the warmup leaves it no step to decay in, and the rate stays at --lr. Not checked
  // on resume: a checkpoint records the resolved horizon, --steps for a run that was all warmup.
  if (cfg.lr_decay_steps > 0 && cfg.lr_decay_steps <= cfg.warmup_steps + 1 &&
      !cfg.resume_point.active()) {
    throw ConfigError("--lr-decay-steps=" + std::to_string(cfg.lr_decay_steps) +
                      " with --warmup-steps=" + std::to_string(cfg.warmup_steps) +
                      " leaves the learning rate no step to decay in (the cosine starts after "
                      "the warmup): give --lr-decay-steps >= " +
                      std::to_string(cfg.warmup_steps + 2) + ", or 0 for --steps");
  }
  if (cfg.checkpoint_every > 0 && cfg.stats_path == kNoStats && cfg.checkpoint_dir.empty() &&
      !cfg.resume_point.active()) {
    throw ConfigError(
        "--checkpoint-every needs --checkpoint-dir when --stats is none (the "
        "default folder is named after the statistics file)");
  }
  if (cfg.eval_every > 0 && !has_val_data(cfg)) {
    throw ConfigError("--eval-every=" + std::to_string(cfg.eval_every) +
                      " needs --val-data: there is no validation data to evaluate");
  }
  try {
    with_value_excerpt(cfg.data, [](const std::string& t) { token_source_check_spec(t); });
    if (has_val_data(cfg)) {
      with_value_excerpt(cfg.val_data,
                         [](const std::string& t) { token_source_check_spec(t, "--val-data"); });
    }
  } catch (const DataSpecError& e) {
    throw ConfigError(e.what());  // already names the option and the valid forms
  }
}

std::string run_config_to_text(const RunConfig& cfg) {
  return "# moe_rt configuration (TOML): re-read with --config FILE\n" +
         config_toml_text(run_config_values(cfg));
}

std::vector<RunConfigValue> run_config_values(const RunConfig& cfg) {
  std::vector<RunConfigValue> values;
  for (const OptionField& f : option_fields()) values.push_back({f.name, f.get(cfg), f.kind});
  return values;
}

}  // namespace moe

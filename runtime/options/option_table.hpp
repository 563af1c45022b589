// The option table: every configuration option once, with its help text, how to read and write
// its value, what --resume does with it, the values it accepts on its own, and whether ranks must
// agree on it. --help, the config-file keys, parsing, run_config_to_text, the rules of --resume,
// the range checks and the ranks' agreement are all generated from it (runtime/options/options.cpp,
// runtime/options/config_agree.cpp), so they cannot disagree: adding an option is adding a row.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/options/options.hpp"

namespace moe {

// What --resume does with an option (docs/checkpoints.md, "Options on resume").
enum class OnResume {
  kFromCheckpoint,  // changes the arithmetic: the checkpoint's value; a different one is refused
  kContinued,       // the checkpoint's value unless given again: the run's length and habits
  kOwn,             // this run's own, never inherited: output paths, the layout over the ranks
};

// The values a numeric option accepts by itself: min (or above it, when `above_min`) up to max,
// where max is given. Checks that involve other options stay in run_config_validate, and the
// model's own shape checks in model_config_validate.
struct OptionRange {
  double min = 0.0;
  bool above_min = false;
  std::optional<double> max;
  const char* meaning = nullptr;  // what a special value means, as the error adds: "0 = off"
};

// The values each option must accept (>= 0, > 0, ...), written as the rows' range column.
OptionRange at_least(double min, const char* meaning = nullptr);
OptionRange positive();
OptionRange within(double min, double max, const char* meaning = nullptr);
OptionRange nonnegative_float();  // [0, FLT_MAX]: the optimizer computes in float
OptionRange positive_float();     // (0, FLT_MAX]

// A row's rules besides its value: the resume rule has no default, so that a new option says it.
struct OptionRules {
  OptionRules(OnResume resume, std::optional<OptionRange> accepted = std::nullopt,
              bool differs_by_rank = false)
      : on_resume(resume), range(accepted), per_rank(differs_by_rank) {}
  // The same rules, for an option whose default differs from what runs did before it existed:
  // `value` (as the option's text) is what a checkpoint written before then ran with.
  OptionRules before_option(const char* value) const {
    OptionRules rules = *this;
    rules.older_value = value;
    return rules;
  }
  OnResume on_resume;
  std::optional<OptionRange> range;
  bool per_rank;  // ranks may be given different values (left out of their agreement)
  // The value of the option in a checkpoint whose configuration lacks it (written before the
  // option existed), nullptr when that is the default. Its run is continued as it began: an
  // absent option would otherwise take today's default, and a kFromCheckpoint option would then
  // change the arithmetic of a resumed run silently.
  const char* older_value = nullptr;
};

struct OptionField {
  const char* section;     // the config file's table ("optimizer"), "" for a top-level key
  const char* name;        // long name without "--"; also the config-file key
  const char* value_name;  // N, X, NAME, PATH, SOURCE, MODE
  const char* help;
  std::function<std::string(const RunConfig&)> get;
  std::function<void(RunConfig&, const std::string&)> set;  // throws ConfigError naming it
  bool is_flag = false;  // boolean: `--name` alone means true; `name = false` in a file
  char kind = 's';       // the value's type: 'b' bool, 'i' int, 'u' unsigned, 'f' real, 's' text
  OptionRules rules;
  std::function<double(const RunConfig&)> number;  // a numeric option's value; empty otherwise
};

// Every configuration option, in --help order.
const std::vector<OptionField>& option_fields();

// The option named `name` (without "--"), or nullptr.
const OptionField* option_find(std::string_view name);

// Throws ConfigError when the value of option `f` in `cfg` is outside its range (none: never),
// with the message "--NAME must be <range> (<meaning>), got <value>".
void option_range_check(const OptionField& f, const RunConfig& cfg);

}  // namespace moe

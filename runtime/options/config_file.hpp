// Config files (`--config FILE`): TOML (toml.io, read with toml++), each option under the key of
// its long name, at the top level or in the table of its topic ([optimizer] lr = 3e-3); writing a
// configuration so that it reads back unchanged; and the bounded, escaped excerpt that error
// messages quote instead of raw user text.
//
// Values are typed by the option: an integer for N, a number (integer or float) for X, true or
// false for BOOL, a string for the rest ("N|auto" takes either). The old `key = value` format of
// earlier versions (plain values up to a ` #` comment, quoted ones with \" \\ \n \t \r \xNN) is
// still read, from a --config file once with a note that converts it, and from checkpoints and
// statistics files written before.
#pragma once

#include <cstddef>
#include <exception>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "model/config.hpp"
#include "runtime/options/options.hpp"

namespace moe {

// One option's value as read from a config file, as text for the option's setter.
struct ConfigEntry {
  std::string key;    // the long option name
  std::string value;  // the value as text: a number, true/false, a string's contents
  int line = 0;       // 1-based
};

struct ConfigText {
  std::vector<ConfigEntry> entries;
  bool legacy = false;  // read in the old `key = value` format
};

// Parses config text, TOML or else the old format. `source` names it in errors ("config file
// 'run.toml'"). Throws ConfigError naming the source, the line and an excerpt for text that is
// neither, an unknown key, a key outside its table or given twice, or a value of the wrong type.
ConfigText config_text_parse(std::string_view text, const std::string& source);

// Reads and parses the file at `path` (ConfigError when it is missing, not a regular file or
// unreadable); errors start with config_file_where(path, line).
ConfigText config_file_read(const std::string& path);

// "--config: config file 'PATH' line N: ", the start of an error about that line.
std::string config_file_where(const std::string& path, int line);

// The configuration as TOML: `values` (run_config_values: every option, in --help order), the
// top-level keys first, then one table per topic. config_text_parse gives every value back.
std::string config_toml_text(const std::vector<RunConfigValue>& values);

// Whether `text` is well-formed UTF-8, which a TOML string must be.
bool utf8_valid(std::string_view text);

inline constexpr size_t kExcerptBytes = 80;        // a value quoted in an error message
inline constexpr size_t kPathExcerptBytes = 1024;  // a file name, which is of little use cut

// `text` made safe to quote in a one-line message: printable ASCII and well-formed UTF-8 as they
// are, a backslash as \\, any other byte as \xNN; at most `max_bytes` of that, then
// "…(N bytes)" with the length of the whole text when it was cut.
std::string text_excerpt(std::string_view text, size_t max_bytes = kExcerptBytes);

// The one name of `names` nearest to `given` (edits: insert, delete, replace, swap two
// neighbours), when it is near enough to be a slip: at most 2 edits, or a third of its length;
// "" when none is, or two are equally near.
std::string nearest_name(std::string_view given, const std::vector<std::string>& names);
// The option names (long, without "--") a suggestion may name: the table's and the actions'.
std::vector<std::string> option_names_for_suggestions();

// Returns check(text) for a user's value. Model and data code echo a bad value whole in their
// errors; where the value is not fit to print whole (long, control characters), the error is
// rethrown as a ConfigError whose message holds the value's excerpt instead.
template <class Check>
auto with_value_excerpt(const std::string& text, Check check) -> decltype(check(text)) {
  try {
    return check(text);
  } catch (const std::exception& e) {
    const std::string excerpt = text_excerpt(text);
    if (excerpt == text || text.empty()) throw;
    std::string message = e.what();
    for (size_t at = message.find(text); at != std::string::npos;
         at = message.find(text, at + excerpt.size())) {
      message.replace(at, text.size(), excerpt);
    }
    throw ConfigError(message);
  }
}

// The format in a few lines, for moe_rt --help.
const char* config_file_syntax_help();

}  // namespace moe

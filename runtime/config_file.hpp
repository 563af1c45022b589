// Config files (`--config FILE`) as text: the line syntax, reading it, writing a value so that it
// reads back unchanged, and the bounded, escaped excerpt that error messages quote instead of raw
// user text. The syntax is parsed here rather than by Boost, whose config-file parser ends a value
// at any `#` (`stats = run#1.h5` read as `run`), so --print-config output did not always read back.
//
// The syntax, one line at a time (a trailing CR and a leading UTF-8 byte-order mark are dropped):
//  - a blank line, or one whose first non-blank character is `#`, is a comment;
//  - any other line is `key = value`; spaces and tabs around the key and the value are dropped;
//  - a plain value is the rest of the line, up to a comment: a `#` that starts the value or follows
//    a space or a tab; `#` inside a word, `=`, quotes and backslashes are themselves;
//  - a value that starts with `"` is quoted: it ends at the next `"` not escaped by a backslash,
//    with the escapes \" \\ \n \t \r and \xNN (any byte but NUL); only a comment may follow it;
//  - control characters other than tab are refused in the line: write them as escapes.
#pragma once

#include <cstddef>
#include <exception>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "model/config.hpp"

namespace moe {

// One `key = value` line.
struct ConfigEntry {
  std::string key;
  std::string value;  // unquoted, escapes resolved
  int line = 0;       // 1-based
};

// Parses config text. `source` names it in errors ("config file 'run.cfg'"); `is_key` says which
// keys exist. Throws ConfigError naming the source, the line and an excerpt of it for a line that
// is not `key = value`, a bad quoted value, an unknown key or a key given twice.
std::vector<ConfigEntry> config_text_parse(std::string_view text, const std::string& source,
                                           const std::function<bool(std::string_view)>& is_key);

// Reads and parses the file at `path` (ConfigError when it is missing, not a regular file or
// unreadable); errors start with config_file_where(path, line).
std::vector<ConfigEntry> config_file_read(const std::string& path,
                                          const std::function<bool(std::string_view)>& is_key);

// "--config: config file 'PATH' line N: ", the start of an error about that line.
std::string config_file_where(const std::string& path, int line);

// `value` as it is written after `key = `: plain when that reads back unchanged and holds no `#`,
// else quoted and escaped. config_text_parse of `key = <this>` gives `value` back exactly.
std::string config_value_to_text(std::string_view value);

inline constexpr size_t kExcerptBytes = 80;        // a value quoted in an error message
inline constexpr size_t kPathExcerptBytes = 1024;  // a file name, which is of little use cut

// `text` made safe to quote in a one-line message: printable ASCII and well-formed UTF-8 as they
// are, a backslash as \\, any other byte as \xNN; at most `max_bytes` of that, then
// "…(N bytes)" with the length of the whole text when it was cut.
std::string text_excerpt(std::string_view text, size_t max_bytes = kExcerptBytes);

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

// The syntax above in a few lines, for moe_rt --help.
const char* config_file_syntax_help();

}  // namespace moe

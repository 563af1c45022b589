// Config files: TOML read with toml++ and written for --print-config, the old `key = value` line
// format read for files and checkpoints written before, and error excerpts. The format is
// described in config_file.hpp; docs/options.md and moe_rt --help say the same.
#include "runtime/options/config_file.hpp"

#include <toml++/toml.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>

#include "io/input_file.hpp"
#include "model/config.hpp"
#include "runtime/options/option_table.hpp"
#include "runtime/options/option_values.hpp"

namespace moe {
namespace {

bool is_blank(char c) {
  return c == ' ' || c == '\t';
}

// A byte no line may hold raw: the C0 controls but tab, and DEL.
bool is_control(unsigned char c) {
  return (c < 0x20 && c != '\t') || c == 0x7f;
}

std::string_view trim_left(std::string_view s) {
  while (!s.empty() && is_blank(s.front())) s.remove_prefix(1);
  return s;
}

std::string_view trim(std::string_view s) {
  s = trim_left(s);
  while (!s.empty() && is_blank(s.back())) s.remove_suffix(1);
  return s;
}

std::string hex_byte(unsigned char c) {
  char text[8];
  std::snprintf(text, sizeof text, "\\x%02X", c);
  return text;
}

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// The length of the well-formed UTF-8 sequence of a printable character (U+00A0 and above) at the
// start of `s`, or 0 (a stray or overlong byte, a surrogate, a C1 control, a cut sequence).
size_t utf8_printable_length(std::string_view s) {
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(s[i]); };
  const unsigned char lead = byte(0);
  size_t length = 0;
  unsigned char low = 0x80, high = 0xBF;  // the range of the second byte
  if (lead == 0xC2) {
    length = 2, low = 0xA0;  // U+0080..U+009F are the C1 controls
  } else if (lead >= 0xC3 && lead <= 0xDF) {
    length = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    if (lead == 0xE0) low = 0xA0;   // overlong
    if (lead == 0xED) high = 0x9F;  // surrogates
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    if (lead == 0xF0) low = 0x90;   // overlong
    if (lead == 0xF4) high = 0x8F;  // above U+10FFFF
  }
  if (length == 0 || s.size() < length || byte(1) < low || byte(1) > high) return 0;
  for (size_t i = 2; i < length; ++i) {
    if (byte(i) < 0x80 || byte(i) > 0xBF) return 0;
  }
  return length;
}

// Parses one non-comment line (no line break, already checked for control characters).
// Returns {key, value}; throws ConfigError prefixed with `where`.
std::pair<std::string, std::string> parse_line(std::string_view line, const std::string& where) {
  const size_t eq = line.find('=');
  const std::string_view key = eq == std::string_view::npos ? "" : trim(line.substr(0, eq));
  if (key.empty()) {
    throw ConfigError(where + "expected `key = value`, got '" + text_excerpt(trim(line)) + "'");
  }
  std::string_view rest = trim_left(line.substr(eq + 1));
  std::string value;
  if (!rest.starts_with('"')) {
    // Plain: up to a `#` that starts the value or follows a blank.
    size_t end = 0;
    while (end < rest.size() && !(rest[end] == '#' && (end == 0 || is_blank(rest[end - 1])))) ++end;
    return {std::string(key), std::string(trim(rest.substr(0, end)))};
  }
  size_t i = 1;
  for (; i < rest.size() && rest[i] != '"'; ++i) {
    if (rest[i] != '\\') {
      value += rest[i];
      continue;
    }
    const char escape = ++i < rest.size() ? rest[i] : '\0';
    switch (escape) {
      case '"':
        value += '"';
        break;
      case '\\':
        value += '\\';
        break;
      case 'n':
        value += '\n';
        break;
      case 't':
        value += '\t';
        break;
      case 'r':
        value += '\r';
        break;
      case 'x': {
        const int hi = i + 1 < rest.size() ? hex_digit(rest[i + 1]) : -1;
        const int lo = i + 2 < rest.size() ? hex_digit(rest[i + 2]) : -1;
        if (hi < 0 || lo < 0 || hi * 16 + lo == 0) {
          throw ConfigError(where + "\\x in a quoted value needs two hex digits, not 00, in '" +
                            text_excerpt(rest) + "'");
        }
        value += static_cast<char>(hi * 16 + lo);
        i += 2;
        break;
      }
      default:
        throw ConfigError(where + "unknown escape in the quoted value '" + text_excerpt(rest) +
                          "' (valid: \\\" \\\\ \\n \\t \\r \\xNN)");
    }
  }
  if (i >= rest.size()) {
    throw ConfigError(where + "the quoted value '" + text_excerpt(rest) + "' has no closing quote");
  }
  const std::string_view after = trim_left(rest.substr(i + 1));
  if (!after.empty() && after.front() != '#') {
    throw ConfigError(where + "text after the closing quote: '" + text_excerpt(after) +
                      "' (only a # comment may follow)");
  }
  return {std::string(key), value};
}

// The old format: `key = value` lines, plain or quoted values, `#` comments.
// `reached` is the line it reads, for an error.
std::vector<ConfigEntry> legacy_parse(std::string_view text, const std::string& source,
                                      int& reached) {
  std::vector<ConfigEntry> entries;
  std::map<std::string, int, std::less<>> seen;  // key -> its line
  int line_number = 0;
  while (!text.empty()) {
    const size_t newline = text.find('\n');
    std::string_view line = text.substr(0, newline);
    text.remove_prefix(newline == std::string_view::npos ? text.size() : newline + 1);
    reached = ++line_number;
    if (line.ends_with('\r')) line.remove_suffix(1);
    const std::string where = source + " line " + std::to_string(line_number) + ": ";
    for (const char c : line) {
      if (is_control(static_cast<unsigned char>(c))) {
        throw ConfigError(where + "control character " + hex_byte(static_cast<unsigned char>(c)) +
                          " in '" + text_excerpt(line) +
                          "' (write it as an escape in a quoted value)");
      }
    }
    const std::string_view content = trim_left(line);
    if (content.empty() || content.front() == '#') continue;
    auto [key, value] = parse_line(content, where);
    if (option_find(key) == nullptr) {
      const std::string near = nearest_name(key, option_names_for_suggestions());
      throw ConfigError(where + "unknown key '" + text_excerpt(key) + "'" +
                        (near.empty() ? "" : " (did you mean '" + near + "'?)") +
                        " (keys are the long option names of moe_rt --help)");
    }
    if (const auto it = seen.find(key); it != seen.end()) {
      throw ConfigError(where + "key '" + key + "' given twice (first on line " +
                        std::to_string(it->second) + ")");
    }
    seen.emplace(key, line_number);
    entries.push_back({std::move(key), std::move(value), line_number});
  }
  return entries;
}

// Whether a key appears twice: as a top-level key and in its table ("key given twice").
using SeenKeys = std::map<std::string, int, std::less<>>;

// What a TOML value is, for an error about its type.
const char* toml_type_name(const toml::node& node) {
  switch (node.type()) {
    case toml::node_type::string:
      return "string";
    case toml::node_type::integer:
      return "integer";
    case toml::node_type::floating_point:
      return "floating-point number";
    case toml::node_type::boolean:
      return "boolean";
    case toml::node_type::array:
      return "array";
    case toml::node_type::table:
      return "table";
    default:
      return "date or time";
  }
}

// The value of TOML node `node` for option `f` as the text its setter reads; throws ConfigError
// prefixed with `where` for a value of another type.
std::string toml_value_text(const toml::node& node, const OptionField& f,
                            const std::string& where) {
  const std::string option = std::string("--") + f.name;
  const bool auto_or_count = std::string_view(f.value_name) == "N|auto";
  auto wrong = [&](const char* expected) {
    return ConfigError(where + option + " takes " + expected + ", got a TOML " +
                       toml_type_name(node));
  };
  switch (f.kind) {
    case 'b':
      if (const auto* v = node.as_boolean()) return v->get() ? "true" : "false";
      throw wrong("true or false");
    case 'i':
    case 'u':
      if (const auto* v = node.as_integer()) return std::to_string(v->get());
      if (f.kind == 'u' && node.is_string()) return node.as_string()->get();  // above 2^63 - 1
      throw wrong(f.kind == 'u' ? "an integer (or its digits in a string)" : "an integer");
    case 'f':
      if (const auto* v = node.as_floating_point()) return option_number_to_text(v->get());
      if (const auto* v = node.as_integer()) return std::to_string(v->get());
      throw wrong("a number");
    default:
      if (const auto* v = node.as_string()) return v->get();
      if (auto_or_count && node.is_integer()) return std::to_string(node.as_integer()->get());
      throw wrong(auto_or_count ? "a string or an integer" : "a string");
  }
}

// One option `key` = `node` of table `table` ("" for the top level) into `entries`.
void toml_entry(std::string_view key, const toml::node& node, std::string_view table,
                const std::string& source, SeenKeys& seen, std::vector<ConfigEntry>& entries) {
  const int line = static_cast<int>(node.source().begin.line);
  const std::string where = source + " line " + std::to_string(line) + ": ";
  const OptionField* f = option_find(key);
  if (f == nullptr) {
    const std::string near = nearest_name(key, option_names_for_suggestions());
    throw ConfigError(where + "unknown key '" + text_excerpt(key) + "'" +
                      (table.empty() ? "" : " in [" + std::string(table) + "]") +
                      (near.empty() ? "" : " (did you mean '" + near + "'?)") +
                      " (keys are the long option names of moe_rt --help)");
  }
  if (!table.empty() && table != f->section) {
    throw ConfigError(where + "key '" + std::string(key) + "' belongs " +
                      (*f->section ? "in [" + std::string(f->section) + "]" : "at the top level") +
                      ", not in [" + std::string(table) + "]");
  }
  if (const auto it = seen.find(key); it != seen.end()) {
    throw ConfigError(where + "key '" + std::string(key) + "' given twice (first on line " +
                      std::to_string(it->second) + ")");
  }
  seen.emplace(std::string(key), line);
  entries.push_back({std::string(key), toml_value_text(node, *f, where), line});
}

// The sections' names: the tables a config file may hold.
bool is_section(std::string_view name) {
  for (const OptionField& f : option_fields()) {
    if (*f.section && name == f.section) return true;
  }
  return false;
}

// TOML text; throws toml::parse_error for text that is not TOML, ConfigError for TOML that is
// not a configuration.
std::vector<ConfigEntry> toml_parse(std::string_view text, const std::string& source) {
  const toml::table root = toml::parse(text, source);
  // toml++ orders a table's keys by name: the file's order is their lines'.
  struct Item {
    std::string_view key, table;
    const toml::node* node;
  };
  std::vector<Item> items;
  for (const auto& [key, node] : root) {
    const std::string_view name = key.str();
    if (const toml::table* table = node.as_table(); table && is_section(name)) {
      for (const auto& [inner, value] : *table) items.push_back({inner.str(), name, &value});
    } else {
      items.push_back({name, "", &node});
    }
  }
  std::stable_sort(items.begin(), items.end(), [](const Item& x, const Item& y) {
    return x.node->source().begin < y.node->source().begin;
  });
  std::vector<ConfigEntry> entries;
  SeenKeys seen;
  for (const Item& item : items)
    toml_entry(item.key, *item.node, item.table, source, seen, entries);
  return entries;
}

std::string file_source(const std::string& path) {
  return "--config: config file '" + text_excerpt(path, kPathExcerptBytes) + "'";
}

// The error of text that is neither TOML nor of the old format, at the line TOML stopped at: its
// description, the line, and how TOML writes text when the line holds the old form's plain text.
ConfigError not_toml(std::string_view text, const std::string& source, const toml::parse_error& e) {
  const auto line = e.source().begin.line;
  std::string_view rest = text;
  for (auto l = line; l > 1 && !rest.empty(); --l) {
    const size_t nl = rest.find('\n');
    rest.remove_prefix(nl == std::string_view::npos ? rest.size() : nl + 1);
  }
  std::string_view content = trim(rest.substr(0, rest.find('\n')));
  if (content.ends_with('\r')) content.remove_suffix(1);
  std::string message = source + " line " + std::to_string(line) + ": invalid TOML (" +
                        text_excerpt(e.description(), 160) + ") in '" + text_excerpt(content) + "'";
  // The old format's plain text values are the commonest mistake: say how TOML writes them.
  const size_t eq = content.find('=');
  const OptionField* f =
      eq == std::string_view::npos ? nullptr : option_find(trim(content.substr(0, eq)));
  if (f != nullptr && f->kind == 's') {
    const std::string_view value = trim(content.substr(eq + 1));
    if (!value.empty() && value.front() != '"' && value.front() != '\'') {
      message += " (text is a quoted string: " + std::string(f->name) + " = \"" +
                 text_excerpt(value, 40) + "\")";
    }
  }
  return ConfigError(message);
}

}  // namespace

ConfigText config_text_parse(std::string_view text, const std::string& source) {
  if (text.starts_with("\xEF\xBB\xBF")) text.remove_prefix(3);  // a UTF-8 byte-order mark
  try {
    return {toml_parse(text, source), false};
  } catch (const toml::parse_error& e) {
    // Not TOML: the old format, or the TOML error. Past the line TOML stopped at, the file is of
    // the old format, and the old format's error is the one.
    // A [table] line is TOML's alone: such a file is TOML with an error.
    bool has_table = false;
    for (size_t at = 0; at < text.size() && !has_table;) {
      const size_t end = std::min(text.find('\n', at), text.size());
      has_table = trim(text.substr(at, end - at)).starts_with('[');
      at = end + 1;
    }
    int reached = 0;
    try {
      if (!has_table) return {legacy_parse(text, source, reached), true};
    } catch (const ConfigError&) {
      if (reached > static_cast<int>(e.source().begin.line)) throw;
    }
    throw not_toml(text, source, e);
  }
}

ConfigText config_file_read(const std::string& path) {
  const std::string source = file_source(path);
  if (const std::string problem = input_file_problem(path); !problem.empty()) {
    throw ConfigError(source + ": " + problem);
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError(source + ": cannot be opened");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw ConfigError(source + ": cannot be read");
  return config_text_parse(text, source);
}

std::string config_file_where(const std::string& path, int line) {
  return file_source(path) + " line " + std::to_string(line) + ": ";
}

namespace {

// `value` as a TOML basic string: quoted, with \" \\ and the escapes of control characters.
std::string toml_string(std::string_view value) {
  std::string text = "\"";
  for (const char c : value) {
    switch (c) {
      case '"':
        text += "\\\"";
        break;
      case '\\':
        text += "\\\\";
        break;
      case '\n':
        text += "\\n";
        break;
      case '\t':
        text += "\\t";
        break;
      case '\r':
        text += "\\r";
        break;
      default:
        if (is_control(static_cast<unsigned char>(c))) {
          char escape[8];
          std::snprintf(escape, sizeof escape, "\\u%04X", static_cast<unsigned char>(c));
          text += escape;
        } else {
          text += c;
        }
    }
  }
  return text + "\"";
}

// One value as TOML, by its kind: integers, floats with a point or exponent, true/false, strings.
std::string toml_value(const RunConfigValue& v) {
  switch (v.kind) {
    case 'b':
    case 'i':
      return v.text;
    case 'u':  // TOML integers are signed 64-bit: larger seeds as their digits in a string
      return std::stoull(v.text) <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())
                 ? v.text
                 : toml_string(v.text);
    case 'f':
      return v.text.find_first_of(".eEn") == std::string::npos ? v.text + ".0" : v.text;
    default: {
      // "N|auto": a count as an integer.
      const OptionField* f = option_find(v.name);
      const bool count = f != nullptr && std::string_view(f->value_name) == "N|auto" &&
                         !v.text.empty() &&
                         v.text.find_first_not_of("0123456789") == std::string::npos;
      return count ? v.text : toml_string(v.text);
    }
  }
}

}  // namespace

std::string config_toml_text(const std::vector<RunConfigValue>& values) {
  // Tables in order of their first option; top-level keys before any table, as TOML requires.
  std::vector<std::string> sections = {""};
  std::map<std::string, std::string> body;
  for (const RunConfigValue& v : values) {
    const OptionField* f = option_find(v.name);
    const std::string section = f != nullptr ? f->section : "";
    if (!body.count(section) && !section.empty()) sections.push_back(section);
    body[section] += v.name + " = " + toml_value(v) + "\n";
  }
  std::string text;
  for (const std::string& section : sections) {
    if (!body.count(section)) continue;
    if (!section.empty()) text += "\n[" + section + "]\n";
    text += body[section];
  }
  return text;
}

bool utf8_valid(std::string_view text) {
  for (size_t i = 0; i < text.size();) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    // A C1 control (U+0080..U+009F) is well-formed, if not printable.
    const size_t length =
        (c == 0xC2 && i + 1 < text.size() && static_cast<unsigned char>(text[i + 1]) >= 0x80 &&
         static_cast<unsigned char>(text[i + 1]) < 0xA0)
            ? 2
            : utf8_printable_length(text.substr(i));
    if (length == 0) return false;
    i += length;
  }
  return true;
}

std::string nearest_name(std::string_view given, const std::vector<std::string>& names) {
  // Optimal string alignment distance, row by row.
  auto distance = [](std::string_view a, std::string_view b) {
    std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
    for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
    for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
    for (size_t i = 1; i <= a.size(); ++i) {
      for (size_t j = 1; j <= b.size(); ++j) {
        const size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
        d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
        if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) {
          d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
        }
      }
    }
    return d[a.size()][b.size()];
  };
  if (given.size() > 256) return "";  // not a slip of a name
  std::string best;
  size_t best_distance = 0;
  bool tie = false;
  for (const std::string& name : names) {
    const size_t n = distance(given, name);
    if (n > std::max<size_t>(2, name.size() / 3)) continue;
    if (best.empty() || n < best_distance) {
      best = name;
      best_distance = n;
      tie = false;
    } else if (n == best_distance) {
      tie = true;
    }
  }
  return tie ? "" : best;
}

std::vector<std::string> option_names_for_suggestions() {
  std::vector<std::string> names = {"config", "print-config", "help"};
  for (const OptionField& f : option_fields()) names.emplace_back(f.name);
  return names;
}

std::string text_excerpt(std::string_view text, size_t max_bytes) {
  std::string out;
  size_t used = 0;  // bytes of `text` shown
  while (used < text.size()) {
    const std::string_view rest = text.substr(used);
    const unsigned char c = static_cast<unsigned char>(rest.front());
    size_t length = 1;
    std::string piece;
    if (c == '\\') {
      piece = "\\\\";
    } else if (c >= 0x20 && c < 0x7f) {
      piece = std::string(1, static_cast<char>(c));
    } else if ((length = utf8_printable_length(rest)) > 0) {
      piece = std::string(rest.substr(0, length));
    } else {
      length = 1;
      piece = hex_byte(c);
    }
    if (out.size() + piece.size() > max_bytes) break;
    out += piece;
    used += length;
  }
  if (used < text.size()) out += "…(" + std::to_string(text.size()) + " bytes)";
  return out;
}

const char* config_file_syntax_help() {
  return "Config files (--config): TOML. The keys are the long names above, at the top level or\n"
         "in their topic's table ([architecture], [routing], [data], [output], [checkpoint],\n"
         "[optimizer], [parallel]; --print-config shows which). Numbers and true/false are\n"
         "written plain, text in double quotes, with TOML's escapes. Example:\n"
         "  model = \"micro\"\n"
         "  [optimizer]\n"
         "  lr = 3e-3   # a comment\n"
         "--print-config writes this form, so its output reads back unchanged. The old\n"
         "`key = value` files of earlier versions are still read, with a note that converts "
         "them.\n";
}

}  // namespace moe

// Config files: the line parser, quoting a value for --print-config, and error excerpts. The
// syntax is described in config_file.hpp; README.md and moe_rt --help say the same.
#include "runtime/config_file.hpp"

#include <cstdio>
#include <fstream>
#include <iterator>
#include <map>

#include "io/input_file.hpp"
#include "model/config.hpp"

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

std::string file_source(const std::string& path) {
  return "--config: config file '" + text_excerpt(path, kPathExcerptBytes) + "'";
}

}  // namespace

std::vector<ConfigEntry> config_text_parse(std::string_view text, const std::string& source,
                                           const std::function<bool(std::string_view)>& is_key) {
  if (text.starts_with("\xEF\xBB\xBF")) text.remove_prefix(3);  // a UTF-8 byte-order mark
  std::vector<ConfigEntry> entries;
  std::map<std::string, int, std::less<>> seen;  // key -> its line
  int line_number = 0;
  while (!text.empty()) {
    const size_t newline = text.find('\n');
    std::string_view line = text.substr(0, newline);
    text.remove_prefix(newline == std::string_view::npos ? text.size() : newline + 1);
    ++line_number;
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
    if (!is_key(key)) {
      throw ConfigError(where + "unknown key '" + text_excerpt(key) +
                        "' (keys are the long option names of moe_rt --help)");
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

std::vector<ConfigEntry> config_file_read(const std::string& path,
                                          const std::function<bool(std::string_view)>& is_key) {
  const std::string source = file_source(path);
  if (const std::string problem = input_file_problem(path); !problem.empty()) {
    throw ConfigError(source + ": " + problem);
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError(source + ": cannot be opened");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw ConfigError(source + ": cannot be read");
  return config_text_parse(text, source, is_key);
}

std::string config_file_where(const std::string& path, int line) {
  return file_source(path) + " line " + std::to_string(line) + ": ";
}

std::string config_value_to_text(std::string_view value) {
  bool quote = value.starts_with('"') ||
               (!value.empty() && (is_blank(value.front()) || is_blank(value.back())));
  for (const char c : value) {
    quote = quote || c == '#' || c == '\t' || is_control(static_cast<unsigned char>(c));
  }
  if (!quote) return std::string(value);
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
        text += is_control(static_cast<unsigned char>(c)) ? hex_byte(static_cast<unsigned char>(c))
                                                          : std::string(1, c);
    }
  }
  return text + "\"";
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
  return "Config files (--config): `key = value` lines, the keys the long names above. A `#` "
         "starts\n"
         "a comment at the start of a line or of a value, or after a space or tab, so run#1.h5 is\n"
         "one value. A value in double quotes keeps its spaces and `#`, with the escapes\n"
         "\\\" \\\\ \\n \\t \\r \\xNN (the only way to write a control character). Example:\n"
         "  stats = \"runs/a #1.h5\"   # a comment\n"
         "--print-config quotes the values that need it, so its output reads back unchanged.\n";
}

}  // namespace moe

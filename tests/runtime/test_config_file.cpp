// Tests of the config-file syntax (runtime/config_file.hpp): comments, plain and quoted values,
// every error naming the line, config_value_to_text read back unchanged for awkward values, and
// the bounded, escaped excerpts that error messages quote. Pure functions of text.
#include <gtest/gtest.h>

#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "model/config.hpp"
#include "runtime/config_file.hpp"

namespace moe {
namespace {

bool any_key(std::string_view) {
  return true;
}

std::vector<ConfigEntry> parse(std::string_view text) {
  return config_text_parse(text, "test.cfg", any_key);
}

// The single value of `text`, which must hold one `key = value` line.
std::string value_of(std::string_view text) {
  const std::vector<ConfigEntry> entries = parse(text);
  EXPECT_EQ(entries.size(), 1u) << text;
  return entries.empty() ? "<none>" : entries[0].value;
}

// Parsing `text` must throw a ConfigError whose message holds every one of `words`.
void expect_error(std::string_view text, std::initializer_list<std::string> words) {
  try {
    parse(text);
    ADD_FAILURE() << "no ConfigError for: " << text;
  } catch (const ConfigError& e) {
    const std::string message = e.what();
    for (const std::string& word : words) {
      EXPECT_NE(message.find(word), std::string::npos) << "'" << word << "' not in: " << message;
    }
    EXPECT_LT(message.size(), 400u) << message;
  }
}

TEST(ConfigFile, KeysValuesAndComments) {
  const std::vector<ConfigEntry> entries = parse(
      "# comment\n\n  steps=5\nlr = 0.01   # trailing comment\n\tdata = text:a b.txt \r\n"
      "   # indented comment\nstats =\n");
  ASSERT_EQ(entries.size(), 4u);
  EXPECT_EQ(entries[0].key, "steps");
  EXPECT_EQ(entries[0].value, "5");
  EXPECT_EQ(entries[0].line, 3);
  EXPECT_EQ(entries[1].value, "0.01");
  EXPECT_EQ(entries[2].value, "text:a b.txt");  // inner space kept, CR and outer blanks dropped
  EXPECT_EQ(entries[3].key, "stats");
  EXPECT_EQ(entries[3].value, "");
  EXPECT_EQ(entries[3].line, 7);
  EXPECT_TRUE(parse("").empty());
  EXPECT_TRUE(parse("\xEF\xBB\xBF# only a byte-order mark and a comment").empty());
}

TEST(ConfigFile, HashIsACommentOnlyAtTheStartOrAfterABlank) {
  EXPECT_EQ(value_of("stats = run#1.h5"), "run#1.h5");  // Boost's parser read "run"
  EXPECT_EQ(value_of("stats = run#1.h5 # the first"), "run#1.h5");
  EXPECT_EQ(value_of("stats = run\t#1.h5"), "run");
  EXPECT_EQ(value_of("stats = # nothing"), "");
  EXPECT_EQ(value_of("stats =#x"), "");
  EXPECT_EQ(value_of("data = a=b=c"), "a=b=c");
  EXPECT_EQ(value_of("data = say \"hi\" \\n"), "say \"hi\" \\n");  // plain: no escapes
}

TEST(ConfigFile, QuotedValues) {
  EXPECT_EQ(value_of("stats = \"  a # b  \""), "  a # b  ");
  EXPECT_EQ(value_of("stats = \"\\\"q\\\" \\\\ \\n\\t\\r\\x41\\x7f\"  # comment"),
            "\"q\" \\ \n\t\rA\x7f");
  EXPECT_EQ(value_of("stats = \"\""), "");
  EXPECT_EQ(value_of("stats = \"\\xe2\\x80\\xa6\""), "\xE2\x80\xA6");
}

TEST(ConfigFile, BadLinesNameTheLine) {
  expect_error("steps = 1\nlayers 4\n", {"test.cfg", "line 2", "layers 4", "key = value"});
  expect_error("= 4\n", {"line 1", "key = value"});
  expect_error("[section]\n", {"line 1", "[section]"});
  expect_error("stats = \"open\n", {"line 1", "no closing quote"});
  expect_error("stats = \"a\\qb\"\n", {"line 1", "unknown escape", "\\xNN"});
  expect_error("stats = \"a\\x4\"\n", {"line 1", "two hex digits"});
  expect_error("stats = \"a\\x00\"\n", {"line 1", "not 00"});
  expect_error("stats = \"a\" b\n", {"line 1", "after the closing quote", "b"});
  expect_error("steps = 1\nsteps = 2\n", {"line 2", "'steps' given twice", "line 1"});
  expect_error(std::string_view("stats = a\0b\n", 12), {"line 1", "control character \\x00"});
  expect_error("\n\nstats = a\x1b[31m\n", {"line 3", "\\x1B[31m"});
  try {
    config_text_parse("steps = 1\nbogus-key = 2\n", "test.cfg",
                      [](std::string_view key) { return key == "steps"; });
    ADD_FAILURE() << "unknown key accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("line 2: unknown key 'bogus-key'"), std::string::npos)
        << e.what();
  }
}

// parse(print(value)) == value for values a command line can give.
TEST(ConfigFile, ValuesReadBackUnchanged) {
  const std::vector<std::string> values = {
      "",
      "plain",
      "run#1.h5",
      "#",
      "#start",
      "a # b",
      "a\t#b",
      "\"",
      "\"quoted\"",
      "x\"y",
      "back\\slash",
      "trailing\\",
      "\\\"",
      "\\x41",
      " lead",
      "trail ",
      "  ",
      "\t",
      "a=b = c",
      "é€😀 ünïcödé",
      "\xFF\xFE not UTF-8",
      "line\nbreak",
      "cr\r",
      "\x01\x1f\x7f",
      "# \" \\ #",
      std::string(100000, 'v') + "#" + std::string(100000, ' ') + "\"",
  };
  for (const std::string& value : values) {
    const std::string line = "stats = " + config_value_to_text(value) + "\n";
    EXPECT_EQ(value_of(line), value) << line;
  }
  EXPECT_EQ(config_value_to_text("runs/a.h5"), "runs/a.h5");  // plain when it can be
  EXPECT_EQ(config_value_to_text("a\\b"), "a\\b");
  EXPECT_EQ(config_value_to_text("run#1.h5"), "\"run#1.h5\"");
  EXPECT_EQ(config_value_to_text(" a\"b\n"), "\" a\\\"b\\n\"");
}

TEST(TextExcerpt, BoundedAndEscaped) {
  EXPECT_EQ(text_excerpt("plain text, 12 = 3"), "plain text, 12 = 3");
  EXPECT_EQ(text_excerpt(""), "");
  EXPECT_EQ(text_excerpt(std::string_view("a\0b", 3)), "a\\x00b");  // not cut at the NUL
  EXPECT_EQ(text_excerpt("tab\tnl\ndel\x7f\\"), "tab\\x09nl\\x0Adel\\x7F\\\\");
  EXPECT_EQ(text_excerpt("é€😀"), "é€😀");                          // well-formed UTF-8 is printable
  EXPECT_EQ(text_excerpt("\xC2\x85|\xC3|\xED\xA0\x80|\xC0\xAF"),  // C1, cut, surrogate, overlong
            "\\xC2\\x85|\\xC3|\\xED\\xA0\\x80|\\xC0\\xAF");
  const std::string huge(10 * 1000 * 1000, 'x');
  const std::string cut = text_excerpt(huge);
  EXPECT_EQ(cut, std::string(kExcerptBytes, 'x') + "…(10000000 bytes)");
  EXPECT_EQ(text_excerpt(std::string(kExcerptBytes, 'y')), std::string(kExcerptBytes, 'y'));
  // A cut never splits a UTF-8 character or an escape.
  EXPECT_EQ(text_excerpt(std::string(79, 'z') + "é"), std::string(79, 'z') + "…(81 bytes)");
  EXPECT_EQ(text_excerpt(std::string(78, 'z') + "\x01"), std::string(78, 'z') + "…(79 bytes)");
  EXPECT_EQ(text_excerpt(std::string(2000, '\x02'), 8), "\\x02\\x02…(2000 bytes)");
}

TEST(TextExcerpt, ValueErrorsFromModelCodeAreRebuilt) {
  const auto check = [](const std::string& t) -> int {
    throw ConfigError("--score-func: unknown score function '" + t + "' (valid: ...)");
  };
  const std::string plain = "relu";
  try {
    with_value_excerpt(plain, check);
    ADD_FAILURE() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()), "--score-func: unknown score function 'relu' (valid: ...)");
  }
  const std::string odd = std::string(1000, 'r') + "\n";
  try {
    with_value_excerpt(odd, check);
    ADD_FAILURE() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()), "--score-func: unknown score function '" +
                                         std::string(kExcerptBytes, 'r') +
                                         "…(1001 bytes)' (valid: ...)");
  }
  EXPECT_EQ(with_value_excerpt(odd, [](const std::string& t) { return t.size(); }), 1001u);
}

}  // namespace
}  // namespace moe

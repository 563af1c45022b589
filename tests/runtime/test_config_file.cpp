// Tests of config files (runtime/options/config_file.hpp): TOML with flat keys or topic tables,
// values typed by their option, every error naming the line, the old `key = value` format still
// read, config_toml_text read back unchanged for awkward values, and the bounded, escaped excerpts
// that error messages quote. Pure functions of text.
#include <gtest/gtest.h>

#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "model/config.hpp"
#include "runtime/options/config_file.hpp"
#include "runtime/options/options.hpp"

namespace moe {
namespace {

std::vector<ConfigEntry> parse(std::string_view text) {
  return config_text_parse(text, "test.cfg").entries;
}

bool is_legacy(std::string_view text) {
  return config_text_parse(text, "test.cfg").legacy;
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

TEST(ConfigFile, TomlFlatKeysAndTables) {
  const std::vector<ConfigEntry> entries = parse(
      "# comment\nmodel = \"micro\"\nsteps = 5   # trailing comment\n\n[optimizer]\nlr = 0.01\n"
      "grad-clip = 1\n[data]\ndata = \"text:a b.txt\"\n[routing]\nbias-update-center = true\n"
      "[parallel]\nranks-per-host = 4\n");
  ASSERT_EQ(entries.size(), 7u);
  EXPECT_EQ(entries[0].key, "model");
  EXPECT_EQ(entries[0].value, "micro");
  EXPECT_EQ(entries[1].value, "5");
  EXPECT_EQ(entries[1].line, 3);
  EXPECT_EQ(entries[2].key, "lr");
  EXPECT_EQ(entries[2].value, "0.01");
  EXPECT_EQ(entries[2].line, 6);
  EXPECT_EQ(entries[3].value, "1");  // an integer for a real option
  EXPECT_EQ(entries[4].value, "text:a b.txt");
  EXPECT_EQ(entries[5].value, "true");
  EXPECT_EQ(entries[6].value, "4");  // N|auto: an integer or a string
  EXPECT_FALSE(is_legacy("steps = 5\n"));
  // Flat keys (every option's long name at the top level) and dotted keys are the same file.
  EXPECT_EQ(parse("lr = 0.01\n")[0].value, "0.01");
  EXPECT_EQ(parse("optimizer.lr = 0.01\n")[0].value, "0.01");
  EXPECT_EQ(parse("seed = \"18446744073709551615\"\n")[0].value, "18446744073709551615");
  EXPECT_TRUE(parse("").empty());
  EXPECT_TRUE(parse("\xEF\xBB\xBF# only a byte-order mark and a comment").empty());
}

TEST(ConfigFile, TomlErrorsNameTheLine) {
  expect_error("steps = 1\nlayers 4\n", {"test.cfg", "line 2", "invalid TOML", "in 'layers 4'"});
  // The old format's plain text in a file that is not of the old format either (a table).
  expect_error("steps = 1\n[output]\nstats = runs/a.h5\n",
               {"line 3", "invalid TOML", "(text is a quoted string: stats = \"runs/a.h5\")"});
  EXPECT_TRUE(is_legacy("steps = 1\n\nstats = runs/a.h5\n"));  // read, with a note
  // A [table] makes the file TOML: its first error is the one, not the old format's at the table.
  expect_error("model = micro\n\n[optimizer]\nlr = 3e-3\n",
               {"line 1", "invalid TOML", "(text is a quoted string: model = \"micro\")"});
  expect_error("[section]\n", {"line 1", "unknown key 'section'"});
  expect_error("[optimizer]\nsteps = 3\n",
               {"line 2", "'steps' belongs at the top level", "not in [optimizer]"});
  expect_error("[data]\nlr = 3\n", {"line 2", "'lr' belongs in [optimizer]"});
  expect_error("lr = 1\n[optimizer]\nlr = 2\n", {"line 3", "'lr' given twice", "line 1"});
  expect_error("steps = 1\nbogus-key = 2\n", {"line 2", "unknown key 'bogus-key'"});
  expect_error("steps = 1.5\n", {"line 1", "--steps takes an integer", "floating-point"});
  expect_error("steps = \"5\"\n", {"--steps takes an integer", "string"});
  expect_error("lr = \"0.1\"\n", {"--lr takes a number"});
  expect_error("bias-update-center = 1\n", {"--bias-update-center takes true or false"});
  expect_error("stats = 5\n", {"--stats takes a string"});
  expect_error("stats = [\"a\"]\n", {"--stats takes a string", "array"});
  expect_error("stats = \"a\\qb\"\n", {"line 1", "invalid TOML"});
  expect_error("stats = \"open\n", {"line 1", "invalid TOML"});
}

// Files of earlier versions: plain values up to a ` #` comment, quoted ones with their escapes.
TEST(ConfigFile, TheOldFormatIsStillRead) {
  const std::vector<ConfigEntry> entries = parse(
      "# comment\n\n  steps=5\nlr = 0.01   # trailing comment\n\tdata = text:a b.txt \r\n"
      "   # indented comment\nstats =\n");
  EXPECT_TRUE(is_legacy("steps = 5\ndata = text:a b.txt\n"));
  ASSERT_EQ(entries.size(), 4u);
  EXPECT_EQ(entries[0].key, "steps");
  EXPECT_EQ(entries[0].value, "5");
  EXPECT_EQ(entries[0].line, 3);
  EXPECT_EQ(entries[1].value, "0.01");
  EXPECT_EQ(entries[2].value, "text:a b.txt");  // inner space kept, CR and outer blanks dropped
  EXPECT_EQ(entries[3].key, "stats");
  EXPECT_EQ(entries[3].value, "");
  EXPECT_EQ(entries[3].line, 7);
  EXPECT_EQ(value_of("stats = run#1.h5"), "run#1.h5");  // Boost's parser read "run"
  EXPECT_EQ(value_of("stats = run#1.h5 # the first"), "run#1.h5");
  EXPECT_EQ(value_of("stats = run\t#1.h5"), "run");
  EXPECT_EQ(value_of("stats = # nothing"), "");
  EXPECT_EQ(value_of("data = a=b=c"), "a=b=c");
  EXPECT_EQ(value_of("data = say \"hi\" \\n"), "say \"hi\" \\n");  // plain: no escapes
  EXPECT_EQ(value_of("stats = \"\\\"q\\\" \\\\ \\n\\t\\r\\x41\\x7f\"  # comment"),
            "\"q\" \\ \n\t\rA\x7f");
  EXPECT_EQ(value_of("stats = \"\\xe2\\x80\\xa6\""), "\xE2\x80\xA6");
}

// parse(config_toml_text(value)) == value for text values a command line can give.
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
      "\\u0041",
      " lead",
      "trail ",
      "  ",
      "\t",
      "a=b = c",
      "é€😀 ünïcödé",
      "line\nbreak",
      "cr\r",
      "\x01\x1f\x7f",
      "# \" \\ #",
      "'''",
      std::string(100000, 'v') + "#" + std::string(100000, ' ') + "\"",
  };
  for (const std::string& value : values) {
    const std::string text = config_toml_text({{"stats", value, 's'}});
    EXPECT_EQ(value_of(text), value) << text;
    EXPECT_FALSE(is_legacy(text)) << text;
  }
  EXPECT_EQ(config_toml_text({{"stats", "runs/a.h5", 's'}}), "\n[output]\nstats = \"runs/a.h5\"\n");
  EXPECT_EQ(config_toml_text({{"stats", "\x01", 's'}}), "\n[output]\nstats = \"\\u0001\"\n");
  // Numbers by kind: reals keep a point or an exponent, seeds above 2^63 - 1 are strings.
  EXPECT_EQ(config_toml_text({{"model", "micro", 's'},
                              {"seed", "18446744073709551615", 'u'},
                              {"route-scale", "10", 'f'},
                              {"norm-eps", "1e-06", 'f'},
                              {"lr", "0.003", 'f'},
                              {"steps", "200", 'i'},
                              {"check-bias", "false", 'b'}}),
            "model = \"micro\"\nseed = \"18446744073709551615\"\nsteps = 200\n\n[architecture]\n"
            "route-scale = 10.0\nnorm-eps = 1e-06\n\n[optimizer]\nlr = 0.003\n\n[routing]\n"
            "check-bias = false\n");
  EXPECT_EQ(config_toml_text({{"ranks-per-host", "4", 's'}, {"threads", "0", 'i'}}),
            "\n[parallel]\nranks-per-host = 4\nthreads = 0\n");
  EXPECT_EQ(config_toml_text({{"ranks-per-host", "auto", 's'}}),
            "\n[parallel]\nranks-per-host = \"auto\"\n");
  EXPECT_TRUE(utf8_valid("é€😀 \x01\xC2\x85"));
  EXPECT_FALSE(utf8_valid("\xFF\xFE not UTF-8"));
  EXPECT_FALSE(utf8_valid("cut \xC3"));
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

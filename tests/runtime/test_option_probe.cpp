// Adding an option is adding a row. This suite is built against moe_options_probe, the options
// library compiled with MOE_RT_OPTION_PROBE, which adds exactly one RunConfig field and one row of
// the option table (--probe-option: [optimizer], an integer 0 to 100, continued on resume) and
// touches nothing else. Each test finds the row where an option must reach: --help and its resume
// lists, the command line, TOML config files in its table, --print-config, the range check, the
// ranks' agreement (the digest), the statistics file's /config values, and --resume.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <string>
#include <vector>

#include "io/checkpoint_file.hpp"
#include "options_test_util.hpp"
#include "runtime/options/config_agree.hpp"
#include "runtime/options/config_file.hpp"
#include "runtime/options/option_table.hpp"
#include "runtime/options/options.hpp"
#include "test_tempdir.hpp"

#ifndef MOE_RT_OPTION_PROBE
#error "test_option_probe.cpp is built against moe_options_probe, with MOE_RT_OPTION_PROBE"
#endif

namespace moe {
namespace {

using testing_util::TempDir;

using testing_options::config_error;
using testing_options::parse;
using testing_options::step2_header;
using testing_options::write_file;

TEST(OptionProbe, TheRowIsInTheTableOnce) {
  const auto count =
      std::count_if(option_fields().begin(), option_fields().end(),
                    [](const OptionField& f) { return std::string(f.name) == "probe-option"; });
  EXPECT_EQ(count, 1);
  const OptionField* f = option_find("probe-option");
  ASSERT_NE(f, nullptr);
  EXPECT_STREQ(f->section, "optimizer");
}

TEST(OptionProbe, HelpListsItWithItsResumeRule) {
  const std::string help = options_help_text();
  EXPECT_NE(help.find("\n  --probe-option N "), std::string::npos) << help;
  const size_t rules = help.find("\nOn --resume"), continued = help.find("continued unless"),
               own = help.find("this run's own:");
  ASSERT_NE(rules, std::string::npos) << help;
  ASSERT_NE(continued, std::string::npos) << help;
  ASSERT_NE(own, std::string::npos) << help;
  ASSERT_LT(rules, continued);
  ASSERT_LT(continued, own);
  const size_t listed = help.find("--probe-option", continued);
  EXPECT_LT(listed, own) << "not in the list of continued options:\n" << help.substr(rules);
}

TEST(OptionProbe, CommandLineAndRangeCheck) {
  EXPECT_EQ(parse({"--model", "micro"}).probe_option, 0);
  EXPECT_EQ(parse({"--model", "micro", "--probe-option", "7"}).probe_option, 7);
  EXPECT_EQ(config_error({"--model", "micro", "--probe-option", "101"}),
            "--probe-option must be in [0, 100], got 101");
  EXPECT_NE(config_error({"--model", "micro", "--probe-option", "x"}).find("--probe-option"),
            std::string::npos);
}

TEST(OptionProbe, TomlInItsTableAndPrintConfigReadsBack) {
  TempDir dir;
  const RunConfig in_table =
      parse({"--config",
             write_file(dir, "a.toml", "model = \"micro\"\n[optimizer]\nprobe-option = 9\n")});
  EXPECT_EQ(in_table.probe_option, 9);
  const RunConfig top_level =
      parse({"--config", write_file(dir, "b.toml", "model = \"micro\"\nprobe-option = 8\n")});
  EXPECT_EQ(top_level.probe_option, 8);
  const std::string misplaced = config_error(
      {"--config", write_file(dir, "c.toml", "model = \"micro\"\n[routing]\nprobe-option = 9\n")});
  EXPECT_NE(misplaced.find("'probe-option' belongs in [optimizer]"), std::string::npos)
      << misplaced;
  const std::string wrong_type =
      config_error({"--config", write_file(dir, "d.toml", "[optimizer]\nprobe-option = \"9\"\n")});
  EXPECT_NE(wrong_type.find("--probe-option takes an integer"), std::string::npos) << wrong_type;

  const std::string text = run_config_to_text(in_table);
  const size_t table = text.find("\n[optimizer]\n");
  ASSERT_NE(table, std::string::npos) << text;
  const size_t line = text.find("\nprobe-option = 9\n");
  ASSERT_NE(line, std::string::npos) << text;
  EXPECT_GT(line, table);
  EXPECT_EQ(text.find('[', table + 2), text.find("\n[", line) + 1);  // within [optimizer]
  const RunConfig back = parse({"--config", write_file(dir, "back.toml", text)});
  EXPECT_EQ(back.probe_option, 9);
  EXPECT_EQ(run_config_to_text(back), text);
}

TEST(OptionProbe, TheRanksAgreeOnItAndTheStatisticsFileRecordsIt) {
  const RunConfig cfg = parse({"--model", "micro", "--probe-option", "7"});
  const std::vector<ConfigItem> items = config_agree_items(cfg);
  const auto item = std::find_if(items.begin(), items.end(),
                                 [](const ConfigItem& i) { return i.option == "--probe-option"; });
  ASSERT_NE(item, items.end());
  EXPECT_EQ(item->value, "7");
  // A rank with another value gives another digest buffer: the agreement would stop there.
  EXPECT_NE(config_digest_buffer(items),
            config_digest_buffer(config_agree_items(parse({"--model", "micro"}))));

  // The statistics file's /config and its config attribute are written from these values
  // (runtime/output/run_stats.cpp), as the report's table is.
  const std::vector<RunConfigValue> values = run_config_values(cfg);
  const auto value = std::find_if(values.begin(), values.end(),
                                  [](const RunConfigValue& v) { return v.name == "probe-option"; });
  ASSERT_NE(value, values.end());
  EXPECT_EQ(value->text, "7");
  EXPECT_EQ(value->kind, 'i');
}

// A checkpoint whose configuration has --probe-option 3, after step 2 of a global batch of 1.
std::string probe_checkpoint(const TempDir& dir) {
  RunConfig cfg = parse({"--model", "micro", "--steps", "5", "--probe-option", "3"});
  cfg.stats_path = kNoStats;
  CheckpointHeader h = step2_header(cfg);
  h.data_description = "synthetic";
  const std::string path = dir.file("ckpt_00000002.h5");
  CheckpointWriter w(path, h);
  w.commit();
  return path;
}

TEST(OptionProbe, ResumeContinuesItUnlessGivenAgain) {
  TempDir dir;
  const std::string checkpoint = probe_checkpoint(dir);
  EXPECT_EQ(parse({"--resume", checkpoint, "--steps", "8"}).probe_option, 3);
  EXPECT_EQ(parse({"--resume", checkpoint, "--steps", "8", "--probe-option", "5"}).probe_option, 5);
}

}  // namespace
}  // namespace moe

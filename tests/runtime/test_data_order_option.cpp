// Tests of --data-order as an option: shuffled by default, read from the command line and from
// a config file's [data] table, refused with the valid values otherwise; on --resume the
// checkpoint's, and for a checkpoint written before the option existed (its configuration has
// no data-order line) the sequential order that run trained in, whatever today's default.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "io/checkpoint_file.hpp"
#include "options_test_util.hpp"
#include "runtime/options/options.hpp"
#include "test_tempdir.hpp"

namespace moe {
namespace {

using testing_options::config_error;
using testing_options::parse;
using testing_options::step2_header;
using testing_options::write_file;
using testing_util::TempDir;

// The configuration text without its data-order line: what a checkpoint written before the
// option existed recorded.
std::string without_data_order(const std::string& text) {
  const std::string line = "data-order = ";
  const size_t at = text.find("\n" + line);
  EXPECT_NE(at, std::string::npos) << text;
  return text.substr(0, at + 1) + text.substr(text.find('\n', at + 1) + 1);
}

// A checkpoint after step 2 of a 5-step micro run on a text file, whose configuration text is
// `edit` applied to that of `args`.
std::string checkpoint(const TempDir& dir, const std::vector<std::string>& args,
                       std::string (*edit)(const std::string&) = nullptr) {
  std::vector<std::string> all = {"--model", "micro",  "--steps",         "5",       "--vocab",
                                  "256",     "--data", "text:corpus.txt", "--stats", kNoStats};
  all.insert(all.end(), args.begin(), args.end());
  CheckpointHeader h = step2_header(parse(all));
  if (edit != nullptr) h.config_text = edit(h.config_text);
  h.data_description = "text:corpus.txt (4096 bytes as tokens 0..255)";
  static int count = 0;
  const std::string path = dir.file("ckpt_" + std::to_string(++count) + ".h5");
  CheckpointWriter w(path, h);
  w.commit();
  return path;
}

TEST(DataOrderOption, ShuffledByDefaultAndReadFromEveryPlace) {
  EXPECT_EQ(parse({}).data_order, DataOrder::kShuffled);
  EXPECT_EQ(parse({"--data-order", "sequential"}).data_order, DataOrder::kSequential);
  const std::string text = run_config_to_text(parse({}));
  EXPECT_NE(text.find("\n[data]\n"), std::string::npos);
  EXPECT_NE(text.find("\ndata-order = \"shuffled\"\n"), std::string::npos) << text;
  TempDir dir;
  const std::string file =
      write_file(dir, "order.toml", "[data]\ndata = \"text:a.txt\"\ndata-order = \"sequential\"\n");
  EXPECT_EQ(parse({"--config", file}).data_order, DataOrder::kSequential);
  EXPECT_EQ(parse({"--config", file, "--data-order", "shuffled"}).data_order, DataOrder::kShuffled);
  EXPECT_EQ(config_error({"--data-order", "random"}),
            "--data-order: unknown order 'random' (valid: shuffled, sequential)");
}

TEST(DataOrderOption, ResumeTakesTheCheckpointsOrder) {
  TempDir dir;
  for (const char* order : {"shuffled", "sequential"}) {
    const std::string ckpt = checkpoint(dir, {"--data-order", order});
    const RunConfig resumed = parse({"--resume", ckpt, "--steps", "8"});
    EXPECT_EQ(data_order_name(resumed.data_order), std::string(order));
    // The same value again is accepted; another changes the arithmetic and is refused.
    EXPECT_EQ(parse({"--resume", ckpt, "--steps", "8", "--data-order", order}).data_order,
              resumed.data_order);
    const char* other = std::string(order) == "shuffled" ? "sequential" : "shuffled";
    const std::string error =
        config_error({"--resume", ckpt, "--steps", "8", "--data-order", other});
    EXPECT_NE(error.find("conflicts with checkpoint"), std::string::npos) << error;
    EXPECT_NE(error.find(std::string("data-order = ") + order), std::string::npos) << error;
  }
}

// A run begun before --data-order existed read its file in the sequential order: resuming its
// checkpoint continues in that order, not today's default, and asking it to shuffle is refused.
TEST(DataOrderOption, CheckpointFromBeforeTheOptionKeepsTheSequentialOrder) {
  TempDir dir;
  const std::string old = checkpoint(dir, {}, without_data_order);
  const RunConfig resumed = parse({"--resume", old, "--steps", "8"});
  EXPECT_EQ(resumed.data_order, DataOrder::kSequential);
  EXPECT_NE(run_config_to_text(resumed).find("\ndata-order = \"sequential\"\n"), std::string::npos);
  EXPECT_EQ(parse({"--resume", old, "--steps", "8", "--data-order", "sequential"}).data_order,
            DataOrder::kSequential);
  const std::string error =
      config_error({"--resume", old, "--steps", "8", "--data-order", "shuffled"});
  EXPECT_NE(error.find("data-order = sequential"), std::string::npos) << error;
  // A new run from an old configuration file takes the default: the file does not say.
  const std::string file =
      write_file(dir, "old.toml", without_data_order(run_config_to_text(parse({}))));
  EXPECT_EQ(parse({"--config", file}).data_order, DataOrder::kShuffled);
}

}  // namespace
}  // namespace moe

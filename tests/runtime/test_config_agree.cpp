// Tests of the set-up check that every rank holds the same configuration
// (runtime/options/config_agree): the items compared, the digest buffer and its reduction on
// simulated ranks in one process, and config_agree itself over the real ranks (1 and 2), where rank
// 1 is given a different option.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "runtime/options/config_agree.hpp"

namespace moe {
namespace {

RunConfig parse(const std::vector<std::string>& args) {
  std::vector<const char*> argv = {"moe_rt"};
  for (const std::string& arg : args) argv.push_back(arg.c_str());
  return options_parse(static_cast<int>(argv.size()), argv.data());
}

// The element-wise MAX over simulated ranks, as allreduce_max computes it.
std::vector<int64_t> reduce_max(const std::vector<RunConfig>& ranks) {
  std::vector<int64_t> reduced = config_digest_buffer(config_agree_items(ranks[0]));
  for (const RunConfig& cfg : ranks) {
    const std::vector<int64_t> mine = config_digest_buffer(config_agree_items(cfg));
    for (size_t i = 0; i < reduced.size(); ++i) reduced[i] = std::max(reduced[i], mine[i]);
  }
  return reduced;
}

// The option named by the first disagreement among the simulated ranks, or "" when they agree.
std::string first_difference(const std::vector<RunConfig>& ranks) {
  const std::vector<ConfigItem> items = config_agree_items(ranks[0]);
  const size_t first = config_first_disagreement(reduce_max(ranks));
  return first == items.size() ? "" : items[first].option;
}

TEST(ConfigAgree, ItemsAreActionsThenEveryOptionButThreads) {
  const std::vector<ConfigItem> items = config_agree_items(parse({"--steps", "7"}));
  ASSERT_GT(items.size(), 30u);
  EXPECT_EQ(items[0].option, "--help");
  EXPECT_EQ(items[1].option, "--print-config");
  EXPECT_EQ(items[2].option, "--model");
  const auto has = [&](const std::string& option) {
    return std::any_of(items.begin(), items.end(),
                       [&](const ConfigItem& i) { return i.option == option; });
  };
  EXPECT_TRUE(has("--seed"));
  EXPECT_TRUE(has("--lr"));
  EXPECT_TRUE(has("--stats"));
  EXPECT_FALSE(has("--threads"));  // bitwise thread-count invariant: may differ per node
  EXPECT_NE(config_value_digest("5"), config_value_digest("6"));
  EXPECT_NE(config_value_digest(""), config_value_digest(std::string(1, '\0')));
}

TEST(ConfigAgree, FirstDisagreementOnSimulatedRanks) {
  const RunConfig base = parse({"--model", "micro"});
  EXPECT_EQ(first_difference({base}), "");
  EXPECT_EQ(first_difference({base, base, base}), "");
  EXPECT_EQ(first_difference({base, parse({"--model", "micro", "--threads", "3"})}), "");
  EXPECT_EQ(first_difference({base, base, parse({"--model", "micro", "--steps", "6"})}), "--steps");
  EXPECT_EQ(first_difference({parse({"--model", "micro", "--seed", "1"}), base}), "--seed");
  EXPECT_EQ(first_difference({base, parse({"--model", "micro", "--lr", "0.0030000000000000001"}),
                              parse({"--model", "micro", "--lr", "0.004", "--seed", "2"})}),
            "--seed");  // the first option in --help order; 3e-3 written longer is the same
  EXPECT_EQ(first_difference({base, parse({"--help"})}), "--help");
  EXPECT_EQ(first_difference({parse({"--print-config"}), base}), "--print-config");
  // Ranks that resolved the same --resume folder to different checkpoints (a live run wrote one
  // between their looks).
  RunConfig older = base, newer = base;
  older.resume_point.checkpoint = "ck/step-00000010.h5";
  newer.resume_point.checkpoint = "ck/step-00000020.h5";
  EXPECT_EQ(first_difference({older, older}), "");
  EXPECT_EQ(first_difference({older, newer}), "the checkpoint --resume resolved to");
  // Digest buffer: per item the digest and its complement.
  const std::vector<int64_t> one = config_digest_buffer({{"--a", "x"}, {"--b", ""}});
  ASSERT_EQ(one.size(), 4u);
  EXPECT_EQ(one[1], ~one[0]);
  EXPECT_EQ(config_first_disagreement(one), 2u);
}

// Over the real ranks: every rank throws the same SetupError, reported by rank 0 only.
TEST(ConfigAgree, RanksThatDifferAllStopWithOneMessage) {
  const Comm world = Comm::world();
  const RunConfig same = parse({"--model", "micro", "--threads", std::to_string(1 + world.rank())});
  EXPECT_NO_THROW(config_agree(world, same));
  if (world.size() < 2) return;
  const std::string steps = world.rank() == 1 ? "6" : "5";
  const std::string long_stats = std::string(1000, 's') + "\x01";
  try {
    config_agree(world, parse({"--model", "micro", "--steps", steps}));
    ADD_FAILURE() << "no SetupError";
  } catch (const SetupError& e) {
    EXPECT_EQ(e.report(), world.rank() == 0);
    EXPECT_EQ(std::string(e.what()),
              "ranks disagree on the configuration: --steps is '5' on rank 0 but '6' on rank 1 "
              "(give every rank the same options and config file contents)");
  }
  try {
    config_agree(world,
                 parse({"--model", "micro", "--stats", world.rank() == 0 ? "a.h5" : long_stats}));
    ADD_FAILURE() << "no SetupError";
  } catch (const SetupError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("--stats is 'a.h5' on rank 0 but 'sss"), std::string::npos) << message;
    EXPECT_NE(message.find("…(1001 bytes)' on rank 1"), std::string::npos) << message;
  }
  // The same --resume folder, resolved to different checkpoints (a live run wrote between the
  // ranks' looks): the message says so instead of asking for the same options.
  RunConfig resumed = same;
  resumed.resume = "ck";
  resumed.resume_point.checkpoint =
      world.rank() == 1 ? "ck/step-00000020.h5" : "ck/step-00000010.h5";
  try {
    config_agree(world, resumed);
    ADD_FAILURE() << "no SetupError";
  } catch (const SetupError& e) {
    EXPECT_EQ(std::string(e.what()),
              "ranks chose different checkpoints of --resume ck: 'ck/step-00000010.h5' on rank 0 "
              "but 'ck/step-00000020.h5' on rank 1 (a live run is writing to that folder): name a "
              "checkpoint file");
  }
}

}  // namespace
}  // namespace moe

// Tests of the run configuration: presets, precedence (command line > config file > preset),
// every error naming its option, --help, and run_config_to_text read back through --config.
// Plain functions of argv: every rank runs them, each with its own temporary files.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <initializer_list>
#include <string>
#include <vector>

#include "options_test_util.hpp"
#include "runtime/options/config_agree.hpp"
#include "runtime/options/config_file.hpp"
#include "runtime/options/option_table.hpp"
#include "runtime/options/options.hpp"
#include "runtime/options/presets.hpp"
#include "test_tempdir.hpp"

namespace moe {
namespace {

using testing_util::TempDir;

using testing_options::parse;
using testing_options::write_file;

// Parsing `args` must throw a ConfigError whose message contains every one of `words`.
void expect_config_error(const std::vector<std::string>& args,
                         std::initializer_list<std::string> words) {
  std::string joined;
  for (const std::string& arg : args) joined += arg + " ";
  try {
    parse(args);
    ADD_FAILURE() << "no ConfigError for: " << joined;
  } catch (const ConfigError& e) {
    const std::string message = e.what();
    for (const std::string& word : words) {
      EXPECT_NE(message.find(word), std::string::npos)
          << "'" << word << "' not in: " << message << " (args: " << joined << ")";
    }
  }
}

void expect_model_eq(const ModelConfig& a, const ModelConfig& b) {
  EXPECT_EQ(a.vocab, b.vocab);
  EXPECT_EQ(a.d_model, b.d_model);
  EXPECT_EQ(a.layers, b.layers);
  EXPECT_EQ(a.hash_layers, b.hash_layers);
  EXPECT_EQ(a.heads, b.heads);
  EXPECT_EQ(a.kv_heads, b.kv_heads);
  EXPECT_EQ(a.head_dim, b.head_dim);
  EXPECT_EQ(a.experts, b.experts);
  EXPECT_EQ(a.top_k, b.top_k);
  EXPECT_EQ(a.shared_experts, b.shared_experts);
  EXPECT_EQ(a.ffn_dim, b.ffn_dim);
  EXPECT_EQ(a.seq_len, b.seq_len);
  EXPECT_EQ(a.batch_per_rank, b.batch_per_rank);
  EXPECT_EQ(a.score_func, b.score_func);
  EXPECT_EQ(a.route_scale, b.route_scale);  // exact: the text form round-trips bit for bit
  EXPECT_EQ(a.swiglu_limit, b.swiglu_limit);
  EXPECT_EQ(a.rope_theta, b.rope_theta);
  EXPECT_EQ(a.sliding_window, b.sliding_window);
  EXPECT_EQ(a.norm_eps, b.norm_eps);
}

void expect_run_eq(const RunConfig& a, const RunConfig& b) {
  expect_model_eq(a.model, b.model);
  EXPECT_EQ(a.model_name, b.model_name);
  EXPECT_EQ(a.steps, b.steps);
  EXPECT_EQ(a.seed, b.seed);
  EXPECT_EQ(a.data, b.data);
  EXPECT_EQ(a.data_order, b.data_order);
  EXPECT_EQ(a.stats_path, b.stats_path);
  EXPECT_EQ(a.lr, b.lr);
  EXPECT_EQ(a.warmup_steps, b.warmup_steps);
  EXPECT_EQ(a.weight_decay, b.weight_decay);
  EXPECT_EQ(a.grad_clip, b.grad_clip);
  EXPECT_EQ(a.routing, b.routing);  // every [routing] option
  EXPECT_EQ(a.ep, b.ep);
  EXPECT_EQ(a.threads, b.threads);
}

TEST(Presets, DeepseekTinyIsSpecSection2) {
  const ModelConfig c = preset_model("deepseek4-tiny");
  EXPECT_EQ(c.vocab, 2048);
  EXPECT_EQ(c.d_model, 128);
  EXPECT_EQ(c.layers, 7);
  EXPECT_EQ(c.hash_layers, 3);
  EXPECT_EQ(c.heads, 4);
  EXPECT_EQ(c.kv_heads, 1);
  EXPECT_EQ(c.head_dim, 32);
  EXPECT_EQ(c.experts, 8);
  EXPECT_EQ(c.top_k, 3);
  EXPECT_EQ(c.shared_experts, 1);
  EXPECT_EQ(c.ffn_dim, 128);
  EXPECT_EQ(c.seq_len, 256);
  EXPECT_EQ(c.batch_per_rank, 1);
  EXPECT_EQ(c.score_func, ScoreFunc::kSqrtSoftplus);
  EXPECT_EQ(c.route_scale, 1.5f);
  EXPECT_EQ(c.swiglu_limit, 10.0f);
  EXPECT_EQ(c.rope_theta, 10000.0f);
  EXPECT_EQ(c.sliding_window, 128);
  EXPECT_EQ(c.norm_eps, 1e-6f);
}

TEST(Presets, EveryPresetIsValidAndUnknownListsThem) {
  EXPECT_EQ(preset_names(),
            (std::vector<std::string>{"deepseek4-tiny", "deepseek4-fine", "micro"}));
  for (const std::string& name : preset_names()) {
    EXPECT_NO_THROW(run_config_validate(parse({"--model", name}))) << name;
  }
  EXPECT_EQ(preset_model("micro").vocab, 64);
  EXPECT_THROW(preset_model("deepseek4-huge"), ConfigError);
  expect_config_error({"--model", "deepseek4-huge"}, {"--model", "deepseek4-huge", "micro"});
}

// deepseek4-fine: deepseek4-tiny's widths outside the experts, DeepSeek-V3's group-limited routing
// (set by the preset, overridable like any option), and about the same expert width per token.
TEST(Presets, FineGrainedPresetSetsItsExpertGroups) {
  const RunConfig fine = parse({"--model", "deepseek4-fine"});
  const ModelConfig tiny = preset_model("deepseek4-tiny");
  EXPECT_EQ(fine.model.experts, 64);
  EXPECT_EQ(fine.model.top_k, 8);
  EXPECT_EQ(fine.model.ffn_dim, 56);
  EXPECT_EQ(fine.model.shared_experts, 1);
  EXPECT_EQ(fine.routing.routing_groups, 8);
  EXPECT_EQ(fine.routing.group_topk, 4);
  EXPECT_EQ(fine.model.d_model, tiny.d_model);
  EXPECT_EQ(fine.model.layers, tiny.layers);
  EXPECT_EQ(fine.model.seq_len, tiny.seq_len);
  const int fine_width = (fine.model.top_k + fine.model.shared_experts) * fine.model.ffn_dim;
  const int tiny_width = (tiny.top_k + tiny.shared_experts) * tiny.ffn_dim;
  EXPECT_NEAR(fine_width, tiny_width, 0.02 * tiny_width);
  // The other presets leave group-limited routing off; the command line and a file win.
  EXPECT_EQ(parse({}).routing.routing_groups, 1);
  EXPECT_EQ(parse({"--model", "micro"}).routing.routing_groups, 1);
  const RunConfig plain = parse({"--model", "deepseek4-fine", "--routing-groups", "1"});
  EXPECT_EQ(plain.routing.routing_groups, 1);
  const TempDir dir;
  const RunConfig from_file = parse(
      {"--config", write_file(dir, "fine.toml", "model = \"deepseek4-fine\"\ngroup-topk = 2\n")});
  EXPECT_EQ(from_file.routing.routing_groups, 8);
  EXPECT_EQ(from_file.routing.group_topk, 2);
  // A top-k the groups cannot split is refused with the option named.
  expect_config_error({"--model", "deepseek4-fine", "--top-k", "6"}, {"--group-topk"});
}

TEST(Options, DefaultsAreThePreset) {
  const RunConfig cfg = parse({});
  expect_model_eq(cfg.model, preset_model("deepseek4-tiny"));
  EXPECT_EQ(cfg.model_name, "deepseek4-tiny");
  EXPECT_EQ(cfg.steps, 200);
  EXPECT_EQ(cfg.seed, 1234u);
  EXPECT_EQ(cfg.data, "synthetic");
  EXPECT_EQ(cfg.routing.bias_update_rate, 0.01);
  EXPECT_EQ(cfg.routing.seq_aux_loss_weight, 0.0001);
  EXPECT_EQ(forced_routing_name(cfg.routing.force_balance), "none");
  EXPECT_EQ(cfg.ep, 0);
  EXPECT_EQ(cfg.threads, 0);
  EXPECT_FALSE(cfg.help);
  EXPECT_FALSE(cfg.print_config);
  EXPECT_TRUE(cfg.stats_path.empty());  // a new file under runs/ at run time
  expect_model_eq(parse({"--model", "micro"}).model, preset_model("micro"));
}

TEST(Options, CommandLineOverridesPreset) {
  const RunConfig cfg = parse({"--layers", "43", "--hash-layers=3", "--score-func", "sigmoid",
                               "--swiglu-limit", "-1", "--seed", "18446744073709551615",
                               "--force-balance", "round-robin", "--stats", "out.h5"});
  EXPECT_EQ(cfg.model.layers, 43);
  EXPECT_EQ(cfg.model.hash_layers, 3);
  EXPECT_EQ(cfg.model.score_func, ScoreFunc::kSigmoid);
  EXPECT_EQ(cfg.model.swiglu_limit, -1.0f);
  EXPECT_EQ(cfg.seed, 18446744073709551615u);
  EXPECT_EQ(forced_routing_name(cfg.routing.force_balance), "round-robin");
  EXPECT_EQ(cfg.stats_path, "out.h5");
  EXPECT_EQ(cfg.model.d_model, 128);  // untouched fields keep the preset's value
}

TEST(Options, FlagsAloneMeanTrueAndTakeExplicitValues) {
  EXPECT_FALSE(parse({}).routing.bias_update_center);
  EXPECT_TRUE(parse({"--bias-update-center"}).routing.bias_update_center);
  EXPECT_TRUE(parse({"--check-bias", "--steps", "3"}).check_bias);
  EXPECT_FALSE(parse({"--overwrite=false"}).overwrite);
  const RunConfig cfg =
      parse({"--balance-loss-form", "maxtext", "--routing-groups", "2", "--group-topk", "1",
             "--force-balance", "random", "--trace-every", "5"});
  EXPECT_EQ(cfg.routing.balance_loss_form, BalanceLossForm::kMaxText);
  EXPECT_EQ(cfg.routing.routing_groups, 2);
  EXPECT_EQ(forced_routing_name(cfg.routing.force_balance), "random");
  EXPECT_EQ(cfg.trace_every, 5);
}

TEST(Options, CommandLineOverridesFileOverridesPreset) {
  TempDir dir;
  const std::string path = write_file(dir, "run.cfg",
                                      "# a comment\nmodel = micro\nlayers = 5\ntop-k = 1\n"
                                      "lr = 0.01\ndata = text:corpus.txt\n");
  const RunConfig cfg = parse({"--config", path, "--layers", "4"});
  EXPECT_EQ(cfg.config_path, path);
  EXPECT_EQ(cfg.model_name, "micro");
  EXPECT_EQ(cfg.model.layers, 4);  // command line
  EXPECT_EQ(cfg.model.top_k, 1);   // file
  EXPECT_EQ(cfg.lr, 0.01);         // file
  EXPECT_EQ(cfg.data, "text:corpus.txt");
  EXPECT_EQ(cfg.model.d_model, 16);  // the file's preset
  EXPECT_EQ(cfg.steps, 200);         // default
  // --model on the command line picks the preset under the file's other values.
  const RunConfig tiny = parse({"--model", "deepseek4-tiny", "--config", path});
  EXPECT_EQ(tiny.model_name, "deepseek4-tiny");
  EXPECT_EQ(tiny.model.d_model, 128);
  EXPECT_EQ(tiny.model.layers, 5);
}

TEST(Options, BadCommandLinesNameTheOption) {
  expect_config_error({"--bogus", "1"}, {"--bogus"});
  expect_config_error({"--lay", "4"}, {"--lay"});  // no abbreviations
  expect_config_error({"--top-k", "abc"}, {"--top-k", "abc", "integer"});
  expect_config_error({"--top-k", "2.5"}, {"--top-k", "2.5"});
  expect_config_error({"--lr", "fast"}, {"--lr", "fast"});
  expect_config_error({"--lr", "nan"}, {"--lr", "finite"});
  expect_config_error({"--seed", "-1"}, {"--seed", "-1"});
  expect_config_error({"--steps"}, {"--steps"});
  expect_config_error({"--steps", "3", "--steps", "4"}, {"--steps"});
  expect_config_error({"extra"}, {"positional"});
  expect_config_error({"--score-func", "relu"},
                      {"--score-func", "relu", "sqrtsoftplus, sigmoid, softmax"});
  expect_config_error({"--force-balance", "sometimes"},
                      {"--force-balance", "sometimes", "none, round-robin, random, zipf:ALPHA"});
  expect_config_error({"--force-balance", "hot:1.5"}, {"--force-balance", "hot:1.5"});
  expect_config_error({"--force-balance", "zipf:x"}, {"--force-balance", "zipf:x"});
  expect_config_error({"--balance-loss-form", "switch"},
                      {"--balance-loss-form", "switch", "deepseek, maxtext"});
  expect_config_error({"--check-bias", "maybe"}, {"--check-bias", "true or false"});
  expect_config_error({"--data", "bin:x"}, {"--data", "synthetic, synthetic:zipf=S, tokens:PATH"});
}

TEST(Options, ImpossibleValuesNameTheOption) {
  expect_config_error({"--top-k", "9"}, {"--top-k"});
  expect_config_error({"--routing-groups", "3"}, {"--routing-groups"});
  expect_config_error({"--routing-groups", "4", "--group-topk", "2"}, {"--group-topk"});
  expect_config_error({"--trace-every", "-1"}, {"--trace-every"});
  expect_config_error({"--hash-layers", "8"}, {"--hash-layers"});
  expect_config_error({"--kv-heads", "3"}, {"--kv-heads"});
  expect_config_error({"--steps", "0"}, {"--steps"});
  expect_config_error({"--lr", "0"}, {"--lr"});
  expect_config_error({"--warmup-steps", "-1"}, {"--warmup-steps"});
  expect_config_error({"--weight-decay", "-0.1"}, {"--weight-decay"});
  expect_config_error({"--grad-clip", "-1"}, {"--grad-clip"});
  expect_config_error({"--bias-update-rate", "-1e-3"}, {"--bias-update-rate"});
  expect_config_error({"--seq-aux-loss-weight", "-1"}, {"--seq-aux-loss-weight"});
  expect_config_error({"--ep", "-2"}, {"--ep"});
  expect_config_error({"--threads", "-1"}, {"--threads"});
}

// The cosine decays from the end of the warmup to --lr-decay-steps: a horizon within one step of
// the warmup's end would leave the rate at --lr for the whole run.
TEST(Options, DecayHorizonWithinTheWarmupIsRefusedNamingBoth) {
  expect_config_error({"--warmup-steps", "20", "--lr-decay-steps", "5"},
                      {"--lr-decay-steps=5", "--warmup-steps=20", "no step to decay", ">= 22"});
  expect_config_error({"--warmup-steps", "20", "--lr-decay-steps", "21"},
                      {"--lr-decay-steps=21", "--warmup-steps=20"});
  EXPECT_EQ(parse({"--warmup-steps", "20", "--lr-decay-steps", "22"}).lr_decay_steps, 22);
  // 0 means --steps: a run shorter than its warmup stays legal (it is all warmup).
  EXPECT_EQ(parse({"--warmup-steps", "20", "--steps", "5"}).lr_decay_steps, 0);
}

TEST(Options, BadConfigFilesNameTheFileAndKey) {
  TempDir dir;
  const std::string missing = write_file(dir, "present.cfg", "") + ".absent";
  expect_config_error({"--config", missing}, {"--config", missing});
  const std::string unknown = write_file(dir, "unknown.cfg", "layers = 4\nbogus-key = 1\n");
  expect_config_error({"--config", unknown}, {"bogus-key", unknown});
  const std::string nested = write_file(dir, "nested.cfg", "config = other.cfg\n");
  expect_config_error({"--config", nested}, {"config", nested});
  const std::string bad_value = write_file(dir, "bad_value.cfg", "top-k = abc\n");
  expect_config_error({"--config", bad_value}, {"--top-k", "abc"});
  const std::string bad_line = write_file(dir, "bad_line.cfg", "layers 4\n");
  expect_config_error({"--config", bad_line}, {bad_line, "layers 4"});
  const std::string bad_model = write_file(dir, "bad_model.cfg", "model = gpt5\n");
  expect_config_error({"--config", bad_model}, {bad_model, "line 1", "--model", "gpt5", "micro"});
  const std::string later = write_file(dir, "later.cfg", "# top-k next\nsteps = 2\ntop-k = x\n");
  expect_config_error({"--config", later}, {later, "line 3", "--top-k", "'x'"});
  const std::string twice = write_file(dir, "twice.cfg", "steps = 2\nsteps = 3\n");
  expect_config_error({"--config", twice},
                      {twice, "line 2", "invalid TOML", "redefine", "'steps'"});
  const std::string quote = write_file(dir, "quote.cfg", "stats = \"a.h5\n");
  expect_config_error({"--config", quote}, {quote, "line 1", "invalid TOML", "stats = \"a.h5"});
  const std::string empty = write_file(dir, "empty.cfg", "");
  EXPECT_EQ(parse({"--config", empty}).steps, 200);
}

// Errors quote a bounded, escaped excerpt of the user's text, never megabytes or raw bytes.
TEST(Options, ErrorsQuoteAnExcerptOfTheValue) {
  const auto message_of = [](const std::vector<std::string>& args) {
    try {
      parse(args);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    ADD_FAILURE() << "no ConfigError";
    return std::string();
  };
  const std::string huge(10 * 1000 * 1000, '7');
  std::string message = message_of({"--top-k", huge + "x"});
  EXPECT_LT(message.size(), 200u);
  EXPECT_NE(message.find("--top-k: invalid value '7777"), std::string::npos) << message;
  EXPECT_NE(message.find("…(10000001 bytes)' (expected an integer)"), std::string::npos);
  for (const char* option : {"--bias-update-center", "--model", "--score-func", "--force-balance",
                             "--balance-loss-form", "--data"}) {
    message = message_of({option, huge + "\n"});
    EXPECT_LT(message.size(), 300u) << option;
    EXPECT_NE(message.find(option), std::string::npos) << message;
    EXPECT_NE(message.find("…(10000001 bytes)"), std::string::npos) << message;
  }
  EXPECT_NE(message_of({"--score-func", "re\x01lu\x1b[31m"}).find("'re\\x01lu\\x1B[31m'"),
            std::string::npos);
  message = message_of({"--" + huge});
  EXPECT_LT(message.size(), 200u);
  EXPECT_NE(message.find("unknown option '--777"), std::string::npos) << message;

  TempDir dir;
  const std::string big = write_file(dir, "big.cfg", "steps = 2\nlayers = " + huge + "\n");
  message = message_of({"--config", big});
  EXPECT_LT(message.size(), 300u);
  EXPECT_NE(message.find(big + "' line 2: --layers: invalid value '777"), std::string::npos)
      << message;
  const std::string key = write_file(dir, "key.cfg", huge + " = 1\n");
  message = message_of({"--config", key});
  EXPECT_LT(message.size(), 300u);
  EXPECT_NE(message.find("line 1: unknown key '777"), std::string::npos) << message;
  const std::string nul = write_file(dir, "nul.cfg", std::string("steps = 2\0\x07\n", 12));
  message = message_of({"--config", nul});
  EXPECT_NE(message.find("line 1: invalid TOML ("), std::string::npos) << message;
  EXPECT_NE(message.find("in 'steps = 2\\x00\\x07'"), std::string::npos) << message;
}

TEST(Options, HelpIsFlaggedAndListsEveryOption) {
  const RunConfig cfg = parse({"--help"});
  EXPECT_TRUE(cfg.help);
  EXPECT_TRUE(parse({"--layers", "4", "--help"}).help);
  EXPECT_TRUE(parse({"--print-config"}).print_config);
  const std::string help = options_help_text();
  for (const char* option : {"--model",
                             "--steps",
                             "--seed",
                             "--batch-per-rank",
                             "--seq-len",
                             "--layers",
                             "--hash-layers",
                             "--experts",
                             "--top-k",
                             "--shared-experts",
                             "--d-model",
                             "--ffn-dim",
                             "--heads",
                             "--kv-heads",
                             "--head-dim",
                             "--vocab",
                             "--score-func",
                             "--route-scale",
                             "--swiglu-limit",
                             "--sliding-window",
                             "--bias-update-rate",
                             "--seq-aux-loss-weight",
                             "--force-balance",
                             "--data",
                             "--stats",
                             "--lr",
                             "--warmup-steps",
                             "--weight-decay",
                             "--grad-clip",
                             "--ep",
                             "--threads",
                             "--config",
                             "--help",
                             "--print-config",
                             "--rope-theta",
                             "--norm-eps"}) {
    EXPECT_NE(help.find(option), std::string::npos) << option;
  }
  EXPECT_NE(help.find("(=200)"), std::string::npos) << help;  // defaults are shown
  EXPECT_NE(help.find("(=2048)"), std::string::npos) << help;
  EXPECT_NE(help.find("micro"), std::string::npos) << help;
}

TEST(Options, TextRoundTripsThroughConfigFile) {
  const RunConfig changed = parse({"--model",
                                   "micro",
                                   "--steps",
                                   "21",
                                   "--seed",
                                   "987654321987654321",
                                   "--batch-per-rank",
                                   "3",
                                   "--seq-len",
                                   "40",
                                   "--layers",
                                   "6",
                                   "--hash-layers",
                                   "2",
                                   "--experts",
                                   "6",
                                   "--top-k",
                                   "3",
                                   "--shared-experts",
                                   "2",
                                   "--d-model",
                                   "24",
                                   "--ffn-dim",
                                   "20",
                                   "--heads",
                                   "4",
                                   "--kv-heads",
                                   "2",
                                   "--head-dim",
                                   "6",
                                   "--vocab",
                                   "300",
                                   "--score-func",
                                   "softmax",
                                   "--route-scale",
                                   "0.1",
                                   "--swiglu-limit",
                                   "7.25",
                                   "--sliding-window",
                                   "0",
                                   "--rope-theta",
                                   "500000",
                                   "--norm-eps",
                                   "1e-5",
                                   "--bias-update-rate",
                                   "0.3",
                                   "--seq-aux-loss-weight",
                                   "3.3333333333333335e-05",
                                   "--force-balance",
                                   "round-robin",
                                   "--data",
                                   "tokens:/data/fineweb_train_000001.bin",
                                   "--data-order",
                                   "sequential",
                                   "--stats",
                                   "runs/a.h5",
                                   "--lr",
                                   "3e-5",
                                   "--warmup-steps",
                                   "0",
                                   "--weight-decay",
                                   "0",
                                   "--grad-clip",
                                   "0.5",
                                   "--ep",
                                   "2",
                                   "--threads",
                                   "3"});
  TempDir dir;
  for (const RunConfig& original : {changed, parse({})}) {
    const std::string text = run_config_to_text(original);
    const std::string path = write_file(dir, "resolved.cfg", text);
    const RunConfig reread = parse({"--config", path});
    expect_run_eq(reread, original);
    EXPECT_EQ(run_config_to_text(reread), text);
  }
  // Every configuration option is a key of the text.
  const std::string text = run_config_to_text(changed);
  for (const char* key : {"model", "steps", "seed", "vocab", "rope-theta", "norm-eps", "stats",
                          "threads", "ep", "force-balance", "score-func"}) {
    const std::string line_start = std::string("\n").append(key).append(" = ");
    EXPECT_NE(text.find(line_start), std::string::npos) << key;
  }
  EXPECT_NE(text.find("route-scale = 0.1\n"), std::string::npos) << text;
}

// --print-config output read back with --config gives the same configuration, whatever the text
// of the string options: each value is written quoted where the config-file syntax needs it.
TEST(Options, AwkwardValuesRoundTripThroughConfigFile) {
  const std::vector<std::string> values = {
      "run#1.h5",
      "#",
      "# x",
      "a #b",
      "\"",
      "say \"hi\"",
      "\\",
      "C:\\dir\\",
      "\\\"",
      " lead",
      "trail ",
      "\t",
      "a=b",
      "= x =",
      "é€😀 ünïcödé",
      "",
      "new\nline",
      "\x01\x7f",
      std::string(5000, 'L') + " # " + std::string(5000, '"'),
  };
  TempDir dir;
  for (const std::string& value : values) {
    std::vector<std::string> args = {"--stats", value, "--hash-table", value};
    if (!value.empty()) args.insert(args.end(), {"--data", "text:" + value});
    const RunConfig original = parse(args);
    ASSERT_EQ(original.stats_path, value);
    const std::string text = run_config_to_text(original);
    const RunConfig reread = parse({"--config", write_file(dir, "awkward.cfg", text)});
    EXPECT_EQ(reread.stats_path, value) << text;
    EXPECT_EQ(reread.routing.hash_table_path, value);
    EXPECT_EQ(reread.data, original.data);
    expect_run_eq(reread, original);
    EXPECT_EQ(run_config_to_text(reread), text);
  }
  // The example of the config-file section: `#` inside a word was cut by Boost's parser.
  const std::string text = run_config_to_text(parse({"--stats", "run#1.h5"}));
  EXPECT_NE(text.find("\nstats = \"run#1.h5\"\n"), std::string::npos) << text;
}

// The range column of the option table: each option's own bounds, in one message form.
TEST(Options, RangesComeFromTheTableWithOneMessageForm) {
  auto message = [](const std::vector<std::string>& args) {
    try {
      parse(args);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no ConfigError");
  };
  EXPECT_EQ(message({"--steps", "0"}), "--steps must be positive, got 0");
  EXPECT_EQ(message({"--lr", "-1e-3"}),
            "--lr must be positive and within float range (<= 3.4e38), got -0.001");
  EXPECT_EQ(message({"--lr", "1e39"}),
            "--lr must be positive and within float range (<= 3.4e38), got 1e+39");
  EXPECT_EQ(message({"--grad-clip", "-1"}),
            "--grad-clip must be >= 0 and within float range (<= 3.4e38), got -1");
  EXPECT_EQ(message({"--trace-every", "-1"}), "--trace-every must be >= 0 (0 = off), got -1");
  EXPECT_EQ(message({"--keep-checkpoints", "0"}), "--keep-checkpoints must be >= 1, got 0");
  EXPECT_EQ(message({"--threads", "1025"}),
            "--threads must be in [0, 1024] (0 = default), got 1025");
  EXPECT_EQ(message({"--eval-every", "-2"}),
            "--eval-every must be >= 0 (0 = after the last step only), got -2");
  // The edges are accepted.
  EXPECT_EQ(parse({"--threads", "1024", "--keep-checkpoints", "1", "--grad-clip", "0"}).threads,
            1024);
}

// Every row of the option table reaches every place an option goes: --help, the config file
// (--print-config's text reads back), the statistics file's /config (run_config_values), the
// ranks' agreement unless per-rank, and --help's lists of the resume rules unless the option is
// the checkpoint's. A new option is one row, and this test covers it.
TEST(Options, EveryTableRowReachesEveryPlace) {
  const RunConfig cfg = parse({});
  const std::string help = options_help_text();
  const std::string text = run_config_to_text(cfg);
  const std::string resume_rules = help.substr(help.find("\nOn --resume"));
  const std::vector<RunConfigValue> values = run_config_values(cfg);
  const std::vector<ConfigItem> agreed = config_agree_items(cfg);
  ASSERT_EQ(values.size(), option_fields().size());
  size_t i = 0;
  for (const OptionField& f : option_fields()) {
    const std::string name = f.name, option = "--" + name;
    EXPECT_NE(help.find("\n  " + option + " "), std::string::npos) << option;
    EXPECT_NE(text.find("\n" + name + " = "), std::string::npos) << option;
    EXPECT_EQ(values[i++].name, name);
    const bool in_agreement = std::any_of(agreed.begin(), agreed.end(),
                                          [&](const auto& a) { return a.option == option; });
    EXPECT_EQ(in_agreement, !f.rules.per_rank) << option;
    // In a resume list exactly when continued or own ("--steps," or "--steps\n").
    const bool listed = resume_rules.find(" " + option + ",") != std::string::npos ||
                        resume_rules.find(" " + option + "\n") != std::string::npos;
    EXPECT_EQ(listed, f.rules.on_resume != OnResume::kFromCheckpoint) << option;
    if (f.rules.range) {
      EXPECT_TRUE(f.number) << option << ": a range on a value that is no number";
    }
  }
  // --print-config's text reads back to the same configuration.
  TempDir dir;
  const RunConfig back = parse({"--config", write_file(dir, "all.conf", text)});
  EXPECT_EQ(run_config_to_text(back), text);
}

}  // namespace
}  // namespace moe

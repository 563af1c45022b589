// ModelConfig validation, the expert-parallel layout check, the default --ep and score function
// names: every bad value throws ConfigError naming its command-line option.
// Legend: V vocab, D model width, L layers, L_h hash layers, E experts, K top-k, F expert width,
// W ranks, P expert-parallel group size.
#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "model/config.hpp"

namespace moe {
namespace {

// Validating `cfg` throws ConfigError whose message contains `option`.
void expect_rejected(const std::function<void()>& validate, const std::string& option) {
  try {
    validate();
    ADD_FAILURE() << "accepted, expected a ConfigError naming " << option;
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find(option), std::string::npos)
        << "message does not name " << option << ": " << e.what();
  }
}

void expect_model_rejected(const std::function<void(ModelConfig&)>& edit,
                           const std::string& option) {
  ModelConfig cfg;
  edit(cfg);
  expect_rejected([&] { model_config_validate(cfg); }, option);
}

TEST(ModelConfig, DefaultsValidate) {
  const ModelConfig cfg;
  EXPECT_NO_THROW(model_config_validate(cfg));
  // The deepseek4-tiny preset (docs/architecture.md, "The model").
  EXPECT_EQ(cfg.vocab, 2048);
  EXPECT_EQ(cfg.d_model, 128);
  EXPECT_EQ(cfg.layers, 7);
  EXPECT_EQ(cfg.hash_layers, 3);
  EXPECT_EQ(cfg.experts, 8);
  EXPECT_EQ(cfg.top_k, 3);
  EXPECT_EQ(cfg.score_func, ScoreFunc::kSqrtSoftplus);
  EXPECT_EQ(cfg.route_scale, 1.5f);
  EXPECT_EQ(cfg.swiglu_limit, 10.0f);
}

TEST(ModelConfig, TopKMustBePositiveAndAtMostExperts) {
  expect_model_rejected([](ModelConfig& c) { c.top_k = 9; }, "--top-k");
  expect_model_rejected([](ModelConfig& c) { c.top_k = 0; }, "--top-k");
  expect_model_rejected([](ModelConfig& c) { c.top_k = -2; }, "--top-k");
  ModelConfig all_experts;
  all_experts.top_k = all_experts.experts;  // K == E is allowed
  EXPECT_NO_THROW(model_config_validate(all_experts));
}

TEST(ModelConfig, WidthsMustBePositive) {
  expect_model_rejected([](ModelConfig& c) { c.vocab = 0; }, "--vocab");
  expect_model_rejected([](ModelConfig& c) { c.d_model = -1; }, "--d-model");
  expect_model_rejected([](ModelConfig& c) { c.layers = 0; }, "--layers");
  expect_model_rejected([](ModelConfig& c) { c.heads = 0; }, "--heads");
  expect_model_rejected([](ModelConfig& c) { c.kv_heads = 0; }, "--kv-heads");
  expect_model_rejected([](ModelConfig& c) { c.head_dim = 0; }, "--head-dim");
  expect_model_rejected([](ModelConfig& c) { c.experts = 0; }, "--experts");
  expect_model_rejected([](ModelConfig& c) { c.ffn_dim = 0; }, "--ffn-dim");
  expect_model_rejected([](ModelConfig& c) { c.seq_len = 0; }, "--seq-len");
  expect_model_rejected([](ModelConfig& c) { c.batch_per_rank = 0; }, "--batch-per-rank");
}

TEST(ModelConfig, HashLayersWithinLayers) {
  expect_model_rejected([](ModelConfig& c) { c.hash_layers = 8; }, "--hash-layers");
  expect_model_rejected([](ModelConfig& c) { c.hash_layers = -1; }, "--hash-layers");
  ModelConfig all_hash, no_hash;
  all_hash.hash_layers = all_hash.layers;
  no_hash.hash_layers = 0;
  EXPECT_NO_THROW(model_config_validate(all_hash));
  EXPECT_NO_THROW(model_config_validate(no_hash));
}

TEST(ModelConfig, KvHeadsMustDivideHeads) {
  expect_model_rejected([](ModelConfig& c) { c.kv_heads = 3; }, "--kv-heads");
  ModelConfig mha;
  mha.kv_heads = mha.heads;
  EXPECT_NO_THROW(model_config_validate(mha));
}

TEST(ModelConfig, OtherBadValuesNameTheirOption) {
  expect_model_rejected([](ModelConfig& c) { c.shared_experts = -1; }, "--shared-experts");
  expect_model_rejected([](ModelConfig& c) { c.head_dim = 31; }, "--head-dim");
  expect_model_rejected([](ModelConfig& c) { c.sliding_window = -1; }, "--sliding-window");
  expect_model_rejected([](ModelConfig& c) { c.route_scale = 0.0f; }, "--route-scale");
  expect_model_rejected([](ModelConfig& c) { c.norm_eps = 0.0f; }, "--norm-eps");
}

TEST(ParallelConfig, EpMustDivideRanksAndNotExceedExperts) {
  const ModelConfig cfg;  // E = 8
  EXPECT_NO_THROW(parallel_config_validate(cfg, 8, 8));
  EXPECT_NO_THROW(parallel_config_validate(cfg, 8, 4));
  EXPECT_NO_THROW(parallel_config_validate(cfg, 6, 3));
  EXPECT_NO_THROW(parallel_config_validate(cfg, 1, 1));
  expect_rejected([&] { parallel_config_validate(cfg, 8, 3); }, "--ep");    // P does not divide W
  expect_rejected([&] { parallel_config_validate(cfg, 16, 16); }, "--ep");  // E < P
  expect_rejected([&] { parallel_config_validate(cfg, 8, 0); }, "--ep");
  ModelConfig few_experts;
  few_experts.experts = 2;
  few_experts.top_k = 2;
  expect_rejected([&] { parallel_config_validate(few_experts, 4, 4); }, "--ep");
}

TEST(ParallelConfig, DefaultEpIsLargestDivisorOfRanksAtMostExperts) {
  EXPECT_EQ(default_ep_size(8, 8), 8);
  EXPECT_EQ(default_ep_size(8, 3), 2);
  EXPECT_EQ(default_ep_size(6, 4), 3);
  EXPECT_EQ(default_ep_size(1, 8), 1);
  EXPECT_EQ(default_ep_size(16, 8), 8);
  EXPECT_EQ(default_ep_size(7, 8), 7);
  EXPECT_EQ(default_ep_size(7, 6), 1);  // prime W above E: no expert parallelism
  // The default always passes the layout check.
  ModelConfig cfg;
  for (int w = 1; w <= 16; ++w) {
    EXPECT_NO_THROW(parallel_config_validate(cfg, w, default_ep_size(w, cfg.experts))) << w;
  }
}

TEST(ScoreFuncName, RoundTripsAndRejectsUnknown) {
  for (ScoreFunc f : {ScoreFunc::kSqrtSoftplus, ScoreFunc::kSigmoid, ScoreFunc::kSoftmax}) {
    EXPECT_EQ(score_func_from_name(score_func_name(f)), f);
  }
  EXPECT_EQ(score_func_from_name("sqrtsoftplus"), ScoreFunc::kSqrtSoftplus);
  EXPECT_EQ(score_func_from_name("sigmoid"), ScoreFunc::kSigmoid);
  EXPECT_EQ(score_func_from_name("softmax"), ScoreFunc::kSoftmax);
  expect_rejected([] { score_func_from_name("relu"); }, "--score-func");
  expect_rejected([] { score_func_from_name(""); }, "--score-func");
  EXPECT_STREQ(routing_mode_name(RoutingMode::kHash), "hash");
  EXPECT_STREQ(routing_mode_name(RoutingMode::kTopK), "topk");
  EXPECT_STREQ(routing_mode_name(RoutingMode::kRoundRobin), "forced");
}

}  // namespace
}  // namespace moe

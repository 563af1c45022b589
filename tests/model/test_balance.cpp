// Load-balancing formulas against hand-computed values and their definitions; the balance loss
// gradient against finite differences; the bias update and the balance metrics.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "model/balance.hpp"
#include "model/rng.hpp"
#include "model/routing_config.hpp"

namespace moe {
namespace {

// S = 2 tokens, E = 3, K = 1. Scores: t0 = (3, 1, 0) -> top-1 expert 0; t1 = (1, 1, 2) -> 2.
// f = E/(K·S)·count = 1.5·(1, 0, 1); P = mean of normalised rows = ((3/4 + 1/4)/2,
// (1/4 + 1/4)/2, (0 + 1/2)/2) = (0.5, 0.25, 0.25); Σ f·P = 1.5·0.5 + 1.5·0.25 = 1.125.
TEST(BalanceLoss, DeepSeekFormHandValue) {
  const std::vector<double> s = {3, 1, 0, 1, 1, 2};
  const std::vector<int32_t> sel = {0, 2};
  const std::vector<float> bias = {0, 0, 0};
  std::vector<double> d(6), scratch;
  std::vector<int32_t> topk(2);
  const double loss =
      balance_loss_forward_backward(d.data(), topk.data(), scratch, s.data(), sel.data(),
                                    bias.data(), 1, 2, 3, 1, 0.1, BalanceLossForm::kDeepSeek);
  EXPECT_NEAR(loss, 0.1 * 1.125, 1e-15);
}

// The DeepSeek form counts the top-k of UNBIASED scores, not the actual (biased) selection.
TEST(BalanceLoss, DeepSeekFormIgnoresBiasAndSelection) {
  const std::vector<double> s = {3, 1, 0, 1, 1, 2};
  const std::vector<int32_t> sel_a = {0, 2}, sel_b = {1, 1};
  const std::vector<float> bias_a = {0, 0, 0}, bias_b = {0, 5, 0};
  std::vector<double> d(6), scratch;
  std::vector<int32_t> topk(2);
  const double a =
      balance_loss_forward_backward(d.data(), topk.data(), scratch, s.data(), sel_a.data(),
                                    bias_a.data(), 1, 2, 3, 1, 1.0, BalanceLossForm::kDeepSeek);
  const double b =
      balance_loss_forward_backward(d.data(), topk.data(), scratch, s.data(), sel_b.data(),
                                    bias_b.data(), 1, 2, 3, 1, 1.0, BalanceLossForm::kDeepSeek);
  EXPECT_EQ(a, b);
}

// MaxText: L = α·E·Σ_e d_e·p_e with d from the actual selection and p from softmax(s + b).
TEST(BalanceLoss, MaxTextFormMatchesItsDefinition) {
  const int S = 3, E = 4, K = 2;
  const std::vector<double> s = {0.3, 1.2, 0.1, 0.7, 0.9, 0.2, 0.4, 0.5, 0.1, 0.1, 1.5, 0.6};
  const std::vector<int32_t> sel = {1, 3, 0, 3, 2, 3};
  const std::vector<float> bias = {0.1f, -0.2f, 0.0f, 0.3f};
  double d[4] = {0}, p[4] = {0};
  for (int i = 0; i < S * K; ++i) d[sel[i]] += 1.0 / S;
  for (int t = 0; t < S; ++t) {
    double z = 0;
    for (int e = 0; e < E; ++e) z += std::exp(s[t * E + e] + bias[e]);
    for (int e = 0; e < E; ++e) p[e] += std::exp(s[t * E + e] + bias[e]) / z / S;
  }
  double expect = 0;
  for (int e = 0; e < E; ++e) expect += 0.01 * E * d[e] * p[e];
  std::vector<double> grad(S * E), scratch;
  std::vector<int32_t> topk(S * K);
  const double got =
      balance_loss_forward_backward(grad.data(), topk.data(), scratch, s.data(), sel.data(),
                                    bias.data(), 1, S, E, K, 0.01, BalanceLossForm::kMaxText);
  EXPECT_NEAR(got, expect, 1e-15);
}

// Central differences in double, h = 1e-6, tolerance 1e-8 absolute on gradients of size ~1e-2.
TEST(BalanceLoss, GradientMatchesFiniteDifferences) {
  const int B = 2, S = 5, E = 6, K = 2;
  std::vector<double> s(B * S * E);
  const uint64_t stream = rng_stream(1, "balance");
  for (size_t i = 0; i < s.size(); ++i) s[i] = 0.2 + rng_uniform(stream, i);
  std::vector<int32_t> sel(B * S * K), topk(B * S * K);
  for (size_t i = 0; i < sel.size(); ++i) sel[i] = static_cast<int32_t>((i * 7 + i / K) % E);
  const std::vector<float> bias = {0.1f, 0, -0.1f, 0.2f, 0, 0};
  for (BalanceLossForm form : {BalanceLossForm::kDeepSeek, BalanceLossForm::kMaxText}) {
    std::vector<double> grad(s.size()), scratch, unused(s.size());
    balance_loss_forward_backward(grad.data(), topk.data(), scratch, s.data(), sel.data(),
                                  bias.data(), B, S, E, K, 0.3, form);
    for (size_t i = 0; i < s.size(); ++i) {
      const double keep = s[i];
      s[i] = keep + 1e-6;
      const double lp =
          balance_loss_forward_backward(unused.data(), topk.data(), scratch, s.data(), sel.data(),
                                        bias.data(), B, S, E, K, 0.3, form);
      s[i] = keep - 1e-6;
      const double lm =
          balance_loss_forward_backward(unused.data(), topk.data(), scratch, s.data(), sel.data(),
                                        bias.data(), B, S, E, K, 0.3, form);
      s[i] = keep;
      EXPECT_NEAR(grad[i], (lp - lm) / 2e-6, 1e-8) << balance_loss_form_name(form) << " " << i;
    }
  }
}

TEST(BiasUpdate, SignOfDeficitAndCentring) {
  std::vector<float> b = {0, 0, 0, 0};
  const std::vector<int64_t> load = {10, 2, 4, 4};  // mean 5
  bias_update(b, load, 0.5, false);
  EXPECT_EQ(b, (std::vector<float>{-0.5f, 0.5f, 0.5f, 0.5f}));
  std::vector<float> c = {1, 1, 1, 1};
  bias_update(c, load, 0.5, true);  // steps (-0.5, 0.5, 0.5, 0.5) minus their mean 0.25
  EXPECT_EQ(c, (std::vector<float>{0.25f, 1.25f, 1.25f, 1.25f}));
  std::vector<float> even = {0.1f, 0.2f};
  bias_update(even, std::vector<int64_t>{3, 3}, 1.0, false);  // at the mean: no change
  EXPECT_EQ(even, (std::vector<float>{0.1f, 0.2f}));
}

// --shadow's rules: names read back to the same rules; every malformed list is refused by name.
TEST(ShadowRules, ParseNamesAndRefusals) {
  EXPECT_TRUE(shadow_rules_from_text("").empty());
  const std::vector<ShadowRule> rules =
      shadow_rules_from_text("sign:0.001,none,proportional:2,sign-centered:0");
  ASSERT_EQ(rules.size(), 4u);
  EXPECT_EQ(rules[0], (ShadowRule{ShadowKind::kSign, 0.001}));
  EXPECT_EQ(rules[1], (ShadowRule{ShadowKind::kNone, 0.0}));
  EXPECT_EQ(rules[2], (ShadowRule{ShadowKind::kProportional, 2.0}));
  EXPECT_EQ(rules[3], (ShadowRule{ShadowKind::kSignCentered, 0.0}));
  EXPECT_EQ(shadow_rules_text(rules), "sign:0.001,none,proportional:2,sign-centered:0");
  EXPECT_EQ(shadow_rules_from_text(shadow_rules_text(rules)), rules);
  EXPECT_EQ(shadow_rule_name({ShadowKind::kSign, 1e-3}), "sign:0.001");
  for (const char* bad :
       {"sign", "sign:", "sign:-1", "sign:abc", "sign:1e7", "sign:nan", "sign:0.1x", "bogus:1",
        "none,none", "none,,sign:1", "none,", "sign:0.1,sign:0.10", "none:1", " none"}) {
    try {
      shadow_rules_from_text(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("--shadow"), std::string::npos) << e.what();
    }
  }
}

// Each rule's update by hand; the sign rules are bias_update itself, bit for bit.
TEST(ShadowRules, BiasUpdateByRule) {
  const std::vector<int64_t> load = {10, 30, 20, 20};  // mean 20
  std::vector<float> bias = {0.5f, -0.25f, 0.0f, 1.0f};
  std::vector<float> b = bias;
  shadow_bias_update({ShadowKind::kProportional, 0.1}, b, load);
  EXPECT_EQ(b, (std::vector<float>{0.5f + 0.05f, -0.25f - 0.05f, 0.0f, 1.0f}));
  b = bias;
  shadow_bias_update({ShadowKind::kNone, 0.0}, b, load);
  EXPECT_EQ(b, bias);
  b = bias;
  shadow_bias_update({ShadowKind::kProportional, 0.1}, b, std::vector<int64_t>(4, 0));
  EXPECT_EQ(b, bias);  // no token routed: nothing to move by
  for (bool center : {false, true}) {
    std::vector<float> want = bias;
    bias_update(want, load, 0.01, center);
    b = bias;
    shadow_bias_update({center ? ShadowKind::kSignCentered : ShadowKind::kSign, 0.01}, b, load);
    EXPECT_EQ(b, want);
    EXPECT_NE(b, bias);
  }
}

TEST(BalanceMetrics, HandValues) {
  // Loads (6, 2, 2, 2): mean 3, variance (9 + 1 + 1 + 1)/4 = 3, violation (6 − 3)/3 = 1,
  // cv sqrt(3)/3.
  const BalanceMetrics m = balance_metrics(std::vector<int64_t>{6, 2, 2, 2});
  EXPECT_DOUBLE_EQ(m.variance, 3.0);
  EXPECT_DOUBLE_EQ(m.max_violation, 1.0);
  EXPECT_DOUBLE_EQ(m.cv, std::sqrt(3.0) / 3.0);
  const BalanceMetrics even = balance_metrics(std::vector<int64_t>{4, 4});
  EXPECT_EQ(even.variance, 0.0);
  EXPECT_EQ(even.max_violation, 0.0);
  EXPECT_DOUBLE_EQ(overload_factor(std::vector<int64_t>{30, 10, 20}), 1.5);
  EXPECT_DOUBLE_EQ(overload_factor(std::vector<int64_t>{0, 0}), 1.0);
}

}  // namespace
}  // namespace moe

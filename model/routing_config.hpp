// The routing and balancing settings of a run (docs/load-balancing.md), typed: how experts are
// selected (natural top-k, group-limited, or forced for throughput runs), the loss-free bias
// update, and the sequence-wise balance loss. The option table parses them once (the [routing]
// table of a config file); the run and its RoutingState (model.hpp) hold this one value, and
// every field has its option's name.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "model/config.hpp"

namespace moe {

// The form of the sequence-wise balance loss (balance.hpp has both formulas): DeepSeek's f·P per
// sequence summed over layers, or MaxText pull request #4190's (extra factor K, softmax of the
// biased scores, mean over layers).
enum class BalanceLossForm { kDeepSeek, kMaxText };
BalanceLossForm balance_loss_form_from_name(std::string_view name);  // ConfigError otherwise
const char* balance_loss_form_name(BalanceLossForm form);

// Forced random routing's skew (router.hpp, route_random): expert e drawn with weight
// (e + 1)^-zipf_alpha, and a hot_fraction of tokens taking expert 0 in their first slot.
struct RandomRouting {
  double zipf_alpha = 0.0;
  double hot_fraction = 0.0;
  bool operator==(const RandomRouting&) const = default;
};

// --force-balance: natural routing, or forced round-robin, or forced random with a skew.
struct ForcedRouting {
  bool forced = false;       // false: natural routing
  bool round_robin = false;  // else random with `skew`
  RandomRouting skew;
  // kTopK for natural routing (hash layers stay hash), else kRoundRobin or kRandom for every layer.
  RoutingMode mode() const;
  bool operator==(const ForcedRouting&) const = default;
};
// Parses "none", "round-robin", "random", "zipf:ALPHA" (ALPHA in [0, 10]) or "hot:FRACTION"
// ([0, 1]). Throws ConfigError naming --force-balance otherwise.
ForcedRouting forced_routing_from_name(std::string_view spec);
// The name forced_routing_from_name reads back to the same value: a skew is written as its
// shortest exact number ("zipf:0.5"); random without skew is "random".
std::string forced_routing_name(const ForcedRouting& forced);

// --drop-policy: which of an expert's assignments over its capacity are dropped
// (model/capacity.hpp): those of the smallest combine weights ("probs", Megatron-Core's
// default) or the latest in the sequence ("position").
enum class DropPolicy { kByProbability, kByPosition };
DropPolicy drop_policy_from_name(std::string_view name);  // ConfigError otherwise
const char* drop_policy_name(DropPolicy policy);

// --capacity-unit: the tokens a capacity is counted over: each sequence (the default: the same
// bits on any rank count) or all of a rank's tokens (Megatron-Core's per-rank capacity, which
// depends on how many sequences a rank holds, so on the rank count).
enum class CapacityUnit { kSequence, kRank };
CapacityUnit capacity_unit_from_name(std::string_view name);  // ConfigError otherwise
const char* capacity_unit_name(CapacityUnit unit);

// A shadow balancer (--shadow, docs/load-balancing.md "Shadow balancers"): a bias-update rule run
// beside training. It routes the run's own scores with a bias of its own, counts the global loads
// that routing would give, and moves its bias by its rule; nothing it does reaches training.
//   kSign:          b[e] += γ·sign(mean − c[e])                 (DeepSeek's, as --bias-update-rate)
//   kSignCentered:  the same, shifted to mean zero              (as --bias-update-center)
//   kProportional:  b[e] += γ·(mean − c[e]) / mean              (moved by the load error itself)
//   kNone:          b = 0: plain top-k of the scores
enum class ShadowKind { kNone, kSign, kSignCentered, kProportional };
struct ShadowRule {
  ShadowKind kind = ShadowKind::kNone;
  double rate = 0.0;  // γ (0 for kNone)
  bool operator==(const ShadowRule&) const = default;
};
// Parses "" (no shadows) or a comma-separated list of "none", "sign:γ", "sign-centered:γ",
// "proportional:γ" (γ a finite number in [0, 1e6]). Throws ConfigError naming --shadow on an
// unknown rule, a bad γ, an empty item or a rule given twice (two shadows with one name).
std::vector<ShadowRule> shadow_rules_from_text(std::string_view spec);
// A rule's name, which shadow_rules_from_text reads back to it: "sign:0.001" (γ as its shortest
// exact number), "none". The statistics file's group /shadow/<name>.
std::string shadow_rule_name(const ShadowRule& rule);
// The names joined by commas ("" for none).
std::string shadow_rules_text(const std::vector<ShadowRule>& rules);

// Defaults are the run's (moe_rt --help): natural routing, the loss-free bias at γ = 0.01
// (DeepSeek-V3 used 0.001 at a learning rate of 2.2e-4) and the balance loss at α = 0.0001.
struct RoutingConfig {
  ForcedRouting force_balance;          // natural unless forced
  int routing_groups = 1;               // G: group-limited when > 1
  int group_topk = 1;                   // M: groups a token may use
  double bias_update_rate = 0.01;       // γ of the loss-free bias, 0 = off
  bool bias_update_center = false;      // shift each update to mean 0
  double seq_aux_loss_weight = 0.0001;  // α of the balance loss, 0 = off
  BalanceLossForm balance_loss_form = BalanceLossForm::kDeepSeek;  // of the balance loss
  double z_loss_weight = 0.0;   // of the router z-loss (model/z_loss.hpp), 0 = off
  std::string hash_table_path;  // the hash layers' tables file, "" = seeded (routing_state_make)
  std::vector<ShadowRule> shadows;  // shadow balancers, none by default
  double capacity_factor = 0.0;     // C of the token capacity (model/capacity.hpp), 0 = dropless
  DropPolicy drop_policy = DropPolicy::kByProbability;   // which assignments over it are dropped
  CapacityUnit capacity_unit = CapacityUnit::kSequence;  // the tokens it is counted over
  bool operator==(const RoutingConfig&) const = default;
};

// Throws ConfigError naming the option whose value cannot run with `model`: G not dividing E; M
// not in [1, G], not dividing K, or leaving K/M above the experts of a group. (The values each
// option accepts by itself, γ and α at least 0 and within float range, are the option table's.)
void routing_config_validate(const RoutingConfig& routing, const ModelConfig& model);

}  // namespace moe

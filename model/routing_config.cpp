// The routing configuration's names, both ways, and its checks against the model.
#include "model/routing_config.hpp"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <string>

namespace moe {

BalanceLossForm balance_loss_form_from_name(std::string_view name) {
  if (name == "deepseek") return BalanceLossForm::kDeepSeek;
  if (name == "maxtext") return BalanceLossForm::kMaxText;
  throw ConfigError("--balance-loss-form: unknown form '" + std::string(name) +
                    "' (valid: deepseek, maxtext)");
}

const char* balance_loss_form_name(BalanceLossForm form) {
  return form == BalanceLossForm::kDeepSeek ? "deepseek" : "maxtext";
}

RoutingMode ForcedRouting::mode() const {
  if (!forced) return RoutingMode::kTopK;
  return round_robin ? RoutingMode::kRoundRobin : RoutingMode::kRandom;
}

ForcedRouting forced_routing_from_name(std::string_view spec) {
  ForcedRouting f;
  // The same strict form as every numeric option: the whole rest is one decimal number.
  auto number_after = [&](std::string_view prefix, double lo, double hi) {
    const std::string_view text = spec.substr(prefix.size());
    double v = -1;
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
    if (ec != std::errc() || end != text.data() + text.size() || text.empty() ||
        !(v >= lo && v <= hi)) {
      char range[48];
      std::snprintf(range, sizeof range, "[%g, %g]", lo, hi);
      throw ConfigError("--force-balance: '" + std::string(spec) + "' needs a number in " + range +
                        " after '" + std::string(prefix) + "'");
    }
    return v;
  };
  if (spec == "none") return f;
  f.forced = true;
  if (spec == "round-robin") {
    f.round_robin = true;
  } else if (spec == "random") {
  } else if (spec.starts_with("zipf:")) {
    f.skew.zipf_alpha = number_after("zipf:", 0.0, 10.0);
  } else if (spec.starts_with("hot:")) {
    f.skew.hot_fraction = number_after("hot:", 0.0, 1.0);
  } else {
    throw ConfigError("--force-balance: unknown mode '" + std::string(spec) +
                      "' (valid: none, round-robin, random, zipf:ALPHA, hot:FRACTION)");
  }
  return f;
}

namespace {

// The shortest text that reads back to `value` (std::to_chars), as the options print numbers.
std::string shortest_text(double value) {
  char text[64];
  const auto end = std::to_chars(text, text + sizeof text, value).ptr;
  return std::string(text, end);
}

}  // namespace

std::string forced_routing_name(const ForcedRouting& f) {
  if (!f.forced) return "none";
  if (f.round_robin) return "round-robin";
  if (f.skew.hot_fraction > 0) return "hot:" + shortest_text(f.skew.hot_fraction);
  if (f.skew.zipf_alpha > 0) return "zipf:" + shortest_text(f.skew.zipf_alpha);
  return "random";
}

DropPolicy drop_policy_from_name(std::string_view name) {
  if (name == "probs") return DropPolicy::kByProbability;
  if (name == "position") return DropPolicy::kByPosition;
  throw ConfigError("--drop-policy: unknown policy '" + std::string(name) +
                    "' (valid: probs, position)");
}

const char* drop_policy_name(DropPolicy policy) {
  return policy == DropPolicy::kByPosition ? "position" : "probs";
}

CapacityUnit capacity_unit_from_name(std::string_view name) {
  if (name == "sequence") return CapacityUnit::kSequence;
  if (name == "rank") return CapacityUnit::kRank;
  throw ConfigError("--capacity-unit: unknown unit '" + std::string(name) +
                    "' (valid: sequence, rank)");
}

const char* capacity_unit_name(CapacityUnit unit) {
  return unit == CapacityUnit::kRank ? "rank" : "sequence";
}

std::vector<ShadowRule> shadow_rules_from_text(std::string_view spec) {
  std::vector<ShadowRule> rules;
  if (spec.empty()) return rules;
  constexpr double kMaxRate = 1e6;
  const std::string valid = "(valid: none, sign:RATE, sign-centered:RATE, proportional:RATE)";
  size_t start = 0;
  while (start <= spec.size()) {
    const size_t comma = std::min(spec.find(',', start), spec.size());
    const std::string_view item = spec.substr(start, comma - start);
    ShadowRule rule;
    if (item == "none") {
      rule.kind = ShadowKind::kNone;
    } else {
      const size_t colon = item.find(':');
      const std::string_view kind = item.substr(0, colon);
      if (kind == "sign") {
        rule.kind = ShadowKind::kSign;
      } else if (kind == "sign-centered") {
        rule.kind = ShadowKind::kSignCentered;
      } else if (kind == "proportional") {
        rule.kind = ShadowKind::kProportional;
      } else {
        throw ConfigError("--shadow: unknown rule '" + std::string(item) + "' " + valid);
      }
      const std::string_view number =
          colon == std::string_view::npos ? std::string_view() : item.substr(colon + 1);
      double v = -1;
      const auto [end, ec] = std::from_chars(number.data(), number.data() + number.size(), v);
      if (number.empty() || ec != std::errc() || end != number.data() + number.size() ||
          !(v >= 0 && v <= kMaxRate)) {
        throw ConfigError("--shadow: '" + std::string(item) +
                          "' needs a rate in [0, 1e+06] after '" + std::string(kind) + ":'");
      }
      rule.rate = v;
    }
    for (const ShadowRule& earlier : rules) {
      if (shadow_rule_name(earlier) == shadow_rule_name(rule)) {
        throw ConfigError("--shadow: rule '" + shadow_rule_name(rule) + "' is given twice");
      }
    }
    rules.push_back(rule);
    start = comma + 1;
  }
  return rules;
}

std::string shadow_rule_name(const ShadowRule& rule) {
  switch (rule.kind) {
    case ShadowKind::kNone:
      return "none";
    case ShadowKind::kSign:
      return "sign:" + shortest_text(rule.rate);
    case ShadowKind::kSignCentered:
      return "sign-centered:" + shortest_text(rule.rate);
    case ShadowKind::kProportional:
      return "proportional:" + shortest_text(rule.rate);
  }
  return "none";
}

std::string shadow_rules_text(const std::vector<ShadowRule>& rules) {
  std::string text;
  for (const ShadowRule& rule : rules) {
    if (!text.empty()) text += ',';
    text += shadow_rule_name(rule);
  }
  return text;
}

void routing_config_validate(const RoutingConfig& r, const ModelConfig& m) {
  if (r.routing_groups < 1 || m.experts % r.routing_groups != 0) {
    throw ConfigError("--routing-groups=" + std::to_string(r.routing_groups) +
                      " must be >= 1 and divide --experts=" + std::to_string(m.experts));
  }
  if (r.routing_groups > 1) {
    const int per_group = m.experts / r.routing_groups;
    if (r.group_topk < 1 || r.group_topk > r.routing_groups || m.top_k % r.group_topk != 0 ||
        m.top_k / r.group_topk > per_group) {
      throw ConfigError(
          "--group-topk=" + std::to_string(r.group_topk) +
          " must be in [1, --routing-groups], divide --top-k=" + std::to_string(m.top_k) +
          ", and leave K/M <= experts per group (" + std::to_string(per_group) + ")");
    }
  }
}

}  // namespace moe

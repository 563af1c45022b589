// Option values as text, both ways (option_values.hpp).
#include "runtime/options/option_values.hpp"

#include <cmath>
#include <optional>
#include <type_traits>

#include "runtime/options/config_file.hpp"

namespace moe {
namespace {

ConfigError bad_value(const std::string& option, const std::string& text, const char* expected) {
  return ConfigError(option + ": invalid value '" + text_excerpt(text) + "' (expected " + expected +
                     ")");
}

// The whole string must be the number: "3x", " 3" and "" are errors.
template <class T>
void number_from_text(const std::string& option, const std::string& text, T& out,
                      const char* expected) {
  T value{};
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || text.empty()) {
    throw bad_value(option, text, expected);
  }
  if constexpr (std::is_floating_point_v<T>) {
    if (!std::isfinite(value)) throw bad_value(option, text, expected);
  }
  out = value;
}

}  // namespace

void option_value_from_text(const std::string& option, const std::string& text, int& out) {
  number_from_text(option, text, out, "an integer");
}
void option_value_from_text(const std::string& option, const std::string& text, uint64_t& out) {
  number_from_text(option, text, out, "an unsigned 64-bit integer");
}
void option_value_from_text(const std::string& option, const std::string& text, double& out) {
  number_from_text(option, text, out, "a finite number");
}
void option_value_from_text(const std::string& option, const std::string& text, float& out) {
  number_from_text(option, text, out, "a finite number within float range, |x| <= 3.4e38");
}
void option_value_from_text(const std::string&, const std::string& text, std::string& out) {
  out = text;
}
void option_value_from_text(const std::string& option, const std::string& text, bool& out) {
  if (text == "true" || text == "1" || text == "yes") {
    out = true;
  } else if (text == "false" || text == "0" || text == "no") {
    out = false;
  } else {
    throw bad_value(option, text, "true or false");
  }
}
void option_value_from_text(const std::string&, const std::string& text, ScoreFunc& out) {
  // Its ConfigError names --score-func and the valid names.
  out = with_value_excerpt(text, [](const std::string& t) { return score_func_from_name(t); });
}
void option_value_from_text(const std::string&, const std::string& text, BalanceLossForm& out) {
  // Its ConfigError names --balance-loss-form and the valid forms.
  out =
      with_value_excerpt(text, [](const std::string& t) { return balance_loss_form_from_name(t); });
}
void option_value_from_text(const std::string&, const std::string& text, ForcedRouting& out) {
  // Its ConfigError names --force-balance and the valid modes.
  out = with_value_excerpt(text, [](const std::string& t) { return forced_routing_from_name(t); });
}
void option_value_from_text(const std::string&, const std::string& text,
                            std::vector<ShadowRule>& out) {
  // Its ConfigError names --shadow and the valid rules.
  out = with_value_excerpt(text, [](const std::string& t) { return shadow_rules_from_text(t); });
}
void option_value_from_text(const std::string&, const std::string& text, DropPolicy& out) {
  // Its ConfigError names --drop-policy and the valid policies.
  out = with_value_excerpt(text, [](const std::string& t) { return drop_policy_from_name(t); });
}
void option_value_from_text(const std::string&, const std::string& text, CapacityUnit& out) {
  // Its ConfigError names --capacity-unit and the valid units.
  out = with_value_excerpt(text, [](const std::string& t) { return capacity_unit_from_name(t); });
}
void option_value_from_text(const std::string& option, const std::string& text, DataOrder& out) {
  const std::optional<DataOrder> order = data_order_from_name(text);
  if (!order) {
    throw ConfigError(option + ": unknown order '" + text_excerpt(text) +
                      "' (valid: shuffled, sequential)");
  }
  out = *order;
}

std::string option_value_to_text(int v) {
  return option_number_to_text(v);
}
std::string option_value_to_text(uint64_t v) {
  return option_number_to_text(v);
}
std::string option_value_to_text(double v) {
  return option_number_to_text(v);
}
std::string option_value_to_text(float v) {
  return option_number_to_text(v);
}
std::string option_value_to_text(const std::string& v) {
  return v;
}
std::string option_value_to_text(bool v) {
  return v ? "true" : "false";
}
std::string option_value_to_text(ScoreFunc v) {
  return score_func_name(v);
}
std::string option_value_to_text(BalanceLossForm v) {
  return balance_loss_form_name(v);
}
std::string option_value_to_text(const ForcedRouting& v) {
  return forced_routing_name(v);
}
std::string option_value_to_text(const std::vector<ShadowRule>& v) {
  return shadow_rules_text(v);
}
std::string option_value_to_text(DropPolicy v) {
  return drop_policy_name(v);
}
std::string option_value_to_text(CapacityUnit v) {
  return capacity_unit_name(v);
}
std::string option_value_to_text(DataOrder v) {
  return data_order_name(v);
}

}  // namespace moe

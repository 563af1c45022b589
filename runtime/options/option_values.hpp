// Option values as text, both ways: strict conversions (the whole string must be the value, and
// numbers finite) whose errors name the option and quote an excerpt of the text, and the text of
// a value, the shortest that reads back to it exactly. The option table (options.cpp) calls them
// by the type of the field.
#pragma once

#include <charconv>
#include <cstdint>
#include <string>
#include <vector>

#include "io/data_order.hpp"
#include "model/config.hpp"
#include "model/routing_config.hpp"

namespace moe {

// Throw ConfigError naming `option` ("--top-k") when `text` is not a value of the type.
void option_value_from_text(const std::string& option, const std::string& text, int& out);
void option_value_from_text(const std::string& option, const std::string& text, uint64_t& out);
void option_value_from_text(const std::string& option, const std::string& text, double& out);
void option_value_from_text(const std::string& option, const std::string& text, float& out);
void option_value_from_text(const std::string& option, const std::string& text, std::string& out);
void option_value_from_text(const std::string& option, const std::string& text, bool& out);
void option_value_from_text(const std::string& option, const std::string& text, ScoreFunc& out);
void option_value_from_text(const std::string& option, const std::string& text,
                            BalanceLossForm& out);
void option_value_from_text(const std::string& option, const std::string& text, ForcedRouting& out);
void option_value_from_text(const std::string& option, const std::string& text,
                            std::vector<ShadowRule>& out);
void option_value_from_text(const std::string& option, const std::string& text, DropPolicy& out);
void option_value_from_text(const std::string& option, const std::string& text, CapacityUnit& out);
void option_value_from_text(const std::string& option, const std::string& text, DataOrder& out);

// Shortest text that reads back to the same value (std::to_chars' guarantee).
template <class T> std::string option_number_to_text(T value) {
  char buffer[64];
  const auto result = std::to_chars(buffer, buffer + sizeof(buffer), value);
  return std::string(buffer, result.ptr);
}

std::string option_value_to_text(int v);
std::string option_value_to_text(uint64_t v);
std::string option_value_to_text(double v);
std::string option_value_to_text(float v);
std::string option_value_to_text(const std::string& v);
std::string option_value_to_text(bool v);
std::string option_value_to_text(ScoreFunc v);
std::string option_value_to_text(BalanceLossForm v);
std::string option_value_to_text(const ForcedRouting& v);
std::string option_value_to_text(const std::vector<ShadowRule>& v);
std::string option_value_to_text(DropPolicy v);
std::string option_value_to_text(CapacityUnit v);
std::string option_value_to_text(DataOrder v);

}  // namespace moe

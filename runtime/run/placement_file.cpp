// Reading and writing expert placement files (placement_file.hpp).
#include "runtime/run/placement_file.hpp"

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string_view>

#include "io/input_file.hpp"
#include "io/token_data.hpp"
#include "runtime/options/config_agree.hpp"
#include "runtime/options/config_file.hpp"

namespace moe {
namespace {

// A placement of 256 layers of 4096 experts is about 5 MB of text: anything far larger is not a
// placement file, and is refused before it is read into memory.
constexpr std::uintmax_t kMaxPlacementBytes = 64u << 20;

std::string_view trim(std::string_view s) {
  const size_t first = s.find_first_not_of(" \t\r");
  if (first == std::string_view::npos) return {};
  const size_t last = s.find_last_not_of(" \t\r");
  return s.substr(first, last - first + 1);
}

std::vector<std::string_view> words(std::string_view s) {
  std::vector<std::string_view> out;
  size_t at = 0;
  while (true) {
    at = s.find_first_not_of(" \t\r", at);
    if (at == std::string_view::npos) return out;
    const size_t end = std::min(s.find_first_of(" \t\r", at), s.size());
    out.push_back(s.substr(at, end - at));
    at = end;
  }
}

// A decimal count in [0, 2^31): no sign (from_chars would take "-0"), no exponent, no other base.
std::optional<int> count_of(std::string_view word) {
  if (word.empty() || word[0] < '0' || word[0] > '9') return std::nullopt;
  int value = 0;
  const auto [end, ec] = std::from_chars(word.data(), word.data() + word.size(), value);
  if (ec != std::errc() || end != word.data() + word.size() || value < 0) return std::nullopt;
  return value;
}

class Parser {
 public:
  Parser(const std::string& name, int E, int L, int P)
      : name_(name), E_(E), L_(L), P_(P), layers_(L) {}

  [[noreturn]] void fail(const std::string& problem) const {
    throw DataError("expert placement file '" + name_ + "'" +
                    (line_ > 0 ? " line " + std::to_string(line_) : std::string()) + ": " +
                    problem);
  }

  void line(std::string_view text, int number) {
    line_ = number;
    text = trim(text.substr(0, text.find('#')));
    if (text.empty()) return;
    if (!header_seen_) {
      if (words(text) != words(kPlacementFileHeader)) {
        fail("expected the header line '" + std::string(kPlacementFileHeader) + "', found '" +
             text_excerpt(text) + "'");
      }
      header_seen_ = true;
      return;
    }
    const std::vector<std::string_view> w = words(text);
    if (w[0] == "layer") return layer_line(text);
    if (w[0] == "experts" || w[0] == "layers" || w[0] == "ranks") return size_line(w);
    fail("unknown line '" + text_excerpt(text) +
         "' (expected experts, layers, ranks or layer lines)");
  }

  ModelPlacement finish() {
    line_ = 0;
    if (!header_seen_) fail("empty: no '" + std::string(kPlacementFileHeader) + "' line");
    sizes_check();
    ModelPlacement placement;
    for (int l = 0; l < L_; ++l) {
      if (layers_[l].empty()) fail("layer " + std::to_string(l) + " has no line");
      try {
        placement.emplace_back(E_, layers_[l]);
      } catch (const std::invalid_argument& e) {
        fail("layer " + std::to_string(l) + ": " + e.what());
      }
    }
    return placement;
  }

 private:
  void size_line(const std::vector<std::string_view>& w) {
    const std::string key(w[0]);
    if (layer_seen_) fail("'" + key + "' after the first layer line");
    int* value = key == "experts" ? &file_E_ : key == "layers" ? &file_L_ : &file_P_;
    if (*value > 0) fail("'" + key + "' given twice");
    const std::optional<int> n = w.size() == 2 ? count_of(w[1]) : std::nullopt;
    if (!n || *n < 1) fail("'" + key + "' needs one positive count");
    *value = *n;
  }

  // The file's sizes against the run's: a file made for another model or another EP size.
  void sizes_check() {
    for (const auto& [key, value] : {std::pair{"experts", file_E_}, std::pair{"layers", file_L_},
                                     std::pair{"ranks", file_P_}}) {
      if (value == 0) fail("no '" + std::string(key) + "' line before the layer lines");
    }
    if (file_E_ != E_ || file_L_ != L_) {
      fail("a placement of " + std::to_string(file_E_) + " experts in " + std::to_string(file_L_) +
           " layers, but the model has " + std::to_string(E_) + " experts in " +
           std::to_string(L_) + " layers (--experts, --layers): a file for another model");
    }
    if (file_P_ != P_) {
      fail("a placement on " + std::to_string(file_P_) + " EP ranks, but the run's EP group has " +
           std::to_string(P_) + " (--ep, or the rank count)");
    }
  }

  void layer_line(std::string_view text) {
    if (!layer_seen_) sizes_check();
    layer_seen_ = true;
    const size_t colon = text.find(':');
    const std::vector<std::string_view> head = words(text.substr(0, colon));
    const std::optional<int> l = head.size() == 2 ? count_of(head[1]) : std::nullopt;
    if (colon == std::string_view::npos || !l) {
      fail("expected 'layer N: experts | experts | ...', found '" + text_excerpt(text) + "'");
    }
    if (*l >= L_) {
      fail("layer " + std::to_string(*l) + " outside [0, " + std::to_string(L_) + ")");
    }
    std::vector<std::vector<int>>& ranks = layers_[*l];
    if (!ranks.empty()) fail("layer " + std::to_string(*l) + " given twice");
    std::string_view rest = text.substr(colon + 1);
    while (true) {
      const size_t bar = rest.find('|');
      std::vector<int>& experts = ranks.emplace_back();
      for (const std::string_view word : words(rest.substr(0, bar))) {
        const std::optional<int> e = count_of(word);
        if (!e) {
          fail("layer " + std::to_string(*l) + ", rank " + std::to_string(ranks.size() - 1) +
               ": '" + text_excerpt(word) + "' is not an expert id");
        }
        if (*e >= E_) {
          fail("layer " + std::to_string(*l) + ", rank " + std::to_string(ranks.size() - 1) +
               ": expert " + std::to_string(*e) + " outside [0, " + std::to_string(E_) + ")");
        }
        experts.push_back(*e);
      }
      if (bar == std::string_view::npos) break;
      rest = rest.substr(bar + 1);
      if (static_cast<int>(ranks.size()) > P_) break;
    }
    if (static_cast<int>(ranks.size()) != P_) {
      fail("layer " + std::to_string(*l) + " lists " +
           (static_cast<int>(ranks.size()) > P_ ? "more than " + std::to_string(P_)
                                                : std::to_string(ranks.size())) +
           " ranks, the file says 'ranks " + std::to_string(P_) + "'");
    }
    try {
      const ExpertPlacement check(E_, ranks);  // the layer's own checks, with this line's number
    } catch (const std::invalid_argument& e) {
      fail("layer " + std::to_string(*l) + ": " + e.what());
    }
  }

  std::string name_;
  int E_, L_, P_;
  int file_E_ = 0, file_L_ = 0, file_P_ = 0;
  int line_ = 0;
  bool header_seen_ = false, layer_seen_ = false;
  std::vector<std::vector<std::vector<int>>> layers_;  // [L][P] experts, as the file lists them
};

}  // namespace

ModelPlacement placement_text_parse(const std::string& text, const std::string& name,
                                    int num_experts, int num_layers, int ep_size) {
  Parser parser(name, num_experts, num_layers, ep_size);
  std::istringstream in(text);
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) parser.line(line, number);
  return parser.finish();
}

ModelPlacement placement_file_read(const std::string& path, int num_experts, int num_layers,
                                   int ep_size) {
  const std::string name = text_excerpt(path, kPathExcerptBytes);
  auto fail = [&](const std::string& problem) -> void {
    throw DataError("expert placement file '" + name + "': " + problem);
  };
  if (const std::string problem = input_file_problem(path); !problem.empty()) fail(problem);
  std::error_code ec;
  const std::uintmax_t bytes = std::filesystem::file_size(path, ec);
  if (!ec && bytes > kMaxPlacementBytes) {
    fail("holds " + std::to_string(bytes) + " bytes, more than a placement file's " +
         std::to_string(kMaxPlacementBytes));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot be opened for reading");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) fail("read error");
  return placement_text_parse(text, name, num_experts, num_layers, ep_size);
}

std::string placement_text_make(const ModelPlacement& placement) {
  std::ostringstream text;
  text << kPlacementFileHeader << "\n";
  if (placement.empty()) return text.str();
  const ExpertPlacement& first = placement.front();
  text << "experts " << first.num_experts << "\nlayers " << placement.size() << "\nranks "
       << first.ep_size << "\n";
  for (size_t l = 0; l < placement.size(); ++l) {
    text << "layer " << l << ":";
    for (int q = 0; q < placement[l].ep_size; ++q) {
      if (q > 0) text << " |";
      for (int i = 0; i < placement[l].num_local(q); ++i) text << ' ' << placement[l].expert(q, i);
    }
    text << "\n";
  }
  return text.str();
}

uint64_t placement_digest(const ModelPlacement& placement) {
  return config_value_digest(placement_text_make(placement));
}

}  // namespace moe

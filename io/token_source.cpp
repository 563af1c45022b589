// The `--data` factory (io/token_source.hpp): a spec is `synthetic` (or `synthetic:zipf=S`),
// `tokens:PATH` or `text:PATH`; its form is checked before anything is opened, and the source it
// names is then opened with every check of its own (io/token_data.cpp, io/synthetic_data.cpp).
#include "io/token_source.hpp"

#include <charconv>
#include <optional>
#include <string_view>

#include "io/synthetic_data.hpp"

namespace moe {
namespace {

constexpr const char* kValidSpecs = "valid: synthetic, synthetic:zipf=S, tokens:PATH, text:PATH";
constexpr std::string_view kZipfPrefix = "synthetic:zipf=";
constexpr double kMaxZipf = 16.0;

// The Zipf exponent a `synthetic:zipf=S` spec gives (S a number in [0, kMaxZipf]), none for another
// form. Throws DataSpecError naming `option` when S is not such a number. (Past a few, every draw
// is the first token already: a larger S describes nothing new, only a degenerate chain.)
std::optional<double> synthetic_zipf(const std::string& spec, const char* option) {
  if (!spec.starts_with(kZipfPrefix)) return std::nullopt;
  const std::string_view text = std::string_view(spec).substr(kZipfPrefix.size());
  double value = -1.0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || error != std::errc() || end != text.data() + text.size() ||
      !(value >= 0.0 && value <= kMaxZipf)) {
    throw DataSpecError(std::string(option) + ": '" + spec +
                        "': the Zipf exponent must be a number in [0, 16] (" + kValidSpecs + ")");
  }
  return value;
}

}  // namespace

void token_source_check_spec(const std::string& spec, const char* option) {
  if (spec == "synthetic" || synthetic_zipf(spec, option)) return;
  for (std::string_view prefix : {"tokens:", "text:"}) {
    if (spec.starts_with(prefix)) {
      if (spec.size() == prefix.size()) {
        throw DataSpecError(std::string(option) + ": '" + spec + "' names no file (" + kValidSpecs +
                            ")");
      }
      return;
    }
  }
  throw DataSpecError(std::string(option) + ": unknown data source '" + spec + "' (" + kValidSpecs +
                      ")");
}

std::unique_ptr<TokenSource> token_source_open(const std::string& spec, int vocab, int seq_len,
                                               uint64_t seed, TokenCheckPart part,
                                               DataOrder order) {
  token_source_check_spec(spec);
  if (spec == "synthetic") return std::make_unique<SyntheticSource>(vocab, seq_len, seed);
  if (const std::optional<double> zipf = synthetic_zipf(spec, "--data")) {
    SyntheticParams params;
    params.zipf_exponent = *zipf;
    return std::make_unique<SyntheticSource>(vocab, seq_len, seed, params);
  }
  const size_t colon = spec.find(':');
  const std::string path = spec.substr(colon + 1);
  const SampleOrder sample_order{order, seed};
  if (spec.starts_with("tokens:")) {
    return std::make_unique<FileTokenSource>(
        FileTokenSource::open_shard(path, vocab, seq_len, part, sample_order));
  }
  return std::make_unique<FileTokenSource>(
      FileTokenSource::open_text(path, vocab, seq_len, sample_order));
}

}  // namespace moe

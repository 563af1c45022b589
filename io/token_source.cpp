// The `--data` factory (io/token_source.hpp): a spec is `synthetic`, `tokens:PATH` or `text:PATH`;
// its form is checked before anything is opened, and the source it names is then opened with
// every check of its own (io/token_data.cpp, io/synthetic_data.cpp).
#include "io/token_source.hpp"

#include <string_view>

#include "io/synthetic_data.hpp"

namespace moe {
namespace {

constexpr const char* kValidSpecs = "valid: synthetic, tokens:PATH, text:PATH";

}  // namespace

void token_source_check_spec(const std::string& spec, const char* option) {
  if (spec == "synthetic") return;
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
                                               uint64_t seed, TokenCheckPart part) {
  token_source_check_spec(spec);
  if (spec == "synthetic") return std::make_unique<SyntheticSource>(vocab, seq_len, seed);
  const size_t colon = spec.find(':');
  const std::string path = spec.substr(colon + 1);
  if (spec.starts_with("tokens:")) {
    return std::make_unique<FileTokenSource>(
        FileTokenSource::open_shard(path, vocab, seq_len, part));
  }
  return std::make_unique<FileTokenSource>(FileTokenSource::open_text(path, vocab, seq_len));
}

}  // namespace moe

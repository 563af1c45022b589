// The `--data` (and `--val-data`) factory: a spec's form checked while options are read, then the
// TokenSource it names opened, one of those of io/token_data.hpp and io/synthetic_data.hpp.
#pragma once

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>

#include "io/data_order.hpp"
#include "io/token_data.hpp"

namespace moe {

// A `--data` value that is not one of the valid forms; the message names the option (`--data`,
// `--val-data`) and lists the forms.
class DataSpecError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// Opens the source named by a `--data` value: `synthetic` (`synthetic:zipf=S`: the chain's Zipf
// exponent S >= 0 instead of 1), `tokens:PATH` or `text:PATH`; a shard's
// tokens are checked in `part` only (see TokenCheckPart). A file is read in `order`, shuffled
// with `seed` (io/data_order.hpp); the synthetic source is generated from `seed` in index order.
// Throws DataSpecError for any other form, DataError for a file that cannot be used.
std::unique_ptr<TokenSource> token_source_open(const std::string& spec, int vocab, int seq_len,
                                               uint64_t seed, TokenCheckPart part, DataOrder order);

// Checks only the form of a `--data` value, opening nothing: lets option parsing fail early. The
// message names `option` (`--data`, `--val-data`).
void token_source_check_spec(const std::string& spec, const char* option = "--data");

}  // namespace moe

// Training data as a TokenSource: for global sample index i and sequence length S, the S+1 tokens
// of sample i (S inputs, and the S next-token targets shifted by one). Sources are pure functions
// of the sample index, so any rank can read any sample and the global batch does not depend on W.
// Implementations (SPEC §5): llm.c `.bin` token shards (`tokens:PATH`), raw bytes (`text:PATH`),
// and the generated `synthetic` source of io/synthetic_data.hpp. Also a writer for llm.c shards.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace moe {

// Unusable training data. The message always names the file and the problem.
class DataError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A `--data` value that is not one of the valid forms; the message names --data and lists them.
class DataSpecError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

class TokenSource {
 public:
  virtual ~TokenSource() = default;

  // Writes the S+1 tokens of sample `global_sample_idx` (>= 0) to out[0..seq_len]: out[0..S-1]
  // are the inputs, out[1..S] their next-token targets. Pure: same arguments, same tokens.
  virtual void sample(int64_t global_sample_idx, int seq_len, int32_t* out /*[S+1]*/) const = 0;

  // Tokens held in memory; 0 for generated sources, which are unbounded.
  virtual int64_t num_tokens() const = 0;

  // One line for logs and the statistics file: kind, file, size, and what a reader should know.
  virtual std::string describe() const = 0;
};

// llm.c's `.bin` shard: a header of 256 little-endian int32 (magic, version, token count, unused),
// then the tokens as uint16.
inline constexpr int kShardHeaderInts = 256;
inline constexpr int32_t kShardMagic = 20240520;
inline constexpr int32_t kShardVersion = 1;

// A token sequence held in memory, read from a file at open, sampled by a fixed stride:
// sample i starts at offset (i·S) mod (num_tokens − S). Consecutive samples are consecutive,
// non-overlapping windows (the last target of sample i is the first input of sample i+1), as in
// llm.c's loader; past the end the offsets wrap around modulo the number of valid start offsets,
// so every index is valid and a long run sees the data again at shifted offsets, deterministically.
class FileTokenSource : public TokenSource {
 public:
  // Reads an llm.c shard; checks magic, version, size, every token < vocab, and num_tokens > S.
  static FileTokenSource open_shard(const std::string& path, int vocab, int seq_len);
  // Reads a file's raw bytes as tokens 0..255; needs vocab >= 256 and more than S bytes.
  static FileTokenSource open_text(const std::string& path, int vocab, int seq_len);

  void sample(int64_t global_sample_idx, int seq_len, int32_t* out) const override;
  int64_t num_tokens() const override { return static_cast<int64_t>(tokens_.size()); }
  std::string describe() const override;

  const std::string& path() const { return path_; }

 private:
  FileTokenSource(std::string kind, std::string path, std::vector<uint16_t> tokens);

  std::string kind_;              // "tokens" or "text", as in the --data spec
  std::string path_;
  std::vector<uint16_t> tokens_;  // [num_tokens]
};

// Opens the source named by a `--data` value: `synthetic`, `tokens:PATH` or `text:PATH`.
// Throws DataSpecError for any other form, DataError for a file that cannot be used.
std::unique_ptr<TokenSource> token_source_open(const std::string& spec, int vocab, int seq_len,
                                               uint64_t seed);

// Checks only the form of a `--data` value, opening nothing: lets option parsing fail early.
void token_source_check_spec(const std::string& spec);

// Writes `tokens` as an llm.c shard (version 1). Throws DataError naming the file on failure.
void token_shard_write(const std::string& path, std::span<const uint16_t> tokens);

}  // namespace moe

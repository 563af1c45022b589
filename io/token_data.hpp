// Training data as a TokenSource: for global sample index i and sequence length S, the S+1 tokens
// of sample i (S inputs, and the S next-token targets shifted by one). Sources are pure functions
// of the sample index, so any rank can read any sample and the global batch does not depend on W.
// Implementations: llm.c `.bin` token shards (`tokens:PATH`), raw bytes (`text:PATH`), both mapped
// read-only rather than read, and the generated `synthetic` source of io/synthetic_data.hpp; a
// `--data` value opens one through io/token_source.hpp. Also a writer for llm.c shards.
#pragma once

#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>

#include "io/data_order.hpp"
#include "io/input_file.hpp"

namespace moe {

// Unusable training data. The message always names the file and the problem.
class DataError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Which part of a file's token check (every token < vocab) this process does: part `part_idx` of
// `num_parts` contiguous ranges, in file order. A run gives rank r of W the part {r, W} and agrees
// on the outcome (the lowest failing rank reports), so together the ranks check every token once,
// and the token reported is the first bad one in the file, as with one rank checking it all.
// Every rank must see the same file (the sampling already assumes it).
struct TokenCheckPart {
  int part_idx = 0;
  int num_parts = 1;
};

class TokenSource {
 public:
  virtual ~TokenSource() = default;

  // Writes the S+1 tokens of sample `global_sample_idx` (>= 0) to out[0..seq_len]: out[0..S-1]
  // are the inputs, out[1..S] their next-token targets. Pure: same arguments, same tokens.
  virtual void sample(int64_t global_sample_idx, int seq_len, int32_t* out /*[S+1]*/) const = 0;

  // Tokens the source holds (in its file); 0 for generated sources, which are unbounded.
  virtual int64_t num_tokens() const = 0;

  // Bytes the source keeps in this process's own memory: counted per rank in the memory estimate
  // the banner prints and the set-up check uses.
  virtual int64_t private_bytes() const = 0;

  // Bytes of a file the source maps read-only and shared (0 for none). Not counted per rank: the
  // pages are the node's page cache, held once however many ranks map the file, only as far as
  // they are read, and clean, so the kernel reclaims them under memory pressure (and reads them
  // again when needed) instead of running out of memory.
  virtual int64_t mapped_bytes() const { return 0; }

  // One line for logs and the statistics file: kind, file, size, and what a reader should know.
  virtual std::string describe() const = 0;

  // This process's share of the checksum of the source's file: the wrapping sum, over the file's
  // blocks of kChecksumBlockBytes with index b % part.num_parts == part.part_idx, of a 64-bit hash
  // of each block and its index. Summed over every part (however many), it is the same number:
  // the file's content checksum, which a checkpoint records so that a file rewritten in place is
  // not taken for the one a resumed run trained on. 0 for generated sources.
  virtual uint64_t checksum_part(TokenCheckPart part) const {
    (void)part;
    return 0;
  }
};

inline constexpr int64_t kChecksumBlockBytes = int64_t{1} << 20;

// "0123456789abcdef": a content checksum as text; "" for 0 (no file).
std::string data_checksum_text(uint64_t checksum);

// llm.c's `.bin` shard: a header of 256 little-endian int32 (magic, version, token count, unused),
// then the tokens as uint16.
inline constexpr int kShardHeaderInts = 256;
inline constexpr int32_t kShardMagic = 20240520;
inline constexpr int32_t kShardVersion = 1;

// A token sequence in a file mapped read-only at open, read in S+1-token windows in the order of
// io/data_order.hpp: shuffled (each epoch every non-overlapping window once, in a seeded order of
// its own) or sequential (sample i at offset (i·S) mod (num_tokens − S), consecutive windows as
// in llm.c's loader). Either way every sample index is valid and a sample is a pure function of
// the index, the order and its seed. A rank holds in memory only the pages of the samples it
// reads; the tokens stay in the file's width (uint16 for a shard, uint8 for text) and are
// widened to int32 per sample.
// The file must not be truncated while it is mapped: a read past its new end would fault (SIGBUS).
class FileTokenSource : public TokenSource {
 public:
  // Maps an llm.c shard. Before anything past the header is read, checks the magic, the version,
  // the token count against the file size, and num_tokens > S; then every token < vocab in
  // `part` of the file (one streaming pass over that part of the mapping).
  static FileTokenSource open_shard(const std::string& path, int vocab, int seq_len,
                                    TokenCheckPart part = {}, SampleOrder order = {});
  // Maps a file's raw bytes as tokens 0..255; needs vocab >= 256 (so no token can be out of
  // range and no pass over the file is needed) and more than S bytes.
  static FileTokenSource open_text(const std::string& path, int vocab, int seq_len,
                                   SampleOrder order = {});

  void sample(int64_t global_sample_idx, int seq_len, int32_t* out) const override;
  int64_t num_tokens() const override { return num_tokens_; }
  // The tokens are in mapped_bytes(); the shuffle keeps no table (io/data_order.cpp).
  int64_t private_bytes() const override { return 0; }
  int64_t mapped_bytes() const override { return mapping_.num_bytes(); }
  std::string describe() const override;
  uint64_t checksum_part(TokenCheckPart part) const override;

  const std::string& path() const { return path_; }

 private:
  FileTokenSource(std::string kind, std::string path, FileMapping mapping, int64_t first_byte,
                  int token_bytes, int64_t num_tokens, SampleOrder order);

  std::string kind_;  // "tokens" or "text", as in the --data spec
  std::string path_;
  FileMapping mapping_;                    // the whole file, read-only
  const unsigned char* tokens_ = nullptr;  // [num_tokens · token_bytes] inside mapping_
  int token_bytes_ = 0;                    // 2: uint16 (shard), 1: uint8 (text)
  int64_t num_tokens_ = 0;
  SampleOrder order_;
};

// Writes `tokens` as an llm.c shard (version 1). Throws DataError naming the file on failure.
void token_shard_write(const std::string& path, std::span<const uint16_t> tokens);

}  // namespace moe

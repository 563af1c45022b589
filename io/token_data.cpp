// File-backed token sources (llm.c shards, raw text), their content checksum, and the shard writer.
// Every check on a file happens at open, before any training step, and fails with a DataError
// that names the file and the problem. A shard's header is read and checked against the file size
// before the file is mapped, so a file that is not a shard costs 1 KiB of reading, not its size.
#include "io/token_data.hpp"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <memory>
#include <utility>

#include "io/input_file.hpp"

namespace moe {
namespace {

constexpr int64_t kShardHeaderBytes = kShardHeaderInts * sizeof(int32_t);

DataError data_error(const std::string& path, const std::string& problem) {
  return DataError("data file '" + path + "': " + problem);
}

// The file open for reading, or a DataError naming it and the problem (missing, not a regular
// file, unreadable, a special file that reports size 0).
std::unique_ptr<InputFile> open_input(const std::string& path) {
  try {
    return std::make_unique<InputFile>(path);
  } catch (const InputFileError& e) {
    throw data_error(path, e.what());
  }
}

FileMapping map_input(const InputFile& file, const std::string& path) {
  try {
    return file.map();
  } catch (const InputFileError& e) {
    throw data_error(path, e.what());
  }
}

// A sample needs S+1 tokens: S inputs and the target of the last one.
void require_one_sample(const std::string& path, int64_t num_tokens, int seq_len,
                        const char* unit) {
  if (seq_len <= 0) {
    throw std::invalid_argument("sequence length must be positive, got " + std::to_string(seq_len));
  }
  if (num_tokens == 0) throw data_error(path, std::string("empty: holds no ") + unit);
  if (num_tokens < static_cast<int64_t>(seq_len) + 1) {
    throw data_error(path, "shorter than one sample: holds " + std::to_string(num_tokens) + " " +
                               unit + ", a sample of --seq-len " + std::to_string(seq_len) +
                               " needs " + std::to_string(seq_len + 1));
  }
}

// Tokens [begin, end) of a mapped shard must all be < vocab; throws naming the first one that is
// not, with its offset. Cost: one pass that reads every page of the range once. From the page
// cache that is about 0.1 s per GiB on one core (memory bandwidth, and one page fault per 16
// pages with the kernel's fault-around: 2 GiB in 0.2 s on the 2-core development machine); a file
// not yet cached is read from the disk at the disk's rate, once per node, since the ranks check
// disjoint parts and share the page cache. The pages pass through the process in chunks, each
// dropped from its resident set once checked (they stay in the page cache for the samples), so
// the check adds one chunk, not the file, to a rank's memory.
void check_tokens(const FileMapping& mapping, const uint16_t* tokens /*[num_tokens]*/,
                  int64_t begin, int64_t end, int vocab, const std::string& path) {
  if (vocab > std::numeric_limits<uint16_t>::max()) return;  // every uint16 is a valid token
  constexpr int64_t kChunkTokens = int64_t{1} << 22;         // 8 MiB of the file
  const auto byte_of = [&](int64_t token_idx) {
    return reinterpret_cast<const unsigned char*>(tokens + token_idx) - mapping.data();
  };
  for (int64_t chunk_begin = begin; chunk_begin < end; chunk_begin += kChunkTokens) {
    const int64_t chunk_end = std::min(end, chunk_begin + kChunkTokens);
    uint16_t max_token = 0;  // a max reduction vectorises; the offset is looked up only on failure
    for (int64_t token_idx = chunk_begin; token_idx < chunk_end; ++token_idx) {
      max_token = std::max(max_token, tokens[token_idx]);
    }
    if (max_token >= vocab) {
      for (int64_t token_idx = chunk_begin; token_idx < chunk_end; ++token_idx) {
        if (tokens[token_idx] >= vocab) {
          throw data_error(path, "token out of range: token " + std::to_string(tokens[token_idx]) +
                                     " at offset " + std::to_string(token_idx) + " is >= --vocab " +
                                     std::to_string(vocab));
        }
      }
    }
    mapping.release(byte_of(chunk_begin), byte_of(chunk_end));
  }
}

}  // namespace

FileTokenSource::FileTokenSource(std::string kind, std::string path, FileMapping mapping,
                                 int64_t first_byte, int token_bytes, int64_t num_tokens,
                                 SampleOrder order)
    : kind_(std::move(kind)),
      path_(std::move(path)),
      mapping_(std::move(mapping)),
      tokens_(mapping_.data() + first_byte),
      token_bytes_(token_bytes),
      num_tokens_(num_tokens),
      order_(order) {}

FileTokenSource FileTokenSource::open_shard(const std::string& path, int vocab, int seq_len,
                                            TokenCheckPart part, SampleOrder order) {
  if (part.num_parts < 1 || part.part_idx < 0 || part.part_idx >= part.num_parts) {
    throw std::invalid_argument("token check part " + std::to_string(part.part_idx) + " of " +
                                std::to_string(part.num_parts) + " does not exist");
  }
  // Everything up to the mapping reads the header alone, so a file that is not a shard is
  // refused at once, whatever its size.
  const std::unique_ptr<InputFile> file = open_input(path);
  const int64_t num_bytes = file->num_bytes();
  if (num_bytes < kShardHeaderBytes) {
    throw data_error(path, "truncated header: " + std::to_string(num_bytes) +
                               " bytes, shorter than the " + std::to_string(kShardHeaderBytes) +
                               "-byte llm.c shard header");
  }
  int32_t header[kShardHeaderInts];  // little-endian on every platform this runs on
  int64_t header_read = 0;
  try {
    header_read = file->read_at(0, std::span<char>(reinterpret_cast<char*>(header), sizeof header));
  } catch (const InputFileError& e) {
    throw data_error(path, e.what());
  }
  if (header_read < kShardHeaderBytes) {  // the file shrank since its size was taken
    throw data_error(path, "truncated header: read " + std::to_string(header_read) + " of the " +
                               std::to_string(kShardHeaderBytes) + " header bytes");
  }
  if (header[0] != kShardMagic) {
    throw data_error(path, "bad magic " + std::to_string(header[0]) + " (expected " +
                               std::to_string(kShardMagic) + "): not an llm.c token shard");
  }
  if (header[1] != kShardVersion) {
    throw data_error(path, "unsupported version " + std::to_string(header[1]) + " (expected " +
                               std::to_string(kShardVersion) + ", uint16 tokens)");
  }
  const int64_t num_tokens = header[2];
  if (num_tokens < 0) {
    throw data_error(path, "bad header: negative token count " + std::to_string(num_tokens));
  }
  const int64_t payload_bytes = num_bytes - kShardHeaderBytes;
  const int64_t expected_bytes = num_tokens * static_cast<int64_t>(sizeof(uint16_t));
  if (payload_bytes < expected_bytes) {
    throw data_error(path, "truncated: header says " + std::to_string(num_tokens) +
                               " tokens, file holds " + std::to_string(payload_bytes / 2));
  }
  // llm.c refuses a size mismatch either way; extra bytes usually mean a wrong format.
  if (payload_bytes > expected_bytes) {
    throw data_error(path, "trailing bytes: header says " + std::to_string(num_tokens) +
                               " tokens, file has " +
                               std::to_string(payload_bytes - expected_bytes) + " bytes more");
  }
  require_one_sample(path, num_tokens, seq_len, "tokens");
  FileTokenSource source("tokens", path, map_input(*file, path), kShardHeaderBytes,
                         sizeof(uint16_t), num_tokens, order);
  // The header is 1024 bytes into a page-aligned mapping, so the uint16 tokens are aligned.
  const auto* tokens = reinterpret_cast<const uint16_t*>(source.tokens_);
  const int64_t begin = num_tokens * part.part_idx / part.num_parts;
  const int64_t end = num_tokens * (part.part_idx + 1) / part.num_parts;
  check_tokens(source.mapping_, tokens, begin, end, vocab, path);
  return source;
}

FileTokenSource FileTokenSource::open_text(const std::string& path, int vocab, int seq_len,
                                           SampleOrder order) {
  if (vocab < 256) {
    throw data_error(path, "text data needs --vocab >= 256 (every byte is a token), got --vocab " +
                               std::to_string(vocab));
  }
  const std::unique_ptr<InputFile> file = open_input(path);
  require_one_sample(path, file->num_bytes(), seq_len, "bytes");
  return FileTokenSource("text", path, map_input(*file, path), 0, 1, file->num_bytes(), order);
}

void FileTokenSource::sample(int64_t global_sample_idx, int seq_len, int32_t* out) const {
  if (global_sample_idx < 0) {
    throw std::invalid_argument("sample index must be >= 0, got " +
                                std::to_string(global_sample_idx));
  }
  require_one_sample(path_, num_tokens(), seq_len, "tokens");
  const auto start =
      static_cast<size_t>(data_sample_start(global_sample_idx, num_tokens(), seq_len, order_));
  if (token_bytes_ == 2) {
    const auto* tokens = reinterpret_cast<const uint16_t*>(tokens_);
    for (int pos_idx = 0; pos_idx <= seq_len; ++pos_idx) out[pos_idx] = tokens[start + pos_idx];
  } else {
    for (int pos_idx = 0; pos_idx <= seq_len; ++pos_idx) out[pos_idx] = tokens_[start + pos_idx];
  }
}

namespace {

uint64_t mix64(uint64_t x) {  // splitmix64's finaliser
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// A 64-bit hash of block `index` of a file, `n` bytes at `p`: 8 bytes at a time, each multiplied
// in, rotated and multiplied again; the tail byte by byte; the length and index mixed in last.
uint64_t block_hash(const unsigned char* p, int64_t n, int64_t index) {
  constexpr uint64_t k1 = 0x9e3779b97f4a7c15ull, k2 = 0xc2b2ae3d27d4eb4full;
  uint64_t h = k1 ^ static_cast<uint64_t>(index);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    h ^= w * k2;
    h = ((h << 31) | (h >> 33)) * k1;
  }
  for (; i < n; ++i) h = (h ^ p[i]) * k2;
  return mix64(h ^ static_cast<uint64_t>(n) ^ mix64(static_cast<uint64_t>(index)));
}

}  // namespace

uint64_t FileTokenSource::checksum_part(TokenCheckPart part) const {
  const int64_t size = mapping_.num_bytes();
  uint64_t sum = 0;
  for (int64_t b = part.part_idx; b * kChecksumBlockBytes < size; b += part.num_parts) {
    const int64_t begin = b * kChecksumBlockBytes;
    const int64_t n = std::min(kChecksumBlockBytes, size - begin);
    sum += block_hash(mapping_.data() + begin, n, b);
    mapping_.release(begin, begin + n);  // a streaming pass: the pages go again
  }
  return sum;
}

std::string data_checksum_text(uint64_t checksum) {
  if (checksum == 0) return "";
  char text[17];
  std::snprintf(text, sizeof text, "%016" PRIx64, checksum);
  return text;
}

std::string FileTokenSource::describe() const {
  const std::string count = std::to_string(num_tokens_);
  if (kind_ == "text") return "text:" + path_ + " (" + count + " bytes as tokens 0..255)";
  return "tokens:" + path_ + " (llm.c shard, " + count + " uint16 tokens)";
}

void token_shard_write(const std::string& path, std::span<const uint16_t> tokens) {
  if (tokens.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    throw data_error(path, "cannot write: " + std::to_string(tokens.size()) +
                               " tokens exceed the int32 count of the shard header");
  }
  int32_t header[kShardHeaderInts] = {};
  header[0] = kShardMagic;
  header[1] = kShardVersion;
  header[2] = static_cast<int32_t>(tokens.size());
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw data_error(path, "cannot write: cannot open for writing");
  out.write(reinterpret_cast<const char*>(header), kShardHeaderBytes);
  out.write(reinterpret_cast<const char*>(tokens.data()),
            static_cast<std::streamsize>(tokens.size_bytes()));
  out.close();
  if (!out) throw data_error(path, "cannot write: write failed");
}

}  // namespace moe

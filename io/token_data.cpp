// File-backed token sources (llm.c shards, raw text), the `--data` factory, and the shard writer.
// Every check on a file happens at open, before any training step, and fails with a DataError
// that names the file and the problem.
#include "io/token_data.hpp"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string_view>
#include <utility>

#include "io/input_file.hpp"
#include "io/synthetic_data.hpp"

namespace moe {
namespace {

constexpr int64_t kShardHeaderBytes = kShardHeaderInts * sizeof(int32_t);
constexpr const char* kValidSpecs = "valid: synthetic, tokens:PATH, text:PATH";

DataError data_error(const std::string& path, const std::string& problem) {
  return DataError("data file '" + path + "': " + problem);
}

// The whole file in memory. Distinguishes a missing file from one that exists but cannot be read.
std::vector<char> read_file_bytes(const std::string& path) {
  if (const std::string problem = input_file_problem(path); !problem.empty()) {
    throw data_error(path, problem);
  }
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) throw data_error(path, "unreadable: cannot open for reading");
  const std::streamsize num_bytes = in.tellg();
  if (num_bytes < 0) throw data_error(path, "unreadable: cannot determine the file size");
  std::vector<char> bytes(static_cast<size_t>(num_bytes));
  in.seekg(0);
  if (num_bytes > 0 && !in.read(bytes.data(), num_bytes)) {
    throw data_error(path, "unreadable: read failed after " + std::to_string(in.gcount()) +
                               " of " + std::to_string(num_bytes) + " bytes");
  }
  return bytes;
}

// A sample needs S+1 tokens: S inputs and the target of the last one.
void require_one_sample(const std::string& path, int64_t num_tokens, int seq_len,
                        const char* unit) {
  if (seq_len <= 0) {
    throw std::invalid_argument("sequence length must be positive, got " +
                                std::to_string(seq_len));
  }
  if (num_tokens == 0) throw data_error(path, std::string("empty: holds no ") + unit);
  if (num_tokens < static_cast<int64_t>(seq_len) + 1) {
    throw data_error(path, "shorter than one sample: holds " + std::to_string(num_tokens) + " " +
                               unit + ", a sample of --seq-len " + std::to_string(seq_len) +
                               " needs " + std::to_string(seq_len + 1));
  }
}

}  // namespace

FileTokenSource::FileTokenSource(std::string kind, std::string path, std::vector<uint16_t> tokens)
    : kind_(std::move(kind)), path_(std::move(path)), tokens_(std::move(tokens)) {}

FileTokenSource FileTokenSource::open_shard(const std::string& path, int vocab, int seq_len) {
  const std::vector<char> bytes = read_file_bytes(path);
  const int64_t num_bytes = static_cast<int64_t>(bytes.size());
  if (num_bytes < kShardHeaderBytes) {
    throw data_error(path, "truncated header: " + std::to_string(num_bytes) +
                               " bytes, shorter than the " + std::to_string(kShardHeaderBytes) +
                               "-byte llm.c shard header");
  }
  int32_t header[kShardHeaderInts];  // little-endian on every platform this runs on
  std::memcpy(header, bytes.data(), kShardHeaderBytes);
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
  std::vector<uint16_t> tokens(static_cast<size_t>(num_tokens));
  if (num_tokens > 0) std::memcpy(tokens.data(), bytes.data() + kShardHeaderBytes, expected_bytes);
  for (size_t token_idx = 0; token_idx < tokens.size(); ++token_idx) {
    if (tokens[token_idx] >= vocab) {
      throw data_error(path, "token out of range: token " + std::to_string(tokens[token_idx]) +
                                 " at offset " + std::to_string(token_idx) +
                                 " is >= --vocab " + std::to_string(vocab));
    }
  }
  require_one_sample(path, num_tokens, seq_len, "tokens");
  return FileTokenSource("tokens", path, std::move(tokens));
}

FileTokenSource FileTokenSource::open_text(const std::string& path, int vocab, int seq_len) {
  if (vocab < 256) {
    throw data_error(path, "text data needs --vocab >= 256 (every byte is a token), got --vocab " +
                               std::to_string(vocab));
  }
  const std::vector<char> bytes = read_file_bytes(path);
  require_one_sample(path, static_cast<int64_t>(bytes.size()), seq_len, "bytes");
  std::vector<uint16_t> tokens(bytes.size());
  for (size_t byte_idx = 0; byte_idx < bytes.size(); ++byte_idx) {
    tokens[byte_idx] = static_cast<unsigned char>(bytes[byte_idx]);
  }
  return FileTokenSource("text", path, std::move(tokens));
}

void FileTokenSource::sample(int64_t global_sample_idx, int seq_len, int32_t* out) const {
  if (global_sample_idx < 0) {
    throw std::invalid_argument("sample index must be >= 0, got " +
                                std::to_string(global_sample_idx));
  }
  require_one_sample(path_, num_tokens(), seq_len, "tokens");
  // Start offsets 0 .. N−S−1 leave room for S+1 tokens. The product i·S can exceed 64 bits for
  // very long runs on very large files, hence the 128-bit intermediate.
  const uint64_t num_starts = static_cast<uint64_t>(num_tokens() - seq_len);
  const auto product = static_cast<unsigned __int128>(global_sample_idx) * seq_len;
  const auto start = static_cast<size_t>(product % num_starts);
  for (int pos_idx = 0; pos_idx <= seq_len; ++pos_idx) out[pos_idx] = tokens_[start + pos_idx];
}

std::string FileTokenSource::describe() const {
  const std::string count = std::to_string(tokens_.size());
  if (kind_ == "text") return "text:" + path_ + " (" + count + " bytes as tokens 0..255)";
  return "tokens:" + path_ + " (llm.c shard, " + count + " uint16 tokens)";
}

void token_source_check_spec(const std::string& spec) {
  if (spec == "synthetic") return;
  for (std::string_view prefix : {"tokens:", "text:"}) {
    if (spec.starts_with(prefix)) {
      if (spec.size() == prefix.size()) {
        throw DataSpecError("--data: '" + spec + "' names no file (" + kValidSpecs + ")");
      }
      return;
    }
  }
  throw DataSpecError("--data: unknown data source '" + spec + "' (" + kValidSpecs + ")");
}

std::unique_ptr<TokenSource> token_source_open(const std::string& spec, int vocab, int seq_len,
                                               uint64_t seed) {
  token_source_check_spec(spec);
  if (spec == "synthetic") return std::make_unique<SyntheticSource>(vocab, seq_len, seed);
  const size_t colon = spec.find(':');
  const std::string path = spec.substr(colon + 1);
  if (spec.starts_with("tokens:")) {
    return std::make_unique<FileTokenSource>(FileTokenSource::open_shard(path, vocab, seq_len));
  }
  return std::make_unique<FileTokenSource>(FileTokenSource::open_text(path, vocab, seq_len));
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

// Reading and writing hash-routing table files.
#include "io/hash_table_file.hpp"

#include <fstream>

#include "io/input_file.hpp"
#include "io/token_data.hpp"

namespace moe {
namespace {

[[noreturn]] void fail(const std::string& path, const std::string& problem) {
  throw DataError("hash table file '" + path + "': " + problem);
}

}  // namespace

std::vector<int32_t> hash_table_file_read(const std::string& path, int hash_layers, int vocab,
                                          int top_k) {
  if (const std::string problem = input_file_problem(path); !problem.empty()) fail(path, problem);
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, "cannot be opened for reading");
  int32_t header[256] = {0};
  if (!in.read(reinterpret_cast<char*>(header), sizeof header)) fail(path, "truncated header");
  if (header[0] != kHashTableMagic) {
    fail(path, "bad magic " + std::to_string(header[0]) + " (expected " +
                   std::to_string(kHashTableMagic) + ")");
  }
  if (header[1] != kHashTableVersion)
    fail(path, "unsupported version " + std::to_string(header[1]));
  if (header[2] != hash_layers || header[3] != vocab || header[4] != top_k) {
    fail(path, "holds tables of shape [" + std::to_string(header[2]) + ", " +
                   std::to_string(header[3]) + ", " + std::to_string(header[4]) +
                   "] but the model needs [--hash-layers, --vocab, --top-k] = [" +
                   std::to_string(hash_layers) + ", " + std::to_string(vocab) + ", " +
                   std::to_string(top_k) + "]");
  }
  std::vector<int32_t> tables(static_cast<size_t>(hash_layers) * vocab * top_k);
  if (!in.read(reinterpret_cast<char*>(tables.data()),
               static_cast<std::streamsize>(tables.size() * sizeof(int32_t)))) {
    fail(path, "truncated: fewer entries than L_h·V·K = " + std::to_string(tables.size()));
  }
  if (in.peek() != std::char_traits<char>::eof()) fail(path, "trailing bytes after the tables");
  return tables;
}

void hash_table_file_write(const std::string& path, std::span<const int32_t> tables,
                           int hash_layers, int vocab, int top_k) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) fail(path, "cannot write");
  int32_t header[256] = {kHashTableMagic, kHashTableVersion, hash_layers, vocab, top_k};
  out.write(reinterpret_cast<const char*>(header), sizeof header);
  out.write(reinterpret_cast<const char*>(tables.data()),
            static_cast<std::streamsize>(tables.size() * sizeof(int32_t)));
  if (!out) fail(path, "write failed");
}

}  // namespace moe

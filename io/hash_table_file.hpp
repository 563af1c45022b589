// Hash-routing tables on disk (`--hash-table PATH`), in the style of llm.c's shards: a header of
// 256 int32 (magic 20261202, version 1, L_h, V, K, rest zero), then L_h·V·K int32 expert ids,
// little-endian, table l row v at ((l·V) + v)·K. Errors are DataError naming the file.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace moe {

inline constexpr int32_t kHashTableMagic = 20261202;
inline constexpr int32_t kHashTableVersion = 1;

// Reads a table file and checks its shape against the model's L_h, V and K (not the ids' range:
// the model validates entries against E).
std::vector<int32_t> hash_table_file_read(const std::string& path, int hash_layers, int vocab,
                                          int top_k);

void hash_table_file_write(const std::string& path, std::span<const int32_t> tables,
                           int hash_layers, int vocab, int top_k);

}  // namespace moe

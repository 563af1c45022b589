// The small types every part of the statistics file shares: its format name and version, the
// error for an unusable output path, and one typed configuration value. The writer
// (io/stats_writer.hpp), the file's self-description (io/stats_schema.hpp) and its paths on disk
// (io/stats_path.hpp) each include this rather than one another.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

namespace moe {

inline constexpr const char* kStatsFormat = "moe_rt.stats";
// 2: units and description on every dataset, dimension scales (/dims, /steps/step, /perf/phases,
// /trace/step), typed configuration attributes (/config). Version 1 files lack these only.
inline constexpr int32_t kStatsFormatVersion = 2;

// An unusable output path. The message names the path and the problem.
class StatsPathError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// One configuration option as the typed attribute /config/<name>: `text` is its value as written
// (unquoted); `kind` says its type: 'b' bool, 'i' int64, 'u' uint64, 'f' float64, 's' string.
struct StatsConfigValue {
  std::string name;
  std::string text;
  char kind = 's';
};

}  // namespace moe

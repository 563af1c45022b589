// What the ranks agree on before the first step. Set-up errors: each rank reads its options and
// input files itself, so one may fail where the others do not; setup_agree makes all of them stop
// with one message (SetupError). The configuration: each rank parses its own command line and
// config file, so an MPMD command line (`mpirun -np 1 moe_rt --steps 5 : -np 1 moe_rt --steps 6`)
// or node-local config files can give ranks different options: different step counts hang in the
// collectives of the last steps, a different seed or learning rate trains on silently. At set-up
// the ranks compare a 64-bit digest of every option's value and stop, all of them, on the first
// that differs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "comm/communicator.hpp"
#include "runtime/options/options.hpp"

namespace moe {

// A failure before the first collective (options, data, layout), agreed on by every rank: all ranks
// throw it, and exactly one of them (the lowest failing rank) reports it, so the user reads one
// message and every rank exits non-zero without MPI_Abort.
class SetupError : public std::runtime_error {
 public:
  SetupError(const std::string& message, bool report)
      : std::runtime_error(message), report_(report) {}
  bool report() const { return report_; }

 private:
  bool report_;
};

// Collective over `world`: returns when no rank has an error; otherwise throws SetupError on every
// rank. `local_error` is this rank's message, empty when it has none.
void setup_agree(const Comm& world, const std::string& local_error);

// One thing the ranks must agree on: an option's name ("--steps") and its value as text.
struct ConfigItem {
  std::string option;
  std::string value;
};

// Everything the ranks must agree on, in a fixed order: --help and --print-config (ranks that
// disagree on them would take different paths through main), then every configuration option but
// --threads (see config_agree.cpp).
std::vector<ConfigItem> config_agree_items(const RunConfig& cfg);

uint64_t config_value_digest(std::string_view value);  // 64-bit FNV-1a of the bytes

// [2·items]: per item its digest and the digest's bitwise complement (as int64), so that one
// element-wise MAX over the ranks holds each item's largest digest and the complement of its
// smallest.
std::vector<int64_t> config_digest_buffer(const std::vector<ConfigItem>& items);

// From a buffer MAX-reduced over the ranks: the index of the first item whose digests differ
// between ranks (largest != smallest), or the item count when they all agree.
size_t config_first_disagreement(std::span<const int64_t> reduced);

// Collective over `world`: returns when every rank holds the same items. Otherwise every rank
// throws SetupError, and rank 0 reports it: the first differing option, its value on rank 0 and on
// the lowest rank that differs (escaped excerpts), e.g. "--steps is '5' on rank 0 but '6' on rank
// 1".
void config_agree(const Comm& world, const RunConfig& cfg);

}  // namespace moe

// The ranks' agreement at set-up: on errors, one MAX all-reduce naming the lowest failing rank; on
// the configuration, digests compared with one MAX all-reduce and, only when they differ, two
// small collectives to name the values.
#include "runtime/options/config_agree.hpp"

#include "runtime/options/config_file.hpp"
#include "runtime/options/option_table.hpp"

namespace moe {
namespace {

// Collective: `text` of rank `root` on every rank.
std::string broadcast_text(const Comm& world, const std::string& text, int root) {
  std::vector<int64_t> length = {static_cast<int64_t>(text.size())};
  world.broadcast(std::span<int64_t>(length), root);
  std::vector<uint8_t> bytes(text.begin(), text.end());
  bytes.resize(static_cast<size_t>(length[0]));
  world.broadcast(std::span<uint8_t>(bytes), root);
  return std::string(bytes.begin(), bytes.end());
}

}  // namespace

void setup_agree(const Comm& world, const std::string& local_error) {
  // Lowest failing rank, or W when none failed: a MIN all-reduce of (failed ? rank : W), written
  // as the MAX of the negation with the typed helper.
  std::vector<int> flag = {local_error.empty() ? -world.size() : -world.rank()};
  world.allreduce_max(std::span<int>(flag));
  const int reporter = -flag[0];
  if (reporter == world.size()) return;
  if (local_error.empty()) {
    throw SetupError("rank " + std::to_string(reporter) + " failed during set-up", false);
  }
  throw SetupError(local_error, world.rank() == reporter);
}

std::vector<ConfigItem> config_agree_items(const RunConfig& cfg) {
  std::vector<ConfigItem> items = {{"--help", cfg.help ? "true" : "false"},
                                   {"--print-config", cfg.print_config ? "true" : "false"}};
  // Every option but those the table marks per-rank (--threads): the rest change the run or the
  // path through it.
  for (const OptionField& f : option_fields()) {
    if (!f.rules.per_rank) items.push_back({std::string("--") + f.name, f.get(cfg)});
  }
  // Each rank resolves a --resume folder itself; a live run writing there may have added or
  // pruned a checkpoint between two ranks' looks. Last: config_agree names it apart.
  items.push_back({"the checkpoint --resume resolved to", cfg.resume_point.checkpoint});
  return items;
}

uint64_t config_value_digest(std::string_view value) {
  uint64_t hash = 14695981039346656037ull;  // FNV-1a offset basis and prime
  for (const char c : value) {
    hash = (hash ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  }
  return hash;
}

std::vector<int64_t> config_digest_buffer(const std::vector<ConfigItem>& items) {
  std::vector<int64_t> buffer;
  buffer.reserve(2 * items.size());
  for (const ConfigItem& item : items) {
    const auto digest = static_cast<int64_t>(config_value_digest(item.value));
    buffer.push_back(digest);
    buffer.push_back(~digest);  // ~ reverses the order of int64: MAX of ~d is ~(MIN of d)
  }
  return buffer;
}

size_t config_first_disagreement(std::span<const int64_t> reduced) {
  for (size_t i = 0; 2 * i + 1 < reduced.size(); ++i) {
    if (reduced[2 * i] != ~reduced[2 * i + 1]) return i;
  }
  return reduced.size() / 2;
}

void config_agree(const Comm& world, const RunConfig& cfg) {
  const std::vector<ConfigItem> items = config_agree_items(cfg);
  std::vector<int64_t> reduced = config_digest_buffer(items);
  const std::vector<int64_t> mine = reduced;
  world.allreduce_max(std::span<int64_t>(reduced));
  const size_t first = config_first_disagreement(reduced);
  if (first == items.size()) return;

  // The lowest rank whose value differs from rank 0's (there is one: the digests differ), as the
  // MAX of the negated rank, W standing for "same as rank 0".
  std::vector<int64_t> root_digest = {mine[2 * first]};
  world.broadcast(std::span<int64_t>(root_digest), 0);
  std::vector<int> lowest = {mine[2 * first] != root_digest[0] ? -world.rank() : -world.size()};
  world.allreduce_max(std::span<int>(lowest));
  const int other = -lowest[0];

  // Rank 0's and that rank's values, as bounded excerpts (a value may be megabytes long), so that
  // every rank throws the same message.
  const std::string root_text = broadcast_text(world, text_excerpt(items[first].value), 0);
  const std::string other_text = broadcast_text(world, text_excerpt(items[first].value), other);
  if (first + 1 == items.size()) {  // the resolved checkpoint, every option the same
    throw SetupError("ranks chose different checkpoints of --resume " +
                         text_excerpt(cfg.resume, kPathExcerptBytes) + ": '" + root_text +
                         "' on rank 0 but '" + other_text + "' on rank " + std::to_string(other) +
                         " (a live run is writing to that folder): name a checkpoint file",
                     world.rank() == 0);
  }
  throw SetupError("ranks disagree on the configuration: " + items[first].option + " is '" +
                       root_text + "' on rank 0 but '" + other_text + "' on rank " +
                       std::to_string(other) +
                       " (give every rank the same options and config file contents)",
                   world.rank() == 0);
}

}  // namespace moe

// The order in which a data file's training sequences are read (--data-order), as a pure
// function of the global sample index, so that any rank can compute any sample's place and a
// run's batches do not depend on the rank count.
//
// A file of N tokens holds num_windows = ⌊(N − 1)/S⌋ non-overlapping windows: window w is the
// tokens [w·S, w·S + S], S inputs and the next-token target of the last one (the last
// (N − 1) mod S tokens are never read). Two orders:
//   shuffled    epoch e = ⌊i / num_windows⌋ reads every window once, in the order of a keyed
//               permutation of [0, num_windows) drawn anew for each epoch from (seed, e), as
//               trainers sample pretraining data (PyTorch's DataLoader(shuffle=True), Megatron's
//               cyclic sampler): the sequences of one step come from all over the file.
//   sequential  sample i starts at token (i·S) mod (N − S): consecutive windows, as llm.c's
//               loader reads a shard, so one step's sequences are one stretch of text. Past the
//               end the starts wrap around modulo the N − S valid start offsets (the order of
//               runs before --data-order existed).
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace moe {

enum class DataOrder { kSequential, kShuffled };

// "shuffled" or "sequential"; none for any other name.
std::optional<DataOrder> data_order_from_name(std::string_view name);
const char* data_order_name(DataOrder order);

// How a file source maps sample indices to token offsets: the order, and the seed of the shuffle.
struct SampleOrder {
  DataOrder order = DataOrder::kSequential;
  uint64_t seed = 0;  // --seed; unused by the sequential order
};

// ⌊(num_tokens − 1)/seq_len⌋: the non-overlapping windows of S+1 tokens (sharing their edges)
// a file holds. Needs num_tokens > seq_len > 0.
int64_t data_num_windows(int64_t num_tokens, int seq_len);

// Position `idx` of a keyed permutation of [0, n): a bijection of [0, n) for each key, computed
// in O(1) memory (a Feistel network with cycle walking, data_order.cpp). Needs idx < n.
uint64_t data_window_permute(uint64_t idx, uint64_t n, uint64_t key);

// The first token of global sample `sample_idx` (>= 0) of a file of num_tokens > seq_len tokens,
// in `order`: the sample is tokens [start, start + S].
int64_t data_sample_start(int64_t sample_idx, int64_t num_tokens, int seq_len, SampleOrder order);

}  // namespace moe

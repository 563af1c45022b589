// Expert placement files (`--expert-placement FILE`, written by `moe_stats.py placement`): which
// EP rank holds which experts, layer by layer. A text file, so that a person can read and edit it:
//
//   # comments run from '#' to the end of the line; blank lines are ignored
//   moe_rt-placement 1
//   experts 8
//   layers 7
//   ranks 2
//   layer 0: 0 1 2 3 | 4 5 6 7
//   layer 1: 0 2 4 6 | 1 3 5 7
//   ...
//
// The header line comes first; `experts`, `layers` and `ranks` once each, before the first
// `layer` line; then one `layer l:` line per layer, each with `ranks` groups separated by '|':
// group q lists the global expert ids EP rank q holds, in any order. Every rank holds at least one
// expert and every expert is on a rank; an expert listed on several ranks is replicated (each
// replica takes the rows of a contiguous chunk of the EP group's sequences). Errors are DataError
// naming the file, the line and the problem.
#pragma once

#include <string>
#include <vector>

#include "model/model.hpp"

namespace moe {

inline constexpr const char* kPlacementFileHeader = "moe_rt-placement 1";

// Reads `path` and checks it against the run: E experts, L layers, P EP ranks. Every rank of the
// run reads the file for itself; run_setup checks that they read the same placement.
ModelPlacement placement_file_read(const std::string& path, int num_experts, int num_layers,
                                   int ep_size);

// The same, from the file's text (`name` stands for the file in messages).
ModelPlacement placement_text_parse(const std::string& text, const std::string& name,
                                    int num_experts, int num_layers, int ep_size);

// The text of a placement file for `placement` (the contiguous layout included).
std::string placement_text_make(const ModelPlacement& placement);

// A 64-bit FNV-1a digest of the placement (every layer's experts rank by rank): ranks compare it
// to agree that they read the same file.
uint64_t placement_digest(const ModelPlacement& placement);

}  // namespace moe

// What is wrong with an input file (a data shard, a hash table, a config file) before it is opened,
// in one wording for all of them. Checking first matters: a directory opens as an empty stream on
// Linux (a config file that is a directory would read as no keys), and a FIFO blocks the open.
#pragma once

#include <string>

namespace moe {

// "" when `path` is an existing regular file (after following links); otherwise the problem:
// "missing: no such file", "missing: a link to no file", "not a regular file (a directory)",
// "not a regular file", or "cannot be inspected: <reason>".
std::string input_file_problem(const std::string& path);

}  // namespace moe

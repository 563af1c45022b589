// Tests that can run at some rank counts only (a test of six-rank EP groups, one that needs a
// second rank, one whose global batch must split evenly). A test registers its condition here, and
// the MPI test main leaves it out at the other rank counts, through GoogleTest's filter: not run
// and not reported as skipped there, since nothing is missing. A test that still finds itself at a
// rank count it cannot use (an explicit --gtest_filter) fails instead of passing unnoticed.
#pragma once

#include <string>
#include <vector>

namespace moe::test {

using RankCondition = bool (*)(int world_size);

// Registers `test` ("Suite.Name") to run only where `runs(world size)` holds. Returns true, so
// that a namespace-scope constant can register at static initialisation (MOE_TEST_RANKS).
bool register_rank_condition(const char* test, RankCondition runs);

// The registered tests that cannot run at `world_size`.
std::vector<std::string> tests_left_out(int world_size);

}  // namespace moe::test

// MOE_TEST_RANKS(Suite, Name, [](int w) { return w == 6; }); beside TEST(Suite, Name).
#define MOE_TEST_RANKS(suite, name, condition)                         \
  [[maybe_unused]] static const bool moe_test_ranks_##suite##_##name = \
      ::moe::test::register_rank_condition(#suite "." #name, condition)

// GoogleTest main for tests that run under mpiexec: every rank runs every test, the failures are
// combined with an all-reduce so all ranks exit with the same code, and only rank 0 prints.
// Also used, at one rank, by tests that need no MPI: MPI_Init works without mpiexec.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "comm/communicator.hpp"
#include "mpi_test_ranks.hpp"

namespace moe::test {
namespace {

std::vector<std::pair<std::string, RankCondition>>& rank_conditions() {
  static std::vector<std::pair<std::string, RankCondition>> conditions;
  return conditions;
}

}  // namespace

bool register_rank_condition(const char* test, RankCondition runs) {
  rank_conditions().emplace_back(test, runs);
  return true;
}

std::vector<std::string> tests_left_out(int world_size) {
  std::vector<std::string> out;
  for (const auto& [test, runs] : rank_conditions()) {
    if (!runs(world_size)) out.push_back(test);
  }
  return out;
}

}  // namespace moe::test

namespace {

// Adds the tests that cannot run at `world_size` to GoogleTest's negative filter.
void leave_out_tests_of_other_rank_counts(int world_size) {
  const std::vector<std::string> out = moe::test::tests_left_out(world_size);
  if (out.empty()) return;
  std::string filter = GTEST_FLAG_GET(filter);
  filter += filter.find('-') == std::string::npos ? "-" : ":";
  for (size_t i = 0; i < out.size(); ++i) filter += (i > 0 ? ":" : "") + out[i];
  GTEST_FLAG_SET(filter, filter);
}

// On ranks other than 0 only failed assertions are printed, each tagged with its rank.
class FailurePrinter : public testing::EmptyTestEventListener {
 public:
  explicit FailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const testing::TestPartResult& r) override {
    if (!r.failed()) return;
    std::fprintf(stderr, "[rank %d] %s:%d: failure\n%s\n", rank_,
                 r.file_name() ? r.file_name() : "?", r.line_number(), r.summary());
  }

 private:
  int rank_;
};

// Rank 0 keeps GoogleTest's printer; the others print only their failures.
void silence_non_root_ranks(int rank) {
  if (rank == 0) return;
  auto& listeners = testing::UnitTest::GetInstance()->listeners();
  delete listeners.Release(listeners.default_result_printer());
  listeners.Append(new FailurePrinter(rank));
}

}  // namespace

int main(int argc, char** argv) {
  moe::MpiSession mpi(&argc, &argv);
  testing::InitGoogleTest(&argc, argv);
  const moe::Comm world = moe::Comm::world();
  silence_non_root_ranks(world.rank());
  leave_out_tests_of_other_rank_counts(world.size());
  int failed = 0;
  try {
    failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  } catch (const std::exception& e) {
    // A test that throws past GoogleTest would leave the others waiting: end the job instead.
    moe::mpi_abort_job(e.what(), 3);
  }
  int any_failed[1] = {failed};
  world.allreduce_max(std::span<int>(any_failed));
  if (any_failed[0] && !failed) {
    std::fprintf(stderr, "rank %d: passed locally, but another rank failed\n", world.rank());
  }
  return any_failed[0];
}

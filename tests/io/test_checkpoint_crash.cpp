// Crash safety of checkpoints (io/checkpoint_file.hpp, docs/checkpoints.md): a writer program
// (checkpoint_writer_child.cpp) writes the checkpoints of steps s, s+1, ..., committing each and
// pruning to the newest 2, and is killed with SIGKILL at random moments. After every kill the
// directory's newest complete checkpoint is at least the last one whose commit() returned, and
// it and every other complete one there read back whole: the header and every tensor of its step,
// checksums passing. Then a new writer continues after it, as a resumed run would.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "checkpoint_test_data.hpp"
#include "checkpoint_test_util.hpp"
#include "child_process.hpp"
#include "io/checkpoint_file.hpp"
#include "test_tempdir.hpp"

namespace moe {
namespace {

namespace fs = std::filesystem;
using namespace checkpoint_test;
using Clock = std::chrono::steady_clock;
using testing_util::TempDir;

// The writer program (checkpoint_writer_child.cpp) writing from `first_step` on in `dir`.
class WriterProcess : public testing_util::ChildProcess {
 public:
  WriterProcess(const std::string& dir, int64_t first_step)
      : ChildProcess(MOE_CHECKPOINT_WRITER_CHILD, {dir, std::to_string(first_step)}) {}
};

// The complete checkpoints the directory must hold, from the writers' messages: a commit adds
// its step, a pruning keeps the newest 2. A kill can land between an action and its message;
// reconcile() accounts for that.
struct Expected {
  std::vector<int64_t> steps;  // oldest first
  int64_t next = 0;            // the step the writer begins next
  int64_t begun = -1;          // the step it began last
  char last = 0;               // its last message
  void start_writer(int64_t first_step) { next = first_step, last = 0; }
  void add(char c) {
    if (c == 'b') begun = next++;
    if (c == 'c') steps.push_back(begun);
    if (c == 'p' && steps.size() > 2) steps.erase(steps.begin(), steps.end() - 2);
    last = c;
  }
  // After a kill, given the steps found: a write killed after its rename is complete, and a
  // pruning killed midway removed some of the oldest. Anything else found is an error.
  void reconcile(const std::vector<int64_t>& found) {
    if (last == 'b' && !found.empty() && found.back() == begun) steps.push_back(begun);
    if (last == 'c') {
      const size_t keep = std::min<size_t>(2, steps.size());
      if (found.size() >= keep && found.size() <= steps.size() &&
          std::equal(found.begin(), found.end(), steps.end() - found.size())) {
        steps = found;
      }
    }
  }
};

// The checkpoint at `path` holds exactly the header and tensors of `step`.
void expect_checkpoint_of_step(const std::string& path, int64_t step) {
  SCOPED_TRACE(path);
  try {
    const CheckpointReader r(path);
    const CheckpointHeader& got = r.header();
    const CheckpointHeader want = header_of_step(step);
    expect_same_header(got, want);
    for (int t = 0; t < kNumFloatTensors; ++t) {
      std::vector<float> values(kFloatTensors[t].count);
      r.read_floats(kFloatTensors[t].name, values);
      EXPECT_TRUE(values == float_values(step, t)) << kFloatTensors[t].name;  // [1, 2): no NaN
    }
    std::vector<int32_t> table(kTableCount);
    r.read_ints(kTableName, table);
    EXPECT_TRUE(table == table_values(step)) << kTableName;
  } catch (const CheckpointError& e) {
    ADD_FAILURE() << e.what();
  }
}

// A seed from MOE_TEST_SEED (to explore other kill moments), else a fixed one.
uint32_t test_seed() {
  const char* text = std::getenv("MOE_TEST_SEED");
  return text != nullptr ? static_cast<uint32_t>(std::strtoul(text, nullptr, 10)) : 20260102u;
}

// How often the kills land inside a write, measured on a shared 2-core machine at 20-60 ms a
// checkpoint (the seed fixes the delays, not what the writer is doing when they end): of the 40
// random kills, 34 to 40 came while a checkpoint was being written, 33 to 39 of them while its
// .tmp file existed and the others between its rename and the message after commit(); the rest
// came after a commit, during the pruning or between two checkpoints, and kills there in a row
// left up to 5 complete checkpoints. The default seed gave 37, 37 and 39 kills inside writes in
// three runs. 2 to 5 s in all, also with two busy loops taking both cores.
TEST(CheckpointCrash, SigkillAtRandomMomentsAlwaysLeavesACompleteCheckpoint) {
  constexpr int kKills = 40;
  const uint32_t seed = test_seed();
  SCOPED_TRACE("MOE_TEST_SEED=" + std::to_string(seed));
  std::mt19937 rng(seed);
  TempDir dir;
  const std::string folder = dir.path().string();
  const Clock::time_point start = Clock::now();

  // The first writer commits three checkpoints; the time they take sets the delays before the
  // kills, so that most kills land inside a write.
  Expected expected;
  double seconds_per_checkpoint = 0;
  {
    WriterProcess writer(folder, 0);
    const Clock::time_point t0 = Clock::now();
    while (expected.steps.size() < 3) {
      const char c = writer.receive();
      ASSERT_NE(c, 0) << "the first writer stopped after " << expected.steps.size() << " commits";
      expected.add(c);
    }
    seconds_per_checkpoint = std::chrono::duration<double>(Clock::now() - t0).count() / 3;
    for (char c : writer.kill_and_drain()) expected.add(c);
  }

  int in_write = 0, with_tmp = 0, max_found = 0;
  for (int round = 0; round <= kKills; ++round) {
    SCOPED_TRACE("after kill " + std::to_string(round));
    std::vector<int64_t> found;
    for (const auto& [s, path] : checkpoint_list(folder)) found.push_back(s);
    expected.reconcile(found);
    EXPECT_EQ(found, expected.steps) << "last message '" << expected.last << "'";
    ASSERT_FALSE(found.empty());
    EXPECT_EQ(checkpoint_resolve(folder), folder + "/" + checkpoint_file_name(found.back()));
    for (const auto& [s, path] : checkpoint_list(folder)) expect_checkpoint_of_step(path, s);
    int num_tmp = 0;
    for (const fs::directory_entry& e : fs::directory_iterator(folder)) {
      const std::string name = e.path().filename().string();
      if (name.ends_with(".tmp")) {
        ++num_tmp;
        EXPECT_EQ(name, checkpoint_file_name(expected.begun) + ".tmp");
        EXPECT_EQ(expected.last, 'b');
      }
    }
    if (::testing::Test::HasFailure()) return;  // one broken state is enough to read about
    if (round > 0) {
      in_write += expected.last == 'b';
      with_tmp += num_tmp;
      max_found = std::max(max_found, static_cast<int>(found.size()));
    }
    if (round == kKills) break;

    // The next writer continues after the newest checkpoint, as a resumed run would (replacing
    // the .tmp a killed write left), and is killed after a random delay.
    expected.start_writer(found.back() + 1);
    WriterProcess writer(folder, found.back() + 1);
    const char first = writer.receive();
    ASSERT_EQ(first, 'b') << "the writer did not start";
    expected.add(first);
    std::uniform_real_distribution<double> delay(0, 1.25 * seconds_per_checkpoint);
    std::this_thread::sleep_for(std::chrono::duration<double>(delay(rng)));
    for (char c : writer.kill_and_drain()) expected.add(c);
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  std::printf(
      "checkpoint crash test: %d kills (seed %u, %.0f ms a checkpoint, %.1f s): %d while "
      "a checkpoint was being written, %d left a .tmp file; up to %d complete checkpoints\n",
      kKills, seed, 1000 * seconds_per_checkpoint, seconds, in_write, with_tmp, max_found);
  // Without kills inside writes this test would show nothing; a random delay of up to 1.25
  // writes puts most of them there.
  EXPECT_GE(in_write, kKills / 4);
  EXPECT_GE(with_tmp, kKills / 4);
}

}  // namespace
}  // namespace moe

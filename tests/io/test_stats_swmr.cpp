// Tests of the HDF5 statistics file while it is being written: a writer killed by SIGKILL (after
// its rows, or in the middle of appending) leaves a file whose completed rows all read back, and
// a SWMR reader in another process sees each appended row appear (docs/hdf5-schema.md).
// The writer is another program (stats_writer_child.cpp); pipes keep the two in lock-step.
// Legend: N rows, L layers, E experts, K top-k, V vocabulary, W ranks, T traced tokens.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "child_process.hpp"
#include "io/stats_writer.hpp"
#include "stats_test_util.hpp"
#include "test_tempdir.hpp"

namespace moe {
namespace {

using namespace stats_test;
using testing_util::TempDir;

// The writer program (stats_writer_child.cpp), its stdin and stdout piped to this test.
class WriterProcess : public testing_util::ChildProcess {
 public:
  explicit WriterProcess(std::vector<std::string> args)
      : ChildProcess(MOE_STATS_WRITER_CHILD, std::move(args)) {}
};

// Rows a reader may trust after a crash: those of /steps/step, less a last row still holding the
// fill value -1 (its index was extended but not written), per docs/hdf5-schema.md.
size_t committed_rows(hid_t f) {
  H5Id dset(MOE_H5_CHECK(H5Dopen2(f, "/steps/step", H5P_DEFAULT)), H5Dclose);
  const size_t n = dataset_dims(dset.get())[0];
  const std::vector<int64_t> steps = read_rows<int64_t>(f, "/steps/step", n, {}, true);
  return (n > 0 && steps.back() == -1) ? n - 1 : n;
}

TEST(StatsCrash, SigkillAfterFiveRowsKeepsAllFive) {
  TempDir dir;
  const std::string path = dir.file("run.h5");
  WriterProcess writer({"kill-after", path, "5"});
  const int status = writer.wait();
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "status " << status;
  const H5Id file = open_file(path);  // SWMR read: the superblock still says "being written"
  EXPECT_EQ(committed_rows(file.get()), 5u);
  expect_step_rows(file.get(), 5, true);
}

TEST(StatsCrash, SigkillDuringAppendsKeepsEveryCompletedRow) {
  TempDir dir;
  const std::string path = dir.file("run.h5");
  WriterProcess writer({"kill-during", path});
  ASSERT_TRUE(writer.receive()) << "the writer did not append its first rows";
  ::usleep(20000 + std::random_device{}() % 20000);
  writer.kill();
  const int status = writer.wait();
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "status " << status;
  const H5Id file = open_file(path);
  const size_t n = committed_rows(file.get());
  EXPECT_GE(n, 5u);
  expect_step_rows(file.get(), n);  // every dataset has >= n rows, all n complete
}

// The rows of every /trace dataset after a crash, per docs/hdf5-schema.md: those of /trace/step
// less a last row still holding -1, checked against TraceData of steps 0, 2, 4, ...
size_t committed_trace_rows(hid_t f) {
  H5Id step(MOE_H5_CHECK(H5Dopen2(f, "/trace/step", H5P_DEFAULT)), H5Dclose);
  const size_t rows = dataset_dims(step.get())[0];
  std::vector<int64_t> steps = read_rows<int64_t>(f, "/trace/step", rows, {}, true);
  if (!steps.empty() && steps.back() == -1) steps.pop_back();
  std::vector<int64_t> even(steps.size());
  for (size_t i = 0; i < even.size(); ++i) even[i] = static_cast<int64_t>(2 * i);
  expect_trace_rows(f, even);
  return steps.size();
}

// Has the writer program append `rows` rows (and a trace after every even one) with chunks of at
// most `chunk_bytes` and `chunk_rows`, then close, journalling the file as published and every
// write after it (stats_writer_child.cpp); then opens each prefix of the journal as a crashed file
// would be, each write also cut at every page of the file it spans, as Linux stops a write()
// killed midway (the file then ends where the cut data ends, or where it ended before). Every
// state must open, hold every row whose append had returned (and at most one more), and read
// them back intact in every dataset, traces included. Returns the number of states checked.
size_t expect_every_state_sound(const TempDir& dir, int rows, int chunk_bytes, int chunk_rows) {
  const std::string path = dir.file("run.h5"), journal_path = dir.file("run.journal");
  WriterProcess writer({"journal", path, std::to_string(rows), journal_path,
                        std::to_string(chunk_bytes), std::to_string(chunk_rows)});
  const int status = writer.wait();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
  std::ifstream in(journal_path, std::ios::binary);
  const std::string journal((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto number = [&](size_t at) {
    uint64_t v = 0;
    for (int b = 0; b < 8; ++b)
      v |= uint64_t{static_cast<unsigned char>(journal[at + b])} << (8 * b);
    return v;
  };
  const std::string state = dir.file("state.h5");
  std::string image;
  size_t steps_done = 0, traces_done = 0, states = 0;
  // Opens `image` as a crashed file; false (with the failures recorded) when it is not sound.
  auto sound = [&](const std::string& where) {
    ++states;
    std::ofstream(state, std::ios::binary | std::ios::trunc).write(image.data(), image.size());
    try {
      const H5Id file = open_file(state);
      const size_t n = committed_rows(file.get());
      EXPECT_TRUE(n == steps_done || n == steps_done + 1)
          << n << " rows, " << steps_done << " appends returned";
      expect_step_rows(file.get(), n);
      const size_t m = committed_trace_rows(file.get());
      EXPECT_TRUE(m == traces_done || m == traces_done + 1)
          << m << " trace rows, " << traces_done << " trace appends returned";
    } catch (const Hdf5Error& e) {
      ADD_FAILURE() << e.what();
    }
    if (testing::Test::HasFailure()) ADD_FAILURE() << "in the state " << where;
    return !testing::Test::HasFailure();
  };
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  for (size_t at = 0, record = 0; at + 17 <= journal.size(); ++record) {
    const char kind = journal[at];
    const uint64_t offset = number(at + 1), count = number(at + 9);
    const size_t bytes = at + 17;
    at = bytes + (kind == 'W' ? count : 0);
    if (at > journal.size()) {
      ADD_FAILURE() << "journal cut short";
      return states;
    }
    const std::string where = "after journal record " + std::to_string(record);
    if (kind == 'S') {
      steps_done = offset + 1;
    } else if (kind == 'R') {
      traces_done = offset / 2 + 1;
    } else if (kind == 'T') {
      image.resize(offset);
      if (record > 1 && !sound(where)) return states;
    } else {
      EXPECT_EQ(kind, 'W');
      const size_t before = image.size();
      for (size_t cut = (offset / page + 1) * page; record > 0 && cut < offset + count;
           cut += page) {
        image.resize(std::max(before, cut));
        image.replace(offset, cut - offset, journal, bytes, cut - offset);
        if (!sound(where + " cut at byte " + std::to_string(cut - offset))) return states;
      }
      image.resize(std::max<size_t>(before, offset + count));
      image.replace(offset, count, journal, bytes, count);
      if (record > 0 && !sound(where)) return states;
    }
  }
  EXPECT_EQ(steps_done, static_cast<size_t>(rows));
  return states;
}

// The file in every state a kill could leave it in, not only where a random kill lands. With
// chunks of 1 to 4 rows, many fill up; with the default chunks, every flush rewrites each chunk
// whole, several pages of it. Chunks that moved (the live file once compressed a chunk when it
// filled, so it was written elsewhere and the chunk index pointed there before the dataset's
// extent said the chunk was full: a reader took the compressed bytes for raw ones) fail here
// within the first fill.
TEST(StatsCrash, EveryStateAKillCanLeaveKeepsEveryCompletedRow) {
  {
    TempDir dir;
    EXPECT_GT(expect_every_state_sound(dir, 24, 512, 4), 1000u);
  }
  if (testing::Test::HasFailure()) return;
  TempDir dir;
  const StatsStorage defaults;
  EXPECT_GT(expect_every_state_sound(dir, 6, static_cast<int>(defaults.chunk_bytes),
                                     static_cast<int>(defaults.max_chunk_rows)),
            600u);
}

// Linux acts on SIGKILL only between the pages a write() copies, so a checksummed metadata block
// that straddles a page can be left half old, half new: a dataset header torn that way made a
// whole dataset unreadable in 3 of 2000 random kills (docs/hdf5-schema.md). The writer allocates
// file space in 4 KiB pages, so no header smaller than a page straddles one.
TEST(StatsCrash, NoDatasetHeaderStraddlesAPage) {
  TempDir dir;
  const std::string path = dir.file("run.h5");
  WriterProcess writer({"kill-after", path, "300"});
  const int status = writer.wait();
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "status " << status;
  const H5Id file = open_file(path);
  H5Id fcpl(MOE_H5_CHECK(H5Fget_create_plist(file.get())), H5Pclose);
  H5F_fspace_strategy_t strategy{};
  hbool_t persist = 0;
  hsize_t threshold = 0, page = 0;
  MOE_H5_CHECK(H5Pget_file_space_strategy(fcpl.get(), &strategy, &persist, &threshold));
  MOE_H5_CHECK(H5Pget_file_space_page_size(fcpl.get(), &page));
  EXPECT_EQ(strategy, H5F_FSPACE_STRATEGY_PAGE);
  EXPECT_EQ(page, static_cast<hsize_t>(kStatsFilePageBytes));
  // Only the first chunk of a dataset's object header changes during appends (its dataspace and
  // layout messages); the attributes (units, description, dimension scales) were added before
  // SWMR mode, into continuation chunks that are never written again. Its size is in the header's
  // prefix (version 2: "OHDR", version, flags, optional times and attribute phase change, then
  // the size of chunk 0 in 1 << (flags & 3) bytes), read here from the file itself.
  std::ifstream raw(path, std::ios::binary);
  auto chunk0_bytes = [&](haddr_t addr) -> hsize_t {
    unsigned char prefix[32] = {0};
    raw.seekg(static_cast<std::streamoff>(addr));
    raw.read(reinterpret_cast<char*>(prefix), sizeof prefix);
    EXPECT_EQ(std::string(reinterpret_cast<char*>(prefix), 4), "OHDR") << "header at " << addr;
    const unsigned flags = prefix[5];
    size_t at = 6 + ((flags & 0x20) ? 16 : 0) + ((flags & 0x10) ? 4 : 0);
    const size_t width = size_t{1} << (flags & 3);
    hsize_t size = 0;
    for (size_t b = 0; b < width; ++b) size |= hsize_t{prefix[at + b]} << (8 * b);
    at += width;
    return at + size + 4;  // prefix, messages, checksum
  };
  int checked = 0;
  for (const char* group : {"/steps", "/routing", "/perf", "/trace"}) {
    H5Id g(MOE_H5_CHECK(H5Gopen2(file.get(), group, H5P_DEFAULT)), H5Gclose);
    H5G_info_t info;
    MOE_H5_CHECK(H5Gget_info(g.get(), &info));
    for (hsize_t i = 0; i < info.nlinks; ++i) {
      H5O_info_t o;
      MOE_H5_CHECK(H5Oget_info_by_idx2(g.get(), ".", H5_INDEX_NAME, H5_ITER_INC, i, &o,
                                       H5O_INFO_BASIC | H5O_INFO_HDR, H5P_DEFAULT));
      if (o.type != H5O_TYPE_DATASET) continue;
      ++checked;
      const hsize_t bytes = chunk0_bytes(o.addr);
      EXPECT_EQ(o.addr / page, (o.addr + bytes - 1) / page)
          << group << " #" << i << " header chunk 0 at " << o.addr << ", " << bytes << " bytes";
    }
  }
  EXPECT_GE(checked, 16);
}

// A full disk at an append (simulated in the writer program: see stats_writer_child.cpp) ends the
// writer at once: the process usually dies of the error without running destructors (rank 0
// aborts the job), so the writer must not leave the file marked as open for writing. A file
// without a complete step is removed; one with steps is closed with them.
TEST(StatsFullDisk, AFileWithoutACompleteStepIsRemoved) {
  TempDir dir;
  const std::string path = dir.file("run.h5");
  WriterProcess writer({"full-disk", path, "0"});
  const std::string said = writer.read_all();
  const int status = writer.wait();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status << ": " << said;
  EXPECT_NE(said.find("statistics file '" + path + "' held no complete step and was removed"),
            std::string::npos)
      << said;
  EXPECT_FALSE(std::filesystem::exists(path));
  EXPECT_FALSE(std::filesystem::exists(path + ".new"));
}

TEST(StatsFullDisk, AFileWithStepsIsClosedWithThem) {
  TempDir dir;
  const std::string path = dir.file("run.h5");
  WriterProcess writer({"full-disk", path, "5"});
  const std::string said = writer.read_all();
  const int status = writer.wait();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status << ": " << said;
  const std::string closed = "statistics file '" + path + "' was closed with its ";
  const size_t at = said.find(closed);
  ASSERT_NE(at, std::string::npos) << said;
  const size_t rows = std::stoul(said.substr(at + closed.size()));
  EXPECT_GE(rows, 5u);
  const H5Id file = open_file(path, /*swmr=*/false);  // no "open for writing" flag left
  EXPECT_EQ(committed_rows(file.get()), rows);
  expect_step_rows(file.get(), rows);
}

// The full disk's error is one line short enough to read, naming the file and the system's cause
// (HDF5's whole error stack made it 600 to 4,500 characters).
TEST(StatsFullDisk, TheErrorIsOneShortLineNamingFileAndCause) {
  TempDir dir;
  const std::string path = dir.file("run.h5");
  WriterProcess writer({"full-disk", path, "2"});
  const std::string said = writer.read_all();
  const int status = writer.wait();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status << ": " << said;
  EXPECT_NE(said.find("No space left on device (errno 28)"), std::string::npos) << said;
  EXPECT_NE(said.find("statistics file '" + path + "'"), std::string::npos) << said;
  EXPECT_EQ(said.find('\n'), std::string::npos) << said;
  EXPECT_LT(said.size(), 240 + path.size()) << said;
}

// The writer appends one row per request; the reader (this process) refreshes and sees each row
// appear. The reader must be another process: a second H5Fopen in the writer's process succeeds
// but shares the writer's open file (HDF5 matches the inode), so it would see rows through the
// writer's caches rather than through the file.
TEST(StatsSwmr, ReaderSeesRowsAppearWhileTheWriterRuns) {
  TempDir dir;
  const std::string path = dir.file("run.h5");
  constexpr int kRows = 5;
  WriterProcess writer({"lock-step", path, std::to_string(kRows)});
  ASSERT_TRUE(writer.receive()) << "the writer did not start";
  {
    const H5Id file = open_file(path);
    H5Id step(MOE_H5_CHECK(H5Dopen2(file.get(), "/steps/step", H5P_DEFAULT)), H5Dclose);
    H5Id load(MOE_H5_CHECK(H5Dopen2(file.get(), "/routing/expert_load", H5P_DEFAULT)), H5Dclose);
    EXPECT_EQ(dataset_dims(step.get())[0], 0u);
    for (int s = 0; s < kRows; ++s) {
      writer.send();
      ASSERT_TRUE(writer.receive()) << "the writer did not append row " << s;
      MOE_H5_CHECK(H5Drefresh(step.get()));
      MOE_H5_CHECK(H5Drefresh(load.get()));
      EXPECT_EQ(dataset_dims(step.get())[0], hsize_t(s + 1));
      EXPECT_EQ(dataset_dims(load.get()), (std::vector<hsize_t>{hsize_t(s + 1), kL, kE}));
    }
    expect_step_rows(file.get(), kRows);
  }
  writer.send();
  const int status = writer.wait();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
}

// A reader does not read a dataset's extent and its chunk index at the same moment. While the
// live file compressed each chunk as it filled, moving it, a reader that took the extent before
// a chunk filled and the index after read the compressed bytes as raw values (seen in 5 of 12
// twelve-second `moe_stats.py watch` runs on `--model micro`). Here a reader opens the file again
// and again while the writer appends with chunks of 1 to 4 rows, checking every row it counts as
// complete.
TEST(StatsSwmr, ReadersDuringAppendsReadOnlyTheRowsWritten) {
  TempDir dir;
  const std::string path = dir.file("run.h5");
  WriterProcess writer({"stream", path});
  ASSERT_TRUE(writer.receive()) << "the writer did not start";
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  size_t reads = 0, last = 0;
  while (std::chrono::steady_clock::now() < end && !testing::Test::HasFailure()) {
    const H5Id file = open_file(path, true, 100);
    last = committed_rows(file.get());
    expect_step_rows(file.get(), last);
    ++reads;
  }
  writer.kill();
  writer.wait();
  EXPECT_GT(last, 20u) << "the writer appended too few rows to test anything";
  EXPECT_GT(reads, 20u);
}

}  // namespace
}  // namespace moe

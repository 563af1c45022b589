// Tests of the statistics file's life on disk (docs/hdf5-schema.md, "Paths" and "Locks"): a file
// a live writer holds is never replaced or removed by another writer, whether it is being written
// or still being set up; a writer that never publishes leaves the old file byte for byte; leftovers
// of killed writers are removed, a live writer's are not; a file removed during the run is
// reported, not recreated. The other writer is a second StatsWriter, or a FileLock held by the
// test, in this process: open-file-description locks conflict inside one process too.
// Legend: N rows, L layers, E experts, K top-k, V vocabulary, W ranks, T traced tokens.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "io/file_lock.hpp"
#include "io/stats_writer.hpp"
#include "stats_test_util.hpp"
#include "test_tempdir.hpp"

namespace moe {
namespace {

namespace fs = std::filesystem;
using namespace stats_test;
using testing_util::TempDir;

std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

// The StatsPathError message of `call`; "" if it throws none.
template <typename Call> std::string path_error_of(Call call) {
  try {
    call();
  } catch (const StatsPathError& e) {
    return e.what();
  }
  return "";
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// A published file with `rows` rows, closed.
void write_file(const std::string& path, int64_t rows) {
  StatsWriter w(path, true, test_header());
  w.publish();
  write_rows(w, 0, rows);
}

// ---- a live writer's file ----------------------------------------------------------------------

TEST(StatsLock, ALiveWritersFileIsNeitherReplacedNorRemoved) {
  TempDir dir;
  const std::string path = dir.file("live.h5");
  StatsWriter live(path, false, test_header());
  live.publish();
  write_rows(live, 0, 3);
  for (const std::string& msg : {path_error_of([&] { StatsWriter::check_path(path, true); }),
                                 path_error_of([&] { StatsWriter(path, true, test_header()); })}) {
    EXPECT_TRUE(contains(msg, "'" + path + "'") &&
                contains(msg, "is being written by another running moe_rt") &&
                contains(msg, "choose another --stats"))
        << msg;
  }
  EXPECT_FALSE(fs::exists(path + ".new"));
  write_rows(live, 3, 5);  // the live writer goes on, in the same file
  live.close();
  expect_step_rows(open_file(path, /*swmr=*/false).get(), 5, /*exact=*/true);
  EXPECT_EQ(path_error_of([&] { StatsWriter::check_path(path, true); }), "");  // lock released
}

TEST(StatsLock, AWriterStillSettingUpHoldsThePathToo) {
  TempDir dir;
  const std::string path = dir.file("setup.h5");
  write_file(path, 2);
  const std::string old = file_bytes(path);
  StatsWriter first(path, true, test_header());  // not published: its set-up goes on
  const std::string msg = path_error_of([&] { StatsWriter(path, true, test_header()); });
  EXPECT_TRUE(contains(msg, "is being created by another running moe_rt") &&
              contains(msg, path + ".new"))
      << msg;
  EXPECT_EQ(file_bytes(path), old);
  first.publish();
  first.close();
  expect_step_rows(open_file(path).get(), 0, true);
}

// A writer that appeared at the path after this one was checked (an older moe_rt, say) is found
// at publish: this writer stays unpublished and the other's file is untouched.
TEST(StatsLock, PublishRefusesAPathALiveWriterTookMeanwhile) {
  TempDir dir;
  const std::string path = dir.file("taken.h5");
  StatsWriter late(path, true, test_header());
  FileLock other;
  ASSERT_EQ(FileLock::create(path, other), FileLock::Outcome::kLocked);
  write_bytes(path, "another run's rows");
  const std::string msg = path_error_of([&] { late.publish(); });
  EXPECT_TRUE(contains(msg, "is being written by another running moe_rt")) << msg;
  late.close();
  EXPECT_EQ(file_bytes(path), "another run's rows");
  EXPECT_FALSE(fs::exists(path + ".new"));
}

// ---- set-up that fails, publishing -------------------------------------------------------------

TEST(StatsStaging, AWriterThatNeverPublishesLeavesTheOldFileByteForByte) {
  TempDir dir;
  const std::string path = dir.file("old.h5");
  write_file(path, 4);
  const std::string old = file_bytes(path);
  {
    StatsWriter w(path, true, test_header(0));
    EXPECT_TRUE(fs::exists(path + ".new"));
    EXPECT_THROW(write_rows(w, 0, 1), std::invalid_argument);  // no rows before publish()
  }
  EXPECT_EQ(file_bytes(path), old);
  EXPECT_FALSE(fs::exists(path + ".new"));
}

TEST(StatsStaging, PublishWithoutOverwriteRefusesAFileThatAppearedSinceTheCheck) {
  TempDir dir;
  const std::string path = dir.file("appeared.h5");
  StatsWriter w(path, false, test_header());
  write_bytes(path, "someone else's file");
  const std::string msg = path_error_of([&] { w.publish(); });
  EXPECT_TRUE(contains(msg, "already exists") && contains(msg, "--overwrite")) << msg;
  w.close();
  EXPECT_EQ(file_bytes(path), "someone else's file");
}

TEST(StatsStaging, ALinkToAFileIsKeptAndItsFileReplaced) {
  TempDir dir;
  const std::string real = dir.file("real.h5"), link = dir.file("link.h5");
  write_bytes(real, "old");
  fs::create_symlink(real, link);
  {
    StatsWriter w(link, true, test_header());
    w.publish();
    write_rows(w, 0, 2);
  }
  EXPECT_TRUE(fs::is_symlink(link));
  expect_step_rows(open_file(real, false).get(), 2, true);
}

// ---- leftovers of killed writers ---------------------------------------------------------------

TEST(StatsLeftovers, AKilledWritersCompactionAndStagingFilesAreRemovedAtTheStart) {
  TempDir dir;
  const std::string path = dir.file("run.h5");
  write_bytes(path + ".compact", "half a copy");
  write_bytes(path + ".new", "half a header");
  StatsWriter w(path, false, test_header());
  EXPECT_FALSE(fs::exists(path + ".compact"));  // at the start, not at close
  EXPECT_NE(file_bytes(path + ".new"), "half a header");
  w.publish();
  write_rows(w, 0, 2);
  w.close();
  EXPECT_FALSE(fs::exists(path + ".new") || fs::exists(path + ".compact"));
  expect_step_rows(open_file(path, false).get(), 2, true);
}

TEST(StatsLeftovers, ACompactionFileALiveWriterHoldsIsLeftAlone) {
  TempDir dir;
  const std::string path = dir.file("run.h5");
  FileLock compacting;
  ASSERT_EQ(FileLock::create(path + ".compact", compacting), FileLock::Outcome::kLocked);
  write_bytes(path + ".compact", "a live copy");
  {
    StatsWriter w(path, false, test_header());
    w.publish();
    write_rows(w, 0, 2);
  }  // close() cannot compact (warning): the file stays complete, uncompacted
  EXPECT_EQ(file_bytes(path + ".compact"), "a live copy");
  expect_step_rows(open_file(path, false).get(), 2, true);
}

// ---- a file removed during the run -------------------------------------------------------------

TEST(StatsRemoved, AFileRemovedDuringTheRunIsReportedAndNotRecreated) {
  TempDir dir;
  const std::string path = dir.file("gone.h5");
  StatsWriter w(path, false, test_header());
  w.publish();
  write_rows(w, 0, 3);
  fs::remove(path);
  write_rows(w, 3, 5);
  w.close();
  EXPECT_TRUE(w.removed());
  EXPECT_FALSE(fs::exists(path) || fs::exists(path + ".compact"));
}

TEST(StatsRemoved, AFileReplacedDuringTheRunIsLeftAlone) {
  TempDir dir;
  const std::string path = dir.file("replaced.h5");
  StatsWriter w(path, false, test_header());
  w.publish();
  write_rows(w, 0, 3);
  fs::remove(path);
  write_bytes(path, "a file put there by hand");
  w.close();
  EXPECT_TRUE(w.removed());
  EXPECT_EQ(file_bytes(path), "a file put there by hand");
}

TEST(StatsRemoved, AFileThatStayedIsNotReportedRemoved) {
  TempDir dir;
  StatsWriter w(dir.file("kept.h5"), false, test_header());
  w.publish();
  w.close();
  EXPECT_FALSE(w.removed());
}

}  // namespace
}  // namespace moe

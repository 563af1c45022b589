// Tests of the checkpoint file (io/checkpoint_file.hpp, docs/checkpoints.md): the header and every
// tensor read back bit for bit, each tensor stored chunked with a Fletcher-32 checksum, nothing
// under the final name before commit(), reader errors that name the file and the problem (a byte
// flipped inside a tensor among them: a checksum error, never wrong values), and finding and
// pruning the checkpoints of a directory. Crash safety under SIGKILL: test_checkpoint_crash.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint_test_data.hpp"
#include "checkpoint_test_util.hpp"
#include "io/checkpoint_file.hpp"
#include "io/hdf5_check.hpp"
#include "test_tempdir.hpp"

namespace moe {
namespace {

using checkpoint_test::expect_same_header;

namespace fs = std::filesystem;
using testing_util::TempDir;

// The message of the CheckpointError that `f` throws; a failure when it throws none.
template <class F> std::string error_of(F&& f) {
  try {
    f();
  } catch (const CheckpointError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no CheckpointError thrown";
  return "";
}

void expect_mentions(const std::string& message, std::initializer_list<std::string> parts) {
  for (const std::string& p : parts) {
    EXPECT_NE(message.find(p), std::string::npos) << "'" << p << "' is not in: " << message;
  }
}

// The index of the first element whose bits differ, -1 when all agree: NaN payloads and -0.0
// count, and a mismatch prints one index instead of a million values.
template <class T> int64_t first_difference(const std::vector<T>& a, const std::vector<T>& b) {
  if (a.size() != b.size()) return static_cast<int64_t>(std::min(a.size(), b.size()));
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(T)) != 0) return static_cast<int64_t>(i);
  }
  return -1;
}

// Every field at an edge: 64-bit counts beyond int32, a seed near 2^64 (a signed or double
// round trip would change it), a long multi-line UTF-8 text, quotes and spaces, an empty string.
CheckpointHeader odd_header() {
  CheckpointHeader h;
  h.step = 123'456'789'012;
  h.global_batch = 3'000'000'001;
  h.world_size = 4096;
  h.ep_size = 63;
  h.seed = 0xFFFFFFFFFFFFFFFDull;
  h.model = "deepseek4-tiny";
  for (int i = 0; i < 4000; ++i) {
    h.config_text += "key_" + std::to_string(i) + " = 'a \"quoted\"\tvalue, ü ß 漢字'\n";
  }
  h.program_version = "moe_rt 0.1.0 (09fc686-dirty)";
  h.created = "2026-01-02T03:04:05.123456+05:30";
  h.stats_path = "/runs/ä ö/run (1); $HOME\\x.h5";
  h.data_description = "";
  return h;
}

CheckpointHeader small_header(int64_t step = 3) {
  CheckpointHeader h;
  h.step = step;
  h.global_batch = 8;
  h.world_size = 2;
  h.ep_size = 2;
  h.model = "tiny";
  return h;
}

// Random bit patterns: every kind of float, NaNs with all sorts of payloads among them.
std::vector<float> random_bits(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<float> v(n);
  for (float& x : v) x = std::bit_cast<float>(static_cast<uint32_t>(rng()));
  return v;
}

std::vector<float> special_floats() {
  std::vector<float> v = {-0.0f,
                          0.0f,
                          std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity(),
                          std::numeric_limits<float>::max(),
                          std::numeric_limits<float>::lowest(),
                          std::numeric_limits<float>::denorm_min(),
                          1.0f / 3.0f};
  for (uint32_t nan : {0x7FC00000u, 0x7FC12345u, 0xFFC00001u, 0x7F800001u, 0xFFBFFFFFu}) {
    v.push_back(std::bit_cast<float>(nan));  // quiet and signalling, both signs, payloads
  }
  return v;
}

// A committed checkpoint with one float tensor "param/w" of `n` values 1000 + i.
std::string write_simple(const TempDir& dir, size_t n = 10, int64_t step = 3) {
  const std::string path = dir.file(checkpoint_file_name(step));
  std::vector<float> w(n);
  for (size_t i = 0; i < n; ++i) w[i] = 1000.0f + static_cast<float>(i);
  CheckpointWriter writer(path, small_header(step));
  writer.write_floats("param/w", w);
  writer.commit();
  return path;
}

void touch(const std::string& path, const std::string& text = "") {
  std::ofstream(path) << text;
}

// ---- content ----------------------------------------------------------------------------------

TEST(CheckpointFile, HeaderAndTensorsRoundTripBitForBit) {
  TempDir dir;
  const std::string path = dir.file(checkpoint_file_name(7));
  const CheckpointHeader h = odd_header();
  const std::vector<float> specials = special_floats();
  const std::vector<float> big = random_bits((hsize_t{5} << 20) / 2, 1);  // 2.5 chunks
  const std::vector<hsize_t> table_dims = {5, 3, 100'000};  // chunks of 3 rows: 2 chunks
  std::vector<int32_t> table(5 * 3 * 100'000);
  std::mt19937 rng(2);
  for (int32_t& x : table) x = static_cast<int32_t>(rng());
  table[0] = std::numeric_limits<int32_t>::min(), table[1] = std::numeric_limits<int32_t>::max();
  {
    CheckpointWriter w(path, h);
    w.write_floats("param/layers.3.moe.experts.5.w1", specials);
    w.write_floats("adam_v/layers.3.moe.experts.5.w1", big);
    w.write_floats("param/empty", {});
    w.write_ints("routing/hash_tables", table_dims, table);
    w.write_ints("routing/empty", {0}, {});
    w.write_ints("routing/no_columns", {4, 0}, {});
    w.commit();
  }
  const CheckpointReader r(path);
  EXPECT_EQ(r.path(), path);
  expect_same_header(r.header(), h);
  std::vector<float> got(specials.size(), 7.0f);
  r.read_floats("param/layers.3.moe.experts.5.w1", got);
  EXPECT_EQ(first_difference(got, specials), -1);
  got.assign(big.size(), 7.0f);
  r.read_floats("adam_v/layers.3.moe.experts.5.w1", got);
  EXPECT_EQ(first_difference(got, big), -1);
  std::vector<int32_t> got_table(table.size(), 7);
  r.read_ints("routing/hash_tables", got_table);
  EXPECT_EQ(first_difference(got_table, table), -1);
  EXPECT_NO_THROW(r.read_floats("param/empty", {}));
  EXPECT_NO_THROW(r.read_ints("routing/empty", {}));
  EXPECT_NO_THROW(r.read_ints("routing/no_columns", {}));
}

// What h5py users see (docs/checkpoints.md): the format attributes, an unsigned seed, and every
// tensor with values chunked (at most 2^20 elements a chunk) under a Fletcher-32 checksum.
TEST(CheckpointFile, EveryTensorIsChunkedUnderAFletcher32Checksum) {
  TempDir dir;
  const std::string path = dir.file("ck.h5");
  {
    CheckpointWriter w(path, odd_header());
    w.write_floats("param/one", std::vector<float>{1.0f});
    w.write_floats("param/big", std::vector<float>((hsize_t{5} << 20) / 2, 0.5f));
    w.write_ints("routing/hash_tables", {5, 3, 100'000}, std::vector<int32_t>(1'500'000, 1));
    w.commit();
  }
  h5_silence_auto_print();
  const H5Id file(MOE_H5_CHECK(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT)), H5Fclose);
  const hid_t f = file.get();
  {
    const H5Id type = h5_string_type();
    H5Id a(MOE_H5_CHECK(H5Aopen(f, "format", H5P_DEFAULT)), H5Aclose);
    char* text = nullptr;
    MOE_H5_CHECK(H5Aread(a.get(), type.get(), &text));
    EXPECT_STREQ(text, "moe_rt.checkpoint");
    H5free_memory(text);
    int32_t version = 0;
    H5Id v(MOE_H5_CHECK(H5Aopen(f, "format_version", H5P_DEFAULT)), H5Aclose);
    MOE_H5_CHECK(H5Aread(v.get(), H5T_NATIVE_INT32, &version));
    EXPECT_EQ(version, 1);
    H5Id s(MOE_H5_CHECK(H5Aopen(f, "seed", H5P_DEFAULT)), H5Aclose);
    H5Id seed_type(MOE_H5_CHECK(H5Aget_type(s.get())), H5Tclose);
    EXPECT_EQ(H5Tget_sign(seed_type.get()), H5T_SGN_NONE);
    EXPECT_EQ(H5Tget_size(seed_type.get()), 8u);
  }
  const std::pair<const char*, hsize_t> expected_chunks[] = {
      {"param/one", 1}, {"param/big", 3}, {"routing/hash_tables", 2}};
  for (const auto& [name, num_chunks] : expected_chunks) {
    SCOPED_TRACE(name);
    H5Id d(MOE_H5_CHECK(H5Dopen2(f, name, H5P_DEFAULT)), H5Dclose);
    H5Id dcpl(MOE_H5_CHECK(H5Dget_create_plist(d.get())), H5Pclose);
    ASSERT_EQ(H5Pget_layout(dcpl.get()), H5D_CHUNKED);
    unsigned flags = 0;
    size_t num_values = 0;
    EXPECT_GE(H5Pget_filter_by_id2(dcpl.get(), H5Z_FILTER_FLETCHER32, &flags, &num_values, nullptr,
                                   0, nullptr, nullptr),
              0)
        << "no Fletcher-32 filter";
    H5Id space(MOE_H5_CHECK(H5Dget_space(d.get())), H5Sclose);
    hsize_t n = 0;
    MOE_H5_CHECK(H5Dget_num_chunks(d.get(), space.get(), &n));
    EXPECT_EQ(n, num_chunks);
    std::vector<hsize_t> chunk(static_cast<size_t>(H5Pget_chunk(dcpl.get(), 0, nullptr)));
    MOE_H5_CHECK(H5Pget_chunk(dcpl.get(), static_cast<int>(chunk.size()), chunk.data()));
    hsize_t chunk_elements = 1;
    for (hsize_t c : chunk) chunk_elements *= c;
    EXPECT_LE(chunk_elements, hsize_t{1} << 20);
  }
}

// ---- commit -----------------------------------------------------------------------------------

TEST(CheckpointFile, NothingUnderTheFinalNameBeforeCommit) {
  TempDir dir;
  const std::string path = dir.file(checkpoint_file_name(3));
  CheckpointWriter w(path, small_header());
  w.write_floats("param/w", std::vector<float>(1000, 1.0f));
  EXPECT_FALSE(fs::exists(path));
  EXPECT_TRUE(fs::exists(path + ".tmp"));
  EXPECT_TRUE(checkpoint_list(dir.path().string()).empty());
  w.commit();
  EXPECT_TRUE(fs::is_regular_file(path));
  EXPECT_FALSE(fs::exists(path + ".tmp"));
  EXPECT_EQ(CheckpointReader(path).header().step, 3);
}

TEST(CheckpointFile, AWriterDestroyedWithoutCommitLeavesNothing) {
  TempDir dir;
  const std::string path = dir.file(checkpoint_file_name(3));
  {
    CheckpointWriter w(path, small_header());
    w.write_floats("param/w", std::vector<float>(1000, 1.0f));
  }
  EXPECT_FALSE(fs::exists(path));
  EXPECT_FALSE(fs::exists(path + ".tmp"));
  EXPECT_TRUE(fs::is_empty(dir.path()));
}

// A stale temporary file (a killed writer's) is replaced, and a checkpoint of the same step
// already there is replaced whole by the commit.
TEST(CheckpointFile, CommitReplacesStaleFilesOfTheSameStep) {
  TempDir dir;
  const std::string path = write_simple(dir, 10, 3);
  touch(path + ".tmp", "half a checkpoint");
  CheckpointWriter w(path, small_header());
  w.write_floats("param/w", std::vector<float>(4, -2.0f));
  w.commit();
  const CheckpointReader r(path);
  std::vector<float> got(4);
  r.read_floats("param/w", got);
  EXPECT_EQ(got, std::vector<float>(4, -2.0f));
  EXPECT_FALSE(fs::exists(path + ".tmp"));
}

// A shape that does not match its values would make HDF5 read past the caller's buffer.
TEST(CheckpointFile, WriterRefusesValuesThatDoNotFillTheShape) {
  TempDir dir;
  const std::string path = dir.file("ck.h5");
  CheckpointWriter w(path, small_header());
  expect_mentions(error_of([&] {
                    w.write_ints("routing/t", {2, 3}, std::vector<int32_t>(5));
                  }),
                  {path, "'routing/t'", "5 values", "2 x 3"});
  expect_mentions(error_of([&] { w.write_ints("routing/t", {}, std::vector<int32_t>(1)); }),
                  {path, "'routing/t'"});
  w.write_ints("routing/t", {2, 3}, std::vector<int32_t>(6, 4));  // the name is still free
  w.commit();
  std::vector<int32_t> got(6);
  CheckpointReader(path).read_ints("routing/t", got);
  EXPECT_EQ(got, std::vector<int32_t>(6, 4));
}

TEST(CheckpointFile, WriterErrorsNameTheFile) {
  TempDir dir;
  const std::string path = dir.file("no-such-dir/" + checkpoint_file_name(1));
  expect_mentions(error_of([&] { CheckpointWriter w(path, small_header()); }), {path});
  const std::string good = dir.file("ck.h5");
  CheckpointWriter w(good, small_header());
  w.write_floats("param/w", std::vector<float>(2));
  expect_mentions(error_of([&] { w.write_floats("param/w", std::vector<float>(2)); }),
                  {good, "writing failed"});
}

// ---- reader errors ----------------------------------------------------------------------------

TEST(CheckpointReaderErrors, MissingFileOrDirectory) {
  TempDir dir;
  const std::string path = dir.file(checkpoint_file_name(1));
  expect_mentions(error_of([&] { CheckpointReader r(path); }), {path, "missing"});
  const std::string folder = dir.path().string();
  expect_mentions(error_of([&] { CheckpointReader r(folder); }), {folder, "directory"});
}

TEST(CheckpointReaderErrors, NotAnHdf5File) {
  TempDir dir;
  const std::string path = dir.file(checkpoint_file_name(1));
  touch(path, "model = deepseek4-tiny\nsteps = 10\n");
  expect_mentions(error_of([&] { CheckpointReader r(path); }), {path, "not an HDF5 file"});
}

TEST(CheckpointReaderErrors, Hdf5FileOfAnotherKind) {
  TempDir dir;
  const std::string bare = dir.file("bare.h5"), stats = dir.file("stats.h5");
  h5_silence_auto_print();
  for (const std::string& path : {bare, stats}) {
    const H5Id f(MOE_H5_CHECK(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT)),
                 H5Fclose);
    if (path == stats) h5_write_string_attr(f.get(), "format", "moe_rt.stats");
    h5_write_int_attr(f.get(), "format_version", 1);
  }
  for (const std::string& path : {bare, stats}) {
    expect_mentions(error_of([&] { CheckpointReader r(path); }), {path, "not a moe_rt checkpoint"});
  }
}

TEST(CheckpointReaderErrors, AnotherFormatVersion) {
  TempDir dir;
  const std::string path = write_simple(dir);
  {
    h5_silence_auto_print();
    const H5Id f(MOE_H5_CHECK(H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT)), H5Fclose);
    MOE_H5_CHECK(H5Adelete(f.get(), "format_version"));
    h5_write_int_attr(f.get(), "format_version", 2);
  }
  expect_mentions(error_of([&] { CheckpointReader r(path); }),
                  {path, "format version 2", "reads version 1"});
}

TEST(CheckpointReaderErrors, TruncatedFile) {
  TempDir dir;
  const std::string path = write_simple(dir, 500'000);
  fs::resize_file(path, fs::file_size(path) / 2);
  const std::string message = error_of([&] { CheckpointReader r(path); });
  expect_mentions(message, {path, "cannot be opened", "truncated file: eof = "});
  // HDF5's cause in one short line, not its whole stack.
  EXPECT_LT(message.size(), 250 + path.size()) << message;
  EXPECT_EQ(message.find("major"), std::string::npos) << message;
}

// A byte flipped inside a tensor's stored values: the read fails with HDF5's Fletcher-32 error
// instead of returning values one bit off; the header and the other tensors still read.
TEST(CheckpointReaderErrors, FlippedByteInATensorIsAChecksumError) {
  TempDir dir;
  const std::string path = write_simple(dir, 300'000);
  haddr_t addr = HADDR_UNDEF;
  hsize_t stored_bytes = 0;
  {
    h5_silence_auto_print();
    const H5Id f(MOE_H5_CHECK(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT)), H5Fclose);
    const H5Id d(MOE_H5_CHECK(H5Dopen2(f.get(), "param/w", H5P_DEFAULT)), H5Dclose);
    const H5Id space(MOE_H5_CHECK(H5Dget_space(d.get())), H5Sclose);
    MOE_H5_CHECK(
        H5Dget_chunk_info(d.get(), space.get(), 0, nullptr, nullptr, &addr, &stored_bytes));
  }
  ASSERT_GE(stored_bytes, 300'000u * 4);
  EXPECT_EQ(stored_bytes, 300'000u * 4 + 4);  // the values, then their checksum
  std::fstream io(path, std::ios::in | std::ios::out | std::ios::binary);
  // Element 1000 (the value 2000.0f) as it lies in the file: this is the tensor's raw data.
  const std::streamoff at = static_cast<std::streamoff>(addr) + 4 * 1000;
  float stored = 0;
  io.seekg(at);
  io.read(reinterpret_cast<char*>(&stored), 4);
  ASSERT_EQ(stored, 2000.0f) << "chunk 0 is not at file offset " << addr;
  const float flipped = std::bit_cast<float>(std::bit_cast<uint32_t>(stored) ^ 1u);
  io.seekp(at);
  io.write(reinterpret_cast<const char*>(&flipped), 4);
  io.close();

  const CheckpointReader r(path);
  EXPECT_EQ(r.header().step, 3);
  std::vector<float> got(300'000);
  expect_mentions(error_of([&] { r.read_floats("param/w", got); }),
                  {path, "'param/w'", "Fletcher32 checksum"});
}

TEST(CheckpointReaderErrors, MissingDatasetWrongSizeWrongType) {
  TempDir dir;
  const std::string path = dir.file(checkpoint_file_name(3));
  {
    CheckpointWriter w(path, small_header());
    w.write_floats("param/w", std::vector<float>(10, 1.5f));
    w.write_ints("routing/hash_tables", {2, 5}, std::vector<int32_t>(10, 3));
    w.commit();
  }
  const CheckpointReader r(path);
  std::vector<float> floats(10);
  std::vector<int32_t> ints(10);
  for (const char* name : {"param/v", "adam_m/w", "param/w/x"}) {
    expect_mentions(error_of([&] { r.read_floats(name, floats); }),
                    {path, "has no dataset '" + std::string(name) + "'"});
  }
  for (size_t n : {9, 11}) {
    std::vector<float> wrong(n);
    expect_mentions(error_of([&] { r.read_floats("param/w", wrong); }),
                    {path, "'param/w'", "holds 10 values", "needs " + std::to_string(n)});
  }
  // HDF5 would convert between float and int; a tensor of the other type is an error instead.
  expect_mentions(error_of([&] { r.read_floats("routing/hash_tables", floats); }),
                  {path, "'routing/hash_tables'", "int32", "float32"});
  expect_mentions(error_of([&] { r.read_ints("param/w", ints); }),
                  {path, "'param/w'", "float32", "int32"});
  r.read_floats("param/w", floats);  // the reader still works
  EXPECT_EQ(floats, std::vector<float>(10, 1.5f));
}

// ---- directories ------------------------------------------------------------------------------

// A checkpoint of run `run_id` (started at `started`, continuing `lineage`) at `step` in `dir`.
void write_run_checkpoint(const std::string& dir, int64_t step, const std::string& run_id,
                          int64_t started, const std::string& lineage = "") {
  CheckpointHeader h = checkpoint_test::header_of_step(step);
  h.run_id = run_id;
  h.run_started = started;
  h.lineage = lineage;
  checkpoint_test::write_checkpoint(dir, step, &h);
}

constexpr const char* kRunA = "aaaaaaaaaaaaaaaa";
constexpr const char* kRunB = "bbbbbbbbbbbbbbbb";

TEST(CheckpointDirectory, ResolveFileDirectoryAndMissing) {
  TempDir dir;
  const std::string folder = dir.path().string();
  touch(dir.file("anything.h5"));
  EXPECT_EQ(checkpoint_resolve(dir.file("anything.h5")), dir.file("anything.h5"));
  // Step 10 is the run's newest by step; step 2 is the newest by file time, which counts for
  // nothing.
  for (int s : {10, 9, 2}) write_run_checkpoint(folder, s, kRunA, 100);
  fs::last_write_time(
      dir.file(checkpoint_file_name(10)),
      fs::last_write_time(dir.file(checkpoint_file_name(2))) - std::chrono::hours(1));
  // Not complete checkpoints: temporary, other spellings, not a regular file.
  touch(dir.file(checkpoint_file_name(11) + ".tmp"));
  touch(dir.file("step-12.h5"));
  touch(dir.file(checkpoint_file_name(13) + ".bak"));
  touch(dir.file("step-000000014.h5"));
  touch(dir.file("step-00000016.ABCDEF0123456789.h5"));  // not a run id: upper case
  touch(dir.file("step-00000016.0123.h5"));
  fs::create_directory(dir.file(checkpoint_file_name(15)));
  std::string note = "stale";
  EXPECT_EQ(checkpoint_resolve(folder, &note), dir.file(checkpoint_file_name(10)));
  EXPECT_EQ(note, "");  // one run: nothing to say
  EXPECT_EQ(checkpoint_resolve(folder + "/"),
            (dir.path() / "" / checkpoint_file_name(10)).string());
  const auto list = checkpoint_list(folder);
  ASSERT_EQ(list.size(), 3u);
  EXPECT_EQ(list[0], std::make_pair(int64_t{2}, dir.file(checkpoint_file_name(2))));
  EXPECT_EQ(list[1].first, 9);
  EXPECT_EQ(list[2].first, 10);

  const std::string missing = dir.file("gone");
  expect_mentions(error_of([&] { checkpoint_resolve(missing); }), {missing, "no such file"});
  // A file under a checkpoint's name whose header cannot be read stops the choice, named.
  touch(dir.file(checkpoint_file_name(30)), "not a checkpoint");
  expect_mentions(error_of([&] { checkpoint_resolve(folder); }),
                  {dir.file(checkpoint_file_name(30)), "not an HDF5 file"});
}

TEST(CheckpointDirectory, ResolveRefusesADirectoryWithoutACompleteCheckpoint) {
  TempDir dir;
  const std::string folder = dir.path().string();
  expect_mentions(error_of([&] { checkpoint_resolve(folder); }),
                  {folder, "no complete checkpoint"});
  touch(dir.file(checkpoint_file_name(4) + ".tmp"));
  touch(dir.file("step-1.h5"));
  touch(dir.file(checkpoint_file_name(1) + ".bak"));
  touch(dir.file("notes.txt"));
  expect_mentions(error_of([&] { checkpoint_resolve(folder); }),
                  {folder, "no complete checkpoint"});
}

// Run A wrote 3, 7, ..., 23; run B resumed from A's step 7 and wrote 11 and 15 (beside A's of the
// same steps, under names with its id) and 17: the folder's newest run is B, whatever the steps.
TEST(CheckpointDirectory, ResolveTakesTheNewestOfTheRunStartedLastAndSaysWhatElseIsThere) {
  TempDir dir;
  const std::string folder = dir.path().string();
  for (int s = 3; s <= 23; s += 4) write_run_checkpoint(folder, s, kRunA, 100);
  const std::string lineage = std::string(kRunA) + "@7";
  for (int s : {11, 15, 17}) write_run_checkpoint(folder, s, kRunB, 200, lineage);
  EXPECT_TRUE(fs::exists(dir.file(checkpoint_file_name(11, kRunB))));
  EXPECT_TRUE(fs::exists(dir.file(checkpoint_file_name(11))));  // A's, not replaced
  EXPECT_EQ(CheckpointReader(dir.file(checkpoint_file_name(11))).header().run_id, kRunA);
  EXPECT_EQ(checkpoint_path_for(folder, 17, kRunB), dir.file(checkpoint_file_name(17)));
  EXPECT_EQ(checkpoint_path_for(folder, 19, kRunB), dir.file(checkpoint_file_name(19, kRunB)));
  EXPECT_EQ(checkpoint_path_for(folder, 19, kRunA), dir.file(checkpoint_file_name(19)));
  EXPECT_EQ(checkpoint_path_for(folder, 40, kRunA), dir.file(checkpoint_file_name(40)));

  std::string note;
  EXPECT_EQ(checkpoint_resolve(folder, &note), dir.file(checkpoint_file_name(17)));
  // A's 11, 15, 19 and 23 lie on another branch; its 3 and 7 are B's history too.
  expect_mentions(note, {"run " + std::string(kRunB), "4 checkpoint(s) of other branches",
                         "step 23 of run " + std::string(kRunA)});

  // Branches: B's own, and A's up to the step B continued from.
  const auto catalog = checkpoint_catalog(folder);
  ASSERT_EQ(catalog.size(), 9u);
  std::vector<int64_t> on_b;
  for (const CheckpointEntry& e : catalog) {
    if (checkpoint_on_branch(e, kRunB, lineage)) on_b.push_back(e.step);
  }
  EXPECT_EQ(on_b, (std::vector<int64_t>{3, 7, 11, 15, 17}));
}

TEST(CheckpointDirectory, PruneKeepsTheNewestOfItsBranchAndNeverAnotherBranch) {
  TempDir dir;
  const std::string folder = dir.path().string();
  for (int s : {1, 2, 3, 5, 8}) write_run_checkpoint(folder, s, kRunA, 100);
  const std::string lineage = std::string(kRunA) + "@3";  // B continued A's step 3
  for (int s : {4, 6, 7}) write_run_checkpoint(folder, s, kRunB, 200, lineage);
  const std::vector<std::string> stale = {checkpoint_file_name(9) + ".tmp",
                                          checkpoint_file_name(1) + ".tmp",
                                          checkpoint_file_name(4, kRunB) + ".tmp"};
  const std::vector<std::string> unrelated = {
      "notes.txt",    "step-1.h5", "other.tmp", "x.h5.tmp", checkpoint_file_name(3) + ".bak",
      "step-1.h5.tmp"};
  for (const std::string& name : stale) touch(dir.file(name));
  for (const std::string& name : unrelated) touch(dir.file(name));
  EXPECT_TRUE(checkpoint_prune(folder, 2, kRunB, lineage).empty());
  std::vector<std::string> left;
  for (const fs::directory_entry& e : fs::directory_iterator(dir.path())) {
    left.push_back(e.path().filename().string());
  }
  std::sort(left.begin(), left.end());
  // B's branch (A's 1, 2, 3, B's 4, 6, 7) keeps 6 and 7; A's 5 and 8 are another branch's.
  std::vector<std::string> want = unrelated;
  for (int s : {5, 6, 7, 8}) want.push_back(checkpoint_file_name(s));
  std::sort(want.begin(), want.end());
  EXPECT_EQ(left, want);

  EXPECT_TRUE(checkpoint_prune(folder, 5, kRunB, lineage).empty());  // fewer than K
  EXPECT_EQ(checkpoint_list(folder).size(), 4u);
  EXPECT_TRUE(checkpoint_prune(folder, 0, kRunB, lineage).empty());  // the newest always stays
  EXPECT_EQ(checkpoint_list(folder).size(), 3u);
  // Run A alone (its lineage is empty): 5 and 8 are its own.
  EXPECT_TRUE(checkpoint_prune(folder, 1, kRunA, "").empty());
  std::vector<int64_t> steps;
  for (const auto& [step, path] : checkpoint_list(folder)) steps.push_back(step);
  EXPECT_EQ(steps, (std::vector<int64_t>{7, 8}));
  // A file the catalog cannot read: nothing is removed, and the warning says why.
  touch(dir.file(checkpoint_file_name(2)), "damaged");
  const auto warnings = checkpoint_prune(folder, 1, kRunB, lineage);
  ASSERT_EQ(warnings.size(), 1u);
  expect_mentions(warnings[0], {"not pruned", checkpoint_file_name(2)});
  EXPECT_EQ(checkpoint_list(folder).size(), 3u);
  EXPECT_TRUE(checkpoint_prune(dir.file("gone"), 2, kRunA, "").empty());  // never throws
}

TEST(CheckpointDirectory, OneLiveRunPerFolder) {
  TempDir dir;
  const std::string folder = dir.file("ck/inner");
  const std::string lock_file = folder + "/" + kCheckpointLockName;
  {
    CheckpointFolderLock first(folder, "run 1, process 7 on host-a");
    EXPECT_TRUE(fs::exists(lock_file));
    expect_mentions(error_of([&] { CheckpointFolderLock second(folder, "run 2"); }),
                    {"checkpoint folder '" + folder + "' is in use by another live run",
                     "run 1, process 7 on host-a", "--checkpoint-dir"});
  }
  // Released: the lock file and the empty folder it created are gone, its parent stays.
  EXPECT_FALSE(fs::exists(folder));
  EXPECT_TRUE(fs::exists(dir.file("ck")));
  {
    CheckpointFolderLock again(folder, "run 3");
    write_run_checkpoint(folder, 1, kRunA, 100);
  }
  EXPECT_TRUE(fs::exists(dir.file("ck/inner/" + checkpoint_file_name(1))));  // kept: not empty
  EXPECT_FALSE(fs::exists(lock_file));
  // A lock file left by a killed run is no one's: taken over.
  touch(lock_file, "run 4, killed");
  CheckpointFolderLock after_kill(folder, "run 5");
  EXPECT_TRUE(fs::exists(lock_file));
  // A path that is a file cannot be a folder.
  touch(dir.file("plain"));
  expect_mentions(error_of([&] { CheckpointFolderLock bad(dir.file("plain"), "run 6"); }),
                  {dir.file("plain"), "cannot create it"});
}

}  // namespace
}  // namespace moe

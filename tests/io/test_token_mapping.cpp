// Tests of how the file-backed token sources touch their files: a shard's header is checked
// before anything else is read (a 2 GiB file that is not a shard costs a 1 KiB read), files are
// mapped rather than copied (a 2 GiB text file adds no 2 GiB to the process), the token check
// streams through the mapping without keeping it resident, splits into parts that together find
// the first bad token, and a special file that reports size 0 is named as such.
// "Read" and "resident" are measured with the kernel's own counters (/proc/self/io, VmHWM), not
// with timings; a system without them skips those checks.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "data_error_check.hpp"
#include "io/token_data.hpp"
#include "test_tempdir.hpp"

namespace moe {
namespace {

using testing_util::expect_data_error;
using testing_util::TempDir;

constexpr int64_t kMiB = int64_t{1} << 20;
constexpr int64_t kGiB = int64_t{1} << 30;
constexpr int64_t kHeaderBytes = kShardHeaderInts * sizeof(int32_t);

// A field of /proc/self/<file> ("rchar: 123" or "VmHWM:  456 kB") as a number, -1 without one.
int64_t proc_self_field(const std::string& file, const std::string& field) {
  std::ifstream in("/proc/self/" + file);
  std::string line;
  while (std::getline(in, line)) {
    if (line.starts_with(field + ":")) return std::stoll(line.substr(field.size() + 1));
  }
  return -1;
}

// Bytes this process has read with read-like calls (pread included, page faults not), or -1.
int64_t bytes_read() {
  return proc_self_field("io", "rchar");
}

// The peak resident size since the last reset_resident_peak(), in bytes, or -1.
int64_t resident_peak() {
  const int64_t kib = proc_self_field("status", "VmHWM");
  return kib < 0 ? -1 : kib * 1024;
}
int64_t resident_now() {
  return proc_self_field("status", "VmRSS") * 1024;
}

// Sets the peak resident size back to the current one (Linux: "5" into clear_refs).
bool reset_resident_peak() {
  std::ofstream out("/proc/self/clear_refs");
  out << "5";
  out.close();
  return static_cast<bool>(out);
}

// A sparse file of `num_bytes` (no disk blocks but those written) starting with `head`.
void write_sparse(const std::string& path, int64_t num_bytes, const std::vector<char>& head) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  ASSERT_GE(fd, 0) << path;
  ASSERT_EQ(::pwrite(fd, head.data(), head.size(), 0), static_cast<ssize_t>(head.size()));
  ASSERT_EQ(::ftruncate(fd, num_bytes), 0);
  ::close(fd);
}

std::vector<char> shard_header(int32_t magic, int32_t count) {
  std::vector<int32_t> header(kShardHeaderInts, 0);
  header[0] = magic;
  header[1] = kShardVersion;
  header[2] = count;
  const auto* bytes = reinterpret_cast<const char*>(header.data());
  return {bytes, bytes + kHeaderBytes};
}

// A 2 GiB file that is not a shard is refused from its header: it used to be read whole first
// (2.1 GB resident, tens of seconds on a slow disk). Likewise a header whose count the file
// cannot hold.
TEST(TokenMapping, BadHeaderOfA2GiBFileIsRefusedFromTheHeaderAlone) {
  TempDir dir;
  const std::string bad_magic = dir.file("bad_magic.bin");
  write_sparse(bad_magic, 2 * kGiB, shard_header(12345, 100));
  const std::string too_many = dir.file("too_many.bin");
  write_sparse(too_many, 2 * kGiB, shard_header(kShardMagic, 2147483647));
  const bool have_peak = reset_resident_peak() && resident_peak() > 0;
  const int64_t peak_before = resident_peak();
  const int64_t read_before = bytes_read();

  expect_data_error([&] { FileTokenSource::open_shard(bad_magic, 2048, 16); }, bad_magic,
                    "bad magic 12345");
  expect_data_error([&] { FileTokenSource::open_shard(too_many, 2048, 16); }, too_many,
                    "truncated: header says 2147483647 tokens, file holds 1073741312");

  if (read_before >= 0) {
    EXPECT_LT(bytes_read() - read_before, 64 * 1024) << "read past the headers";
  }
  if (have_peak) {
    EXPECT_LT(resident_peak() - peak_before, 64 * kMiB) << "a file made resident";
  }
}

// A payload that ends inside a token is truncated, not rounded.
TEST(TokenMapping, PayloadEndingInsideATokenIsTruncated) {
  TempDir dir;
  const std::string path = dir.file("half.bin");
  std::vector<char> bytes = shard_header(kShardMagic, 100);
  bytes.resize(kHeaderBytes + 2 * 99 + 1, '\0');
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.close();
  expect_data_error([&] { FileTokenSource::open_shard(path, 2048, 16); }, path,
                    "truncated: header says 100 tokens, file holds 99");
}

// Through the mapping, over several chunks of the token check: the same samples as the tokens
// written, at the sampling rule's offsets, wrap-around included.
TEST(TokenMapping, MappedShardGivesTheWrittenTokens) {
  TempDir dir;
  const std::string path = dir.file("large.bin");
  const int vocab = 50257;
  std::vector<uint16_t> tokens(9'000'001);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint16_t>((i * 7919) % vocab);
  token_shard_write(path, tokens);
  const FileTokenSource source = FileTokenSource::open_shard(path, vocab, 64);
  EXPECT_EQ(source.num_tokens(), static_cast<int64_t>(tokens.size()));
  EXPECT_EQ(source.mapped_bytes(), kHeaderBytes + 2 * static_cast<int64_t>(tokens.size()));
  EXPECT_EQ(source.private_bytes(), 0);
  const auto num_starts = static_cast<int64_t>(tokens.size()) - 64;
  std::vector<int32_t> sample(65);
  for (int64_t sample_idx : {int64_t{0}, int64_t{1}, int64_t{65535}, int64_t{140624},
                             int64_t{140625}, int64_t{987654321}}) {
    source.sample(sample_idx, 64, sample.data());
    const int64_t start = sample_idx * 64 % num_starts;
    for (int pos_idx = 0; pos_idx <= 64; ++pos_idx) {
      ASSERT_EQ(sample[pos_idx], tokens[start + pos_idx]) << sample_idx << " " << pos_idx;
    }
  }
}

// The check reports the first bad token with its offset and value, wherever it lies relative to
// the chunks it streams in (the last token of one, the first of the next, the file's last).
TEST(TokenMapping, BadTokenIsFoundAtItsOffsetAnywhere) {
  TempDir dir;
  const std::string path = dir.file("bad.bin");
  const int64_t num_tokens = 5'000'000;
  for (int64_t bad_idx : {int64_t{0}, (int64_t{1} << 22) - 1, int64_t{1} << 22, num_tokens - 1}) {
    std::vector<uint16_t> tokens(num_tokens, 7);
    tokens[num_tokens - 1] = 4097;  // a later bad token, which must not be the one reported
    tokens[bad_idx] = 4096;
    token_shard_write(path, tokens);
    expect_data_error([&] { FileTokenSource::open_shard(path, 4096, 16); }, path,
                      "token 4096 at offset " + std::to_string(bad_idx) + " is >= --vocab 4096");
  }
}

// Parts split the check: exactly the part holding a bad token fails, naming it; together the
// parts cover every token once. Parts that do not exist are an error.
TEST(TokenMapping, CheckPartsTogetherCoverEveryToken) {
  TempDir dir;
  const std::string path = dir.file("parts.bin");
  const int64_t num_tokens = 1001;
  for (int64_t bad_idx : {int64_t{0}, int64_t{333}, int64_t{334}, int64_t{1000}}) {
    std::vector<uint16_t> tokens(num_tokens, 3);
    tokens[bad_idx] = 64;
    token_shard_write(path, tokens);
    for (int num_parts : {1, 2, 3, 4, 7}) {
      int failures = 0;
      for (int part_idx = 0; part_idx < num_parts; ++part_idx) {
        try {
          FileTokenSource::open_shard(path, 64, 16, TokenCheckPart{part_idx, num_parts});
        } catch (const DataError& e) {
          ++failures;
          EXPECT_NE(std::string(e.what()).find("offset " + std::to_string(bad_idx)),
                    std::string::npos)
              << e.what();
        }
      }
      EXPECT_EQ(failures, 1) << "bad token " << bad_idx << ", " << num_parts << " parts";
    }
  }
  EXPECT_THROW(FileTokenSource::open_shard(path, 65, 16, TokenCheckPart{2, 2}),
               std::invalid_argument);
  EXPECT_THROW(FileTokenSource::open_shard(path, 65, 16, TokenCheckPart{0, 0}),
               std::invalid_argument);
  // The header checks are every part's: a bad header fails whatever the part.
  std::ofstream(path, std::ios::binary | std::ios::in).write("\1\2\3\4", 4);
  expect_data_error(
      [&] {
        FileTokenSource::open_shard(path, 65, 16, TokenCheckPart{1, 3});
      },
      path, "magic");
}

// The check touches every page of a 256 MiB shard, yet the process's peak resident size grows by
// a chunk, not the file: checked pages are dropped as it goes (they stay in the page cache).
TEST(TokenMapping, TokenCheckDoesNotKeepTheFileResident) {
  TempDir dir;
  const std::string path = dir.file("zeros.bin");
  write_sparse(path, kHeaderBytes + 256 * kMiB, shard_header(kShardMagic, 128 * kMiB));
  if (!reset_resident_peak() || resident_peak() < 0) GTEST_SKIP() << "no VmHWM reset here";
  const int64_t peak_before = resident_peak();
  const FileTokenSource source = FileTokenSource::open_shard(path, 2, 16);
  EXPECT_EQ(source.num_tokens(), 128 * kMiB);
  EXPECT_LT(resident_peak() - peak_before, 64 * kMiB);
  EXPECT_LT(resident_now(), peak_before + 64 * kMiB);
}

// A 2 GiB (and a bit) text file is mapped, not copied (it used to take 6.3 GB: the bytes, then
// every byte widened to uint16): opening it reads nothing, and sampling reads bytes at offsets
// past 2^31.
TEST(TokenMapping, TextFileIsMappedNotCopied) {
  TempDir dir;
  const std::string path = dir.file("big.txt");
  const int64_t num_bytes = 2 * kGiB + 4096;
  write_sparse(path, num_bytes, {'a', 'b', 'c'});
  {
    const int fd = ::open(path.c_str(), O_WRONLY);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::pwrite(fd, "xyz", 3, num_bytes - 10), 3);
    ::close(fd);
  }
  const bool have_peak = reset_resident_peak() && resident_peak() > 0;
  const int64_t peak_before = resident_peak();
  const int64_t read_before = bytes_read();
  const FileTokenSource source = FileTokenSource::open_text(path, 256, 8);
  EXPECT_EQ(source.num_tokens(), num_bytes);
  EXPECT_EQ(source.mapped_bytes(), num_bytes);
  std::vector<int32_t> sample(9);
  source.sample(0, 8, sample.data());
  EXPECT_EQ(sample, (std::vector<int32_t>{'a', 'b', 'c', 0, 0, 0, 0, 0, 0}));
  // N − 8 starts, a multiple of 8: sample (N − 16)/8 starts at byte N − 16, the last one a
  // stride of 8 reaches, and ends on byte N − 8.
  source.sample((num_bytes - 16) / 8, 8, sample.data());
  EXPECT_EQ(sample, (std::vector<int32_t>{0, 0, 0, 0, 0, 0, 'x', 'y', 'z'}));
  if (read_before >= 0) {
    EXPECT_LT(bytes_read() - read_before, 64 * 1024);
  }
  if (have_peak) {
    EXPECT_LT(resident_peak() - peak_before, 64 * kMiB);
  }
}

// procfs files report size 0 and produce text when read: named as such, not as unreadable (the
// old wording), while a truly empty file is still "empty".
TEST(TokenMapping, SpecialFileOfSizeZeroIsNamed) {
  const std::string path = "/proc/self/status";
  expect_data_error([&] { FileTokenSource::open_shard(path, 2048, 16); }, path,
                    "reports size 0 but is not empty");
  expect_data_error([&] { FileTokenSource::open_text(path, 256, 16); }, path,
                    "reports size 0 but is not empty");
  TempDir dir;
  const std::string empty = dir.file("empty.bin");
  write_sparse(empty, 0, {});
  expect_data_error([&] { FileTokenSource::open_shard(empty, 2048, 16); }, empty,
                    "truncated header: 0 bytes");
  expect_data_error([&] { FileTokenSource::open_text(empty, 256, 16); }, empty, "empty");
}

}  // namespace
}  // namespace moe

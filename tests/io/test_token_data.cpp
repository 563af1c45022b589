// Tests of the file-backed token sources: llm.c shard round trip and sampling rule, every bad-data
// case (missing or not a file, truncated, bad magic or version, token >= V, shorter than one
// sample: the DataError names the file and the problem), raw text, the `--data` factory.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "data_error_check.hpp"
#include "io/synthetic_data.hpp"
#include "io/token_data.hpp"
#include "io/token_source.hpp"
#include "test_tempdir.hpp"

namespace moe {
namespace {

namespace fs = std::filesystem;

using testing_util::expect_data_error;
using testing_util::TempDir;

// A shard with an arbitrary header and payload, for the malformed cases.
void write_raw_shard(const std::string& path, int32_t magic, int32_t version, int32_t count,
                     const std::vector<uint16_t>& tokens, size_t extra_bytes = 0) {
  std::vector<int32_t> header(kShardHeaderInts, 0);
  header[0] = magic;
  header[1] = version;
  header[2] = count;
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(header.data()), header.size() * sizeof(int32_t));
  out.write(reinterpret_cast<const char*>(tokens.data()), tokens.size() * sizeof(uint16_t));
  out << std::string(extra_bytes, 'x');
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out << bytes;
}

std::vector<uint16_t> counting_tokens(int num_tokens, int vocab) {
  std::vector<uint16_t> tokens(num_tokens);
  for (int i = 0; i < num_tokens; ++i) tokens[i] = static_cast<uint16_t>((i * 7 + 3) % vocab);
  return tokens;
}

TEST(TokenShard, WriteThenReadRoundTrips) {
  TempDir dir;
  const std::string path = dir.file("train.bin");
  const std::vector<uint16_t> tokens = counting_tokens(1000, 500);
  token_shard_write(path, tokens);
  EXPECT_EQ(fs::file_size(path), 1024u + 2u * tokens.size());

  const FileTokenSource source = FileTokenSource::open_shard(path, 512, 16);
  EXPECT_EQ(source.num_tokens(), 1000);
  EXPECT_NE(source.describe().find(path), std::string::npos);
  std::vector<int32_t> sample(17);
  for (int64_t sample_idx : {0, 1, 5, 61}) {
    source.sample(sample_idx, 16, sample.data());
    for (int pos_idx = 0; pos_idx <= 16; ++pos_idx) {
      ASSERT_EQ(sample[pos_idx], tokens[sample_idx * 16 + pos_idx]) << sample_idx << " " << pos_idx;
    }
  }
}

TEST(TokenShard, SamplesWrapAroundModuloValidStarts) {
  TempDir dir;
  const std::string path = dir.file("small.bin");
  const std::vector<uint16_t> tokens = counting_tokens(100, 64);
  token_shard_write(path, tokens);
  const FileTokenSource source = FileTokenSource::open_shard(path, 64, 10);
  std::vector<int32_t> sample(11);
  // 90 valid starts (0..89): sample i starts at (10·i) mod 90.
  for (int64_t sample_idx : {int64_t{8}, int64_t{9}, int64_t{13}, int64_t{1000000000000007}}) {
    source.sample(sample_idx, 10, sample.data());
    const auto start = static_cast<size_t>((sample_idx % 90) * 10 % 90);
    for (int pos_idx = 0; pos_idx <= 10; ++pos_idx) {
      ASSERT_EQ(sample[pos_idx], tokens[start + pos_idx]) << sample_idx;
    }
  }
  // With S = 9 there are 91 starts; sample 10 takes the last one (90) and ends on the last token.
  source.sample(10, 9, sample.data());
  EXPECT_EQ(sample[0], tokens[90]);
  EXPECT_EQ(sample[9], tokens[99]);
  EXPECT_THROW(source.sample(-1, 10, sample.data()), std::invalid_argument);
}

TEST(TokenShard, MissingFileIsNamed) {
  TempDir dir;
  const std::string path = dir.file("absent.bin");
  expect_data_error([&] { FileTokenSource::open_shard(path, 512, 16); }, path, "missing");
}

TEST(TokenShard, DirectoryIsNotARegularFile) {
  TempDir dir;
  const std::string path = dir.file("subdir");
  fs::create_directories(path);
  expect_data_error([&] { FileTokenSource::open_shard(path, 512, 16); }, path,
                    "not a regular file (a directory)");
}

// A FIFO would block the open until something writes to it.
TEST(TokenShard, FifoIsNotARegularFile) {
  TempDir dir;
  const std::string path = dir.file("pipe.bin");
  ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0);
  expect_data_error([&] { FileTokenSource::open_shard(path, 512, 16); }, path,
                    "not a regular file");
}

TEST(TokenShard, DanglingLinkIsMissing) {
  TempDir dir;
  const std::string path = dir.file("link.bin");
  fs::create_symlink(dir.file("absent.bin"), path);
  expect_data_error([&] { FileTokenSource::open_shard(path, 512, 16); }, path,
                    "missing: a link to no file");
}

TEST(TokenShard, FileShorterThanHeaderIsTruncated) {
  TempDir dir;
  const std::string path = dir.file("short.bin");
  write_bytes(path, std::string(100, '\0'));
  expect_data_error([&] { FileTokenSource::open_shard(path, 512, 16); }, path, "header");
}

TEST(TokenShard, BadMagicIsNamed) {
  TempDir dir;
  const std::string path = dir.file("magic.bin");
  write_raw_shard(path, 12345, 1, 100, counting_tokens(100, 64));
  expect_data_error([&] { FileTokenSource::open_shard(path, 512, 16); }, path, "magic");
}

TEST(TokenShard, BadVersionIsNamed) {
  TempDir dir;
  const std::string path = dir.file("version.bin");
  write_raw_shard(path, kShardMagic, 2, 100, counting_tokens(100, 64));
  expect_data_error([&] { FileTokenSource::open_shard(path, 512, 16); }, path, "version 2");
}

TEST(TokenShard, FewerTokensThanHeaderSaysIsTruncated) {
  TempDir dir;
  const std::string path = dir.file("truncated.bin");
  write_raw_shard(path, kShardMagic, 1, 100, counting_tokens(60, 64));
  expect_data_error([&] { FileTokenSource::open_shard(path, 512, 16); }, path, "truncated");
}

TEST(TokenShard, BytesBeyondHeaderCountAreRejected) {
  TempDir dir;
  const std::string path = dir.file("trailing.bin");
  write_raw_shard(path, kShardMagic, 1, 100, counting_tokens(100, 64), 3);
  expect_data_error([&] { FileTokenSource::open_shard(path, 512, 16); }, path, "trailing");
}

TEST(TokenShard, TokenAtLeastVocabNamesOffsetValueAndVocab) {
  TempDir dir;
  const std::string path = dir.file("range.bin");
  std::vector<uint16_t> tokens = counting_tokens(100, 64);
  tokens[37] = 64;
  token_shard_write(path, tokens);
  expect_data_error([&] { FileTokenSource::open_shard(path, 64, 16); }, path, "out of range");
  expect_data_error([&] { FileTokenSource::open_shard(path, 64, 16); }, path, "offset 37");
  expect_data_error([&] { FileTokenSource::open_shard(path, 64, 16); }, path, "token 64");
  expect_data_error([&] { FileTokenSource::open_shard(path, 64, 16); }, path, "--vocab 64");
  EXPECT_NO_THROW(FileTokenSource::open_shard(path, 65, 16));
}

TEST(TokenShard, ShorterThanOneSampleIsNamed) {
  TempDir dir;
  const std::string path = dir.file("tiny.bin");
  token_shard_write(path, counting_tokens(16, 64));
  expect_data_error([&] { FileTokenSource::open_shard(path, 64, 16); }, path, "shorter than one");
  EXPECT_NO_THROW(FileTokenSource::open_shard(path, 64, 15));  // 16 tokens: exactly one sample
  const std::string empty = dir.file("empty.bin");
  token_shard_write(empty, {});
  expect_data_error([&] { FileTokenSource::open_shard(empty, 64, 16); }, empty, "empty");
}

TEST(TokenShard, UnwritablePathIsNamed) {
  TempDir dir;
  const std::string path = dir.file("no_such_dir/out.bin");
  const std::vector<uint16_t> tokens = counting_tokens(10, 64);
  expect_data_error([&] { token_shard_write(path, tokens); }, path, "cannot write");
}

TEST(TextSource, BytesAreTokens) {
  TempDir dir;
  const std::string path = dir.file("corpus.txt");
  std::string text = "hello, moe_rt";
  text += static_cast<char>(0xff);
  text += static_cast<char>(0x80);
  write_bytes(path, text);
  const FileTokenSource source = FileTokenSource::open_text(path, 256, 4);
  EXPECT_EQ(source.num_tokens(), static_cast<int64_t>(text.size()));
  std::vector<int32_t> sample(5);
  source.sample(0, 4, sample.data());
  EXPECT_EQ(sample, (std::vector<int32_t>{'h', 'e', 'l', 'l', 'o'}));
  source.sample(2, 4, sample.data());  // starts at byte 8 ("oe_rt")
  EXPECT_EQ(sample, (std::vector<int32_t>{'o', 'e', '_', 'r', 't'}));
  source.sample(8, 4, sample.data());  // 15 bytes, 11 starts: 32 mod 11 = byte 10, "_rt\xff\x80"
  EXPECT_EQ(sample[3], 255);
  EXPECT_EQ(sample[4], 128);
  EXPECT_NE(source.describe().find("text:" + path), std::string::npos);
}

TEST(TextSource, ErrorsNameTheFile) {
  TempDir dir;
  const std::string path = dir.file("corpus.txt");
  write_bytes(path, "0123456789");
  expect_data_error([&] { FileTokenSource::open_text(path, 255, 4); }, path, "--vocab >= 256");
  expect_data_error([&] { FileTokenSource::open_text(path, 256, 10); }, path, "shorter than one");
  const std::string absent = dir.file("absent.txt");
  expect_data_error([&] { FileTokenSource::open_text(absent, 256, 4); }, absent, "missing");
  const std::string empty = dir.file("empty.txt");
  write_bytes(empty, "");
  expect_data_error([&] { FileTokenSource::open_text(empty, 256, 4); }, empty, "empty");
}

TEST(DataSpec, FactoryOpensEachForm) {
  TempDir dir;
  const std::string shard = dir.file("a.bin");
  token_shard_write(shard, counting_tokens(200, 100));
  const std::string text = dir.file("a.txt");
  write_bytes(text, std::string(3000, 'z'));  // longer than a shard header

  const auto synthetic = token_source_open("synthetic", 64, 16, 7, {}, DataOrder::kSequential);
  EXPECT_NE(dynamic_cast<const SyntheticSource*>(synthetic.get()), nullptr);
  EXPECT_EQ(synthetic->num_tokens(), 0);
  const auto tokens = token_source_open("tokens:" + shard, 100, 16, 7, {}, DataOrder::kSequential);
  EXPECT_EQ(tokens->num_tokens(), 200);
  const auto bytes = token_source_open("text:" + text, 256, 16, 7, {}, DataOrder::kSequential);
  EXPECT_EQ(bytes->num_tokens(), 3000);
  expect_data_error(
      [&] { token_source_open("tokens:" + text, 256, 16, 7, {}, DataOrder::kSequential); }, text,
      "magic");
}

// synthetic:zipf=S: the chain with another Zipf exponent (1 is plain `synthetic`, bit for bit);
// anything but a finite number >= 0 is refused with the option named.
TEST(DataSpec, SyntheticZipfExponent) {
  std::vector<int32_t> plain(16), one(16), flat(16);
  token_source_open("synthetic", 256, 16, 7, {}, DataOrder::kSequential)
      ->sample(3, 16, plain.data());
  token_source_open("synthetic:zipf=1", 256, 16, 7, {}, DataOrder::kSequential)
      ->sample(3, 16, one.data());
  EXPECT_EQ(plain, one);
  const auto half = token_source_open("synthetic:zipf=0.5", 256, 16, 7, {}, DataOrder::kSequential);
  const auto* source = dynamic_cast<const SyntheticSource*>(half.get());
  ASSERT_NE(source, nullptr);
  EXPECT_NE(half->describe().find("Zipf(0.50)"), std::string::npos) << half->describe();
  const auto plain_source = token_source_open("synthetic", 256, 16, 7, {}, DataOrder::kSequential);
  EXPECT_GT(source->unigram_entropy_nats(),
            dynamic_cast<const SyntheticSource&>(*plain_source).unigram_entropy_nats());
  half->sample(3, 16, flat.data());
  EXPECT_NE(flat, plain);
  EXPECT_NO_THROW(token_source_check_spec("synthetic:zipf=0"));
  EXPECT_NO_THROW(token_source_check_spec("synthetic:zipf=16"));
  for (const std::string spec :
       {"synthetic:zipf=", "synthetic:zipf=-1", "synthetic:zipf=abc", "synthetic:zipf=nan",
        "synthetic:zipf=inf", "synthetic:zipf=1x", "synthetic:zipf= 1", "synthetic:s=1",
        "synthetic:zipf=16.5", "synthetic:zipf=1e300"}) {
    for (const char* option : {"--data", "--val-data"}) {
      try {
        token_source_check_spec(spec, option);
        ADD_FAILURE() << "no error for " << option << " '" << spec << "'";
      } catch (const DataSpecError& e) {
        EXPECT_NE(std::string(e.what()).find(option), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("synthetic:zipf=S"), std::string::npos) << e.what();
      }
    }
  }
}

TEST(DataSpec, UnknownFormNamesOptionAndValidForms) {
  for (const std::string spec : {"", "synth", "Synthetic", "bin:x.bin", "tokens:", "text:"}) {
    EXPECT_THROW(token_source_check_spec(spec), DataSpecError) << spec;
    try {
      token_source_open(spec, 256, 16, 1, {}, DataOrder::kSequential);
      ADD_FAILURE() << "no error for --data '" << spec << "'";
    } catch (const std::invalid_argument& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find("--data"), std::string::npos) << message;
      EXPECT_NE(message.find("synthetic, synthetic:zipf=S, tokens:PATH, text:PATH"),
                std::string::npos)
          << message;
    }
  }
  EXPECT_NO_THROW(token_source_check_spec("synthetic"));
  EXPECT_NO_THROW(token_source_check_spec("tokens:/no/such/file.bin"));  // form only
}

// The content checksum is the same however many parts hash it (a resume may change the rank
// count), and changes with any byte, the last included.
TEST(TokenShard, ChecksumOfTheContentsDoesNotDependOnTheParts) {
  TempDir dir;
  const std::string path = dir.file("train.bin");
  std::vector<uint16_t> tokens = counting_tokens(1'700'000, 500);  // about 3.2 blocks
  token_shard_write(path, tokens);
  const uint64_t whole = FileTokenSource::open_shard(path, 512, 16).checksum_part({0, 1});
  EXPECT_NE(whole, 0u);
  for (int parts : {2, 3, 4, 7}) {
    const FileTokenSource source = FileTokenSource::open_shard(path, 512, 16);
    uint64_t sum = 0;
    for (int p = 0; p < parts; ++p) sum += source.checksum_part({p, parts});
    EXPECT_EQ(sum, whole) << parts << " parts";
  }
  EXPECT_EQ(data_checksum_text(whole).size(), 16u);
  EXPECT_EQ(data_checksum_text(0), "");
  // One token changed, in the first block or in the last: another checksum. Two blocks swapped
  // (the same hashes, other places): another checksum too.
  for (size_t at : {size_t{3}, tokens.size() - 1}) {
    std::vector<uint16_t> changed = tokens;
    changed[at] ^= 1;
    token_shard_write(path, changed);
    EXPECT_NE(FileTokenSource::open_shard(path, 512, 16).checksum_part({0, 1}), whole) << at;
  }
  std::vector<uint16_t> swapped = tokens;
  const size_t block = kChecksumBlockBytes / 2;  // tokens per block
  std::swap_ranges(swapped.begin() + block - 512, swapped.begin() + 2 * block - 512,
                   swapped.begin() + 2 * block - 512);
  token_shard_write(path, swapped);
  EXPECT_NE(FileTokenSource::open_shard(path, 512, 16).checksum_part({0, 1}), whole);
  // Generated data has no file to check.
  EXPECT_EQ(SyntheticSource(64, 16, 1).checksum_part({0, 1}), 0u);
}

}  // namespace
}  // namespace moe

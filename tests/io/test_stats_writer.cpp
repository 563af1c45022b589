// Tests of the HDF5 statistics file (docs/hdf5-schema.md), read back with the HDF5 C API:
// every dataset's dtype, shape and values, the root attributes, byte-identical files for identical
// inputs, compaction at close, output-path errors and default names. Crash safety and the SWMR
// reader are in test_stats_swmr.cpp; the fixtures and readers in stats_test_util.hpp.
// Legend: N rows, L layers, E experts, K top-k, V vocabulary, W ranks, T traced tokens.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "io/stats_path.hpp"
#include "io/stats_writer.hpp"
#include "stats_test_util.hpp"
#include "test_tempdir.hpp"

namespace moe {
namespace {

namespace fs = std::filesystem;
using namespace stats_test;
using testing_util::TempDir;

// ---- the file's content ------------------------------------------------------------------------

TEST(StatsWriter, RoundTripsEveryDatasetAndAttribute) {
  TempDir dir;
  const std::string path = dir.file("run.h5");
  const StatsHeader h = test_header();
  {
    StatsWriter w(path, false, h);
    w.publish();
    write_rows(w, 0, 3);
    w.append_trace(TraceData(0).row());
    w.append_trace(TraceData(2).row());
    EXPECT_EQ(w.num_rows(), 3);
    EXPECT_EQ(w.num_trace_rows(), 2);
  }
  const H5Id file = open_file(path, false);  // closed cleanly: plain read-only works
  const hid_t f = file.get();
  EXPECT_EQ(read_string_attr(f, "format"), "moe_rt.stats");
  EXPECT_EQ(read_attr<int32_t>(f, "format_version"), 2);
  const std::pair<const char*, std::string> texts[] = {{"program_version", h.program_version},
                                                       {"model", h.model},
                                                       {"config", h.config_text},
                                                       {"created", h.created},
                                                       {"data", h.data_description}};
  for (const auto& [name, value] : texts) EXPECT_EQ(read_string_attr(f, name), value) << name;
  EXPECT_EQ(read_attr<uint64_t>(f, "seed"), h.seed);
  EXPECT_TRUE(std::isnan(read_attr<double>(f, "entropy_floor")));
  const std::pair<const char*, int> ints[] = {
      {"world_size", kW},   {"ep_size", 2},  {"num_layers", kL},
      {"num_experts", kE},  {"top_k", kK},   {"vocab", kV},
      {"hash_layers", kLh}, {"seq_len", 16}, {"batch_per_rank", 1}};
  for (const auto& [name, value] : ints) EXPECT_EQ(read_attr<int32_t>(f, name), value) << name;
  // No host map in the header: every rank on host 0.
  EXPECT_EQ(read_attr<int32_t>(f, "num_hosts"), 1);
  EXPECT_EQ(read_rows<int32_t>(f, "/hosts/rank_host", kW, {}, true), std::vector<int32_t>(kW, 0));
  EXPECT_EQ(read_strings(f, "/layers/routing"), h.layer_routing);
  EXPECT_EQ(read_strings(f, "/perf/phases"), h.phase_names);
  EXPECT_EQ(read_rows<int32_t>(f, "/layers/hash_table", kLh, {kV, kK}, true), h.hash_tables);
  expect_step_rows(f, 3, /*exact=*/true);

  // The trace of steps 0 and 2.
  expect_trace_rows(f, {0, 2}, /*exact=*/true);
}

TEST(StatsWriter, WithoutTracingOrHashLayersHasNoTraceGroupAndAnEmptyHashTable) {
  TempDir dir;
  const std::string path = dir.file("run.h5");
  {
    StatsWriter w(path, false, test_header(0, 0));
    w.publish();
    write_rows(w, 0, 2);
    EXPECT_THROW(w.append_trace(TraceData(0).row()), std::invalid_argument);
  }
  const H5Id file = open_file(path);
  EXPECT_EQ(H5Lexists(file.get(), "/trace", H5P_DEFAULT), 0);
  EXPECT_TRUE(read_rows<int32_t>(file.get(), "/layers/hash_table", 0, {kV, kK}, true).empty());
  expect_step_rows(file.get(), 2, true);
}

TEST(StatsWriter, ValidationRowsRoundTripUnderEvalAndAreRefusedWithoutIt) {
  TempDir dir;
  const std::string path = dir.file("run.h5");
  StatsHeader h = test_header(0, 0);
  h.eval = true;
  h.val_data_description = "tokens:val.bin (llm.c shard, 4096 uint16 tokens)";
  // Row q: after step 5q + 4, values distinct per row.
  auto row_data = [](int64_t q) {
    std::vector<int64_t> load, dropped;
    std::vector<double> variance, violation;
    for (int i = 0; i < kL * kE; ++i) load.push_back(q * 1000 + i), dropped.push_back(q * 10 + i);
    for (int l = 0; l < kL; ++l) variance.push_back(q + 0.5 * l), violation.push_back(q - 0.25 * l);
    return std::tuple{load, variance, violation, dropped};
  };
  {
    StatsWriter w(path, false, h);
    w.publish();
    write_rows(w, 0, 2);
    for (int64_t q = 0; q < 2; ++q) {
      const auto [load, variance, violation, dropped] = row_data(q);
      w.append_eval(EvalRow{5 * q + 4, 3.0 - q, 0.125 * (q + 1), 96 * (q + 1), load, variance,
                            violation, dropped});
    }
    const auto [load, variance, violation, dropped] = row_data(2);
    EvalRow bad{14,       1.0,       0.1,    96, std::span<const int64_t>(load).first(kE),
                variance, violation, dropped};
    EXPECT_THROW(w.append_eval(bad), std::invalid_argument);
    bad.expert_load = load;
    bad.dropped = std::span<const int64_t>(dropped).first(kE);
    EXPECT_THROW(w.append_eval(bad), std::invalid_argument);
    EXPECT_EQ(w.num_eval_rows(), 2);
  }
  const H5Id file = open_file(path, false);
  const hid_t f = file.get();
  EXPECT_EQ(read_string_attr(f, "val_data"), h.val_data_description);
  EXPECT_EQ(read_rows<int64_t>(f, "/eval/step", 2, {}, true), (std::vector<int64_t>{4, 9}));
  EXPECT_EQ(read_rows<double>(f, "/eval/loss", 2, {}, true), (std::vector<double>{3.0, 2.0}));
  EXPECT_EQ(read_rows<double>(f, "/eval/time_s", 2, {}, true), (std::vector<double>{0.125, 0.25}));
  EXPECT_EQ(read_rows<int64_t>(f, "/eval/tokens", 2, {}, true), (std::vector<int64_t>{96, 192}));
  std::vector<int64_t> load, dropped;
  std::vector<double> variance, violation;
  for (int64_t q = 0; q < 2; ++q) {
    const auto [l, v, m, d] = row_data(q);
    load = concat<int64_t>(load, l);
    dropped = concat<int64_t>(dropped, d);
    variance = concat<double>(variance, v);
    violation = concat<double>(violation, m);
  }
  EXPECT_EQ(read_rows<int64_t>(f, "/eval/expert_load", 2, {kL, kE}, true), load);
  EXPECT_EQ(read_rows<double>(f, "/eval/load_variance", 2, {kL}, true), variance);
  EXPECT_EQ(read_rows<double>(f, "/eval/max_violation", 2, {kL}, true), violation);
  EXPECT_EQ(read_rows<int64_t>(f, "/eval/dropped", 2, {kL, kE}, true), dropped);

  // Without eval in the header: no /eval group, no val_data, and append_eval refused.
  const std::string plain = dir.file("plain.h5");
  StatsWriter w(plain, false, test_header(0, 0));
  w.publish();
  const auto [l, v, m, d] = row_data(0);
  EXPECT_THROW(w.append_eval(EvalRow{0, 1.0, 0.1, 96, l, v, m, d}), std::invalid_argument);
  w.close();
  const H5Id plain_file = open_file(plain, false);
  EXPECT_EQ(H5Lexists(plain_file.get(), "/eval", H5P_DEFAULT), 0);
  EXPECT_EQ(H5Aexists(plain_file.get(), "val_data"), 0);
}

TEST(StatsWriter, WritesTheHostOfEachRank) {
  TempDir dir;
  const std::string path = dir.file("run.h5");
  StatsHeader h = test_header(0);
  h.rank_host = {0, 1};
  {
    StatsWriter w(path, false, h);
    w.publish();
    write_rows(w, 0, 1);
  }
  const H5Id file = open_file(path, false);
  EXPECT_EQ(read_attr<int32_t>(file.get(), "num_hosts"), 2);
  EXPECT_EQ(read_rows<int32_t>(file.get(), "/hosts/rank_host", kW, {}, true),
            (std::vector<int32_t>{0, 1}));
  for (const std::vector<int32_t>& bad : {std::vector<int32_t>{0}, {0, 2}, {-1, 0}}) {
    h.rank_host = bad;
    EXPECT_THROW(StatsWriter(dir.file("bad.h5"), false, h), std::invalid_argument);
  }
}

TEST(StatsWriter, RejectsWrongRowSizesBeforeWritingAnything) {
  TempDir dir;
  StatsWriter w(dir.file("run.h5"), false, test_header());
  w.publish();
  write_rows(w, 0, 1);
  const RowData d(1);
  StepRow bad = d.row();
  bad.expert_load = bad.expert_load.first(kE);
  try {
    w.append(bad);
    FAIL() << "a short expert_load was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("expert_load has 4 values, expected L*E = 12"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(w.num_rows(), 1);
  w.append(d.row());  // the writer is still usable
  EXPECT_EQ(w.num_rows(), 2);
}

TEST(StatsWriter, RejectsAnInconsistentHeader) {
  TempDir dir;
  StatsHeader h = test_header();
  h.layer_routing[1] = "sinkhorn";
  EXPECT_THROW(StatsWriter(dir.file("a.h5"), false, h), std::invalid_argument);
  h = test_header();
  h.hash_tables.pop_back();
  EXPECT_THROW(StatsWriter(dir.file("b.h5"), false, h), std::invalid_argument);
  EXPECT_FALSE(fs::exists(dir.file("a.h5")) || fs::exists(dir.file("b.h5")));  // nothing created
}

std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// No hidden timestamps: identical inputs (including `created`) give identical bytes.
TEST(StatsWriter, IdenticalInputsGiveByteIdenticalFiles) {
  TempDir dir;
  for (const char* name : {"a.h5", "b.h5"}) {
    StatsWriter w(dir.file(name), false, test_header());
    w.publish();
    write_rows(w, 0, 40);
    w.append_trace(TraceData(0).row());
  }
  const std::string a = file_bytes(dir.file("a.h5")), b = file_bytes(dir.file("b.h5"));
  EXPECT_GT(a.size(), 0u);
  EXPECT_TRUE(a == b) << "files differ (" << a.size() << " and " << b.size() << " bytes)";
  // Both were written within a second: also check that no object records a time at all.
  const H5Id file = open_file(dir.file("a.h5"));
  for (const char* name : {"/", "/steps", "/steps/loss", "/layers/routing", "/trace/experts"}) {
    H5O_info_t info{};
    MOE_H5_CHECK(H5Oget_info_by_name2(file.get(), name, &info, H5O_INFO_TIME, H5P_DEFAULT));
    EXPECT_EQ(info.mtime, 0) << name;
    EXPECT_EQ(info.btime, 0) << name;
  }
}

// The live file stores its chunks unfiltered; close() copies the file with them compressed. Same
// content, less space, and no temporary left over.
TEST(StatsWriter, CloseCompactsTheFile) {
  TempDir dir;
  for (bool compact : {true, false}) {
    StatsStorage storage;
    storage.compact_on_close = compact;
    StatsWriter w(dir.file(compact ? "a.h5" : "b.h5"), false, test_header(), storage);
    w.publish();
    write_rows(w, 0, 300);
  }
  EXPECT_LT(fs::file_size(dir.file("a.h5")), fs::file_size(dir.file("b.h5")));
  EXPECT_FALSE(fs::exists(dir.file("a.h5.compact")));
  for (const char* name : {"a.h5", "b.h5"})
    expect_step_rows(open_file(dir.file(name)).get(), 300, true);
  // Compacted: shuffle + deflate on the same chunks, the same fill value; uncompacted: the live
  // file's unfiltered chunks.
  for (const char* name : {"a.h5", "b.h5"}) {
    const H5Id file = open_file(dir.file(name));
    for (const char* column : {"/steps/step", "/routing/expert_load", "/trace/experts"}) {
      H5Id dset(MOE_H5_CHECK(H5Dopen2(file.get(), column, H5P_DEFAULT)), H5Dclose);
      H5Id dcpl(MOE_H5_CHECK(H5Dget_create_plist(dset.get())), H5Pclose);
      const bool compacted = std::string(name) == "a.h5";
      ASSERT_EQ(H5Pget_nfilters(dcpl.get()), compacted ? 2 : 0) << name << column;
      if (compacted) {
        unsigned flags = 0, level = 0;
        size_t count = 1;
        EXPECT_EQ(H5Pget_filter2(dcpl.get(), 0, &flags, nullptr, nullptr, 0, nullptr, nullptr),
                  H5Z_FILTER_SHUFFLE);
        EXPECT_EQ(H5Pget_filter2(dcpl.get(), 1, &flags, &count, &level, 0, nullptr, nullptr),
                  H5Z_FILTER_DEFLATE);
        EXPECT_EQ(level, 4u) << column;
      }
      hsize_t chunk[4] = {0};
      const std::string c = column;
      EXPECT_EQ(H5Pget_chunk(dcpl.get(), 4, chunk), c == "/steps/step"      ? 1
                                                    : c == "/trace/experts" ? 4
                                                                            : 3);
      EXPECT_EQ(chunk[0], std::string(column) == "/steps/step" ? 1024u : 256u) << column;
      if (std::string(column) == "/steps/step") {
        int64_t fill = 0;
        MOE_H5_CHECK(H5Pget_fill_value(dcpl.get(), H5T_NATIVE_INT64, &fill));
        EXPECT_EQ(fill, -1) << name;
      }
    }
  }
}

// h5_copy_file with filters on a file with what moe_rt's statistics file lacks: links created out
// of name order in a group that indexes their creation order, a soft link, an external link, two
// hard links to one dataset, and chunked datasets of numbers (one with a fill value), of compound
// values and of strings. Only the numbers get the filters; the rest is as H5Ocopy leaves it.
TEST(H5CopyFile, FiltersNumbersAndKeepsLinksAndOrder) {
  TempDir dir;
  const std::string src = dir.file("src.h5"), dst = dir.file("dst.h5");
  const std::vector<int32_t> numbers = {5, 6, 7, 8, 9};
  {
    H5Id f(MOE_H5_CHECK(H5Fcreate(src.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT)), H5Fclose);
    H5Id gcpl(MOE_H5_CHECK(H5Pcreate(H5P_GROUP_CREATE)), H5Pclose);
    MOE_H5_CHECK(
        H5Pset_link_creation_order(gcpl.get(), H5P_CRT_ORDER_TRACKED | H5P_CRT_ORDER_INDEXED));
    H5Id g(MOE_H5_CHECK(H5Gcreate2(f.get(), "/g", H5P_DEFAULT, gcpl.get(), H5P_DEFAULT)), H5Gclose);
    const hsize_t dims = numbers.size(), max_dims = H5S_UNLIMITED, chunk = 2;
    H5Id space(MOE_H5_CHECK(H5Screate_simple(1, &dims, &max_dims)), H5Sclose);
    H5Id dcpl(MOE_H5_CHECK(H5Pcreate(H5P_DATASET_CREATE)), H5Pclose);
    MOE_H5_CHECK(H5Pset_chunk(dcpl.get(), 1, &chunk));
    const int32_t fill = -3;
    MOE_H5_CHECK(H5Pset_fill_value(dcpl.get(), H5T_NATIVE_INT32, &fill));
    for (const char* name : {"zeta", "alpha"}) {  // created in this order
      H5Id d(MOE_H5_CHECK(H5Dcreate2(g.get(), name, H5T_STD_I32LE, space.get(), H5P_DEFAULT,
                                     dcpl.get(), H5P_DEFAULT)),
             H5Dclose);
      MOE_H5_CHECK(
          H5Dwrite(d.get(), H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, numbers.data()));
    }
    MOE_H5_CHECK(H5Lcreate_hard(g.get(), "zeta", g.get(), "again", H5P_DEFAULT, H5P_DEFAULT));
    MOE_H5_CHECK(H5Lcreate_soft("/g/alpha", g.get(), "soft", H5P_DEFAULT, H5P_DEFAULT));
    MOE_H5_CHECK(
        H5Lcreate_external("other.h5", "/x", g.get(), "external", H5P_DEFAULT, H5P_DEFAULT));
    H5Id pair(MOE_H5_CHECK(H5Tcreate(H5T_COMPOUND, 8)), H5Tclose);
    MOE_H5_CHECK(H5Tinsert(pair.get(), "a", 0, H5T_NATIVE_INT32));
    MOE_H5_CHECK(H5Tinsert(pair.get(), "b", 4, H5T_NATIVE_INT32));
    H5Id plain(MOE_H5_CHECK(H5Pcreate(H5P_DATASET_CREATE)), H5Pclose);
    MOE_H5_CHECK(H5Pset_chunk(plain.get(), 1, &chunk));
    H5Id c(MOE_H5_CHECK(H5Dcreate2(f.get(), "/pairs", pair.get(), space.get(), H5P_DEFAULT,
                                   plain.get(), H5P_DEFAULT)),
           H5Dclose);
    const std::vector<int32_t> pairs = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
    MOE_H5_CHECK(H5Dwrite(c.get(), pair.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, pairs.data()));
    H5Id text(MOE_H5_CHECK(H5Tcopy(H5T_C_S1)), H5Tclose);
    MOE_H5_CHECK(H5Tset_size(text.get(), H5T_VARIABLE));
    MOE_H5_CHECK(H5Tset_cset(text.get(), H5T_CSET_UTF8));
    H5Id t(MOE_H5_CHECK(H5Dcreate2(f.get(), "/text", text.get(), space.get(), H5P_DEFAULT,
                                   plain.get(), H5P_DEFAULT)),
           H5Dclose);
    const char* words[] = {"a", "bb", "ccc", "dddd", "eeeee"};
    MOE_H5_CHECK(H5Dwrite(t.get(), text.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, words));
  }
  h5_copy_file(src, dst, H5P_DEFAULT, H5P_DEFAULT, {true, 4});
  const H5Id f = open_file(dst, false);
  auto filters = [&](const char* name) {
    H5Id d(MOE_H5_CHECK(H5Dopen2(f.get(), name, H5P_DEFAULT)), H5Dclose);
    H5Id dcpl(MOE_H5_CHECK(H5Dget_create_plist(d.get())), H5Pclose);
    return H5Pget_nfilters(dcpl.get());
  };
  EXPECT_EQ(filters("/g/zeta"), 2);
  EXPECT_EQ(filters("/pairs"), 0);
  EXPECT_EQ(filters("/text"), 0);
  EXPECT_EQ(read_rows<int32_t>(f.get(), "/g/alpha", 5, {}, true), numbers);
  {
    H5Id d(MOE_H5_CHECK(H5Dopen2(f.get(), "/g/zeta", H5P_DEFAULT)), H5Dclose);
    H5Id dcpl(MOE_H5_CHECK(H5Dget_create_plist(d.get())), H5Pclose);
    int32_t fill = 0;
    MOE_H5_CHECK(H5Pget_fill_value(dcpl.get(), H5T_NATIVE_INT32, &fill));
    EXPECT_EQ(fill, -3);
  }
  EXPECT_EQ(read_strings(f.get(), "/text"),
            (std::vector<std::string>{"a", "bb", "ccc", "dddd", "eeeee"}));
  std::vector<std::string> order;
  H5Id g(MOE_H5_CHECK(H5Gopen2(f.get(), "/g", H5P_DEFAULT)), H5Gclose);
  for (hsize_t i = 0; i < 5; ++i) {
    char name[32] = {0};
    MOE_H5_CHECK(H5Lget_name_by_idx(g.get(), ".", H5_INDEX_CRT_ORDER, H5_ITER_INC, i, name,
                                    sizeof name, H5P_DEFAULT));
    order.push_back(name);
  }
  EXPECT_EQ(order, (std::vector<std::string>{"zeta", "alpha", "again", "soft", "external"}));
  H5L_info_t soft{}, external{};
  MOE_H5_CHECK(H5Lget_info(g.get(), "soft", &soft, H5P_DEFAULT));
  MOE_H5_CHECK(H5Lget_info(g.get(), "external", &external, H5P_DEFAULT));
  EXPECT_EQ(soft.type, H5L_TYPE_SOFT);
  EXPECT_EQ(external.type, H5L_TYPE_EXTERNAL);
  H5O_info_t zeta{}, again{};
  MOE_H5_CHECK(H5Oget_info_by_name2(g.get(), "zeta", &zeta, H5O_INFO_BASIC, H5P_DEFAULT));
  MOE_H5_CHECK(H5Oget_info_by_name2(g.get(), "again", &again, H5O_INFO_BASIC, H5P_DEFAULT));
  EXPECT_EQ(zeta.addr, again.addr);
  EXPECT_EQ(zeta.rc, 2u);
}

// The message is one short line: the function, what failed, the system's error and the source
// line without its folders; HDF5's whole stack (hundreds to thousands of characters, source paths
// and major/minor classes of every layer) only with MOE_RT_HDF5_STACK, on stderr.
TEST(StatsWriter, Hdf5ErrorIsOneShortLineWithTheCause) {
  h5_silence_auto_print();
  ::unsetenv("MOE_RT_HDF5_STACK");
  testing::internal::CaptureStderr();
  try {
    MOE_H5_CHECK(H5Fopen("/nonexistent/moe.h5", H5F_ACC_RDONLY, H5P_DEFAULT));
    ADD_FAILURE() << "opening a missing file succeeded";
  } catch (const Hdf5Error& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.rfind("HDF5 H5Fopen (test_stats_writer.cpp:", 0), 0u) << what;
    EXPECT_NE(what.find("unable to open file: No such file or directory (errno 2)"),
              std::string::npos)
        << what;
    EXPECT_LT(what.size(), 200u) << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
    EXPECT_EQ(what.find("major"), std::string::npos) << what;
  }
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "");
}

TEST(StatsWriter, Hdf5StackOnStderrWithTheVariable) {
  h5_silence_auto_print();
  ::setenv("MOE_RT_HDF5_STACK", "1", 1);
  testing::internal::CaptureStderr();
  std::string what;
  try {
    MOE_H5_CHECK(H5Fopen("/nonexistent/moe.h5", H5F_ACC_RDONLY, H5P_DEFAULT));
  } catch (const Hdf5Error& e) {
    what = e.what();
  }
  const std::string stack = testing::internal::GetCapturedStderr();
  ::unsetenv("MOE_RT_HDF5_STACK");
  EXPECT_LT(what.size(), 200u) << what;  // the line stays short
  EXPECT_NE(stack.find("HDF5 error stack of H5Fopen (test_stats_writer.cpp:"), std::string::npos)
      << stack;
  EXPECT_NE(stack.find("#000"), std::string::npos) << stack;
  EXPECT_NE(stack.find("H5Fopen(): unable to open file"), std::string::npos) << stack;
  EXPECT_NE(stack.find("'/nonexistent/moe.h5'"), std::string::npos) << stack;
}

// If h5dump (hdf5-tools) is installed, it reads the header of a written file.
TEST(StatsWriter, H5dumpReadsTheFile) {
  if (std::system("command -v h5dump >/dev/null 2>&1") != 0) GTEST_SKIP() << "h5dump not on PATH";
  TempDir dir;
  const std::string path = dir.file("run.h5");
  {
    StatsWriter w(path, false, test_header());
    w.publish();
    write_rows(w, 0, 2);
  }
  const std::string out = dir.file("dump.txt");
  ASSERT_EQ(std::system(("h5dump -H " + path + " > " + out + " 2>&1").c_str()), 0)
      << file_bytes(out);
  EXPECT_NE(file_bytes(out).find("DATASET \"expert_load\""), std::string::npos);
}

// ---- output paths ------------------------------------------------------------------------------

// The StatsPathError message of check_path(path, overwrite); "" if it passes.
std::string path_problem(const std::string& path, bool overwrite) {
  try {
    StatsWriter::check_path(path, overwrite);
  } catch (const StatsPathError& e) {
    return e.what();
  }
  return "";
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(StatsPath, MissingDirectoryIsNamed) {
  TempDir dir;
  const std::string path = dir.file("no/such/run.h5");
  const std::string msg = path_problem(path, false);
  EXPECT_TRUE(contains(msg, path) && contains(msg, "does not exist")) << msg;
  EXPECT_FALSE(fs::exists(dir.file("no")));
}

TEST(StatsPath, ParentThatIsAFileIsNamed) {
  TempDir dir;
  std::ofstream(dir.file("plain")) << "x";
  const std::string msg = path_problem(dir.file("plain/run.h5"), false);
  EXPECT_TRUE(contains(msg, "is not a directory")) << msg;
}

TEST(StatsPath, PathThatIsADirectoryIsNamed) {
  TempDir dir;
  fs::create_directory(dir.file("sub"));
  const std::string msg = path_problem(dir.file("sub"), true);
  EXPECT_TRUE(contains(msg, dir.file("sub")) && contains(msg, "is a directory")) << msg;
}

TEST(StatsPath, DanglingLinkIsNamed) {
  TempDir dir;
  const std::string path = dir.file("run.h5");
  fs::create_symlink(dir.file("elsewhere.h5"), path);
  const std::string msg = path_problem(path, false);
  EXPECT_TRUE(contains(msg, path) && contains(msg, "which does not exist")) << msg;
}

TEST(StatsPath, UnwritableDirectoryIsNamed) {
  TempDir dir;
  const std::string sub = dir.file("ro");
  fs::create_directory(sub);
  fs::permissions(sub, fs::perms::owner_read | fs::perms::owner_exec);
  if (::access(sub.c_str(), W_OK) == 0) {
    GTEST_SKIP() << "running with privileges (root?) that ignore directory permissions: a "
                    "read-only directory is still writable, so this case cannot be checked";
  }
  const std::string msg = path_problem(sub + "/run.h5", false);
  EXPECT_TRUE(contains(msg, "is not writable")) << msg;
}

TEST(StatsPath, ExistingFileNeedsOverwrite) {
  TempDir dir;
  const std::string path = dir.file("run.h5");
  {
    StatsWriter w(path, false, test_header());
    w.publish();
  }
  const std::string msg = path_problem(path, false);
  EXPECT_TRUE(contains(msg, path) && contains(msg, "already exists") &&
              contains(msg, "--overwrite"))
      << msg;
  EXPECT_THROW(StatsWriter(path, false, test_header()), StatsPathError);
  EXPECT_EQ(path_problem(path, true), "");
  {
    StatsWriter w(path, true, test_header(0));
    w.publish();
    write_rows(w, 0, 1);
  }
  const H5Id file = open_file(path);
  EXPECT_EQ(H5Lexists(file.get(), "/trace", H5P_DEFAULT), 0);  // the new file, not the old one
  expect_step_rows(file.get(), 1);
}

TEST(StatsPath, DefaultNamesAreDistinctWithinOneSecond) {
  TempDir dir;
  const std::string runs = dir.file("runs/nested");
  const std::string a = stats_default_path(runs, "deepseek4-tiny");
  const std::string b = stats_default_path(runs, "deepseek4-tiny");
  EXPECT_NE(a, b);
  for (const std::string& p : {a, b}) {
    EXPECT_EQ(fs::path(p).parent_path(), fs::path(runs));
    EXPECT_EQ(fs::path(p).filename().string().rfind("deepseek4-tiny-", 0), 0u) << p;
    EXPECT_EQ(fs::path(p).extension(), ".h5") << p;
    EXPECT_TRUE(fs::exists(p));  // reserved, empty
  }
  // A reserved (empty) name is accepted without --overwrite.
  StatsWriter w(a, false, test_header());
  w.publish();
  write_rows(w, 0, 1);
  const std::string iso = stats_now_iso8601();  // 2026-05-09T07:35:25+02:00
  EXPECT_EQ(iso.size(), 25u) << iso;
  EXPECT_EQ(iso[10], 'T');
  EXPECT_EQ(iso[22], ':');
}

// runs/latest.h5 follows the newest file: created, replaced (a dangling link too), a staging link
// a killed process of the same id left is cleared, and anything but a link is left alone.
TEST(StatsPath, LatestLinkFollowsTheNewestFile) {
  TempDir dir;
  const std::string runs = dir.file("runs");
  const std::string link = runs + "/latest.h5";
  const std::string a = stats_default_path(runs, "micro");
  EXPECT_EQ(stats_link_latest(a), "");
  EXPECT_EQ(fs::read_symlink(link), fs::path(a).filename());
  const std::string b = stats_default_path(runs, "micro");
  fs::remove(a);  // the link now dangles: still replaced
  char host[256] = {};
  ASSERT_EQ(::gethostname(host, sizeof host - 1), 0);
  fs::create_symlink("elsewhere", link + "." + host + "." + std::to_string(::getpid()));
  EXPECT_EQ(stats_link_latest(b), "");
  EXPECT_EQ(fs::read_symlink(link), fs::path(b).filename());
  EXPECT_EQ(std::distance(fs::directory_iterator(runs), fs::directory_iterator()), 2);
  fs::remove(link);
  fs::create_directory(link);
  const std::string problem = stats_link_latest(b);
  EXPECT_NE(problem.find("latest.h5' exists and is not a link"), std::string::npos) << problem;
  EXPECT_TRUE(fs::is_directory(link));
}

}  // namespace
}  // namespace moe

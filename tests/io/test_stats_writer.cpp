// Tests of the HDF5 statistics file (SPEC §6, docs/hdf5-schema.md), read back with the HDF5 C API:
// every dataset's dtype, shape and values, the root attributes, byte-identical files for identical
// inputs, compaction at close, output-path errors, default names, survival of SIGKILL, and a
// SWMR reader in a separate process.
// Legend: N rows, L layers, E experts, K top-k, V vocabulary, W ranks, T traced tokens.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "io/stats_writer.hpp"

namespace moe {
namespace {

namespace fs = std::filesystem;
constexpr int kL = 3, kLh = 1, kE = 4, kK = 2, kV = 5, kW = 2, kT = 4;

// A fresh directory under the system temp path, removed with everything in it at scope exit.
class TempDir {
 public:
  TempDir() {
    static std::atomic<int> counter{0};
    path_ = fs::temp_directory_path() /
            ("moe_stats_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++) +
             "_" + std::to_string(std::random_device{}()));
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  fs::path path_;
};

StatsHeader test_header(int trace_tokens = kT, int hash_layers = kLh) {
  StatsHeader h;
  h.model = "deepseek4-tiny";
  h.config_text = "model = deepseek4-tiny\nlayers = 3\n";
  h.program_version = "moe_rt 0.1.0";
  h.data_description = "synthetic: zipf";
  h.created = "2026-01-02T03:04:05+00:00";
  h.world_size = kW, h.ep_size = 2, h.num_layers = kL, h.num_experts = kE, h.top_k = kK;
  h.vocab = kV, h.hash_layers = hash_layers, h.seq_len = 16, h.batch_per_rank = 1;
  h.seed = 0xFEEDFACECAFEBEEFull;
  h.entropy_floor = std::nan("");
  h.layer_routing = {"hash", "topk", "topk"};
  if (hash_layers == 0) h.layer_routing[0] = "topk";
  for (int i = 0; i < hash_layers * kV * kK; ++i) h.hash_tables.push_back(i % kE);
  h.phase_names = {"attention", "router", "dispatch"};
  h.trace_tokens = trace_tokens;
  return h;
}

constexpr int kNumPhases = 3;

// The values of step `s`, each field distinct, and a StepRow viewing them.
struct RowData {
  int64_t s;
  std::vector<int64_t> expert_load, rank_load;  // [L, E], [L, W]
  std::vector<float> bias;                      // [L, E]
  std::vector<double> per_layer;                // [5, L]: variance, violation, cv, overload, loss
  std::vector<double> phase_times;              // [W, num_phases]
  explicit RowData(int64_t step) : s(step) {
    for (int i = 0; i < kL * kE; ++i) expert_load.push_back(s * 100 + i);
    for (int i = 0; i < kL * kW; ++i) rank_load.push_back(s * 10 + i + 7);
    for (int i = 0; i < kL * kE; ++i) bias.push_back(0.5f * s - 0.25f * i);
    for (int i = 0; i < 5 * kL; ++i) per_layer.push_back(s + 0.125 * i);
    for (int i = 0; i < kW * kNumPhases; ++i) phase_times.push_back(0.001 * (s + 1) * (i + 1));
  }
  std::span<const double> layer_field(int f) const {
    return std::span<const double>(per_layer).subspan(f * kL, kL);
  }
  StepRow row() const {
    return StepRow{s,
                   2.5 + s,
                   0.01 * s,
                   1.0 + s,
                   1e-3,
                   1000.0 * (s + 1),
                   0.25,
                   expert_load,
                   rank_load,
                   bias,
                   layer_field(0),
                   layer_field(1),
                   layer_field(2),
                   layer_field(3),
                   layer_field(4),
                   phase_times};
  }
};

// The traced routing of step `s`.
struct TraceData {
  int64_t s;
  std::vector<int32_t> token_id, position, rank, experts;  // [T], [T], [T], [L, T, K]
  std::vector<float> weights;                              // [L, T, K]
  explicit TraceData(int64_t step) : s(step) {
    for (int t = 0; t < kT; ++t) {
      token_id.push_back(static_cast<int32_t>(s + t));
      position.push_back(t);
      rank.push_back(t % kW);
    }
    for (int i = 0; i < kL * kT * kK; ++i) {
      experts.push_back((i + static_cast<int>(s)) % kE);
      weights.push_back(0.5f + 0.01f * i);
    }
  }
  TraceRow row() const { return TraceRow{s, token_id, position, rank, experts, weights}; }
};

// ---- reading back with the C API ----------------------------------------------------------------

// Opens read-only; with SWMR read, which also opens a file whose writer died (docs/hdf5-schema.md).
H5Id open_file(const std::string& path, bool swmr = true) {
  h5_silence_auto_print();
  const unsigned flags = H5F_ACC_RDONLY | (swmr ? H5F_ACC_SWMR_READ : 0u);
  return H5Id(MOE_H5_CHECK(H5Fopen(path.c_str(), flags, H5P_DEFAULT)), H5Fclose);
}

std::vector<hsize_t> dataset_dims(hid_t dset) {
  H5Id space(MOE_H5_CHECK(H5Dget_space(dset)), H5Sclose);
  std::vector<hsize_t> dims(MOE_H5_CHECK(H5Sget_simple_extent_ndims(space.get())));
  MOE_H5_CHECK(H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr));
  return dims;
}

// HDF5 types of a C++ value type: the native memory type and the little-endian file type.
template <typename T>
hid_t mem_type() {
  if constexpr (std::is_same_v<T, int32_t>) return H5T_NATIVE_INT32;
  if constexpr (std::is_same_v<T, int64_t>) return H5T_NATIVE_INT64;
  if constexpr (std::is_same_v<T, uint64_t>) return H5T_NATIVE_UINT64;
  if constexpr (std::is_same_v<T, float>) return H5T_NATIVE_FLOAT;
  return H5T_NATIVE_DOUBLE;
}
template <typename T>
hid_t file_type() {
  if constexpr (std::is_same_v<T, int32_t>) return H5T_STD_I32LE;
  if constexpr (std::is_same_v<T, int64_t>) return H5T_STD_I64LE;
  if constexpr (std::is_same_v<T, uint64_t>) return H5T_STD_U64LE;
  if constexpr (std::is_same_v<T, float>) return H5T_IEEE_F32LE;
  return H5T_IEEE_F64LE;
}

std::vector<std::string> read_strings(hid_t file, const std::string& name) {
  H5Id dset(MOE_H5_CHECK(H5Dopen2(file, name.c_str(), H5P_DEFAULT)), H5Dclose);
  H5Id type(MOE_H5_CHECK(H5Dget_type(dset.get())), H5Tclose);
  EXPECT_GT(H5Tis_variable_str(type.get()), 0) << name;
  EXPECT_EQ(H5Tget_cset(type.get()), H5T_CSET_UTF8) << name;
  const std::vector<hsize_t> dims = dataset_dims(dset.get());
  std::vector<char*> raw(dims.at(0));
  MOE_H5_CHECK(H5Dread(dset.get(), type.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, raw.data()));
  std::vector<std::string> out(raw.begin(), raw.end());
  H5Id space(MOE_H5_CHECK(H5Dget_space(dset.get())), H5Sclose);
  MOE_H5_CHECK(H5Dvlen_reclaim(type.get(), space.get(), H5P_DEFAULT, raw.data()));
  return out;
}

template <typename T>
T read_attr(hid_t file, const char* name) {
  H5Id attr(MOE_H5_CHECK(H5Aopen(file, name, H5P_DEFAULT)), H5Aclose);
  H5Id type(MOE_H5_CHECK(H5Aget_type(attr.get())), H5Tclose);
  EXPECT_GT(H5Tequal(type.get(), file_type<T>()), 0) << "attribute " << name << ": wrong dtype";
  T value{};
  MOE_H5_CHECK(H5Aread(attr.get(), mem_type<T>(), &value));
  return value;
}

std::string read_string_attr(hid_t file, const char* name) {
  H5Id attr(MOE_H5_CHECK(H5Aopen(file, name, H5P_DEFAULT)), H5Aclose);
  H5Id type(MOE_H5_CHECK(H5Aget_type(attr.get())), H5Tclose);
  EXPECT_GT(H5Tis_variable_str(type.get()), 0) << "attribute " << name;
  char* text = nullptr;
  MOE_H5_CHECK(H5Aread(attr.get(), type.get(), &text));
  std::string value(text);
  H5free_memory(text);
  return value;
}

// First `n` rows of dataset `name` after checking its dtype and row shape `row_dims`; the file
// must hold at least n rows, or exactly n if `exact`.
template <typename T>
std::vector<T> read_rows(hid_t file, const std::string& name, size_t n,
                         std::vector<hsize_t> row_dims, bool exact) {
  H5Id dset(MOE_H5_CHECK(H5Dopen2(file, name.c_str(), H5P_DEFAULT)), H5Dclose);
  H5Id type(MOE_H5_CHECK(H5Dget_type(dset.get())), H5Tclose);
  EXPECT_GT(H5Tequal(type.get(), file_type<T>()), 0) << name << ": wrong dtype";
  std::vector<hsize_t> count = dataset_dims(dset.get());
  EXPECT_EQ(std::vector<hsize_t>(count.begin() + 1, count.end()), row_dims) << name;
  if (count[0] < n || (exact && count[0] != n)) {
    ADD_FAILURE() << name << " has " << count[0] << " rows, expected " << n;
    return {};
  }
  hsize_t num_values = n;
  for (hsize_t d : row_dims) num_values *= d;
  std::vector<T> values(num_values);
  if (num_values == 0) return values;
  count[0] = n;
  const std::vector<hsize_t> start(count.size(), 0);
  H5Id file_space(MOE_H5_CHECK(H5Dget_space(dset.get())), H5Sclose);
  MOE_H5_CHECK(H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, start.data(), nullptr,
                                   count.data(), nullptr));
  H5Id mem_space(MOE_H5_CHECK(H5Screate_simple(1, &num_values, nullptr)), H5Sclose);
  MOE_H5_CHECK(H5Dread(dset.get(), mem_type<T>(), mem_space.get(), file_space.get(), H5P_DEFAULT,
                       values.data()));
  return values;
}

template <typename T>
std::vector<T> concat(std::vector<T> a, std::span<const T> b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// Checks dataset `name` against get(RowData(s).row()) for s in [0, n), see read_rows.
template <typename T, typename Get>
void expect_column(hid_t f, const std::string& name, size_t n, std::vector<hsize_t> row_dims,
                   bool exact, Get get) {
  std::vector<T> want;
  for (size_t s = 0; s < n; ++s) {
    const RowData d(static_cast<int64_t>(s));
    const StepRow r = d.row();
    const std::span<const T> values = get(r);
    want.insert(want.end(), values.begin(), values.end());
  }
  EXPECT_EQ(read_rows<T>(f, name, n, row_dims, exact), want) << name;
}

// Checks dtype, shape and rows [0, n) of every /steps, /routing and /perf dataset against
// RowData(0..n-1); with `exact`, also that each holds exactly n rows.
void expect_step_rows(hid_t f, size_t n, bool exact = false) {
  using R = const StepRow&;
  expect_column<int64_t>(f, "/steps/step", n, {}, exact, [](R r) { return std::span(&r.step, 1); });
  const std::pair<const char*, double StepRow::*> scalars[] = {
      {"loss", &StepRow::loss},
      {"balance_loss", &StepRow::balance_loss},
      {"grad_norm", &StepRow::grad_norm},
      {"lr", &StepRow::lr},
      {"tokens_per_s", &StepRow::tokens_per_s},
      {"step_time_s", &StepRow::step_time_s}};
  for (const auto& [name, field] : scalars) {
    expect_column<double>(f, std::string("/steps/") + name, n, {}, exact,
                          [field](R r) { return std::span(&(r.*field), 1); });
  }
  expect_column<int64_t>(f, "/routing/expert_load", n, {kL, kE}, exact,
                         [](R r) { return r.expert_load; });
  expect_column<int64_t>(f, "/routing/rank_load", n, {kL, kW}, exact,
                         [](R r) { return r.rank_load; });
  expect_column<float>(f, "/routing/bias", n, {kL, kE}, exact, [](R r) { return r.bias; });
  const std::pair<const char*, std::span<const double> StepRow::*> per_layer[] = {
      {"load_variance", &StepRow::load_variance},
      {"max_violation", &StepRow::max_violation},
      {"load_cv", &StepRow::load_cv},
      {"rank_overload", &StepRow::rank_overload},
      {"balance_loss", &StepRow::layer_balance_loss}};
  for (const auto& [name, field] : per_layer) {
    expect_column<double>(f, std::string("/routing/") + name, n, {kL}, exact,
                          [field](R r) { return r.*field; });
  }
  expect_column<double>(f, "/perf/phase_time", n, {kW, kNumPhases}, exact,
                        [](R r) { return r.phase_times; });
}

void write_rows(StatsWriter& w, int64_t first, int64_t last) {
  for (int64_t s = first; s < last; ++s) w.append(RowData(s).row());
}

// ---- the file's content ------------------------------------------------------------------------

TEST(StatsWriter, RoundTripsEveryDatasetAndAttribute) {
  TempDir dir;
  const std::string path = dir.file("run.h5");
  const StatsHeader h = test_header();
  {
    StatsWriter w(path, false, h);
    write_rows(w, 0, 3);
    w.append_trace(TraceData(0).row());
    w.append_trace(TraceData(2).row());
    EXPECT_EQ(w.num_rows(), 3);
    EXPECT_EQ(w.num_trace_rows(), 2);
  }
  const H5Id file = open_file(path, false);  // closed cleanly: plain read-only works
  const hid_t f = file.get();
  EXPECT_EQ(read_string_attr(f, "format"), "moe_rt.stats");
  EXPECT_EQ(read_attr<int32_t>(f, "format_version"), 1);
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
  EXPECT_EQ(read_strings(f, "/layers/routing"), h.layer_routing);
  EXPECT_EQ(read_strings(f, "/perf/phases"), h.phase_names);
  EXPECT_EQ(read_rows<int32_t>(f, "/layers/hash_table", kLh, {kV, kK}, true), h.hash_tables);
  expect_step_rows(f, 3, /*exact=*/true);

  // The trace of steps 0 and 2.
  std::vector<int32_t> token_id, position, rank, experts;
  std::vector<float> weights;
  for (int64_t s : {0, 2}) {
    const TraceData t(s);
    token_id = concat<int32_t>(token_id, t.token_id);
    position = concat<int32_t>(position, t.position);
    rank = concat<int32_t>(rank, t.rank);
    experts = concat<int32_t>(experts, t.experts);
    weights = concat<float>(weights, t.weights);
  }
  EXPECT_EQ(read_rows<int64_t>(f, "/trace/step", 2, {}, true), (std::vector<int64_t>{0, 2}));
  EXPECT_EQ(read_rows<int32_t>(f, "/trace/token_id", 2, {kT}, true), token_id);
  EXPECT_EQ(read_rows<int32_t>(f, "/trace/position", 2, {kT}, true), position);
  EXPECT_EQ(read_rows<int32_t>(f, "/trace/rank", 2, {kT}, true), rank);
  EXPECT_EQ(read_rows<int32_t>(f, "/trace/experts", 2, {kL, kT, kK}, true), experts);
  EXPECT_EQ(read_rows<float>(f, "/trace/weights", 2, {kL, kT, kK}, true), weights);
}

TEST(StatsWriter, WithoutTracingOrHashLayersHasNoTraceGroupAndAnEmptyHashTable) {
  TempDir dir;
  const std::string path = dir.file("run.h5");
  {
    StatsWriter w(path, false, test_header(0, 0));
    write_rows(w, 0, 2);
    EXPECT_THROW(w.append_trace(TraceData(0).row()), std::invalid_argument);
  }
  const H5Id file = open_file(path);
  EXPECT_EQ(H5Lexists(file.get(), "/trace", H5P_DEFAULT), 0);
  EXPECT_TRUE(read_rows<int32_t>(file.get(), "/layers/hash_table", 0, {kV, kK}, true).empty());
  expect_step_rows(file.get(), 2, true);
}

TEST(StatsWriter, RejectsWrongRowSizesBeforeWritingAnything) {
  TempDir dir;
  StatsWriter w(dir.file("run.h5"), false, test_header());
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

// SWMR writing leaves each chunk's unfiltered first copy behind as a hole; close() copies the
// file without them. Same content, less space, and no temporary left over.
TEST(StatsWriter, CloseCompactsTheFile) {
  TempDir dir;
  for (bool compact : {true, false}) {
    StatsStorage storage;
    storage.compact_on_close = compact;
    StatsWriter w(dir.file(compact ? "a.h5" : "b.h5"), false, test_header(), storage);
    write_rows(w, 0, 300);
  }
  EXPECT_LT(fs::file_size(dir.file("a.h5")), fs::file_size(dir.file("b.h5")));
  EXPECT_FALSE(fs::exists(dir.file("a.h5.compact")));
  for (const char* name : {"a.h5", "b.h5"})
    expect_step_rows(open_file(dir.file(name)).get(), 300, true);
}

TEST(StatsWriter, Hdf5ErrorNamesTheCallTheStackAndTheLine) {
  h5_silence_auto_print();
  try {
    MOE_H5_CHECK(H5Fopen("/nonexistent/moe.h5", H5F_ACC_RDONLY, H5P_DEFAULT));
    FAIL() << "opening a missing file succeeded";
  } catch (const Hdf5Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("H5Fopen(\"/nonexistent/moe.h5\""), std::string::npos) << what;
    EXPECT_NE(what.find("unable to open file"), std::string::npos) << what;
    EXPECT_NE(what.find("test_stats_writer.cpp:"), std::string::npos) << what;
  }
}

// If h5dump (hdf5-tools) is installed, it reads the header of a written file.
TEST(StatsWriter, H5dumpReadsTheFile) {
  if (std::system("command -v h5dump >/dev/null 2>&1") != 0) GTEST_SKIP() << "h5dump not on PATH";
  TempDir dir;
  const std::string path = dir.file("run.h5");
  {
    StatsWriter w(path, false, test_header());
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
  { StatsWriter w(path, false, test_header()); }
  const std::string msg = path_problem(path, false);
  EXPECT_TRUE(contains(msg, path) && contains(msg, "already exists") &&
              contains(msg, "--overwrite"))
      << msg;
  EXPECT_THROW(StatsWriter(path, false, test_header()), StatsPathError);
  EXPECT_EQ(path_problem(path, true), "");
  {
    StatsWriter w(path, true, test_header(0));
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
  write_rows(w, 0, 1);
  const std::string iso = stats_now_iso8601();  // 2026-05-09T07:35:25+02:00
  EXPECT_EQ(iso.size(), 25u) << iso;
  EXPECT_EQ(iso[10], 'T');
  EXPECT_EQ(iso[22], ':');
}

// ---- crash safety and live reading -------------------------------------------------------------

// Runs `body` in a forked child that never returns into GoogleTest: it exits 0 when `body`
// returns, 2 when it throws (after printing why). The child makes no MPI calls.
template <typename Body>
pid_t run_child(Body body) {
  const pid_t pid = ::fork();
  if (pid != 0) return pid;
  try {
    body();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "child: %s\n", e.what());
    ::_exit(2);
  }
  ::_exit(0);
}

// One byte through a pipe, for lock-step between the processes.
void send_byte(int fd) {
  const char c = 'x';
  if (::write(fd, &c, 1) != 1) throw std::runtime_error("pipe write failed");
}
bool receive_byte(int fd) {
  char c = 0;
  return ::read(fd, &c, 1) == 1;
}

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
  const pid_t pid = run_child([&] {
    StatsWriter w(path, false, test_header());
    write_rows(w, 0, 5);
    ::raise(SIGKILL);  // no close, no destructor
  });
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "status " << status;
  const H5Id file = open_file(path);  // SWMR read: the superblock still says "being written"
  EXPECT_EQ(committed_rows(file.get()), 5u);
  expect_step_rows(file.get(), 5, true);
}

TEST(StatsCrash, SigkillDuringAppendsKeepsEveryCompletedRow) {
  TempDir dir;
  const std::string path = dir.file("run.h5");
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t pid = run_child([&] {
    StatsWriter w(path, false, test_header());
    write_rows(w, 0, 5);
    send_byte(ready[1]);
    write_rows(w, 5, 1000000);  // until killed, most likely inside an append
  });
  ASSERT_TRUE(receive_byte(ready[0]));
  ::usleep(20000 + std::random_device{}() % 20000);
  ::kill(pid, SIGKILL);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ::close(ready[0]), ::close(ready[1]);
  const H5Id file = open_file(path);
  const size_t n = committed_rows(file.get());
  EXPECT_GE(n, 5u);
  expect_step_rows(file.get(), n);  // every dataset has >= n rows, all n complete
}

// The writer (a child) appends one row per request; the reader (this process) refreshes and
// sees each row appear. The reader must be another process: a second H5Fopen in the writer's
// process succeeds but shares the writer's open file (HDF5 matches the inode), so it would see
// rows through the writer's caches rather than through the file.
TEST(StatsSwmr, ReaderSeesRowsAppearWhileTheWriterRuns) {
  TempDir dir;
  const std::string path = dir.file("run.h5");
  int to_child[2], to_parent[2];
  ASSERT_EQ(::pipe(to_child), 0);
  ASSERT_EQ(::pipe(to_parent), 0);
  constexpr int kRows = 5;
  const pid_t pid = run_child([&] {
    StatsWriter w(path, false, test_header());
    send_byte(to_parent[1]);  // created, SWMR write mode on
    for (int s = 0; s < kRows; ++s) {
      if (!receive_byte(to_child[0])) return;
      w.append(RowData(s).row());
      send_byte(to_parent[1]);
    }
    receive_byte(to_child[0]);  // stay open until the reader is done
  });
  ASSERT_TRUE(receive_byte(to_parent[0]));
  {
    const H5Id file = open_file(path);
    H5Id step(MOE_H5_CHECK(H5Dopen2(file.get(), "/steps/step", H5P_DEFAULT)), H5Dclose);
    H5Id load(MOE_H5_CHECK(H5Dopen2(file.get(), "/routing/expert_load", H5P_DEFAULT)), H5Dclose);
    EXPECT_EQ(dataset_dims(step.get())[0], 0u);
    for (int s = 0; s < kRows; ++s) {
      send_byte(to_child[1]);
      ASSERT_TRUE(receive_byte(to_parent[0]));
      MOE_H5_CHECK(H5Drefresh(step.get()));
      MOE_H5_CHECK(H5Drefresh(load.get()));
      EXPECT_EQ(dataset_dims(step.get())[0], hsize_t(s + 1));
      EXPECT_EQ(dataset_dims(load.get()), (std::vector<hsize_t>{hsize_t(s + 1), kL, kE}));
    }
    expect_step_rows(file.get(), kRows);
  }
  send_byte(to_child[1]);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
  for (int fd : {to_child[0], to_child[1], to_parent[0], to_parent[1]}) ::close(fd);
}

}  // namespace
}  // namespace moe

// Readers shared by the HDF5 statistics-file tests (test_stats_writer.cpp, test_stats_swmr.cpp),
// built on the HDF5 C API: they check every dataset's dtype and row shape as they read, up to
// expect_step_rows, which checks every /steps, /routing and /perf dataset at once against the
// rows of stats_test_data.hpp.
// Legend: N rows, L layers, E experts, K top-k, V vocabulary, W ranks, T traced tokens.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "io/hdf5_check.hpp"
#include "io/stats_writer.hpp"
#include "stats_test_data.hpp"

namespace moe::stats_test {

// ---- reading back with the C API ----------------------------------------------------------------

// Opens read-only; with SWMR read, which also opens a file whose writer died (docs/hdf5-schema.md).
// A SWMR reader retries a metadata block whose checksum fails, sleeping twice as long each time;
// at HDF5's 100 attempts a torn block in a crashed file would hold the test for ever, at 20 it
// fails it within about a millisecond. A reader of a live file needs HDF5's 100: a block it reads
// while the writer rewrites it fails its checksum until the writer is done.
inline H5Id open_file(const std::string& path, bool swmr = true, unsigned read_attempts = 20) {
  h5_silence_auto_print();
  const unsigned flags = H5F_ACC_RDONLY | (swmr ? H5F_ACC_SWMR_READ : 0u);
  H5Id fapl(MOE_H5_CHECK(H5Pcreate(H5P_FILE_ACCESS)), H5Pclose);
  MOE_H5_CHECK(H5Pset_metadata_read_attempts(fapl.get(), read_attempts));
  return H5Id(MOE_H5_CHECK(H5Fopen(path.c_str(), flags, fapl.get())), H5Fclose);
}

inline std::vector<hsize_t> dataset_dims(hid_t dset) {
  H5Id space(MOE_H5_CHECK(H5Dget_space(dset)), H5Sclose);
  std::vector<hsize_t> dims(MOE_H5_CHECK(H5Sget_simple_extent_ndims(space.get())));
  MOE_H5_CHECK(H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr));
  return dims;
}

// HDF5 types of a C++ value type: the native memory type and the little-endian file type.
template <typename T> hid_t mem_type() {
  if constexpr (std::is_same_v<T, int32_t>) return H5T_NATIVE_INT32;
  if constexpr (std::is_same_v<T, int64_t>) return H5T_NATIVE_INT64;
  if constexpr (std::is_same_v<T, uint64_t>) return H5T_NATIVE_UINT64;
  if constexpr (std::is_same_v<T, float>) return H5T_NATIVE_FLOAT;
  return H5T_NATIVE_DOUBLE;
}
template <typename T> hid_t file_type() {
  if constexpr (std::is_same_v<T, int32_t>) return H5T_STD_I32LE;
  if constexpr (std::is_same_v<T, int64_t>) return H5T_STD_I64LE;
  if constexpr (std::is_same_v<T, uint64_t>) return H5T_STD_U64LE;
  if constexpr (std::is_same_v<T, float>) return H5T_IEEE_F32LE;
  return H5T_IEEE_F64LE;
}

inline std::vector<std::string> read_strings(hid_t file, const std::string& name) {
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

template <typename T> T read_attr(hid_t file, const char* name) {
  H5Id attr(MOE_H5_CHECK(H5Aopen(file, name, H5P_DEFAULT)), H5Aclose);
  H5Id type(MOE_H5_CHECK(H5Aget_type(attr.get())), H5Tclose);
  EXPECT_GT(H5Tequal(type.get(), file_type<T>()), 0) << "attribute " << name << ": wrong dtype";
  T value{};
  MOE_H5_CHECK(H5Aread(attr.get(), mem_type<T>(), &value));
  return value;
}

inline std::string read_string_attr(hid_t file, const char* name) {
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

template <typename T> std::vector<T> concat(std::vector<T> a, std::span<const T> b) {
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
inline void expect_step_rows(hid_t f, size_t n, bool exact = false) {
  using R = const StepRow&;
  expect_column<int64_t>(f, "/steps/step", n, {}, exact, [](R r) { return std::span(&r.step, 1); });
  const std::pair<const char*, double StepRow::*> scalars[] = {
      {"loss", &StepRow::loss},
      {"balance_loss", &StepRow::balance_loss},
      {"z_loss", &StepRow::z_loss},
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
  expect_column<int64_t>(f, "/routing/dropped", n, {kL, kE}, exact, [](R r) { return r.dropped; });
  expect_column<int32_t>(f, "/routing/source_expert_load", n, {kL, kW, kE}, exact,
                         [](R r) { return r.source_expert_load; });
  const std::pair<const char*, std::span<const double> StepRow::*> per_layer[] = {
      {"load_variance", &StepRow::load_variance},
      {"max_violation", &StepRow::max_violation},
      {"load_cv", &StepRow::load_cv},
      {"rank_overload", &StepRow::rank_overload},
      {"balance_loss", &StepRow::layer_balance_loss},
      {"z_loss", &StepRow::layer_z_loss}};
  for (const auto& [name, field] : per_layer) {
    expect_column<double>(f, std::string("/routing/") + name, n, {kL}, exact,
                          [field](R r) { return r.*field; });
  }
  expect_column<double>(f, "/perf/phase_time", n, {kW, kNumPhases}, exact,
                        [](R r) { return r.phase_times; });
  expect_column<int64_t>(f, "/routing/dispatch_rows", n, {kL}, exact,
                         [](R r) { return r.dispatch_rows; });
  expect_column<int64_t>(f, "/routing/cross_host_rows", n, {kL}, exact,
                         [](R r) { return r.cross_host_rows; });
  expect_column<int64_t>(f, "/routing/cross_host_tokens", n, {kL}, exact,
                         [](R r) { return r.cross_host_tokens; });
}

// Checks dtype, shape and the first steps.size() rows of /trace/step and every other /trace
// dataset against TraceData of `steps`; with `exact`, also that each holds exactly that many rows.
inline void expect_trace_rows(hid_t f, const std::vector<int64_t>& steps, bool exact = false) {
  std::vector<int32_t> token_id, position, rank, experts, experts_unbiased;
  std::vector<float> weights;
  for (int64_t s : steps) {
    const TraceData t(s);
    token_id = concat<int32_t>(token_id, t.token_id);
    position = concat<int32_t>(position, t.position);
    rank = concat<int32_t>(rank, t.rank);
    experts = concat<int32_t>(experts, t.experts);
    weights = concat<float>(weights, t.weights);
    experts_unbiased = concat<int32_t>(experts_unbiased, t.experts_unbiased);
  }
  const size_t n = steps.size();
  EXPECT_EQ(read_rows<int64_t>(f, "/trace/step", n, {}, exact), steps);
  EXPECT_EQ(read_rows<int32_t>(f, "/trace/token_id", n, {kT}, exact), token_id);
  EXPECT_EQ(read_rows<int32_t>(f, "/trace/position", n, {kT}, exact), position);
  EXPECT_EQ(read_rows<int32_t>(f, "/trace/rank", n, {kT}, exact), rank);
  EXPECT_EQ(read_rows<int32_t>(f, "/trace/experts", n, {kL, kT, kK}, exact), experts);
  EXPECT_EQ(read_rows<float>(f, "/trace/weights", n, {kL, kT, kK}, exact), weights);
  EXPECT_EQ(read_rows<int32_t>(f, "/trace/experts_unbiased", n, {kL, kT, kK}, exact),
            experts_unbiased);
}

}  // namespace moe::stats_test

// The statistics file describes itself (format version 2, io/stats_schema.hpp): every dataset has
// "units" and "description", every axis a label, the step, layer, expert, rank, phase, slot,
// token, traced-step and eval-step axes their dimension scale, in the live file (SWMR) and after
// close() compacted it; the configuration is also a group of typed attributes.
#include <gtest/gtest.h>
#include <hdf5_hl.h>

#include <string>
#include <vector>

#include "io/stats_writer.hpp"
#include "stats_test_util.hpp"
#include "test_tempdir.hpp"

namespace moe {
namespace {

using namespace stats_test;
using testing_util::TempDir;

// (dataset, axis, scale) of every attachment the writer makes.
struct Attachment {
  const char* dataset;
  unsigned axis;
  const char* scale;
};
const Attachment kAttachments[] = {
    {"/steps/loss", 0, "/steps/step"},
    {"/steps/step_time_s", 0, "/steps/step"},
    {"/routing/expert_load", 0, "/steps/step"},
    {"/routing/expert_load", 1, "/dims/layer"},
    {"/routing/expert_load", 2, "/dims/expert"},
    {"/routing/rank_load", 2, "/dims/rank"},
    {"/routing/source_expert_load", 2, "/dims/rank"},
    {"/routing/source_expert_load", 3, "/dims/expert"},
    {"/routing/bias", 2, "/dims/expert"},
    {"/routing/load_cv", 1, "/dims/layer"},
    {"/perf/phase_time", 1, "/dims/rank"},
    {"/perf/phase_time", 2, "/perf/phases"},
    {"/layers/routing", 0, "/dims/layer"},
    {"/layers/hash_table", 2, "/dims/slot"},
    {"/trace/experts", 0, "/trace/step"},
    {"/trace/experts", 2, "/dims/token"},
    {"/trace/experts", 3, "/dims/slot"},
    {"/trace/token_id", 1, "/dims/token"},
    {"/trace/experts_unbiased", 3, "/dims/slot"},
    {"/eval/loss", 0, "/eval/step"},
    {"/eval/expert_load", 0, "/eval/step"},
    {"/eval/expert_load", 2, "/dims/expert"},
    {"/eval/max_violation", 1, "/dims/layer"},
    {"/routing/cross_host_rows", 0, "/steps/step"},
    {"/routing/cross_host_rows", 1, "/dims/layer"},
    {"/routing/dispatch_rows", 1, "/dims/layer"},
    {"/hosts/rank_host", 0, "/dims/rank"},
    {"/routing/cross_host_tokens", 1, "/dims/layer"},
    {"/routing/dropped", 0, "/steps/step"},
    {"/routing/dropped", 2, "/dims/expert"},
    {"/eval/dropped", 0, "/eval/step"},
    {"/eval/dropped", 1, "/dims/layer"},
};

H5Id open_dset(hid_t f, const char* path) {
  return H5Id(MOE_H5_CHECK(H5Dopen2(f, path, H5P_DEFAULT)), H5Dclose);
}

herr_t collect_dataset(hid_t, const char* name, const H5O_info_t* info, void* out) {
  if (info->type == H5O_TYPE_DATASET) static_cast<std::vector<std::string>*>(out)->push_back(name);
  return 0;
}

// The live file is open in this process, by the writer with HDF5's file locking off: a second
// open here must say the same (it then shares the writer's open file, caches included, which is
// enough to check what the writer created before SWMR mode).
H5Id open_here(const std::string& path, bool live) {
  if (!live) return open_file(path, false);
  H5Id fapl(MOE_H5_CHECK(H5Pcreate(H5P_FILE_ACCESS)), H5Pclose);
  MOE_H5_CHECK(H5Pset_file_locking(fapl.get(), 0, 1));
  return H5Id(MOE_H5_CHECK(H5Fopen(path.c_str(), H5F_ACC_RDONLY | H5F_ACC_SWMR_READ, fapl.get())),
              H5Fclose);
}

void expect_described(const std::string& path, bool live) {
  SCOPED_TRACE(live ? "live file" : "compacted file");
  const H5Id file = open_here(path, live);
  const hid_t f = file.get();
  EXPECT_EQ(read_attr<int32_t>(f, "format_version"), 2);
  std::vector<std::string> datasets;
  MOE_H5_CHECK(
      H5Ovisit2(f, H5_INDEX_NAME, H5_ITER_INC, collect_dataset, &datasets, H5O_INFO_BASIC));
  EXPECT_EQ(datasets.size(), 47u);  // 23 per-step, 4 fixed, 5 axes, 7 trace, 8 eval
  for (const std::string& name : datasets) {
    const H5Id d = open_dset(f, name.c_str());
    EXPECT_FALSE(read_string_attr(d.get(), "units").empty()) << name;
    EXPECT_FALSE(read_string_attr(d.get(), "description").empty()) << name;
  }
  for (const Attachment& a : kAttachments) {
    const H5Id d = open_dset(f, a.dataset);
    const H5Id s = open_dset(f, a.scale);
    EXPECT_EQ(MOE_H5_CHECK(H5DSis_attached(d.get(), s.get(), a.axis)), 1)
        << a.dataset << " axis " << a.axis << " -> " << a.scale;
  }
  const H5Id load = open_dset(f, "/routing/expert_load");
  char label[16] = {0};
  const char* expected[] = {"step", "layer", "expert"};
  for (unsigned axis = 0; axis < 3; ++axis) {
    MOE_H5_CHECK(H5DSget_label(load.get(), axis, label, sizeof label));
    EXPECT_STREQ(label, expected[axis]);
  }
  // The step axis's scale is the step column: as long as the rows.
  EXPECT_EQ(dataset_dims(open_dset(f, "/steps/step").get())[0], dataset_dims(load.get())[0]);
  EXPECT_EQ(read_rows<int32_t>(f, "/dims/expert", kE, {}, true),
            (std::vector<int32_t>{0, 1, 2, 3}));
  // The configuration text, typed.
  const H5Id config(MOE_H5_CHECK(H5Gopen2(f, "/config", H5P_DEFAULT)), H5Gclose);
  EXPECT_EQ(read_string_attr(config.get(), "model"), "deepseek4-tiny");
  EXPECT_EQ(read_attr<int64_t>(config.get(), "layers"), 3);
}

TEST(StatsSchema, EveryDatasetIsDescribedAndItsAxesNamedLiveAndAfterCompaction) {
  TempDir dir;
  const std::string path = dir.file("run.h5");
  StatsHeader h = test_header();
  h.eval = true;
  StatsWriter w(path, false, h);
  w.publish();
  write_rows(w, 0, 3);
  w.append_trace(TraceData(0).row());
  const std::vector<int64_t> load(kL * kE, 5);
  const std::vector<double> per_layer(kL, 0.0);
  w.append_eval(EvalRow{2, 1.5, 0.1, 64, load, per_layer, per_layer, load});
  expect_described(path, /*swmr=*/true);
  w.close();
  expect_described(path, /*swmr=*/false);
}

// Shadow balancers: a group /shadow/<rule> each, with the rule as an attribute and per-step
// expert_load, max_violation and bias, described and with their axes' scales, live and after
// compaction; rows of the wrong size and names that are no group name are refused.
TEST(StatsSchema, ShadowGroupsRoundTripDescribed) {
  TempDir dir;
  const std::string path = dir.file("run.h5");
  StatsHeader h = test_header();
  h.shadow_rules = {"sign:0.001", "none"};
  constexpr int R = 2, N = 3;
  std::vector<int64_t> all_load;
  std::vector<float> all_bias;
  std::vector<double> all_violation;
  {
    StatsWriter w(path, false, h);
    w.publish();
    for (int s = 0; s < N; ++s) {
      const RowData data(s);
      std::vector<int64_t> load(R * kL * kE);
      std::vector<float> bias(load.size());
      std::vector<double> violation(R * kL);
      for (size_t i = 0; i < load.size(); ++i) load[i] = 1000 * s + static_cast<int64_t>(i);
      for (size_t i = 0; i < bias.size(); ++i) bias[i] = 0.25f * s - 0.125f * i;
      for (size_t i = 0; i < violation.size(); ++i) violation[i] = s + 0.5 * i;
      StepRow row = data.row();
      row.shadow_load = load;
      row.shadow_bias = bias;
      row.shadow_max_violation = violation;
      w.append(row);
      all_load.insert(all_load.end(), load.begin(), load.end());
      all_bias.insert(all_bias.end(), bias.begin(), bias.end());
      all_violation.insert(all_violation.end(), violation.begin(), violation.end());
      row.shadow_max_violation = std::span<const double>(violation).first(kL);
      EXPECT_THROW(w.append(row), std::invalid_argument);
    }
    const H5Id live = open_here(path, /*live=*/true);
    EXPECT_EQ(read_rows<int64_t>(live.get(), "/shadow/none/expert_load", N, {kL, kE}, true).size(),
              static_cast<size_t>(N) * kL * kE);
  }
  const H5Id file = open_file(path, false);
  const hid_t f = file.get();
  for (int r = 0; r < R; ++r) {
    const std::string group = "/shadow/" + h.shadow_rules[r];
    const H5Id g(MOE_H5_CHECK(H5Gopen2(f, group.c_str(), H5P_DEFAULT)), H5Gclose);
    EXPECT_EQ(read_string_attr(g.get(), "rule"), h.shadow_rules[r]);
    std::vector<int64_t> load;
    std::vector<float> bias;
    std::vector<double> violation;
    for (int s = 0; s < N; ++s) {
      const size_t at = (static_cast<size_t>(s) * R + r) * kL * kE;
      load.insert(load.end(), all_load.begin() + at, all_load.begin() + at + kL * kE);
      bias.insert(bias.end(), all_bias.begin() + at, all_bias.begin() + at + kL * kE);
      const size_t v = (static_cast<size_t>(s) * R + r) * kL;
      violation.insert(violation.end(), all_violation.begin() + v, all_violation.begin() + v + kL);
    }
    EXPECT_EQ(read_rows<int64_t>(f, group + "/expert_load", N, {kL, kE}, true), load);
    EXPECT_EQ(read_rows<float>(f, group + "/bias", N, {kL, kE}, true), bias);
    EXPECT_EQ(read_rows<double>(f, group + "/max_violation", N, {kL}, true), violation);
    for (const char* name : {"/expert_load", "/bias", "/max_violation"}) {
      const H5Id d = open_dset(f, (group + name).c_str());
      EXPECT_FALSE(read_string_attr(d.get(), "units").empty()) << group << name;
      EXPECT_FALSE(read_string_attr(d.get(), "description").empty()) << group << name;
      const H5Id step = open_dset(f, "/steps/step"), layer = open_dset(f, "/dims/layer");
      EXPECT_EQ(MOE_H5_CHECK(H5DSis_attached(d.get(), step.get(), 0)), 1) << group << name;
      EXPECT_EQ(MOE_H5_CHECK(H5DSis_attached(d.get(), layer.get(), 1)), 1) << group << name;
      char label[16] = {0};
      MOE_H5_CHECK(H5DSget_label(d.get(), 1, label, sizeof label));
      EXPECT_STREQ(label, "layer");
    }
  }
  // Files without --shadow have no /shadow group (test_header has none).
  for (const std::vector<std::string>& bad :
       {std::vector<std::string>{"a/b"}, {"sign:1", "sign:1"}, {""}, {".."}}) {
    StatsHeader b = test_header();
    b.shadow_rules = bad;
    EXPECT_THROW(StatsWriter(dir.file("bad.h5"), true, b), std::invalid_argument) << bad[0];
  }
}

}  // namespace
}  // namespace moe

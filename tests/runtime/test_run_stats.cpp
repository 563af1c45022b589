// The statistics file holds exactly what the run computed: read back with the HDF5 C library
// (in SWMR-read mode, as a live reader would) and compared with the run's own step records.
#include <gtest/gtest.h>
#include <hdf5.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "comm/communicator.hpp"
#include "runtime/options.hpp"
#include "runtime/presets.hpp"
#include "runtime/train.hpp"

namespace moe {
namespace {

template <class T> std::vector<T> read_all(hid_t file, const char* name, hid_t mem_type) {
  const hid_t ds = H5Dopen2(file, name, H5P_DEFAULT);
  EXPECT_GE(ds, 0) << name;
  const hid_t space = H5Dget_space(ds);
  const hssize_t n = H5Sget_simple_extent_npoints(space);
  std::vector<T> out(static_cast<size_t>(n));
  EXPECT_GE(H5Dread(ds, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data()), 0) << name;
  H5Sclose(space);
  H5Dclose(ds);
  return out;
}

TEST(RunStats, FileHoldsExactlyWhatTheRunComputed) {
  const Comm world = Comm::world();
  // One path for the whole job: rank 0's pid names it.
  std::vector<int64_t> pid = {static_cast<int64_t>(getpid())};
  world.broadcast(std::span<int64_t>(pid), 0);
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("moe_rt_run_stats_" + std::to_string(pid[0]) + ".h5"))
                               .string();
  RunConfig cfg;
  cfg.model_name = "micro";
  cfg.model = preset_model("micro");
  cfg.steps = 4;
  cfg.threads = 1;
  cfg.stats_path = path;
  cfg.overwrite = true;
  const TrainSummary run = train_run(cfg, world, /*quiet=*/true);
  world.barrier();
  if (world.rank() == 0) {
    const hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY | H5F_ACC_SWMR_READ, H5P_DEFAULT);
    ASSERT_GE(f, 0);
    const auto steps = read_all<int64_t>(f, "/steps/step", H5T_NATIVE_INT64);
    const auto loss = read_all<double>(f, "/steps/loss", H5T_NATIVE_DOUBLE);
    const auto grad = read_all<double>(f, "/steps/grad_norm", H5T_NATIVE_DOUBLE);
    const auto load = read_all<int64_t>(f, "/routing/expert_load", H5T_NATIVE_INT64);
    const auto rank_load = read_all<int64_t>(f, "/routing/rank_load", H5T_NATIVE_INT64);
    const auto bias = read_all<float>(f, "/routing/bias", H5T_NATIVE_FLOAT);
    const auto variance = read_all<double>(f, "/routing/load_variance", H5T_NATIVE_DOUBLE);
    const auto phases = read_all<double>(f, "/perf/phase_time", H5T_NATIVE_DOUBLE);
    H5Fclose(f);
    ASSERT_EQ(steps.size(), run.steps.size());
    const size_t LE = run.steps[0].expert_load.size(), LW = run.steps[0].rank_load.size();
    const size_t L = run.steps[0].load_variance.size();
    for (size_t s = 0; s < steps.size(); ++s) {
      const StepRecord& r = run.steps[s];
      EXPECT_EQ(steps[s], r.step);
      EXPECT_EQ(loss[s], r.loss);
      EXPECT_EQ(grad[s], r.grad_norm);
      EXPECT_EQ(std::vector<int64_t>(load.begin() + s * LE, load.begin() + (s + 1) * LE),
                r.expert_load);
      EXPECT_EQ(std::vector<int64_t>(rank_load.begin() + s * LW, rank_load.begin() + (s + 1) * LW),
                r.rank_load);
      EXPECT_EQ(std::vector<float>(bias.begin() + s * LE, bias.begin() + (s + 1) * LE), r.bias);
      EXPECT_EQ(std::vector<double>(variance.begin() + s * L, variance.begin() + (s + 1) * L),
                r.load_variance);
    }
    // Every rank reported its phase times, and they are plausible (non-negative, not all zero).
    double total = 0;
    for (double t : phases) {
      EXPECT_GE(t, 0.0);
      total += t;
    }
    EXPECT_GT(total, 0.0);
    std::filesystem::remove(path);
  }
}

}  // namespace
}  // namespace moe

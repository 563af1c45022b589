// The statistics file holds exactly what the run computed: read back with the HDF5 C library
// (in SWMR-read mode, as a live reader would) and compared with the run's own step records.
#include <gtest/gtest.h>
#include <hdf5.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "comm/communicator.hpp"
#include "model/phase_timer.hpp"
#include "runtime/options/options.hpp"
#include "runtime/options/presets.hpp"
#include "runtime/run/train.hpp"

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

// A 1-thread micro run of `steps` steps whose statistics go to a temporary file named by `tag`
// and rank 0's pid (one path for the whole job), which `path` receives.
TrainSummary micro_run(const Comm& world, const std::string& tag, int steps, std::string& path) {
  std::vector<int64_t> pid = {static_cast<int64_t>(getpid())};
  world.broadcast(std::span<int64_t>(pid), 0);
  path = (std::filesystem::temp_directory_path() / (tag + std::to_string(pid[0]) + ".h5")).string();
  RunConfig cfg;
  cfg.model_name = "micro";
  cfg.model = preset_model("micro");
  cfg.steps = steps;
  cfg.threads = 1;
  cfg.stats_path = path;
  cfg.overwrite = true;
  TrainSummary run = train_run(cfg, world, /*quiet=*/true);
  world.barrier();
  return run;
}

TEST(RunStats, FileHoldsExactlyWhatTheRunComputed) {
  const Comm world = Comm::world();
  std::string path;
  const TrainSummary run = micro_run(world, "moe_rt_run_stats_", 4, path);
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

// The phases of a step lie within its time, the statistics append that each step's "stats"
// phase carries from the step before included: on every rank and step their sum (the checkpoint,
// written between steps, aside) is at most the step's time, and the phase table's rest is not
// negative. The append used to fall outside the step's clock (a negative "unaccounted").
TEST(RunStats, PhasesAddUpToNoMoreThanTheStep) {
  const Comm world = Comm::world();
  std::string path;
  constexpr int kSteps = 8;
  const TrainSummary run = micro_run(world, "moe_rt_phase_sum_", kSteps, path);
  if (world.rank() != 0) return;
  // Sums of a few dozen durations against one difference of clock readings: rounding only.
  constexpr double kRounding = 1e-9;
  double accounted = 0;
  for (int p = 0; p < kNumPhases; ++p) {
    if (p != static_cast<int>(Phase::kCheckpoint)) accounted += run.phases.mean_ms[p];
  }
  EXPECT_GE(run.phases.step_ms - accounted, -kRounding * 1e3);
  const hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  const auto step_time = read_all<double>(f, "/steps/step_time_s", H5T_NATIVE_DOUBLE);
  const auto phases = read_all<double>(f, "/perf/phase_time", H5T_NATIVE_DOUBLE);
  H5Fclose(f);
  const size_t W = static_cast<size_t>(world.size());
  ASSERT_EQ(step_time.size(), static_cast<size_t>(kSteps));
  ASSERT_EQ(phases.size(), step_time.size() * W * kNumPhases);
  for (size_t s = 0; s < step_time.size(); ++s) {
    for (size_t r = 0; r < W; ++r) {
      double sum = 0;
      for (int p = 0; p < kNumPhases; ++p) {
        if (p != static_cast<int>(Phase::kCheckpoint)) sum += phases[(s * W + r) * kNumPhases + p];
      }
      EXPECT_LE(sum, step_time[s] + kRounding) << "step " << s << ", rank " << r;
    }
  }
  std::filesystem::remove(path);
}

// Each rank's phase times reach rank 0's file in that rank's own row (they ride in the step's
// end-of-step collective): every row of every step carries time, and the file's rows, summed as
// the run summed them, give the phase table's mean and slowest-rank figures exactly.
TEST(RunStats, EveryRankWritesItsOwnPhaseTimes) {
  const Comm world = Comm::world();
  std::string path;
  constexpr int kSteps = 5;
  const TrainSummary run = micro_run(world, "moe_rt_phase_rows_", kSteps, path);
  if (world.rank() != 0) return;
  const hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  const auto phases = read_all<double>(f, "/perf/phase_time", H5T_NATIVE_DOUBLE);
  H5Fclose(f);
  const size_t W = static_cast<size_t>(world.size()), steps = static_cast<size_t>(kSteps);
  ASSERT_EQ(phases.size(), steps * W * kNumPhases);
  const auto at = [&](size_t s, size_t r, int p) { return phases[(s * W + r) * kNumPhases + p]; };
  for (size_t s = 0; s < steps; ++s) {
    for (size_t r = 0; r < W; ++r) {
      double sum = 0;
      for (int p = 0; p < kNumPhases; ++p) sum += at(s, r, p);
      EXPECT_GT(sum, 0.0) << "step " << s << ", rank " << r;
    }
  }
  // train_run's sums: the steps after the first, in order, then ms per step, mean over ranks.
  ASSERT_EQ(run.phases.mean_ms.size(), static_cast<size_t>(kNumPhases));
  for (int p = 0; p < kNumPhases; ++p) {
    double mean = 0, slowest = 0;
    for (size_t r = 0; r < W; ++r) {
      double sum = 0;
      for (size_t s = 1; s < steps; ++s) sum += at(s, r, p);
      const double ms = sum * 1e3 / static_cast<double>(steps - 1);
      mean += ms / static_cast<double>(W);
      slowest = std::max(slowest, ms);
    }
    EXPECT_EQ(mean, run.phases.mean_ms[p]) << kPhaseNames[p];
    EXPECT_EQ(slowest, run.phases.max_ms[p]) << kPhaseNames[p];
  }
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace moe

// moe_rt: the program. Parses options on every rank, agrees on set-up errors, trains, and prints
// the story on rank 0. An error after set-up aborts the whole job so that no rank hangs.
#include <cstdio>
#include <algorithm>
#include <exception>
#include <numeric>

#include "comm/communicator.hpp"
#include "runtime/options.hpp"
#include "runtime/train.hpp"

namespace {

void print_summary(const moe::TrainSummary& s) {
  if (s.steps.empty()) return;
  const moe::StepRecord& last = s.steps.back();
  // Throughput: median over the steps after the first (which pays for warm-up).
  std::vector<double> tps;
  for (size_t i = s.steps.size() > 1 ? 1 : 0; i < s.steps.size(); ++i) {
    tps.push_back(s.steps[i].tokens_per_s);
  }
  std::sort(tps.begin(), tps.end());
  double seconds = 0;
  for (const auto& r : s.steps) seconds += r.seconds;
  std::printf("\nsummary: %zu steps in %.1f s, median %.0f tokens/s\n", s.steps.size(), seconds,
              tps[tps.size() / 2]);
  std::printf("  loss %.4f -> %.4f", s.steps.front().loss, last.loss);
  if (s.entropy_floor >= 0) {
    std::printf(" (data floor %.4f nats, %.4f above it)", s.entropy_floor,
                last.loss - s.entropy_floor);
  }
  std::printf("\n  worst load violation at the last step: %.3f\n", last.max_violation);
}

}  // namespace

int main(int argc, char** argv) {
  moe::MpiSession mpi(&argc, &argv);
  const moe::Comm world = moe::Comm::world();
  try {
    moe::RunConfig cfg;
    std::string error;
    try {
      cfg = moe::options_parse(argc, argv);
    } catch (const std::exception& e) {
      error = e.what();
    }
    moe::setup_agree(world, error);
    if (cfg.help || cfg.print_config) {
      if (world.rank() == 0) {
        std::fputs((cfg.help ? moe::options_help_text() : moe::run_config_to_text(cfg)).c_str(),
                   stdout);
      }
      return 0;
    }
    const moe::TrainSummary summary = moe::train_run(cfg, world);
    if (world.rank() == 0) print_summary(summary);
    return 0;
  } catch (const moe::SetupError& e) {
    if (e.report()) std::fprintf(stderr, "moe_rt: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    moe::mpi_abort_job(e.what(), 3);
  }
}

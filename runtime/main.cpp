// moe_rt: the program. Parses options on every rank, agrees on set-up errors and checks that every
// rank holds the same configuration, trains, and prints the story on rank 0. An error after set-up
// aborts the whole job so that no rank hangs.
#include <cstdio>
#include <exception>

#include "comm/communicator.hpp"
#include "runtime/config_agree.hpp"
#include "runtime/options.hpp"
#include "runtime/report.hpp"
#include "runtime/train.hpp"

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
    moe::config_agree(world, cfg);  // every rank read the same options, or all stop here
    if (cfg.help || cfg.print_config) {
      if (world.rank() == 0) {
        std::fputs((cfg.help ? moe::options_help_text() : moe::run_config_to_text(cfg)).c_str(),
                   stdout);
      }
      return 0;
    }
    const moe::TrainSummary summary = moe::train_run(cfg, world, /*quiet=*/false,
                                                      /*measure_peak=*/true);
    if (world.rank() == 0) moe::report_summary(summary, summary.stats_path);
    return 0;
  } catch (const moe::SetupError& e) {
    if (e.report()) std::fprintf(stderr, "moe_rt: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    moe::mpi_abort_job(e.what(), 3);
  }
}

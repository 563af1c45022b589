// moe_rt: the program. Parses options on every rank, agrees on set-up errors and checks that every
// rank holds the same configuration, trains, and prints the story on rank 0. An error after set-up
// aborts the whole job so that no rank hangs.
// Exit status: 0 done; 2 bad input (nothing ran); 3 an error during the run; 4 a non-finite loss
// or gradient norm stopped it; 128 + N stopped by signal N (130 SIGINT, 143 SIGTERM, 138 SIGUSR1).
#include <cstdio>
#include <exception>
#include <string>

#include "comm/communicator.hpp"
#include "io/hdf5_check.hpp"
#include "runtime/options/config_agree.hpp"
#include "runtime/options/options.hpp"
#include "runtime/output/report.hpp"
#include "runtime/run/stop_signal.hpp"
#include "runtime/run/train.hpp"

namespace {

// What rank 0 says when a run ends early, and the exit status of every rank.
int report_end(const moe::TrainSummary& s, bool rank0) {
  using moe::RunEnd;
  const std::string checkpoint =
      s.last_checkpoint.empty()
          ? (s.checkpoint_dir.empty() ? std::string("no checkpoint (checkpointing is off)")
                                      : "no checkpoint written by this run")
          : "newest checkpoint '" + s.last_checkpoint + "'";
  const std::string step = std::to_string(s.last_step);
  switch (s.end) {
    case RunEnd::kCompleted:
      return 0;
    case RunEnd::kSignal:
      if (rank0) {
        // Under mpirun the step lines (stdout) and this line (stderr) are forwarded separately:
        // once signalled, mpirun reads the rest of stdout only as the job ends, in pieces that
        // need not end at a line's end, and this line may overtake them. Starting with a newline,
        // in one write, it stands on a line of its own in a log of both streams.
        const std::string line =
            std::string(moe::stop_signal_under_launcher() ? "\n" : "") + "moe_rt: stopped by " +
            moe::stop_signal_name(s.stop_signal) + " after step " + step + "; " + checkpoint +
            (s.last_checkpoint.empty() ? "" : "; continue with --resume " + s.checkpoint_dir) +
            "\n";
        std::fflush(stdout);
        std::fwrite(line.data(), 1, line.size(), stderr);
      }
      return 128 + s.stop_signal;
    case RunEnd::kNonFinite:
      if (rank0) {
        const moe::StepRecord& r = s.steps.back();
        std::fprintf(stderr,
                     "moe_rt: error: step %s: loss %g, gradient norm %g: not finite (%s); the "
                     "step updated nothing and the run stopped; %s\n",
                     step.c_str(), r.loss, r.grad_norm, s.end_detail.c_str(), checkpoint.c_str());
      }
      return 4;
    case RunEnd::kStatsFailed:
      if (rank0) {
        std::fprintf(stderr, "moe_rt: error: after step %s: %s; stopped without a checkpoint; %s\n",
                     step.c_str(), s.end_detail.c_str(), checkpoint.c_str());
      }
      return 3;
    case RunEnd::kCheckpointFailed:
      if (rank0) {
        std::fprintf(stderr, "moe_rt: error: after step %s: %s; stopped\n", step.c_str(),
                     s.end_detail.c_str());
      }
      return 3;
  }
  return 3;
}

}  // namespace

int main(int argc, char** argv) {
  const moe::Hdf5LibraryHold hdf5;  // before any HDF5 call; shuts the library down last
  moe::MpiSession mpi(&argc, &argv);
  moe::stop_signal_install();
  const moe::Comm world = moe::Comm::world();
  try {
    moe::RunConfig cfg;
    std::string error;
    try {
      cfg = moe::options_parse(argc, argv);
      moe::run_config_fit_world(cfg, world.size());
    } catch (const std::exception& e) {
      error = e.what();
    }
    moe::setup_agree(world, error);
    moe::config_agree(world, cfg);  // every rank read the same options, or all stop here
    if (world.rank() == 0 && !cfg.config_note.empty()) {
      std::fprintf(stderr, "moe_rt: note: %s\n", cfg.config_note.c_str());
    }
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
    return report_end(summary, world.rank() == 0);
  } catch (const moe::SetupError& e) {
    if (e.report()) std::fprintf(stderr, "moe_rt: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    moe::mpi_abort_job(e.what(), 3);
  }
}

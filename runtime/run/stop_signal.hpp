// Stopping a run cleanly on a signal. SIGTERM (what SLURM sends before its time limit and what
// mpirun forwards), SIGINT (Ctrl-C) and SIGUSR1 (forwarded by Open MPI's mpirun without killing
// the job) set a flag; the training loop agrees on it across ranks at the next step boundary,
// writes a checkpoint when checkpointing is on, closes the statistics file and exits with
// 128 + the signal's number. A second signal ends the process at once, with the signal's default
// action. docs/checkpoints.md, "Stopping".
#pragma once

namespace moe {

// Installs the handlers (idempotent). Call after MPI_Init, which may install its own.
void stop_signal_install();

// The first stop signal received since installation, 0 if none. Async-signal-safe to set,
// cheap to read (one atomic load).
int stop_signal_pending();

// Started by a launcher (mpirun, srun), as stop_signal_install found: the standard streams are
// the launcher's pipes or pseudo-terminals, each forwarded on its own.
bool stop_signal_under_launcher();

// "SIGTERM", "SIGINT", "SIGUSR1", else "a signal".
const char* stop_signal_name(int signal_number);

// Test hook: forget a received signal (the handlers stay installed).
void stop_signal_reset();

}  // namespace moe

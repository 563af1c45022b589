#!/bin/bash
# Whether a stopped moe_rt job should be requeued, decided from what moe_rt left rather than from
# mpirun's exit status alone: Open MPI 4.1's mpirun, sent SIGUSR1 and then SIGTERM, can crash in
# PMIx_Finalize (exit 139) after every rank stopped cleanly (exit 138, checkpoint written).
#
# Sourced by moe_rt.sbatch. Also a command, for checking a finished job by hand:
#   bash scripts/slurm/stop_outcome.sh STATUS LOG
# prints the decision and exits 0 for "requeue", 1 otherwise. LOG is moe_rt's output: standard
# error for the stop message, standard output for the summary of a finished run.

# moe_rt_stop_checkpoint LOG: the checkpoint named by rank 0's stop message in LOG (moe_rt's
# standard error) when the run stopped on SIGUSR1 after a complete step; false when LOG has no
# such message or the checkpoint it names is not there (docs/checkpoints.md, "Stopping"):
#   moe_rt: stopped by SIGUSR1 after step 712; newest checkpoint 'DIR/step-00000712.h5'; ...
moe_rt_stop_checkpoint() {
  local line checkpoint
  line=$(grep -a "^moe_rt: stopped by SIGUSR1 after step [0-9]*; newest checkpoint '" "$1" \
    2>/dev/null | tail -n 1)
  [[ -n $line ]] || return 1
  checkpoint=${line#*newest checkpoint \'}
  checkpoint=${checkpoint%%\'*}
  [[ -f $checkpoint && -s $checkpoint ]] || return 1
  printf '%s\n' "$checkpoint"
}

# moe_rt_finished LOG: true when LOG (moe_rt's output) holds the run's summary ("summary: 200
# steps in 74.8 s, ..."), which rank 0 prints at every end, and no line saying the run stopped
# early (on a signal, a non-finite loss, a failed write): every step ran.
moe_rt_finished() {
  grep -aq "^summary: [0-9]* steps in " "$1" 2>/dev/null &&
    ! grep -aEq "^moe_rt: (stopped by|error:)" "$1" 2>/dev/null
}

# moe_rt_requeue_decision STATUS LOG: prints one line saying what happened; true when the job
# should be requeued: the ranks stopped on SIGUSR1 and left the checkpoint their message names,
# whatever mpirun's own exit status (138, or 139 when mpirun crashed while finishing). A run that
# printed its summary is finished whatever the status: the time limit's signal can reach mpirun
# after the last step, while it exits (138 then, with no stop message), and a requeued job
# could not resume (its checkpoint has run every step).
moe_rt_requeue_decision() {
  local status=$1 log=$2 checkpoint
  if ((status == 0)); then
    echo "moe_rt.sbatch: every step ran; not requeued"
    return 1
  fi
  if moe_rt_finished "$log"; then
    echo "moe_rt.sbatch: every step ran (mpirun exited $status while finishing); not requeued"
    return 1
  fi
  if ! checkpoint=$(moe_rt_stop_checkpoint "$log"); then
    echo "moe_rt.sbatch: mpirun exited $status and moe_rt reported no stop on SIGUSR1 with its" \
      "checkpoint in place; not requeued"
    return 1
  fi
  if ((status == 138)); then
    echo "moe_rt.sbatch: stopped on SIGUSR1, checkpoint $checkpoint; requeued"
  else
    echo "moe_rt.sbatch: the ranks stopped on SIGUSR1 (checkpoint $checkpoint) but mpirun" \
      "exited $status while finishing; requeued"
  fi
}

if [[ ${BASH_SOURCE[0]} == "$0" ]]; then
  if (($# != 2)) || [[ ! $1 =~ ^[0-9]+$ ]]; then
    echo "usage: stop_outcome.sh STATUS LOG" >&2
    exit 2
  fi
  moe_rt_requeue_decision "$1" "$2"
fi

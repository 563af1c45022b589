// The checkpoint file ("moe_rt.checkpoint", format version 1): HDF5 holding named float32 tensors,
// int32 tables and a header of root attributes, everything a run needs to continue after step s.
// io/ knows no model: the caller names the tensors (runtime/run/checkpoint.cpp: parameters, AdamW
// moments, routing bias and hash tables, with expert tensors named by global expert id).
//
// Crash safety: a checkpoint is written under a temporary name beside its final one, closed,
// flushed to disk (fsync), renamed, and its directory flushed. A kill at any moment leaves the
// final name either absent or naming a complete file; only final names count as checkpoints.
// Every tensor is stored with HDF5's Fletcher-32 checksum, which every read verifies.
// Layout and guarantees: docs/checkpoints.md.
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace moe {

inline constexpr const char* kCheckpointFormat = "moe_rt.checkpoint";
inline constexpr int32_t kCheckpointFormatVersion = 1;
inline constexpr const char* kCheckpointLockName = ".moe_rt.lock";

// An unusable checkpoint or checkpoint path. The message names the file and the problem.
class CheckpointError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The root attributes: what was run, and where it stopped.
struct CheckpointHeader {
  int64_t step = -1;         // the last completed step (0-based); a resumed run starts at +1
  int64_t global_batch = 0;  // sequences per step over all ranks (W·B)
  int world_size = 0;        // W of the run that wrote it (informational: any W may resume)
  int ep_size = 0;           // P of the run that wrote it (informational)
  uint64_t seed = 0;
  std::string model;            // preset name
  std::string config_text;      // the resolved configuration, as --print-config prints it
  std::string program_version;  // "moe_rt 0.1.0"
  std::string created;          // ISO-8601 local time with offset
  std::string stats_path;       // the statistics file of the run that wrote it, absolute; "" none
  std::string data_description;
  std::string data_checksum;  // the --data file's content checksum (data_checksum_text); "" none
  // The run that wrote it: a random id (16 hex digits) new for every start and every resume, and
  // when that run started (ns since the Unix epoch), which orders the runs of a folder. Older
  // checkpoints have neither ("" and 0).
  std::string run_id;
  int64_t run_started = 0;
  // The runs it continues, oldest first, "<run id>@<step>;..." (each resumed from that run's
  // checkpoint of that step); "" for a run started afresh. With run_id, it says which branch of
  // resumes the checkpoint lies on (checkpoint_on_branch).
  std::string lineage;
};

// Writes one checkpoint. Nothing appears under `final_path` until commit() succeeds.
class CheckpointWriter {
 public:
  // Creates "<final_path>.tmp" (replacing a stale one) and writes the header.
  // Throws CheckpointError.
  CheckpointWriter(std::string final_path, const CheckpointHeader& header);
  ~CheckpointWriter();  // removes the temporary file unless committed
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  // `name` is a path such as "param/dense/embed"; groups are created as needed. `values` of
  // write_ints must fill `dims` (at least one dimension) exactly. Throw CheckpointError.
  void write_floats(const std::string& name, std::span<const float> values);
  void write_ints(const std::string& name, const std::vector<hsize_t>& dims,
                  std::span<const int32_t> values);
  // Closes, fsyncs, renames to the final path and fsyncs the directory. Throws CheckpointError.
  void commit();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Reads one checkpoint: opening checks the format name and version and reads the header.
class CheckpointReader {
 public:
  explicit CheckpointReader(const std::string& path);  // throws CheckpointError
  ~CheckpointReader();
  CheckpointReader(CheckpointReader&&) noexcept;
  CheckpointReader& operator=(CheckpointReader&&) noexcept;

  const std::string& path() const;
  const CheckpointHeader& header() const;

  // Reads dataset `name` into `out`, which must match its element count exactly. Throws
  // CheckpointError for a missing dataset, another size, another element type (float32 and
  // int32 are never converted into each other) or a failed checksum.
  void read_floats(const std::string& name, std::span<float> out) const;
  void read_ints(const std::string& name, std::span<int32_t> out) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// "step-00000011.h5": the file name of the checkpoint taken at the end of step `step`. With a
// run id, "step-00000011.<run id>.h5": the name a run uses when the plain one holds another run's
// checkpoint (a branch resumed from an older checkpoint of a folder).
std::string checkpoint_file_name(int64_t step, const std::string& run_id = "");

// One complete checkpoint of a folder and the run that wrote it (from its header).
struct CheckpointEntry {
  int64_t step = -1;
  std::string path;
  std::string run_id;       // "" for a checkpoint older than run ids
  int64_t run_started = 0;  // 0 for those
  std::string lineage;
};

// The complete checkpoints of `dir` (final names only), oldest first, as (step, path).
std::vector<std::pair<int64_t, std::string>> checkpoint_list(const std::string& dir);

// The complete checkpoints of `dir` with their runs, ordered by the run's start, then by step.
// Reads every header; a file removed meanwhile (a live run's pruning) is left out, and the folder
// listed again. Throws CheckpointError naming a file whose header cannot be read.
std::vector<CheckpointEntry> checkpoint_catalog(const std::string& dir);

// Whether `e` lies on the branch of run `run_id` that continues `lineage`: written by that run, or
// by a run of its lineage at or before the step the branch continued from.
bool checkpoint_on_branch(const CheckpointEntry& e, const std::string& run_id,
                          const std::string& lineage);

// `path` itself when it is a file; for a directory the newest checkpoint of the run that started
// last (a folder may hold several runs, or branches of one). `note`, when given, gets one
// sentence naming that run and any checkpoints of other branches left in the folder ("" when
// there are none, or for a file). Throws CheckpointError when the path is missing, or the
// directory holds no complete checkpoint or one whose header cannot be read.
std::string checkpoint_resolve(const std::string& path, std::string* note = nullptr);

// Where run `run_id` writes its checkpoint of `step` in `dir`: checkpoint_file_name(step), unless
// a file of that name holds another run's checkpoint, which is never replaced: then the name with
// the run id.
std::string checkpoint_path_for(const std::string& dir, int64_t step, const std::string& run_id);

// Removes all but the newest `keep` (>= 1) checkpoints of `dir` on the branch of run `run_id`
// (checkpoint_on_branch with `lineage`), and temporary files that a killed writer left behind
// (CheckpointFolderLock: no other writer lives). Checkpoints of other branches and runs are never
// removed. Failures are returned as warnings, never thrown: a checkpoint that cannot be removed
// costs disk space, not correctness.
std::vector<std::string> checkpoint_prune(const std::string& dir, int keep,
                                          const std::string& run_id, const std::string& lineage);

// One live run owns a checkpoint folder: the lock file ".moe_rt.lock" in it (FileLock: released
// by the system however the run ends), holding a line that names the run. Creates the folder when
// missing, and removes it again if nothing was written to it.
// Throws CheckpointError as CheckpointFolderLock does when a live run holds folder `dir`; takes
// nothing. A resumed run that will write there checks it while it reads its options, before the
// live run's pruning can remove the checkpoint it resumes from.
void checkpoint_folder_check_free(const std::string& dir);

class CheckpointFolderLock {
 public:
  CheckpointFolderLock();
  // Throws CheckpointError naming the folder when another live run holds it (with the holder's
  // line), or when the folder cannot be created or locked.
  CheckpointFolderLock(const std::string& dir, const std::string& holder);
  ~CheckpointFolderLock();  // removes the lock file, and the folder if it created it and it is
                            // empty
  CheckpointFolderLock(CheckpointFolderLock&&) noexcept;
  CheckpointFolderLock& operator=(CheckpointFolderLock&&) noexcept;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace moe

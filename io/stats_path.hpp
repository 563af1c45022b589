// The statistics file's names on disk and its moves between them, for StatsWriter
// (io/stats_writer.cpp): the output path checked before anything is created; the file created
// under a staging name, locked; renamed over the target only by publish(); copied to a compaction
// name at close. No file a live writer holds (FileLock) is ever replaced or removed.
// docs/hdf5-schema.md, "Paths" and "Locks". Also, for the run, the default file name under runs/
// and the creation time the header records.
#pragma once

#include <string>

#include "io/file_lock.hpp"
#include "io/hdf5_check.hpp"
#include "io/stats_types.hpp"

namespace moe {

// The names one writer uses.
struct StatsFiles {
  std::string path;     // as the caller gave it; messages name it
  std::string target;   // what publish replaces: `path`, or the file a link at `path` points to
  std::string staging;  // target + ".new": the file until it is published
  std::string compact;  // target + ".compact": the copy made at close
};

StatsFiles stats_files(const std::string& path);

// The checks of StatsWriter::check_path (io/stats_writer.hpp), which calls this. Throws
// StatsPathError.
void stats_check_path(const std::string& path, bool overwrite);

// Creates files.staging, empty and locked into `lock`. A staging or compaction file left by a
// killed writer is removed first; one a live writer holds is left alone. Throws StatsPathError
// (another run is setting up the same path, or a system call failed).
void stats_staging_create(const StatsFiles& files, FileLock& lock);

// Renames files.staging over files.target, after locking the file there so that no other run
// writes or replaces it meanwhile. Throws StatsPathError when a live run writes the target, or
// when, without `overwrite`, a non-empty file appeared there since the path was checked.
void stats_publish(const StatsFiles& files, bool overwrite);

// Rewrites the closed, published file compressed: the live file's per-step datasets are stored
// unfiltered (docs/hdf5-schema.md, "Crash safety"), and the copy gives them `filters`
// (h5_copy_file). The copy (files.compact, created with `fcpl`, both files opened with `fapl`) is
// locked before it is written and renamed over the target, and its lock then replaces `lock`: the
// path always names a complete file, and a locked one until the writer releases it. Skipped with a
// warning on stderr when the disk lacks room or the copy fails; the file at the target is then
// unchanged. `after_copy` runs on the copy before it is closed (h5_copy_file).
void stats_compact(const StatsFiles& files, FileLock& lock, hid_t fcpl, hid_t fapl,
                   const H5CopyFilters& filters, void (*after_copy)(hid_t) = nullptr);

// "statistics file 'PATH': " + problem.
std::string stats_path_message(const std::string& path, const std::string& problem);

// "<runs_dir>/<model>-YYYYmmdd-HHMMSS.h5" in local time, or with "-2", "-3", ... before ".h5"
// when that name exists. Creates runs_dir (and parents) if missing, and reserves the name by
// creating it empty with O_EXCL, so two calls (or two runs) in the same second get two names.
// Throws StatsPathError if runs_dir cannot be created or is not writable.
std::string stats_default_path(const std::string& runs_dir, const std::string& model);

// The name of the link beside the default files that points at the newest of them: "latest.h5".
inline constexpr const char* kLatestStatsName = "latest.h5";

// Points `<folder of path>/latest.h5` at `path`, as a link holding the file's name alone (the
// folder can move). An older link is replaced atomically (a new link under a temporary name,
// latest.h5.<host>.<pid>, renamed over it), so a reader finds either the old run or the new one,
// never no file. A regular file, folder or anything else that is not a link at that name is the
// user's and is left alone. Returns "" when the link points at `path`, else the problem, for a
// warning: the run's own file is complete either way.
std::string stats_link_latest(const std::string& path);

// Now, as ISO-8601 local time with the UTC offset: "2026-05-09T07:35:25+02:00".
std::string stats_now_iso8601();

}  // namespace moe

// StatsWriter: creates the statistics file (docs/hdf5-schema.md) with every dataset up front (SWMR
// write mode allows no new objects or attributes), under a staging name and locked; appends one row
// per step once it is published; ends it cleanly after a failed append (the output-path checks, the
// staging file, publishing, compaction and the default file name are in stats_path.cpp).
// Layout, guarantees and chunk measurements: docs/hdf5-schema.md. Legend: N steps, L layers,
// E experts, W ranks, T traced tokens, num_phases timed phases.
#include "io/stats_writer.hpp"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <utility>

#include "io/stats_path.hpp"
#include "io/stats_schema.hpp"

namespace moe {
namespace {

namespace fs = std::filesystem;

// Rows per chunk: the largest power of two whose uncompressed chunk stays within chunk_bytes,
// at least 1 and at most max_chunk_rows.
hsize_t chunk_rows(hsize_t row_bytes, const StatsStorage& storage) {
  hsize_t rows = 1;
  while (rows * 2 * row_bytes <= static_cast<hsize_t>(storage.chunk_bytes) &&
         rows * 2 <= static_cast<hsize_t>(storage.max_chunk_rows)) {
    rows *= 2;
  }
  return rows;
}

// Dataset `name` of shape [0, row_dims...], unlimited along the first dimension, chunked as
// [chunk_rows, row_dims...] and unfiltered (compressed by the copy at close); `fill` (may be null)
// marks unwritten rows.
H5RowDataset column_create(hid_t file, const char* name, hid_t file_type, hid_t mem_type,
                           const std::vector<hsize_t>& row_dims, const StatsStorage& storage,
                           const void* fill) {
  hsize_t row_bytes = MOE_H5_CHECK(H5Tget_size(file_type));
  for (hsize_t d : row_dims) row_bytes *= d;
  std::vector<hsize_t> chunk = row_dims;
  chunk.insert(chunk.begin(), chunk_rows(row_bytes, storage));
  H5Id dcpl = h5_untimed_plist(H5P_DATASET_CREATE);
  MOE_H5_CHECK(H5Pset_chunk(dcpl.get(), static_cast<int>(chunk.size()), chunk.data()));
  if (fill != nullptr) MOE_H5_CHECK(H5Pset_fill_value(dcpl.get(), mem_type, fill));

  // The chunk being appended to must stay in the chunk cache, or every append would read it
  // back: room for a few chunks, at least HDF5's default 1 MiB.
  const size_t chunk_bytes = static_cast<size_t>(chunk[0] * row_bytes);
  H5Id dapl(MOE_H5_CHECK(H5Pcreate(H5P_DATASET_ACCESS)), H5Pclose);
  MOE_H5_CHECK(H5Pset_chunk_cache(dapl.get(), 521, std::max<size_t>(1 << 20, 4 * chunk_bytes),
                                  H5D_CHUNK_CACHE_W0_DEFAULT));
  return h5_row_dataset_create(file, name, file_type, mem_type, row_dims, dcpl.get(), dapl.get());
}

void require(bool ok, const std::string& what) {
  if (!ok) throw std::invalid_argument("StatsWriter: " + what);
}

// Span sizes of one appended row against the header's dimensions.
template <typename T>
void require_size(const char* call, const char* field, std::span<const T> values, size_t expected,
                  const char* shape) {
  require(values.size() == expected, std::string(call) + ": " + field + " has " +
                                         std::to_string(values.size()) + " values, expected " +
                                         shape + " = " + std::to_string(expected));
}

void validate_header(const StatsHeader& h) {
  require(h.num_layers >= 1 && h.num_experts >= 1 && h.top_k >= 1 && h.vocab >= 1 &&
              h.world_size >= 1 && h.ep_size >= 1,
          "num_layers, num_experts, top_k, vocab, world_size and ep_size must be >= 1");
  require(h.hash_layers >= 0 && h.hash_layers <= h.num_layers,
          "hash_layers must be in [0, num_layers]");
  require(h.trace_tokens >= 0, "trace_tokens must be >= 0");
  require(!h.phase_names.empty(), "phase_names must name at least one phase");
  require(h.layer_routing.size() == static_cast<size_t>(h.num_layers),
          "layer_routing needs num_layers entries");
  for (const std::string& kind : h.layer_routing) {
    require(kind == "hash" || kind == "topk" || kind == "forced",
            "layer_routing entry '" + kind + "' is not hash, topk or forced");
  }
  require(h.hash_tables.size() == static_cast<size_t>(h.hash_layers) * h.vocab * h.top_k,
          "hash_tables needs hash_layers * vocab * top_k entries");
  require(h.placement.empty() ||
              h.placement.size() == static_cast<size_t>(h.num_layers) * h.ep_size * h.num_experts,
          "placement needs num_layers * ep_size * num_experts entries (or none)");
  require(h.rank_host.empty() || h.rank_host.size() == static_cast<size_t>(h.world_size),
          "rank_host needs world_size entries (or none)");
  for (const int32_t host : h.rank_host) {
    require(host >= 0 && host < h.world_size, "rank_host entries must be in [0, world_size)");
  }
  for (size_t r = 0; r < h.shadow_rules.size(); ++r) {
    const std::string& name = h.shadow_rules[r];
    require(!name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos,
            "shadow_rules entry '" + name + "' is not a group name");
    for (size_t q = 0; q < r; ++q) {
      require(h.shadow_rules[q] != name, "shadow_rules entry '" + name + "' is given twice");
    }
  }
}

// [W] host of each rank: the header's, or host 0 for every rank.
std::vector<int32_t> rank_hosts(const StatsHeader& h) {
  return h.rank_host.empty() ? std::vector<int32_t>(h.world_size, 0) : h.rank_host;
}

void write_root_attributes(hid_t file, const StatsHeader& h) {
  h5_write_string_attr(file, "format", kStatsFormat);
  h5_write_int_attr(file, "format_version", kStatsFormatVersion);
  h5_write_string_attr(file, "program_version", h.program_version);
  h5_write_string_attr(file, "model", h.model);
  h5_write_string_attr(file, "config", h.config_text);
  h5_write_string_attr(file, "created", h.created);
  h5_write_string_attr(file, "data", h.data_description);
  if (h.eval) h5_write_string_attr(file, "val_data", h.val_data_description);
  h5_write_attr(file, "seed", H5T_STD_U64LE, H5T_NATIVE_UINT64, &h.seed);
  h5_write_attr(file, "entropy_floor", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, &h.entropy_floor);
  const std::pair<const char*, int> ints[] = {
      {"world_size", h.world_size},   {"ep_size", h.ep_size}, {"num_layers", h.num_layers},
      {"num_experts", h.num_experts}, {"top_k", h.top_k},     {"vocab", h.vocab},
      {"hash_layers", h.hash_layers}, {"seq_len", h.seq_len}, {"batch_per_rank", h.batch_per_rank}};
  for (const auto& [name, value] : ints) h5_write_int_attr(file, name, value);
  const std::vector<int32_t> hosts = rank_hosts(h);
  h5_write_int_attr(file, "num_hosts", 1 + *std::max_element(hosts.begin(), hosts.end()));
  if (!h.run_id.empty()) h5_write_string_attr(file, "run_id", h.run_id);
  // A run resumed from one that kept no statistics file (--stats none) has no predecessor to name,
  // but its rows still start after the checkpoint's step.
  if (!h.resumed_from.empty()) {
    h5_write_string_attr(file, "resumed_from", h.resumed_from);
    h5_write_string_attr(file, "resumed_from_run", h.resumed_from_run);
  }
  if (h.resumed_from_step >= 0) {
    h5_write_attr(file, "resumed_from_step", H5T_STD_I64LE, H5T_NATIVE_INT64, &h.resumed_from_step);
  }
}

// Latest format: checksummed metadata and the extensible-array chunk index that SWMR needs.
// HDF5's own file lock (flock) is off: the writer's FileLock keeps every other run out for the
// whole life of the file, and no reader can open it before SWMR mode, which starts before the file
// gets its name (publish). Where Linux emulates flock() with byte-range locks (NFS), HDF5's lock
// would collide with the writer's own. Readers keep HDF5's lock: it and FileLock never meet.
H5Id stats_fapl() {
  H5Id fapl(MOE_H5_CHECK(H5Pcreate(H5P_FILE_ACCESS)), H5Pclose);
  MOE_H5_CHECK(H5Pset_libver_bounds(fapl.get(), H5F_LIBVER_LATEST, H5F_LIBVER_LATEST));
  MOE_H5_CHECK(H5Pset_file_locking(fapl.get(), 0, 1));
  return fapl;
}

// The end of file that a closed HDF5 file's superblock (version 2 or 3, which
// H5F_LIBVER_LATEST writes, at offset 0) records, which readers require the file to reach; 0 when
// it cannot be read. The close after a failed append may record a larger end than the library
// reported before it (the metadata flushed at the close is allocated then).
hsize_t superblock_end(const std::string& path) {
  unsigned char sb[12 + 4 * 8];
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return 0;
  const size_t got = std::fread(sb, 1, sizeof sb, f);
  std::fclose(f);
  static const unsigned char kSignature[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};
  if (got < 12 || std::memcmp(sb, kSignature, 8) != 0 || (sb[8] != 2 && sb[8] != 3)) return 0;
  const size_t offset_size = sb[9];
  if (offset_size < 1 || offset_size > 8 || got < 12 + 3 * offset_size) return 0;
  // Base address, superblock extension address, end of file address: little-endian, each
  // offset_size bytes; the end is relative to the base.
  auto field = [&](size_t index) {
    hsize_t v = 0;
    for (size_t b = offset_size; b-- > 0;) v = (v << 8) | sb[12 + index * offset_size + b];
    return v;
  };
  return field(0) + field(2);
}

}  // namespace

struct StatsWriter::Impl {
  StatsFiles files;
  FileLock lock;  // on the file written, from its creation until close() has finished
  H5Id file;
  std::vector<H5RowDataset> steps;  // append order of StepRow's fields, /steps/step last
  std::vector<H5RowDataset> trace;  // append order of TraceRow's fields, /trace/step last
  std::vector<H5RowDataset> eval;   // append order of EvalRow's fields, /eval/step last
  size_t L = 0, E = 0, W = 0, T = 0, K = 0, num_phases = 0, R = 0;
  bool overwrite = false;
  bool compact_on_close = true;
  H5CopyFilters compact_filters;  // what the copy at close gives the per-step datasets
  bool published = false;         // publish() put the file at its path
  bool removed = false;           // close() found the path no longer naming the file written
  bool failed = false;            // an append threw: the file was ended then (end_after_failure)
  int64_t rows_done = 0, traces_done = 0, evals_done = 0;  // appends that returned

  // Root attributes, /layers, /perf/phases, every per-step dataset; then SWMR write mode.
  void create_objects(const StatsHeader& h, const StatsStorage& storage);

  // Datasets first: the file closes only when its last object does. Closing the file ends SWMR
  // write mode and clears the superblock's "open for writing" flags. After a failure the
  // datasets close quietly (their flush fails again), so that the file's close is still tried.
  void close_file(bool after_failure) {
    for (std::vector<H5RowDataset>* columns : {&steps, &trace, &eval}) {
      for (H5RowDataset& c : *columns) after_failure ? c.dset.close_quietly() : c.dset.close();
    }
    file.close();
  }

  // After a failed append the datasets may differ in length. The file is ended at once, since the
  // error usually ends the process without destructors (rank 0 aborts the job): closed, so no
  // "open for writing" flag stays behind, or removed when it holds no complete row. Says which.
  // A write that failed past the file's end (a full disk, a file-size limit) leaves the file
  // shorter than the end HDF5 allocated and recorded in the superblock, and readers refuse it as
  // truncated. The missing bytes belong to the failed row only: the file is extended to `end`
  // (a hole, which needs no disk space). "" when done or not needed, else what to run instead.
  std::string restore_end(const std::string& path, hsize_t end) {
    std::error_code ec;
    const uintmax_t size = fs::file_size(path, ec);
    if (ec || end == 0 || size >= end) return "";
    if (::truncate(path.c_str(), static_cast<off_t>(end)) == 0) return "";
    return "; it is " + std::to_string(end - size) + " bytes shorter than its recorded end (" +
           std::strerror(errno) + "): extend it with 'truncate -s " + std::to_string(end) + " " +
           path + "' to read it";
  }

  std::string end_after_failure() {
    // The end HDF5 allocated (H5Fget_filesize: the larger of the file's size and its allocated
    // end), read before the close, or the one the superblock records after it if larger.
    hsize_t end = 0;
    if (file.valid() && H5Fget_filesize(file.get(), &end) < 0) end = 0;
    H5Eclear2(H5E_DEFAULT);
    std::string closing;
    try {
      close_file(/*after_failure=*/true);
    } catch (const Hdf5Error& e) {
      closing = e.what();
    }
    const std::string& path = published ? files.target : files.staging;
    end = std::max(end, superblock_end(path));
    std::string outcome = "statistics file '" + files.path + "' ";
    try {
      if (rows_done == 0 && traces_done == 0 && evals_done == 0) {
        lock.remove(path);
        outcome += "held no complete step and was removed";
      } else if (closing.empty()) {
        outcome += "was closed with its " + std::to_string(rows_done) +
                   " complete step(s), not compacted" + restore_end(path, end);
      } else {
        outcome += "could not be closed either (" + closing +
                   "): it may still be marked as open for writing (h5clear -s clears that)" +
                   restore_end(path, end);
      }
    } catch (const FileLockError& e) {
      outcome += "held no complete step, but could not be removed: " + std::string(e.what());
    }
    lock.release();
    return outcome;
  }

  // After a failed creation, leaves no half-made file behind: closes what is open and removes
  // the staging file.
  void abandon_staging() {
    steps.clear(), trace.clear(), eval.clear();
    file.close_quietly();
    try {
      lock.remove(files.staging);
    } catch (const FileLockError&) {
      // Left as a leftover that the next run removes (stats_staging_create); the first error is
      // the one to report.
    }
    lock.release();
  }

  // Writes one row per column, flushing before the last column (the step index) and after it:
  // a step index on disk means the rest of its row is on disk too.
  void append_row(std::vector<H5RowDataset>& columns, const std::vector<const void*>& values,
                  int64_t& done) {
    require(!failed, "append after an earlier append failed (the file was ended then)");
    require(file.valid(), "append after close()");
    require(published, "append before publish()");
    h5_silence_auto_print();
    failed = true;
    try {
      for (size_t i = 0; i + 1 < columns.size(); ++i) h5_row_dataset_append(columns[i], values[i]);
      MOE_H5_CHECK(H5Fflush(file.get(), H5F_SCOPE_LOCAL));
      h5_row_dataset_append(columns.back(), values.back());
      MOE_H5_CHECK(H5Fflush(file.get(), H5F_SCOPE_LOCAL));
    } catch (const Hdf5Error& e) {
      throw Hdf5Error(std::string(e.what()) + "; " + end_after_failure());
    }
    failed = false;
    ++done;
  }
};

void StatsWriter::check_path(const std::string& path, bool overwrite) {
  stats_check_path(path, overwrite);
}

StatsWriter::StatsWriter(const std::string& path, bool overwrite, const StatsHeader& h,
                         const StatsStorage& storage)
    : impl_(std::make_unique<Impl>()) {
  check_path(path, overwrite);
  validate_header(h);
  require(storage.chunk_bytes >= 1 && storage.max_chunk_rows >= 1,
          "chunk_bytes and max_chunk_rows must be at least 1");
  require(storage.deflate_level >= 0 && storage.deflate_level <= 9,
          "deflate_level must be 0 to 9, not " + std::to_string(storage.deflate_level));
  h5_silence_auto_print();
  Impl& m = *impl_;
  m.files = stats_files(path);
  m.overwrite = overwrite;
  m.L = h.num_layers, m.E = h.num_experts, m.W = h.world_size;
  m.num_phases = h.phase_names.size(), m.T = h.trace_tokens, m.K = h.top_k;
  m.R = h.shadow_rules.size();
  m.compact_on_close = storage.compact_on_close;
  m.compact_filters = {storage.shuffle, static_cast<unsigned>(storage.deflate_level)};
  stats_staging_create(m.files, m.lock);
  try {
    const H5Id fapl = stats_fapl();
    const H5Id fcpl = h5_untimed_plist(H5P_FILE_CREATE);  // untimed root group
    // File space in pages: no metadata block smaller than a page straddles one. Linux acts on
    // SIGKILL only between the pages of a write(), so a block that straddled one could be left
    // half written by a kill during a flush, and its dataset unreadable (seen in 3 of 2000
    // kills). Free space is not kept in the file (persist 0); the chunks, unfiltered, are written
    // in place and never freed.
    MOE_H5_CHECK(H5Pset_file_space_strategy(fcpl.get(), H5F_FSPACE_STRATEGY_PAGE, 0, 1));
    MOE_H5_CHECK(H5Pset_file_space_page_size(fcpl.get(), kStatsFilePageBytes));
    // The staging file exists (empty, locked): HDF5 truncates it, keeping the lock's inode.
    m.file = H5Id(
        MOE_H5_CHECK(H5Fcreate(m.files.staging.c_str(), H5F_ACC_TRUNC, fcpl.get(), fapl.get())),
        H5Fclose);
    m.create_objects(h, storage);
  } catch (const Hdf5Error& e) {
    // HDF5's message names the call, not the file.
    m.abandon_staging();
    throw Hdf5Error("statistics file '" + m.files.path + "': cannot be created: " + e.what());
  } catch (...) {
    m.abandon_staging();
    throw;
  }
}

void StatsWriter::Impl::create_objects(const StatsHeader& h, const StatsStorage& storage) {
  Impl& m = *this;
  const hid_t f = m.file.get();

  write_root_attributes(f, h);
  H5Id gcpl = h5_untimed_plist(H5P_GROUP_CREATE);
  for (const char* group :
       {"/layers", "/hosts", "/steps", "/routing", "/perf", "/trace", "/eval"}) {
    if (std::string(group) == "/trace" && h.trace_tokens == 0) continue;
    if (std::string(group) == "/eval" && !h.eval) continue;
    H5Id(MOE_H5_CHECK(H5Gcreate2(f, group, H5P_DEFAULT, gcpl.get(), H5P_DEFAULT)), H5Gclose)
        .close();
  }
  h5_write_string_dataset(f, "/layers/routing", h.layer_routing);
  h5_write_fixed_dataset(f, "/layers/hash_table", H5T_STD_I32LE, H5T_NATIVE_INT32,
                         {hsize_t(h.hash_layers), hsize_t(h.vocab), hsize_t(h.top_k)},
                         h.hash_tables.data());
  if (!h.shadow_rules.empty()) {
    H5Id(MOE_H5_CHECK(H5Gcreate2(f, "/shadow", H5P_DEFAULT, gcpl.get(), H5P_DEFAULT)), H5Gclose)
        .close();
    for (const std::string& rule : h.shadow_rules) {
      const H5Id group(MOE_H5_CHECK(H5Gcreate2(f, ("/shadow/" + rule).c_str(), H5P_DEFAULT,
                                               gcpl.get(), H5P_DEFAULT)),
                       H5Gclose);
      h5_write_string_attr(group.get(), "rule", rule);
    }
  }
  h5_write_string_dataset(f, "/perf/phases", h.phase_names);
  if (!h.placement.empty()) {
    h5_write_fixed_dataset(f, "/layers/placement", H5T_STD_U8LE, H5T_NATIVE_UINT8,
                           {hsize_t(h.num_layers), hsize_t(h.ep_size), hsize_t(h.num_experts)},
                           h.placement.data());
  }
  const std::vector<int32_t> hosts = rank_hosts(h);
  h5_write_fixed_dataset(f, "/hosts/rank_host", H5T_STD_I32LE, H5T_NATIVE_INT32, {m.W},
                         hosts.data());

  const int64_t no_step = -1;  // fill value of the step columns: "row not written"
  const hid_t i64 = H5T_STD_I64LE, f64 = H5T_IEEE_F64LE, f32 = H5T_IEEE_F32LE;
  const hid_t n_i64 = H5T_NATIVE_INT64, n_f64 = H5T_NATIVE_DOUBLE, n_f32 = H5T_NATIVE_FLOAT;
  const hid_t i32 = H5T_STD_I32LE, n_i32 = H5T_NATIVE_INT32;
  auto add = [&](std::vector<H5RowDataset>& to, const char* name, hid_t type, hid_t mem,
                 std::vector<hsize_t> row, const void* fill = nullptr) {
    to.push_back(column_create(f, name, type, mem, row, storage, fill));
  };
  for (const char* name : {"/steps/loss", "/steps/balance_loss", "/steps/grad_norm", "/steps/lr",
                           "/steps/tokens_per_s", "/steps/step_time_s"}) {
    add(m.steps, name, f64, n_f64, {});
  }
  add(m.steps, "/routing/expert_load", i64, n_i64, {m.L, m.E});
  add(m.steps, "/routing/rank_load", i64, n_i64, {m.L, m.W});
  add(m.steps, "/routing/bias", f32, n_f32, {m.L, m.E});
  for (const char* name : {"/routing/load_variance", "/routing/max_violation", "/routing/load_cv",
                           "/routing/rank_overload", "/routing/balance_loss"}) {
    add(m.steps, name, f64, n_f64, {m.L});
  }
  add(m.steps, "/perf/phase_time", f64, n_f64, {m.W, m.num_phases});
  add(m.steps, "/routing/dispatch_rows", i64, n_i64, {m.L});
  add(m.steps, "/routing/cross_host_rows", i64, n_i64, {m.L});
  add(m.steps, "/routing/cross_host_tokens", i64, n_i64, {m.L});
  add(m.steps, "/steps/z_loss", f64, n_f64, {});
  add(m.steps, "/routing/z_loss", f64, n_f64, {m.L});
  add(m.steps, "/routing/dropped", i64, n_i64, {m.L, m.E});
  add(m.steps, "/routing/source_expert_load", i32, n_i32, {m.L, m.W, m.E});
  for (const std::string& rule : h.shadow_rules) {
    const std::string group = "/shadow/" + rule;
    add(m.steps, (group + "/expert_load").c_str(), i64, n_i64, {m.L, m.E});
    add(m.steps, (group + "/max_violation").c_str(), f64, n_f64, {m.L});
    add(m.steps, (group + "/bias").c_str(), f32, n_f32, {m.L, m.E});
  }
  add(m.steps, "/steps/step", i64, n_i64, {}, &no_step);
  if (m.T > 0) {
    for (const char* name : {"/trace/token_id", "/trace/position", "/trace/rank"}) {
      add(m.trace, name, i32, n_i32, {m.T});
    }
    add(m.trace, "/trace/experts", i32, n_i32, {m.L, m.T, m.K});
    add(m.trace, "/trace/weights", f32, n_f32, {m.L, m.T, m.K});
    add(m.trace, "/trace/experts_unbiased", i32, n_i32, {m.L, m.T, m.K});
    add(m.trace, "/trace/step", i64, n_i64, {}, &no_step);
  }
  if (h.eval) {
    add(m.eval, "/eval/loss", f64, n_f64, {});
    add(m.eval, "/eval/time_s", f64, n_f64, {});
    add(m.eval, "/eval/tokens", i64, n_i64, {});
    add(m.eval, "/eval/expert_load", i64, n_i64, {m.L, m.E});
    add(m.eval, "/eval/load_variance", f64, n_f64, {m.L});
    add(m.eval, "/eval/max_violation", f64, n_f64, {m.L});
    add(m.eval, "/eval/dropped", i64, n_i64, {m.L, m.E});
    add(m.eval, "/eval/step", i64, n_i64, {}, &no_step);
  }
  stats_write_config_attributes(f, h.config_values, h.config_text);
  stats_describe(f, StatsAxes{m.L, m.E, m.W, m.K, m.T});
  // From here on no object or attribute can be created; readers may open with SWMR.
  MOE_H5_CHECK(H5Fstart_swmr_write(f));
}

StatsWriter::StatsWriter(StatsWriter&&) noexcept = default;
StatsWriter& StatsWriter::operator=(StatsWriter&&) noexcept = default;

StatsWriter::~StatsWriter() {
  if (!impl_) return;
  try {
    close();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "warning: closing statistics file '%s' failed: %s\n",
                 impl_->files.path.c_str(), e.what());
  }
}

void StatsWriter::append(const StepRow& r) {
  const Impl& m = *impl_;
  const char* call = "append";
  require_size(call, "expert_load", r.expert_load, m.L * m.E, "L*E");
  require_size(call, "rank_load", r.rank_load, m.L * m.W, "L*W");
  require_size(call, "bias", r.bias, m.L * m.E, "L*E");
  for (const auto& [name, values] : {std::pair{"load_variance", r.load_variance},
                                     {"max_violation", r.max_violation},
                                     {"load_cv", r.load_cv},
                                     {"rank_overload", r.rank_overload},
                                     {"layer_balance_loss", r.layer_balance_loss},
                                     {"layer_z_loss", r.layer_z_loss}}) {
    require_size(call, name, values, m.L, "L");
  }
  require_size(call, "phase_times", r.phase_times, m.W * m.num_phases, "W*num_phases");
  require_size(call, "dispatch_rows", r.dispatch_rows, m.L, "L");
  require_size(call, "cross_host_rows", r.cross_host_rows, m.L, "L");
  require_size(call, "cross_host_tokens", r.cross_host_tokens, m.L, "L");
  require_size(call, "dropped", r.dropped, m.L * m.E, "L*E");
  require_size(call, "source_expert_load", r.source_expert_load, m.L * m.W * m.E, "L*W*E");
  require_size(call, "shadow_load", r.shadow_load, m.R * m.L * m.E, "R*L*E");
  require_size(call, "shadow_bias", r.shadow_bias, m.R * m.L * m.E, "R*L*E");
  require_size(call, "shadow_max_violation", r.shadow_max_violation, m.R * m.L, "R*L");
  std::vector<const void*> values = {&r.loss,
                                     &r.balance_loss,
                                     &r.grad_norm,
                                     &r.lr,
                                     &r.tokens_per_s,
                                     &r.step_time_s,
                                     r.expert_load.data(),
                                     r.rank_load.data(),
                                     r.bias.data(),
                                     r.load_variance.data(),
                                     r.max_violation.data(),
                                     r.load_cv.data(),
                                     r.rank_overload.data(),
                                     r.layer_balance_loss.data(),
                                     r.phase_times.data(),
                                     r.dispatch_rows.data(),
                                     r.cross_host_rows.data(),
                                     r.cross_host_tokens.data(),
                                     &r.z_loss,
                                     r.layer_z_loss.data(),
                                     r.dropped.data(),
                                     r.source_expert_load.data()};
  for (size_t q = 0; q < m.R; ++q) {
    values.push_back(r.shadow_load.data() + q * m.L * m.E);
    values.push_back(r.shadow_max_violation.data() + q * m.L);
    values.push_back(r.shadow_bias.data() + q * m.L * m.E);
  }
  values.push_back(&r.step);
  impl_->append_row(impl_->steps, values, impl_->rows_done);
}

void StatsWriter::append_trace(const TraceRow& r) {
  const Impl& m = *impl_;
  const char* call = "append_trace";
  require(m.T > 0, "append_trace: the header has trace_tokens = 0, so the file has no /trace");
  require_size(call, "token_id", r.token_id, m.T, "T");
  require_size(call, "position", r.position, m.T, "T");
  require_size(call, "rank", r.rank, m.T, "T");
  require_size(call, "experts", r.experts, m.L * m.T * m.K, "L*T*K");
  require_size(call, "weights", r.weights, m.L * m.T * m.K, "L*T*K");
  require_size(call, "experts_unbiased", r.experts_unbiased, m.L * m.T * m.K, "L*T*K");
  impl_->append_row(impl_->trace,
                    {r.token_id.data(), r.position.data(), r.rank.data(), r.experts.data(),
                     r.weights.data(), r.experts_unbiased.data(), &r.step},
                    impl_->traces_done);
}

void StatsWriter::append_eval(const EvalRow& r) {
  const Impl& m = *impl_;
  const char* call = "append_eval";
  require(!m.eval.empty(), "append_eval: the header has eval = false, so the file has no /eval");
  require_size(call, "expert_load", r.expert_load, m.L * m.E, "L*E");
  require_size(call, "load_variance", r.load_variance, m.L, "L");
  require_size(call, "max_violation", r.max_violation, m.L, "L");
  require_size(call, "dropped", r.dropped, m.L * m.E, "L*E");
  impl_->append_row(impl_->eval,
                    {&r.loss, &r.time_s, &r.tokens, r.expert_load.data(), r.load_variance.data(),
                     r.max_violation.data(), r.dropped.data(), &r.step},
                    impl_->evals_done);
}

int64_t StatsWriter::num_rows() const {
  return impl_->steps.empty() ? 0 : static_cast<int64_t>(impl_->steps.back().dims[0]);
}

int64_t StatsWriter::num_trace_rows() const {
  return impl_->trace.empty() ? 0 : static_cast<int64_t>(impl_->trace.back().dims[0]);
}

int64_t StatsWriter::num_eval_rows() const {
  return impl_->eval.empty() ? 0 : static_cast<int64_t>(impl_->eval.back().dims[0]);
}

const std::string& StatsWriter::path() const {
  return impl_->files.path;
}

bool StatsWriter::removed() const {
  return impl_->removed;
}

void StatsWriter::publish() {
  Impl& m = *impl_;
  require(m.lock.held() && m.file.valid(), "publish after close() or a failed append");
  if (m.published) return;
  stats_publish(m.files, m.overwrite);
  m.published = true;
}

void StatsWriter::close() {
  if (!impl_ || !impl_->lock.held()) return;
  Impl& m = *impl_;
  h5_silence_auto_print();
  // The lock goes last, however close() ends: until then no other run touches the file.
  struct Release {
    FileLock& lock;
    ~Release() { lock.release(); }
  } release{m.lock};
  if (!m.published) {
    // Set-up did not finish: the file never had its name, and the target stays as it was.
    m.steps.clear(), m.trace.clear(), m.eval.clear();
    m.file.close_quietly();
    m.lock.remove(m.files.staging);
    return;
  }
  m.close_file(/*after_failure=*/false);
  // Removed (or replaced) during the run: nothing to compact, and nothing to say "written" of.
  m.removed = !m.lock.names(m.files.target);
  if (!m.removed && m.compact_on_close) {
    stats_compact(m.files, m.lock, h5_untimed_plist(H5P_FILE_CREATE).get(), stats_fapl().get(),
                  m.compact_filters, stats_reattach_scales);
  }
}

}  // namespace moe

// CheckpointWriter and CheckpointReader: the HDF5 checkpoint file, its crash-safe commit
// (temporary name, fsync, rename, directory fsync), and finding and pruning checkpoints in a
// directory. docs/checkpoints.md.
#include "io/checkpoint_file.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string_view>
#include <tuple>
#include <utility>

#include "io/file_lock.hpp"
#include "io/hdf5_check.hpp"
#include "io/input_file.hpp"

namespace moe {
namespace {

namespace fs = std::filesystem;

constexpr const char* kTmpSuffix = ".tmp";
constexpr hsize_t kMaxChunkElements = hsize_t{1} << 20;  // 4 MiB chunks of float32

CheckpointError file_error(const std::string& path, const std::string& problem) {
  return CheckpointError("checkpoint '" + path + "': " + problem);
}

// fsync of a file or a directory by path.
void sync_path(const std::string& path, bool directory) {
  const int fd = ::open(path.c_str(), (directory ? O_RDONLY | O_DIRECTORY : O_RDONLY) | O_CLOEXEC);
  if (fd < 0 || ::fsync(fd) != 0) {
    const std::string reason = std::strerror(errno);
    if (fd >= 0) ::close(fd);
    throw file_error(path, "cannot flush to disk: " + reason);
  }
  ::close(fd);
}

H5Id checkpoint_fapl() {
  H5Id fapl(MOE_H5_CHECK(H5Pcreate(H5P_FILE_ACCESS)), H5Pclose);
  MOE_H5_CHECK(H5Pset_libver_bounds(fapl.get(), H5F_LIBVER_V110, H5F_LIBVER_LATEST));
  MOE_H5_CHECK(H5Pset_file_locking(fapl.get(), 1, 1));
  return fapl;
}

// A dataset of `count` elements of `file_type`: chunked with the Fletcher-32 checksum when it
// holds data (HDF5 checks it on every read), contiguous when empty (nothing to check).
H5Id create_dataset(hid_t file, const std::string& name, hid_t file_type,
                    const std::vector<hsize_t>& dims) {
  hsize_t count = 1;
  for (hsize_t d : dims) count *= d;
  H5Id space(MOE_H5_CHECK(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr)),
             H5Sclose);
  H5Id dcpl = h5_untimed_plist(H5P_DATASET_CREATE);
  if (count > 0) {
    // Chunks along the first dimension, whole rows each, at most about kMaxChunkElements.
    std::vector<hsize_t> chunk = dims;
    const hsize_t row = count / dims[0];
    chunk[0] =
        std::max<hsize_t>(1, std::min(dims[0], kMaxChunkElements / std::max<hsize_t>(1, row)));
    MOE_H5_CHECK(H5Pset_chunk(dcpl.get(), static_cast<int>(chunk.size()), chunk.data()));
    MOE_H5_CHECK(H5Pset_fletcher32(dcpl.get()));
  }
  H5Id lcpl(MOE_H5_CHECK(H5Pcreate(H5P_LINK_CREATE)), H5Pclose);
  MOE_H5_CHECK(H5Pset_create_intermediate_group(lcpl.get(), 1));
  return H5Id(MOE_H5_CHECK(H5Dcreate2(file, name.c_str(), file_type, space.get(), lcpl.get(),
                                      dcpl.get(), H5P_DEFAULT)),
              H5Dclose);
}

std::string read_string_attr(hid_t loc, const char* name) {
  H5Id attr(MOE_H5_CHECK(H5Aopen(loc, name, H5P_DEFAULT)), H5Aclose);
  const H5Id type = h5_string_type();
  char* text = nullptr;
  MOE_H5_CHECK(H5Aread(attr.get(), type.get(), &text));
  std::string value = text != nullptr ? text : "";
  H5free_memory(text);
  return value;
}

template <class T> T read_scalar_attr(hid_t loc, const char* name, hid_t mem_type) {
  H5Id attr(MOE_H5_CHECK(H5Aopen(loc, name, H5P_DEFAULT)), H5Aclose);
  T value{};
  MOE_H5_CHECK(H5Aread(attr.get(), mem_type, &value));
  return value;
}

// "2 x 3 x 4": a shape in messages.
std::string shape_text(const std::vector<hsize_t>& dims) {
  std::string text;
  for (hsize_t d : dims) text += (text.empty() ? "" : " x ") + std::to_string(d);
  return text.empty() ? "() (a tensor needs at least one dimension)" : text;
}

// "float32", "int32", "uint8", ...: a stored element type in messages.
std::string type_text(hid_t type) {
  const std::string bits = std::to_string(8 * H5Tget_size(type));
  switch (H5Tget_class(type)) {
    case H5T_FLOAT:
      return "float" + bits;
    case H5T_INTEGER:
      return (H5Tget_sign(type) == H5T_SGN_NONE ? "uint" : "int") + bits;
    default:
      return "non-numeric";
  }
}

// Whether `name` ("a/b/c") is a dataset of `file`. H5Lexists fails, rather than answering no,
// when a group on the way is missing or is a dataset, so the path is checked a link at a time.
bool has_dataset(hid_t file, const std::string& name) {
  for (size_t end = name.find('/', 1);; end = name.find('/', end + 1)) {
    const std::string prefix = name.substr(0, end);
    if (MOE_H5_CHECK(H5Lexists(file, prefix.c_str(), H5P_DEFAULT)) <= 0) return false;
    const H5Id object(MOE_H5_CHECK(H5Oopen(file, prefix.c_str(), H5P_DEFAULT)), H5Oclose);
    const H5I_type_t type = H5Iget_type(object.get());
    if (end == std::string::npos) return type == H5I_DATASET;
    if (type != H5I_GROUP) return false;
  }
}

constexpr size_t kRunIdDigits = 16;

bool is_run_id(std::string_view id) {
  return id.size() == kRunIdDigits && std::all_of(id.begin(), id.end(), [](char c) {
           return std::isxdigit(c) && !std::isupper(c);
         });
}

// The step of a final checkpoint name, "step-NNNNNNNN.h5" or "step-NNNNNNNN.<run id>.h5", or -1
// for any other name.
int64_t step_of_name(const std::string& name) {
  int64_t step = -1;
  int end = 0;
  if (std::sscanf(name.c_str(), "step-%" SCNd64 "%n", &step, &end) != 1 || step < 0) return -1;
  const std::string rest = name.substr(static_cast<size_t>(end));
  const std::string id = rest.size() == 1 + kRunIdDigits + 3 ? rest.substr(1, kRunIdDigits) : "";
  return name == checkpoint_file_name(step, is_run_id(id) ? id : "") ? step : -1;
}

// The runs a lineage names, each with the step its successor continued from.
std::vector<std::pair<std::string, int64_t>> lineage_entries(const std::string& lineage) {
  std::vector<std::pair<std::string, int64_t>> out;
  size_t begin = 0;
  while (begin < lineage.size()) {
    size_t end = lineage.find(';', begin);
    if (end == std::string::npos) end = lineage.size();
    const std::string entry = lineage.substr(begin, end - begin);
    const size_t at = entry.rfind('@');
    if (at != std::string::npos) {
      out.emplace_back(entry.substr(0, at), std::strtoll(entry.c_str() + at + 1, nullptr, 10));
    }
    begin = end + 1;
  }
  return out;
}

// "run 0123456789abcdef", or "checkpoints without a run id" for older ones.
std::string run_text(const std::string& run_id) {
  return run_id.empty() ? "checkpoints without a run id" : "run " + run_id;
}

}  // namespace

// ---- writing
// --------------------------------------------------------------------------------------

struct CheckpointWriter::Impl {
  std::string final_path, tmp_path;
  H5Id file;
  bool committed = false;

  // Runs an HDF5 step, turning its Hdf5Error into a CheckpointError naming the file.
  template <class F> void guard(F&& f) {
    try {
      h5_silence_auto_print();
      f();
    } catch (const Hdf5Error& e) {
      throw file_error(final_path, std::string("writing failed: ") + e.what());
    }
  }
};

CheckpointWriter::CheckpointWriter(std::string final_path, const CheckpointHeader& h)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.final_path = std::move(final_path);
  m.tmp_path = m.final_path + kTmpSuffix;
  m.guard([&] {
    const H5Id fcpl = h5_untimed_plist(H5P_FILE_CREATE);
    m.file = H5Id(MOE_H5_CHECK(H5Fcreate(m.tmp_path.c_str(), H5F_ACC_TRUNC, fcpl.get(),
                                         checkpoint_fapl().get())),
                  H5Fclose);
    const hid_t f = m.file.get();
    h5_write_string_attr(f, "format", kCheckpointFormat);
    h5_write_int_attr(f, "format_version", kCheckpointFormatVersion);
    h5_write_attr(f, "step", H5T_STD_I64LE, H5T_NATIVE_INT64, &h.step);
    h5_write_attr(f, "global_batch", H5T_STD_I64LE, H5T_NATIVE_INT64, &h.global_batch);
    h5_write_int_attr(f, "world_size", h.world_size);
    h5_write_int_attr(f, "ep_size", h.ep_size);
    h5_write_attr(f, "seed", H5T_STD_U64LE, H5T_NATIVE_UINT64, &h.seed);
    h5_write_string_attr(f, "model", h.model);
    h5_write_string_attr(f, "config", h.config_text);
    h5_write_string_attr(f, "program_version", h.program_version);
    h5_write_string_attr(f, "created", h.created);
    h5_write_string_attr(f, "stats_path", h.stats_path);
    h5_write_string_attr(f, "data", h.data_description);
    h5_write_string_attr(f, "data_checksum", h.data_checksum);
    h5_write_string_attr(f, "run_id", h.run_id);
    h5_write_attr(f, "run_started", H5T_STD_I64LE, H5T_NATIVE_INT64, &h.run_started);
    h5_write_string_attr(f, "lineage", h.lineage);
  });
}

CheckpointWriter::~CheckpointWriter() {
  if (!impl_ || impl_->committed) return;
  impl_->file.close_quietly();
  std::error_code ec;
  fs::remove(impl_->tmp_path, ec);
}

void CheckpointWriter::write_floats(const std::string& name, std::span<const float> values) {
  impl_->guard([&] {
    const H5Id d = create_dataset(impl_->file.get(), name, H5T_IEEE_F32LE, {values.size()});
    if (!values.empty()) {
      MOE_H5_CHECK(
          H5Dwrite(d.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()));
    }
  });
}

void CheckpointWriter::write_ints(const std::string& name, const std::vector<hsize_t>& dims,
                                  std::span<const int32_t> values) {
  // HDF5 takes as many values as the shape holds: a shorter span would be read past its end.
  hsize_t count = 1;
  for (hsize_t d : dims) count *= d;
  if (dims.empty() || count != values.size()) {
    throw file_error(impl_->final_path, "dataset '" + name + "': " + std::to_string(values.size()) +
                                            " values do not fill the shape " + shape_text(dims));
  }
  impl_->guard([&] {
    const H5Id d = create_dataset(impl_->file.get(), name, H5T_STD_I32LE, dims);
    if (!values.empty()) {
      MOE_H5_CHECK(
          H5Dwrite(d.get(), H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()));
    }
  });
}

void CheckpointWriter::commit() {
  Impl& m = *impl_;
  m.guard([&] { m.file.close(); });
  sync_path(m.tmp_path, false);
  std::error_code ec;
  fs::rename(m.tmp_path, m.final_path, ec);
  if (ec)
    throw file_error(m.final_path, "cannot rename the written file into place: " + ec.message());
  m.committed = true;
  const fs::path dir = fs::path(m.final_path).parent_path();
  sync_path(dir.empty() ? "." : dir.string(), true);
}

// ---- reading
// --------------------------------------------------------------------------------------

struct CheckpointReader::Impl {
  std::string path;
  H5Id file;
  CheckpointHeader header;

  // `mem_type` is float32 or int32; the stored type must be that too, since HDF5 would
  // otherwise convert between them (and round or clamp) instead of failing.
  template <class T> void read(const std::string& name, hid_t mem_type, std::span<T> out) const {
    try {
      h5_silence_auto_print();
      if (!has_dataset(file.get(), name)) {
        throw file_error(path, "has no dataset '" + name +
                                   "' (a checkpoint of another model or configuration?)");
      }
      H5Id d(MOE_H5_CHECK(H5Dopen2(file.get(), name.c_str(), H5P_DEFAULT)), H5Dclose);
      H5Id stored(MOE_H5_CHECK(H5Dget_type(d.get())), H5Tclose);
      if (type_text(stored.get()) != type_text(mem_type)) {
        throw file_error(path, "dataset '" + name + "' holds " + type_text(stored.get()) +
                                   " values, not " + type_text(mem_type) +
                                   " (a checkpoint of another model or configuration?)");
      }
      H5Id space(MOE_H5_CHECK(H5Dget_space(d.get())), H5Sclose);
      const hssize_t count = MOE_H5_CHECK(H5Sget_simple_extent_npoints(space.get()));
      if (static_cast<size_t>(count) != out.size()) {
        throw file_error(path, "dataset '" + name + "' holds " + std::to_string(count) +
                                   " values, this model needs " + std::to_string(out.size()) +
                                   " (a checkpoint of another model or configuration?)");
      }
      if (count > 0) {
        MOE_H5_CHECK(H5Dread(d.get(), mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data()));
      }
    } catch (const Hdf5Error& e) {
      throw file_error(path, "dataset '" + name + "' cannot be read (corrupt file?): " + e.what());
    }
  }
};

CheckpointReader::CheckpointReader(const std::string& path) : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.path = path;
  if (const std::string problem = input_file_problem(path); !problem.empty()) {
    throw file_error(path, problem);
  }
  h5_silence_auto_print();
  try {
    if (MOE_H5_CHECK(H5Fis_hdf5(path.c_str())) <= 0) {
      throw file_error(path, "is not an HDF5 file");
    }
  } catch (const Hdf5Error&) {
    throw file_error(path, "is not an HDF5 file");
  }
  try {
    m.file = H5Id(MOE_H5_CHECK(H5Fopen(path.c_str(), H5F_ACC_RDONLY, checkpoint_fapl().get())),
                  H5Fclose);
  } catch (const Hdf5Error& e) {
    throw file_error(path, std::string("cannot be opened (truncated or damaged?): ") + e.what());
  }
  const hid_t f = m.file.get();
  CheckpointHeader& h = m.header;
  try {
    if (MOE_H5_CHECK(H5Aexists(f, "format")) <= 0 ||
        read_string_attr(f, "format") != kCheckpointFormat) {
      throw file_error(path, std::string("is not a moe_rt checkpoint (no format attribute '") +
                                 kCheckpointFormat + "')");
    }
    const int32_t version = read_scalar_attr<int32_t>(f, "format_version", H5T_NATIVE_INT32);
    if (version != kCheckpointFormatVersion) {
      throw file_error(path, "has format version " + std::to_string(version) +
                                 "; this moe_rt reads version " +
                                 std::to_string(kCheckpointFormatVersion));
    }
    h.step = read_scalar_attr<int64_t>(f, "step", H5T_NATIVE_INT64);
    h.global_batch = read_scalar_attr<int64_t>(f, "global_batch", H5T_NATIVE_INT64);
    h.world_size = read_scalar_attr<int32_t>(f, "world_size", H5T_NATIVE_INT32);
    h.ep_size = read_scalar_attr<int32_t>(f, "ep_size", H5T_NATIVE_INT32);
    h.seed = read_scalar_attr<uint64_t>(f, "seed", H5T_NATIVE_UINT64);
    h.model = read_string_attr(f, "model");
    h.config_text = read_string_attr(f, "config");
    h.program_version = read_string_attr(f, "program_version");
    h.created = read_string_attr(f, "created");
    h.stats_path = read_string_attr(f, "stats_path");
    h.data_description = read_string_attr(f, "data");
    // Absent from checkpoints written before runs had ids and data checksums.
    if (MOE_H5_CHECK(H5Aexists(f, "run_id")) > 0) h.run_id = read_string_attr(f, "run_id");
    if (MOE_H5_CHECK(H5Aexists(f, "run_started")) > 0) {
      h.run_started = read_scalar_attr<int64_t>(f, "run_started", H5T_NATIVE_INT64);
    }
    if (MOE_H5_CHECK(H5Aexists(f, "lineage")) > 0) h.lineage = read_string_attr(f, "lineage");
    if (MOE_H5_CHECK(H5Aexists(f, "data_checksum")) > 0) {
      h.data_checksum = read_string_attr(f, "data_checksum");
    }
  } catch (const Hdf5Error& e) {
    throw file_error(path, std::string("has a damaged or incomplete header: ") + e.what());
  }
  if (h.step < 0 || h.global_batch < 1) {
    throw file_error(path, "has an invalid header (step " + std::to_string(h.step) +
                               ", global batch " + std::to_string(h.global_batch) + ")");
  }
  if (!h.run_id.empty() && !is_run_id(h.run_id)) {
    throw file_error(path, "has an invalid header (run id '" + h.run_id.substr(0, 40) +
                               "' is not 16 hex digits)");
  }
}

CheckpointReader::~CheckpointReader() = default;
CheckpointReader::CheckpointReader(CheckpointReader&&) noexcept = default;
CheckpointReader& CheckpointReader::operator=(CheckpointReader&&) noexcept = default;

const std::string& CheckpointReader::path() const {
  return impl_->path;
}
const CheckpointHeader& CheckpointReader::header() const {
  return impl_->header;
}

void CheckpointReader::read_floats(const std::string& name, std::span<float> out) const {
  impl_->read(name, H5T_NATIVE_FLOAT, out);
}

void CheckpointReader::read_ints(const std::string& name, std::span<int32_t> out) const {
  impl_->read(name, H5T_NATIVE_INT32, out);
}

// ---- directories
// ----------------------------------------------------------------------------------

std::string checkpoint_file_name(int64_t step, const std::string& run_id) {
  char name[40];
  std::snprintf(name, sizeof name, "step-%08" PRId64, step);
  return std::string(name) + (run_id.empty() ? "" : "." + run_id) + ".h5";
}

std::vector<std::pair<int64_t, std::string>> checkpoint_list(const std::string& dir) {
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir, ec)) {
    const int64_t step = step_of_name(entry.path().filename().string());
    if (step >= 0 && entry.is_regular_file(ec)) found.emplace_back(step, entry.path().string());
  }
  std::sort(found.begin(), found.end());
  return found;
}

std::vector<CheckpointEntry> checkpoint_catalog(const std::string& dir) {
  std::vector<CheckpointEntry> entries;
  // A checkpoint removed since the listing (a live run writing there pruned it) is not part of
  // the folder; the newer one that replaced it may be missing from the listing, so the folder is
  // listed again, a few times at most.
  bool vanished = false;
  for (int attempt = 1; attempt == 1 || (vanished && attempt <= 5); ++attempt) {
    entries.clear();
    vanished = false;
    for (const auto& [step, path] : checkpoint_list(dir)) {
      CheckpointHeader h;
      try {
        h = CheckpointReader(path).header();
      } catch (const CheckpointError&) {
        std::error_code ec;
        if (fs::exists(path, ec) || ec) throw;
        vanished = true;
        continue;
      }
      if (h.step != step) {
        throw file_error(path, "its header says step " + std::to_string(h.step) +
                                   ", its name another: a renamed checkpoint?");
      }
      entries.push_back({step, path, h.run_id, h.run_started, h.lineage});
    }
  }
  std::stable_sort(entries.begin(), entries.end(), [](const auto& a, const auto& b) {
    return std::tie(a.run_started, a.run_id, a.step) < std::tie(b.run_started, b.run_id, b.step);
  });
  return entries;
}

bool checkpoint_on_branch(const CheckpointEntry& e, const std::string& run_id,
                          const std::string& lineage) {
  if (e.run_id == run_id) return true;
  for (const auto& [run, step] : lineage_entries(lineage)) {
    if (e.run_id == run && e.step <= step) return true;
  }
  return false;
}

std::string checkpoint_resolve(const std::string& path, std::string* note) {
  if (note != nullptr) note->clear();
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  if (!fs::exists(status)) throw file_error(path, "no such file or directory");
  if (!fs::is_directory(status)) return path;
  if (ec) throw file_error(path, "cannot be inspected: " + ec.message());
  const std::vector<CheckpointEntry> all = checkpoint_catalog(path);
  if (all.empty()) {
    throw file_error(path, "the directory holds no complete checkpoint (no step-NNNNNNNN.h5)");
  }
  // The run that started last, its newest checkpoint: the catalog's last entry.
  const CheckpointEntry& newest = all.back();
  if (note != nullptr) {
    int64_t others = 0;
    const CheckpointEntry* other_newest = nullptr;
    for (const CheckpointEntry& e : all) {
      if (checkpoint_on_branch(e, newest.run_id, newest.lineage)) continue;
      ++others;
      if (other_newest == nullptr || e.step > other_newest->step) other_newest = &e;
    }
    const bool several = std::any_of(all.begin(), all.end(),
                                     [&](const auto& e) { return e.run_id != newest.run_id; });
    if (several) {
      *note = "'" + path + "' holds checkpoints of more than one run: continuing " +
              run_text(newest.run_id) + " (the one started last) from its newest, '" + newest.path +
              "'";
      if (others > 0) {
        *note += "; " + std::to_string(others) + " checkpoint(s) of other branches are kept " +
                 "there (the newest: step " + std::to_string(other_newest->step) + " of " +
                 run_text(other_newest->run_id) + ", '" + other_newest->path +
                 "'): name a file to continue one of them";
      }
    }
  }
  return newest.path;
}

std::string checkpoint_path_for(const std::string& dir, int64_t step, const std::string& run_id) {
  const std::string plain = (fs::path(dir) / checkpoint_file_name(step)).string();
  std::error_code ec;
  if (!fs::exists(plain, ec)) return plain;
  try {
    if (CheckpointReader(plain).header().run_id == run_id) return plain;
  } catch (const CheckpointError&) {
    // Not a checkpoint this run can read: not replaced either.
  }
  return (fs::path(dir) / checkpoint_file_name(step, run_id)).string();
}

std::vector<std::string> checkpoint_prune(const std::string& dir, int keep,
                                          const std::string& run_id, const std::string& lineage) {
  std::vector<std::string> warnings;
  auto remove = [&](const fs::path& p) {
    std::error_code ec;
    if (!fs::remove(p, ec) && ec) {
      warnings.push_back("cannot remove old checkpoint '" + p.string() + "': " + ec.message());
    }
  };
  std::vector<std::pair<int64_t, std::string>> branch;
  try {
    for (const CheckpointEntry& e : checkpoint_catalog(dir)) {
      if (checkpoint_on_branch(e, run_id, lineage)) branch.emplace_back(e.step, e.path);
    }
  } catch (const CheckpointError& e) {
    // A file the catalog cannot read is no one's to remove: nothing is pruned this time.
    warnings.push_back(std::string("old checkpoints not pruned: ") + e.what());
    branch.clear();
  }
  std::sort(branch.begin(), branch.end());
  for (size_t i = 0; i + static_cast<size_t>(std::max(1, keep)) < branch.size(); ++i) {
    remove(branch[i].second);
  }
  std::error_code ec;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.size() > 3 && name.ends_with(kTmpSuffix) &&
        step_of_name(name.substr(0, name.size() - std::strlen(kTmpSuffix))) >= 0) {
      remove(entry.path());
    }
  }
  return warnings;
}

// ---- the folder's lock
// ------------------------------------------------------------------------------

namespace {

// The refusal of a folder whose lock file `lock_path` a live run holds, with the holder's line.
CheckpointError folder_in_use(const std::string& dir, const std::string& lock_path) {
  std::string other;
  std::ifstream in(lock_path);
  std::getline(in, other);
  return CheckpointError("checkpoint folder '" + dir + "' is in use by another live run (" +
                         (other.empty() ? lock_path + " is locked" : other) +
                         "): wait for it to end, or choose another --checkpoint-dir");
}

}  // namespace

void checkpoint_folder_check_free(const std::string& dir) {
  const std::string lock_path = (fs::path(dir) / kCheckpointLockName).string();
  try {
    if (FileLock::is_held(lock_path)) throw folder_in_use(dir, lock_path);
  } catch (const FileLockError& e) {
    throw CheckpointError("checkpoint folder '" + dir + "': cannot inspect its lock: " + e.what());
  }
}

struct CheckpointFolderLock::Impl {
  std::string dir, path;
  FileLock lock;
  bool created = false;  // the folder did not exist before
};

CheckpointFolderLock::CheckpointFolderLock(const std::string& dir, const std::string& holder)
    : impl_(std::make_unique<Impl>()) {
  std::error_code ec;
  impl_->dir = dir;
  impl_->created = fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir)) {
    throw CheckpointError("checkpoint folder '" + dir + "': cannot create it" +
                          (ec ? ": " + ec.message() : std::string(": not a directory")));
  }
  if (::access(dir.c_str(), W_OK | X_OK) != 0) {
    throw CheckpointError("checkpoint folder '" + dir + "' is not writable");
  }
  impl_->path = (fs::path(dir) / kCheckpointLockName).string();
  try {
    if (FileLock::create(impl_->path, impl_->lock) == FileLock::Outcome::kBusy) {
      throw folder_in_use(dir, impl_->path);
    }
    impl_->lock.write_text(holder + "\n");
  } catch (const FileLockError& e) {
    throw CheckpointError("checkpoint folder '" + dir + "': cannot lock it: " + e.what());
  }
}

CheckpointFolderLock::~CheckpointFolderLock() {
  if (!impl_ || !impl_->lock.held()) return;
  try {
    impl_->lock.remove(impl_->path);
  } catch (const FileLockError&) {
    // Left behind: the next run finds it unlocked and removes it (FileLock::create).
  }
  impl_->lock.release();
  // A folder this run created and left empty (set-up failed, or it stopped before its first
  // checkpoint) goes too; fs::remove leaves a folder that holds anything.
  std::error_code ec;
  if (impl_->created) fs::remove(impl_->dir, ec);
}

CheckpointFolderLock::CheckpointFolderLock() = default;
CheckpointFolderLock::CheckpointFolderLock(CheckpointFolderLock&&) noexcept = default;
CheckpointFolderLock& CheckpointFolderLock::operator=(CheckpointFolderLock&&) noexcept = default;

}  // namespace moe

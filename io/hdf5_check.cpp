// Out-of-line part of MOE_H5_CHECK (HDF5's error stack as one short line of text), H5Id, and the
// small write and copy helpers of io/hdf5_check.hpp.
#include "io/hdf5_check.hpp"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <utility>

namespace moe {
namespace {

std::atomic<bool> g_close_failed{false};

// HDF5 closes at exit every file still open (H5_term_library, registered with atexit). A file whose
// close already failed (a full disk during the flush of a statistics row) is left by HDF5 1.10 in a
// state where that second close crashes the process ("can't destroy cache: slist already
// enabled?", then a segmentation fault in H5F__close_cb), turning a documented error exit into a
// crash. Every file moe_rt keeps it closes itself, and one it could not close is abandoned on
// purpose (StatsWriter, end_after_failure), so the library is told not to clean up at exit. This
// runs before main, before any other HDF5 call; should it fail (the library already started), HDF5
// keeps its exit handler, as before.
const bool g_no_exit_cleanup = H5dont_atexit() >= 0;

struct StackText {
  std::string outermost;  // the first entry's description: what the called function says failed
  std::string innermost;  // the last entry's description: the cause (e.g. the system's errno)
};

// H5Ewalk2 callback: keeps the first and the last entry's description.
herr_t h5_collect_entry(unsigned depth, const H5E_error2_t* entry, void* client) {
  auto* text = static_cast<StackText*>(client);
  // Some descriptions embed a ctime() string and its newline; the message stays one line.
  std::string desc = entry->desc ? entry->desc : "";
  std::replace(desc.begin(), desc.end(), '\n', ' ');
  if (depth == 0) text->outermost = desc;
  text->innermost = std::move(desc);
  return 0;
}

// The value of `key = 'value'` or `key = value,` in a description, "" if absent.
std::string h5_desc_value(const std::string& desc, const std::string& key) {
  const size_t at = desc.find(key + " = ");
  if (at == std::string::npos) return "";
  size_t begin = at + key.size() + 3;
  if (begin < desc.size() && desc[begin] == '\'') {
    const size_t end = desc.find('\'', begin + 1);
    return end == std::string::npos ? "" : desc.substr(begin + 1, end - begin - 1);
  }
  return desc.substr(begin, desc.find(',', begin) - begin);
}

// A description that carries the system's error (the file drivers': "file write failed: time =
// ..., filename = '...', file descriptor = 3, errno = 28, error message = 'No space left on
// device', buf = ..., ...") shortened to "file write failed: No space left on device (errno 28)".
// Any other is kept, cut at 160 characters.
std::string h5_short_desc(const std::string& desc) {
  const std::string message = h5_desc_value(desc, "error message");
  if (!message.empty()) {
    const std::string errno_text = h5_desc_value(desc, "errno");
    return desc.substr(0, desc.find(": ")) + ": " + message +
           (errno_text.empty() ? "" : " (errno " + errno_text + ")");
  }
  constexpr size_t kMaxDescChars = 160;
  return desc.size() <= kMaxDescChars ? desc : desc.substr(0, kMaxDescChars) + "...";
}

// "what the call says failed: the innermost cause", each shortened, the cause once if the two
// begin alike (H5Fopen's "unable to open file" over the driver's "unable to open file: ...").
std::string h5_cause(const StackText& stack) {
  const std::string outer = h5_short_desc(stack.outermost);
  const std::string inner = h5_short_desc(stack.innermost);
  if (inner.empty() || inner == outer) return outer;
  if (outer.empty() || inner.compare(0, outer.size(), outer) == 0) return inner;
  return outer + ": " + inner;
}

// MOE_RT_HDF5_STACK set (and not "0"): every failed call prints HDF5's whole error stack.
bool h5_stack_wanted() {
  const char* value = std::getenv("MOE_RT_HDF5_STACK");
  return value != nullptr && *value != '\0' && std::string(value) != "0";
}

// The walked stack's first and last entries; with MOE_RT_HDF5_STACK, the whole stack on stderr.
StackText h5_error_stack(const std::string& where) {
  // Walk a copy: H5Eget_msg is itself an API call and would clear the live stack under the walk.
  // H5Eget_current_stack also clears the current stack, ready for the next call.
  StackText text;
  const hid_t stack = H5Eget_current_stack();
  if (stack < 0) {
    text.outermost = "the HDF5 error stack could not be read";
    return text;
  }
  if (H5Eget_num(stack) <= 0) {
    text.outermost = "no HDF5 error stack";
  } else if (H5Ewalk2(stack, H5E_WALK_DOWNWARD, h5_collect_entry, &text) < 0) {
    text.outermost += " [error stack walk failed]";
  }
  if (h5_stack_wanted()) {
    std::fprintf(stderr, "moe_rt: HDF5 error stack of %s:\n", where.c_str());
    if (H5Eprint2(stack, stderr) < 0) std::fputs("  (the stack could not be printed)\n", stderr);
    std::fflush(stderr);
  }
  H5Eclose_stack(stack);
  return text;
}

}  // namespace

Hdf5LibraryHold::Hdf5LibraryHold() {
  H5dont_atexit();
}

Hdf5LibraryHold::~Hdf5LibraryHold() {
  if (!h5_close_failed()) H5close();
}

bool h5_close_failed() {
  return g_close_failed.load();
}

void h5_silence_auto_print() {
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
}

void h5_fail(const char* call, const char* file, int line) {
  // One short line: the function, what failed and its innermost cause (often the system's own
  // words, "No space left on device"), and the source line without its folders. The whole stack
  // (600 to 4,500 characters, one entry per HDF5 layer) only with MOE_RT_HDF5_STACK, on stderr.
  const std::string call_text(call);
  const std::string function = call_text.substr(0, call_text.find('('));
  const std::string path(file);
  const std::string where =
      function + " (" + path.substr(path.find_last_of('/') + 1) + ":" + std::to_string(line) + ")";
  const StackText stack = h5_error_stack(where);
  throw Hdf5Error("HDF5 " + where + " failed: " + h5_cause(stack));
}

H5Id& H5Id::operator=(H5Id&& other) noexcept {
  if (this != &other) {
    close_quietly();
    id_ = std::exchange(other.id_, H5I_INVALID_HID);
    closer_ = other.closer_;
  }
  return *this;
}

void H5Id::close() {
  if (id_ < 0) return;
  const hid_t id = std::exchange(id_, H5I_INVALID_HID);
  // Named after the closer's role rather than its spelling: the pointer hides which H5*close.
  if (closer_(id) < 0) {
    g_close_failed = true;
    h5_fail("H5*close(handle)", __FILE__, __LINE__);
  }
}

void H5Id::close_quietly() noexcept {
  if (id_ < 0) return;
  const hid_t id = std::exchange(id_, H5I_INVALID_HID);
  if (closer_(id) < 0) {
    g_close_failed = true;
    H5Eclear2(H5E_DEFAULT);
  }
}

H5Id h5_untimed_plist(hid_t plist_class) {
  H5Id plist(MOE_H5_CHECK(H5Pcreate(plist_class)), H5Pclose);
  MOE_H5_CHECK(H5Pset_obj_track_times(plist.get(), 0));
  return plist;
}

H5Id h5_string_type() {
  H5Id type(MOE_H5_CHECK(H5Tcopy(H5T_C_S1)), H5Tclose);
  MOE_H5_CHECK(H5Tset_size(type.get(), H5T_VARIABLE));
  MOE_H5_CHECK(H5Tset_cset(type.get(), H5T_CSET_UTF8));
  return type;
}

void h5_write_attr(hid_t loc, const char* name, hid_t file_type, hid_t mem_type,
                   const void* value) {
  H5Id space(MOE_H5_CHECK(H5Screate(H5S_SCALAR)), H5Sclose);
  H5Id attr(MOE_H5_CHECK(H5Acreate2(loc, name, file_type, space.get(), H5P_DEFAULT, H5P_DEFAULT)),
            H5Aclose);
  MOE_H5_CHECK(H5Awrite(attr.get(), mem_type, value));
}

void h5_write_string_attr(hid_t loc, const char* name, const std::string& value) {
  const H5Id type = h5_string_type();
  const char* text = value.c_str();
  h5_write_attr(loc, name, type.get(), type.get(), &text);
}

void h5_write_int_attr(hid_t loc, const char* name, int32_t value) {
  h5_write_attr(loc, name, H5T_STD_I32LE, H5T_NATIVE_INT32, &value);
}

void h5_write_fixed_dataset(hid_t loc, const char* name, hid_t file_type, hid_t mem_type,
                            const std::vector<hsize_t>& dims, const void* values) {
  H5Id space(MOE_H5_CHECK(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr)),
             H5Sclose);
  H5Id dcpl = h5_untimed_plist(H5P_DATASET_CREATE);
  H5Id dset(MOE_H5_CHECK(H5Dcreate2(loc, name, file_type, space.get(), H5P_DEFAULT, dcpl.get(),
                                    H5P_DEFAULT)),
            H5Dclose);
  if (MOE_H5_CHECK(H5Sget_simple_extent_npoints(space.get())) > 0) {
    MOE_H5_CHECK(H5Dwrite(dset.get(), mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, values));
  }
}

void h5_write_string_dataset(hid_t loc, const char* name, const std::vector<std::string>& values) {
  std::vector<const char*> texts;
  for (const std::string& v : values) texts.push_back(v.c_str());
  const H5Id type = h5_string_type();
  h5_write_fixed_dataset(loc, name, type.get(), type.get(), {values.size()}, texts.data());
}

H5RowDataset h5_row_dataset_create(hid_t loc, const char* name, hid_t file_type, hid_t mem_type,
                                   const std::vector<hsize_t>& row_dims, hid_t dcpl, hid_t dapl) {
  H5RowDataset d;
  d.mem_type = mem_type;
  d.dims = row_dims;
  d.dims.insert(d.dims.begin(), 0);
  std::vector<hsize_t> max_dims = d.dims;
  max_dims[0] = H5S_UNLIMITED;
  H5Id space(MOE_H5_CHECK(
                 H5Screate_simple(static_cast<int>(d.dims.size()), d.dims.data(), max_dims.data())),
             H5Sclose);
  d.dset =
      H5Id(MOE_H5_CHECK(H5Dcreate2(loc, name, file_type, space.get(), H5P_DEFAULT, dcpl, dapl)),
           H5Dclose);
  d.file_space = std::move(space);
  d.count = d.dims;
  d.count[0] = 1;
  d.start.assign(d.dims.size(), 0);
  d.row_space = H5Id(
      MOE_H5_CHECK(H5Screate_simple(static_cast<int>(d.count.size()), d.count.data(), nullptr)),
      H5Sclose);
  return d;
}

void h5_row_dataset_append(H5RowDataset& d, const void* values) {
  // Measured: keeping the two dataspaces instead of H5Dget_space/H5Screate_simple per append.
  const int rank = static_cast<int>(d.dims.size());
  d.start[0] = d.dims[0];
  d.dims[0] += 1;
  MOE_H5_CHECK(H5Dset_extent(d.dset.get(), d.dims.data()));
  MOE_H5_CHECK(H5Sset_extent_simple(d.file_space.get(), rank, d.dims.data(), nullptr));
  MOE_H5_CHECK(H5Sselect_hyperslab(d.file_space.get(), H5S_SELECT_SET, d.start.data(), nullptr,
                                   d.count.data(), nullptr));
  MOE_H5_CHECK(H5Dwrite(d.dset.get(), d.mem_type, d.row_space.get(), d.file_space.get(),
                        H5P_DEFAULT, values));
}

namespace {

// Copies the attributes of `from` onto `to`, in name order: each read with its own type (a
// variable-length string reads as char*) and written back as the same bytes, then what HDF5
// allocated for variable-length values freed. Attributes holding object references are skipped:
// they would point into the source file (h5_copy_file's `after_copy` remakes them).
void copy_attributes(hid_t from, hid_t to) {
  H5O_info_t info{};
  MOE_H5_CHECK(H5Oget_info2(from, &info, H5O_INFO_NUM_ATTRS));
  for (hsize_t i = 0; i < info.num_attrs; ++i) {
    H5Id attr(MOE_H5_CHECK(H5Aopen_by_idx(from, ".", H5_INDEX_NAME, H5_ITER_INC, i, H5P_DEFAULT,
                                          H5P_DEFAULT)),
              H5Aclose);
    H5Id type(MOE_H5_CHECK(H5Aget_type(attr.get())), H5Tclose);
    if (MOE_H5_CHECK(H5Tdetect_class(type.get(), H5T_REFERENCE)) > 0) continue;
    std::string name(MOE_H5_CHECK(H5Aget_name(attr.get(), 0, nullptr)) + 1, '\0');
    MOE_H5_CHECK(H5Aget_name(attr.get(), name.size(), name.data()));
    H5Id space(MOE_H5_CHECK(H5Aget_space(attr.get())), H5Sclose);
    const hssize_t num_values = MOE_H5_CHECK(H5Sget_simple_extent_npoints(space.get()));
    std::vector<unsigned char> bytes(MOE_H5_CHECK(H5Tget_size(type.get())) * num_values);
    MOE_H5_CHECK(H5Aread(attr.get(), type.get(), bytes.data()));
    H5Id copy(MOE_H5_CHECK(
                  H5Acreate2(to, name.c_str(), type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT)),
              H5Aclose);
    const herr_t written = H5Awrite(copy.get(), type.get(), bytes.data());
    if (MOE_H5_CHECK(H5Tdetect_class(type.get(), H5T_VLEN)) > 0 ||
        MOE_H5_CHECK(H5Tis_variable_str(type.get())) > 0) {
      MOE_H5_CHECK(H5Dvlen_reclaim(type.get(), space.get(), H5P_DEFAULT, bytes.data()));
    }
    MOE_H5_CHECK(written);
  }
}

// H5Ovisit2 callback: the path of every object below the root, in name order.
herr_t collect_object(hid_t, const char* name, const H5O_info_t*, void* paths) {
  if (std::string(name) != ".") static_cast<std::vector<std::string>*>(paths)->push_back(name);
  return 0;
}

// Creation properties for a copy of `group`: its time tracking, creation-order tracking of links
// and attributes, storage phase changes and link estimates. Not the group's own list
// (H5Gget_create_plist), which keeps the address of its link storage in the source file.
H5Id group_create_plist(hid_t group) {
  H5Id own(MOE_H5_CHECK(H5Gget_create_plist(group)), H5Pclose);
  hbool_t track_times = 0;
  unsigned link_order = 0, attr_order = 0, max_compact = 0, min_dense = 0;
  unsigned max_attr_compact = 0, min_attr_dense = 0, est_entries = 0, est_name = 0;
  MOE_H5_CHECK(H5Pget_obj_track_times(own.get(), &track_times));
  MOE_H5_CHECK(H5Pget_link_creation_order(own.get(), &link_order));
  MOE_H5_CHECK(H5Pget_attr_creation_order(own.get(), &attr_order));
  MOE_H5_CHECK(H5Pget_link_phase_change(own.get(), &max_compact, &min_dense));
  MOE_H5_CHECK(H5Pget_attr_phase_change(own.get(), &max_attr_compact, &min_attr_dense));
  MOE_H5_CHECK(H5Pget_est_link_info(own.get(), &est_entries, &est_name));
  H5Id gcpl(MOE_H5_CHECK(H5Pcreate(H5P_GROUP_CREATE)), H5Pclose);
  MOE_H5_CHECK(H5Pset_obj_track_times(gcpl.get(), track_times));
  MOE_H5_CHECK(H5Pset_link_creation_order(gcpl.get(), link_order));
  MOE_H5_CHECK(H5Pset_attr_creation_order(gcpl.get(), attr_order));
  MOE_H5_CHECK(H5Pset_link_phase_change(gcpl.get(), max_compact, min_dense));
  MOE_H5_CHECK(H5Pset_attr_phase_change(gcpl.get(), max_attr_compact, min_attr_dense));
  MOE_H5_CHECK(H5Pset_est_link_info(gcpl.get(), est_entries, est_name));
  return gcpl;
}

// True for numbers: integers, floats, enums and bitfields, and arrays of them.
bool is_numeric(hid_t type) {
  switch (MOE_H5_CHECK(H5Tget_class(type))) {
    case H5T_INTEGER:
    case H5T_FLOAT:
    case H5T_ENUM:
    case H5T_BITFIELD:
      return true;
    case H5T_ARRAY: {
      H5Id base(MOE_H5_CHECK(H5Tget_super(type)), H5Tclose);
      return is_numeric(base.get());
    }
    default:
      return false;
  }
}

// True for a chunked dataset of numbers written without filters: one h5_copy_file rewrites with
// its filters rather than copying as it is.
bool refilter(hid_t dset, hid_t dcpl) {
  if (MOE_H5_CHECK(H5Pget_layout(dcpl)) != H5D_CHUNKED || MOE_H5_CHECK(H5Pget_nfilters(dcpl)) > 0)
    return false;
  H5Id type(MOE_H5_CHECK(H5Dget_type(dset)), H5Tclose);
  return is_numeric(type.get());
}

// Writes dataset `dset` (creation properties `dcpl`) as `name` in `to`: its creation properties
// plus `filters`, its type and extent, its values read and written in slabs of whole chunks along
// the first axis (at least one chunk, about 8 MiB).
void copy_refiltered(hid_t to, const char* name, hid_t dset, hid_t dcpl,
                     const H5CopyFilters& filters) {
  H5Id type(MOE_H5_CHECK(H5Dget_type(dset)), H5Tclose);
  H5Id space(MOE_H5_CHECK(H5Dget_space(dset)), H5Sclose);
  H5Id props(MOE_H5_CHECK(H5Pcopy(dcpl)), H5Pclose);
  MOE_H5_CHECK(H5Pset_chunk_opts(props.get(), 0));
  if (filters.shuffle) MOE_H5_CHECK(H5Pset_shuffle(props.get()));
  if (filters.deflate_level > 0) MOE_H5_CHECK(H5Pset_deflate(props.get(), filters.deflate_level));
  H5Id copy(MOE_H5_CHECK(H5Dcreate2(to, name, type.get(), space.get(), H5P_DEFAULT, props.get(),
                                    H5P_DEFAULT)),
            H5Dclose);
  const int rank = MOE_H5_CHECK(H5Sget_simple_extent_ndims(space.get()));
  std::vector<hsize_t> dims(rank), chunk(rank);
  MOE_H5_CHECK(H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr));
  MOE_H5_CHECK(H5Pget_chunk(dcpl, rank, chunk.data()));
  if (rank == 0 || dims[0] == 0) return;
  size_t row_bytes = MOE_H5_CHECK(H5Tget_size(type.get()));
  for (int d = 1; d < rank; ++d) row_bytes *= dims[d];
  if (row_bytes == 0) return;
  const hsize_t slab_rows =
      chunk[0] * std::max<hsize_t>(1, (hsize_t{8} << 20) / (chunk[0] * row_bytes));
  std::vector<unsigned char> values(static_cast<size_t>(std::min(slab_rows, dims[0]) * row_bytes));
  H5Id out_space(MOE_H5_CHECK(H5Dget_space(copy.get())), H5Sclose);
  std::vector<hsize_t> start(rank, 0), count = dims;
  for (hsize_t row = 0; row < dims[0]; row += slab_rows) {
    start[0] = row;
    count[0] = std::min(slab_rows, dims[0] - row);
    H5Id slab(MOE_H5_CHECK(H5Screate_simple(rank, count.data(), nullptr)), H5Sclose);
    for (hid_t s : {space.get(), out_space.get()}) {
      MOE_H5_CHECK(
          H5Sselect_hyperslab(s, H5S_SELECT_SET, start.data(), nullptr, count.data(), nullptr));
    }
    MOE_H5_CHECK(H5Dread(dset, type.get(), slab.get(), space.get(), H5P_DEFAULT, values.data()));
    MOE_H5_CHECK(
        H5Dwrite(copy.get(), type.get(), slab.get(), out_space.get(), H5P_DEFAULT, values.data()));
  }
}

// An object's address in the source file and its path in the copy, for objects that more than
// one hard link reaches: the first link copies the object, the others link to that copy.
using CopiedObjects = std::map<haddr_t, std::string>;

// Copies the links of group `from` (path `path` in both files, "" for the root) into group `to`,
// in the order they were created where the group indexes that order, else in name order. Soft
// and external links are made again as links. An object a hard link reaches first: a group is
// made with its own creation properties and filled in turn, a dataset to refilter rewritten,
// anything else (and everything when no filter is asked for) copied with H5Ocopy without
// attributes; a later hard link to it links to the copy.
void copy_members(hid_t from, hid_t to, const std::string& path, const H5CopyFilters& filters,
                  hid_t ocpypl, CopiedObjects& copied) {
  const bool any_filter = filters.shuffle || filters.deflate_level > 0;
  H5Id own(MOE_H5_CHECK(H5Gget_create_plist(from)), H5Pclose);
  unsigned order = 0;
  MOE_H5_CHECK(H5Pget_link_creation_order(own.get(), &order));
  const H5_index_t index = (order & H5P_CRT_ORDER_INDEXED) ? H5_INDEX_CRT_ORDER : H5_INDEX_NAME;
  H5G_info_t links{};
  MOE_H5_CHECK(H5Gget_info(from, &links));
  for (hsize_t i = 0; i < links.nlinks; ++i) {
    const ssize_t length =
        MOE_H5_CHECK(H5Lget_name_by_idx(from, ".", index, H5_ITER_INC, i, nullptr, 0, H5P_DEFAULT));
    std::string name(length + 1, '\0');
    MOE_H5_CHECK(H5Lget_name_by_idx(from, ".", index, H5_ITER_INC, i, name.data(), name.size(),
                                    H5P_DEFAULT));
    name.resize(length);
    const std::string here = path + "/" + name;
    H5L_info_t link{};
    MOE_H5_CHECK(H5Lget_info(from, name.c_str(), &link, H5P_DEFAULT));
    if (link.type == H5L_TYPE_SOFT || link.type == H5L_TYPE_EXTERNAL) {
      std::string value(link.u.val_size, '\0');
      MOE_H5_CHECK(H5Lget_val(from, name.c_str(), value.data(), value.size(), H5P_DEFAULT));
      if (link.type == H5L_TYPE_SOFT) {
        MOE_H5_CHECK(H5Lcreate_soft(value.c_str(), to, name.c_str(), H5P_DEFAULT, H5P_DEFAULT));
      } else {
        const char *file = nullptr, *object = nullptr;
        MOE_H5_CHECK(H5Lunpack_elink_val(value.data(), value.size(), nullptr, &file, &object));
        MOE_H5_CHECK(H5Lcreate_external(file, object, to, name.c_str(), H5P_DEFAULT, H5P_DEFAULT));
      }
      continue;
    }
    if (link.type != H5L_TYPE_HARD) {
      throw Hdf5Error("h5_copy_file: '" + here + "' is a user-defined link, which is not copied");
    }
    const auto [first, fresh] = copied.emplace(link.u.address, here);
    if (!fresh) {
      H5Id root(MOE_H5_CHECK(H5Gopen2(to, "/", H5P_DEFAULT)), H5Gclose);
      MOE_H5_CHECK(H5Lcreate_hard(root.get(), first->second.c_str(), to, name.c_str(), H5P_DEFAULT,
                                  H5P_DEFAULT));
      continue;
    }
    H5O_info_t info{};
    MOE_H5_CHECK(H5Oget_info_by_name2(from, name.c_str(), &info, H5O_INFO_BASIC, H5P_DEFAULT));
    if (any_filter && info.type == H5O_TYPE_GROUP) {
      H5Id group(MOE_H5_CHECK(H5Gopen2(from, name.c_str(), H5P_DEFAULT)), H5Gclose);
      H5Id made(MOE_H5_CHECK(H5Gcreate2(to, name.c_str(), H5P_DEFAULT,
                                        group_create_plist(group.get()).get(), H5P_DEFAULT)),
                H5Gclose);
      copy_members(group.get(), made.get(), here, filters, ocpypl, copied);
      continue;
    }
    if (any_filter && info.type == H5O_TYPE_DATASET) {
      H5Id dset(MOE_H5_CHECK(H5Dopen2(from, name.c_str(), H5P_DEFAULT)), H5Dclose);
      H5Id dcpl(MOE_H5_CHECK(H5Dget_create_plist(dset.get())), H5Pclose);
      if (refilter(dset.get(), dcpl.get())) {
        copy_refiltered(to, name.c_str(), dset.get(), dcpl.get(), filters);
        continue;
      }
    }
    MOE_H5_CHECK(H5Ocopy(from, name.c_str(), to, name.c_str(), ocpypl, H5P_DEFAULT));
  }
}

}  // namespace

void h5_copy_file(const std::string& src, const std::string& dst, hid_t fcpl, hid_t fapl,
                  const H5CopyFilters& filters, void (*after_copy)(hid_t)) {
  H5Id in(MOE_H5_CHECK(H5Fopen(src.c_str(), H5F_ACC_RDONLY, fapl)), H5Fclose);
  H5Id out(MOE_H5_CHECK(H5Fcreate(dst.c_str(), H5F_ACC_TRUNC, fcpl, fapl)), H5Fclose);
  copy_attributes(in.get(), out.get());
  // Objects without their attributes, which are copied one by one below: HDF5 1.10.8's H5Ocopy
  // crashes (SIGSEGV in H5T__conv_vlen) copying an attribute of object references, as dimension
  // scales keep them, and would leave references between separately copied groups pointing
  // nowhere anyway.
  H5Id ocpypl(MOE_H5_CHECK(H5Pcreate(H5P_OBJECT_COPY)), H5Pclose);
  MOE_H5_CHECK(H5Pset_copy_object(ocpypl.get(), H5O_COPY_WITHOUT_ATTR_FLAG));
  {
    H5Id from(MOE_H5_CHECK(H5Gopen2(in.get(), "/", H5P_DEFAULT)), H5Gclose);
    H5Id to(MOE_H5_CHECK(H5Gopen2(out.get(), "/", H5P_DEFAULT)), H5Gclose);
    CopiedObjects copied;
    copy_members(from.get(), to.get(), "", filters, ocpypl.get(), copied);
  }
  std::vector<std::string> paths;
  MOE_H5_CHECK(
      H5Ovisit2(in.get(), H5_INDEX_NAME, H5_ITER_INC, collect_object, &paths, H5O_INFO_BASIC));
  for (const std::string& path : paths) {
    H5Id from(MOE_H5_CHECK(H5Oopen(in.get(), path.c_str(), H5P_DEFAULT)), H5Oclose);
    H5Id to(MOE_H5_CHECK(H5Oopen(out.get(), path.c_str(), H5P_DEFAULT)), H5Oclose);
    copy_attributes(from.get(), to.get());
  }
  if (after_copy != nullptr) after_copy(out.get());
  out.close();
  in.close();
}

}  // namespace moe

// HDF5 error checking, handle ownership and the few write helpers io/ needs. Every HDF5 call goes
// through MOE_H5_CHECK, which throws Hdf5Error naming the function, what failed and its innermost
// cause from HDF5's error stack, and file:line, in one short line. HDF5's automatic stack printing
// is switched off (h5_silence_auto_print); with MOE_RT_HDF5_STACK=1 in the environment a failed
// call prints the whole stack on stderr. H5Id owns one identifier.
// Only the statistics writer (rank 0) uses HDF5, so messages name no rank: io/ links no MPI.
#pragma once

#include <hdf5.h>

#include <stdexcept>
#include <string>
#include <vector>

namespace moe {

class Hdf5Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Builds the message from the current error stack ("HDF5 H5Fopen (file.cpp:12) failed: unable to
// open file: No such file or directory (errno 2)"), clears the stack and throws. Out of line so
// the macro stays small.
[[noreturn]] void h5_fail(const char* call, const char* file, int line);

// Turns off HDF5's automatic printing of error stacks. The setting is per thread in a thread-safe
// HDF5 build, so every entry point that makes HDF5 calls calls this first (it is cheap).
void h5_silence_auto_print();

// HDF5's library shutdown, held by the program instead of HDF5's own exit handler. A file whose
// close failed (its last flush hit a full disk: ENOSPC) is left by HDF5 1.10 half torn down in its
// table of open objects, and the shutdown then dereferences it (a SIGSEGV at exit, exit status
// 139 where the run had reported its error). The holder constructed first in main() turns the
// exit handler off (H5dont_atexit) and shuts the library down when it is destroyed, unless a close
// failed: the process then ends with the files it closed closed, and the failed one left to the
// system. Every open and close of the program is its own; the holder adds no close of its own.
class Hdf5LibraryHold {
 public:
  Hdf5LibraryHold();
  ~Hdf5LibraryHold();
  Hdf5LibraryHold(const Hdf5LibraryHold&) = delete;
  Hdf5LibraryHold& operator=(const Hdf5LibraryHold&) = delete;
};

// Whether any H5Id close has failed in this process (the holder then leaves the library as it is).
bool h5_close_failed();

// hid_t, herr_t and htri_t all report failure as a negative value.
template <typename T> inline T h5_check(T result, const char* call, const char* file, int line) {
  if (result < 0) h5_fail(call, file, line);
  return result;
}

// One owned HDF5 identifier (file, group, dataset, dataspace, datatype, property list,
// attribute), closed with the matching H5*close function. Move-only.
class H5Id {
 public:
  using Closer = herr_t (*)(hid_t);

  H5Id() = default;
  H5Id(hid_t id, Closer closer) : id_(id), closer_(closer) {}
  H5Id(H5Id&& other) noexcept : id_(other.id_), closer_(other.closer_) {
    other.id_ = H5I_INVALID_HID;
  }
  H5Id& operator=(H5Id&& other) noexcept;
  H5Id(const H5Id&) = delete;
  H5Id& operator=(const H5Id&) = delete;
  ~H5Id() { close_quietly(); }

  hid_t get() const { return id_; }
  bool valid() const { return id_ >= 0; }

  // Checked close: throws Hdf5Error if HDF5 reports a failure (for example a failed flush).
  void close();
  // Close for destructors: never throws, drops any error.
  void close_quietly() noexcept;

 private:
  hid_t id_ = H5I_INVALID_HID;
  Closer closer_ = nullptr;
};

// ---- helpers; all throw Hdf5Error
// ----------------------------------------------------------------

// Object (or file) creation properties that record no modification times, so that a file's bytes
// are a pure function of what is written (HDF5 stores times in object headers by default).
H5Id h5_untimed_plist(hid_t plist_class);

// Variable-length UTF-8 string type: h5py reads such attributes as str, datasets via .asstr().
H5Id h5_string_type();

// Scalar attribute `name` on `loc` of type `file_type`, written from `value` of type `mem_type`.
void h5_write_attr(hid_t loc, const char* name, hid_t file_type, hid_t mem_type, const void* value);
void h5_write_string_attr(hid_t loc, const char* name, const std::string& value);
void h5_write_int_attr(hid_t loc, const char* name, int32_t value);  // stored as int32 LE

// Fixed-size, contiguous, untimed dataset written once; `values` holds product(dims) elements.
void h5_write_fixed_dataset(hid_t loc, const char* name, hid_t file_type, hid_t mem_type,
                            const std::vector<hsize_t>& dims, const void* values);
// [n] variable-length UTF-8 strings.
void h5_write_string_dataset(hid_t loc, const char* name, const std::vector<std::string>& values);

// A dataset whose first dimension grows by one row per append.
struct H5RowDataset {
  H5Id dset;
  hid_t mem_type = H5I_INVALID_HID;  // native type of the appended values
  std::vector<hsize_t> dims;         // current extent, dims[0] = rows
  // Kept from one append to the next rather than made anew: the dataset's file dataspace (its
  // extent set to dims, the new row selected) and the memory dataspace of one row.
  H5Id file_space, row_space;
  std::vector<hsize_t> start, count;  // the hyperslab of the last row: start[0] = dims[0] − 1
};

// Creates `name` of shape [0, row_dims...], unlimited along the first dimension; `dcpl` must set
// chunking (and may set filters and a fill value), `dapl` the chunk cache.
H5RowDataset h5_row_dataset_create(hid_t loc, const char* name, hid_t file_type, hid_t mem_type,
                                   const std::vector<hsize_t>& row_dims, hid_t dcpl, hid_t dapl);
// Extends by one row and writes `values` (one row: product(row_dims) values of mem_type) to it.
// After a throw `d` may count a row the file does not hold: append no more to it.
void h5_row_dataset_append(H5RowDataset& d, const void* values);

// Filters a copy gives to the chunked datasets that were written without any: shuffle, then
// deflate at `deflate_level` (0: no deflate). All off by default.
struct H5CopyFilters {
  bool shuffle = false;
  unsigned deflate_level = 0;
};

// Copies the root attributes and every object under the root of the closed file `src` into a new
// file `dst` (created with `fcpl`, replacing any file there; both opened with `fapl`), link by link
// in each group's creation order where it indexes that order, else in name order. Groups are made
// with their own creation properties; a chunked dataset of numbers written without filters is
// rewritten with `filters` added to its creation properties (same chunks, fill value and time
// setting), in slabs of whole chunks; every other object goes through H5Ocopy (same layout, chunks
// and filters, no recompression). Soft and external links are made again as links, and a second
// hard link to an object links to its copy. No holes either way. Attributes are copied one by
// one, except those holding object references (dimension scales): `after_copy`, when given,
// remakes them in `dst` before it is closed. Throws Hdf5Error for a user-defined link.
void h5_copy_file(const std::string& src, const std::string& dst, hid_t fcpl, hid_t fapl,
                  const H5CopyFilters& filters = {}, void (*after_copy)(hid_t) = nullptr);

}  // namespace moe

// Evaluates an HDF5 call, throws Hdf5Error if it returned a negative value, else yields the value.
#define MOE_H5_CHECK(call) ::moe::h5_check((call), #call, __FILE__, __LINE__)

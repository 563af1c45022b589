// What is wrong with an input file (a data shard, a hash table, a config file) before it is opened,
// in one wording for all of them. Checking first matters: a directory opens as an empty stream on
// Linux (a config file that is a directory would read as no keys), and a FIFO blocks the open.
// Also InputFile, for readers that need a file's size before reading it (a data shard checks its
// header against the size, then maps the file instead of reading it).
#pragma once

#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>

namespace moe {

// "" when `path` is an existing regular file (after following links); otherwise the problem:
// "missing: no such file", "missing: a link to no file", "not a regular file (a directory)",
// "not a regular file", or "cannot be inspected: <reason>".
std::string input_file_problem(const std::string& path);

// Why an input file cannot be used, without the path: each reader names the file in its own
// wording ("data file 'x': <problem>").
class InputFileError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A file mapped read-only and shared (PROT_READ, MAP_SHARED): its pages are the page cache's, so
// the processes of a node that map one file share one copy, and a process holds only the pages it
// touches. Move-only; unmaps in the destructor.
class FileMapping {
 public:
  FileMapping() = default;
  FileMapping(FileMapping&& other) noexcept;
  FileMapping& operator=(FileMapping&& other) noexcept;
  FileMapping(const FileMapping&) = delete;
  FileMapping& operator=(const FileMapping&) = delete;
  ~FileMapping();

  const unsigned char* data() const { return static_cast<const unsigned char*>(addr_); }
  int64_t num_bytes() const { return num_bytes_; }

  // Drops the whole pages inside bytes [begin, end) from this process's resident set; the next
  // access faults them in again from the page cache (or the disk). The file is not changed and
  // the page cache keeps them, so other processes mapping the file are not affected.
  void release(int64_t begin, int64_t end) const;

 private:
  friend class InputFile;
  FileMapping(void* addr, int64_t num_bytes) : addr_(addr), num_bytes_(num_bytes) {}

  void* addr_ = nullptr;
  int64_t num_bytes_ = 0;
};

// A regular file open read-only (a POSIX descriptor, closed by the destructor), with its size.
class InputFile {
 public:
  // Throws InputFileError with input_file_problem's wording, "unreadable: cannot open for reading
  // (<reason>)", or "reports size 0 but is not empty (a special file, e.g. under /proc?)": files
  // that the kernel generates as they are read report size 0 and can be neither sized nor mapped.
  // A truly empty file opens, with num_bytes() 0.
  explicit InputFile(const std::string& path);
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;
  ~InputFile();

  int64_t num_bytes() const { return num_bytes_; }

  // Reads bytes [offset, offset + out.size()), fewer at the end of the file; returns how many.
  // Throws InputFileError when the read fails.
  int64_t read_at(int64_t offset, std::span<char> out) const;

  // Maps the whole file (num_bytes() > 0) read-only and shared. Throws InputFileError on failure.
  FileMapping map() const;

 private:
  int fd_ = -1;
  int64_t num_bytes_ = 0;
};

}  // namespace moe

// Helpers shared by the benchmark programs of bench/: summary statistics of repeated timings (the
// median and the spread), the machine and BLAS banner every program prints first, the thread
// count per rank, the reference sgemm call, a minimal `--name value` argument reader, and the MPI
// `main` of every program.
// Benchmarks are programs, not tests (STYLE.md): nothing here asserts a speed.
#pragma once

#include <cblas.h>
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "comm/communicator.hpp"
#include "model/blas.hpp"
#include "model/gemm/gemm.hpp"

namespace moe::bench {

// Median, minimum and maximum of repeated timings (seconds or any unit).
struct Spread {
  double median = 0, min = 0, max = 0;
};

inline Spread spread_of(std::vector<double> v) {
  if (v.empty()) return {};
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  const double median = n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
  return Spread{median, v.front(), v.back()};
}

// The first line of /proc/cpuinfo's "model name", the logical CPUs and the memory, one line.
inline std::string machine_description() {
  std::string model = "unknown CPU";
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);) {
    if (line.rfind("model name", 0) == 0) {
      model = line.substr(line.find(':') + 2);
      break;
    }
  }
  long long mem_kib = 0;
  std::ifstream meminfo("/proc/meminfo");
  for (std::string line; std::getline(meminfo, line);) {
    if (line.rfind("MemTotal:", 0) == 0) {
      mem_kib = std::atoll(line.c_str() + 9);
      break;
    }
  }
  return model + ", " + std::to_string(std::thread::hardware_concurrency()) + " logical CPUs, " +
         std::to_string(mem_kib / (1024 * 1024)) + " GiB";
}

// The OpenBLAS guard variables, as they are in this process's environment (the kernel that ran
// is in blas_info(); a benchmark run under `env -u OPENBLAS_CORETYPE` shows the detected one).
inline std::string blas_env_description() {
  std::string out;
  for (const char* name : {"OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "OPENBLAS_NUM_THREADS"}) {
    const char* v = std::getenv(name);
    out += std::string(out.empty() ? "" : ", ") + name + "=" + (v ? v : "(unset)");
  }
  return out;
}

// Threads per rank: `requested` if > 0, else cores / ranks on this node (at least 1), as the
// training loop does; the model's threads, with OpenBLAS single-threaded inside them
// (blas_set_threads). Collective over `world` (the node split). Returns the count set.
inline int set_blas_threads(const Comm& world, int requested) {
  int n = requested;
  if (n <= 0) {
    const Comm node = world.split_shared();
    const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    n = std::max(1, cores / node.size());
  }
  blas_set_threads(n);
  return n;
}

// OpenBLAS's own threads for the plain cblas_sgemm references (the model does not use OpenBLAS).
inline void blas_set_library_threads(int n) {
  openblas_set_num_threads(std::max(1, n));
}

// The reference GEMM: OpenBLAS's sgemm on packed row-major matrices, C[M,N] = op(A)[M,K]·op(B)[K,N]
// + beta·C, in moe::gemm's argument order (ta, tb: op transposes; each leading dimension is its
// matrix's row length as stored).
inline void reference_sgemm(bool ta, bool tb, int M, int N, int K, const float* A, const float* B,
                            float beta, float* C) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N,
              K, 1.0f, A, ta ? M : K, B, tb ? K : N, beta, C, N);
}

// The OpenBLAS the references run on: its configuration and the core it chose.
inline std::string openblas_info() {
  const char* config = openblas_get_config();
  const char* core = openblas_get_corename();
  return std::string(config ? config : "OpenBLAS (unknown configuration)") + " core " +
         (core ? core : "(unknown)");
}

// While alive, OpenBLAS runs on n threads of its own: for the plain cblas_sgemm references (the
// rate "sgemm reaches on this machine"). Back to single-threaded at the end.
class LibraryThreads {
 public:
  explicit LibraryThreads(int n) { blas_set_library_threads(n); }
  ~LibraryThreads() { blas_set_library_threads(1); }
  LibraryThreads(const LibraryThreads&) = delete;
  LibraryThreads& operator=(const LibraryThreads&) = delete;
};

// Rank 0 prints the banner: program, what it measures, machine, BLAS library and kernel.
inline void print_banner(const Comm& world, const char* program, const std::string& what,
                         int blas_threads) {
  if (world.rank() != 0) return;
  std::printf("# %s: %s\n", program, what.c_str());
  std::printf("# ranks %d, threads per rank %d\n", world.size(), blas_threads);
  std::printf("# machine: %s\n", machine_description().c_str());
  std::printf("# %s\n", blas_info().c_str());
  std::printf("# reference BLAS: %s\n", openblas_info().c_str());
  std::printf("# env: %s\n", blas_env_description().c_str());
}

// `--name value` (or `--name=value`) from argv, else `fallback`. Unknown names are ignored, so
// every program reads only what it knows; --help is handled by the caller.
inline std::string arg_text(int argc, char** argv, const char* name, const std::string& fallback) {
  const size_t len = std::strlen(name);
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], name, len) != 0) continue;
    if (argv[i][len] == '=') return argv[i] + len + 1;
    if (argv[i][len] == '\0' && i + 1 < argc) return argv[i + 1];
  }
  return fallback;
}

inline long long arg_int(int argc, char** argv, const char* name, long long fallback) {
  const std::string v = arg_text(argc, argv, name, "");
  return v.empty() ? fallback : std::atoll(v.c_str());
}

// `--level L`: runs the GEMMs at instruction-set level L (model/gemm/gemm.hpp) instead of the
// best this CPU has; unknown or absent levels are refused with the reason.
inline void force_gemm_level_arg(int argc, char** argv) {
  const std::string level = arg_text(argc, argv, "--level", "");
  if (level.empty()) return;
  const auto parsed = gemm_level_parse(level);
  if (!parsed) throw std::invalid_argument("--level: unknown GEMM level '" + level + "'");
  gemm_level_force(*parsed);
}

inline bool arg_flag(int argc, char** argv, const char* name) {
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], name) == 0) return true;
  }
  return false;
}

// The slowest rank's value: a collective's time is the time of its last rank to finish.
inline double max_over_ranks(const Comm& comm, double v) {
  double buf[1] = {v};
  comm.allreduce_max(std::span<double>(buf));
  return buf[0];
}

// Keeps a computed value alive so that the optimiser cannot drop the work that produced it.
inline void benchmark_keep(double v) {
  asm volatile("" : : "x"(v) : "memory");
}

inline double sum_over_ranks(const Comm& comm, double v) {
  double buf[1] = {v};
  comm.allreduce_sum(std::span<double>(buf));
  return buf[0];
}

// The `main` of an MPI benchmark: MPI up, `run(argc, argv)`'s exit code; an exception prints one
// line and aborts the job, so that no rank hangs in a collective (STYLE.md).
inline int bench_mpi_main(int argc, char** argv, int (*run)(int, char**)) {
  MpiSession mpi(&argc, &argv);
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    mpi_abort_job(e.what(), 3);
  }
}

}  // namespace moe::bench

// The statistics file's costs (io/stats_writer.hpp): the time of one append (both flushes), the
// live file's bytes per row, the time close() takes (the compressing copy included) and the closed
// file's bytes per row, for a synthetic run of N steps with values shaped like a training run's
// (loads that drift around their mean, a bias that random-walks, timings with noise).
// Run: build/bench/bench_stats_file [--rows N] [--layers L] [--experts E] [--ranks W]
//      [--phases P] [--reps R] [--deflate LEVEL] [--chunk-bytes B] [--evict-mib M] [--dir DIR]
// Defaults: 3000 rows of L = 7, E = 8, W = 8, 14 phases, 3 repetitions, the writer's deflate
// level (0 to 9; 0: shuffle only) and chunk target in bytes, files under /tmp. --evict-mib M
// writes M MiB between appends (untimed), as a training step does, so that each append starts
// with caches holding none of HDF5's state; 0 (the default) appends back to back.
// Prints one line per repetition and the medians over them.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "io/stats_writer.hpp"

namespace {

using Clock = std::chrono::steady_clock;

struct Args {
  int64_t rows = 3000, layers = 7, experts = 8, ranks = 8, phases = 14, reps = 3;
  int64_t deflate = moe::StatsStorage{}.deflate_level;
  int64_t chunk_bytes = moe::StatsStorage{}.chunk_bytes;
  int64_t evict_mib = 0;
  std::string dir = "/tmp";
};

[[noreturn]] void usage(const std::string& what) {
  std::fprintf(stderr,
               "bench_stats_file: %s\nusage: bench_stats_file [--rows N] [--layers L] "
               "[--experts E] [--ranks W] [--phases P] [--reps R] [--deflate LEVEL] "
               "[--chunk-bytes B] [--evict-mib M] [--dir DIR]\n",
               what.c_str());
  std::exit(64);
}

Args parse(int argc, char** argv) {
  Args a;
  // Each count: where it goes, its least and its largest value.
  struct Count {
    const char* flag;
    int64_t* to;
    int64_t least, most;
  };
  const Count counts[] = {{"--rows", &a.rows, 1, int64_t{1} << 30},
                          {"--layers", &a.layers, 1, 4096},
                          {"--experts", &a.experts, 2, 1 << 16},
                          {"--ranks", &a.ranks, 1, 1 << 16},
                          {"--phases", &a.phases, 1, 1024},
                          {"--reps", &a.reps, 1, 1000},
                          {"--deflate", &a.deflate, 0, 9},
                          {"--chunk-bytes", &a.chunk_bytes, 1, int64_t{1} << 30},
                          {"--evict-mib", &a.evict_mib, 0, 1 << 16}};
  for (int i = 1; i < argc; i += 2) {
    const std::string flag = argv[i];
    const Count* count = nullptr;
    for (const Count& c : counts) {
      if (flag == c.flag) count = &c;
    }
    if (flag != "--dir" && count == nullptr) usage("unknown flag " + flag);
    if (i + 1 >= argc) usage("no value after " + flag);
    const char* value = argv[i + 1];
    if (count == nullptr) {
      a.dir = value;
      continue;
    }
    char* end = nullptr;
    errno = 0;
    const long long n = std::strtoll(value, &end, 10);
    if (end == value || *end != '\0' || errno != 0 || n < count->least || n > count->most) {
      usage(flag + " takes a whole number from " + std::to_string(count->least) + " to " +
            std::to_string(count->most) + ", not '" + value + "'");
    }
    *count->to = n;
  }
  return a;
}

moe::StatsHeader header(const Args& a) {
  moe::StatsHeader h;
  h.model = "bench";
  h.config_text = "model = \"bench\"\n";
  h.program_version = "bench_stats_file";
  h.data_description = "synthetic";
  h.created = "2026-01-01T00:00:00+00:00";
  h.world_size = a.ranks, h.ep_size = a.ranks, h.num_layers = a.layers;
  h.num_experts = a.experts, h.top_k = 2, h.vocab = 16, h.hash_layers = 0;
  h.seq_len = 64, h.batch_per_rank = 4, h.seed = 1;
  h.entropy_floor = std::nan("");
  h.layer_routing.assign(a.layers, "topk");
  for (int64_t p = 0; p < a.phases; ++p) h.phase_names.push_back("phase" + std::to_string(p));
  return h;
}

// One step's values, drawn from `rng`; `bias` random-walks across calls.
struct Row {
  std::vector<int64_t> expert_load, rank_load, dispatch, cross_rows, cross_tokens, dropped;
  std::vector<float> bias;
  std::vector<double> per_layer, phase_times, z;
  std::vector<int32_t> source;

  explicit Row(const Args& a) : bias(a.layers * a.experts, 0.0f) {}

  moe::StepRow next(int64_t step, std::mt19937_64& rng, const Args& a) {
    const int64_t L = a.layers, E = a.experts, W = a.ranks;
    const int64_t per_expert = 2 * 256 * W / E;  // K · tokens / E
    std::normal_distribution<double> noise(0.0, 1.0);
    expert_load.assign(L * E, 0);
    for (auto& v : expert_load)
      v = std::max<int64_t>(0, per_expert + std::llround(noise(rng) * per_expert * 0.2));
    rank_load.assign(L * W, 0);
    for (int64_t l = 0; l < L; ++l)
      for (int64_t e = 0; e < E; ++e) rank_load[l * W + e * W / E] += expert_load[l * E + e];
    for (auto& b : bias) b += static_cast<float>(1e-3 * noise(rng));
    per_layer.resize(6 * L);
    for (auto& v : per_layer) v = std::abs(noise(rng)) * 0.1;
    phase_times.resize(W * a.phases);
    for (auto& v : phase_times) v = 1e-3 * (1.0 + 0.1 * std::abs(noise(rng)));
    dispatch.assign(L, 2 * 256 * W);
    cross_rows.resize(L);
    cross_tokens.resize(L);
    for (int64_t l = 0; l < L; ++l) {
      cross_rows[l] = 256 * W + std::llround(noise(rng) * 20);
      cross_tokens[l] = 200 * W + std::llround(noise(rng) * 20);
    }
    z.resize(L);
    for (auto& v : z) v = 1e-4 * std::abs(noise(rng));
    dropped.assign(L * E, 0);
    source.resize(L * W * E);
    for (int64_t i = 0; i < L * W * E; ++i)
      source[i] = static_cast<int32_t>(expert_load[(i / (W * E)) * E + i % E] / W);
    moe::StepRow r;
    r.step = step;
    r.loss = 3.0 * std::exp(-1e-3 * step) + 0.01 * noise(rng);
    r.balance_loss = 1e-4 * (1.0 + 0.1 * noise(rng));
    r.grad_norm = 1.0 + 0.1 * noise(rng);
    r.lr = 3e-4;
    r.tokens_per_s = 8000 + 100 * noise(rng);
    r.step_time_s = 0.25 + 0.01 * noise(rng);
    r.expert_load = expert_load, r.rank_load = rank_load, r.bias = bias;
    const std::span<const double> pl(per_layer);
    r.load_variance = pl.subspan(0, L), r.max_violation = pl.subspan(L, L);
    r.load_cv = pl.subspan(2 * L, L), r.rank_overload = pl.subspan(3 * L, L);
    r.layer_balance_loss = pl.subspan(4 * L, L), r.layer_z_loss = pl.subspan(5 * L, L);
    r.phase_times = phase_times;
    r.dispatch_rows = dispatch, r.cross_host_rows = cross_rows, r.cross_host_tokens = cross_tokens;
    r.z_loss = 1e-4;
    r.dropped = dropped, r.source_expert_load = source;
    return r;
  }
};

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return std::nan("");
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(q * static_cast<double>(v.size() - 1) + 0.5)];
}

double median(std::vector<double> v) {
  return percentile(std::move(v), 0.5);
}

int64_t file_bytes(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? static_cast<int64_t>(st.st_size) : -1;
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  const std::string path = a.dir + "/bench_stats_file." + std::to_string(::getpid()) + ".h5";
  std::printf("%lld rows, L = %lld, E = %lld, W = %lld, %lld phases\n",
              static_cast<long long>(a.rows), static_cast<long long>(a.layers),
              static_cast<long long>(a.experts), static_cast<long long>(a.ranks),
              static_cast<long long>(a.phases));
  std::printf("%4s %12s %12s %12s %12s %14s %12s %14s\n", "rep", "append p50", "p90", "p99",
              "mean (us)", "live B/row", "close (ms)", "closed B/row");
  std::vector<double> p50s, p90s, p99s, means, lives, closes, closeds;
  for (int64_t rep = 0; rep < a.reps; ++rep) {
    std::mt19937_64 rng(1234 + rep);
    Row row(a);
    std::vector<double> us;
    double live = 0, close_ms = 0, closed = 0;
    try {
      us.reserve(static_cast<size_t>(a.rows));
      std::vector<char> evict(static_cast<size_t>(a.evict_mib) << 20);
      moe::StatsStorage storage;
      storage.deflate_level = static_cast<int>(a.deflate);
      storage.chunk_bytes = a.chunk_bytes;
      moe::StatsWriter w(path, true, header(a), storage);
      w.publish();
      for (int64_t s = 0; s < a.rows; ++s) {
        const moe::StepRow r = row.next(s, rng, a);
        for (size_t i = 0; i < evict.size(); i += 64) evict[i] = static_cast<char>(evict[i] + 1);
        asm volatile("" : : "r"(evict.data()) : "memory");  // the stores must happen
        const auto t0 = Clock::now();
        w.append(r);
        us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
      }
      live = static_cast<double>(file_bytes(path)) / static_cast<double>(a.rows);
      const auto t0 = Clock::now();
      w.close();
      close_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
      closed = static_cast<double>(file_bytes(path)) / static_cast<double>(a.rows);
      if (live < 0 || closed < 0) throw std::runtime_error("cannot stat " + path);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "bench_stats_file: %s\n", e.what());
      std::remove(path.c_str());
      return 1;
    }
    std::remove(path.c_str());
    double sum = 0;
    for (double t : us) sum += t;
    p50s.push_back(percentile(us, 0.5)), p90s.push_back(percentile(us, 0.9));
    p99s.push_back(percentile(us, 0.99)), means.push_back(sum / static_cast<double>(us.size()));
    lives.push_back(live), closes.push_back(close_ms), closeds.push_back(closed);
    std::printf("%4lld %12.1f %12.1f %12.1f %12.1f %14.0f %12.1f %14.0f\n",
                static_cast<long long>(rep), p50s.back(), p90s.back(), p99s.back(), means.back(),
                live, close_ms, closed);
  }
  std::printf("%4s %12.1f %12.1f %12.1f %12.1f %14.0f %12.1f %14.0f\n", "med", median(p50s),
              median(p90s), median(p99s), median(means), median(lives), median(closes),
              median(closeds));
  return 0;
}

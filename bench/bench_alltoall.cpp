// bench_alltoall: the expert-parallel token exchange against raw MPI_Alltoallv, nccl-tests style.
//
// For each size (tokens per rank T) and routing (Zipf-skewed, or exactly balanced round-robin):
//   ep  = EpExchange round trip: dispatch_counted (the plan's counts sent with its rows to the
//         experts' owners, each block landing at its expert-major place) + combine (back, in
//         send order) — what one MoE layer does forward;
//   raw = two MPI_Alltoallv calls with the same per-pair counts, there and back, rows left
//         source-major, no count exchange: the same bytes moved by the bare collective.
// Rows are identity-coded (source rank, token, slot, expert, then a pattern of small integers),
// so after timing one checked round trip counts the wrong elements exactly, as the comm tests do:
// the dispatched rows must arrive expert-major with the right provenance, and the combined rows
// must come back to their send positions carrying the "expert's" exact transform.
//
// Bytes: b = T·K·D·4 per rank and direction. A round trip moves 2b per rank, so
//   algbw = 2b / time, busbw = algbw·(n−1)/n (n ranks; the share of the bytes that leaves a rank).
// Time: per repetition the slowest rank's time (barrier before); the median, min and max over the
// repetitions after warm-up. imbal = max over ranks of rows received / mean (1 = balanced).
//
// Legend: T tokens per rank, K experts per token, E experts, D row width (floats), P = n ranks
// (the whole world is one EP group), R rows received by a rank.
//
// Run: mpiexec -np 8 [--oversubscribe] build/bench/bench_alltoall [--min-tokens 64]
//      [--max-tokens 4096] [--factor 4] [--width 128] [--top-k 3] [--experts 8] [--warmup 5]
//      [--iters 20] [--routing both|zipf|balanced] [--seed 1] [--breakdown]
//      [--counts auto|before|with]
// --breakdown adds a second table: each part of the round trip timed alone. --counts: how the
// plan's counts travel (EpExchange::Counts): an all-to-all before the rows, or with them; auto
// (the default) as moe_rt chooses: with the rows when the ranks span hosts.
#include <mpi.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "bench/bench_common.hpp"
#include "comm/dispatch_plan.hpp"
#include "comm/ep_exchange.hpp"

namespace moe::bench {
namespace {

enum class Routing { kZipf, kBalanced };

const char* routing_name(Routing r) {
  return r == Routing::kZipf ? "zipf" : "balanced";
}

// [T, K] distinct expert ids of source `rank`, recomputable on any rank.
// kZipf: expert e drawn with weight 1/(e+1) among those not yet taken (the same popular experts
//   on every rank, as natural routing early in training; max load ≈ 2× the mean at E=8, K=3).
// kBalanced: forced round-robin, ((rank·T + t)·K + j) mod E over the global token index.
std::vector<int32_t> make_routing(Routing kind, uint64_t seed, int rank, int T, int K, int E) {
  std::vector<int32_t> idx(static_cast<size_t>(T) * K);
  if (kind == Routing::kBalanced) {
    for (int64_t t = 0; t < T; ++t) {
      for (int j = 0; j < K; ++j)
        idx[t * K + j] = static_cast<int32_t>(((rank * int64_t{T} + t) * K + j) % E);
    }
    return idx;
  }
  std::mt19937_64 gen(seed * 1000003u + static_cast<uint64_t>(rank));
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  std::vector<double> weight(E);
  for (int t = 0; t < T; ++t) {
    for (int e = 0; e < E; ++e) weight[e] = 1.0 / (e + 1);
    for (int j = 0; j < K; ++j) {
      double total = 0;
      for (double w : weight) total += w;
      double u = uniform(gen) * total;
      int pick = E - 1;
      for (int e = 0; e < E; ++e) {
        if (weight[e] > 0 && (u -= weight[e]) < 0) {
          pick = e;
          break;
        }
      }
      while (weight[pick] == 0) --pick;  // rounding at the top end
      idx[static_cast<size_t>(t) * K + j] = pick;
      weight[pick] = 0;
    }
  }
  return idx;
}

// Identity code of one row of width D: [source, token, slot, expert, pattern...]; every value is a
// small integer, exact in float, so a row's provenance is checked with no tolerance.
float code_at(int source, int t, int j, int e, int c) {
  switch (c) {
    case 0:
      return static_cast<float>(source);
    case 1:
      return static_cast<float>(t);
    case 2:
      return static_cast<float>(j);
    case 3:
      return static_cast<float>(e);
    default:
      return static_cast<float>((t * 31 + c * 17 + source * 7 + j * 3) % 8191);
  }
}

// The benchmark's "expert": y = e − x per element, exact in float, different from the input.
float expert_transform(float x, int e) {
  return static_cast<float>(e) - x;
}

struct Result {
  Spread plan_us, ep, raw;  // plan build (µs, local); round trips (s, slowest rank)
  long long ep_wrong = 0, raw_wrong = 0;
  double imbalance = 1.0;
  // --breakdown: medians (s, slowest rank) of each part on its own, barrier-separated.
  double counted = 0, dispatch = 0, combine = 0, raw_one = 0, raw_nonblocking = 0;
};

Result run_case(const Comm& world, Routing kind, int T, int K, int E, int D, int warmup, int iters,
                uint64_t seed, bool breakdown, EpExchange::Counts counts) {
  const int P = world.size(), me = world.rank();
  const ExpertPlacement placement{E, P};
  std::vector<std::vector<int32_t>> routing(P);
  for (int s = 0; s < P; ++s) routing[s] = make_routing(kind, seed, s, T, K, E);

  DispatchPlan plan;
  std::vector<double> plan_us;
  for (int i = 0; i < warmup + iters; ++i) {
    const double t0 = MPI_Wtime();
    dispatch_plan_build(plan, routing[me], T, K, placement, me);
    if (i >= warmup) plan_us.push_back((MPI_Wtime() - t0) * 1e6);
  }
  EpExchange ex(world, counts);
  const int NK = plan.num_send();
  const size_t Dz = static_cast<size_t>(D);
  std::vector<float> send(NK * Dz), back(NK * Dz), expert_rows;
  for (int p = 0; p < NK; ++p) {
    const int a = plan.send_assignment[p];
    for (int c = 0; c < D; ++c) send[p * Dz + c] = code_at(me, a / K, a % K, routing[me][a], c);
  }
  ex.dispatch_counted(expert_rows, std::span<const float>(send), plan, D);  // learns R
  const int R = plan.num_recv;
  std::vector<float> raw_rows(R * Dz);
  // Raw MPI_Alltoallv: the plan's per-pair row counts in elements, computed once, outside timing.
  std::vector<int> sc(P), sd(P), rc(P), rd(P);
  for (int r = 0; r < P; ++r) {
    sc[r] = plan.send_counts[r] * D;
    sd[r] = plan.send_offsets[r] * D;
    rc[r] = plan.recv_counts[r] * D;
    rd[r] = plan.recv_offsets[r] * D;
  }
  auto ep_round_trip = [&] {
    ex.dispatch_counted(expert_rows, std::span<const float>(send), plan, D);
    ex.combine(std::span<float>(back), std::span<const float>(expert_rows), plan, D);
  };
  auto raw_round_trip = [&] {
    MOE_MPI_CHECK(MPI_Alltoallv(send.data(), sc.data(), sd.data(), MPI_FLOAT, raw_rows.data(),
                                rc.data(), rd.data(), MPI_FLOAT, world.raw()));
    MOE_MPI_CHECK(MPI_Alltoallv(raw_rows.data(), rc.data(), rd.data(), MPI_FLOAT, back.data(),
                                sc.data(), sd.data(), MPI_FLOAT, world.raw()));
  };

  Result res;
  for (int i = 0; i < warmup; ++i) {
    ep_round_trip();
    raw_round_trip();
  }
  std::vector<double> ep_t, raw_t;
  for (int i = 0; i < iters; ++i) {  // interleaved, so drift in the machine's load hits both
    world.barrier();
    double t0 = MPI_Wtime();
    ep_round_trip();
    ep_t.push_back(max_over_ranks(world, MPI_Wtime() - t0));
    world.barrier();
    t0 = MPI_Wtime();
    raw_round_trip();
    raw_t.push_back(max_over_ranks(world, MPI_Wtime() - t0));
  }
  res.plan_us = spread_of(plan_us);
  res.ep = spread_of(ep_t);
  res.raw = spread_of(raw_t);
  if (breakdown) {
    // Each part alone: where the round trip's time over two bare MPI_Alltoallv goes.
    auto median_of = [&](auto&& part) {
      std::vector<double> t;
      for (int i = 0; i < warmup + iters; ++i) {
        world.barrier();
        const double t0 = MPI_Wtime();
        part();
        const double dt = max_over_ranks(world, MPI_Wtime() - t0);
        if (i >= warmup) t.push_back(dt);
      }
      return spread_of(t).median;
    };
    res.counted =
        median_of([&] { ex.dispatch_counted(expert_rows, std::span<const float>(send), plan, D); });
    res.dispatch = median_of(
        [&] { ex.dispatch(std::span<float>(expert_rows), std::span<const float>(send), plan, D); });
    res.combine = median_of(
        [&] { ex.combine(std::span<float>(back), std::span<const float>(expert_rows), plan, D); });
    res.raw_one = median_of([&] {
      MOE_MPI_CHECK(MPI_Alltoallv(send.data(), sc.data(), sd.data(), MPI_FLOAT, raw_rows.data(),
                                  rc.data(), rd.data(), MPI_FLOAT, world.raw()));
    });
    res.raw_nonblocking = median_of([&] {
      MPI_Request req;
      MOE_MPI_CHECK(MPI_Ialltoallv(send.data(), sc.data(), sd.data(), MPI_FLOAT, raw_rows.data(),
                                   rc.data(), rd.data(), MPI_FLOAT, world.raw(), &req));
      MOE_MPI_CHECK(MPI_Wait(&req, MPI_STATUS_IGNORE));
    });
  }

  // ---- checked round trips (untimed) ----
  long long ep_wrong = 0, raw_wrong = 0;
  const int E_loc = placement.num_local(me);
  std::fill(expert_rows.begin(), expert_rows.end(), NAN);
  ex.dispatch_counted(expert_rows, std::span<const float>(send), plan, D);
  // Expert-major: local expert, then source rank, then the source's token order.
  size_t row = 0;
  for (int i = 0; i < E_loc; ++i) {
    const int e = placement.expert(me, i);
    for (int s = 0; s < P; ++s) {
      for (size_t a = 0; a < routing[s].size(); ++a) {
        if (routing[s][a] != e) continue;
        if (row >= static_cast<size_t>(R)) {
          ep_wrong += D;  // a row that should have arrived did not
          continue;
        }
        for (int c = 0; c < D; ++c) {
          ep_wrong += expert_rows[row * Dz + c] != code_at(s, a / K, a % K, e, c);
        }
        ++row;
      }
    }
  }
  ep_wrong += static_cast<long long>(R - std::min<size_t>(row, R)) * D;  // rows too many
  for (int i = 0; i < E_loc; ++i) {
    for (int r = plan.expert_offsets[i]; r < plan.expert_offsets[i + 1]; ++r) {
      for (int c = 0; c < D; ++c) {
        float& x = expert_rows[r * Dz + c];
        x = expert_transform(x, placement.expert(me, i));
      }
    }
  }
  std::fill(back.begin(), back.end(), NAN);
  ex.combine(std::span<float>(back), std::span<const float>(expert_rows), plan, D);
  for (int p = 0; p < NK; ++p) {
    const int a = plan.send_assignment[p], e = routing[me][a];
    for (int c = 0; c < D; ++c) {
      ep_wrong += back[p * Dz + c] != expert_transform(code_at(me, a / K, a % K, e, c), e);
    }
  }
  // Raw: source-major on arrival (source, then its send order: expert, then token), then back.
  std::fill(raw_rows.begin(), raw_rows.end(), NAN);
  std::fill(back.begin(), back.end(), NAN);
  raw_round_trip();
  row = 0;
  for (int s = 0; s < P; ++s) {
    for (int i = 0; i < E_loc; ++i) {
      const int e = placement.expert(me, i);
      for (size_t a = 0; a < routing[s].size(); ++a) {
        if (routing[s][a] != e || row >= static_cast<size_t>(R)) continue;
        for (int c = 0; c < D; ++c) {
          raw_wrong += raw_rows[row * Dz + c] != code_at(s, a / K, a % K, e, c);
        }
        ++row;
      }
    }
  }
  for (size_t i = 0; i < send.size(); ++i) raw_wrong += back[i] != send[i];
  res.ep_wrong = static_cast<long long>(sum_over_ranks(world, static_cast<double>(ep_wrong)));
  res.raw_wrong = static_cast<long long>(sum_over_ranks(world, static_cast<double>(raw_wrong)));
  const double max_r = max_over_ranks(world, R), mean_r = sum_over_ranks(world, R) / P;
  res.imbalance = mean_r > 0 ? max_r / mean_r : 1.0;
  return res;
}

void print_header(const Comm& world, int K, int E, int D, int warmup, int iters) {
  if (world.rank() != 0) return;
  std::printf(
      "# E=%d experts in contiguous blocks over %d ranks (one EP group), K=%d, rows of "
      "D=%d floats; warm-up %d, %d timed repetitions per size\n",
      E, world.size(), K, D, warmup, iters);
  std::printf(
      "# bytes = T*K*D*4 per rank per direction; algbw = 2*bytes/time (round trip); "
      "busbw = algbw*(n-1)/n; time = slowest rank, median [min, max]\n");
  std::printf(
      "# ep  = EpExchange dispatch_counted (the plan's counts and its rows) + combine; raw = "
      "MPI_Alltoallv there and back with the same counts; ratio = ep/raw medians\n#\n");
  std::printf("#%8s %6s %10s %6s %8s | %9s %9s %9s %7s %7s %7s | %9s %9s %9s %7s %7s %7s | %6s\n",
              "routing", "tokens", "bytes", "imbal", "plan", "ep time", "min", "max", "algbw",
              "busbw", "#wrong", "raw time", "min", "max", "algbw", "busbw", "#wrong", "ratio");
  std::printf("#%8s %6s %10s %6s %8s | %9s %9s %9s %7s %7s %7s | %9s %9s %9s %7s %7s %7s | %6s\n",
              "", "(T)", "(B)", "", "(us)", "(us)", "(us)", "(us)", "(GB/s)", "(GB/s)", "", "(us)",
              "(us)", "(us)", "(GB/s)", "(GB/s)", "", "");
}

void print_breakdown_header(const Comm& world) {
  if (world.rank() != 0) return;
  std::printf(
      "#\n# breakdown, each part alone (median us, slowest rank): counted = dispatch_counted (a "
      "new plan's first dispatch: its counts, before or with its rows); dispatch = a "
      "dispatch of a plan already counted (the backward pass's); combine; each = block or "
      "whole-pair messages (MPI_Isend/MPI_Irecv, own blocks copied) + MPI_Waitall; raw = one "
      "MPI_Alltoallv; raw_nb = MPI_Ialltoallv + MPI_Wait\n");
  std::printf("#%8s %6s %9s %9s %9s %9s %9s\n", "routing", "tokens", "counted", "dispatch",
              "combine", "raw", "raw_nb");
}

void print_breakdown_row(const Comm& world, Routing kind, int T, const Result& r) {
  if (world.rank() != 0) return;
  std::printf(" %8s %6d %9.1f %9.1f %9.1f %9.1f %9.1f\n", routing_name(kind), T, r.counted * 1e6,
              r.dispatch * 1e6, r.combine * 1e6, r.raw_one * 1e6, r.raw_nonblocking * 1e6);
  std::fflush(stdout);
}

void print_row(const Comm& world, Routing kind, int T, long long bytes, const Result& r) {
  if (world.rank() != 0) return;
  const double n = world.size(), bus = (n - 1) / n;
  auto bw = [&](double s) { return s > 0 ? 2.0 * static_cast<double>(bytes) / s / 1e9 : 0.0; };
  std::printf(
      " %8s %6d %10lld %6.2f %8.1f | %9.1f %9.1f %9.1f %7.2f %7.2f %7lld | %9.1f %9.1f "
      "%9.1f %7.2f %7.2f %7lld | %6.3f\n",
      routing_name(kind), T, bytes, r.imbalance, r.plan_us.median, r.ep.median * 1e6,
      r.ep.min * 1e6, r.ep.max * 1e6, bw(r.ep.median), bw(r.ep.median) * bus, r.ep_wrong,
      r.raw.median * 1e6, r.raw.min * 1e6, r.raw.max * 1e6, bw(r.raw.median),
      bw(r.raw.median) * bus, r.raw_wrong, r.ep.median / r.raw.median);
  std::fflush(stdout);
}

int run(int argc, char** argv) {
  const Comm world = Comm::world();
  const int min_tokens = static_cast<int>(arg_int(argc, argv, "--min-tokens", 64));
  const int max_tokens = static_cast<int>(arg_int(argc, argv, "--max-tokens", 4096));
  const int factor = static_cast<int>(std::max(2LL, arg_int(argc, argv, "--factor", 4)));
  const int D = static_cast<int>(arg_int(argc, argv, "--width", 128));
  const int K = static_cast<int>(arg_int(argc, argv, "--top-k", 3));
  const int E = static_cast<int>(arg_int(argc, argv, "--experts", 8));
  const int warmup = static_cast<int>(arg_int(argc, argv, "--warmup", 5));
  const int iters = static_cast<int>(std::max(1LL, arg_int(argc, argv, "--iters", 20)));
  const uint64_t seed = static_cast<uint64_t>(arg_int(argc, argv, "--seed", 1));
  const std::string which = arg_text(argc, argv, "--routing", "both");
  const bool breakdown = arg_flag(argc, argv, "--breakdown");
  const std::string counts_mode = arg_text(argc, argv, "--counts", "auto");
  const bool spans_hosts = world.split_shared().size() < world.size();  // alike on every rank
  const bool with_rows = counts_mode == "with" || (counts_mode == "auto" && spans_hosts);
  const EpExchange::Counts counts =
      with_rows ? EpExchange::Counts::kWithRows : EpExchange::Counts::kBeforeRows;
  if (E < world.size() || K > E || K < 1 || D < 4 || min_tokens < 1 ||
      (counts_mode != "auto" && counts_mode != "before" && counts_mode != "with")) {
    if (world.rank() == 0) {
      std::fprintf(stderr,
                   "bench_alltoall: needs experts >= ranks, 1 <= top-k <= experts, "
                   "width >= 4, tokens >= 1, --counts auto, before or with\n");
    }
    return 2;
  }
  print_banner(world, "bench_alltoall",
               "EpExchange dispatch+combine vs raw MPI_Alltoallv, same bytes", 1);
  print_header(world, K, E, D, warmup, iters);
  if (world.rank() == 0) {
    std::printf("# counts: %s (--counts %s; the ranks are on %s)\n#\n",
                with_rows ? "with the rows" : "all-to-all before the rows", counts_mode.c_str(),
                spans_hosts ? "several hosts" : "one host");
  }
  std::vector<Routing> kinds;
  if (which == "both" || which == "zipf") kinds.push_back(Routing::kZipf);
  if (which == "both" || which == "balanced") kinds.push_back(Routing::kBalanced);
  long long wrong = 0;
  std::vector<std::pair<Routing, int>> done;
  std::vector<Result> results;
  for (Routing kind : kinds) {
    for (long long T = min_tokens; T <= max_tokens; T *= factor) {
      const Result r = run_case(world, kind, static_cast<int>(T), K, E, D, warmup, iters, seed,
                                breakdown, counts);
      print_row(world, kind, static_cast<int>(T), T * K * D * static_cast<long long>(sizeof(float)),
                r);
      wrong += r.ep_wrong + r.raw_wrong;
      done.emplace_back(kind, static_cast<int>(T));
      results.push_back(r);
    }
  }
  if (breakdown) {
    print_breakdown_header(world);
    for (size_t i = 0; i < done.size(); ++i) {
      print_breakdown_row(world, done[i].first, done[i].second, results[i]);
    }
  }
  if (world.rank() == 0) std::printf("# wrong elements in total: %lld\n", wrong);
  return wrong == 0 ? 0 : 1;
}

}  // namespace
}  // namespace moe::bench

int main(int argc, char** argv) {
  return moe::bench::bench_mpi_main(argc, argv, moe::bench::run);
}

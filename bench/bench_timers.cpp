// The cost of the phase timers (model/phase_timer.hpp): one ScopedPhase with timing on (two
// steady_clock reads and an add) and off (a null PhaseTimes), to set against the ~100 scopes a
// deepseek4-tiny step opens. Run: build/bench/bench_timers
#include <benchmark/benchmark.h>

#include "model/phase_timer.hpp"

namespace {

void BM_ScopedPhaseOn(benchmark::State& state) {
  moe::PhaseTimes times;
  for (auto _ : state) {
    moe::ScopedPhase timer(&times, moe::Phase::kExperts);
    benchmark::DoNotOptimize(times);
  }
}
BENCHMARK(BM_ScopedPhaseOn);

void BM_ScopedPhaseOff(benchmark::State& state) {
  moe::PhaseTimes* none = nullptr;
  benchmark::DoNotOptimize(none);
  for (auto _ : state) {
    moe::ScopedPhase timer(none, moe::Phase::kExperts);
    benchmark::ClobberMemory();
  }
}
BENCHMARK(BM_ScopedPhaseOff);

}  // namespace

BENCHMARK_MAIN();

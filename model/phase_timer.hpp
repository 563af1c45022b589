// Per-phase wall-clock timers for one rank's step: where does a step's time go? A
// ScopedPhase adds the time between its construction and destruction to one slot of PhaseTimes;
// with a null PhaseTimes it does nothing, so code paths stay the same with timing off.
#pragma once

#include <array>
#include <chrono>

namespace moe {

enum class Phase : int {
  kAttention,  // attention forward (projections, RoPE, core)
  kRouter,     // router logits, scores, selection, weights, balance loss, dispatch plan
  kDispatch,   // count exchange and token all-to-all, forward
  kExperts,    // local routed experts and shared expert, forward
  kCombine,    // reverse all-to-all and weighted sum, forward
  kAttentionBackward,
  kRouterBackward,
  kDispatchBackward,  // dispatch's backward: input gradients return by all-to-all, summed
  kExpertsBackward,   // routed and shared experts
  kCombineBackward,   // combine's backward: weight gradients, output gradients out by all-to-all
  kOther,             // embedding, norms, LM head, loss, data: the rest of forward and backward
  kAllReduce,         // gradient, loss and load all-reduces
  kOptimizer,         // clipping, AdamW, bias update
  kStats,             // balance metrics, gathering, HDF5 writing
  kCheckpoint,        // gathering and writing a checkpoint (charged to the step after it)
  kCount
};
inline constexpr int kNumPhases = static_cast<int>(Phase::kCount);

// Names as written to /perf/phases.
inline constexpr std::array<const char*, kNumPhases> kPhaseNames = {
    "attention",     "router",     "dispatch",     "experts",     "combine",
    "attention_bwd", "router_bwd", "dispatch_bwd", "experts_bwd", "combine_bwd",
    "other",         "allreduce",  "optimizer",    "stats",       "checkpoint"};

struct PhaseTimes {
  std::array<double, kNumPhases> seconds{};  // accumulated since the last reset
  void reset() { seconds.fill(0.0); }
  double& operator[](Phase p) { return seconds[static_cast<int>(p)]; }
};

// The phases' clock. A step's own time is measured on it too, so that its phases, which lie
// within the step, never add up to more than the step's time.
using PhaseClock = std::chrono::steady_clock;
inline double phase_seconds_since(PhaseClock::time_point start) {
  return std::chrono::duration<double>(PhaseClock::now() - start).count();
}

class ScopedPhase {
 public:
  ScopedPhase(PhaseTimes* times, Phase phase) : times_(times), phase_(phase) {
    if (times_) start_ = PhaseClock::now();
  }
  ~ScopedPhase() {
    if (times_) (*times_)[phase_] += phase_seconds_since(start_);
  }
  ScopedPhase(const ScopedPhase&) = delete;
  ScopedPhase& operator=(const ScopedPhase&) = delete;

 private:
  PhaseTimes* times_;
  Phase phase_;
  PhaseClock::time_point start_;
};

}  // namespace moe

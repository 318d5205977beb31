// scripts/replay-ab's driver: replays each trace through the baseline's stream_pool and this
// checkout's, alternately (the order swapped every round), `rounds` times, and prints per trace
// the median over rounds of each side's per-operation p50 (interpolated within the counter's
// steps of about 10 ns) and mean (net of the timer), and in how many rounds this checkout's
// p50 was lower / equal; then, for both sides, the
// p50 of each kind of operation (with its share) and the mean of its fastest 90 % (it resolves
// what the p50's steps hide). Kinds: small (up to the default small_max: a lane's bin serves
// it, or the heap on a miss) and large (above: always the heap).
// Usage: replay-ab ROUNDS TRACE...
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <unordered_map>
#include <vector>

#include <vram/alloc/stream_pool.hpp>  // only for the default small_max
#include <vram/trace/detail/quantiles.hpp>
#include <vram/trace/read_trace.hpp>

#include "replay_op.hpp"

void replay_base(const std::vector<ab::op>&, const ab::shape&, std::vector<std::uint32_t>&, std::uint64_t&);
void replay_head(const std::vector<ab::op>&, const ab::shape&, std::vector<std::uint32_t>&, std::uint64_t&);

namespace {

/// Interpolated within the counter's steps (detail::trace::step_quantile): this VM's counter moves in
/// steps of about 10 ns, and the timer's own cost is read as 2 or 3 of them (the plain median
/// said 30 ns where its true cost is about 26).
double quantile(std::vector<std::uint32_t> v, double q) { return vram::detail::trace::step_quantile(v, q); }
/// The mean of the fastest 90 %: finer than a p50 on a counter that moves in 10-ns steps,
/// and free of the rare growths and preemptions that dominate a plain mean.
double trimmed_mean(std::vector<std::uint32_t> v) {
  std::sort(v.begin(), v.end());
  std::size_t n = std::max<std::size_t>(1, v.size() * 9 / 10);
  double sum = 0;
  for (std::size_t i = 0; i < n; ++i) sum += v[i];
  return sum / static_cast<double>(n);
}
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s ROUNDS TRACE...\n", argv[0]);
    return 2;
  }
  int rounds = std::max(1, std::atoi(argv[1]));
  // Ticks per nanosecond, and the timer's own cost (an empty region timed like an operation).
  auto clock0 = std::chrono::steady_clock::now();
  std::uint64_t tick0 = ab::ticks_now();
  while (std::chrono::steady_clock::now() - clock0 < std::chrono::milliseconds(200)) {
  }
  double per_ns = static_cast<double>(ab::ticks_now() - tick0) / 2e8;
  std::vector<std::uint32_t> empty(100000);
  for (auto& e : empty) {
    std::uint64_t start = ab::ticks_now();
    e = static_cast<std::uint32_t>(ab::ticks_now() - start);
  }
  double timer = quantile(empty, 0.5);
  std::printf("time-stamp counter: %.3f ticks/ns; timer %.1f ns (subtracted); %d rounds, order swapped each round\n",
              per_ns, timer / per_ns, rounds);
  std::printf("%-46s %9s %9s %11s %10s %10s\n", "trace", "base p50", "head p50", "head < / =", "base mean", "head mean");
  bool different_places = false;  // a trace whose blocks the two builds place differently: exit 1
  for (int a = 2; a < argc; ++a) {
    vram::trace::trace t = vram::trace::read_trace(argv[a]);
    std::vector<ab::op> ops;
    ops.reserve(t.events.size());
    std::unordered_map<std::uint64_t, std::uint32_t> slot_of;
    ab::shape shape{0, static_cast<std::uint32_t>(std::max<std::size_t>(1, t.streams))};
    for (const auto& e : t.events) {
      bool alloc = e.kind == vram::trace::event::op::alloc;
      std::uint32_t slot = alloc ? (slot_of[e.id] = shape.slots++) : slot_of.at(e.id);
      ops.push_back({slot, static_cast<std::uint32_t>(e.stream), e.bytes, alloc});
    }
    // Kinds: 0 small allocation, 1 small free, 2 large allocation, 3 large free.
    const std::size_t small_max = vram::stream_pool_options{}.small_max;
    std::vector<int> kind(ops.size());
    std::size_t count[4] = {};
    for (std::size_t i = 0; i < ops.size(); ++i) ++count[kind[i] = (ops[i].bytes > small_max ? 2 : 0) + (ops[i].alloc ? 0 : 1)];
    std::vector<double> p50[2], mean[2], kind_p50[2][4], kind_mean[2][4];
    std::vector<std::uint32_t> ticks, of_kind[4];
    std::uint64_t placement[2];
    replay_base(ops, shape, ticks, placement[0]);  // warm-up, not counted: the first replay pays page faults and cold caches
    replay_head(ops, shape, ticks, placement[1]);
    bool same_places = placement[0] == placement[1];
    int head_lower = 0, tied = 0;
    for (int r = 0; r < rounds; ++r) {
      for (int turn = 0; turn < 2; ++turn) {
        int side = (turn + r) % 2;  // 0: base, 1: head
        std::uint64_t placed;
        (side == 0 ? replay_base : replay_head)(ops, shape, ticks, placed);
        same_places = same_places && placed == placement[side];
        double sum = 0;
        for (std::uint32_t x : ticks) sum += x;
        p50[side].push_back((quantile(ticks, 0.5) - timer) / per_ns);
        mean[side].push_back((sum / static_cast<double>(ticks.size()) - timer) / per_ns);
        for (auto& v : of_kind) v.clear();
        for (std::size_t i = 0; i < ticks.size(); ++i) of_kind[kind[i]].push_back(ticks[i]);
        for (int k = 0; k < 4; ++k) {
          if (of_kind[k].empty()) continue;
          kind_p50[side][k].push_back((quantile(of_kind[k], 0.5) - timer) / per_ns);
          kind_mean[side][k].push_back((trimmed_mean(of_kind[k]) - timer) / per_ns);
        }
      }
      head_lower += p50[1].back() < p50[0].back();
      tied += p50[1].back() == p50[0].back();
    }
    const char* name = argv[a];
    for (const char* c = argv[a]; *c != '\0'; ++c)
      if (*c == '/') name = c + 1;
    std::printf("%-46s %9.1f %9.1f %5d / %-3d %10.1f %10.1f\n", name, median(p50[0]), median(p50[1]), head_lower, tied,
                median(mean[0]), median(mean[1]));
    const char* kind_name[4] = {"small alloc", "small free", "large alloc", "large free"};
    std::printf("  p50 by kind (share of operations), base -> head:");
    for (int k = 0; k < 4; ++k)
      if (!kind_p50[1][k].empty())
        std::printf(" %s %.1f -> %.1f ns (%.0f %%)%s", kind_name[k], median(kind_p50[0][k]), median(kind_p50[1][k]),
                    100.0 * static_cast<double>(count[k]) / static_cast<double>(ops.size()), k < 3 ? "," : "");
    std::printf("\n  mean of the fastest 90 %% by kind, base -> head:");
    for (int k = 0; k < 4; ++k)
      if (!kind_mean[1][k].empty())
        std::printf(" %s %.1f -> %.1f%s", kind_name[k], median(kind_mean[0][k]), median(kind_mean[1][k]), k < 3 ? "," : "");
    std::printf("\n  returned addresses, base vs head: %s\n", same_places ? "identical" : "DIFFERENT");
    if (!same_places) different_places = true;
  }
  return different_places ? 1 : 0;
}

#pragma once
// An adversarial harness for stream-ordered allocators, over steps of a training-like loop:
// every block is pattern-filled on its stream and verified on its stream just before its
// free (where it is then overwritten, so that work still pending at a free is a write); the live ranges are checked for overlap on every allocation; check_invariants() runs
// at every step boundary; the streams lag behind the host at random (slow tasks), so that a
// block handed out before another stream's work on its bytes is finished is seen unordered
// (its first task finds that work not done) and, where the late write lands, corrupted. The steps repeat with mutations (entries missing, added, resized,
// swapped, freed late, a shape that changes every N steps, eval steps, a smaller last batch,
// gradient accumulation), single-threaded on several streams or with one thread per stream.
//
// A resource under test needs allocate(stream_ref, bytes), deallocate(stream_ref, p, bytes),
// check_invariants() and stats(); mark_step() is called at each boundary where it has one.

#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include <vram/core/host_stream.hpp>
#include <vram/core/stream_ref.hpp>

namespace vram::test::adversarial {

/// One event of a step: the allocation of `bytes` under `name` on `stream`, or its free.
/// A name is on one stream for the whole run; a free of a name not live is skipped (the
/// first step frees the gradients of a step before it that never ran).
struct op {
  bool alloc = true;
  std::uint32_t name = 0;
  std::size_t bytes = 0;
  unsigned stream = 0;
};
using step_ops = std::vector<op>;

/// The shape of a training-like step.
struct step_shape {
  unsigned layers = 12;
  std::size_t activation = 96 << 10;  ///< bytes per saved activation (scaled by the batch)
  std::size_t parameter = 64 << 10;   ///< bytes of each layer's weight and gradient
  double batch = 1.0;                 ///< batch scale of the activations
  unsigned micro_steps = 1;           ///< gradient accumulation: forward/backward passes per step
  bool eval = false;                  ///< forward only, no gradients, no optimizer
  /// zero_grad after the forward, before backward (`optimizer.zero_grad(); loss.backward()`):
  /// the last step's gradients live beside this step's activations.
  bool zero_grad_late = false;
  /// The loss (a small block made at the end of the forward) lives until the next step's
  /// replaces it (`loss = model(batch)`): a leftover freed late in the step, long after the
  /// gradients.
  bool loss_crosses = false;
  unsigned streams = 3;               ///< 0: compute; temporaries on every stream; 2: the optimizer
};

// Names: weights and optimizer state (live for the whole run), gradients (freed by the next
// step's zero_grad), the loss (by the next step's forward), activations and temporaries
// (inside the step).
inline constexpr std::uint32_t weight_name = 1u << 28, state_name = 2u << 28, grad_name = 3u << 28,
                               loss_name = 4u << 28;

/// One step of a loop like PyTorch's: zero_grad frees the last step's gradients (first, or
/// after the forward with zero_grad_late); forward saves an activation per layer (with a
/// short temporary beside each, on the streams in turn); backward frees them in reverse and
/// allocates each layer's gradient, which outlives the step; the optimizer's foreach
/// temporaries come and go on their own stream, and its state is made once, in the first
/// step that runs it.
inline step_ops training_step(const step_shape& s, std::uint32_t& next_name, bool first_optimizer_step) {
  step_ops ops;
  auto fresh = [&] { return next_name++; };
  const unsigned opt = s.streams > 2 ? 2 : 0;
  const auto act = static_cast<std::size_t>(double(s.activation) * s.batch);
  auto zero_grad = [&] {
    for (unsigned l = 0; l < s.layers; ++l) ops.push_back({false, grad_name + l, s.parameter, 0});
  };
  if (!s.eval && !s.zero_grad_late) zero_grad();
  for (unsigned m = 0; m < s.micro_steps; ++m) {
    std::vector<std::uint32_t> saved;
    for (unsigned l = 0; l < s.layers; ++l) {
      std::uint32_t t = fresh();
      unsigned ts = l % s.streams;
      ops.push_back({true, t, act / 2 + 256 * l, ts});
      std::uint32_t a = fresh();
      ops.push_back({true, a, act + 512 * (l % 4), 0});
      ops.push_back({false, t, act / 2 + 256 * l, ts});
      if (s.eval) {
        ops.push_back({false, a, act + 512 * (l % 4), 0});
      } else {
        saved.push_back(a);
      }
    }
    if (s.eval) continue;
    if (m == 0 && s.loss_crosses) {
      ops.push_back({false, loss_name, 4096, 0});  // the last step's
      ops.push_back({true, loss_name, 4096, 0});
    }
    if (m == 0 && s.zero_grad_late) zero_grad();
    for (unsigned l = s.layers; l-- > 0;) {
      std::uint32_t a = saved[l];
      std::uint32_t t = fresh();
      unsigned ts = (l + 1) % s.streams;
      ops.push_back({true, t, act / 4 + 128, ts});
      if (m == 0) ops.push_back({true, grad_name + l, s.parameter, 0});  // accumulated into after
      ops.push_back({false, t, act / 4 + 128, ts});
      ops.push_back({false, a, act + 512 * (l % 4), 0});
    }
  }
  if (s.eval) return ops;
  std::vector<std::uint32_t> temps;
  for (unsigned l = 0; l < s.layers; ++l) {
    if (first_optimizer_step) ops.push_back({true, state_name + l, 2 * s.parameter, opt});
    std::uint32_t t = fresh();
    temps.push_back(t);
    ops.push_back({true, t, s.parameter, opt});
  }
  for (std::uint32_t t : temps) ops.push_back({false, t, s.parameter, opt});
  return ops;
}

enum class mutation {
  none,
  missing,         ///< allocations (and their frees) left out at random
  added,           ///< extra short-lived allocations at random places
  resized,         ///< allocations of another size than the plan's
  swapped,         ///< neighbouring allocations in the other order
  freed_late,      ///< frees moved later, some past the step's end
  reshaped,        ///< every 3rd step another sequence length
  eval_every,      ///< an eval step (forward only) every 3rd step
  smaller_last,    ///< the last step a smaller batch
  accumulation,    ///< every step 2 micro-steps of gradient accumulation, every 4th one 3
};

inline const char* name_of(mutation m) {
  switch (m) {
    case mutation::none: return "none";
    case mutation::missing: return "missing";
    case mutation::added: return "added";
    case mutation::resized: return "resized";
    case mutation::swapped: return "swapped";
    case mutation::freed_late: return "freed late";
    case mutation::reshaped: return "reshaped every 3";
    case mutation::eval_every: return "eval every 3";
    case mutation::smaller_last: return "smaller last batch";
    case mutation::accumulation: return "accumulation";
  }
  return "?";
}

inline constexpr mutation all_mutations[] = {mutation::none,        mutation::missing,    mutation::added,
                                             mutation::resized,     mutation::swapped,    mutation::freed_late,
                                             mutation::reshaped,    mutation::eval_every, mutation::smaller_last,
                                             mutation::accumulation};

/// The steps of a run: `steps` steps of `base`, mutated. Index k is step k; what a step frees
/// late is appended to the next one after its first few events.
inline std::vector<step_ops> mutated_steps(const step_shape& base, mutation m, int steps, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uint32_t next_name = 0;
  std::vector<step_ops> out;
  std::vector<op> late;  // frees carried into the next step
  bool optimizer_ran = false;
  for (int k = 0; k < steps; ++k) {
    step_shape s = base;
    if (m == mutation::reshaped && k % 3 == 2) s.batch *= 1.5;
    if (m == mutation::eval_every && k % 3 == 2) s.eval = true;
    if (m == mutation::smaller_last && k == steps - 1) s.batch *= 0.4;
    if (m == mutation::accumulation) s.micro_steps = k % 4 == 3 ? 3 : 2;
    step_ops ops;
    if (k == 0)
      for (unsigned l = 0; l < base.layers; ++l) ops.push_back({true, weight_name + l, base.parameter, 0});
    step_ops step = training_step(s, next_name, !s.eval && !optimizer_ran);
    ops.insert(ops.end(), step.begin(), step.end());
    optimizer_ran |= !s.eval;
    const bool mutate = k >= 2;  // the first two steps repeat: a plan is made and served once
    if (mutate && m == mutation::missing) {
      std::vector<std::uint32_t> gone;
      for (const op& o : ops)
        if (o.alloc && o.name < weight_name && rng() % 8 == 0) gone.push_back(o.name);
      std::erase_if(ops, [&](const op& o) { return std::find(gone.begin(), gone.end(), o.name) != gone.end(); });
    }
    if (mutate && m == mutation::added) {
      for (int x = 0; x < 4; ++x) {
        std::size_t at = rng() % (ops.size() + 1);
        std::uint32_t n = next_name++;
        std::size_t bytes = 256 * (1 + rng() % 512);
        unsigned st = static_cast<unsigned>(rng() % base.streams);
        ops.insert(ops.begin() + static_cast<std::ptrdiff_t>(at), {{true, n, bytes, st}, {false, n, bytes, st}});
      }
    }
    if (mutate && m == mutation::resized) {
      std::map<std::uint32_t, std::size_t> bigger;
      for (const op& o : ops)
        if (o.alloc && o.name < weight_name && rng() % 6 == 0) bigger[o.name] = o.bytes + 256 * (1 + rng() % 64);
      for (op& o : ops)
        if (auto it = bigger.find(o.name); it != bigger.end()) o.bytes = it->second;
    }
    if (mutate && m == mutation::swapped) {
      for (std::size_t i = 0; i + 1 < ops.size(); ++i)
        if (ops[i].alloc && ops[i + 1].alloc && rng() % 4 == 0) std::swap(ops[i], ops[i + 1]), ++i;
    }
    if (!late.empty()) {  // the last step's late frees, after a few of this step's events
      std::size_t at = std::min<std::size_t>(ops.size(), 3);
      ops.insert(ops.begin() + static_cast<std::ptrdiff_t>(at), late.begin(), late.end());
      late.clear();
    }
    if (mutate && m == mutation::freed_late) {
      for (std::size_t i = 0; i < ops.size(); ++i) {
        if (ops[i].alloc || ops[i].name >= weight_name || rng() % 10 != 0) continue;
        op f = ops[i];
        ops.erase(ops.begin() + static_cast<std::ptrdiff_t>(i));
        if (rng() % 2 == 0) {
          late.push_back(f);
        } else {
          std::size_t to = i + rng() % (ops.size() - i + 1);
          ops.insert(ops.begin() + static_cast<std::ptrdiff_t>(to), f);
        }
      }
    }
    out.push_back(std::move(ops));
  }
  if (!late.empty()) out.back().insert(out.back().end(), late.begin(), late.end());
  return out;
}

/// What a run found.
struct findings {
  std::size_t corrupted = 0;           ///< blocks whose pattern did not survive until their free
  std::size_t unordered = 0;           ///< blocks filled before another stream's last task on their bytes ran
  std::size_t overlaps = 0;            ///< allocations overlapping a live block
  std::size_t invariant_failures = 0;  ///< check_invariants() throws at a boundary
  std::string first_invariant_failure;
  std::size_t peak_reserved = 0;       ///< over the steps from the third on (once a plan serves)
  std::size_t allocations = 0;
};

namespace detail {

/// The live ranges of every block, checked for overlap on insertion.
class live_ranges {
 public:
  bool insert(const void* p, std::size_t bytes) {
    std::lock_guard lock(mutex_);
    auto a = reinterpret_cast<std::uintptr_t>(p);
    auto next = ranges_.lower_bound(a);
    bool overlap = (next != ranges_.end() && next->first < a + bytes);
    if (next != ranges_.begin() && std::prev(next)->second > a) overlap = true;
    if (!overlap) ranges_.emplace(a, a + bytes);
    return !overlap;
  }
  void erase(const void* p) {
    std::lock_guard lock(mutex_);
    ranges_.erase(reinterpret_cast<std::uintptr_t>(p));
  }

 private:
  std::mutex mutex_;
  std::map<std::uintptr_t, std::uintptr_t> ranges_;
};

/// The freed blocks whose last task has not run yet: a block handed out over their bytes must
/// be ordered after those tasks, which its first task checks (the stream-order invariant,
/// seen whenever the freeing stream lags, not only when a late write happens to land).
class pending_frees {
 public:
  using flag = std::shared_ptr<std::atomic<bool>>;
  void add(const void* p, std::size_t bytes, flag done) {
    std::lock_guard lock(mutex_);
    auto a = reinterpret_cast<std::uintptr_t>(p);
    pending_.push_back({a, a + bytes, std::move(done)});
  }
  /// The flags of the pending frees overlapping [p, p + bytes); drops those already done.
  std::vector<flag> overlapping(const void* p, std::size_t bytes) {
    std::lock_guard lock(mutex_);
    auto a = reinterpret_cast<std::uintptr_t>(p);
    std::erase_if(pending_, [](const entry& e) { return e.done->load(); });
    std::vector<flag> out;
    for (const entry& e : pending_)
      if (e.begin < a + bytes && a < e.end) out.push_back(e.done);
    return out;
  }

 private:
  struct entry {
    std::uintptr_t begin, end;
    flag done;
  };
  std::mutex mutex_;
  std::vector<entry> pending_;
};

inline unsigned char pattern_of(std::uint64_t serial) { return static_cast<unsigned char>(1 + serial * 37 % 251); }
inline constexpr unsigned char poison = 0;  // what a block's last task leaves in it: no pattern

/// Every 256th byte and the last: two blocks at 256-aligned starts that overlap share one.
inline bool intact(const unsigned char* p, std::size_t bytes, unsigned char pattern) {
  for (std::size_t b = 0; b < bytes; b += 256)
    if (p[b] != pattern) return false;
  return p[bytes - 1] == pattern;
}

}  // namespace detail

/// Runs `steps` on `r` with `streams.size()` host streams. threaded: one thread per stream,
/// each issuing its stream's events in order, the threads meeting at each boundary (where one
/// of them marks the step); else one thread issues every event in order. Lag: one task in
/// `lag_one_in` is preceded on its stream by a sleep of up to 1 ms.
template <class R>
findings run(R& r, const std::vector<step_ops>& steps, std::vector<host_stream>& streams, bool threaded,
             std::uint64_t seed, unsigned lag_one_in = 4) {
  findings out;
  detail::live_ranges ranges;
  detail::pending_frees pending;
  std::atomic<std::size_t> corrupted{0}, unordered{0}, overlaps{0}, allocations{0};
  struct block {
    void* p;
    std::size_t bytes;
    unsigned char pattern;
    unsigned stream;
  };
  std::atomic<std::uint64_t> serial{1};
  auto check_boundary = [&](int k) {
    try {
      r.check_invariants();
    } catch (const std::exception& e) {
      if (out.invariant_failures++ == 0) out.first_invariant_failure = e.what();
    }
    if (k >= 2) out.peak_reserved = std::max<std::size_t>(out.peak_reserved, r.stats().reserved_bytes);
    if constexpr (requires { r.mark_step(); }) r.mark_step();
  };
  // The events of one stream (or all, single-threaded), with that worker's own live map.
  auto issue = [&](const step_ops& ops, std::unordered_map<std::uint32_t, block>& live, std::mt19937_64& rng,
                   int only_stream) {
    for (const op& o : ops) {
      if (only_stream >= 0 && o.stream != static_cast<unsigned>(only_stream)) continue;
      host_stream& s = streams[o.stream % streams.size()];
      const bool lag = rng() % lag_one_in == 0;
      const auto pause = std::chrono::microseconds(rng() % 1000);
      if (o.alloc) {
        void* p = r.allocate(s, o.bytes);
        ++allocations;
        if (!ranges.insert(p, o.bytes)) ++overlaps;
        const unsigned char pattern = detail::pattern_of(serial++);
        live[o.name] = {p, o.bytes, pattern, o.stream};
        s.enqueue([=, &unordered, before = pending.overlapping(p, o.bytes)] {
          if (lag) std::this_thread::sleep_for(pause);
          for (const auto& done : before)
            if (!done->load()) ++unordered;
          std::memset(p, pattern, o.bytes);
        });
      } else {
        auto it = live.find(o.name);
        if (it == live.end()) continue;
        block b = it->second;
        live.erase(it);
        auto done = std::make_shared<std::atomic<bool>>(false);
        pending.add(b.p, b.bytes, done);
        s.enqueue([=, &corrupted] {  // the block's last use writes, as a kernel does
          if (lag) std::this_thread::sleep_for(pause);
          if (!detail::intact(static_cast<const unsigned char*>(b.p), b.bytes, b.pattern)) ++corrupted;
          std::memset(b.p, detail::poison, b.bytes);
          done->store(true);
        });
        ranges.erase(b.p);
        r.deallocate(s, b.p, b.bytes);
      }
    }
  };
  const int n = static_cast<int>(steps.size());
  std::vector<std::unordered_map<std::uint32_t, block>> live(threaded ? streams.size() : 1);
  if (!threaded) {
    std::mt19937_64 rng(seed);
    for (int k = 0; k < n; ++k) {
      check_boundary(k);
      issue(steps[static_cast<std::size_t>(k)], live[0], rng, -1);
    }
  } else {
    // The boundary runs alone: every thread has issued its events of the step, none of the next.
    int k = 0;  // the boundary's step: touched only by the barrier's completion
    std::barrier sync(static_cast<std::ptrdiff_t>(streams.size()), [&]() noexcept {
      try {
        check_boundary(k++);
      } catch (...) {
        ++out.invariant_failures;
      }
    });
    std::vector<std::thread> workers;
    for (std::size_t t = 0; t < streams.size(); ++t)
      workers.emplace_back([&, t] {
        std::mt19937_64 rng(seed + t);
        for (int step = 0; step < n; ++step) {
          sync.arrive_and_wait();
          issue(steps[static_cast<std::size_t>(step)], live[t], rng, static_cast<int>(t));
        }
      });
    for (auto& w : workers) w.join();
  }
  // What is still live at the end (weights, state, gradients, late frees) is freed, checked first.
  for (auto& m : live)
    for (auto& [name, b] : m) {
      host_stream& s = streams[b.stream % streams.size()];
      s.enqueue([=, &corrupted] {
        if (!detail::intact(static_cast<const unsigned char*>(b.p), b.bytes, b.pattern)) ++corrupted;
      });
      ranges.erase(b.p);
      r.deallocate(s, b.p, b.bytes);
    }
  for (auto& s : streams) s.synchronize();
  try {
    r.check_invariants();
  } catch (const std::exception& e) {
    if (out.invariant_failures++ == 0) out.first_invariant_failure = e.what();
  }
  out.corrupted = corrupted;
  out.unordered = unordered;
  out.overlaps = overlaps;
  out.allocations = allocations;
  return out;
}

}  // namespace vram::test::adversarial

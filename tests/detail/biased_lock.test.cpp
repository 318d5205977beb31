// detail::biased_lock: mutual exclusion (lock, try_lock, try_enter) between the thread it is
// biased to (on the bias and off it) and the others, the bias moving between threads,
// revocation, and a forked child.

#include <catch2/catch.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include <vram/detail/biased_lock.hpp>

using vram::detail::biased_guard;
using vram::detail::biased_lock;
using vram::detail::heavy_barrier;
using vram::detail::thread_slot;
using vram::detail::thread_slots;

namespace {

// A critical section that detects any overlap: it marks itself inside, and bumps a plain
// counter in two steps that another thread inside at the same time would break.
struct section {
  std::atomic<int> inside{0};
  std::uint64_t count = 0;  // only under the lock
  std::atomic<bool> overlapped{false};

  void run() {
    if (inside.exchange(1, std::memory_order_relaxed) != 0) overlapped = true;
    const std::uint64_t before = count;
    count = before + 1;
    if (inside.exchange(0, std::memory_order_relaxed) != 1) overlapped = true;
  }
};

// Enters until `stop`; returns the entries made while the lock was biased to this thread,
// adds every entry to `entries`.
std::uint64_t enter_until(biased_lock& lock, section& s, const std::atomic<bool>& stop, std::uint64_t& entries) {
  const std::size_t me = thread_slot::get();
  std::uint64_t on_bias = 0;
  while (!stop.load(std::memory_order_relaxed)) {
    lock.lock();
    s.run();
    on_bias += lock.biased_to() == me;
    lock.unlock();
    ++entries;
  }
  return on_bias;
}

void enter_times(biased_lock& lock, std::uint32_t n) {
  for (std::uint32_t i = 0; i < n; ++i) biased_guard g(lock);
}

}  // namespace

TEST_CASE("biased_lock: biases itself to a thread that keeps coming; another thread revokes it", "[detail][biased_lock]") {
#if defined(__linux__)
  REQUIRE(heavy_barrier::available());  // membarrier: every Linux kernel since 4.14
#endif
  const std::size_t me = thread_slot::get();
  REQUIRE(me < thread_slots);
  biased_lock lock;
  CHECK(lock.biased_to() == thread_slots);
  enter_times(lock, biased_lock::rebias_after);
  REQUIRE(lock.biased_to() == (heavy_barrier::available() ? me : thread_slots));
  if (!heavy_barrier::available()) return;  // no barrier: never biased, the spin_lock is the lock
  lock.lock();
  CHECK(lock.biased_to() == me);  // inside on the bias
  lock.unlock();

  std::size_t seen_inside = 0;
  std::thread other([&] {
    biased_guard g(lock);
    seen_inside = lock.biased_to();
  });
  other.join();
  CHECK(seen_inside == thread_slots);  // revoked before it entered
  REQUIRE(lock.try_lock());  // through the spin lock
  CHECK(lock.biased_to() == thread_slots);
  lock.unlock();
  // A bias revoked this soon did not pay for its barrier: the next takes more entries (twice
  // as many, unless this thread stalled past min_bias_time), never more than the maximum.
  std::uint32_t entries = 1;
  while (lock.biased_to() != me && entries < biased_lock::max_rebias_after) {
    enter_times(lock, 1);
    ++entries;
  }
  CHECK(lock.biased_to() == me);
  CHECK(entries > biased_lock::rebias_after / 2);

  {  // a lock_guard (BasicLockable) by the owner keeps the bias
    std::lock_guard g(lock);
  }
  CHECK(lock.biased_to() == me);
}

TEST_CASE("biased_lock: a thread past the thread slots is never biased, and a slotted thread still is after it", "[detail][biased_lock]") {
  // Park threads on every free slot, then the next thread runs on the shared overflow slot.
  std::atomic<bool> release{false};
  std::vector<std::thread> parked;
  biased_lock lock;
  std::size_t overflow_slot = 0;
  bool overflow_tried_lock = false, overflow_biased = true;
  for (;;) {
    REQUIRE(parked.size() <= thread_slots);
    std::atomic<int> got{-1};
    std::thread t([&] {
      const std::size_t slot = thread_slot::get();
      got = static_cast<int>(slot);
      if (slot < thread_slots) {
        while (!release.load()) std::this_thread::yield();
        return;
      }
      overflow_slot = slot;
      for (std::uint32_t i = 0; i < 3 * biased_lock::rebias_after; ++i) {
        if (i % 2 == 0) {
          biased_guard g(lock);
        } else if (lock.try_lock()) {
          overflow_tried_lock = true;
          lock.unlock();
        }
      }
      overflow_biased = lock.biased();
    });
    while (got.load() < 0) std::this_thread::yield();
    if (static_cast<std::size_t>(got.load()) == thread_slots) {
      t.join();
      break;
    }
    parked.push_back(std::move(t));
  }
  release = true;
  for (auto& t : parked) t.join();
  CHECK(overflow_slot == thread_slots);
  CHECK(overflow_tried_lock);
  CHECK_FALSE(overflow_biased);
  if (!heavy_barrier::available()) return;
  const std::size_t me = thread_slot::get();
  REQUIRE(me < thread_slots);
  enter_times(lock, biased_lock::rebias_after);
  CHECK(lock.biased_to() == me);
}

TEST_CASE("biased_lock: try_lock and try_enter fail, not wait, while another thread is inside, on its bias or not", "[detail][biased_lock]") {
  for (const bool biased : {false, true}) {
    biased_lock lock;
    std::atomic<int> phase{0};
    std::size_t holder_bias = 0;
    std::thread holder([&] {
      if (biased) enter_times(lock, biased_lock::rebias_after);
      lock.lock();
      holder_bias = lock.biased_to();
      phase = 1;
      while (phase.load() != 2) std::this_thread::yield();
      lock.unlock();
    });
    while (phase.load() != 1) std::this_thread::yield();
    CHECK_FALSE(lock.try_lock());
    CHECK_FALSE(lock.try_enter());
    phase = 2;
    holder.join();
    CHECK((holder_bias != thread_slots) == (biased && heavy_barrier::available()));
    REQUIRE(lock.try_lock());
    CHECK(lock.biased_to() == thread_slots);  // the holder's bias, if any, was revoked
    lock.unlock();
  }
}

TEST_CASE("biased_lock: after a try_lock revoked the bias of an owner inside, lock() waits for it to leave", "[detail][biased_lock]") {
  biased_lock lock;
  std::atomic<int> phase{0};
  std::atomic<bool> holder_inside{false};
  std::thread holder([&] {
    enter_times(lock, biased_lock::rebias_after);
    lock.lock();  // on its bias, where the barrier exists
    holder_inside = true;
    phase = 1;
    while (phase.load() != 2) std::this_thread::yield();
    holder_inside = false;
    lock.unlock();
  });
  while (phase.load() != 1) std::this_thread::yield();
  CHECK_FALSE(lock.try_lock());  // revokes the bias, finds the owner inside, gives up
  bool overlapped = false;
  std::thread locker([&] {
    lock.lock();
    overlapped = holder_inside.load();
    lock.unlock();
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  phase = 2;
  holder.join();
  locker.join();
  CHECK_FALSE(overlapped);
}

TEST_CASE("biased_lock: the owner and other threads never overlap, on the bias or off it", "[detail][biased_lock]") {
  biased_lock lock;
  section s;
  std::atomic<bool> stop{false};
  std::uint64_t owner_entries = 0, on_bias = 0;
  std::thread owner([&] { on_bias = enter_until(lock, s, stop, owner_entries); });
  constexpr int others = 3, rounds = 400;
  std::vector<std::thread> threads;
  for (int t = 0; t < others; ++t)
    threads.emplace_back([&] {
      for (int i = 0; i < rounds; ++i) {
        {
          std::lock_guard g(lock);
          s.run();
        }
        // A pause in which the owner enters alone often enough to bias the lock again.
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
    });
  for (auto& t : threads) t.join();
  stop = true;
  owner.join();
  CHECK_FALSE(s.overlapped.load());
  CHECK(s.count == owner_entries + std::uint64_t{others} * rounds);
  INFO("owner entries " << owner_entries << ", on the bias " << on_bias);
  if (heavy_barrier::available()) CHECK(on_bias > 0);  // the bias was taken, and revoked
  CHECK(on_bias < owner_entries);
}

TEST_CASE("biased_lock: the bias moves between threads that come in bursts, and never lets two in", "[detail][biased_lock]") {
  biased_lock lock;
  section s;
  constexpr int threads_n = 4, bursts = 300;
  std::atomic<std::uint64_t> entries{0}, on_bias{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < threads_n; ++t)
    threads.emplace_back([&, t] {
      std::mt19937 rng(t);
      for (int b = 0; b < bursts; ++b) {
        const int burst = std::uniform_int_distribution<int>(1, 4 * int{biased_lock::rebias_after})(rng);
        for (int i = 0; i < burst; ++i) {
          const auto how = rng() % 4;  // 0: try_lock, 1: try_enter (left by leave), else lock
          biased_lock::entry in;
          if (how == 0) {
            if (!lock.try_lock()) continue;
          } else if (how == 1) {
            if (!(in = lock.try_enter())) continue;
          } else {
            lock.lock();
          }
          s.run();
          const bool mine = lock.biased_to() == thread_slot::get();
          if (how == 1)
            lock.leave(in);
          else
            lock.unlock();
          entries.fetch_add(1, std::memory_order_relaxed);
          if (mine) on_bias.fetch_add(1, std::memory_order_relaxed);
        }
        if (rng() % 8 == 0) std::this_thread::yield();
      }
    });
  for (auto& t : threads) t.join();
  CHECK_FALSE(s.overlapped.load());
  CHECK(s.count == entries.load());
  INFO("entries " << entries.load() << ", on the bias " << on_bias.load());
  if (heavy_barrier::available()) CHECK(on_bias.load() > 0);
}

TEST_CASE("biased_lock: a forked child revokes and re-biases the lock it inherited", "[detail][biased_lock]") {
  biased_lock lock;
  enter_times(lock, biased_lock::rebias_after);
  const std::size_t me = thread_slot::get();
  REQUIRE(lock.biased_to() == (heavy_barrier::available() ? me : thread_slots));
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    // The child's one thread holds the bias; a thread of its own revokes it, against the
    // owner entering on the bias meanwhile.
    section s;
    std::atomic<bool> stop{false};
    std::uint64_t entries = 0;
    std::thread other([&] {
      for (int i = 0; i < 200; ++i) {
        {
          biased_guard g(lock);
          s.run();
        }
        std::this_thread::sleep_for(std::chrono::microseconds(20));
      }
      stop = true;
    });
    enter_until(lock, s, stop, entries);
    other.join();
    ::_exit(!s.overlapped.load() && s.count == entries + 200 ? 0 : 1);
  }
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  CHECK(lock.biased_to() == (heavy_barrier::available() ? me : thread_slots));  // the parent's lock is its own
}

// detail::biased_lock: mutual exclusion between its owner (on the bias and off it) and other
// threads, revocation and re-biasing, a lock without owner, and a forked child.

#include <catch2/catch.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

#include <vram/detail/biased_lock.hpp>

using vram::detail::biased_lock;
using vram::detail::heavy_barrier;
using vram::detail::other_guard;
using vram::detail::owner_guard;

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

// Enters as owner until `stop`, counting the entries made on the bias.
std::uint64_t own_until(biased_lock& lock, section& s, const std::atomic<bool>& stop, std::uint64_t& entries) {
  std::uint64_t on_bias = 0;
  while (!stop.load(std::memory_order_relaxed)) {
    const bool biased = lock.owner_lock();
    s.run();
    lock.owner_unlock(biased);
    on_bias += biased;
    ++entries;
  }
  return on_bias;
}

}  // namespace

TEST_CASE("biased_lock: the owner enters on the bias after a quiet spell, another thread revokes it", "[detail][biased_lock]") {
#if defined(__linux__)
  REQUIRE(heavy_barrier::available());  // membarrier: every Linux kernel since 4.14
#endif
  biased_lock lock;
  CHECK_FALSE(lock.biased());
  for (std::uint32_t i = 0; i < biased_lock::rebias_after; ++i) {
    owner_guard g(lock);
  }
  REQUIRE(lock.biased() == heavy_barrier::available());
  if (!heavy_barrier::available()) return;  // no barrier: never biased, the spin_lock is the lock
  CHECK(lock.owner_lock());  // on the bias
  lock.owner_unlock(true);

  std::thread other([&] { other_guard g(lock); });
  other.join();
  CHECK_FALSE(lock.biased());
  CHECK_FALSE(lock.owner_lock());  // through the spin_lock
  lock.owner_unlock(false);
  for (std::uint32_t i = 1; i < biased_lock::rebias_after; ++i) {
    owner_guard g(lock);
  }
  CHECK(lock.biased());
}

TEST_CASE("biased_lock: owner and other threads never overlap, on the bias or off it", "[detail][biased_lock]") {
  biased_lock lock;
  section s;
  std::atomic<bool> stop{false};
  std::uint64_t owner_entries = 0, on_bias = 0;
  std::thread owner([&] { on_bias = own_until(lock, s, stop, owner_entries); });
  constexpr int others = 3, rounds = 400;
  std::vector<std::thread> threads;
  for (int t = 0; t < others; ++t)
    threads.emplace_back([&] {
      for (int i = 0; i < rounds; ++i) {
        {
          other_guard g(lock);
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
  if (heavy_barrier::available()) CHECK(on_bias > 0);  // the bias was taken, and revoked
  INFO("owner entries " << owner_entries << ", on the bias " << on_bias);
  CHECK(on_bias < owner_entries);
}

TEST_CASE("biased_lock: never biased, any thread may enter as owner", "[detail][biased_lock]") {
  biased_lock lock;
  lock.never_bias();
  section s;
  constexpr int threads_n = 4, rounds = 20000;
  std::vector<std::thread> threads;
  std::atomic<int> on_bias{0};
  for (int t = 0; t < threads_n; ++t)
    threads.emplace_back([&] {
      for (int i = 0; i < rounds; ++i) {
        const bool biased = lock.owner_lock();
        s.run();
        lock.owner_unlock(biased);
        on_bias += biased;
      }
    });
  for (auto& t : threads) t.join();
  CHECK_FALSE(s.overlapped.load());
  CHECK(s.count == std::uint64_t{threads_n} * rounds);
  CHECK(on_bias == 0);
  CHECK_FALSE(lock.biased());
}

TEST_CASE("biased_lock: a forked child revokes and re-biases the lock it inherited", "[detail][biased_lock]") {
  biased_lock lock;
  for (std::uint32_t i = 0; i < biased_lock::rebias_after; ++i) {
    owner_guard g(lock);
  }
  REQUIRE(lock.biased() == heavy_barrier::available());
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    // The child's one thread is the owner; a thread of its own revokes, against the owner
    // entering on the bias meanwhile.
    section s;
    std::atomic<bool> stop{false};
    std::uint64_t entries = 0;
    std::thread other([&] {
      for (int i = 0; i < 200; ++i) {
        {
          other_guard g(lock);
          s.run();
        }
        std::this_thread::sleep_for(std::chrono::microseconds(20));
      }
      stop = true;
    });
    own_until(lock, s, stop, entries);
    other.join();
    ::_exit(!s.overlapped.load() && s.count == entries + 200 ? 0 : 1);
  }
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  CHECK(lock.biased() == heavy_barrier::available());  // the parent's lock is its own
}

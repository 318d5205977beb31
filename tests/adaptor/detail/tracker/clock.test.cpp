// detail::tracker::tracker_clock against the system clock it maps the time-stamp counter onto:
// its times never decrease, and they stay within a few microseconds of the system clock read
// beside them, in bursts of calls (between anchors) and across sleeps (at anchors), for long
// enough that the rate is measured from the counter and used.

#include <catch2/catch.hpp>

#include <chrono>
#include <cstdint>
#include <thread>

#include <vram/adaptor/detail/tracker/clock.hpp>

using vram::detail::tracker::tracker_clock;
using vram::detail::tracker::tracker_now_us;

TEST_CASE("tracker_clock: monotonic, and within microseconds of the system clock", "[adaptor][tracker]") {
  tracker_clock clock;
  INFO("time-stamp counter: " << clock.counter());
  std::int64_t last = 0, worst = 0;
  for (int round = 0; round < 60; ++round) {
    for (int i = 0; i < 2000; ++i) {
      const std::int64_t before = tracker_now_us();
      const std::int64_t t = clock.now_us();
      const std::int64_t after = tracker_now_us();
      REQUIRE(t >= last);
      last = t;
      // A preempted reading widens [before, after]; the bound is what the mapping adds to it.
      const std::int64_t off = t < before ? before - t : (t > after ? t - after : 0);
      worst = off > worst ? off : worst;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(round % 2 == 0 ? 300 : 1700));
  }
  INFO("the furthest reading from the system clock: " << worst << " us");
  CHECK(worst <= 50);
}

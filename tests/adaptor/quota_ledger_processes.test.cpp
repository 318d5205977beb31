// Quota ledgers shared by real processes: workers (ledger_worker.cpp, fork + exec) race
// over tight hierarchical limits while a sampler process reads the ledger continuously.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include <vram/adaptor/quota_ledger.hpp>

#include "support/child_process.hpp"
#include "support/scratch_ledger.hpp"

using vram::test::child_process;
using vram::test::scratch_ledger;

namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;

/// job (8 MiB) -> a (5 MiB), b (5 MiB); other (3 MiB). Workers want far more than that.
struct tight_tree {
  explicit tight_tree(vram::quota_ledger& l)
      : job(l.add_tenant("job")), a(l.add_tenant("job/a")), b(l.add_tenant("job/b")), other(l.add_tenant("other")) {
    l.set_hard_limit(job, 8 * MiB);
    l.set_hard_limit(a, 5 * MiB);
    l.set_hard_limit(b, 5 * MiB);
    l.set_hard_limit(other, 3 * MiB);
  }
  vram::tenant job, a, b, other;
  [[nodiscard]] const char* path(int i) const {
    static const char* paths[] = {"job/a", "job/b", "other"};
    return paths[i % 3];
  }
};

std::unique_ptr<child_process> racer(const scratch_ledger& ledger, const char* tenant, const char* backend,
                                     unsigned seed, long operations) {
  return std::make_unique<child_process>(std::vector<std::string>{VRAM_LEDGER_WORKER, "race", ledger.name(), tenant,
                                                                   backend, std::to_string(seed),
                                                                   std::to_string(operations)});
}

std::unique_ptr<child_process> sampler(const scratch_ledger& ledger) {
  return std::make_unique<child_process>(std::vector<std::string>{VRAM_LEDGER_WORKER, "sample", ledger.name()});
}

/// "key value key value ..." -> {key: value}
std::map<std::string, std::size_t> fields(const std::string& line) {
  std::map<std::string, std::size_t> out;
  std::istringstream in(line);
  std::string key;
  std::size_t value;
  while (in >> key >> value) out[key] = value;
  return out;
}

void race_and_check(const char* backend, int workers) {
  scratch_ledger ledger;
  tight_tree tree(ledger.admin());
  auto watch = sampler(ledger);
  REQUIRE(watch->read_line() == "ready");
  std::vector<std::unique_ptr<child_process>> racers;
  for (int i = 0; i < workers; ++i) racers.push_back(racer(ledger, tree.path(i), backend, 1000u + i, 20000));
  for (auto& r : racers) REQUIRE(r->read_line() == "ready");

  // Every racer is done and holds what it holds: the ledger's usage is exactly the sum.
  std::map<std::uint32_t, std::size_t> charged;  // tenant id -> bytes its own processes charged
  std::size_t refused = 0;
  for (int i = 0; i < workers; ++i) {
    auto f = fields(racers[i]->read_line());
    REQUIRE(f.count("charged") == 1);
    charged[ledger.admin().at(tree.path(i)).id] += f["charged"];
    refused += f["refused"];
  }
  const auto& l = ledger.admin();
  CHECK(l.usage(tree.a) == charged[tree.a.id]);
  CHECK(l.usage(tree.b) == charged[tree.b.id]);
  CHECK(l.usage(tree.other) == charged[tree.other.id]);
  CHECK(l.usage(tree.job) == charged[tree.a.id] + charged[tree.b.id]);
  CHECK(refused > 0);  // the limits were contended, not idle
  CHECK(l.peak_usage(tree.job) <= 8 * MiB);
  CHECK(l.peak_usage(tree.a) <= 5 * MiB);
  CHECK(l.peak_usage(tree.other) <= 3 * MiB);
  l.check_invariants();

  for (auto& r : racers) r->close_input();
  for (auto& r : racers) {
    CHECK(r->read_line() == "done");
    CHECK(r->wait() == 0);
  }
  watch->close_input();
  auto s = fields(watch->read_line());
  CHECK(watch->wait() == 0);
  INFO("sampler: " << s["samples"] << " samples");
  CHECK(s["samples"] > 0);
  CHECK(s["violations"] == 0);
  for (vram::tenant t : {tree.job, tree.a, tree.b, tree.other}) CHECK(l.usage(t) == 0);
  CHECK(l.processes().empty());
  l.check_invariants();
}

}  // namespace

TEST_CASE("racing processes over host memory never pass a hard limit, and the sums are exact") {
  race_and_check("host", 12);
}

TEST_CASE("racing pools over simulated devices never pass a hard limit, and the sums are exact") {
  race_and_check("simulated", 8);
}

TEST_CASE("processes killed mid-allocation have their charges returned") {
  scratch_ledger ledger;
  tight_tree tree(ledger.admin());
  auto watch = sampler(ledger);
  REQUIRE(watch->read_line() == "ready");
  std::vector<std::unique_ptr<child_process>> racers;
  for (int i = 0; i < 16; ++i) racers.push_back(racer(ledger, tree.path(i), i % 2 ? "host" : "simulated", 77u + i, 0));
  for (auto& r : racers) REQUIRE(r->read_line() == "ready");

  // SIGKILL at random moments of their endless racing, a few at a time, while the others go on.
  std::mt19937 rng(5);
  for (auto& r : racers) {
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % 20000));
    r->kill(SIGKILL);
    CHECK(r->wait() == 128 + SIGKILL);
  }
  auto& l = ledger.admin();
  // Until someone reclaims, the dead still hold their charges (their slots say so).
  std::size_t dead = 0;
  for (const auto& p : l.processes()) dead += p.alive ? 0 : 1;
  CHECK(dead + l.reclaimed_processes() == 16);  // some may already be reclaimed by a refused charge

  CHECK(l.reclaim() == dead);
  for (vram::tenant t : {tree.job, tree.a, tree.b, tree.other}) CHECK(l.usage(t) == 0);
  CHECK(l.processes().empty());
  CHECK(l.reclaimed_processes() == 16);
  l.check_invariants();
  watch->close_input();
  auto s = fields(watch->read_line());
  CHECK(watch->wait() == 0);
  CHECK(s["violations"] == 0);
}

TEST_CASE("two ledgers never mix") {
  scratch_ledger first, second;
  tight_tree one(first.admin()), two(second.admin());
  std::vector<std::unique_ptr<child_process>> racers;
  for (int i = 0; i < 4; ++i) racers.push_back(racer(i % 2 ? first : second, "job/a", "host", 9u + i, 5000));
  for (auto& r : racers) REQUIRE(r->read_line() == "ready");
  std::size_t in_first = 0, in_second = 0;
  for (int i = 0; i < 4; ++i) (i % 2 ? in_first : in_second) += fields(racers[i]->read_line())["charged"];
  CHECK(first.admin().usage(one.a) == in_first);
  CHECK(second.admin().usage(two.a) == in_second);
  CHECK(first.admin().processes().size() == 2);
  CHECK(second.admin().processes().size() == 2);
  for (auto& r : racers) r->close_input();
  for (auto& r : racers) CHECK(r->wait() == 0);
}

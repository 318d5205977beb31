// Quota ledgers shared by real processes: workers (ledger_worker.cpp, fork + exec) race
// over tight hierarchical limits while a sampler process reads the ledger continuously; a
// killed process's charges come back while the children it started live on.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
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

/// How a process that holds charges starts the process that outlives it.
enum class descendant {
  fork,        // fork() without exec (a DataLoader worker, multiprocessing's "fork")
  fork_exec,   // fork() then exec of ledger_worker
  spawn,       // posix_spawn of ledger_worker (no fork handlers run)
  grandchild,  // fork() of a child that forks again; the grandchild attaches
};

/// The next line `fd` holds, without its newline; "" once every writer closed it.
std::string read_line_from(int fd) {
  std::string line;
  char c;
  for (;;) {
    ssize_t n = ::read(fd, &c, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0 || c == '\n') return line;
    line += c;
  }
}

void write_line_to(int fd, const std::string& line) {
  std::string l = line + "\n";
  if (::write(fd, l.data(), l.size()) != static_cast<ssize_t>(l.size())) ::_exit(5);
}

/// In a forked process: attaches on its own, charges `bytes` to `tenant`, says
/// "ready <pid>" on `report`, and gives its slot back at end of input on `hold`.
[[noreturn]] void attach_and_hold(const std::string& ledger, const char* tenant, std::size_t bytes, int hold,
                                  int report) {
  try {
    auto mine = vram::quota_ledger::attach(ledger);
    if (!mine->charge(mine->at(tenant), bytes).granted) ::_exit(3);
    write_line_to(report, "ready " + std::to_string(::getpid()));
    char c;
    while (::read(hold, &c, 1) > 0) {
    }
  } catch (...) {
    ::_exit(99);
  }
  ::_exit(0);
}

/// In the process that holds `inherited`: starts the descendant `how` says, which attaches
/// on its own and charges 100 bytes to job/child. Exits when something fails.
void start_descendant(descendant how, const std::string& ledger, vram::quota_ledger& inherited, int hold, int report) {
  std::string worker = VRAM_LEDGER_WORKER;
  std::vector<std::string> args{worker, "hold", ledger, "job/child", "100"};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  switch (how) {
    case descendant::fork:
      if (::fork() == 0) {
        try {  // the handle it inherited is its parent's: it refuses to charge
          (void)inherited.charge(inherited.at("job/child"), 1);
          ::_exit(4);
        } catch (const vram::ledger_error& e) {
          if (e.why() != vram::ledger_error::reason::forked) ::_exit(4);
        }
        attach_and_hold(ledger, "job/child", 100, hold, report);
      }
      return;
    case descendant::fork_exec:
      if (::fork() == 0) {
        ::dup2(hold, 0);
        ::dup2(report, 1);
        ::execv(argv[0], argv.data());
        ::_exit(127);
      }
      return;
    case descendant::spawn: {
      posix_spawn_file_actions_t actions;
      posix_spawn_file_actions_init(&actions);
      posix_spawn_file_actions_adddup2(&actions, hold, 0);
      posix_spawn_file_actions_adddup2(&actions, report, 1);
      pid_t pid;
      if (::posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ) != 0) ::_exit(6);
      posix_spawn_file_actions_destroy(&actions);
      return;
    }
    case descendant::grandchild:
      if (::fork() == 0) {
        if (::fork() == 0) attach_and_hold(ledger, "job/child", 100, hold, report);
        char c;  // the middle process lives until the end of input too
        while (::read(hold, &c, 1) > 0) {
        }
        ::_exit(0);
      }
      return;
  }
}

/// A process attaches, charges 600 of job's 1000 bytes to job/parent, starts a descendant
/// that charges 100 to job/child on its own, and is killed by SIGKILL while the descendant
/// lives on. The parent's 600 come back, exactly, and the descendant's 100 stay its own.
void kill_the_parent_of(descendant how) {
  scratch_ledger ledger;
  auto& admin = ledger.admin();
  const vram::tenant job = admin.add_tenant("job"), parents = admin.add_tenant("job/parent"),
                     childs = admin.add_tenant("job/child");
  admin.set_hard_limit(job, 1000);
  int report[2], hold[2];
  REQUIRE(::pipe2(report, O_CLOEXEC) == 0);
  REQUIRE(::pipe2(hold, O_CLOEXEC) == 0);
  const pid_t parent = ::fork();
  REQUIRE(parent >= 0);
  if (parent == 0) {
    ::close(report[0]);
    ::close(hold[1]);
    try {
      auto mine = vram::quota_ledger::attach(ledger.name());
      if (!mine->charge(mine->at("job/parent"), 600).granted) ::_exit(3);
      start_descendant(how, ledger.name(), *mine, hold[0], report[1]);
      ::close(report[1]);  // the descendant holds its own: its end is the end of the report
      ::close(hold[0]);
      for (;;) ::pause();  // holding `mine` until killed
    } catch (...) {
      ::_exit(99);
    }
  }
  ::close(report[1]);
  ::close(hold[0]);
  struct cleanup {  // a failed REQUIRE leaves no process behind
    pid_t parent;
    int report, hold;
    bool reaped = false;
    ~cleanup() {
      if (!reaped) {
        ::kill(parent, SIGKILL);
        ::waitpid(parent, nullptr, 0);
      }
      if (hold >= 0) ::close(hold);
      ::close(report);
    }
  } guard{parent, report[0], hold[1]};

  const std::string ready = read_line_from(report[0]);
  REQUIRE(ready.rfind("ready ", 0) == 0);
  const int worker = std::stoi(ready.substr(6));
  ::kill(parent, SIGKILL);
  int status = 0;
  REQUIRE(::waitpid(parent, &status, 0) == parent);
  guard.reaped = true;
  REQUIRE(WIFSIGNALED(status));
  CHECK(WTERMSIG(status) == SIGKILL);
  REQUIRE(::kill(worker, 0) == 0);  // the descendant lives on

  std::size_t dead = 0, alive = 0;
  for (const auto& p : admin.processes()) {
    CHECK(p.alive == (p.pid == worker));
    (p.alive ? alive : dead) += 1;
  }
  CHECK(dead == 1);
  CHECK(alive == 1);
  CHECK(admin.reclaim() == 1);
  CHECK(admin.usage(parents) == 0);
  CHECK(admin.usage(childs) == 100);
  CHECK(admin.usage(job) == 100);
  CHECK(admin.reclaimed_processes() == 1);
  admin.check_invariants();
  {
    auto newcomer = ledger.attach();  // all of the parent's 600 are free again: 100 + 900 fit
    CHECK(newcomer->charge(parents, 900).granted);
    CHECK(admin.usage(job) == 1000);
    newcomer->uncharge(parents, 900);
  }
  REQUIRE(admin.processes().size() == 1);
  CHECK(admin.processes()[0].alive);
  CHECK(admin.processes()[0].charged == std::vector<std::pair<vram::tenant, std::size_t>>{{childs, 100}});

  ::close(guard.hold);  // the descendant gives its slot back and exits
  guard.hold = -1;
  CHECK(read_line_from(report[0]).empty());
  CHECK(admin.reclaim() == 0);  // it left; nobody died
  CHECK(admin.processes().empty());
  CHECK(admin.usage(job) == 0);
  admin.check_invariants();
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

TEST_CASE("a killed process's charges come back while a child it forked lives on") {
  kill_the_parent_of(descendant::fork);
}

TEST_CASE("a killed process's charges come back while a child it forked and exec'd lives on") {
  kill_the_parent_of(descendant::fork_exec);
}

TEST_CASE("a killed process's charges come back while a child it posix_spawn'ed lives on") {
  kill_the_parent_of(descendant::spawn);
}

TEST_CASE("a killed process's charges come back while its grandchild lives on") {
  kill_the_parent_of(descendant::grandchild);
}

TEST_CASE("a child of fork that attached on its own is reclaimed when killed, while its own child lives on") {
  // The second generation: a handle attached in a child of fork() does not pass its
  // liveness on to the child that child forks either.
  scratch_ledger ledger;
  auto& admin = ledger.admin();
  const vram::tenant t = admin.add_tenant("job");
  int report[2], hold[2];
  REQUIRE(::pipe2(report, O_CLOEXEC) == 0);
  REQUIRE(::pipe2(hold, O_CLOEXEC) == 0);
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    ::close(report[0]);
    ::close(hold[1]);
    try {
      auto mine = vram::quota_ledger::attach(ledger.name());
      if (!mine->charge(t, 300).granted) ::_exit(3);
      if (::fork() == 0) {  // its worker never touches the ledger; it ends at end of input
        char c;
        while (::read(hold[0], &c, 1) > 0) {
        }
        ::_exit(0);
      }
      write_line_to(report[1], "ready");
      ::close(report[1]);
      for (;;) ::pause();  // holding `mine` until killed
    } catch (...) {
      ::_exit(99);
    }
  }
  ::close(report[1]);
  ::close(hold[0]);
  const bool ready = read_line_from(report[0]) == "ready";
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  if (ready) {
    CHECK(admin.reclaim() == 1);
    CHECK(admin.usage(t) == 0);
    CHECK(admin.processes().empty());
    admin.check_invariants();
  }
  ::close(hold[1]);  // the worker ends
  CHECK(read_line_from(report[0]).empty());
  ::close(report[0]);
  CHECK(ready);
}

TEST_CASE("a killed process's charges come back at once, while the child it just forked has not run yet") {
  // No window after fork(): the child never refers to the lock's description, not even
  // before it first runs. Killed the moment fork() returned, the parent is dead to reclaim().
  scratch_ledger ledger;
  auto& admin = ledger.admin();
  const vram::tenant t = admin.add_tenant("job");
  for (int round = 0; round < 20; ++round) {
    int report[2];
    REQUIRE(::pipe2(report, O_CLOEXEC) == 0);
    const pid_t parent = ::fork();
    REQUIRE(parent >= 0);
    if (parent == 0) {
      ::close(report[0]);
      try {
        auto mine = vram::quota_ledger::attach(ledger.name());
        if (!mine->charge(t, 300).granted) ::_exit(3);
        const pid_t worker = ::fork();
        if (worker == 0) {  // never touches the ledger; ends when its parent's test ends it
          ::sleep(30);
          ::_exit(0);
        }
        write_line_to(report[1], std::to_string(worker));
        for (;;) ::pause();  // holding `mine` until killed
      } catch (...) {
        ::_exit(99);
      }
    }
    ::close(report[1]);
    const std::string worker = read_line_from(report[0]);
    ::close(report[0]);
    ::kill(parent, SIGKILL);
    ::waitpid(parent, nullptr, 0);
    INFO("round " << round);
    CHECK(admin.reclaim() == 1);
    CHECK(admin.usage(t) == 0);
    CHECK(admin.processes().empty());
    if (!worker.empty()) ::kill(std::stoi(worker), SIGKILL);
  }
  admin.check_invariants();
}

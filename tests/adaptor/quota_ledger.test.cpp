// vram::quota_ledger and ledger_quota_adaptor within one test process: tenants, limits,
// access, damaged and foreign files, dead holders (forked children), racing threads.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include <vram/adaptor/ledger_quota_adaptor.hpp>
#include <vram/source/host_source.hpp>

#include "support/misuse_capture.hpp"
#include "support/scratch_ledger.hpp"

using vram::ledger_access;
using vram::ledger_error;
using vram::quota_ledger;
using vram::tenant;
using vram::test::scratch_ledger;
using reason = vram::ledger_error::reason;

namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}
void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

/// The reason attach() refuses with (or a failed check when it does not refuse).
reason refusal(const scratch_ledger& l, ledger_access a = ledger_access::charge) {
  try {
    (void)l.attach(a);
  } catch (const ledger_error& e) {
    INFO(e.what());
    CHECK(std::string(e.what()).find(l.path()) != std::string::npos);
    return e.why();
  }
  FAIL("attach accepted the ledger");
  return reason::system;
}

/// Runs `f` in a forked child and returns how the child ended (exit code, or 128 + signal).
int in_child(const std::function<void()>& f) {
  pid_t pid = ::fork();
  if (pid == 0) {
    try {
      f();
    } catch (...) {
      ::_exit(99);
    }
    ::_exit(0);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace

TEST_CASE("a ledger charges a tenant and every ancestor, refusing past any hard limit") {
  scratch_ledger ledger;
  auto& admin = ledger.admin();
  tenant model = admin.add_tenant("serving/llama/interactive");
  tenant llama = admin.at("serving/llama");
  tenant serving = admin.at("serving");
  CHECK(admin.add_tenant("serving/llama/interactive") == model);  // idempotent
  CHECK(admin.path_of(model) == "serving/llama/interactive");
  CHECK(admin.tenant_count() == 3);
  admin.set_hard_limit(serving, 1000);
  admin.set_hard_limit(llama, 700);

  auto process = ledger.attach();
  auto r = process->charge(model, 600);
  CHECK(r.granted);
  for (tenant t : {model, llama, serving}) CHECK(admin.usage(t) == 600);
  CHECK(process->charged(model) == 600);
  CHECK(process->charged(llama) == 0);  // a slot counts its own tenants; ancestors are sums

  r = process->charge(model, 200);  // llama would reach 800 > 700
  CHECK_FALSE(r.granted);
  CHECK(r.limited == llama);
  CHECK(r.limit == 700);
  CHECK(r.usage == 600);
  for (tenant t : {model, llama, serving}) CHECK(admin.usage(t) == 600);  // nothing changed
  CHECK(admin.refusals(llama) == 1);
  CHECK(admin.refusals(model) == 0);

  tenant batch = admin.add_tenant("serving/batch");
  CHECK(process->charge(batch, 400).granted);  // serving: exactly 1000
  CHECK(admin.usage(serving) == 1000);
  CHECK_FALSE(process->charge(batch, 1).granted);
  process->uncharge(model, 600);
  process->uncharge(batch, 400);
  for (tenant t : {model, llama, serving, batch}) CHECK(admin.usage(t) == 0);
  CHECK(admin.peak_usage(serving) == 1000);
  admin.check_invariants();
}

TEST_CASE("ledger_quota_adaptor: quota_exceeded names the tenant, soft limits call back, records match") {
  scratch_ledger ledger;
  tenant t = ledger.admin().add_tenant("job/worker");
  tenant job = ledger.admin().at("job");
  ledger.admin().set_hard_limit(job, 4096);
  ledger.admin().set_soft_limit(job, 1024);
  vram::ledger_quota_adaptor<vram::host_source> q(vram::host_source{}, {ledger.attach(), t});
  std::vector<std::pair<tenant, std::size_t>> crossings;
  q.set_soft_limit_callback([&](tenant level, std::size_t soft, std::size_t) { crossings.emplace_back(level, soft); });

  void* a = q.allocate_sync(1000);
  CHECK(crossings.empty());
  void* b = q.allocate_sync(1000);
  REQUIRE(crossings.size() == 1);
  CHECK(crossings[0] == std::pair{job, std::size_t{1024}});
  q.check_invariants();
  try {
    (void)q.allocate_sync(3000);
    FAIL("granted past the limit");
  } catch (const vram::quota_exceeded& e) {
    CHECK(e.limited_tenant() == job);
    CHECK(std::string(e.tenant_name()) == "job");
    CHECK(e.usage() == 2000);
    CHECK(e.limit() == 4096);
  }
  CHECK(q.usage(job) == 2000);
  CHECK(q.stats().ooms == 1);
  q.check_invariants();

  {  // a foreign pointer and a wrong size change nothing
    vram::test::misuse_capture misuse;
    int x;
    q.deallocate_sync(&x, 8);
    q.deallocate_sync(a, 999);
    CHECK(misuse.count() == 2);
  }
  CHECK(q.usage(job) == 2000);
  q.deallocate_sync(a, 1000);
  q.deallocate_sync(b, 1000);
  CHECK(q.usage(job) == 0);
  q.check_invariants();
}

TEST_CASE("limits are the operator's: a charging handle cannot change them, and the files' modes say so") {
  scratch_ledger ledger;
  tenant t = ledger.admin().add_tenant("tenant");
  ledger.admin().set_hard_limit(t, 100);
  auto process = ledger.attach();
  try {
    process->set_hard_limit(t, ~std::size_t{0});
    FAIL("a charging handle raised a limit");
  } catch (const ledger_error& e) {
    CHECK(e.why() == reason::read_only);
  }
  CHECK_THROWS_AS(process->add_tenant("other"), ledger_error);
  CHECK(ledger.admin().hard_limit(t) == 100);

  struct stat limits {}, usage {};
  REQUIRE(::stat((ledger.path() + "/limits").c_str(), &limits) == 0);
  REQUIRE(::stat((ledger.path() + "/usage").c_str(), &usage) == 0);
  CHECK((limits.st_mode & 0777) == 0640);
  CHECK((usage.st_mode & 0777) == 0660);

  scratch_ledger open_ledger(vram::ledger_options{.mode = 0600, .tenants_may_set_limits = true});
  REQUIRE(::stat((open_ledger.path() + "/limits").c_str(), &limits) == 0);
  CHECK((limits.st_mode & 0777) == 0600);
}

TEST_CASE("the kernel keeps a tenant user from the limits: it may charge, not administer") {
  // Tenants may charge (usage 0666), not change limits (limits 0644). A user that is not the
  // operator: as root, a child that becomes nobody; otherwise this user, with the limits
  // file's write bit taken away (what the mode gives every user but the owner).
  scratch_ledger ledger(vram::ledger_options{.mode = 0666});
  tenant t = ledger.admin().add_tenant("tenant");
  ledger.admin().set_hard_limit(t, 100);
  auto as_tenant_user = [&](const std::function<void()>& f) {
    if (::getuid() == 0)
      return in_child([&] {
        if (::setgid(65534) != 0 || ::setuid(65534) != 0) ::_exit(98);
        f();
      });
    REQUIRE(::chmod((ledger.path() + "/limits").c_str(), 0444) == 0);
    int r = in_child(f);
    REQUIRE(::chmod((ledger.path() + "/limits").c_str(), 0644) == 0);
    return r;
  };
  CHECK(as_tenant_user([&] {
          auto mine = ledger.attach(ledger_access::charge);
          if (!mine->charge(t, 60).granted || mine->charge(t, 60).granted) ::_exit(1);
          mine->uncharge(t, 60);
          try {
            (void)ledger.attach(ledger_access::admin);
          } catch (const ledger_error& e) {
            ::_exit(e.why() == reason::permission ? 0 : 2);
          }
          ::_exit(3);
        }) == 0);
  CHECK(ledger.admin().hard_limit(t) == 100);
  CHECK(ledger.admin().usage(t) == 0);

  scratch_ledger closed;  // the default mode, 0660: a user outside the group may not even charge
  if (::getuid() == 0)
    CHECK(in_child([&] {
            if (::setgid(65534) != 0 || ::setuid(65534) != 0) ::_exit(98);
            try {
              (void)closed.attach(ledger_access::charge);
            } catch (const ledger_error& e) {
              ::_exit(e.why() == reason::permission ? 0 : 2);
            }
            ::_exit(3);
          }) == 0);
}

TEST_CASE("create refuses an existing ledger; attach refuses what is not one") {
  scratch_ledger ledger;
  try {
    (void)quota_ledger::create(ledger.name());
    FAIL("created twice");
  } catch (const ledger_error& e) {
    CHECK(e.why() == reason::exists);
  }
  try {
    (void)quota_ledger::attach("vram-test-no-such-ledger");
    FAIL("attached to nothing");
  } catch (const ledger_error& e) {
    CHECK(e.why() == reason::not_found);
  }
  CHECK_THROWS_AS(ledger.admin().add_tenant("a//b"), ledger_error);
  CHECK_THROWS_AS(ledger.admin().add_tenant(std::string(48, 'x')), ledger_error);
  CHECK_THROWS_AS(ledger.admin().at("missing"), ledger_error);
  CHECK_FALSE(ledger.admin().find("").has_value());
}

TEST_CASE("a tenant path with a NUL or a control character is a bad tenant path, a ledger name with one a bad argument; nothing changes") {
  scratch_ledger ledger;
  auto& admin = ledger.admin();
  const tenant a = admin.add_tenant("a");
  admin.set_hard_limit(a, 1000);
  auto process = ledger.attach();
  REQUIRE(process->charge(a, 100).granted);
  const std::string before = read_file(ledger.path() + "/limits");
  const std::vector<std::string> bad{std::string("a\0b", 3), std::string("a\0", 2), std::string("\0", 1),
                                     "a/b\nc", "a\tb", "a\x1f", "a\x7f", "\x01", "a/\x1b[31m"};
  for (const std::string& name : bad) {
    INFO("name of " << name.size() << " bytes");
    // Refused as "a//b" is: ledger_error (unknown_tenant), a message that names the fault
    // and prints none of the path's bytes.
    for (auto refuse : {+[](quota_ledger& l, const std::string& n) { (void)l.add_tenant(n); },
                        +[](quota_ledger& l, const std::string& n) { (void)l.at(n); }}) {
      bool refused = false;
      try {
        refuse(admin, name);
      } catch (const vram::ledger_error& e) {
        refused = true;
        CHECK(e.why() == reason::unknown_tenant);
        const std::string what = e.what();
        CHECK(what.find("bad tenant path") != std::string::npos);
        CHECK(what.find("control character") != std::string::npos);
        CHECK_FALSE(vram::detail::has_control_character(what));
      }
      CHECK(refused);
    }
    CHECK_THROWS_AS(process->at(name), vram::ledger_error);
    CHECK_FALSE(admin.find(name).has_value());
    CHECK_THROWS_AS(quota_ledger::create(name), vram::invalid_argument);
    CHECK_THROWS_AS(quota_ledger::attach(name), vram::invalid_argument);
    CHECK_THROWS_AS(quota_ledger::remove(name), vram::invalid_argument);
    CHECK_THROWS_AS(quota_ledger::resolve(name), vram::invalid_argument);
    // A NUL in the ledger's own name would open this very ledger: refused too.
    CHECK_THROWS_AS(quota_ledger::attach(ledger.name() + name), vram::invalid_argument);
  }
  CHECK(admin.tenant_count() == 1);
  CHECK(read_file(ledger.path() + "/limits") == before);
  CHECK(admin.usage(a) == 100);
  CHECK(admin.processes().size() == 1);
  admin.check_invariants();
  // The names that are not control characters stay accepted: UTF-8, spaces, punctuation.
  CHECK(admin.path_of(admin.add_tenant("caf\xc3\xa9 ~/x-1.y_z")) == "caf\xc3\xa9 ~/x-1.y_z");
  process->uncharge(a, 100);
  admin.check_invariants();
}

TEST_CASE("a truncated, foreign, damaged or mismatched ledger is refused and left as it was") {
  scratch_ledger ledger;
  tenant t = ledger.admin().add_tenant("job/model");
  ledger.attach()->charge(t, 0);  // a slot came and went
  const std::string limits = ledger.path() + "/limits", usage = ledger.path() + "/usage";
  const std::string good_limits = read_file(limits), good_usage = read_file(usage);

  struct damage {
    const char* what;
    std::string file;
    std::function<void(std::string&)> change;
    reason expected;
  };
  auto offset_of_tenant = offsetof(vram::detail::ledger::limits_file, tenants);
  auto offset_of_usage = offsetof(vram::detail::ledger::usage_file, tenants);
  std::vector<damage> cases = {
      {"empty limits", limits, [](std::string& s) { s.clear(); }, reason::truncated},
      {"truncated usage", usage, [](std::string& s) { s.resize(s.size() / 2); }, reason::truncated},
      {"longer limits", limits, [](std::string& s) { s += "x"; }, reason::foreign},
      {"text file", usage, [](std::string& s) { s = "hello, I am not a ledger\n"; }, reason::foreign},
      {"magic", limits, [](std::string& s) { s[0] = 'X'; }, reason::foreign},
      {"a header byte", usage, [](std::string& s) { s[9] ^= 1; }, reason::corrupted},
      {"another version", limits,
       [](std::string& s) {
         auto* h = reinterpret_cast<vram::detail::ledger::identity*>(s.data());
         h->version = 99;
         h->checksum = h->expected_checksum();
       },
       reason::version},
      {"a tenant's name", limits, [&](std::string& s) { s[offset_of_tenant + 1] ^= 0x20; }, reason::corrupted},
      {"a control character in a tenant's name, sealed again", limits,
       [](std::string& s) {
         auto* f = reinterpret_cast<vram::detail::ledger::limits_file*>(s.data());
         auto& e = f->tenants[0];
         e.name[1] = '\n';
         e.check = vram::detail::ledger::tenant_entry::seal(e.name, e.parent, 0);
       },
       reason::corrupted},
      {"the tenant count", limits,
       [](std::string& s) {
         auto* f = reinterpret_cast<vram::detail::ledger::limits_file*>(s.data());
         std::uint32_t n = 100000;
         std::memcpy(&f->tenant_count, &n, sizeof n);
       },
       reason::corrupted},
      {"a usage total", usage, [&](std::string& s) { s[offset_of_usage] = 7; }, reason::corrupted},
  };
  for (const damage& d : cases) {
    SECTION(d.what) {
      std::string bytes = d.file == limits ? good_limits : good_usage;
      d.change(bytes);
      write_file(d.file, bytes);
      CHECK(refusal(ledger) == d.expected);
      // A reader takes no lock, so it cannot check the usage totals against the slots.
      if (std::string(d.what) != "a usage total") CHECK(refusal(ledger, ledger_access::read) == d.expected);
      CHECK(read_file(d.file) == bytes);  // refused without a write
    }
  }
  SECTION("the usage file of another ledger") {
    scratch_ledger other;
    write_file(usage, read_file(other.path() + "/usage"));
    CHECK(refusal(ledger) == reason::mismatched);
  }
  SECTION("a missing file") {
    ::unlink(usage.c_str());
    CHECK(refusal(ledger) == reason::foreign);
  }
  SECTION("not a directory") {
    scratch_ledger other;
    quota_ledger::remove(other.name());
    write_file(other.path(), "plain file");
    try {
      (void)other.attach();
      FAIL("attached to a plain file");
    } catch (const ledger_error& e) {
      CHECK(e.why() == reason::foreign);
    }
    ::unlink(other.path().c_str());
  }
}

TEST_CASE("a dead process's charges return at a refused charge, at attach and by reclaim") {
  scratch_ledger ledger;
  tenant t = ledger.admin().add_tenant("tenant");
  ledger.admin().set_hard_limit(t, 1000);
  auto& admin = ledger.admin();
  auto die_holding = [&](std::size_t bytes) {
    CHECK(in_child([&] {
            auto mine = ledger.attach();
            if (!mine->charge(t, bytes).granted) ::_exit(1);
            ::raise(SIGKILL);
          }) == 128 + SIGKILL);
  };

  auto survivor = ledger.attach();
  die_holding(800);
  CHECK(admin.usage(t) == 800);
  REQUIRE(admin.processes().size() == 2);
  CHECK(survivor->charge(t, 100).granted);  // fits beside the dead: nothing reclaimed yet
  CHECK(admin.usage(t) == 900);
  CHECK(survivor->charge(t, 500).granted);  // would be refused: the dead's 800 came back first
  CHECK(admin.usage(t) == 600);
  CHECK(admin.reclaimed_processes() == 1);

  die_holding(300);
  CHECK(admin.usage(t) == 900);
  { auto newcomer = ledger.attach(); }  // attaching reclaims
  CHECK(admin.usage(t) == 600);

  die_holding(100);
  CHECK(admin.reclaim() == 1);
  CHECK(admin.usage(t) == 600);
  CHECK(admin.reclaimed_processes() == 3);
  survivor->uncharge(t, 600);
  CHECK(admin.usage(t) == 0);
  admin.check_invariants();
}

TEST_CASE("a process that dies inside the charge mutex is repaired by the next holder") {
  scratch_ledger ledger;
  tenant t = ledger.admin().add_tenant("job/model");
  tenant job = ledger.admin().at("job");
  auto survivor = ledger.attach();
  REQUIRE(survivor->charge(t, 500).granted);
  // The child locks the mutex and dies halfway through a charge: the leaf raised, the parent not.
  CHECK(in_child([&] {
          auto mine = ledger.attach();
          int fd = ::open((ledger.path() + "/usage").c_str(), O_RDWR);
          auto* u = static_cast<vram::detail::ledger::usage_file*>(
              ::mmap(nullptr, sizeof(vram::detail::ledger::usage_file), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
          pthread_mutex_lock(&u->charge_mutex);
          u->tenants[t.id].usage.fetch_add(12345);
          ::raise(SIGKILL);
        }) == 128 + SIGKILL);
  CHECK(ledger.admin().usage(t) == 500 + 12345);  // torn, until the next holder
  CHECK(survivor->charge(t, 1).granted);
  CHECK(ledger.admin().repairs() == 1);
  CHECK(ledger.admin().usage(t) == 501);
  CHECK(ledger.admin().usage(job) == 501);
  ledger.admin().check_invariants();
  survivor->uncharge(t, 501);
}

TEST_CASE("a handle used in a child of fork refuses to charge its parent's slot") {
  scratch_ledger ledger;
  tenant t = ledger.admin().add_tenant("tenant");
  auto parent = ledger.attach();
  CHECK(in_child([&] {
          try {
            (void)parent->charge(t, 1);
          } catch (const ledger_error& e) {
            if (e.why() == reason::forked) ::_exit(0);
          }
          ::_exit(1);
        }) == 0);
  CHECK(ledger.admin().usage(t) == 0);
  CHECK(parent->charge(t, 1).granted);  // the parent's handle still works
  parent->uncharge(t, 1);
}

TEST_CASE("threads racing through their own handles never pass a hard limit") {
  scratch_ledger ledger;
  tenant a = ledger.admin().add_tenant("job/a"), b = ledger.admin().add_tenant("job/b");
  tenant job = ledger.admin().at("job");
  ledger.admin().set_hard_limit(job, 10000);
  std::atomic<bool> stop{false};
  std::atomic<std::size_t> over{0};
  std::thread watcher([&] {
    auto reader = ledger.attach(ledger_access::read);
    while (!stop.load())
      if (reader->usage(job) > 10000) over.fetch_add(1);
  });
  std::vector<std::thread> threads;
  std::atomic<std::size_t> refused{0};
  std::atomic<int> attached{0};
  for (int i = 0; i < 6; ++i)
    threads.emplace_back([&, i] {
      vram::ledger_quota_adaptor<vram::host_source> q(vram::host_source{}, {ledger.attach(), i % 2 ? a : b});
      attached.fetch_add(1);
      while (attached.load() < 6) std::this_thread::yield();  // all race at once
      std::vector<void*> live;
      for (int k = 0; k < 3000; ++k) {  // up to 20 live: each thread alone would pass the limit
        if (live.size() >= 20 || (k % 3 == 2 && !live.empty())) {
          q.deallocate_sync(live.back(), 700);
          live.pop_back();
        } else {
          try {
            live.push_back(q.allocate_sync(700));
          } catch (const vram::quota_exceeded&) {
            refused.fetch_add(1);
          }
        }
      }
      q.check_invariants();
      for (void* p : live) q.deallocate_sync(p, 700);
    });
  for (auto& t : threads) t.join();
  stop = true;
  watcher.join();
  CHECK(over.load() == 0);
  CHECK(refused.load() > 0);
  CHECK(ledger.admin().usage(job) == 0);
  CHECK(ledger.admin().peak_usage(job) <= 10000);
  ledger.admin().check_invariants();
}

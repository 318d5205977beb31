#pragma once
// A quota ledger of the test's own, under a name no other test or run uses, removed when
// the last handle to it goes (its files stay mapped by whoever is attached).

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <memory>
#include <string>

#include <vram/adaptor/quota_ledger.hpp>

namespace vram::test {

class scratch_ledger {
 public:
  /// `suffix` ends the name (a test of "%d" in VRAM_LEDGER wants it to end in a device id).
  explicit scratch_ledger(ledger_options options = {}, const std::string& suffix = "")
      : name_(unique_name() + suffix) {
    admin_ = quota_ledger::create(name_, options);
  }
  ~scratch_ledger() {
    try {
      quota_ledger::remove(name_);
    } catch (...) {  // the test removed it itself
    }
  }
  scratch_ledger(const scratch_ledger&) = delete;
  scratch_ledger& operator=(const scratch_ledger&) = delete;

  [[nodiscard]] const std::string& name() const noexcept { return name_; }
  [[nodiscard]] std::string path() const { return quota_ledger::resolve(name_); }
  /// The handle create() returned (admin access).
  [[nodiscard]] quota_ledger& admin() const noexcept { return *admin_; }
  [[nodiscard]] std::shared_ptr<quota_ledger> attach(ledger_access a = ledger_access::charge) const {
    return quota_ledger::attach(name_, a);
  }

 private:
  static std::string unique_name() {
    static std::atomic<int> n{0};
    char buf[64];
    std::snprintf(buf, sizeof buf, "vram-test-%d-%d", static_cast<int>(::getpid()), n.fetch_add(1));
    return buf;
  }
  std::string name_;
  std::shared_ptr<quota_ledger> admin_;
};

}  // namespace vram::test

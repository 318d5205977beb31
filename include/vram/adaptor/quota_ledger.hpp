#pragma once
// vram::quota_ledger: hierarchical tenant quotas shared by cooperating processes on one
// device, through two files in shared memory (a directory such as /dev/shm/vram-gpu0).
// Operators create and change it (vram::quota_ledger::create, the vram-quota tool); each
// process that allocates attaches to it and charges through vram::ledger_quota_adaptor
// (vram/adaptor/ledger_quota_adaptor.hpp). Model and guarantees: docs/quotas.md.

#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <vram/core/error.hpp>
#include <vram/core/names.hpp>
#include <vram/core/tenant_id.hpp>
#include <vram/core/throw.hpp>
#include <vram/adaptor/detail/charge_result.hpp>
#include <vram/adaptor/detail/ledger/files.hpp>
#include <vram/adaptor/detail/ledger/layout.hpp>
#include <vram/adaptor/detail/ledger/slot_lock.hpp>
#include <vram/adaptor/detail/ledger/system.hpp>
#include <vram/adaptor/detail/ledger/tenant_tree.hpp>

namespace vram {

/// What a handle may do with a ledger.
enum class ledger_access {
  read,    // read limits and usage (both files opened read-only)
  charge,  // claim a process slot and charge tenants (limits read-only, usage read-write)
  admin,   // create tenants, change limits, reclaim dead processes (both files read-write)
};

struct ledger_options {
  /// Mode of the usage file: who may attach to charge (and read). Default: owner and group.
  mode_t mode = 0660;
  /// Whether the limits file gets the same mode (so tenant processes may attach as admin and
  /// change limits). Default false: it gets `mode` without group and other write, so the
  /// kernel keeps tenant processes from raising their own limits.
  bool tenants_may_set_limits = false;
};

/// One attached ledger. Obtained from create() or attach() as a shared_ptr (adaptors that
/// charge through it share it). Thread-safe.
///
/// Charging: charge(t, b) takes the ledger's charge mutex, refuses unless every one of t and
/// its ancestors stays within its hard limit after adding b, then adds b to each and to this
/// handle's process slot. So no tenant's usage ever exceeds its hard limit, not for an
/// instant, whatever processes race (a limit lowered below usage refuses until frees bring
/// usage under it). A refusal changes nothing but the refused tenant's refusal count.
/// Crashes: a process that dies, however it dies, leaves its slot claimed and unlocked,
/// whatever children it started live on (none inherits the slot's lock: slot_lock.hpp); its
/// charges return at the next charge that would be refused, at the next attach, or when an
/// operator runs reclaim() (vram-quota reclaim), whichever comes first. A process that dies
/// inside the charge mutex is repaired by the next holder, which recomputes every usage from
/// the process slots.
/// Names: a name holding a NUL or another control character (a byte below 0x20, or 0x7f) is
/// refused, and nothing changes: a ledger name with vram::invalid_argument, a tenant path
/// with ledger_error (unknown_tenant), as every other malformed tenant path.
/// Trust: every byte read from the files is checked before it is used as an index or a
/// length; a file of another ledger, another layout, damaged or truncated is refused with
/// vram::ledger_error.
class quota_ledger {
 public:
  static constexpr std::size_t unlimited = ~std::size_t{0};
  static constexpr std::size_t max_tenants = detail::ledger::max_tenants;
  static constexpr std::size_t max_processes = detail::ledger::max_processes;
  /// The longest name of one tenant level.
  static constexpr std::size_t max_name = detail::ledger::tenant_tree::max_name;

  /// The directory a ledger name stands for: a name with a '/' is a path; any other name
  /// lives in /dev/shm (so "vram-gpu0" is /dev/shm/vram-gpu0). Throws invalid_argument for a
  /// name with a control character, ledger_error (not_found) for an empty one.
  [[nodiscard]] static std::string resolve(std::string_view name) {
    detail::check_name("quota_ledger", "a ledger name", name);
    if (name.empty()) detail::throw_ledger_error(ledger_error::reason::not_found, "\"\"", "empty ledger name");
    if (name.find('/') != std::string_view::npos) return std::string(name);
    return "/dev/shm/" + std::string(name);
  }

  /// Creates a ledger with no tenants and attaches to it as admin. Both files are written
  /// in a private directory and renamed into place, so no process ever sees half a ledger.
  /// Throws ledger_error (exists, permission, system).
  [[nodiscard]] static std::shared_ptr<quota_ledger> create(std::string_view name, ledger_options options = {}) {
    const std::string path = resolve(name);
    std::uint64_t id[2];
    detail::ledger::random_id(id, path);
    char suffix[64];
    std::snprintf(suffix, sizeof suffix, ".creating.%d.%016llx", static_cast<int>(::getpid()),
                  static_cast<unsigned long long>(id[0]));
    const std::string staging = path + suffix;
    if (::mkdir(staging.c_str(), 0700) != 0)
      detail::ledger::fail_errno(errno == EACCES ? ledger_error::reason::permission : ledger_error::reason::system,
                                 path, "creating its directory", errno);
    try {
      const mode_t limits_mode = options.tenants_may_set_limits ? options.mode : (options.mode & ~mode_t{022}) | 0600;
      detail::ledger::write_new<detail::ledger::limits_file>(staging + "/limits", path, limits_mode, id,
                                                             detail::ledger::limits_magic);
      detail::ledger::write_new<detail::ledger::usage_file>(staging + "/usage", path, options.mode | 0600, id,
                                                            detail::ledger::usage_magic);
      // The directory: searchable by whoever may read either file.
      mode_t dir_mode = 0700 | (options.mode & 044) | ((options.mode & 044) >> 2);
      if (::chmod(staging.c_str(), dir_mode) != 0)
        detail::ledger::fail_errno(ledger_error::reason::system, path, "chmod", errno);
      if (::renameat2(AT_FDCWD, staging.c_str(), AT_FDCWD, path.c_str(), RENAME_NOREPLACE) != 0) {
        int err = errno;
        if (err == EEXIST || err == ENOTEMPTY)
          detail::throw_ledger_error(ledger_error::reason::exists, path, "already exists");
        detail::ledger::fail_errno(ledger_error::reason::system, path, "renaming it into place", err);
      }
    } catch (...) {
      ::unlink((staging + "/limits").c_str());
      ::unlink((staging + "/usage").c_str());
      ::rmdir(staging.c_str());
      throw;
    }
    return attach(path, ledger_access::admin);
  }

  /// Attaches to an existing ledger. With charge access the handle claims a process slot
  /// (returned at destruction). Throws ledger_error: not_found, permission, foreign, version,
  /// truncated, corrupted, mismatched, full.
  [[nodiscard]] static std::shared_ptr<quota_ledger> attach(std::string_view name,
                                                            ledger_access access = ledger_access::charge) {
    return std::shared_ptr<quota_ledger>(new quota_ledger(resolve(name), access));
  }

  /// Deletes the ledger's files. Processes still attached keep charging their mapping, which
  /// no new process can join.
  static void remove(std::string_view name) {
    const std::string path = resolve(name);
    for (const char* f : {"/limits", "/usage"})
      if (::unlink((path + f).c_str()) != 0 && errno != ENOENT)
        detail::ledger::fail_errno(ledger_error::reason::system, path, "removing it", errno);
    if (::rmdir(path.c_str()) != 0)
      detail::ledger::fail_errno(errno == ENOENT ? ledger_error::reason::not_found : ledger_error::reason::system, path,
                                 "removing it", errno);
  }

  quota_ledger(const quota_ledger&) = delete;
  quota_ledger& operator=(const quota_ledger&) = delete;

  /// Gives back this handle's process slot, with whatever it still has charged.
  ~quota_ledger() {
    if (slot_ == no_slot || forked()) return;  // a child of fork: the slot is its parent's
    try {
      auto guard = lock_charges();
      return_slot_locked(slot_);
    } catch (...) {  // a damaged ledger: the slot stays claimed until reclaimed
    }
    slot_lock_.release();
  }

  [[nodiscard]] const std::string& path() const noexcept { return path_; }
  [[nodiscard]] ledger_access access() const noexcept { return access_; }

  // ---- tenants --------------------------------------------------------------------------

  /// The tenant at `path` ("job/model/class"), creating every missing level (admin).
  /// Throws ledger_error: read_only, full, unknown_tenant (a malformed path, or one with a
  /// control character).
  tenant add_tenant(std::string_view tenant_path) {
    require(ledger_access::admin, "creating tenants");
    check_path(tenant_path);
    detail::ledger::robust_guard guard(&limits_->admin_mutex, path_, [] {
      // Nothing to repair: an entry is published (tenant_count raised) only once complete.
    });
    refresh();
    std::uint32_t parent = detail::ledger::no_parent;
    for (std::string_view part : detail::ledger::tenant_tree::split(tenant_path)) {
      std::optional<std::uint32_t> child = tree_.child_named(parent, part);
      if (!child) child = append_tenant_locked(parent, part);
      parent = *child;
    }
    return tenant{parent};
  }

  /// The tenant at `path`, if there is one (none for a malformed path, or one with a control
  /// character: no tenant has one).
  [[nodiscard]] std::optional<tenant> find(std::string_view tenant_path) const {
    if (!detail::ledger::tenant_tree::valid_path(tenant_path) || detail::has_control_character(tenant_path))
      return std::nullopt;
    refresh();
    std::uint32_t at = detail::ledger::no_parent;
    for (std::string_view part : detail::ledger::tenant_tree::split(tenant_path)) {
      std::optional<std::uint32_t> child = tree_.child_named(at, part);
      if (!child) return std::nullopt;
      at = *child;
    }
    return tenant{at};
  }
  /// The tenant at `path`; throws ledger_error (unknown_tenant) when there is none (a
  /// malformed path, or one with a control character, names none).
  [[nodiscard]] tenant at(std::string_view tenant_path) const {
    check_path_characters(tenant_path);
    if (auto t = find(tenant_path)) return *t;
    detail::throw_ledger_error(ledger_error::reason::unknown_tenant, path_,
                               "no tenant '" + std::string(tenant_path) + "'");
  }

  [[nodiscard]] std::size_t tenant_count() const {
    refresh();
    return tree_.size();
  }
  /// Whether t is a tenant of this ledger.
  [[nodiscard]] bool contains(tenant t) const {
    if (t.id < tree_.size()) return true;
    refresh();
    return t.id < tree_.size();
  }
  /// The tenant's own name ("?" when unknown); valid as long as this handle.
  [[nodiscard]] const char* name(tenant t) const noexcept { return t.id < tree_.size() ? tree_.name(t.id) : "?"; }
  /// The tenant's path from its root ("job/model/class").
  [[nodiscard]] std::string path_of(tenant t) const { return contains(t) ? tree_.path_of(t.id) : "?"; }
  /// Sets `out` to t's parent and returns true; false for a root or an unknown tenant.
  [[nodiscard]] bool parent(tenant t, tenant& out) const noexcept {
    if (t.id >= tree_.size() || tree_.parent(t.id) == detail::ledger::no_parent) return false;
    out = tenant{tree_.parent(t.id)};
    return true;
  }

  // ---- limits ---------------------------------------------------------------------------

  /// Sets t's hard limit (unlimited to remove it); admin only. A limit lowered below usage
  /// refuses new charges until frees bring usage under it.
  void set_hard_limit(tenant t, std::size_t bytes) {
    require(ledger_access::admin, "changing limits");
    entry(t).hard.store(bytes, std::memory_order_relaxed);
  }
  void set_soft_limit(tenant t, std::size_t bytes) {
    require(ledger_access::admin, "changing limits");
    entry(t).soft.store(bytes, std::memory_order_relaxed);
  }
  [[nodiscard]] std::size_t hard_limit(tenant t) const { return entry(t).hard.load(std::memory_order_relaxed); }
  [[nodiscard]] std::size_t soft_limit(tenant t) const { return entry(t).soft.load(std::memory_order_relaxed); }

  // ---- usage ----------------------------------------------------------------------------

  /// Bytes charged to t and its descendants, by every process.
  [[nodiscard]] std::size_t usage(tenant t) const { return counters(t).usage.load(std::memory_order_relaxed); }
  [[nodiscard]] std::size_t peak_usage(tenant t) const { return counters(t).peak.load(std::memory_order_relaxed); }
  /// Charges refused for t's own hard limit.
  [[nodiscard]] std::size_t refusals(tenant t) const { return counters(t).refusals.load(std::memory_order_relaxed); }
  /// Bytes this handle's process slot has charged to t itself (not its descendants).
  [[nodiscard]] std::size_t charged(tenant t) const {
    if (slot_ == no_slot || !contains(t)) return 0;
    return slot().charged[t.id].load(std::memory_order_relaxed);
  }
  /// Dead processes whose charges were returned, and holders that died inside the charge
  /// mutex (repaired), since the ledger was created.
  [[nodiscard]] std::size_t reclaimed_processes() const noexcept { return usage_->reclaimed.load(); }
  [[nodiscard]] std::size_t repairs() const noexcept { return usage_->repairs.load(); }

  /// One claimed process slot, as the ledger saw it.
  struct process {
    std::uint32_t slot;
    int pid;               // as the process saw itself (its own pid namespace)
    std::string command;
    bool alive;            // whether its holder still holds the slot's lock
    bool self;             // this handle's slot
    std::vector<std::pair<tenant, std::size_t>> charged;  // nonzero charges, per tenant
  };
  /// The claimed slots (a consistent view when taken with charge or admin access).
  [[nodiscard]] std::vector<process> processes() const {
    refresh();
    std::optional<detail::ledger::robust_guard> guard;
    if (access_ != ledger_access::read) guard.emplace(&usage_->charge_mutex, path_, [this] { repair_locked(); });
    std::vector<process> out;
    for (std::uint32_t i = 0; i < max_processes; ++i) {
      const auto& s = usage_->processes[i];
      if (s.claimed.load(std::memory_order_acquire) != 1) continue;
      process p{i, s.pid, std::string(s.command, strnlen(s.command, sizeof s.command)), alive(i), own(i), {}};
      const std::uint32_t n = tree_.size();
      for (std::uint32_t t = 0; t < n; ++t)
        if (std::size_t c = s.charged[t].load(std::memory_order_relaxed)) p.charged.emplace_back(tenant{t}, c);
      out.push_back(std::move(p));
    }
    return out;
  }

  /// Returns the charges of every process that died; how many there were. Charge or admin.
  std::size_t reclaim() {
    if (access_ == ledger_access::read)
      detail::throw_ledger_error(ledger_error::reason::read_only, path_, "reclaiming needs charge or admin access");
    refresh();
    auto guard = lock_charges();
    return reclaim_locked();
  }

  // ---- charging (charge access) -----------------------------------------------------------

  /// The outcome of charge(): granted (with the levels whose soft limit it crossed upward),
  /// or the tenant whose hard limit refused and its figures.
  using charge_result = detail::adaptor::charge_result;

  /// Charges `bytes` to t and every ancestor, or to none of them (see the class comment).
  /// Throws ledger_error (read_only without a slot, forked in a child of fork, unknown_tenant).
  charge_result charge(tenant t, std::size_t bytes) {
    require_slot();
    if (!contains(t)) unknown(t);
    chain c = chain_of(t);
    auto guard = lock_charges();
    std::size_t refused = first_refusing_locked(c, bytes);
    // Dead processes' charges may be what stands in the way: return them, then look again.
    if (refused != c.size && reclaim_locked() != 0) refused = first_refusing_locked(c, bytes);
    if (refused != c.size) {
      auto& u = usage_->tenants[c.ids[refused]];
      u.refusals.fetch_add(1, std::memory_order_relaxed);
      return {false, 0, tenant{c.ids[refused]}, limits_->tenants[c.ids[refused]].hard.load(std::memory_order_relaxed),
              u.usage.load(std::memory_order_relaxed)};
    }
    std::uint64_t crossed = 0;
    for (std::size_t i = 0; i < c.size; ++i) {
      auto& u = usage_->tenants[c.ids[i]];
      std::size_t before = u.usage.load(std::memory_order_relaxed);
      std::size_t after = before + bytes;
      u.usage.store(after, std::memory_order_relaxed);
      if (after > u.peak.load(std::memory_order_relaxed)) u.peak.store(after, std::memory_order_relaxed);
      std::size_t soft = limits_->tenants[c.ids[i]].soft.load(std::memory_order_relaxed);
      if (i < 64 && before <= soft && after > soft) crossed |= std::uint64_t{1} << i;
    }
    auto& mine = slot().charged[t.id];
    mine.store(mine.load(std::memory_order_relaxed) + bytes, std::memory_order_relaxed);
    return {true, crossed, t, 0, 0};
  }

  /// Returns `bytes` charged to t by this handle. Never fails: a ledger found damaged is
  /// left as it is (its next holder or vram-quota sees it).
  void uncharge(tenant t, std::size_t bytes) noexcept {
    if (slot_ == no_slot || forked() || t.id >= tree_.size()) return;
    chain c = chain_of(t);
    try {
      auto guard = lock_charges();
      auto& mine = slot().charged[t.id];
      std::size_t had = mine.load(std::memory_order_relaxed);
      if (bytes > had) bytes = had;  // never below zero, whatever was written into the file
      mine.store(had - bytes, std::memory_order_relaxed);
      for (std::size_t i = 0; i < c.size; ++i) subtract(usage_->tenants[c.ids[i]].usage, bytes);
    } catch (...) {
    }
  }

  /// Verifies the invariant of the usage file (layout.hpp) under the charge mutex: every
  /// tenant's usage equals the charges of the claimed slots over its subtree. Throws
  /// ledger_error (corrupted) when it does not hold. Charge or admin access.
  void check_invariants() const {
    if (access_ == ledger_access::read) return;
    refresh();
    auto guard = lock_charges();
    std::array<std::size_t, max_tenants> expected = recount_locked();
    for (std::uint32_t t = 0; t < max_tenants; ++t)
      if (expected[t] != usage_->tenants[t].usage.load(std::memory_order_relaxed))
        detail::throw_ledger_error(ledger_error::reason::corrupted, path_,
                                   "usage of tenant " + std::to_string(t) + " is not the sum of its charges");
  }

 private:
  static constexpr std::uint32_t no_slot = ~std::uint32_t{0};
  struct chain {
    std::array<std::uint32_t, max_tenants> ids;
    std::size_t size = 0;
  };

  quota_ledger(std::string path, ledger_access access) : path_(std::move(path)), access_(access) {
    const bool write_limits = access == ledger_access::admin;
    const bool write_usage = access != ledger_access::read;
    struct stat dir {};
    if (::stat(path_.c_str(), &dir) != 0)
      detail::ledger::fail_errno(errno == ENOENT ? ledger_error::reason::not_found : ledger_error::reason::system,
                                 path_, "cannot open", errno);
    if (!S_ISDIR(dir.st_mode)) detail::throw_ledger_error(ledger_error::reason::foreign, path_, "is not a directory");
    limits_file_ = detail::ledger::open_part<detail::ledger::limits_file>(path_, "limits", write_limits,
                                                                          detail::ledger::limits_magic);
    usage_file_ = detail::ledger::open_part<detail::ledger::usage_file>(path_, "usage", write_usage,
                                                                        detail::ledger::usage_magic);
    limits_ = limits_file_.as<detail::ledger::limits_file>();
    usage_ = usage_file_.as<detail::ledger::usage_file>();
    if (std::memcmp(limits_->id.ledger_id, usage_->id.ledger_id, sizeof usage_->id.ledger_id) != 0)
      detail::throw_ledger_error(ledger_error::reason::mismatched, path_,
                                 "its limits and usage files belong to different ledgers");
    refresh();
    for (const auto& s : usage_->processes)
      if (s.claimed.load() > 1) detail::throw_ledger_error(ledger_error::reason::corrupted, path_, "damaged process slot");
    generation_ = detail::ledger::fork_generation();
    if (access == ledger_access::read) return;
    check_invariants();
    if (access == ledger_access::charge) claim_slot();
  }

  void refresh() const { tree_.refresh(*limits_, path_); }
  /// A tenant path with a control character is a malformed path (unknown_tenant), refused
  /// before any message prints it: the bytes would cut or garble it.
  void check_path_characters(std::string_view p) const {
    if (detail::has_control_character(p)) [[unlikely]]
      detail::throw_ledger_error(ledger_error::reason::unknown_tenant, path_,
                                 "bad tenant path (it holds a NUL or another control character)");
  }
  void check_path(std::string_view p) const {
    check_path_characters(p);
    if (!detail::ledger::tenant_tree::valid_path(p))
      detail::throw_ledger_error(ledger_error::reason::unknown_tenant, path_,
                                 "bad tenant path '" + std::string(p) + "' (names of 1 to " +
                                     std::to_string(max_name) + " characters joined by '/')");
  }

  /// Publishes a new entry (admin mutex held).
  std::uint32_t append_tenant_locked(std::uint32_t parent, std::string_view name) {
    const std::uint32_t i = tree_.size();
    if (i == max_tenants)
      detail::throw_ledger_error(ledger_error::reason::full, path_,
                                 "no room for another tenant (" + std::to_string(max_tenants) + ")");
    auto& e = limits_->tenants[i];
    std::memset(e.name, 0, sizeof e.name);
    std::memcpy(e.name, name.data(), name.size());
    e.parent = parent;
    e.check = detail::ledger::tenant_entry::seal(e.name, parent, i);
    e.hard.store(unlimited, std::memory_order_relaxed);
    e.soft.store(unlimited, std::memory_order_relaxed);
    limits_->tenant_count.store(i + 1, std::memory_order_release);
    refresh();
    return i;
  }

  /// The first level of c whose hard limit `bytes` more would pass; c.size when none.
  std::size_t first_refusing_locked(const chain& c, std::size_t bytes) const noexcept {
    for (std::size_t i = 0; i < c.size; ++i) {
      std::size_t cur = usage_->tenants[c.ids[i]].usage.load(std::memory_order_relaxed);
      std::size_t limit = limits_->tenants[c.ids[i]].hard.load(std::memory_order_relaxed);
      if (cur > limit || bytes > limit - cur) return i;
    }
    return c.size;
  }

  chain chain_of(tenant t) const noexcept {
    chain c;
    for (std::uint32_t i = t.id; i != detail::ledger::no_parent; i = tree_.parent(i)) c.ids[c.size++] = i;
    return c;
  }

  detail::ledger::tenant_entry& entry(tenant t) const {
    if (!contains(t)) unknown(t);
    return limits_->tenants[t.id];
  }
  detail::ledger::tenant_usage& counters(tenant t) const {
    if (!contains(t)) unknown(t);
    return usage_->tenants[t.id];
  }
  [[noreturn]] void unknown(tenant t) const {
    detail::throw_ledger_error(ledger_error::reason::unknown_tenant, path_, "no tenant id " + std::to_string(t.id));
  }

  // ---- process slots ---------------------------------------------------------------------

  detail::ledger::process_slot& slot() const noexcept { return usage_->processes[slot_]; }
  [[nodiscard]] bool forked() const noexcept { return detail::ledger::fork_generation() != generation_; }

  void require(ledger_access needed, const char* what) const {
    if (access_ != needed)
      detail::throw_ledger_error(ledger_error::reason::read_only, path_,
                                 std::string(what) + " needs " + (needed == ledger_access::admin ? "admin" : "charge") +
                                     " access");
  }
  void require_slot() const {
    if (slot_ == no_slot) require(ledger_access::charge, "charging");
    if (forked())
      detail::throw_ledger_error(ledger_error::reason::forked, path_,
                                 "this handle belongs to the parent of a fork(); attach again in the child");
  }

  [[nodiscard]] detail::ledger::robust_guard lock_charges() const {
    return detail::ledger::robust_guard(&usage_->charge_mutex, path_, [this] { repair_locked(); });
  }

  /// Whether slot i is this handle's, in the process that claimed it (not a child of fork).
  [[nodiscard]] bool own(std::uint32_t i) const noexcept { return i == slot_ && !forked(); }
  /// Whether slot i's holder is alive. Our own slot is; a slot whose lock no open file
  /// description holds has lost its holder (the mapped descriptor never holds one, so every
  /// slot_lock, this handle's too, is one "elsewhere" from it).
  [[nodiscard]] bool alive(std::uint32_t i) const noexcept {
    return own(i) || detail::ledger::byte_held_elsewhere(usage_file_.fd(), i);
  }

  void claim_slot() {
    auto guard = lock_charges();
    reclaim_locked();
    for (std::uint32_t i = 0; i < max_processes; ++i) {
      auto& s = usage_->processes[i];
      if (s.claimed.load(std::memory_order_relaxed) != 0) continue;
      // Held elsewhere: its last holder is still leaving.
      if (!slot_lock_.acquire(path_ + "/usage", usage_file_.fd(), i, path_)) continue;
      s.pid = static_cast<std::int32_t>(::getpid());
      detail::ledger::process_command(s.command);
      for (auto& c : s.charged) c.store(0, std::memory_order_relaxed);
      s.claimed.store(1, std::memory_order_release);
      slot_ = i;
      return;
    }
    detail::throw_ledger_error(ledger_error::reason::full, path_,
                               "all " + std::to_string(max_processes) + " process slots are taken");
  }

  /// Returns slot i's charges and frees it (charge mutex held).
  void return_slot_locked(std::uint32_t i) const noexcept {
    auto& s = usage_->processes[i];
    const std::uint32_t n = tree_.size();
    bool damaged = false;
    for (std::uint32_t t = 0; t < max_tenants; ++t) {
      std::size_t c = s.charged[t].exchange(0, std::memory_order_relaxed);
      if (c == 0) continue;
      if (t >= n) {
        damaged = true;  // a charge to a tenant that does not exist: recount below
        continue;
      }
      chain ch = chain_of(tenant{t});
      for (std::size_t k = 0; k < ch.size; ++k) subtract(usage_->tenants[ch.ids[k]].usage, c);
    }
    s.claimed.store(0, std::memory_order_release);
    if (damaged) recompute_locked();
  }

  std::size_t reclaim_locked() const noexcept {
    std::size_t n = 0;
    for (std::uint32_t i = 0; i < max_processes; ++i) {
      if (usage_->processes[i].claimed.load(std::memory_order_acquire) != 1 || alive(i)) continue;
      return_slot_locked(i);
      ++n;
    }
    if (n != 0) usage_->reclaimed.fetch_add(n, std::memory_order_relaxed);
    return n;
  }

  /// Each tenant's usage as the slots' charges say it should be.
  std::array<std::size_t, max_tenants> recount_locked() const noexcept {
    std::array<std::size_t, max_tenants> sum{};
    for (const auto& s : usage_->processes) {
      if (s.claimed.load(std::memory_order_acquire) != 1) continue;
      for (std::uint32_t t = 0; t < max_tenants; ++t) sum[t] += s.charged[t].load(std::memory_order_relaxed);
    }
    // Parents have smaller indexes: one pass from the end carries every subtree upwards.
    for (std::uint32_t t = tree_.size(); t-- > 0;)
      if (tree_.parent(t) != detail::ledger::no_parent) sum[tree_.parent(t)] += sum[t];
    return sum;
  }
  void recompute_locked() const noexcept {
    std::array<std::size_t, max_tenants> sum = recount_locked();
    for (std::uint32_t t = 0; t < max_tenants; ++t) {
      auto& u = usage_->tenants[t];
      u.usage.store(sum[t], std::memory_order_relaxed);
      if (sum[t] > u.peak.load(std::memory_order_relaxed)) u.peak.store(sum[t], std::memory_order_relaxed);
    }
  }

  /// A holder died inside the charge mutex, somewhere in a change: drop the dead, then
  /// recompute every usage from the slots (the invariant, made true again).
  void repair_locked() const {
    refresh();
    reclaim_locked();
    recompute_locked();
    usage_->repairs.fetch_add(1, std::memory_order_relaxed);
  }

  static void subtract(std::atomic<std::uint64_t>& a, std::size_t n) noexcept {
    std::size_t v = a.load(std::memory_order_relaxed);
    a.store(v > n ? v - n : 0, std::memory_order_relaxed);
  }

  std::string path_;
  ledger_access access_;
  detail::ledger::mapped_file limits_file_;
  detail::ledger::mapped_file usage_file_;
  detail::ledger::slot_lock slot_lock_;  // holds byte slot_ of the usage file iff slot_ != no_slot
  detail::ledger::limits_file* limits_ = nullptr;
  detail::ledger::usage_file* usage_ = nullptr;
  std::uint32_t slot_ = no_slot;
  std::uint64_t generation_ = 0;

  mutable detail::ledger::tenant_tree tree_;  // the validated copy every tenant lookup reads
};

}  // namespace vram

#pragma once
// Tenants: who an allocation is for (a job, a model, a request class, a layer).
//
//   vram::tenant          a small integer id (0 is the default tenant, "default")
//   vram::tenant_registry names and parent links (job -> model -> layer); a process-wide
//                         one is vram::tenant_registry::global()
//   vram::tenant_scope    sets the calling thread's current tenant for a scope
//
// Adaptors that account per tenant (statistics, quota, tracker, logging) take the tenant
// from an explicit argument when one is given, else from vram::current_tenant().

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <string_view>

#include <vram/core/names.hpp>
#include <vram/core/tenant_id.hpp>
#include <vram/core/throw.hpp>

namespace vram {

/// The most tenants one registry holds. Per-tenant counters are fixed arrays of this size,
/// so the hot path indexes instead of searching a map.
inline constexpr std::size_t max_tenants = 256;
/// Longest tenant name kept (longer names are truncated).
inline constexpr std::size_t max_tenant_name = 47;

/// Names tenants and links each to an optional parent.
///
/// Entries are immutable once created and published with a release store of the count, so
/// lookups (name, parent, ancestors) are lock-free and may run concurrently with create();
/// create() itself takes a mutex. Ids are dense: 0 (the default tenant) .. size()-1.
/// Invariant: parent(t).id < t.id for every t that has a parent (so the hierarchy is a forest
/// and walking ancestors terminates).
class tenant_registry {
 public:
  static constexpr std::uint32_t no_parent = ~std::uint32_t{0};

  tenant_registry() noexcept {
    std::memcpy(entries_[0].name.data(), "default", sizeof "default");
    entries_[0].parent = no_parent;
    count_.store(1, std::memory_order_release);
  }
  tenant_registry(const tenant_registry&) = delete;
  tenant_registry& operator=(const tenant_registry&) = delete;

  /// The process-wide registry used when an adaptor is given none.
  [[nodiscard]] static const std::shared_ptr<tenant_registry>& global() {
    static const std::shared_ptr<tenant_registry> r = std::make_shared<tenant_registry>();
    return r;
  }

  /// Creates a tenant named `name` (truncated to max_tenant_name) under `parent` (none: a
  /// root). Throws vram::invalid_argument, changing nothing, when the registry is full,
  /// `parent` is unknown or `name` holds a NUL or another control character.
  tenant create(std::string_view name, const tenant* parent = nullptr) {
    detail::check_name("tenant_registry", "a tenant name", name);
    std::lock_guard lock(mutex_);
    std::uint32_t n = count_.load(std::memory_order_relaxed);
    if (n == max_tenants) detail::throw_invalid_argument("tenant_registry", "too many tenants (vram::max_tenants)");
    if (parent != nullptr && parent->id >= n) detail::throw_invalid_argument("tenant_registry", "unknown parent tenant");
    entry& e = entries_[n];
    std::size_t len = name.size() < max_tenant_name ? name.size() : max_tenant_name;
    std::memcpy(e.name.data(), name.data(), len);
    e.name[len] = '\0';
    e.parent = parent != nullptr ? parent->id : no_parent;
    count_.store(n + 1, std::memory_order_release);
    return tenant{n};
  }
  tenant create(std::string_view name, tenant parent) { return create(name, &parent); }

  /// Number of tenants (including the default one).
  [[nodiscard]] std::size_t size() const noexcept { return count_.load(std::memory_order_acquire); }
  [[nodiscard]] bool contains(tenant t) const noexcept { return t.id < size(); }

  /// The tenant's name; "?" for an unknown id. The pointer stays valid as long as the registry.
  [[nodiscard]] const char* name(tenant t) const noexcept { return contains(t) ? entries_[t.id].name.data() : "?"; }

  /// Sets `out` to the tenant's parent and returns true; false (out unchanged) for a root.
  [[nodiscard]] bool parent(tenant t, tenant& out) const noexcept {
    if (!contains(t) || entries_[t.id].parent == no_parent) return false;
    out = tenant{entries_[t.id].parent};
    return true;
  }

  /// Number of ancestors (0 for a root).
  [[nodiscard]] std::size_t depth(tenant t) const noexcept {
    std::size_t d = 0;
    for (tenant p; parent(t, p); t = p) ++d;
    return d;
  }

  /// Whether `ancestor` is `t` or one of its ancestors.
  [[nodiscard]] bool is_within(tenant t, tenant ancestor) const noexcept {
    for (;;) {
      if (t == ancestor) return true;
      if (!parent(t, t)) return false;
    }
  }

 private:
  struct entry {
    std::array<char, max_tenant_name + 1> name{};
    std::uint32_t parent = no_parent;
  };
  std::array<entry, max_tenants> entries_{};
  std::atomic<std::uint32_t> count_{0};
  std::mutex mutex_;
};

/// Creates a tenant in the global registry.
inline tenant make_tenant(std::string_view name) { return tenant_registry::global()->create(name); }
inline tenant make_tenant(std::string_view name, tenant parent) { return tenant_registry::global()->create(name, parent); }

namespace detail {
inline tenant& current_tenant_slot() noexcept {
  thread_local tenant t{};
  return t;
}
}  // namespace detail

/// The calling thread's current tenant (the default tenant outside any tenant_scope).
[[nodiscard]] inline tenant current_tenant() noexcept { return detail::current_tenant_slot(); }

/// Sets the calling thread's current tenant until the scope ends, then restores the previous
/// one (scopes nest). Not movable: it belongs to the thread and the block that made it.
class tenant_scope {
 public:
  explicit tenant_scope(tenant t) noexcept : previous_(std::exchange(detail::current_tenant_slot(), t)) {}
  ~tenant_scope() { detail::current_tenant_slot() = previous_; }
  tenant_scope(const tenant_scope&) = delete;
  tenant_scope& operator=(const tenant_scope&) = delete;

 private:
  tenant previous_;
};

}  // namespace vram

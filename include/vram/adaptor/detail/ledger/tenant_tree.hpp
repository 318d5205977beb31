#pragma once
// A ledger's tenant tree as one handle knows it: a process-local copy of the published
// entries of the limits file, each validated once. Entries never change once published, so
// names and parents are read from the copy from then on, never from the shared file again.

#include <array>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <vram/core/error.hpp>
#include <vram/core/names.hpp>
#include <vram/core/throw.hpp>
#include <vram/adaptor/detail/ledger/layout.hpp>

namespace vram::detail::ledger {

class tenant_tree {
 public:
  static constexpr std::size_t max_name = name_bytes - 1;

  /// Copies and validates the entries published since the last call (a name of 1 to
  /// max_name characters, none a control character, a parent below the entry's index, the
  /// entry's seal). Throws
  /// ledger_error (corrupted), naming `path`, for a damaged count or entry.
  void refresh(const limits_file& f, const std::string& path) {
    const std::uint32_t count = f.tenant_count.load(std::memory_order_acquire);
    if (count == size()) return;
    std::lock_guard lock(mutex_);
    const std::uint32_t known = known_.load(std::memory_order_relaxed);
    if (count > max_tenants || count < known) throw_ledger_error(ledger_error::reason::corrupted, path, "damaged tenant count");
    for (std::uint32_t i = known; i < count; ++i) {
      const tenant_entry& e = f.tenants[i];
      name_buffer name{};
      std::memcpy(name.data(), e.name, name.size());
      const std::uint32_t parent = e.parent;
      const bool terminated = std::memchr(name.data(), '\0', name.size()) != nullptr;
      if (!terminated || name[0] == '\0' || has_control_character(name.data()) ||
          (parent != no_parent && parent >= i) || e.check != tenant_entry::seal(name.data(), parent, i))
        throw_ledger_error(ledger_error::reason::corrupted, path, "damaged tenant " + std::to_string(i));
      names_[i] = name;
      parents_[i] = parent;
    }
    known_.store(count, std::memory_order_release);
  }

  /// Entries [0, size()) are copied and valid.
  [[nodiscard]] std::uint32_t size() const noexcept { return known_.load(std::memory_order_acquire); }
  /// For i < size().
  [[nodiscard]] const char* name(std::uint32_t i) const noexcept { return names_[i].data(); }
  [[nodiscard]] std::uint32_t parent(std::uint32_t i) const noexcept { return parents_[i]; }

  /// The child of `parent` (no_parent: a root) named `name`.
  [[nodiscard]] std::optional<std::uint32_t> child_named(std::uint32_t parent, std::string_view name) const {
    const std::uint32_t n = size();
    for (std::uint32_t i = 0; i < n; ++i)
      if (parents_[i] == parent && name == names_[i].data()) return i;
    return std::nullopt;
  }

  /// "job/model/class", for i < size().
  [[nodiscard]] std::string path_of(std::uint32_t i) const {
    std::string p = names_[i].data();
    for (std::uint32_t at = parents_[i]; at != no_parent; at = parents_[at]) p = std::string(names_[at].data()) + "/" + p;
    return p;
  }

  /// Whether `p` is names of 1 to max_name characters joined by single '/'.
  [[nodiscard]] static bool valid_path(std::string_view p) {
    if (p.empty() || p.front() == '/' || p.back() == '/' || p.find("//") != std::string_view::npos) return false;
    for (std::string_view part : split(p))
      if (part.size() > max_name) return false;
    return true;
  }
  [[nodiscard]] static std::vector<std::string_view> split(std::string_view p) {
    std::vector<std::string_view> parts;
    for (std::size_t at = 0; at <= p.size();) {
      std::size_t slash = p.find('/', at);
      if (slash == std::string_view::npos) slash = p.size();
      parts.push_back(p.substr(at, slash - at));
      at = slash + 1;
    }
    return parts;
  }

 private:
  using name_buffer = std::array<char, name_bytes>;
  std::mutex mutex_;  // one refresh at a time; readers only load known_
  std::atomic<std::uint32_t> known_{0};
  std::array<name_buffer, max_tenants> names_{};
  std::array<std::uint32_t, max_tenants> parents_{};
};

}  // namespace vram::detail::ledger

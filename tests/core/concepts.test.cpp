// Compile-time positive and negative checks of the resource concepts and properties.
#include <catch2/catch.hpp>

#include <vram/core/any_resource.hpp>
#include <vram/core/concepts.hpp>
#include <vram/core/resource_ref.hpp>
#include <vram/source/host_source.hpp>
#include <vram/source/simulated_device_source.hpp>

namespace {

struct only_sync {
  void* allocate_sync(std::size_t, std::size_t) { return nullptr; }
  void deallocate_sync(void*, std::size_t, std::size_t) noexcept {}
  bool operator==(const only_sync&) const = default;
};

struct full : only_sync {
  void* allocate(vram::stream_ref, std::size_t, std::size_t) { return nullptr; }
  void deallocate(vram::stream_ref, void*, std::size_t, std::size_t) noexcept {}
  bool operator==(const full&) const = default;
  friend void get_property(const full&, vram::device_accessible) noexcept {}
};

struct throwing_deallocate : only_sync {
  void* allocate(vram::stream_ref, std::size_t, std::size_t) { return nullptr; }
  void deallocate(vram::stream_ref, void*, std::size_t, std::size_t) {}  // not noexcept
  bool operator==(const throwing_deallocate&) const = default;
};

struct not_comparable {
  void* allocate_sync(std::size_t, std::size_t) { return nullptr; }
  void deallocate_sync(void*, std::size_t, std::size_t) noexcept {}
};

struct old_argument_order : only_sync {  // CCCL 3.0's allocate_async shape is not ours
  void* allocate_async(std::size_t, std::size_t, vram::stream_ref) { return nullptr; }
  void deallocate_async(void*, std::size_t, std::size_t, vram::stream_ref) noexcept {}
  bool operator==(const old_argument_order&) const = default;
};

template <class Upstream>
struct adaptor : vram::forward_properties<adaptor<Upstream>, Upstream> {};

}  // namespace

TEST_CASE("concepts accept conforming resources and reject the rest", "[core][concepts]") {
  STATIC_REQUIRE(vram::synchronous_resource<only_sync>);
  STATIC_REQUIRE_FALSE(vram::resource<only_sync>);
  STATIC_REQUIRE(vram::resource<full>);
  STATIC_REQUIRE_FALSE(vram::resource<throwing_deallocate>);
  STATIC_REQUIRE_FALSE(vram::synchronous_resource<not_comparable>);
  STATIC_REQUIRE_FALSE(vram::resource<old_argument_order>);
  STATIC_REQUIRE_FALSE(vram::resource<int>);
}

TEST_CASE("properties are found by ADL and forwarded by adaptors", "[core][concepts]") {
  STATIC_REQUIRE(vram::has_property<full, vram::device_accessible>);
  STATIC_REQUIRE_FALSE(vram::has_property<full, vram::host_accessible>);
  STATIC_REQUIRE(vram::has_property<adaptor<full>, vram::device_accessible>);
  STATIC_REQUIRE_FALSE(vram::has_property<adaptor<full>, vram::host_accessible>);
  STATIC_REQUIRE(vram::resource_with<vram::host_source, vram::host_accessible>);
  STATIC_REQUIRE_FALSE(vram::resource_with<vram::host_source, vram::device_accessible>);
  STATIC_REQUIRE(vram::resource_with<vram::simulated_device_source, vram::device_accessible>);
}

TEST_CASE("resource_ref and any_resource carry exactly their properties", "[core][concepts]") {
  STATIC_REQUIRE(std::is_constructible_v<vram::resource_ref<vram::device_accessible>, full&>);
  STATIC_REQUIRE_FALSE(std::is_constructible_v<vram::resource_ref<vram::host_accessible>, full&>);
  STATIC_REQUIRE_FALSE(std::is_constructible_v<vram::resource_ref<>, only_sync&>);
  STATIC_REQUIRE(vram::has_property<vram::any_resource<vram::device_accessible>, vram::device_accessible>);
  STATIC_REQUIRE(vram::has_contiguous_growth<vram::simulated_device_source>);
  STATIC_REQUIRE_FALSE(vram::has_contiguous_growth<vram::host_source>);
  STATIC_REQUIRE(vram::has_stats<vram::simulated_device_source>);
  STATIC_REQUIRE(vram::has_owns<vram::host_source>);
}

TEST_CASE("any_resource owns a copy and forwards calls", "[core]") {
  vram::host_source source;
  vram::any_resource<vram::host_accessible> any{source};
  void* p = any.allocate_sync(100);
  CHECK(source.owns(p));
  CHECK(any.target<vram::host_source>() != nullptr);
  CHECK(any.target<vram::simulated_device_source>() == nullptr);
  any.deallocate_sync(p, 100);
  CHECK(source.live_allocations() == 0);
  vram::any_resource<vram::host_accessible> moved = std::move(any);
  CHECK(static_cast<bool>(moved));
}

#pragma once
// Conformance fixtures for the CUDA sources (compiled everywhere, run where a GPU exists).

#include <tuple>

#include <vram/source/cuda_async_source.hpp>
#include <vram/source/cuda_device_source.hpp>
#include <vram/source/cuda_managed_source.hpp>
#include <vram/source/cuda_pinned_source.hpp>

namespace vram::test {

struct cuda_device_fixture {
  static constexpr const char* name = "cuda_device_source";
  static constexpr bool host_accessible = false;
  static cuda_device_source make() { return cuda_device_source{}; }
};
struct cuda_async_fixture {
  static constexpr const char* name = "cuda_async_source";
  static constexpr bool host_accessible = false;
  static cuda_async_source make() { return cuda_async_source{}; }
};
struct cuda_pinned_fixture {
  static constexpr const char* name = "cuda_pinned_source";
  static constexpr bool host_accessible = true;
  static cuda_pinned_source make() { return cuda_pinned_source{}; }
};
struct cuda_managed_fixture {
  static constexpr const char* name = "cuda_managed_source";
  static constexpr bool host_accessible = true;
  static cuda_managed_source make() { return cuda_managed_source{}; }
};

using cuda_fixtures = std::tuple<cuda_device_fixture, cuda_async_fixture, cuda_pinned_fixture, cuda_managed_fixture>;

}  // namespace vram::test

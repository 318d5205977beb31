#include <catch2/catch.hpp>

#include <string>
#include <thread>

#include <vram/core/tag_scope.hpp>
#include <vram/core/tenant.hpp>

TEST_CASE("tenant_registry: names, parents, depth, limits", "[core][tenant]") {
  vram::tenant_registry reg;
  CHECK(reg.size() == 1);
  CHECK(std::string(reg.name(vram::tenant::none())) == "default");
  auto job = reg.create("job");
  auto model = reg.create("model", job);
  auto layer = reg.create("layer", model);
  CHECK(job.id == 1);
  CHECK(std::string(reg.name(layer)) == "layer");
  vram::tenant p;
  REQUIRE(reg.parent(layer, p));
  CHECK(p == model);
  CHECK_FALSE(reg.parent(job, p));
  CHECK(reg.depth(layer) == 2);
  CHECK(reg.is_within(layer, job));
  CHECK(reg.is_within(layer, layer));
  CHECK_FALSE(reg.is_within(job, layer));
  CHECK(std::string(reg.name(vram::tenant{999})) == "?");
  CHECK_THROWS_AS(reg.create("orphan", vram::tenant{200}), vram::invalid_argument);

  std::string long_name(100, 'n');
  auto t = reg.create(long_name);
  CHECK(std::string(reg.name(t)).size() == vram::max_tenant_name);

  while (reg.size() < vram::max_tenants) (void)reg.create("filler");
  CHECK_THROWS_AS(reg.create("one too many"), vram::invalid_argument);
}

TEST_CASE("tenant_registry: a name with a NUL or a control character is refused, and nothing changes",
          "[core][tenant]") {
  vram::tenant_registry reg;
  auto job = reg.create("job");
  for (const std::string& name : {std::string("a\0b", 3), std::string("\0", 1), std::string("a\nb"),
                                  std::string("\x7f"), std::string(100, 'n') + '\t'}) {
    CHECK_THROWS_AS(reg.create(name), vram::invalid_argument);
    CHECK_THROWS_AS(reg.create(name, job), vram::invalid_argument);
  }
  CHECK(reg.size() == 2);
  CHECK(std::string(reg.name(reg.create("caf\xc3\xa9 1", job))) == "caf\xc3\xa9 1");  // UTF-8 and spaces stay
}

TEST_CASE("tenant_scope and tag_scope nest and are per thread", "[core][tenant]") {
  vram::tenant a{1}, b{2};
  CHECK(vram::current_tenant() == vram::tenant::none());
  CHECK(std::string(vram::current_tag()).empty());
  {
    vram::tenant_scope sa(a);
    vram::tag_scope ta("outer");
    CHECK(vram::current_tenant() == a);
    {
      vram::tenant_scope sb(b);
      vram::tag_scope tb("inner");
      CHECK(vram::current_tenant() == b);
      CHECK(std::string(vram::current_tag()) == "inner");
      vram::tenant seen_elsewhere{7};
      std::thread([&] { seen_elsewhere = vram::current_tenant(); }).join();
      CHECK(seen_elsewhere == vram::tenant::none());  // scopes are thread-local
    }
    CHECK(vram::current_tenant() == a);
    CHECK(std::string(vram::current_tag()) == "outer");
  }
  CHECK(vram::current_tenant() == vram::tenant::none());
  CHECK(std::string(vram::current_tag()).empty());
}

TEST_CASE("tenant_registry: lookups run while tenants are created", "[core][tenant]") {
  vram::tenant_registry reg;
  std::thread writer([&] {
    vram::tenant parent = vram::tenant::none();
    for (int i = 0; i < 200; ++i) parent = reg.create("t" + std::to_string(i), parent);
  });
  std::size_t seen = 0;
  while (seen < 201) {
    seen = reg.size();
    for (std::uint32_t i = 1; i < seen; ++i) {
      vram::tenant p;
      if (!reg.parent(vram::tenant{i}, p) || p.id != i - 1 || reg.name(vram::tenant{i})[0] != 't') FAIL("inconsistent");
    }
  }
  writer.join();
}

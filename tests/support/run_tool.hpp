#pragma once
// Runs one of the project's executables as a user would, from a shell, capturing what it
// prints (stdout and stderr together) and its exit status.

#include <sys/wait.h>

#include <cstdio>
#include <string>

#include <catch2/catch.hpp>

namespace vram::test {

struct run_result {
  int status;  // the exit status; -1 when it did not exit (a signal)
  std::string out;
};

/// Runs `exe` with `args` (shell words, quoted by the caller where needed).
inline run_result run_tool(const std::string& exe, const std::string& args) {
  const std::string command = "'" + exe + "' " + args + " 2>&1";
  FILE* pipe = ::popen(command.c_str(), "r");
  REQUIRE(pipe != nullptr);
  std::string out;
  char buf[4096];
  while (std::size_t n = std::fread(buf, 1, sizeof buf, pipe)) out.append(buf, n);
  const int status = ::pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

}  // namespace vram::test

#pragma once
// A ledger's two files on disk: written whole at creation, and opened only after everything
// that can be checked before trusting them was checked.

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

#include <vram/core/error.hpp>
#include <vram/core/throw.hpp>
#include <vram/adaptor/detail/ledger/layout.hpp>
#include <vram/adaptor/detail/ledger/system.hpp>

namespace vram::detail::ledger {

/// Creates `file` (of a ledger at `path`) zero-filled, with `mode`, its identity written and
/// its mutex initialized.
template <class File>
void write_new(const std::string& file, const std::string& path, mode_t mode, const std::uint64_t (&id)[2],
               const char (&magic)[8]) {
  int fd = ::open(file.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) fail_errno(ledger_error::reason::system, path, "creating its files", errno);
  if (::ftruncate(fd, sizeof(File)) != 0 || ::fchmod(fd, mode) != 0) {
    int err = errno;
    ::close(fd);
    fail_errno(ledger_error::reason::system, path, "sizing its files", err);
  }
  mapped_file m = map_file(fd, sizeof(File), true, path);
  File* f = m.as<File>();  // zero-filled by ftruncate: every counter starts at 0
  identity& h = f->id;
  std::memcpy(h.magic, magic, sizeof h.magic);
  h.version = layout_version;
  h.tenants = max_tenants;
  h.processes = max_processes;
  h.mutex_bytes = sizeof(pthread_mutex_t);
  h.file_bytes = sizeof(File);
  std::memcpy(h.ledger_id, id, sizeof h.ledger_id);
  h.checksum = h.expected_checksum();
  if constexpr (std::is_same_v<File, limits_file>)
    init_shared_mutex(&f->admin_mutex, path);
  else
    init_shared_mutex(&f->charge_mutex, path);
}

/// Opens and maps one of the two files after checking everything that can be checked
/// before trusting it: a regular file, its magic, its exact size, its layout, its checksum.
template <class File>
mapped_file open_part(const std::string& path, const char* part, bool writable, const char (&magic)[8]) {
  using reason = ledger_error::reason;
  const std::string file = path + "/" + part;
  int fd = ::open(file.c_str(), (writable ? O_RDWR : O_RDONLY) | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) {
    int err = errno;
    if (err == ENOENT) throw_ledger_error(reason::foreign, path, std::string("has no ") + part + " file");
    if (err == EACCES || err == EPERM)
      throw_ledger_error(reason::permission, path,
                         std::string("its ") + part + " file's mode refuses " + (writable ? "writing" : "reading") +
                             " to this user");
    fail_errno(err == ELOOP ? reason::foreign : reason::system, path, "opening it", err);
  }
  auto refuse = [&](reason r, const std::string& what) {
    ::close(fd);
    throw_ledger_error(r, path, std::string(part) + " file: " + what);
  };
  struct stat st {};
  if (::fstat(fd, &st) != 0) refuse(reason::system, "fstat failed");
  if (!S_ISREG(st.st_mode)) refuse(reason::foreign, "not a regular file");
  identity h{};
  const std::size_t size = static_cast<std::size_t>(st.st_size);
  if (size < sizeof h.magic) refuse(size == 0 ? reason::truncated : reason::foreign, "too short to be a ledger");
  if (::pread(fd, &h, size < sizeof h ? size : sizeof h, 0) < static_cast<ssize_t>(sizeof h.magic))
    refuse(reason::system, "cannot be read");
  if (std::memcmp(h.magic, magic, sizeof h.magic) != 0) refuse(reason::foreign, "not a vram ledger");
  if (size < sizeof h) refuse(reason::truncated, "truncated");
  if (h.checksum != h.expected_checksum()) refuse(reason::corrupted, "its header checksum does not match");
  if (h.version != layout_version)
    refuse(reason::version,
           "layout version " + std::to_string(h.version) + ", this build reads " + std::to_string(layout_version));
  if (h.tenants != max_tenants || h.processes != max_processes || h.mutex_bytes != sizeof(pthread_mutex_t) ||
      h.file_bytes != sizeof(File))
    refuse(reason::foreign, "made by a build with another layout");
  if (size < sizeof(File)) refuse(reason::truncated, "truncated");
  if (size > sizeof(File)) refuse(reason::foreign, "longer than its layout");
  return map_file(fd, sizeof(File), writable, path);
}

}  // namespace vram::detail::ledger

#pragma once
// An output file of vram-replay (--json, --html, --write-trace), written through a
// std::ostream over a POSIX file descriptor so that every failure keeps the system's reason:
// creating it (no such directory, a directory, permission), writing it (disk full) and
// closing it. The tool opens its outputs before the replays, so a bad path fails at once.

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ostream>
#include <streambuf>
#include <string>
#include <utility>

namespace vram_replay {

class output_file {
 public:
  explicit output_file(std::string path) : path_(std::move(path)) {}
  ~output_file() {
    if (buffer_.fd >= 0) ::close(buffer_.fd);
  }
  output_file(const output_file&) = delete;
  output_file& operator=(const output_file&) = delete;

  [[nodiscard]] const std::string& path() const noexcept { return path_; }

  /// Creates or truncates the file; false (see error()) where it cannot.
  bool open() {
    buffer_.fd = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    if (buffer_.fd < 0) return fail("cannot create", errno);
    return true;
  }

  /// The stream to write to (after open()).
  std::ostream& stream() noexcept { return stream_; }

  /// Writes what is buffered and closes the file; false (see error()) where any write or
  /// the close failed.
  bool close() {
    stream_.flush();
    int fd = std::exchange(buffer_.fd, -1);
    if (buffer_.error != 0) {
      ::close(fd);
      return fail("cannot write", buffer_.error);
    }
    if (::close(fd) != 0) return fail("cannot write", errno);
    return true;
  }

  /// "cannot write out.json: No space left on device".
  [[nodiscard]] std::string error() const { return what_ + " " + path_ + ": " + std::strerror(errno_); }

 private:
  /// Buffers writes; keeps the errno of the first write(2) that failed (later writes fail too).
  struct fd_buffer : std::streambuf {
    int fd = -1;
    int error = 0;
    char data[1 << 16];

    fd_buffer() { setp(data, data + sizeof data); }
    int overflow(int c) override {
      if (!drain()) return traits_type::eof();
      if (c != traits_type::eof()) {
        *pptr() = static_cast<char>(c);
        pbump(1);
      }
      return traits_type::not_eof(c);
    }
    int sync() override { return drain() ? 0 : -1; }
    bool drain() {
      for (const char* p = pbase(); error == 0 && p < pptr();) {
        ssize_t n = ::write(fd, p, static_cast<std::size_t>(pptr() - p));
        if (n >= 0) p += n;
        else if (errno != EINTR) error = errno;
      }
      setp(data, data + sizeof data);
      return error == 0;
    }
  };

  bool fail(const char* what, int error) {
    what_ = what;
    errno_ = error;
    return false;
  }

  std::string path_;
  fd_buffer buffer_;
  std::ostream stream_{&buffer_};
  std::string what_;
  int errno_ = 0;
};

}  // namespace vram_replay

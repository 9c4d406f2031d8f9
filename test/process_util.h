// Child processes for tests: spawn a binary from the runfiles, read its stdout, kill it.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

extern char** environ;

namespace rdmarpc::testing {

// A binary from this test's runfiles (the working directory under `bazel test`,
// and in the VM).
std::string Runfile(const std::string& rel) {
  if (std::filesystem::exists(rel)) return rel;
  if (const char* dir = std::getenv("TEST_SRCDIR")) {
    for (auto& e : std::filesystem::directory_iterator(dir)) {
      auto p = e.path() / rel;
      if (std::filesystem::exists(p)) return p.string();
    }
  }
  throw std::runtime_error("runfile not found: " + rel);
}

// A child process whose stdout we read line by line; killed (SIGKILL) if still
// running at the end.
class Child {
 public:
  explicit Child(const std::vector<std::string>& args) {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) throw std::runtime_error("pipe failed");
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    int err = posix_spawn(&pid_, argv[0], &fa, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
    close(fds[1]);
    out_ = fds[0];
    if (err != 0) throw std::runtime_error("cannot start " + args[0]);
  }
  ~Child() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    close(out_);
  }

  // The next line of output, or "" at end of output or after `timeout`.
  std::string ReadLine(std::chrono::milliseconds timeout) {
    const auto until = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      if (auto nl = buf_.find('\n'); nl != std::string::npos) {
        std::string line = buf_.substr(0, nl);
        buf_.erase(0, nl + 1);
        return line;
      }
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          until - std::chrono::steady_clock::now());
      if (left.count() <= 0) return "";
      pollfd p{out_, POLLIN, 0};
      if (poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
      char tmp[512];
      ssize_t n = read(out_, tmp, sizeof tmp);
      if (n <= 0) return "";
      buf_.append(tmp, n);
    }
  }

  void Kill() { Stop(SIGKILL); }
  // Sends `sig` without waiting (e.g. SIGCONT).
  void Signal(int sig) { kill(pid_, sig); }

  // SIGSTOP, then waits until the process is really stopped: delivery is asynchronous, and a
  // process on another core keeps running for a moment after kill() returns.
  bool Pause() {
    kill(pid_, SIGSTOP);
    for (int i = 0; i < 400; ++i) {
      std::ifstream stat("/proc/" + std::to_string(pid_) + "/stat");
      std::string pid, comm, state;
      stat >> pid >> comm >> state;  // comm has no spaces for our binaries
      if (state == "T" || state == "t") return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return false;
  }

  // Sends `sig` and waits for the exit; returns the exit code, or 128 + signal if it was killed.
  int Stop(int sig) {
    kill(pid_, sig);
    return Wait();
  }

  // Waits for the exit; returns as Stop does.
  int Wait() {
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  bool running() const { return pid_ > 0 && waitpid(pid_, nullptr, WNOHANG) == 0; }
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
  int out_ = -1;
  std::string buf_;
};

// Starts a server binary (argv in `args`) that prints "listening on URI" once it serves, and
// returns it with that URI. Throws if it exits or stays silent for 20 s.
inline std::pair<std::unique_ptr<Child>, std::string> StartServer(
    const std::vector<std::string>& args) {
  auto child = std::make_unique<Child>(args);
  const std::string prefix = "listening on ";
  for (;;) {  // log lines may come first
    std::string line = child->ReadLine(std::chrono::seconds(20));
    if (line.empty()) throw std::runtime_error(args[0] + " did not start");
    if (line.rfind(prefix, 0) == 0) return {std::move(child), line.substr(prefix.size())};
  }
}

// Whether resident memory says what a process holds, so that tests may bound it: not under a
// sanitizer (ASan keeps freed memory in quarantine and pads every block; TSan adds shadow
// memory). There the attacks still run and the figures are printed, unchecked.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr bool kRssMeaningful = false;
#else
inline constexpr bool kRssMeaningful = true;
#endif

// A process's resident memory (VmRSS) in MiB; -1 when it cannot be read (the process is gone).
inline double RssMiB(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;
  }
  return -1;
}

}  // namespace rdmarpc::testing

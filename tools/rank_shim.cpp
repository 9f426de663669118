// zerotrain-rank: the per-rank shim that `zerotrain launch` starts through mpirun.
// Sets RANK / WORLD_SIZE / LOCAL_RANK / LOCAL_WORLD_SIZE from OpenMPI's variables, runs
// the program in its own process group, prefixes each output line with its rank,
// forwards SIGINT/SIGTERM/SIGHUP to the program's group, and reports a failure with
// the rank and exit code. Links nothing but libc, so it starts instantly.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace {
volatile sig_atomic_t g_child = 0;
void forward_signal(int sig) {
  if (g_child > 0) kill(-g_child, sig);  // the rank's whole process group
}

// Copies complete lines from `fd` to `out`, each prefixed; keeps a partial line in `buf`.
bool pump(int fd, std::string& buf, std::FILE* out, const std::string& prefix) {
  char tmp[65536];
  ssize_t n = read(fd, tmp, sizeof(tmp));
  if (n < 0 && (errno == EINTR || errno == EAGAIN)) return true;
  if (n <= 0) {
    if (!buf.empty()) {
      std::fprintf(out, "%s%s\n", prefix.c_str(), buf.c_str());
      buf.clear();
    }
    std::fflush(out);
    return false;
  }
  buf.append(tmp, static_cast<size_t>(n));
  size_t pos;
  while ((pos = buf.find('\n')) != std::string::npos) {
    std::fprintf(out, "%s%.*s\n", prefix.c_str(), static_cast<int>(pos), buf.data());
    buf.erase(0, pos + 1);
  }
  std::fflush(out);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  int i = 1;
  if (i < argc && std::strcmp(argv[i], "--") == 0) ++i;
  if (i >= argc) { std::fprintf(stderr, "zerotrain-rank: no program given\n"); return 2; }
  const char* r = std::getenv("OMPI_COMM_WORLD_RANK");
  const char* w = std::getenv("OMPI_COMM_WORLD_SIZE");
  const char* lr = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK");
  const char* lw = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
  if (!r || !w) { std::fprintf(stderr, "zerotrain-rank must run under mpirun (started by `zerotrain launch`)\n"); return 2; }
  setenv("RANK", r, 1);
  setenv("WORLD_SIZE", w, 1);
  setenv("LOCAL_RANK", lr ? lr : r, 1);
  setenv("LOCAL_WORLD_SIZE", lw ? lw : w, 1);
  setenv("ZT_LAUNCHER", "1", 1);
  const std::string prefix = std::string("[rank ") + r + "] ";

  int out_pipe[2], err_pipe[2];
  if (pipe(out_pipe) != 0 || pipe(err_pipe) != 0) { std::perror("zerotrain-rank: pipe"); return 1; }
  pid_t pid = fork();
  if (pid < 0) { std::perror("zerotrain-rank: fork"); return 1; }
  if (pid == 0) {
    setpgid(0, 0);  // own process group: a forwarded signal reaches the rank's children too
    dup2(out_pipe[1], 1);
    dup2(err_pipe[1], 2);
    close(out_pipe[0]);
    close(err_pipe[0]);
    close(out_pipe[1]);
    close(err_pipe[1]);
    execvp(argv[i], argv + i);
    std::fprintf(stderr, "zerotrain launch: cannot start '%s': %s\n", argv[i], std::strerror(errno));
    _exit(127);
  }
  setpgid(pid, pid);
  g_child = pid;
  struct sigaction sa {};
  sa.sa_handler = forward_signal;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGHUP, &sa, nullptr);
  close(out_pipe[1]);
  close(err_pipe[1]);

  std::string out_buf, err_buf;
  pollfd fds[2] = {{out_pipe[0], POLLIN, 0}, {err_pipe[0], POLLIN, 0}};
  int open_fds = 2;
  while (open_fds > 0) {
    int rc = poll(fds, 2, -1);
    if (rc < 0 && errno == EINTR) continue;
    for (int k = 0; k < 2; ++k) {
      if (fds[k].fd >= 0 && (fds[k].revents & (POLLIN | POLLHUP | POLLERR))) {
        if (!pump(fds[k].fd, k == 0 ? out_buf : err_buf, k == 0 ? stdout : stderr, prefix)) {
          close(fds[k].fd);
          fds[k].fd = -1;
          --open_fds;
        }
      }
    }
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return 0;
  int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  if (WIFSIGNALED(status)) {
    std::fprintf(stderr, "zerotrain launch: rank %s (pid %d) was killed by signal %d (%s)\n", r, pid,
                 WTERMSIG(status), strsignal(WTERMSIG(status)));
  } else {
    std::fprintf(stderr, "zerotrain launch: rank %s (pid %d) failed with exit code %d; ending the other ranks\n", r,
                 pid, code);
  }
  std::fflush(stderr);
  return code;
}


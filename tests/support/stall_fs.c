/* A filesystem that hangs, for tests (tests/kvptest/stall_fs.py builds and preloads it):
 * while the file named by KVP_STALL_WHILE exists, every fsync(2) of a file whose path
 * contains KVP_STALL_MATCH blocks, as it would on a hung NFS mount or a dying disk. Entering
 * the stall creates KVP_STALL_WHILE.hit, so a test knows the operation is stuck. A stall
 * ends when the gate file is removed, or after 120 s. Without both variables nothing
 * changes. No code of kvpersist knows about it. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int stalls_for(int fd) {
  const char *match = getenv("KVP_STALL_MATCH");
  const char *gate = getenv("KVP_STALL_WHILE");
  if (!match || !gate || access(gate, F_OK) != 0) return 0;
  char link[64], path[4096];
  snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  ssize_t n = readlink(link, path, sizeof path - 1);
  if (n < 0) return 0;
  path[n] = '\0';
  return strstr(path, match) != NULL;
}

static void stall(void) {
  const char *gate = getenv("KVP_STALL_WHILE");
  char hit[4096];
  snprintf(hit, sizeof hit, "%s.hit", gate);
  int fd = open(hit, O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
  if (fd >= 0) close(fd);
  struct timespec five_ms = {0, 5 * 1000 * 1000};
  for (int i = 0; i < 24000 && access(gate, F_OK) == 0; ++i) nanosleep(&five_ms, NULL);
}

int fsync(int fd) {
  static int (*real_fsync)(int);
  if (!real_fsync) real_fsync = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
  if (stalls_for(fd)) stall();
  return real_fsync(fd);
}

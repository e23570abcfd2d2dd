// read(2) calls made so far by this process: the syscr line of /proc/self/io, or -1 if it
// cannot be read. Reading it costs a few read calls itself. Used by the test and the
// benchmark that check that scoring a tree expert reads no file.
#ifndef DECISION_TESTS_READ_SYSCALLS_H_
#define DECISION_TESTS_READ_SYSCALLS_H_

#include <cstdint>
#include <fstream>
#include <string>

// Not decision::testing: in a test inside namespace decision it would hide gtest's ::testing.
namespace decision::testutil {

inline int64_t ReadSyscalls() {
  std::ifstream io("/proc/self/io");
  std::string key;
  int64_t value = 0;
  while (io >> key >> value) {
    if (key == "syscr:") return value;
  }
  return -1;
}

}  // namespace decision::testutil

#endif  // DECISION_TESTS_READ_SYSCALLS_H_
